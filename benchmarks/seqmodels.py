"""Speed and memory of seqmodels.Mamba / Mamba2 against mambapy and torch.nn.GRU, one run.

Measures (issue 4, item 6), all peers in the same process and run so ratios are comparable:

1. training throughput, forward + backward tokens/s at (B=32, L=1024, d_model=64, d_state=16,
   expand=2): seqmodels.Mamba (numba and chunked backends), seqmodels.Mamba2 (d_state=16,
   headdim=16), mambapy's MambaBlock (pscan), torch.nn.GRU(64, 64);
2. peak memory of one forward + backward (extra resident memory of a fresh subprocess, after a
   warm-up call on a tiny input so numba's compilation is not counted; the kernel's
   high-water mark VmHWM on Linux, reset before the call);
3. long sequences (B=4, L=16384): seqmodels Mamba / Mamba2 and GRU forward + backward;
4. step latency at B=1024: Mamba.step / Mamba2.step vs torch.nn.GRUCell(64, 64), early and
   late in a rollout (constant in t);
5. with CUDA and mamba-ssm: the cuda backend vs the chunked torch path at L >= 1024;
6. with ``--ratios`` (alone): the issue-17 ratios in one table, every pair timed in
   interleaved repeats (medians) in the same process, at torch's default thread count and at
   one thread: Mamba / Mamba2 vs nn.GRU fwd+bwd (B=32, L=1024), Mamba.step vs nn.GRUCell
   (B=1024), MambaBackbone.step vs GRUBackbone.step (B=128, 1024; 1% resets) and their
   forward + backward on training windows with resets (L=16, 64, 256, 1024), and the
   backbones' RMSNorm twin vs ``F.rms_norm`` (fwd+bwd on [64, 64, 64]);
7. with ``--compare-threading-layers``: the step latencies and the training and no-grad
   forward times on each of numba's threading layers loadable here (workqueue, omp, tbb), one
   fresh process per layer (numba picks its layer once per process), as ratios to workqueue.

numba's threading layer is the script's own choice for its process
(``seqmodels.kernels.set_numba_threading_layer``, ``--threading-layer``, default auto as the
trainer's: omp for a one-thread pool, workqueue for more); seqmodels itself sets none. With
``--threads N`` numba's pool is sized to N (as the trainer sizes it to its torch threads)
unless ``NUMBA_NUM_THREADS`` is set. So are glibc's allocator thresholds
(``--malloc-tuning``: fixed as the trainer fixes them, ``seqmodels.kernels.
set_malloc_thresholds``; default: glibc's adaptive ones, under which a Mamba block's large
activations are paged in afresh each call).

Usage::

    python benchmarks/seqmodels.py            # full run (a few minutes on 2 cores)
    python benchmarks/seqmodels.py --quick    # smaller sizes, fewer repetitions (smoke test)
    python benchmarks/seqmodels.py --threads 1 --markdown out.md
    python benchmarks/seqmodels.py --compare-threading-layers --only-layers
    python benchmarks/seqmodels.py --ratios --clock cpu   # issue-17 ratios (both thread counts)
    python benchmarks/seqmodels.py --ratios --clock cpu --malloc-tuning   # as in the trainer
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from seqmodels import Mamba, Mamba2  # noqa: E402
from seqmodels.kernels import (  # noqa: E402
    auto_threading_layer,
    numba_threading_layer,
    set_malloc_thresholds,
    set_numba_threading_layer,
)

D_MODEL, D_STATE, EXPAND = 64, 16, 2


# ------------------------------------------------------------------------------------------
# models
# ------------------------------------------------------------------------------------------


def build(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """A function x [B, L, 64] -> y [B, L, 64] for the named model (fresh parameters)."""
    torch.manual_seed(0)
    # (mambapy first: "mambapy".startswith("mamba") is true, so checked after the seqmodels
    # names it would silently build a seqmodels.Mamba instead of mambapy's block)
    if name == "mambapy":
        from mambapy.mamba import MambaBlock, MambaConfig

        cfg = MambaConfig(
            d_model=D_MODEL, n_layers=1, d_state=D_STATE, expand_factor=EXPAND, pscan=True
        )
        block = MambaBlock(cfg)
        return block
    if name.startswith("mamba2"):
        m2 = Mamba2(D_MODEL, d_state=D_STATE, expand=EXPAND, headdim=16, chunk_size=64)
        m2.backend = name.split(":")[1] if ":" in name else "auto"
        return lambda x: m2(x)[0]
    if name.startswith("mamba"):
        m = Mamba(D_MODEL, d_state=D_STATE, expand=EXPAND)
        m.backend = name.split(":")[1] if ":" in name else "auto"
        return lambda x: m(x)[0]
    if name == "gru":
        gru = nn.GRU(D_MODEL, D_MODEL, batch_first=True)
        return lambda x: gru(x)[0]
    raise ValueError(f"unknown model {name!r}")


def fwd_bwd(model: Callable, x: torch.Tensor) -> None:
    model(x).sum().backward()


CLOCK = {"wall": time.perf_counter, "cpu": time.process_time}
clock = time.perf_counter
threading_layer = "workqueue"  # numba's, for this process and the memory subprocesses


def time_train(name: str, batch: int, length: int, reps: int) -> float:
    """Seconds per forward + backward (best of ``reps`` after one warm-up call), measured with
    ``clock`` (wall time, or process CPU time with ``--clock cpu``)."""
    model = build(name)
    x = torch.randn(batch, length, D_MODEL, requires_grad=True)
    fwd_bwd(model, x[:, : min(length, 64)])  # warm-up (numba compile / cache load)
    fwd_bwd(model, x)
    best = float("inf")
    for _ in range(reps):
        start = clock()
        fwd_bwd(model, x)
        best = min(best, clock() - start)
    return best


def peak_memory_mb(name: str, batch: int, length: int, threads: int) -> float:
    """Extra peak RSS (MB) of one forward + backward, measured in a fresh subprocess."""
    cmd = [sys.executable, __file__, "--_mem-child", name, str(batch), str(length)]
    cmd += ["--threading-layer", threading_layer]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _reset_peak_rss() -> bool:
    """Reset the kernel's resident-set high-water mark (VmHWM); False where unsupported."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _mem_child(name: str, batch: int, length: int) -> None:
    """Print the peak of (RSS - RSS before) during one fwd+bwd.

    Linux: the kernel's high-water mark (VmHWM), reset just before the call, so no peak is
    missed. Elsewhere: RSS sampled every ~1 ms by a thread (which cannot run while a kernel
    holds the GIL, so it may miss short peaks)."""
    import gc
    import threading

    model = build(name)
    x = torch.randn(batch, length, D_MODEL, requires_grad=True)
    fwd_bwd(model, torch.randn(2, 16, D_MODEL, requires_grad=True))  # compile/cache load
    gc.collect()
    base = _rss_mb()
    if _reset_peak_rss():
        fwd_bwd(model, x)
        print(_peak_rss_mb() - base)
        return
    peak = [base]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss_mb())
            time.sleep(0.001)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    fwd_bwd(model, x)
    done.set()
    sampler.join()
    peak[0] = max(peak[0], _rss_mb())
    print(peak[0] - base)


