"""GRPO benchmarks: learning vs MAPPO, zero-variance groups, torchrun throughput.

Every figure is printed next to a peer measured in the same invocation (ratios), from real
``python -m marl.train`` / ``torchrun -m marl.train`` runs (subprocesses), so what is timed
is what users run.

Usage::

    # GRPO vs MAPPO on the small preset, same wall-clock budget, 3 seeds (15 min each = 1.5 h)
    python benchmarks/train_grpo.py learning --max-time 900 --seeds 0 1 2
    # an untuned configuration of the env family (issue 5), 240 s each
    python benchmarks/train_grpo.py learning --max-time 240 --seeds 0 \\
        --env grid_size=12 n_scouts=1 n_rescuers=2 n_targets=2 obstacle_density=0.15 max_cycles=150
    # 2-process (torchrun, gloo) vs 1-process GRPO throughput on the same machine
    python benchmarks/train_grpo.py throughput --total-steps 40000
    # the issue's timing target: torchrun 2 x GRPO, 20000 steps, defaults, wall clock
    python benchmarks/train_grpo.py torchrun20k

Outputs go to ``--out`` (default ``runs/bench_grpo``): the run directories, ``summary.json``
and, for ``learning``, ``learning_curves.png`` (success per seed over env steps).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
QUIET = ["--progress", "false", "--gif", "false"]


def _env_args(pairs: list[str]) -> list[str]:
    out = []
    for pair in pairs:
        if "=" not in pair:
            raise SystemExit(f"--env expects KEY=VALUE pairs, got {pair!r}")
        key, value = pair.split("=", 1)
        out += [f"--env.{key}", value]
    return out


def _run(cmd: list[str], log: Path) -> float:
    """Run ``cmd`` (cwd = repo root, OMP_NUM_THREADS=1); returns the wall time in seconds."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"command failed ({proc.returncode}), see {log}: {' '.join(cmd)}")
    return wall


def _train_cmd(args: list[str], nproc: int = 1) -> list[str]:
    if nproc == 1:
        return [sys.executable, "-m", "marl.train", *args]
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc_per_node={nproc}", "-m", "marl.train", *args,
    ]  # fmt: skip


def _metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _eval(run_dir: Path) -> dict:
    return json.loads((run_dir / "eval.json").read_text())


def learning(ns: argparse.Namespace) -> dict:
    out = Path(ns.out)
    env = _env_args(ns.env)
    results: dict = {"max_time": ns.max_time, "env": ns.env, "runs": {}}
    for seed in ns.seeds:
        for algo in ("mappo", "grpo"):
            run_dir = out / f"{algo}_s{seed}"
            extra = ["--group-size", str(ns.group_size)] if algo == "grpo" else []
            args = ["--algo", algo, "--seed", str(seed), "--max-time", str(ns.max_time)]
            args += ["--run-dir", str(run_dir), *QUIET, *extra, *env]
            wall = _run(_train_cmd(args), out / f"{algo}_s{seed}.log")
            rows = _metrics(run_dir)
            ev = _eval(run_dir)
            rec = {
                "wall_s": wall,
                "success_rate": ev.get("success_rate"),
                "solved_rate": ev.get("solved_rate"),
                "env_steps": rows[-1]["env_steps"] if rows else 0,
                "updates": len(rows),
                "curve": [(r["env_steps"], r.get("episode/success")) for r in rows],
            }
            if algo == "grpo":
                fz = [r.get("frac_zero_std", float("nan")) for r in rows]
                q = np.array_split(np.asarray(fz, float), 4) if fz else []
                rec["frac_zero_std_quartiles"] = [float(np.nanmean(c)) for c in q if len(c)]
                rec["frac_zero_std_mean"] = float(np.nanmean(fz)) if fz else None
                rec["group_size"] = ns.group_size
            results["runs"][f"{algo}_s{seed}"] = rec
            steps, n_upd = rec["env_steps"], rec["updates"]
            print(
                f"{algo:5s} seed {seed}: success {rec['success_rate']:.3f} "
                f"({n_upd} updates, {steps} env steps, {wall:.0f} s)"
            )
    print("\nseed  mappo_success  grpo_success  ratio  grpo_frac_zero_std(quartiles)")
    ratios = []
    for seed in ns.seeds:
        m = results["runs"][f"mappo_s{seed}"]["success_rate"] or 0.0
        g = results["runs"][f"grpo_s{seed}"]["success_rate"] or 0.0
        ratio = g / m if m > 0 else float("nan")
        ratios.append(ratio)
        fz = results["runs"][f"grpo_s{seed}"]["frac_zero_std_quartiles"]
        print(f"{seed:4d}  {m:13.3f}  {g:12.3f}  {ratio:5.2f}  {[round(x, 3) for x in fz]}")
    results["ratio_mean"] = float(np.nanmean(ratios)) if ratios else None
    print(f"mean ratio GRPO / MAPPO success: {results['ratio_mean']:.2f}")
    _plot_curves(results, out / "learning_curves.png")
    return results


