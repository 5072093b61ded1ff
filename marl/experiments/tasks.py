"""A benchmark table across tasks: ``python -m marl.compare --tasks small,sparse,hard,memory``.

Each task is an env preset: ``marl.compare`` runs the variants x seeds once per task (as an
ordinary comparison in ``OUT/<task>/``, with ``--env.preset=<task>`` added to every run), then
:func:`write_task_table` reads the tasks' ``summary.json`` files and writes, as BenchMARL's
tables do, one row per task and variant: final success and solved rates as IQM with 95%
stratified-bootstrap CIs, next to the scripted heuristic and the uniform random policy on the
same validation seeds (``OUT/tasks.md``, ``OUT/tasks.json``), and an rliable performance
profile of final success across all tasks and seeds (``OUT/plots/performance_profile.png``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import yaml

from envs import baselines
from marl.experiments import stats

__all__ = ["TASK_METRICS", "task_baselines", "build_task_table", "write_task_table"]

#: per-run scores shown per task
TASK_METRICS = ("success_rate", "solved_rate")


def _run_config(task_dir: str) -> dict[str, Any] | None:
    """The config.yaml of any run of a task (they share validation seeds and env kwargs)."""
    runs = os.path.join(task_dir, "runs")
    for root, _dirs, files in os.walk(runs):
        if "config.yaml" in files:
            with open(os.path.join(root, "config.yaml")) as fh:
                return yaml.safe_load(fh)
    return None


def task_baselines(env_kwargs: Mapping[str, Any], seeds: Sequence[int]) -> dict[str, Any]:
    """The heuristic and random policies' success and solved rates on ``seeds``."""
    out = {}
    for name in ("heuristic", "random"):
        res = baselines.evaluate_baseline(name, seeds=list(seeds), **dict(env_kwargs))
        out[name] = {m: res[m] for m in TASK_METRICS}
    return out


def build_task_table(out: str, tasks: Sequence[str]) -> dict[str, Any]:
    """``{"tasks": {TASK: {"variants": {NAME: {METRIC: interval estimates}}, "baselines":
    {...}, "budget": {...}}}, "variants": [...]}`` from ``OUT/<task>/summary.json``."""
    table: dict[str, Any] = {"tasks": {}, "variants": []}
    for task in tasks:
        task_dir = os.path.join(out, task)
        with open(os.path.join(task_dir, "summary.json")) as fh:
            summary = json.load(fh)
        entry: dict[str, Any] = {"variants": {}, "budget": summary.get("budget"), "baselines": {}}
        for name, v in summary["variants"].items():
            if name not in table["variants"]:
                table["variants"].append(name)
            entry["variants"][name] = {m: v["metrics"].get(m) for m in TASK_METRICS}
        cfg = _run_config(task_dir)
        if cfg is not None and cfg.get("env_fn", "").startswith("envs.multisearch_v0"):
            seeds = range(cfg["eval_seed"], cfg["eval_seed"] + cfg["eval_episodes"])
            entry["baselines"] = task_baselines(cfg.get("env") or {}, seeds)
        table["tasks"][task] = entry
    return table


def _fmt(est: Mapping[str, Any] | None) -> str:
    if not est or est.get("iqm") is None:
        return "n/a"
    ci = est.get("iqm_ci")
    if ci is None:
        return f"{est['iqm']:.3f}"
    return f"{est['iqm']:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]"


def _markdown(table: Mapping[str, Any]) -> str:
    lines = [
        "# Benchmark table across tasks",
        "",
        "Final success / solved rate on each task's validation seeds: IQM over seeds with "
        "95% stratified-bootstrap CIs; the scripted heuristic and the uniform random policy "
        "on the same seeds.",
        "",
        "| task | policy | success IQM [95% CI] | solved IQM [95% CI] | seeds |",
        "|---|---|---|---|---|",
    ]
    for task, entry in table["tasks"].items():
        for name, metrics in entry["variants"].items():
            n = (metrics.get("success_rate") or {}).get("n", 0)
            lines.append(
                f"| {task} | {name} | {_fmt(metrics.get('success_rate'))} | "
                f"{_fmt(metrics.get('solved_rate'))} | {n} |"
            )
        for name, res in entry["baselines"].items():
            lines.append(
                f"| {task} | *{name}* | {res['success_rate']:.3f} | {res['solved_rate']:.3f} | |"
            )
    lines += ["", "![performance profile](plots/performance_profile.png)", ""]
    return "\n".join(lines)


def _profile_plot(table: Mapping[str, Any], path: str) -> str | None:
    """rliable's performance profile of final success over all tasks and seeds."""
    scores = {}
    for name in table["variants"]:
        per_task = []
        for entry in table["tasks"].values():
            est = entry["variants"].get(name, {}).get("success_rate") or {}
            per_task.append(list(est.get("values") or []))
        runs = min((len(v) for v in per_task), default=0)
        if runs:  # [runs, tasks]: the first `runs` seeds of every task
            scores[name] = np.asarray([v[:runs] for v in per_task], dtype=np.float64).T
    if not scores:
        return None
    thresholds = np.linspace(0.0, 1.0, 51)
    profiles = stats.performance_profiles(scores, thresholds)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, (profile, band) in profiles.items():
        ax.plot(thresholds, profile, label=name)
        if band is not None:
            ax.fill_between(thresholds, band[0], band[1], alpha=0.2)
    ax.set_xlabel("final success rate threshold tau")
    ax.set_ylabel("fraction of runs with success > tau")
    ax.set_title("performance profile across tasks")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def write_task_table(out: str, tasks: Sequence[str], *, plots: bool = True) -> dict[str, Any]:
    """Build the table, write ``OUT/tasks.json``, ``OUT/tasks.md`` and the profile plot; print
    the markdown table; return the table."""
    table = build_task_table(out, tasks)
    if plots:
        table["plot"] = _profile_plot(table, os.path.join(out, "plots", "performance_profile.png"))
    with open(os.path.join(out, "tasks.json"), "w") as fh:
        json.dump(table, fh, indent=2)
    text = _markdown(table)
    with open(os.path.join(out, "tasks.md"), "w") as fh:
        fh.write(text)
    print(text)
    return table
