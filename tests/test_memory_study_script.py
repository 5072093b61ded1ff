"""benchmarks/memory_study.sh: argument handling and the plan it prints (``--dry-run`` runs
nothing: marl.compare validates every run's options and prints its command)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "memory_study.sh"


def run(*args: str, tmp: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHON=sys.executable)
    return subprocess.run(
        ["bash", str(SCRIPT), "--out", str(tmp / "study"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_help_lists_the_parts(tmp_path: Path) -> None:
    res = run("--help", tmp=tmp_path)
    assert res.returncode == 0
    for word in ("--cpu", "--seeds", "--parts", "grouping_mamba", "family", "--at-env-steps",
                 "grouping_mamba2_paired"):  # fmt: skip
        assert word in res.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cpu", "ten"], "take positive integers, got 'ten'"),
        (["--seeds", "0"], "take positive integers, got '0'"),
        (["--parts", "memory,nope"], "unknown part 'nope'"),
        (["--frobnicate"], "unknown argument '--frobnicate'"),
    ],
)
def test_bad_arguments_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    res = run(*args, "--dry-run", tmp=tmp_path)
    assert res.returncode == 2
    assert message in res.stderr
    assert not (tmp_path / "study").exists()


def test_dry_run_plans_the_grouping_and_family_parts(tmp_path: Path) -> None:
    res = run("--dry-run", "--seeds", "2", "--cpu", "30", "--parts", "grouping_mamba,family",
              tmp=tmp_path)  # fmt: skip
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    grouping = [x for x in lines if x.startswith(("type/", "position/", "chunk/"))]
    assert len(grouping) == 3 * 2
    assert all("--backbone=mamba " in x and "--max-cpu-time=30" in x for x in grouping)
    assert sum("--whiten-inner=position" in x for x in grouping) == 2
    assert sum("--whiten-inner=chunk --chunk-size=8" in x for x in grouping) == 2
    family = [x for x in lines if x.startswith(("gru/", "mamba/"))]
    assert len(family) == 3 * 2 * 3  # three configurations, two backbones, three seeds each
    assert sum("--env.grid_size=24" in x for x in family) == 6
    assert not any((tmp_path / "study").glob("*/runs"))  # nothing ran


def test_dry_run_plans_the_paired_rerun_without_copied_runs(tmp_path: Path) -> None:
    memory = tmp_path / "study" / "memory" / "runs" / "mamba2" / "seed_0"
    memory.mkdir(parents=True)
    (memory / "finished.json").write_text("{}")  # a finished memory-part run: not copied in
    res = run("--dry-run", "--seeds", "2", "--cpu", "30", "--parts", "grouping_mamba2_paired",
              tmp=tmp_path)  # fmt: skip
    assert res.returncode == 0, res.stderr
    planned = [x for x in res.stdout.splitlines() if x.startswith(("type/", "position/", "chunk/"))]
    assert sorted(x.split(" ")[0] for x in planned) == [
        "position/seed_0", "position/seed_1", "type/seed_0", "type/seed_1"
    ]  # fmt: skip
    assert all("--backbone=mamba2 " in x and "--max-cpu-time=30" in x for x in planned)
    assert sum("--whiten-inner=type" in x for x in planned) == 2
    assert not (tmp_path / "study" / "grouping_mamba2_paired" / "runs").exists()
