"""A ``python -m marl.compare`` study in marl-eval's JSON layout (InstaDeep's ``id-marl-eval``).

::

    python -m marl.compare --report-only --out runs/study --export-marl-eval study.json

    import json
    from marl_eval.utils.data_processing_utils import (
        create_matrices_for_rliable, data_process_pipeline)
    data = data_process_pipeline(json.load(open("study.json")), metrics_to_normalize=[])
    final, over_training = create_matrices_for_rliable(data, "multisearch_v0", [])

The layout (marl-eval's README and its ``JsonLogger``; marl-eval lower-cases every key)::

    {ENV: {TASK: {VARIANT: {"run_<seed>": {"step_<k>": {"step_count": ENV_STEPS,
                                                       METRIC: [value], ...},
                                          ...,
                                          "absolute_metrics": {METRIC: [value], ...}}}}}}

* ENV: the module of the runs' ``env_fn`` (``envs.multisearch_v0:vector_env`` ->
  ``multisearch_v0``). TASK: their env preset (``default`` without one), then the other env
  options every run shares (``hard-rescuer_reward_scale=10``); options one variant sets
  belong to that variant.
* VARIANT: marl-eval's algorithm, one per variant of the study.
* ``run_<seed>``: a run of each seed that every variant finished (marl-eval takes the runs of
  its first algorithm as every algorithm's).
* ``step_<k>``: the k-th periodic validation evaluation (the ``eval/*`` rows of
  metrics.jsonl, every ``eval_every`` updates), ``step_count`` its env steps. marl-eval
  needs the same steps in every run: the first K evaluations, K the fewest any run logged.
* ``absolute_metrics``: the final evaluation (eval.json, the study's primary endpoint): the
  summary's per-seed values.
* METRIC: each evaluation metric of the summary (``success_rate``, ``solved_rate``, the
  descriptive ones the runs report) under its own name, but ``mean_return`` as ``return``:
  marl-eval names the mean of a list ``mean_<metric>``, so its ``mean_return`` is ours. A
  metric some run or evaluation lacks is left out (marl-eval needs every one everywhere).

The runs record each evaluation's mean over its episodes, not the episodes' values: every
list holds one value, that mean (marl-eval's README allows one value for a metric computed
over many episodes). Exports of the same environment merge as dictionaries, one task each.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from marl.experiments import stats
from marl.run.rundir import atomic_write_text

__all__ = ["EXPORT_NAMES", "export_study", "write_export"]

#: Summary metric -> its name in the export (marl-eval adds ``mean_`` to a list's mean).
EXPORT_NAMES = {"mean_return": "return"}


def export_study(summary: Mapping[str, Any], study_dir: str) -> tuple[dict[str, Any], list[str]]:
    """The study whose report is ``summary`` (summary.json's mapping; its runs' directories
    relative to ``study_dir``) in marl-eval's layout (see the module docstring), and notes on
    what was left out. Raises ValueError when nothing can be exported: no evaluation metric,
    no seed every variant finished, or runs of different environments."""
    notes: list[str] = []
    metrics = [m for m, d in summary["metrics"].items() if d.get("source") == "eval"]
    if not metrics:
        raise ValueError("the summary has no evaluation metric (eval.json) to export")
    seeds = _common_seeds(summary, metrics[0], notes)
    metrics = [m for m in metrics if _has_values(summary, m, seeds, notes)]
    dirs = {
        (row["variant"], row["seed"]): os.path.join(study_dir, row["run_dir"])
        for row in summary["runs"]
    }
    runs = {key: stats.load_run(dirs[key]) for key in _run_keys(summary, seeds)}
    env, task = _environment_and_task([run.config or {} for run in runs.values()])
    at_env_steps = summary.get("at_env_steps")
    evaluations = {
        key: _evaluations(run.records, summary["metrics"], at_env_steps)
        for key, run in runs.items()
    }
    metrics = [m for m in metrics if _logged_by_every_run(m, evaluations, notes)]
    if not metrics:
        raise ValueError("no evaluation metric is in every run's final and periodic evaluations")
    steps = min(len(rows) for rows in evaluations.values())
    if steps == 0:
        notes.append("a run logged no periodic evaluation: no step_<k>, only absolute_metrics")
    elif any(len(rows) > steps for rows in evaluations.values()):
        most = max(len(rows) for rows in evaluations.values())
        notes.append(f"runs logged {steps} to {most} evaluations: the first {steps} of each")
    algorithms: dict[str, Any] = {}
    for (name, seed), rows in evaluations.items():
        entry: dict[str, Any] = {}
        for k, row in enumerate(rows[:steps]):
            entry[f"step_{k}"] = {"step_count": row["env_steps"]}
            for m in metrics:
                entry[f"step_{k}"][EXPORT_NAMES.get(m, m)] = [row[m]]
        entry["absolute_metrics"] = {
            EXPORT_NAMES.get(m, m): [_per_seed(summary, name, m)[seed]] for m in metrics
        }
        algorithms.setdefault(name, {})[f"run_{seed}"] = entry
    return {env: {task: algorithms}}, notes


def write_export(path: str, summary: Mapping[str, Any], study_dir: str) -> list[str]:
    """Write :func:`export_study` to ``path`` as JSON; returns its notes."""
    data, notes = export_study(summary, study_dir)
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    atomic_write_text(path, json.dumps(data, indent=1, allow_nan=False) + "\n")
    return notes


def _per_seed(summary: Mapping[str, Any], variant: str, metric: str) -> dict[Any, float]:
    """seed -> the variant's value of ``metric`` (the summary's per-seed values)."""
    entry = summary["variants"][variant]["metrics"].get(metric) or {}
    return dict(zip(entry.get("seeds") or [], entry.get("values") or [], strict=False))


def _common_seeds(summary: Mapping[str, Any], metric: str, notes: list[str]) -> list[int]:
    """The seeds with a value of ``metric`` in every variant, sorted."""
    by_variant = {name: set(_per_seed(summary, name, metric)) for name in summary["variants"]}
    common = set.intersection(*by_variant.values()) - {None}
    if not common:
        raise ValueError(f"no seed has a finished run of every variant with {metric}")
    for name, seeds in by_variant.items():
        if seeds - common:
            notes.append(
                f"{name}: seeds {sorted(seeds - common)} left out (not every variant finished "
                "them; marl-eval needs the same runs for every algorithm)"
            )
    return sorted(common)


def _has_values(
    summary: Mapping[str, Any], metric: str, seeds: Sequence[int], notes: list[str]
) -> bool:
    """Whether every variant has a value of ``metric`` on every one of ``seeds``."""
    missing = [
        name for name in summary["variants"] if set(seeds) - set(_per_seed(summary, name, metric))
    ]
    if missing:
        notes.append(f"{metric} left out: runs of {', '.join(missing)} lack it")
    return not missing


def _run_keys(summary: Mapping[str, Any], seeds: Sequence[int]) -> list[tuple[str, int]]:
    """(variant, seed) of every exported run, variant by variant in the summary's order."""
    return [(name, seed) for name in summary["variants"] for seed in seeds]