def _plot_curves(results: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, rec in results["runs"].items():
        pts = [(s, v) for s, v in rec["curve"] if v is not None]
        if pts:
            xs, ys = zip(*pts, strict=True)
            ax.plot(xs, ys, label=name, color="C0" if name.startswith("mappo") else "C1")
    ax.set_xlabel("env steps")
    ax.set_ylabel("training episode success")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def throughput(ns: argparse.Namespace) -> dict:
    out = Path(ns.out)
    res: dict = {"total_steps": ns.total_steps}
    base = ["--algo", "grpo", "--total-steps", str(ns.total_steps), "--eval-episodes", "4",
            "--plots", "false", "--baselines", "false", *QUIET]  # fmt: skip
    for nproc in (1, 2):
        run_dir = out / f"throughput_{nproc}proc"
        wall = _run(_train_cmd([*base, "--run-dir", str(run_dir)], nproc), out / f"tp{nproc}.log")
        rows = _metrics(run_dir)
        train_s = rows[-1]["time_s"]
        steps = rows[-1]["env_steps"]
        res[f"{nproc}proc"] = {
            "wall_s": wall,
            "train_s": train_s,
            "env_steps": steps,
            "env_sps": steps / train_s,
            "updates": len(rows),
        }
        print(f"{nproc} process(es): {steps} env steps in {train_s:.1f} s of training "
              f"({steps / train_s:.0f} env steps/s), wall {wall:.1f} s")  # fmt: skip
    ratio = res["2proc"]["env_sps"] / res["1proc"]["env_sps"]
    res["speedup_2proc_vs_1proc"] = ratio
    print(f"2-process / 1-process training throughput: {ratio:.2f}x")
    return res


def torchrun20k(ns: argparse.Namespace) -> dict:
    out = Path(ns.out)
    run_dir = out / "torchrun20k"
    args = ["--algo", "grpo", "--total-steps", "20000", "--run-dir", str(run_dir), "--progress",
            "false"]  # fmt: skip
    wall = _run(_train_cmd(args, 2), out / "torchrun20k.log")
    rows = _metrics(run_dir)
    res = {"wall_s": wall, "target_s": 150.0, "train_s": rows[-1]["time_s"], "updates": len(rows)}
    print(f"torchrun --standalone --nproc_per_node=2 -m marl.train --algo grpo --total-steps "
          f"20000: {wall:.1f} s wall (target < 150 s: {'met' if wall < 150 else 'MISSED'}), "
          f"{res['train_s']:.1f} s in the training loop, {len(rows)} updates")  # fmt: skip
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("what", choices=("learning", "throughput", "torchrun20k"))
    p.add_argument("--out", default="runs/bench_grpo")
    p.add_argument("--max-time", type=float, default=900.0, help="learning: seconds per run")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--env", nargs="*", default=[], help="env kwargs KEY=VALUE (learning)")
    p.add_argument("--total-steps", type=int, default=40000, help="throughput: env steps")
    ns = p.parse_args(argv)
    Path(ns.out).mkdir(parents=True, exist_ok=True)
    res = {"learning": learning, "throughput": throughput, "torchrun20k": torchrun20k}[ns.what](ns)
    summary = Path(ns.out) / "summary.json"
    data = json.loads(summary.read_text()) if summary.exists() else {}
    data[ns.what] = res
    summary.write_text(json.dumps(data, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
