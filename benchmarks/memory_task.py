"""Success on multisearch_recall_v0 by memory horizon H: memory is needed, and enough.

For each H, one episode per seed 0..E-1 (E = ``--episodes``, default 1,024) of

* ``remembering`` -- :class:`envs.multisearch_recall_v0.RememberingPolicy`: keeps the cue it
  saw at t = 0, then walks the cued zone's route (the scripted policy with memory);
* ``memoryless`` -- :class:`FixedZonePolicy(0)`: always zone 0's target, the best a policy
  without memory can do (success = chance in expectation; the module doc proves the bound);
* ``random`` -- uniform over the unmasked actions,

next to the chance level 1 / n_zones computed from the env's configuration, with the
memoryless policy's margin over chance and the random policy's success among the episodes
where it collects a target (chance again: the cue cannot steer it).

``--train`` also trains default MAPPO (``--backbone``, mlp by default) with
``python -m marl.train --env-fn envs.multisearch_recall_v0:vector_env`` for each H of
``--train-horizons`` at ``--train-steps`` env steps and reports eval.json's success rate over
``--episodes`` validation episodes (seeds 10000..).

    python benchmarks/memory_task.py                   # H = 16 .. 4096, ~6 min (4096: 4)
    python benchmarks/memory_task.py --quick           # H = 16, 64; 256 episodes
    python benchmarks/memory_task.py --train --train-horizons 16 64   # + MAPPO, ~10 min a run
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from envs import multisearch_recall_v0 as recall  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def scripted_row(horizon: int, episodes: int, decision_steps: int) -> dict[str, float]:
    """The three scripted policies at one horizon (same seeds for each)."""
    kw = dict(memory_horizon=horizon, decision_steps=decision_steps)
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
        "random_collect": random["collect_rate"],
        "seconds": time.perf_counter() - start,
    }


def train_row(
    horizon: int, steps: int, seed: int, backbone: str, episodes: int, runs_dir: str
) -> dict[str, float]:
    """Default MAPPO for ``steps`` env steps at one horizon: eval.json's success rate."""
    run_dir = os.path.join(runs_dir, f"{backbone}_H{horizon}_s{seed}")
    command = [
        sys.executable,
        "-m",
        "marl.train",
        "--env-fn",
        "envs.multisearch_recall_v0:vector_env",
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
    ]
    print("$", " ".join(command[1:]), flush=True)
    start = time.perf_counter()
    subprocess.run(command, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(run_dir, "eval.json")) as f:
        result = json.load(f)
    return {
        "H": horizon,
        "success": result["success_rate"],
        "episodes": result["n_episodes"],
        "seconds": time.perf_counter() - start,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--horizons", type=int, nargs="+", default=[16, 64, 256, 1024, 4096])
    parser.add_argument("--episodes", type=int, default=1024, help="episodes (= seeds) a cell")
    parser.add_argument("--decision-steps", type=int, default=64)
    parser.add_argument("--quick", action="store_true", help="H = 16, 64 with 256 episodes")
    parser.add_argument("--train", action="store_true", help="also train default MAPPO")
    parser.add_argument("--train-horizons", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--train-steps", type=int, default=500_000)
    parser.add_argument("--train-seed", type=int, default=0)
    parser.add_argument("--backbone", default="mlp")
    parser.add_argument("--runs-dir", default=os.path.join(REPO, "runs", "memory_task"))
    args = parser.parse_args(argv)
    if args.quick:
        args.horizons, args.episodes = [16, 64], 256

    print(
        f"multisearch_recall_v0 (defaults: 16x16, 2 scouts + 2 rescuers, 4 zones), "
        f"{args.episodes} episodes a cell (seeds 0..{args.episodes - 1}), success rate"
    )
    header = (
        f"{'H':>5} {'D':>4} {'chance':>7} {'remembering':>12} {'memoryless':>11} "
        f"{'- chance':>9} {'random':>7} {'random|collect':>15} {'seconds':>8}"
    )
    print(header)
    print("-" * len(header))
    for horizon in args.horizons:
        row = scripted_row(horizon, args.episodes, args.decision_steps)
        conditional = row["random"] / row["random_collect"] if row["random_collect"] else math.nan
        print(
            f"{row['H']:>5} {row['D']:>4} {row['chance']:>7.3f} {row['remembering']:>12.3f} "
            f"{row['memoryless']:>11.3f} {row['memoryless'] - row['chance']:>+9.3f} "
            f"{row['random']:>7.3f} {conditional:>15.3f} {row['seconds']:>8.1f}",
            flush=True,
        )
    standard_error = math.sqrt(0.25 * 0.75 / args.episodes)
    print(
        f"memoryless and random|collect: chance + noise (binomial s.e. at chance 0.25: "
        f"{standard_error:.3f}); random = P(collect) x chance"
    )
    if args.train:
        print(
            f"\ndefault MAPPO ({args.backbone}), {args.train_steps} env steps, seed "
            f"{args.train_seed}, success over {args.episodes} validation episodes"
        )
        for horizon in args.train_horizons:
            row = train_row(
                horizon,
                args.train_steps,
                args.train_seed,
                args.backbone,
                args.episodes,
                args.runs_dir,
            )
            print(
                f"H {row['H']:>5}: success {row['success']:.3f} (chance 0.250, "
                f"{row['success'] - 0.25:+.3f}), {row['seconds']:.0f} s",
                flush=True,
            )


if __name__ == "__main__":
    main()
