"""GPU readiness checks behind ``benchmarks/gpu.sh`` (issue 17, item 6).

Three subcommands, each one step of the shell script:

- ``check``: is there a CUDA device for this torch (exit 2 with the reason when not), and is
  mamba-ssm importable (``--require-mamba-ssm``: exit 1 when not, after the install step);
- ``kernels``: ``seqmodels.Mamba`` / ``Mamba2`` with ``backend="cuda"`` (mamba-ssm's scan
  kernels) against ``backend="chunked"`` (the pure-torch path) on the same module and input,
  forward (no grad) and forward + backward at L >= 1024: median ms, the speed-up
  chunked / cuda, peak CUDA memory of forward + backward, and the largest output difference
  between the two (a sanity check; the equivalence tests are tests/test_seqmodels.py -m gpu);
- ``train``: a short ``python -m marl.train --backbone mamba`` run per ``--device`` (default
  ``cpu`` then ``cuda``, the same configuration otherwise): env steps/s and the seconds per
  update spent collecting and updating (medians over the updates after the first, which pays
  numba compilation and CUDA start-up), and the ratio cuda / cpu. ``--device`` places the
  policy for rollouts and the update; the environment steps on the CPU either way.

Every result is printed as a markdown table and written as JSON (and markdown) under
``--out``.

Usage::

    python benchmarks/gpu_bench.py check [--require-mamba-ssm]
    python benchmarks/gpu_bench.py kernels [--quick] [--out DIR]
    python benchmarks/gpu_bench.py train [--quick] [--devices cpu,cuda] [--out DIR] [-- FLAGS]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

try:  # the check must say so when torch is missing, not fail with a traceback
    import torch
except ImportError:  # pragma: no cover - depends on the interpreter
    torch = None

#: exit status when there is no CUDA device (as gpu.sh's)
EXIT_NO_CUDA = 2

D_MODEL, D_STATE, BATCH = 64, 16, 8
#: Mamba2 keyword arguments (d_state, headdim) as benchmarks/seqmodels.py's GPU section
MAMBA2_KW = {"d_state": 64, "headdim": 32}


def _error(message: str) -> None:
    print(f"error: {message}", file=sys.stderr, flush=True)


def _write(out: Path, name: str, record: dict[str, Any], table: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(record, indent=2) + "\n")
    (out / f"{name}.md").write_text("\n".join(table) + "\n")
    print(f"written: {out / (name + '.json')}, {out / (name + '.md')}", flush=True)


# ------------------------------------------------------------------------------------------
# check
# ------------------------------------------------------------------------------------------


def no_cuda_reason() -> str | None:
    """Why this interpreter's torch sees no CUDA device, or None when it sees one."""
    if torch is None:
        return (
            f"torch is not importable by {sys.executable}: install torch first (README, "
            "'GPU'), or pass --python PATH"
        )
    if torch.cuda.is_available():
        return None
    if torch.version.cuda is None:
        return (
            f"no CUDA device: torch {torch.__version__} at {sys.executable} is a CPU-only "
            "build; install the CUDA build (README, 'GPU')"
        )
    return (
        f"no CUDA device: torch {torch.__version__} (CUDA {torch.version.cuda}) sees none "
        "(torch.cuda.is_available() is False: no GPU, no driver, or CUDA_VISIBLE_DEVICES "
        "hides it; see nvidia-smi)"
    )


def cmd_check(args: argparse.Namespace) -> int:
    reason = no_cuda_reason()
    if reason is not None:
        _error(reason)
        return EXIT_NO_CUDA
    from seqmodels.scan import mamba_ssm_available

    props = torch.cuda.get_device_properties(0)
    print(f"python: {sys.executable}")
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPU")
    print(
        f"device 0: {props.name}, compute capability {props.major}.{props.minor}, "
        f"{props.total_memory / 2**30:.0f} GiB"
    )
    available = mamba_ssm_available()
    print(f"mamba-ssm kernels: {'importable' if available else 'not importable'}")
    if args.require_mamba_ssm and not available:
        _error(
            "mamba-ssm is not importable (or its CUDA ops failed to load): the cuda backend "
            "would fall back to the torch path; install the 'cuda' extra (README, 'GPU')"
        )
        return 1
    return 0


