"""Issue 48, item 1: a trained memoryless policy, mlp MAPPO at the memory_horizon study's
budget, stays at chance on ``multisearch_recall_v1``, 32 seeds at each H.

For each H, the study's mlp arm (``marl.experiments.studies.memory_horizon_settings(H)``,
``--backbone mlp --total-steps 1000000 --final-eval-episodes 128``) is trained for the seeds
of ``--seeds``, many in one process (``marl.train --seeds``; as many as fit in about 4 GB of
rollout buffers: 16 at H <= 256, fewer above), into ``RUNS/h<H>/seeds_<a>-<b>/seed_<k>``. The
table then gives, per H, the final success over every seed found: these runs, and the
study's own mlp runs where present (``runs/memory_horizon/h<H>/runs/mlp/seed_<k>``: the same
settings, other seeds). Each cell has the mean, its 95% bootstrap interval (10,000
resamples of the seeds), chance (``1 / n_zones``, from the env's config), and whether the
mean is at most chance + 0.1, the issue's bound.

    python benchmarks/memory_mlp_seeds.py --horizons 64 256 1024 4096 --seeds 16-31
    python benchmarks/memory_mlp_seeds.py --report-only     # the table from the runs present
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNS = os.path.join(REPO, "runs", "memory_mlp_seeds")
STUDY_RUNS = os.path.join(REPO, "runs", "memory_horizon")
BUDGET = 1_000_000
EVAL_EPISODES = 128
MARGIN = 0.1


def seeds_per_process(horizon: int, limit: float = 4e9) -> int:
    """How many seeds one process trains at ``horizon``: the rollout's states (``64 (H + 1)``
    steps of the 1,028-float state, about three copies through an update) of that many seeds
    within ``limit`` bytes, 1 to 16."""
    from marl.experiments.studies import memory_horizon_settings

    window = int(next(a for a in memory_horizon_settings(horizon) if "rollout" in a).split("=")[1])
    per_seed = window * 64 * 1028 * 4 * 3
    return max(1, min(16, int(limit // per_seed)))


def command(horizon: int, first: int, last: int, runs: str, budget: int = BUDGET) -> list[str]:
    """The study's mlp arm at ``horizon`` for seeds ``first..last``, one process; a batch
    directory already there with a checkpoint (an interrupted earlier call) is resumed
    instead. One stopped before its first checkpoint has nothing to resume: :func:`main`
    removes it and this command starts it afresh."""
    from marl.experiments.studies import memory_horizon_settings

    seeds = f"{first}-{last}"
    where = os.path.join(runs, f"h{horizon}", f"seeds_{seeds}")
    if _has_checkpoint(where):
        return [sys.executable, "-m", "marl.train", f"--resume={where}", f"--seeds={seeds}",
                "--progress=false"]  # fmt: skip
    return [
        sys.executable, "-m", "marl.train", "--algo=mappo", "--backbone=mlp",
        *memory_horizon_settings(horizon),
        f"--total-steps={budget}", f"--final-eval-episodes={EVAL_EPISODES}",
        "--torch-threads=1", "--progress=false", "--gif=false", "--baselines=false",
        "--plots=false", f"--seeds={seeds}", f"--run-dir={where}",
    ]  # fmt: skip


def _has_checkpoint(batch: str) -> bool:
    """Whether any seed directory under ``batch`` holds a checkpoint file."""
    for folder, _, names in os.walk(batch):
        if os.path.basename(folder) == "checkpoints" and names:
            return True
    return False


def successes(horizon: int, runs: str, study_runs: str) -> dict[int, float]:
    """Final success by seed at ``horizon``: this script's runs and the study's mlp runs
    (``finished.json`` present, so the run ended normally)."""
    found: dict[int, float] = {}
    for root in (os.path.join(runs, f"h{horizon}"),
                 os.path.join(study_runs, f"h{horizon}", "runs", "mlp")):  # fmt: skip
        for folder, dirs, names in os.walk(root):
            dirs.sort()
            name = os.path.basename(folder)
            if name.startswith("seed_") and "finished.json" in names and "eval.json" in names:
                with open(os.path.join(folder, "eval.json")) as fh:
                    found[int(name[len("seed_") :])] = float(json.load(fh)["success_rate"])
    return found


def bootstrap_interval(values: Sequence[float], reps: int = 10_000, seed: int = 0) -> tuple:
    """95% percentile bootstrap interval of the mean of ``values``."""
    x = np.asarray(values, dtype=np.float64)
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), size=(reps, len(x)))].mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def table(horizons: Sequence[int], runs: str, study_runs: str) -> list[dict]:
    """One row per H with seeds found: n, mean, interval, chance, margin, within bound."""
    from envs.multisearch_recall_v1 import make_config

    rows = []
    for horizon in horizons:
        found = successes(horizon, runs, study_runs)
        if not found:
            continue
        values = [found[k] for k in sorted(found)]
        chance = make_config(memory_horizon=horizon, n_scouts=0, n_rescuers=1).chance
        mean = float(np.mean(values))
        rows.append({
            "H": horizon, "n": len(values), "seeds": sorted(found), "mean": mean,
            "ci": bootstrap_interval(values), "chance": chance, "margin": mean - chance,
            "within": mean <= chance + MARGIN,
        })  # fmt: skip
    return rows


def markdown(rows: Sequence[dict]) -> str:
    lines = [
        "| H | seeds | chance | mlp final success [95% CI] | - chance | <= chance + 0.1 |",
        "|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lo, hi = r["ci"]
        lines.append(
            f"| {r['H']} | {r['n']} | {r['chance']:.3f} | {r['mean']:.3f} [{lo:.3f}, {hi:.3f}] "
            f"| {r['margin']:+.3f} | {'yes' if r['within'] else 'no'} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--horizons", type=int, nargs="+", default=[64, 256, 1024, 4096])
    parser.add_argument("--seeds", default="16-31", help="seeds to train, A-B (default 16-31)")
    parser.add_argument("--report-only", action="store_true", help="train nothing")
    parser.add_argument("--runs", default=RUNS, help="where this script's runs go")
    parser.add_argument("--study-runs", default=STUDY_RUNS, help="the study's runs, pooled in")
    parser.add_argument("--total-steps", type=int, default=BUDGET, help="the study's: 1M")
    args = parser.parse_args(argv)
    first, last = (int(x) for x in args.seeds.split("-"))
    for horizon in [] if args.report_only else args.horizons:
        done = successes(horizon, args.runs, "")
        size = seeds_per_process(horizon)
        for a in range(first, last + 1, size):
            b = min(a + size - 1, last)
            if all(k in done for k in range(a, b + 1)):
                continue
            stale = os.path.join(args.runs, f"h{horizon}", f"seeds_{a}-{b}")
            if os.path.isdir(stale) and not _has_checkpoint(stale):
                shutil.rmtree(stale)  # stopped before its first checkpoint: nothing to lose
            cmd = command(horizon, a, b, args.runs, args.total_steps)
            print("$", " ".join(cmd[1:]), flush=True)
            subprocess.run(cmd, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    print(markdown(table(args.horizons, args.runs, args.study_runs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
