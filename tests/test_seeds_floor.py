"""benchmarks/seeds_floor.py: its table's structure and its input checks (speed itself is
measured by the benchmark, never asserted here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "seeds_floor.py"
TINY = ["--env.preset", "small", "--num-envs", "2", "--rollout-steps", "8", "--hidden-dim", "8",
        "--critic-hidden-dim", "8"]  # fmt: skip


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          cwd=REPO, timeout=300)  # fmt: skip


@pytest.mark.slow  # a benchmark script's own check (about 20 s): the slow tier, run by CI
def test_one_row_per_size_and_phase_with_the_update_doubling_with_the_seeds() -> None:
    res = run("--sizes", "1", "2", "--gemm-size", "64", "--", *TINY)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = [line.split() for line in res.stdout.splitlines() if line.split()[:1] in (["1"], ["2"])]
    assert [(r[0], r[1]) for r in rows] == [("1", "collect"), ("1", "update"), ("2", "collect"),
                                            ("2", "update")]  # fmt: skip
    flops = {(r[0], r[1]): float(r[2]) for r in rows}
    assert all(float(r[4]) > 0 for r in rows)
    # two seeds do the same work each: twice the FLOPs of one (same shapes, same epochs)
    assert flops[("1", "update")] > 0
    assert flops[("2", "update")] == pytest.approx(2 * flops[("1", "update")], abs=0.11)


def test_bad_sizes_are_refused() -> None:
    res = run("--sizes", "0")
    assert res.returncode == 2 and "--sizes" in res.stderr