# ------------------------------------------------------------------------------------------
# kernels
# ------------------------------------------------------------------------------------------


def median_seconds(fn: Callable[[], Any], reps: int, warmup: int) -> float:
    """Median wall time of ``fn()`` over ``reps`` calls after ``warmup`` (CUDA synchronised)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_block(kind: str, length: int, reps: int, warmup: int) -> dict[str, Any]:
    """Both backends on one module (same weights) and one input ``[BATCH, length, D_MODEL]``."""
    from seqmodels import Mamba, Mamba2

    torch.manual_seed(0)
    dev = torch.device("cuda")
    module = (
        Mamba(D_MODEL, d_state=D_STATE, device=dev)
        if kind == "mamba"
        else Mamba2(D_MODEL, device=dev, **MAMBA2_KW)
    )
    x = torch.randn(BATCH, length, D_MODEL, device=dev, requires_grad=True)
    row: dict[str, Any] = {"kind": kind, "L": length, "B": BATCH, "d_model": D_MODEL}
    outputs = {}
    for backend in ("cuda", "chunked"):
        module.backend = backend

        def forward() -> None:
            with torch.no_grad():
                module(x)

        def forward_backward() -> None:
            module(x)[0].sum().backward()

        with torch.no_grad():
            outputs[backend] = module(x)[0].float()
        row[f"fwd_ms_{backend}"] = 1e3 * median_seconds(forward, reps, warmup)
        row[f"fwdbwd_ms_{backend}"] = 1e3 * median_seconds(forward_backward, reps, warmup)
        torch.cuda.reset_peak_memory_stats()
        forward_backward()
        torch.cuda.synchronize()
        row[f"peak_mib_{backend}"] = torch.cuda.max_memory_allocated() / 2**20
        module.zero_grad(set_to_none=True)
        x.grad = None
    row["fwd_speedup"] = row["fwd_ms_chunked"] / row["fwd_ms_cuda"]
    row["fwdbwd_speedup"] = row["fwdbwd_ms_chunked"] / row["fwdbwd_ms_cuda"]
    row["max_abs_diff"] = float((outputs["cuda"] - outputs["chunked"]).abs().max())
    return row


def cmd_kernels(args: argparse.Namespace) -> int:
    reason = no_cuda_reason()
    if reason is not None:
        _error(reason)
        return EXIT_NO_CUDA
    from seqmodels.scan import mamba_ssm_available

    if not mamba_ssm_available():
        _error("mamba-ssm is not importable: nothing to compare (install the 'cuda' extra)")
        return 1
    lengths = [1024] if args.quick else [1024, 4096, 16384]
    reps, warmup = (3, 1) if args.quick else (10, 3)
    rows = [bench_block(k, n, reps, warmup) for k in ("mamba", "mamba2") for n in lengths]
    table = [
        f"## cuda backend vs chunked torch path (B={BATCH}, d_model={D_MODEL}, float32, "
        f"median of {reps}; {torch.cuda.get_device_name(0)})",
        "",
        "| block | L | fwd cuda ms | fwd torch ms | fwd speed-up | fwd+bwd cuda ms "
        "| fwd+bwd torch ms | fwd+bwd speed-up | peak MiB cuda / torch | max abs diff |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        table.append(
            f"| {r['kind']} | {r['L']} | {r['fwd_ms_cuda']:.2f} | {r['fwd_ms_chunked']:.2f} "
            f"| {r['fwd_speedup']:.1f}x | {r['fwdbwd_ms_cuda']:.2f} "
            f"| {r['fwdbwd_ms_chunked']:.2f} | {r['fwdbwd_speedup']:.1f}x "
            f"| {r['peak_mib_cuda']:.0f} / {r['peak_mib_chunked']:.0f} "
            f"| {r['max_abs_diff']:.1e} |"
        )
    print("\n".join(table), flush=True)
    record = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": rows}
    _write(args.out, "kernels", record, table)
    return 0


# ------------------------------------------------------------------------------------------
# train
# ------------------------------------------------------------------------------------------


def train_command(device: str, run_dir: Path, quick: bool, extra: Sequence[str]) -> list[str]:
    """The ``marl.train`` command of one device's run (everything but --device the same)."""
    num_envs, rollout_steps = 64, 128  # the mamba defaults of MAPPO
    updates = 3 if quick else 8
    return [
        sys.executable,
        "-m",
        "marl.train",
        "--backbone=mamba",
        f"--device={device}",
        "--seed=0",
        f"--num-envs={num_envs}",
        f"--rollout-steps={rollout_steps}",
        f"--total-steps={updates * num_envs * rollout_steps}",
        "--eval-every=0",
        "--eval-episodes=2",
        "--progress=false",
        "--baselines=false",
        "--plots=false",
        "--gif=false",
        f"--run-dir={run_dir}",
        "--overwrite",
        *extra,
    ]