def _environment_and_task(configs: Sequence[Mapping[str, Any]]) -> tuple[str, str]:
    """marl-eval's environment (the module of ``env_fn``) and task (the env preset, then the
    other env options every run shares) of runs with these config.yaml mappings."""
    env_fns = {str(c.get("env_fn") or "unknown") for c in configs}
    if len(env_fns) > 1:
        raise ValueError(
            f"the runs use different environments ({', '.join(sorted(env_fns))}); marl-eval "
            "puts every algorithm of a task on one environment"
        )
    env = env_fns.pop().partition(":")[0].rpartition(".")[2]
    options = [dict(c.get("env") or {}) for c in configs]
    shared = {k: v for k, v in options[0].items() if all(o.get(k) == v for o in options)}
    preset = shared.pop("preset", None) or "default"
    return env, "-".join([str(preset), *(f"{k}={v}" for k, v in sorted(shared.items()))])


def _evaluations(
    records: Sequence[Mapping[str, Any]],
    metrics: Mapping[str, Mapping[str, Any]],
    at_env_steps: int | None,
) -> list[dict[str, Any]]:
    """A run's periodic validation evaluations in order: ``env_steps`` and the value of each
    evaluation metric the row logs (``eval/<key>``), up to ``at_env_steps`` when given."""
    rows = []
    for record in records:
        steps = record.get("env_steps")
        if not isinstance(steps, int | float) or (at_env_steps and steps > at_env_steps):
            continue
        row: dict[str, Any] = {"env_steps": steps}
        for metric, description in metrics.items():
            if description.get("source") != "eval":
                continue
            value = record.get(f"eval/{description.get('key')}")
            if isinstance(value, int | float) and math.isfinite(value):
                row[metric] = float(value)
        if len(row) > 1:
            rows.append(row)
    return rows


def _logged_by_every_run(
    metric: str, evaluations: Mapping[Any, Sequence[Mapping[str, Any]]], notes: list[str]
) -> bool:
    """Whether every periodic evaluation of every run logs ``metric``."""
    logged = all(metric in row for rows in evaluations.values() for row in rows)
    if not logged:
        notes.append(f"{metric} left out: not in every periodic evaluation")
    return logged
