"""benchmarks/study.sh: the STUDY file's checks and the plan it prints (``--dry-run`` trains
nothing: marl.compare validates every run's options and prints its command)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "study.sh"
HEAD = subprocess.run(
    ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True
).stdout.strip()


def study_dir(tmp: Path, **keys: str) -> Path:
    d = tmp / "mystudy"
    d.mkdir(exist_ok=True)
    (d / "STUDY").write_text("".join(f"{k}={v}\n" for k, v in keys.items()))
    return d


def run(*args: str, tmp: Path) -> subprocess.CompletedProcess:
    # the checkout under test stands in for the pinned commit's worktree
    env = dict(os.environ, PYTHON=sys.executable, STUDY_TREE=str(REPO),
               STUDY_RUNS=str(tmp / "runs"))  # fmt: skip
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          env=env, timeout=300)  # fmt: skip


def test_help_names_the_study_file_keys(tmp_path: Path) -> None:
    res = run("--help", tmp=tmp_path)
    assert res.returncode == 0
    for word in ("code_commit=", "study=", "seeds=", "total_steps=", "args=", "--persist"):
        assert word in res.stdout


GOOD = {"code_commit": "0" * 40, "study": "whitening_scales", "seeds": "2", "total_steps": "4096"}


@pytest.mark.parametrize(
    ("keys", "args", "message"),
    [
        ({k: v for k, v in GOOD.items() if k != "study"}, [], "lacks 'study='"),
        ({**GOOD, "code_commit": "abc"}, [], "code_commit must be 40 hex digits, got 'abc'"),
        ({**GOOD, "seeds": "0"}, [], "take positive integers, got '0'"),
        (GOOD, ["--frobnicate"], "unknown option '--frobnicate'"),
    ],
)
def test_bad_study_files_and_options_exit_2(
    tmp_path: Path, keys: dict[str, str], args: list[str], message: str
) -> None:
    d = study_dir(tmp_path, **keys)
    res = run(str(d), *args, "--dry-run", tmp=tmp_path)
    assert res.returncode == 2, res.stderr
    assert message in res.stderr
    assert not (tmp_path / "runs").exists()


def test_a_directory_without_a_study_file_is_refused(tmp_path: Path) -> None:
    res = run(str(tmp_path), "--dry-run", tmp=tmp_path)
    assert res.returncode == 2
    assert "has no STUDY file" in res.stderr


def test_dry_run_plans_every_variant_and_seed_with_the_study_args(tmp_path: Path) -> None:
    args = "--algo grpo --common=--env.rescuer_reward_scale=10"
    d = study_dir(tmp_path, **{**GOOD, "code_commit": HEAD, "args": args})
    res = run(str(d), "--dry-run", tmp=tmp_path)
    assert res.returncode == 0, res.stderr
    plan = [x for x in res.stdout.splitlines() if "[new]:" in x]
    assert len(plan) == 4 * 2  # four variants (GRPO: no ti_a0.5, it is none) x two seeds
    assert all("--algo=grpo" in x and "--total-steps=4096" in x for x in plan)
    assert all("--env.rescuer_reward_scale=10" in x for x in plan)
    assert all(str(tmp_path / "runs" / "mystudy") in x for x in plan)


@pytest.mark.parametrize("policies", [False, True])
def test_persist_runs_copies_finished_runs_and_with_policies_their_policy(
    tmp_path: Path, policies: bool
) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    (src / "runs" / "a" / "seed_0" / "policy").mkdir(parents=True)
    (src / "runs" / "a" / "seed_1").mkdir(parents=True)
    (src / "compare.json").write_text("{}")
    done = src / "runs" / "a" / "seed_0"
    for name in ("config.yaml", "eval.json", "finished.json", "metrics.jsonl"):
        (done / name).write_text(name)
    (done / "policy" / "policy.json").write_text("{}")
    (done / "policy" / "weights.pt").write_text("w")
    (src / "runs" / "a" / "seed_1" / "config.yaml").write_text("unfinished")
    args = [str(src), str(dest)] + (["--policies"] if policies else [])
    script = REPO / "benchmarks" / "persist_runs.sh"
    res = subprocess.run(["bash", str(script), *args], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "1 finished run(s)" in res.stdout
    kept = dest / "runs" / "a" / "seed_0"
    assert (kept / "eval.json").read_text() == "eval.json"
    assert (kept / "metrics.jsonl.xz").is_file()
    assert not (dest / "runs" / "a" / "seed_1").exists()
    assert (kept / "policy" / "weights.pt").is_file() == policies