def summarise_run(run_dir: Path) -> dict[str, Any]:
    """Medians over the updates after the first (all of them when there is only one)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "sps" in r]
    if not rows:
        raise RuntimeError(f"{run_dir}/metrics.jsonl holds no update rows")
    timed = rows[1:] or rows
    return {
        "updates": len(rows),
        "env_steps": rows[-1]["env_steps"],
        "sps": statistics.median(r["sps"] for r in timed),
        "collect_s": statistics.median(r["time/collect_s"] for r in timed),
        "update_s": statistics.median(r["time/update_s"] for r in timed),
    }


def cmd_train(args: argparse.Namespace) -> int:
    devices = [d.strip() for d in args.devices.split(",") if d.strip()]
    bad = [d for d in devices if d not in ("cpu", "cuda")]
    if bad or not devices:
        _error(f"--devices takes cpu and/or cuda, comma-separated, got {args.devices!r}")
        return 2
    if "cuda" in devices:
        reason = no_cuda_reason()
        if reason is not None:
            _error(reason)
            return EXIT_NO_CUDA
    extra = list(args.extra[1:] if args.extra[:1] == ["--"] else args.extra)
    results: dict[str, dict[str, Any]] = {}
    for device in devices:
        run_dir = args.out / f"train_{device}"
        command = train_command(device, run_dir, args.quick, extra)
        print(f"$ {' '.join(command)}", flush=True)
        proc = subprocess.run(command, cwd=ROOT)
        if proc.returncode != 0:
            _error(f"the {device} training run failed (exit {proc.returncode})")
            return 1
        results[device] = {**summarise_run(run_dir), "command": command}
    table = [
        "## mamba MAPPO training throughput (multisearch small, E=64, T=128)",
        "",
        "| device | updates | env steps/s | collect s/update | update s/update |",
        "|---|---|---|---|---|",
    ]
    for device, r in results.items():
        table.append(
            f"| {device} | {r['updates']} | {r['sps']:.0f} | {r['collect_s']:.2f} "
            f"| {r['update_s']:.2f} |"
        )
    if {"cpu", "cuda"} <= results.keys():
        cpu, gpu = results["cpu"], results["cuda"]
        table += [
            "",
            f"cuda / cpu: env steps/s {gpu['sps'] / cpu['sps']:.2f}x, update time "
            f"{cpu['update_s'] / gpu['update_s']:.2f}x faster, collection "
            f"{cpu['collect_s'] / gpu['collect_s']:.2f}x faster",
        ]
    print("\n".join(table), flush=True)
    _write(args.out, "train", {"runs": results}, table)
    return 0


# ------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="CUDA device and mamba-ssm present? (exit 2: no CUDA)")
    check.add_argument(
        "--require-mamba-ssm", action="store_true", help="exit 1 when mamba-ssm is missing"
    )
    for name, help_text in (
        ("kernels", "cuda backend vs torch path of seqmodels.Mamba / Mamba2"),
        ("train", "mamba MAPPO throughput per device"),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--quick", action="store_true", help="fewer sizes / updates")
        p.add_argument("--out", type=Path, default=ROOT / "runs" / "gpu", help="output folder")
    train = sub.choices["train"]
    train.add_argument("--devices", default="cpu,cuda", help="comma-separated: cpu, cuda")
    train.add_argument("extra", nargs=argparse.REMAINDER, help="marl.train flags after --")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler = {"check": cmd_check, "kernels": cmd_kernels, "train": cmd_train}[args.command]
    return handler(args)


if __name__ == "__main__":
    raise SystemExit(main())
