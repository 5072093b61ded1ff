"""benchmarks/train_mappo.py seeds (issue 37): the multi-seed throughput table's structure.

Tiny runs (S = 1 and 2, one timed iteration, one round, width 8) in a subprocess, as a user
runs them, for MAPPO (SeedMAPPO; 2 envs x 8 steps) and GRPO (SeedGRPO, ``-- --algo grpo``; 2
groups of 2 whole episodes): one table row per size with positive figures, the single-seed
reference (MAPPO or GRPO) and its ratio, the phase profile. They check the output, not the
speed (20-30 s each on a loaded two-core machine: four processes, each importing torch).
Argument errors, and the options the batch cannot train, are argparse errors before anything
is built.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "benchmarks" / "train_mappo.py")
TINY = ["--env.preset", "small", "--num-envs", "2", "--rollout-steps", "8",
        "--hidden-dim", "8", "--critic-hidden-dim", "8"]  # fmt: skip
TINY_GRPO = ["--algo", "grpo", "--env.preset", "small", "--num-envs", "4", "--group-size", "2",
             "--hidden-dim", "8"]  # fmt: skip
HEADER = ["S", "agent-steps/s", "per", "seed/s", "x", "S=1", "per", "cpu-s", "peak", "RSS", "MiB"]


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def _check_table(extra: list[str], batch: str, single: str, *options: str) -> str:
    """Runs ``seeds --sizes 1 2`` (and ``options``) with the train flags ``extra`` and checks
    the output's structure; returns stdout."""
    cmd = [sys.executable, SCRIPT, "seeds", "--sizes", "1", "2", "--updates", "1",
           "--rounds", "1", *options, "--", *extra]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"seeds: {batch}, seeds 0..S-1 in one process"), lines[0]
    start = next(i for i, line in enumerate(lines) if line.split() == HEADER)
    rows = []
    for line in lines[start + 1 :]:
        if not re.match(r"\s*\d+\s", line):
            break
        rows.append(line.split())
    assert [int(r[0]) for r in rows] == [1, 2]
    for row in rows:
        assert len(row) == 6, row
        assert all(_number(x) > 0 for x in row[1:]), row
    assert _number(rows[0][3]) == 1.0  # S=1 is the reference of the ratios
    text = out.stdout
    reference = re.search(rf"{single} \(.*\): ([\d,]+) agent-steps/s", text)
    assert reference and _number(reference.group(1)) > 0
    ratio = re.search(rf"ratio S=1 new / {single}: ([\d.]+) wall, ([\d.]+) cpu", text)
    assert ratio and float(ratio.group(1)) > 0 and float(ratio.group(2)) > 0
    assert "S=2 is the largest S <= 16" in text
    end = next((i for i, line in enumerate(lines) if line.startswith("what bounds")), len(lines))
    profile = {line.split()[0]: line.split() for line in lines[:end] if line.startswith("S=")}
    for label in ("S=1", "S=2"):
        figures = [float(x.rstrip("%")) for x in profile[label][1:]]
        assert len(figures) == 8 and figures[0] > 0 and figures[2] > 0, profile[label]
    assert any(line.startswith(single) for line in lines[start:])  # its profile row
    if "--profile" not in options:  # the profile's rows start with S= and the single's name
        assert out.stderr.count("agent-steps/s") == 3  # progress: the reference, S=1, S=2
    assert f"  {single}" in out.stderr
    return text


@pytest.mark.slow  # a benchmark script's own check (about 25 s): the slow tier
def test_seeds_prints_one_row_per_size_with_positive_figures() -> None:
    text = _check_table(TINY, "SeedMAPPO", "single-seed MAPPO")
    assert "E=2 T=8 agents=" in text


@pytest.mark.slow  # a benchmark script's own check (about 30 s): the slow tier
def test_seeds_profile_splits_an_iteration_into_phases_against_a_compute_floor() -> None:
    text = _check_table(TINY, "SeedMAPPO", "single-seed MAPPO", "--profile")
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("what bounds it"))
    assert re.search(r"measured [\d.]+ GFLOP/s", lines[start])
    rows = {line.split()[0]: line for line in lines[start + 2 :] if line.strip()}
    for label in ("single-seed", "S=2"):
        shares = [float(x) for x in re.findall(r"(-?[\d.]+)%", rows[label])]
        assert len(shares) == 6, rows[label]
        # env + rollout forwards + update GEMMs + optimizer + the rest: the whole iteration
        assert sum(shares[:5]) == pytest.approx(100, abs=3), rows[label]
        assert all(x >= 0 for x in shares[:4]) and shares[1] > 0 and shares[2] > 0
        assert float(re.search(r"([\d.]+)x", rows[label]).group(1)) > 0  # GEMM / its floor


@pytest.mark.slow  # a benchmark script's own check (about 25 s): the slow tier
def test_seeds_with_algo_grpo_measures_seed_grpo_against_single_seed_grpo() -> None:
    text = _check_table(TINY_GRPO, "SeedGRPO", "single-seed GRPO")
    # GRPO's env steps per iteration vary: the header gives them (whole episodes)
    steps = re.search(r"E=4 group_size=2 \(whole episodes: env steps per seed and iteration "
                      r"([\d,]+) at S=1\)", text)  # fmt: skip
    assert steps and _number(steps.group(1)) > 0, text.splitlines()[0]


def test_seeds_refuses_bad_input_with_an_argparse_error() -> None:
    for bad, message in (
        (["--sizes", "1", "0"], "argument --sizes: invalid value 0: must be an integer >= 1"),
        (["--updates", "x"], "argument --updates: invalid value 'x': not an integer"),
        (["--", "--seed", "3"], "--seed after --: the seeds are 0..S-1"),
    ):
        out = subprocess.run([sys.executable, SCRIPT, "seeds", *bad], capture_output=True,
                             text=True, cwd=ROOT, timeout=120)  # fmt: skip
        assert out.returncode == 2 and message in out.stderr, (bad, out.stderr)
        assert "usage: train_mappo.py seeds" in out.stderr