def step_latency(name: str, batch: int, steps: int) -> tuple[float, float]:
    """Mean seconds per step over the first and the last 20% of ``steps`` steps (no grad)."""
    torch.manual_seed(0)
    x = torch.randn(batch, D_MODEL)
    if name == "gru":
        cell = nn.GRUCell(D_MODEL, D_MODEL)
        state: object = torch.zeros(batch, D_MODEL)

        def step(s):
            return cell(x, s)
    else:
        m = (
            Mamba(D_MODEL, d_state=D_STATE, expand=EXPAND)
            if name == "mamba"
            else Mamba2(D_MODEL, d_state=D_STATE, expand=EXPAND, headdim=16)
        )
        state = m.initial_state(batch)

        def step(s):
            return m.step(x, s)[1]

    times = []
    with torch.no_grad():
        for _ in range(5):
            state = step(state)
        for _ in range(steps):
            start = clock()
            state = step(state)
            times.append(clock() - start)
    k = max(1, steps // 5)
    early = sorted(times[:k])[k // 2]  # medians: robust to other processes on the machine
    late = sorted(times[-k:])[k // 2]
    return early, late


def time_forward(name: str, batch: int, length: int, reps: int) -> float:
    """Seconds per no-grad forward (best of ``reps`` after a warm-up call)."""
    model = build(name)
    x = torch.randn(batch, length, D_MODEL)
    with torch.no_grad():
        model(x[:, : min(length, 64)])
        model(x)
        best = float("inf")
        for _ in range(reps):
            start = clock()
            model(x)
            best = min(best, clock() - start)
    return best


def _interleaved(fns: dict[str, Callable[[], object]], reps: int) -> dict[str, float]:
    """Median seconds of each function over ``reps`` rounds that run all of them in turn (so
    load from other processes hits each alike), after one warm-up call each."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            start = clock()
            fn()
            times[k].append(clock() - start)
    return {k: statistics.median(v) for k, v in times.items()}


def _train_ratios(tag: str, length: int) -> list[tuple[str, str]]:
    """Mamba / Mamba2 vs nn.GRU forward + backward speed at B=32."""
    x = torch.randn(32, length, D_MODEL, requires_grad=True)
    models = {n: build(n) for n in ("gru", "mamba", "mamba2")}
    t = _interleaved({n: functools.partial(fwd_bwd, m, x) for n, m in models.items()}, 5)
    return [
        (f"{n} / nn.GRU fwd+bwd speed, B=32 L={length}, {tag}", f"{t['gru'] / t[n]:.2f}x")
        for n in ("mamba", "mamba2")
    ]


class _Stepper:
    """Calls ``fn(x, state) -> (y, state)`` (or ``-> state``) carrying the state along."""

    def __init__(self, fn: Callable, x: torch.Tensor, state: object, *extra: object) -> None:
        self.fn, self.x, self.state, self.extra = fn, x, state, extra

    def __call__(self) -> None:
        out = self.fn(self.x, self.state, *self.extra)
        self.state = out[1] if isinstance(out, tuple) and len(out) == 2 else out


@torch.no_grad()
def _step_ratios(tag: str, scale: int) -> list[tuple[str, str]]:
    """Mamba.step and Mamba2.step vs nn.GRUCell (B=1024); the Mamba and Mamba2 backbones'
    steps vs GRUBackbone.step (B=128, 1024)."""
    from seqmodels.backbones import make_backbone

    batch = 1024
    x = torch.randn(batch, D_MODEL)
    cell = nn.GRUCell(D_MODEL, D_MODEL)
    blocks = {
        "mamba": Mamba(D_MODEL, d_state=D_STATE, expand=EXPAND),
        "mamba2": Mamba2(D_MODEL, d_state=D_STATE, expand=EXPAND, headdim=16),
    }
    fns = {"gru": _Stepper(cell, x, torch.zeros(batch, D_MODEL))}
    fns |= {k: _Stepper(b.step, x, b.initial_state(batch)) for k, b in blocks.items()}
    t = _interleaved(fns, 300 // scale)
    rows = [
        (f"Mamba.step / nn.GRUCell time, B={batch}, {tag}", f"{t['mamba'] / t['gru']:.2f}x"),
        (f"Mamba2.step / nn.GRUCell time, B={batch}, {tag}", f"{t['mamba2'] / t['gru']:.2f}x"),
    ]
    for batch in (128, 1024):
        x = torch.randn(batch, 40)
        reset = torch.rand(batch) < 0.01
        nets = {k: make_backbone(k, 40, D_MODEL) for k in ("gru", "mamba", "mamba2")}
        fns = {k: _Stepper(n.step, x, n.initial_state(batch), reset) for k, n in nets.items()}
        t = _interleaved(fns, (300 if batch == 128 else 150) // scale)
        for k, label in (("mamba", "MambaBackbone"), ("mamba2", "Mamba2 backbone")):
            name = f"{label}.step / GRUBackbone.step time, B={batch}, {tag}"
            rows.append((name, f"{t[k] / t['gru']:.2f}x"))
    return rows


def _backbone_fwd_bwd(net: nn.Module, x: torch.Tensor, state: tuple, resets: torch.Tensor) -> None:
    net(x, state, resets)[0].sum().backward()


def _window_ratios(tag: str, length: int) -> list[tuple[str, str]]:
    """MambaBackbone vs GRUBackbone forward + backward on a training window with resets."""
    from seqmodels.backbones import make_backbone

    batch = 128 if length <= 256 else 32
    x = torch.randn(batch, length, 40)
    resets = torch.rand(batch, length) < 1 / 200  # episodes of ~200 steps
    nets = {k: make_backbone(k, 40, D_MODEL) for k in ("gru", "mamba")}
    fns = {
        k: functools.partial(_backbone_fwd_bwd, n, x, n.initial_state(batch), resets)
        for k, n in nets.items()
    }
    t = _interleaved(fns, 3 if length >= 256 else 9)
    name = f"MambaBackbone / GRUBackbone fwd+bwd time, B={batch} L={length}, {tag}"
    return [(name, f"{t['mamba'] / t['gru']:.2f}x")]


def _norm_fwd_bwd(fn: Callable, x: torch.Tensor, w: torch.Tensor) -> None:
    fn(x, w, 1e-5).sum().backward()


def _norm_ratio(tag: str, scale: int) -> list[tuple[str, str]]:
    """The backbones' RMSNorm: its numba twin vs torch's F.rms_norm, forward + backward on a
    training minibatch's [windows, window, hidden] = [64, 64, 64] activations."""
    from seqmodels.kernels.numba_ops import rmsnorm_numba
    from seqmodels.ops import rmsnorm_reference

    x = torch.randn(64, 64 // scale, D_MODEL, requires_grad=True)
    w = torch.ones(D_MODEL, requires_grad=True)
    fns = {
        k: functools.partial(_norm_fwd_bwd, fn, x, w)
        for k, fn in (("twin", rmsnorm_numba), ("torch", rmsnorm_reference))
    }
    t = _interleaved(fns, 20)
    name = f"RMSNorm numba twin / F.rms_norm fwd+bwd speed, [64, {64 // scale}, 64], {tag}"
    return [(name, f"{t['torch'] / t['twin']:.2f}x")]


def issue17_ratios(emit: Callable[[str], None], quick: bool) -> None:
    """The issue-17 ratios at torch's default thread count and at one thread (see the module
    docstring, item 6). Speed ratios: > 1 means Mamba is faster; time ratios: < 1 means it
    is faster."""
    default_threads = torch.get_num_threads()
    scale = 4 if quick else 1
    rows: list[tuple[str, str]] = []
    for threads in dict.fromkeys((default_threads, 1)):
        torch.set_num_threads(threads)
        torch.manual_seed(0)
        tag = f"{threads} thread{'s' if threads > 1 else ''}"
        rows += _train_ratios(tag, 1024 // scale)
        rows += _step_ratios(tag, scale)
        for length in (16, 64) if quick else (16, 64, 256, 1024):
            rows += _window_ratios(tag, length)
        rows += _norm_ratio(tag, scale)
    torch.set_num_threads(default_threads)
    emit("| measure | ratio |")
    emit("|---|---|")
    for name, value in rows:
        emit(f"| {name} | {value} |")


LAYERS = ("workqueue", "omp", "tbb")


def _layer_child(threads: int | None, quick: bool) -> None:
    """Print (JSON) step latencies (wall, and CPU time of the process) and training / no-grad
    forward wall times on this process's threading layer."""
    if threads is not None:
        torch.set_num_threads(threads)
    reps = 1 if quick else 3
    batch, length, steps = (8, 256, 50) if quick else (32, 1024, 300)
    global clock
    res: dict[str, float] = {}
    for n in ("gru", "mamba", "mamba2"):
        res[f"step {n}"] = step_latency(n, 1024, steps)[1]
    clock = time.process_time  # CPU of all the process's threads: idle workers' spinning too
    for n in ("mamba", "mamba2"):
        res[f"step {n} cpu"] = step_latency(n, 1024, steps)[1]
    clock = time.perf_counter
    for n in ("mamba:numba", "mamba2:numba"):
        res[f"train {n}"] = time_train(n, batch, length, reps)
        res[f"forward {n}"] = time_forward(n, batch, length, reps)
    assert numba_threading_layer() == threading_layer, numba_threading_layer()
    print(json.dumps(res))


def compare_threading_layers(threads: int | None, quick: bool, rounds: int, emit: Callable) -> None:
    """Fresh processes per loadable threading layer, ``rounds`` rounds of all layers in turn
    (so that load from other processes hits each alike); medians, ratios to workqueue's."""
    runs: dict[str, list[dict]] = {}
    for _ in range(rounds):
        for layer in LAYERS:
            if layer in runs and not runs[layer]:
                continue  # not loadable here
            cmd = [sys.executable, __file__, "--threading-layer", layer, "--_layer-child"]
            cmd += [] if threads is None else ["--threads", str(threads)]
            cmd += ["--quick"] if quick else []
            out = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if out.returncode != 0:
                emit(f"- {layer}: not available here ({out.stderr.strip().splitlines()[-1]})")
                runs[layer] = []
                continue
            runs.setdefault(layer, []).append(json.loads(out.stdout.strip().splitlines()[-1]))
    results = {
        layer: {k: statistics.median(r[k] for r in rs) for k in rs[0] if k != "layer"}
        for layer, rs in runs.items()
        if rs
    }
    if "workqueue" not in results:
        return
    base = results["workqueue"]
    emit("| layer | " + " | ".join(base) + " |")
    emit("|---" * (len(base) + 1) + "|")
    for layer, res in results.items():
        cells = []
        for k, v in res.items():
            unit = f"{v * 1e3:.2f} ms" if k.startswith("step") else f"{v:.3f} s"
            cells.append(unit if layer == "workqueue" else f"{unit} ({v / base[k]:.2f}x)")
        emit(f"| {layer} | " + " | ".join(cells) + " |")


# ------------------------------------------------------------------------------------------
# main
# ------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, 1 repetition")
    parser.add_argument("--threads", type=int, default=None, help="torch/numba threads")
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCK),
        default="wall",
        help="wall time, or process CPU time (fairer on a shared machine with --threads 1)",
    )
    parser.add_argument("--reps", type=int, default=3, help="timed repetitions (best of)")
    parser.add_argument("--skip-memory", action="store_true", help="skip peak-memory runs")
    parser.add_argument("--skip-chunked", action="store_true", help="skip the torch fallback")
    parser.add_argument("--skip-long", action="store_true", help="skip the L=16384 case")
    parser.add_argument("--markdown", type=Path, default=None, help="also write results here")
    parser.add_argument(
        "--threading-layer",
        choices=("auto", *LAYERS),
        default="auto",
        help="numba's threading layer for this process; auto (the trainer's default): omp for "
        "a one-thread pool (--threads 1), else workqueue",
    )
    parser.add_argument(
        "--compare-threading-layers",
        action="store_true",
        help="also time steps and forwards on each loadable numba threading layer",
    )
    parser.add_argument(
        "--only-layers", action="store_true", help="run only the threading-layer comparison"
    )
    parser.add_argument(
        "--layer-rounds", type=int, default=3, help="rounds of the layer comparison (median)"
    )
    parser.add_argument(
        "--ratios",
        action="store_true",
        help="only the issue-17 ratios (both thread counts; --clock cpu on a shared machine)",
    )
    parser.add_argument(
        "--malloc-tuning",
        action="store_true",
        help="fix glibc's allocator thresholds first, as the trainer does by default "
        "(seqmodels.kernels.set_malloc_thresholds); off: glibc's adaptive ones",
    )
    parser.add_argument("--_mem-child", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--_layer-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    global clock, threading_layer
    if args.threads is not None and "NUMBA_NUM_THREADS" not in os.environ:
        os.environ["NUMBA_NUM_THREADS"] = str(args.threads)  # before numba is imported
    threading_layer = args.threading_layer
    if threading_layer == "auto":
        threading_layer = auto_threading_layer()
    set_numba_threading_layer(threading_layer)
    tuned = args.malloc_tuning and set_malloc_thresholds()
    if args._mem_child:
        name, b, length = args._mem_child
        _mem_child(name, int(b), int(length))
        return
    if args._layer_child:
        _layer_child(args.threads, args.quick)
        return
    clock = CLOCK[args.clock]
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    reps = 1 if args.quick else args.reps
    batch, length = (8, 256) if args.quick else (32, 1024)
    long_batch, long_len = (2, 2048) if args.quick else (4, 16384)
    step_batch, steps = (1024, 50) if args.quick else (1024, 500)
    lines: list[str] = []

    def emit(s: str = "") -> None:
        print(s, flush=True)
        lines.append(s)

    emit(
        f"torch {torch.__version__}, threads {threads}, cpu count {os.cpu_count()}, clock "
        f"{args.clock}, numba threading layer {threading_layer}, glibc thresholds "
        f"{'fixed (--malloc-tuning)' if tuned else 'adaptive'}, load average "
        f"{os.getloadavg()[0]:.1f}"
    )
    if args.ratios:
        emit(f"\n## issue-17 ratios (clock {args.clock}, medians of interleaved repeats)")
        issue17_ratios(emit, args.quick)
        if args.markdown is not None:
            args.markdown.write_text("\n".join(lines) + "\n")
        return
    if args.compare_threading_layers:
        emit(
            f"\n## numba threading layers (wall time unless 'cpu': the process's CPU time; step: "
            f"B=1024, median; train / forward: B={batch} L={length}; ratio to workqueue)"
        )
        compare_threading_layers(args.threads, args.quick, args.layer_rounds, emit)
    if args.only_layers:
        return
    emit(f"\n## train fwd+bwd, B={batch} L={length} d_model=64 d_state=16 expand=2")
    emit("| model | s / iter | tokens/s |")
    emit("|---|---|---|")
    names = ["gru", "mambapy", "mamba:numba", "mamba2:numba"]
    if not args.skip_chunked:
        names += ["mamba:chunked", "mamba2:chunked"]
    tps: dict[str, float] = {}
    for name in names:
        sec = time_train(name, batch, length, reps)
        tps[name] = batch * length / sec
        emit(f"| {name} | {sec:.3f} | {tps[name]:,.0f} |")
    emit("\nratios (targets: mamba >= 10x mambapy, >= 0.5x gru; mamba2 >= 1x gru):")
    for a, b in [
        ("mamba:numba", "mambapy"),
        ("mamba:numba", "gru"),
        ("mamba2:numba", "gru"),
        ("mamba:chunked", "mambapy"),
    ]:
        if a not in tps:
            continue
        emit(f"- {a} / {b}: {tps[a] / tps[b]:.2f}x")

    if not args.skip_memory:
        emit(f"\n## peak extra RSS of one fwd+bwd (MB), B={batch} L={length}")
        mem = {
            n: peak_memory_mb(n, batch, length, threads)
            for n in ["mambapy", "mamba:numba", "mamba2:numba", "gru"]
        }
        for n, v in mem.items():
            emit(f"- {n}: {v:,.0f} MB")
        ratio = mem["mamba:numba"] / max(mem["mambapy"], 1e-9)
        emit(f"- mamba:numba / mambapy: {ratio:.3f} (target <= 0.25)")

    if not args.skip_long:
        emit(f"\n## long sequence fwd+bwd, B={long_batch} L={long_len}")
        for name in ["gru", "mamba:numba", "mamba2:numba"]:
            sec = time_train(name, long_batch, long_len, 1)
            emit(f"- {name}: {sec:.2f} s, {long_batch * long_len / sec:,.0f} tokens/s")
        if not args.skip_memory:
            v = peak_memory_mb("mamba:numba", long_batch, long_len, threads)
            emit(f"- mamba:numba peak extra RSS: {v:,.0f} MB")

    emit(f"\n## step latency, B={step_batch} (median ms over the first / last 20% of {steps})")
    lat = {n: step_latency(n, step_batch, steps) for n in ["gru", "mamba", "mamba2"]}
    for n, (early, late) in lat.items():
        emit(f"- {n}: early {early * 1e3:.3f} ms, late {late * 1e3:.3f} ms")
    for n in ("mamba", "mamba2"):
        emit(f"- {n} / GRUCell: {lat[n][1] / lat['gru'][1]:.2f}x (target <= 5x)")

    if torch.cuda.is_available():
        from seqmodels.scan import mamba_ssm_available

        emit("\n## GPU: cuda backend vs chunked torch path, fwd+bwd")
        if not mamba_ssm_available():
            emit("- mamba-ssm not importable: skipped")
        else:
            for kind, cls in (("mamba", Mamba), ("mamba2", Mamba2)):
                for L in (1024, 4096):
                    res = {}
                    for backend in ("cuda", "chunked"):
                        kw = {} if cls is Mamba else {"d_state": 64, "headdim": 32}
                        m = cls(D_MODEL, device="cuda", backend=backend, **kw)
                        x = torch.randn(8, L, D_MODEL, device="cuda", requires_grad=True)
                        for _ in range(2):
                            m(x)[0].sum().backward()
                        torch.cuda.synchronize()
                        start = time.perf_counter()
                        for _ in range(5):
                            m(x)[0].sum().backward()
                        torch.cuda.synchronize()
                        res[backend] = (time.perf_counter() - start) / 5
                    speedup = res["chunked"] / res["cuda"]
                    emit(
                        f"- {kind} L={L}: cuda {res['cuda'] * 1e3:.1f} ms, chunked "
                        f"{res['chunked'] * 1e3:.1f} ms, speed-up {speedup:.1f}x"
                    )
    if args.markdown is not None:
        args.markdown.write_text("\n".join(lines) + "\n")
        print(json.dumps({"written": str(args.markdown)}))


if __name__ == "__main__":
    main()
