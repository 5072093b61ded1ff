"""How the raw advantages' scale differs by position in a study's setting (issue 47, item 4).

    python benchmarks/position_scales.py [--study whitening_position] [--variant batch]
                                         [--updates 3] [--seed 0]

Builds the study variant's MAPPO run, and for each of ``--updates`` rollouts prints the std of
the raw (unwhitened, team and individual mixed) advantages at a few step indices of the
episode, each averaged over the training window's episodes, then the ratio of the largest
per-position std to the smallest, and takes one update. The memory task's only reward comes
with the answer at step H, so GAE's advantages shrink by ``gamma * lambda`` per step back.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

# the repository first: benchmarks/seqmodels.py would shadow the package
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from marl.experiments.studies import get_study  # noqa: E402
from marl.run.config import parse_cli  # noqa: E402
from marl.run.train import _seed_everything, _start_process, get_algorithm, resolve_budget  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", default="whitening_position")
    parser.add_argument("--variant", default="batch")
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    cfg = parse_cli([*get_study(args.study).variants[args.variant], "--torch-threads=1"])
    horizon = cfg.env.get("memory_horizon")
    if horizon is None:
        parser.error(f"--study {args.study}: its env has no memory_horizon (a recall task's has)")
    resolve_budget(cfg)
    ctx, device = _start_process(cfg)
    _seed_everything(args.seed)
    algo = get_algorithm(cfg.algo)(cfg, ctx, device)
    window = cfg.seq_len
    step_in_episode = torch.arange(window) % (horizon + 1)
    shown = sorted({0, horizon // 4, horizon // 2, 3 * horizon // 4, horizon - 1, horizon})
    print("update  " + "  ".join(f"t={t:<5d}" for t in shown) + "  all      max/min")
    for update in range(args.updates):
        batch = algo.collect()
        raw = algo.advantages(batch, 0.0).raw  # [T, E, N]
        position = torch.arange(raw.shape[0]) % window
        std = torch.stack([raw[position == p].std() for p in range(window)])
        by_step = [float(std[step_in_episode == t].mean()) for t in shown]
        ratio = float(std.max() / std.min())
        cells = "  ".join(f"{s:<7.3f}" for s in by_step)
        print(f"{update:<6d}  {cells}  {float(raw.std()):<7.3f}  {ratio:.1f}")
        algo.update(batch, 0.0)


if __name__ == "__main__":
    main()
