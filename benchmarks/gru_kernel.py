"""The GRU recurrence in numba (``SeedGRU.fused``, :mod:`marl.core.kernels.gru_numba`) against
its readable torch loop (``SeedGRU.fused = False``), measured in one process, interleaved:

1. end to end: two MAPPO trainers with the gru backbone, built alike from one seed, one
   iteration each in turn (rollout, advantages, policy and value epochs), the recurrence
   switched before each; agent-steps per second of the iteration and of its update, medians,
   and the ratio fused / loop. Two setups: gru's defaults on the default env, and the
   memory_horizon study's H = 64 recipe (whole-episode windows of 260 steps, 8 x 16
   minibatches), or the train flags after ``--`` instead;
2. the recurrence alone: ``SeedGRU`` forward and backward at a training minibatch's shapes
   (S seeds, B rows, L steps, hidden 64), per shape, medians and the ratio.

The first pass of each warms up (numba compiles, or loads its cache)::

    OMP_NUM_THREADS=1 python benchmarks/gru_kernel.py [--updates 4] [--repeats 20] \\
        [-- extra train flags]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

#: memory_horizon's H = 64 cell, the gru arm (marl.experiments.studies.memory_horizon_settings)
RECALL_64 = [
    "--env-fn", "envs.multisearch_recall_v1:vector_env", "--env.memory_horizon", "64",
    "--env.n_scouts", "0", "--env.n_rescuers", "1", "--num-envs", "64",
    "--rollout-steps", "260", "--seq-len", "260", "--burn-in", "0", "--epochs", "8",
    "--num-minibatches", "16", "--penalty-channel", "none", "--chrono-init", "128",
]  # fmt: skip


def _make_algo(extra: list[str], threads: int):
    from marl.algos.mappo import MAPPO
    from marl.run.config import parse_cli
    from marl.run.train import configure_process

    cfg = parse_cli(["--backbone", "gru", "--progress", "false", "--torch-threads", str(threads),
                     *extra])  # fmt: skip
    configure_process(cfg)
    return MAPPO(cfg, None)


def end_to_end(label: str, extra: list[str], updates: int, threads: int) -> None:
    import torch

    from marl.core.seed_batched import SeedGRU

    algos = []
    for _ in range(2):
        torch.manual_seed(0)
        algos.append(_make_algo(extra, threads))
    rates: dict[bool, dict[str, list[float]]] = {
        f: {"train": [], "update": []} for f in (True, False)
    }
    for round_ in range(updates + 1):  # round 0 warms up
        order = (True, False) if round_ % 2 == 0 else (False, True)
        for fused in order:
            algo = algos[0 if fused else 1]
            SeedGRU.fused = fused
            t = time.perf_counter()
            m = algo.iteration(min(round_ / (updates + 1), 1.0))
            dt = time.perf_counter() - t
            if round_ > 0:
                n = m["env_steps_delta"] * algo.layout.n_agents
                rates[fused]["train"].append(n / dt)
                rates[fused]["update"].append(n / m["time/update_s"])
    SeedGRU.fused = True
    med = {f: {k: float(np.median(v)) for k, v in r.items()} for f, r in rates.items()}
    cfg = algos[0].cfg
    print(f"\n{label}: E={cfg.num_envs} agents={algos[0].layout.n_agents} T={cfg.rollout_steps} "
          f"L={cfg.seq_len} epochs x minibatches={cfg.epochs}x{cfg.num_minibatches}, "
          f"{updates} iterations each, interleaved, medians (agent-steps/s)")  # fmt: skip
    print(f"{'':<8}{'loop':>12}{'fused':>12}{'fused/loop':>12}")
    for key in ("train", "update"):
        loop, fused = med[False][key], med[True][key]
        print(f"{key:<8}{loop:>12,.0f}{fused:>12,.0f}{fused / loop:>12.2f}")


def recurrence(repeats: int, threads: int) -> None:
    import torch
    from torch import nn

    from marl.core.seed_batched import stack_modules

    torch.set_num_threads(threads)
    print(f"\nrecurrence alone: SeedGRU forward + backward, hidden 64, {repeats} calls each, "
          "interleaved, medians (ms)")  # fmt: skip
    print(f"{'S':>3}{'B':>5}{'L':>6}{'loop':>10}{'fused':>10}{'loop/fused':>12}")
    for S, B, L in ((1, 4, 260), (1, 16, 64), (1, 128, 16), (16, 4, 260)):
        torch.manual_seed(0)
        gru = stack_modules([nn.GRU(64, 64, batch_first=True) for _ in range(S)])
        x = torch.randn(S, B, L, 64, requires_grad=True)
        resets = torch.rand(S, B, L) < 0.02
        times: dict[bool, list[float]] = {True: [], False: []}
        for rep in range(repeats + 1):
            for fused in (True, False):
                t = time.perf_counter()
                y, h = gru(x, None, resets, fused=fused)
                (y.sum() + h.sum()).backward()
                if rep > 0:
                    times[fused].append(time.perf_counter() - t)
        loop, fused = (1e3 * float(np.median(times[f])) for f in (False, True))
        print(f"{S:>3}{B:>5}{L:>6}{loop:>10.2f}{fused:>10.2f}{loop / fused:>12.2f}")


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--updates", type=int, default=4, help="timed iterations per trainer")
    p.add_argument("--repeats", type=int, default=20, help="timed calls per recurrence shape")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("extra", nargs="*", help="train flags after --: replace the two setups")
    args = p.parse_args()
    from marl.run.numba_pool import size_numba_pool

    size_numba_pool(["--torch-threads", str(args.threads)])
    if args.extra:
        end_to_end("given flags", args.extra, args.updates, args.threads)
    else:
        end_to_end("gru defaults, default env", [], args.updates, args.threads)
        end_to_end("memory_horizon H = 64 (gru arm)", RECALL_64, args.updates, args.threads)
    recurrence(args.repeats, args.threads)


if __name__ == "__main__":
    main()
