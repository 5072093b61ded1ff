"""The package installs as a user installs it: a fresh virtual environment, torch first (the
README's pin), then ``pip install`` of this checkout without extras; there, outside the
checkout, ``envs.multisearch_v0`` imports and steps, and the console scripts train and
evaluate a tiny run.

Skipped, saying why, when the package index cannot be reached (pip cannot get torch or the
build requirements)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TORCH = "torch==2.13.0"
#: pip output meaning the index (not this package) is the problem
UNREACHABLE = (
    "No matching distribution found",
    "Could not find a version that satisfies",
    "Failed to establish a new connection",
    "Max retries exceeded",
    "Temporary failure in name resolution",
    "Network is unreachable",
    "ConnectTimeoutError",
    "ProxyError",
)
STEP_ENV = """
from envs import multisearch_v0

env = multisearch_v0.parallel_env(preset="small")
obs, infos = env.reset(seed=0)
for _ in range(5):
    actions = {a: env.action_space(a).sample(obs[a]["action_mask"]) for a in env.agents}
    obs, rewards, terms, truncs, infos = env.step(actions)
assert set(rewards) == set(env.possible_agents), rewards
print("stepped", len(env.agents), "agents")
"""


def _pip(python: Path, *args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(python), "-m", "pip", "install", "-q", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _skip_if_unreachable(res: subprocess.CompletedProcess, what: str) -> None:
    if res.returncode == 0:
        return
    out = res.stdout + res.stderr
    if any(text in out for text in UNREACHABLE):
        pytest.skip(f"the package index is unreachable ({what}): {out.strip()[-400:]}")
    raise AssertionError(f"{what} failed:\n{out[-4000:]}")


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_fresh_venv_without_extras(tmp_path) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    python = env_dir / "bin" / "python"
    _skip_if_unreachable(_pip(python, TORCH, timeout=1200), f"pip install {TORCH}")
    # a copy of the checkout, so that the build's files (build/, *.egg-info) stay out of it
    source = tmp_path / "src"
    junk = ("__pycache__", ".venv", ".git", "build", "*.egg-info", "runs", "out", ".*_cache")
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(*junk, ".hypothesis"))
    _skip_if_unreachable(_pip(python, str(source), timeout=900), "pip install <checkout>")

    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    clean["OMP_NUM_THREADS"] = "1"
    work = tmp_path / "work"  # outside the checkout: the installed copy is imported
    work.mkdir()

    def run(*argv: str, timeout: float = 300) -> str:
        res = subprocess.run(
            list(argv), cwd=work, env=clean, capture_output=True, text=True, timeout=timeout
        )
        assert res.returncode == 0, f"{argv}:\n{res.stdout[-2000:]}\n{res.stderr[-4000:]}"
        return res.stdout

    assert "stepped" in run(str(python), "-c", STEP_ENV)
    where = run(str(python), "-c", "import envs, marl; print(envs.__file__, marl.__version__)")
    assert str(REPO) not in where and str(source) not in where and "site-packages" in where
    # no extra was installed: the optional packages are absent
    extras = ["wandb", "ray", "rliable", "onnxruntime", "mamba_ssm"]
    probe = f"import importlib.util as u; print([m for m in {extras!r} if u.find_spec(m)])"
    assert run(str(python), "-c", probe).strip() == "[]"

    bin_dir = env_dir / "bin"
    for script in ("coopsearch-train", "coopsearch-evaluate", "coopsearch-compare"):
        assert "usage" in run(str(bin_dir / script), "--help").lower()
    run_dir = work / "run"
    tiny = ["--num-envs", "4", "--rollout-steps", "8", "--total-steps", "64"]
    tiny += ["--eval-episodes", "1", "--progress", "false", "--baselines", "false"]
    tiny += ["--plots", "false", "--gif", "false", "--env.grid_size", "8"]
    run(str(bin_dir / "coopsearch-train"), *tiny, "--run-dir", str(run_dir), timeout=600)
    assert (run_dir / "finished.json").is_file()
    trained = (run_dir / "eval.json").read_bytes()
    run(str(bin_dir / "coopsearch-evaluate"), str(run_dir), "--seeds", "5", "--out", "e.json")
    assert json.loads((work / "e.json").read_text())["seeds"] == [5]
    assert (run_dir / "eval.json").read_bytes() == trained  # the trainer's, left alone
