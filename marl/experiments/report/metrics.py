"""The metrics a report aggregates: their sources and labels, the curves and advantage statistics
it reads from metrics.jsonl, each run's score, and which metrics a study reports and decides on
(its primary metric)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from marl.experiments import stats

if TYPE_CHECKING:
    from marl.experiments.spec import CompareSpec


#: Per-run scores aggregated across seeds: name -> (source, key, label).
#: source "eval": a field of eval.json; "auc": normalised area under a metrics.jsonl curve.
#: "last": mean of the last :data:`LAST_EVALS` periodic validation evaluations (metrics.jsonl).
METRICS: dict[str, tuple[str, str, str]] = {
    "success_rate": ("eval", "success_rate", "final success rate"),
    "success_rate_last5": (
        "last",
        "eval/success_rate",
        "success rate, mean of the last 5 validation evaluations",
    ),
    "solved_rate": ("eval", "solved_rate", "final solved rate"),
    "solved_rate_last5": (
        "last",
        "eval/solved_rate",
        "solved rate, mean of the last 5 validation evaluations",
    ),
    "mean_return": ("eval", "mean_return", "final return"),
    "auc_success": ("auc", "episode/success", "area under the success curve"),
}
#: Periodic evaluations averaged by the "last" metrics (the second endpoint).
LAST_EVALS = 5
#: The primary metric when a study names none: the first of these that the runs report.
DEFAULT_PRIMARY = ("success_rate", "mean_return")

#: Descriptive per-run figures (eval.json fields), aggregated like METRICS when any run
#: reports them (left out silently otherwise: each belongs to some environments only), with
#: P(X > reference) and the difference to the reference but no verdict: higher is not better
#: by itself (more diverse search, fewer steps to success).
DESCRIPTIVE_METRICS: dict[str, tuple[str, str, str]] = {
    "search_diversity": (
        "eval",
        "search_diversity",
        "search diversity (mean pairwise Jaccard distance between the search sets of "
        "validation episodes from the same reset seed: visited cells in multisearch, issued "
        "queries in websearch)",
    ),
    "eval_entropy": ("eval", "entropy", "policy entropy per step on validation episodes"),
    "steps_to_success": ("eval", "steps_to_success", "steps to success"),
    "query_diversity": ("eval", "query_diversity", "query diversity (distinct / issued)"),
    "query_jaccard_diversity": (
        "eval",
        "query_jaccard_diversity",
        "query diversity (mean pairwise Jaccard distance between queries)",
    ),
}

_ALL_METRICS = {**METRICS, **DESCRIPTIVE_METRICS}

#: metrics.jsonl curves shown as learning curves (training episodes, the policy's entropy per
#: update, and the validation figures logged every ``eval_every`` updates when runs log them).
CURVE_KEYS = (
    "episode/success",
    "episode/return",
    "eval/success_rate",
    "entropy",
    "eval/search_diversity",
)

ADV_STATS = ("mean", "std", "pos_frac", "pos_mean", "neg_mean")

CURVE_POINTS = 50


def _run_score(run: stats.RunData, metric: str) -> float | None:
    source, key, _ = _ALL_METRICS[metric]
    if source == "eval":
        value = (run.eval or {}).get(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        value = float(value)
        return value if np.isfinite(value) else None
    if source == "last":
        return stats.last_evaluations_mean(run.records, key, LAST_EVALS)
    x, y = stats.learning_curve(run.records, key)
    return stats.normalized_auc(x, y)


def _metric_label(metric: str, at_env_steps: int | None) -> str:
    """The metric's label; scored at N env steps, "final ..." becomes "... at N env steps"."""
    label = _ALL_METRICS[metric][2]
    if at_env_steps is None:
        return label
    if _ALL_METRICS[metric][0] == "auc":
        return f"{label} up to {at_env_steps} env steps"
    return f"{label.removeprefix('final ')} at {at_env_steps} env steps"


def _reported_metrics(
    spec: CompareSpec, loaded: Mapping[str, Sequence[stats.RunData]], warnings: list[str]
) -> list[str]:
    """The metrics some finished run reports. A metric no run reports belongs to other
    environments (e.g. success_rate of an outside env): one note, no verdicts."""
    all_runs = [r for v in spec.variants for r in loaded[v.name]]
    unreported = [
        m for m in METRICS if all_runs and all(_run_score(r, m) is None for r in all_runs)
    ]
    if unreported:
        names = ", ".join(repr(METRICS[m][1]) for m in unreported)
        warnings.append(f"no run reports {names} (the environment does not): left out")
    return [m for m in METRICS if m not in unreported] + [
        m for m in DESCRIPTIVE_METRICS if any(_run_score(r, m) is not None for r in all_runs)
    ]


def _primary_metric(spec: CompareSpec, reported: Sequence[str]) -> str:
    """The study's primary metric: ``spec.primary_metric`` if set (it must be reported by the
    runs), else the first of :data:`DEFAULT_PRIMARY` that they report."""
    chosen = getattr(spec, "primary_metric", None)
    if chosen is not None:
        if chosen not in METRICS:
            raise ValueError(
                f"primary metric {chosen!r} is not a metric with verdicts; allowed: "
                + ", ".join(METRICS)
            )
        if chosen not in reported:
            raise ValueError(
                f"primary metric {chosen!r} is not reported by any finished run; reported: "
                + (", ".join(m for m in reported if m in METRICS) or "none")
            )
        return chosen
    for name in DEFAULT_PRIMARY:
        if name in reported:
            return name
    return DEFAULT_PRIMARY[0]
