"""POPGym through the adapter: MAPPO with each actor backbone on a few POPGym tasks, one table.

Every (task, backbone, seed) is one ``python -m marl.train`` run with default settings and
only ``--env-fn``, ``--backbone``, ``--seed`` and ``--total-steps`` set (``--progress false
--plots false --run-dir ...`` do not change training), run one after the other. Runs whose
``eval.json`` exists are skipped, a run with a checkpoint but no ``eval.json`` is resumed
(``--resume``), so the script can be stopped and started again. The table is the eval
``mean_return`` (32 episodes, seeds 10000..10031; the episode sum of the mean over agents of
their rewards: for a single-agent POPGym env, the episode return) per task x backbone: the
mean over seeds with a 95% stratified-bootstrap percentile CI (rliable, through
``marl.experiments.stats.interval_estimates``), next to the POPGym paper's GRU figure where
one is listed in :data:`PAPER_GRU`.

    python benchmarks/popgym_table.py --total-steps 100000            # all 48 runs, then tables
    python benchmarks/popgym_table.py --table-only                    # tables from what exists
    python benchmarks/popgym_table.py --dry-run                       # print the commands
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: short name -> ``--env-fn``
TASKS: dict[str, str] = {
    "RepeatPreviousEasy": "popgym.envs.repeat_previous:RepeatPreviousEasy",
    "CountRecallEasy": "popgym.envs.count_recall:CountRecallEasy",
    "AutoencodeEasy": "popgym.envs.autoencode:AutoencodeEasy",
    "PositionOnlyCartPoleEasy": "popgym.envs.position_only_cartpole:PositionOnlyCartPoleEasy",
}
#: tasks run only when named with ``--tasks`` (not in the default sweep)
MORE_TASKS: dict[str, str] = {
    "RepeatPreviousMedium": "popgym.envs.repeat_previous:RepeatPreviousMedium",
}
ALL_TASKS: dict[str, str] = {**TASKS, **MORE_TASKS}
BACKBONES: tuple[str, ...] = ("mlp", "gru", "mamba", "mamba2")
SEEDS: tuple[int, ...] = (0, 1, 2)

#: The POPGym paper's GRU figures (Morad et al., ICLR 2023), ``{task: (value, where)}``;
#: filled in only from a source that can be cited, never estimated (none could be read so
#: far: BENCHMARKS.md, POPGym section). Their budget (PPO in RLlib, ``POPGYM_STEPS`` env steps
#: per trial: 10M at the paper-release commit, 15M later and in the FFM authors' reading of
#: the public runs; 3 trials; mean over trials of the max mean episodic reward, MMER) is not
#: ours.
PAPER_GRU: dict[str, tuple[float, str]] = {}


def run_dir_of(out_dir: str, task: str, backbone: str, seed: int) -> str:
    return os.path.join(out_dir, task, backbone, f"seed{seed}")


def train_command(
    python: str,
    task: str,
    backbone: str,
    seed: int,
    total_steps: int,
    run_dir: str,
    torch_threads: int,
    nice: int,
) -> list[str]:
    """The ``marl.train`` command of one run (a fresh one; see :func:`plan_command`)."""
    if task not in ALL_TASKS:
        raise ValueError(f"unknown task {task!r}; known: {sorted(ALL_TASKS)}")
    cmd = [
        python, "-m", "marl.train",
        "--env-fn", ALL_TASKS[task],
        "--backbone", backbone,
        "--seed", str(seed),
        "--total-steps", str(total_steps),
        "--torch-threads", str(torch_threads),
        "--progress", "false",
        "--plots", "false",
        "--run-dir", run_dir,
    ]  # fmt: skip
    return (["nice", "-n", str(nice)] if nice else []) + cmd


def plan_command(run_dir: str, fresh: list[str]) -> list[str] | None:
    """None when ``run_dir`` holds ``eval.json`` (done); a ``--resume`` command when it holds
    a checkpoint; else ``fresh`` plus ``--overwrite`` (a start that wrote no checkpoint)."""
    if os.path.isfile(os.path.join(run_dir, "eval.json")):
        return None
    ckpts = os.path.join(run_dir, "checkpoints")
    if os.path.isdir(ckpts) and any(f.endswith(".pt") for f in os.listdir(ckpts)):
        head = fresh[: fresh.index("-m") + 2]  # [nice -n K] python -m marl.train
        return head + ["--resume", run_dir]
    return fresh + (["--overwrite"] if os.path.exists(run_dir) else [])


def collect(out_dir: str, tasks: Sequence[str], backbones: Sequence[str], seeds: Sequence[int]):
    """``{task: {backbone: [per-seed record]}}`` for the runs that have ``eval.json``."""
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for task in tasks:
        for backbone in backbones:
            rows = results.setdefault(task, {}).setdefault(backbone, [])
            for seed in seeds:
                d = run_dir_of(out_dir, task, backbone, seed)
                path = os.path.join(d, "eval.json")
                if not os.path.isfile(path):
                    continue
                with open(path) as fh:
                    ev = json.load(fh)
                row: dict[str, Any] = {"seed": seed, "mean_return": ev["mean_return"]}
                fin = os.path.join(d, "finished.json")
                if os.path.isfile(fin):
                    with open(fin) as fh:
                        f = json.load(fh)
                    row["env_steps"] = f.get("env_steps")
                    row["time_s"] = f.get("time_s")
                rows.append(row)
    return results


def random_return(task: str, seeds: Sequence[int] = range(10000, 10032)) -> float:
    """Uniform random actions: the mean episode return over one episode per reset seed."""
    import importlib

    import numpy as np

    module, cls = ALL_TASKS[task].split(":")
    env = getattr(importlib.import_module(module), cls)()
    returns = []
    for seed in seeds:
        env.reset(seed=int(seed))
        env.action_space.seed(int(seed))
        total, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    return float(np.mean(returns))


def summarise(values: Sequence[float], seed: int = 0) -> dict[str, Any]:
    """Mean with a 95% bootstrap CI (None with fewer than two values)."""
    from marl.experiments.stats import interval_estimates

    est = interval_estimates(list(values), seed=seed)
    return {"n": est["n"], "values": est["values"], "mean": est["mean"], "mean_ci": est["mean_ci"]}


def fmt_cell(summary: Mapping[str, Any], digits: int = 2) -> str:
    """``mean [low, high] (n)``; ``-`` without runs; no CI with one run."""
    if not summary or not summary.get("n"):
        return "-"
    text = f"{summary['mean']:.{digits}f}"
    ci = summary.get("mean_ci")
    if ci is not None:
        text += f" [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]"
    return text + f" (n={summary['n']})"


def markdown_table(
    table: Mapping[str, Mapping[str, Mapping[str, Any]]],
    tasks: Sequence[str],
    backbones: Sequence[str],
    paper: Mapping[str, tuple[float, str]] = PAPER_GRU,
    random: Mapping[str, float] | None = None,
) -> str:
    """Rows tasks, columns backbones (cells from :func:`fmt_cell`), then uniform random (when
    given) and the paper's GRU."""
    head = ["task", *backbones, *(["random"] if random is not None else []), "paper GRU (MMER)"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for task in tasks:
        cells = [fmt_cell(table.get(task, {}).get(b, {})) for b in backbones]
        if random is not None:
            cells.append(f"{random[task]:.2f}" if task in random else "-")
        ref = paper.get(task)
        cells.append("n/a" if ref is None else f"{ref[0]:.2f}")
        lines.append("| " + " | ".join([task, *cells]) + " |")
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python benchmarks/popgym_table.py",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--out-dir", default="runs/popgym_table", help="root of the run dirs")
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(ALL_TASKS))
    p.add_argument("--backbones", nargs="+", default=list(BACKBONES), choices=list(BACKBONES))
    p.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    p.add_argument("--total-steps", type=int, default=100_000, help="env steps per run")
    p.add_argument("--torch-threads", type=int, default=1)
    p.add_argument("--nice", type=int, default=10, help="run each training under nice -n K")
    p.add_argument("--python", default=sys.executable, help="interpreter for marl.train")
    p.add_argument("--table-only", action="store_true", help="train nothing; write the tables")
    p.add_argument("--dry-run", action="store_true", help="print the pending commands only")
    p.add_argument("--json", default=None, help="results JSON [default: OUT_DIR/table.json]")
    p.add_argument("--markdown", default=None, help="table file [default: OUT_DIR/table.md]")
    args = p.parse_args(argv)
    if args.total_steps < 1:
        p.error(f"--total-steps must be >= 1, got {args.total_steps}")
    if args.torch_threads < 1:
        p.error(f"--torch-threads must be >= 1, got {args.torch_threads}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.table_only:
        for seed in args.seeds:  # seed-outer: a stopped sweep has every cell's first seeds
            for task in args.tasks:
                for backbone in args.backbones:
                    d = run_dir_of(args.out_dir, task, backbone, seed)
                    fresh = train_command(
                        args.python, task, backbone, seed, args.total_steps, d,
                        args.torch_threads, args.nice,
                    )  # fmt: skip
                    cmd = plan_command(d, fresh)
                    if cmd is None:
                        continue
                    print(shlex.join(cmd), flush=True)
                    if args.dry_run:
                        continue
                    os.makedirs(os.path.dirname(d), exist_ok=True)
                    start = time.perf_counter()
                    rc = subprocess.run(cmd, cwd=ROOT).returncode
                    print(f"  rc={rc} wall {time.perf_counter() - start:.1f} s", flush=True)
                    if rc != 0:
                        print(f"  run failed: {d}", file=sys.stderr)
        if args.dry_run:
            return 0
    runs = collect(args.out_dir, args.tasks, args.backbones, args.seeds)
    table = {
        task: {
            b: summarise([r["mean_return"] for r in rows]) if rows else {} for b, rows in by.items()
        }
        for task, by in runs.items()
    }
    random = {task: random_return(task) for task in args.tasks}
    md = markdown_table(table, args.tasks, args.backbones, random=random)
    record = {
        "total_steps": args.total_steps,
        "seeds": args.seeds,
        "metric": "eval mean_return (32 episodes, seeds 10000..10031)",
        "ci": "95% stratified-bootstrap percentile CI of the mean over seeds (rliable)",
        "runs": runs,
        "table": table,
        "random": random,
        "paper_gru": {k: {"value": v[0], "source": v[1]} for k, v in PAPER_GRU.items()},
    }
    json_path = args.json or os.path.join(args.out_dir, "table.json")
    md_path = args.markdown or os.path.join(args.out_dir, "table.md")
    for path, text in ((json_path, json.dumps(record, indent=2) + "\n"), (md_path, md)):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as fh:
            fh.write(text)
    print(md, end="")
    missing = sum(len(args.seeds) - len(rows) for by in runs.values() for rows in by.values())
    if missing:
        print(f"{missing} run(s) without eval.json", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    raise SystemExit(main())
