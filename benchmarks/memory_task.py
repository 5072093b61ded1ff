"""Success on multisearch_recall_v0 / _v1 by memory horizon H: memory is needed, and enough.

For each H, one episode per seed 0..E-1 (E = ``--episodes``, default 1,024) of

* ``remembering`` -- :class:`envs.multisearch_recall_v0.RememberingPolicy`: keeps the cue it
  saw at t = 0, then walks the cued zone's route (the scripted policy with memory);
* ``memoryless`` -- :class:`FixedZonePolicy(0)`: always zone 0's target, the best a policy
  without memory can do (success = chance in expectation; the module doc proves the bound);
* ``random`` -- uniform over the unmasked actions,

next to the chance level 1 / n_zones computed from the env's configuration, with the
memoryless policy's margin over chance and the random policy's success among the episodes
where it collects a target (chance again: the cue cannot steer it).

``--env v1`` measures :mod:`envs.multisearch_recall_v1` (one answer action at step H; no
decision walk, so random is at chance too, and no ``--decision-steps``): the same three
policies, the random one's margin over chance besides the fixed zone's.

``--train`` also trains default MAPPO (``--backbone``, mlp by default; more ``marl.train``
flags with ``--train-flags``) with ``python -m marl.train --env-fn
envs.multisearch_recall_<env>:vector_env`` for each H of ``--train-horizons`` at
``--train-steps`` env steps and reports eval.json's success rate over ``--episodes``
validation episodes (seeds 10000..) and the env steps at which the training success
(metrics.jsonl, ``episode/success``) first reached 0.5, in one update and as a mean of 10.

    python benchmarks/memory_task.py                   # v0, H = 16 .. 4096, ~6 min (4096: 4)
    python benchmarks/memory_task.py --quick           # H = 16, 64; 256 episodes
    python benchmarks/memory_task.py --train --train-horizons 16 64   # + MAPPO, ~10 min a run
    python benchmarks/memory_task.py --env v1 --horizons 64 256 1024 4096   # ~1.5 min
    python benchmarks/memory_task.py --env v1 --horizons 64 --train --train-horizons 64 \
        --train-steps 300000 --episodes 256               # + mlp MAPPO, ~1 min
    python benchmarks/memory_task.py --env v1 --horizons 16 --train --train-horizons 16 64 \
        --backbone gru --train-steps 1000000 --episodes 256 \
        --train-flags "--num-envs 16 --rollout-steps 128 --seq-len 128"
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import shlex
import subprocess
import sys
import time
from types import ModuleType

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def recall_module(version: str) -> ModuleType:
    """``envs.multisearch_recall_<version>``."""
    return importlib.import_module(f"envs.multisearch_recall_{version}")


def scripted_row(
    recall: ModuleType, horizon: int, episodes: int, decision_steps: int | None
) -> dict[str, float]:
    """The three scripted policies at one horizon (same seeds for each); ``decision_steps``
    None for v1 (it has none)."""
    kw: dict[str, int] = dict(memory_horizon=horizon)
    if decision_steps is not None:
        kw["decision_steps"] = decision_steps
    seeds = range(episodes)
    start = time.perf_counter()
    remembering = recall.evaluate_policy(recall.RememberingPolicy(), seeds, **kw)
    memoryless = recall.evaluate_policy(recall.FixedZonePolicy(0), seeds, **kw)
    random = recall.evaluate_policy(recall.RandomPolicy(0), seeds, **kw)
    return {
        "H": horizon,
        "D": decision_steps,
        "episodes": episodes,
        "chance": recall.make_config(**kw).chance,
        "remembering": remembering["success_rate"],
        "memoryless": memoryless["success_rate"],
        "random": random["success_rate"],
        "random_collect": random.get("collect_rate", math.nan),
        "seconds": time.perf_counter() - start,
    }


def first_success_at(metrics_path: str, level: float, window: int = 1) -> int | None:
    """The env steps at which the training ``episode/success`` of metrics.jsonl, averaged
    over ``window`` consecutive updates (1: a single update's, a few dozen episodes), first
    reached ``level`` (the last update of that window); None if it never did."""
    steps: list[int] = []
    successes: list[float] = []
    with open(metrics_path) as f:
        for line in f:
            row = json.loads(line)
            if row.get("episode/success") is not None:
                steps.append(int(row["env_steps"]))
                successes.append(float(row["episode/success"]))
    for end in range(window, len(successes) + 1):
        if sum(successes[end - window : end]) / window >= level:
            return steps[end - 1]
    return None


def train_row(
    version: str,
    horizon: int,
    steps: int,
    seed: int,
    backbone: str,
    episodes: int,
    runs_dir: str,
    flags: list[str],
) -> dict[str, float | int | None]:
    """Default MAPPO (plus ``flags``) for ``steps`` env steps at one horizon: eval.json's
    success rate and when the training success first reached 0.5."""
    run_dir = os.path.join(runs_dir, f"{version}_{backbone}_H{horizon}_s{seed}")
    command = [
        sys.executable,
        "-m",
        "marl.train",
        "--env-fn",
        f"envs.multisearch_recall_{version}:vector_env",
        "--env.memory_horizon",
        str(horizon),
        "--backbone",
        backbone,
        "--total-steps",
        str(steps),
        "--seed",
        str(seed),
        "--final-eval-episodes",
        str(episodes),
        "--run-dir",
        run_dir,
        "--overwrite",
        "--progress",
        "false",
        "--plots",
        "false",
        *flags,
    ]
    print("$", " ".join(command[1:]), flush=True)
    start = time.perf_counter()
    subprocess.run(command, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(run_dir, "eval.json")) as f:
        result = json.load(f)
    metrics = os.path.join(run_dir, "metrics.jsonl")
    return {
        "H": horizon,
        "success": result["success_rate"],
        "episodes": result["n_episodes"],
        "passed_half_at": first_success_at(metrics, 0.5),
        "passed_half_at_mean10": first_success_at(metrics, 0.5, window=10),
        "seconds": time.perf_counter() - start,
    }


def print_scripted_table(version: str, horizons: list[int], episodes: int, decision: int) -> float:
    """The scripted rows at each horizon; returns the chance level."""
    recall = recall_module(version)
    decision_steps = decision if version == "v0" else None
    extra = ", one answer action at step H" if version == "v1" else ""
    print(
        f"multisearch_recall_{version} (defaults: 16x16, 2 scouts + 2 rescuers, 4 zones{extra}), "
        f"{episodes} episodes a cell (seeds 0..{episodes - 1}), success rate"
    )
    last = "random|collect" if version == "v0" else "- chance"
    header = (
        f"{'H':>5} {'D':>4} {'chance':>7} {'remembering':>12} {'memoryless':>11} "
        f"{'- chance':>9} {'random':>7} {last:>15} {'seconds':>8}"
    )
    print(header)
    print("-" * len(header))
    chance = math.nan
    for horizon in horizons:
        row = scripted_row(recall, horizon, episodes, decision_steps)
        chance = row["chance"]
        if version == "v0":
            collect = row["random_collect"]
            last_text = f"{row['random'] / collect if collect else math.nan:.3f}"
        else:
            last_text = f"{row['random'] - chance:+.3f}"
        decision_text = "-" if row["D"] is None else str(row["D"])
        print(
            f"{row['H']:>5} {decision_text:>4} {chance:>7.3f} {row['remembering']:>12.3f} "
            f"{row['memoryless']:>11.3f} {row['memoryless'] - chance:>+9.3f} "
            f"{row['random']:>7.3f} {last_text:>15} {row['seconds']:>8.1f}",
            flush=True,
        )
    standard_error = math.sqrt(chance * (1 - chance) / episodes)
    note = "random = P(collect) x chance" if version == "v0" else "random: exactly chance"
    print(
        f"memoryless and random{'|collect' if version == 'v0' else ''}: chance + noise "
        f"(binomial s.e. at chance {chance:.2f}: {standard_error:.3f}); {note}"
    )
    return chance


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", choices=["v0", "v1"], default="v0", help="recall version")
    parser.add_argument("--horizons", type=int, nargs="+", default=[16, 64, 256, 1024, 4096])
    parser.add_argument("--episodes", type=int, default=1024, help="episodes (= seeds) a cell")
    parser.add_argument("--decision-steps", type=int, default=64, help="v0 only")
    parser.add_argument("--quick", action="store_true", help="H = 16, 64 with 256 episodes")
    parser.add_argument("--train", action="store_true", help="also train default MAPPO")
    parser.add_argument("--train-horizons", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--train-steps", type=int, default=500_000)
    parser.add_argument("--train-seed", type=int, default=0)
    parser.add_argument("--backbone", default="mlp")
    parser.add_argument("--train-flags", default="", help="more marl.train flags, one string")
    parser.add_argument("--runs-dir", default=os.path.join(REPO, "runs", "memory_task"))
    args = parser.parse_args(argv)
    if args.quick:
        args.horizons, args.episodes = [16, 64], 256

    chance = print_scripted_table(args.env, args.horizons, args.episodes, args.decision_steps)
    if args.train:
        print(
            f"\ndefault MAPPO ({args.backbone}), {args.train_steps} env steps, seed "
            f"{args.train_seed}, success over {args.episodes} validation episodes"
        )
        for horizon in args.train_horizons:
            row = train_row(
                args.env,
                horizon,
                args.train_steps,
                args.train_seed,
                args.backbone,
                args.episodes,
                args.runs_dir,
                shlex.split(args.train_flags),
            )
            passed = [row["passed_half_at"], row["passed_half_at_mean10"]]
            one, ten = ("never" if p is None else f"at {p} env steps" for p in passed)
            print(
                f"H {row['H']:>5}: success {row['success']:.3f} (chance {chance:.3f}, "
                f"{row['success'] - chance:+.3f}); training success first >= 0.5 {one} "
                f"(mean of 10 updates: {ten}); {row['seconds']:.0f} s",
                flush=True,
            )


if __name__ == "__main__":
    main()
