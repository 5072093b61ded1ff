"""What bounds a seed batch's iteration: measured time per phase against its compute floor.

For one ``SeedMAPPO`` / ``SeedGRPO`` iteration (``marl.algos.seeds``) at each batch size S,
the floating-point work of the rollout and of the update is counted with
``torch.utils.flop_counter.FlopCounterMode`` (matmuls: mm, addmm, bmm, baddbmm, and their
backward), then divided by this machine's GEMM rate measured in the same process (a square
float32 matmul of ``--gemm-size`` at the same thread count): the phase's *compute floor*,
the time it would take if every FLOP ran at the GEMM rate. Printed beside the measured phase
time (the metrics' ``time/collect_s`` and ``time/update_s``, one iteration after a warm-up,
not under the counter) as ``floor / measured``: near 1, the phase is GEMM-bound and batching
more seeds cannot make it cheaper per seed; far below 1, per-operator overhead, memory
traffic or non-GEMM work (the env, Python) bound it, which batching can cut.

    python benchmarks/seeds_floor.py [--sizes 1 16] [--threads 1] [-- train flags]
    python benchmarks/seeds_floor.py --sizes 1 16 -- --backbone gru --env.preset memory
    python benchmarks/seeds_floor.py --sizes 1 16 -- --algo grpo

The counter sees torch operators only: numba kernels (the envs, Mamba's fused scans) are
not counted, so for mamba / mamba2 the floor leaves out the scan.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def gemm_rate(size: int, repeats: int = 5) -> float:
    """Float32 GEMM FLOP/s of this machine at torch's current thread count (best of
    ``repeats`` square ``size`` matmuls)."""
    import torch

    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t)
    return 2.0 * size**3 / best


def count_phases(batch, progress: float) -> tuple[float, float]:
    """FLOPs of one iteration's rollout and of its update (counted apart)."""
    from torch.utils.flop_counter import FlopCounterMode

    phases = {"collect": 0.0, "update": 0.0}
    original = type(batch).update

    def counted_update(self, *args, **kwargs):
        with FlopCounterMode(display=False) as counter:
            out = original(self, *args, **kwargs)
        phases["update"] = float(counter.get_total_flops())
        return out

    type(batch).update = counted_update
    try:
        with FlopCounterMode(display=False) as total:
            batch.iteration(progress)
    finally:
        type(batch).update = original
    phases["collect"] = float(total.get_total_flops()) - phases["update"]
    return phases["collect"], phases["update"]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    p = argparse.ArgumentParser(
        prog="python benchmarks/seeds_floor.py",
        description=__doc__.split("\n\n")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 16], help="Batch sizes S.")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1).")
    p.add_argument("--gemm-size", type=int, default=512, help="Matmul size of the GEMM rate.")
    args = p.parse_args(argv)
    if min(args.sizes) < 1 or args.threads < 1 or args.gemm_size < 16:
        p.error("--sizes and --threads take integers >= 1, --gemm-size >= 16")
    os.environ.setdefault("NUMBA_NUM_THREADS", str(args.threads))
    import torch

    from marl.algos import resolve_algorithm
    from marl.run.config import ConfigError, parse_cli
    from marl.run.train import configure_process

    torch.set_num_threads(args.threads)
    try:
        base = parse_cli(["--progress", "false", *extra])
    except ConfigError as exc:
        p.error(str(exc))
    algorithm = resolve_algorithm(base.algo)
    batched = algorithm.batch_class()
    configure_process(base)
    rate = gemm_rate(args.gemm_size)
    print(f"GEMM rate: {rate / 1e9:.1f} GFLOP/s ({args.gemm_size}^3 float32, "
          f"{args.threads} thread(s)); algo={base.algo} backbone={base.backbone} "
          f"flags: {' '.join(extra) or '(defaults)'}")  # fmt: skip
    print(f"{'S':>4} {'phase':>8} {'MFLOP':>10} {'floor s':>9} {'measured s':>11} "
          f"{'floor/measured':>15} {'measured/seed s':>16}")  # fmt: skip
    for S in args.sizes:
        cfgs = [parse_cli(["--progress", "false", "--seed", str(k), *extra]) for k in range(S)]
        batch = batched(cfgs, algorithm=algorithm)
        batch.iteration(0.0)  # warm-up: numba compilation, allocations
        row = next(r for r in batch.iteration(0.1) if r)
        flops = count_phases(batch, 0.2)
        for phase, work, key in (("collect", flops[0], "time/collect_s"),
                                 ("update", flops[1], "time/update_s")):  # fmt: skip
            measured = row[key]
            floor = work / rate
            print(f"{S:>4} {phase:>8} {work / 1e6:>10.1f} {floor:>9.3f} {measured:>11.3f} "
                  f"{floor / measured:>15.2f} {measured / S:>16.4f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
