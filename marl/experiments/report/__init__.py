"""Summary, report and plots of a ``python -m marl.compare`` directory.

:func:`build_summary` reads every finished run directory, computes the figures with
:mod:`marl.experiments.stats` and returns one JSON-able mapping; :func:`write_all` writes it as

* ``summary.json``: every figure (per-seed values, IQM and mean with CIs, probability of
  improvement over the reference with CI, learning-curve bands, stability figures, advantage
  statistics over training, failed runs with their errors, commands, environment);
* ``report.md``: tables with CIs, plain-sentence verdicts, failed runs, warnings, the exact
  commands, environment and package versions, and the plots;
* ``runs.csv``: one row per run (variant, seed, status, commit, env steps, every endpoint
  metric: the summary's per-seed values);
* ``plots/learning_curves.png`` (mean across seeds with bootstrap CI bands, per variant),
  ``plots/aggregate_intervals.png`` (IQM and mean with CIs per metric and variant),
  ``plots/probability_of_improvement.png`` and ``plots/advantages_<variant>.png`` (advantage
  statistics over training, before and after whitening, per agent type).

The package, in the order the figures are made: :mod:`~marl.experiments.report.metrics` (the
metrics and each run's score), :mod:`~marl.experiments.report.aggregation` (the runs loaded and
aggregated per variant), :mod:`~marl.experiments.report.comparisons` (the comparisons, their
tests and verdicts), :mod:`~marl.experiments.report.provenance` (the runs' commits and the
environment), :mod:`~marl.experiments.report.summary` (summary.json); then the files written
from the summary: :mod:`~marl.experiments.report.markdown` (report.md),
:mod:`~marl.experiments.report.plots` (plots/*.png) and :mod:`~marl.experiments.report.runs_csv`
(runs.csv).

The study protocol (docs/results/README.md): one primary metric (``primary_metric``), whose
comparisons (each variant vs the reference, plus ``spec.comparisons``) carry a permutation
p-value, its Holm adjustment over the family and the verdict ``shown``
(:mod:`marl.experiments.significance`); every other metric's comparison is exploratory.

summary.json layout (metric names: ``success_rate``, ``solved_rate``, ``mean_return`` from
eval.json, ``success_rate_last5``, ``solved_rate_last5`` (mean of the last 5 periodic
evaluations) and ``auc_success`` from metrics.jsonl; and, where runs report them, the descriptive
``search_diversity``, ``eval_entropy``, ``steps_to_success``, ``query_diversity``,
``query_jaccard_diversity`` from eval.json, whose ``metrics`` entry says
``"descriptive": true`` and which get no verdict)::

    {"reference": "baseline", "seeds": [0, 1, ...], "budget": {...}, "bootstrap": {...},
     "variants": {NAME: {"args": [...], "n_finished", "n_failed", "n_missing",
                         "metrics": {METRIC: {"n", "values", "seeds", "iqm", "iqm_ci",
                                              "mean", "mean_ci", "std", "min", "max"}},
                         "probability_of_improvement": {METRIC: {...}} | None,
                         "curves": {"episode/success": {"env_steps", "mean", "mean_ci",
                                                        "iqm", "iqm_ci", "n"}, ...},
                         "stability": {...}, "stability_per_run": [...],
                         "work": {"env_steps" | "wall_s" | "cpu_s" | "env_steps_per_s":
                                  {"mean", "min", "max"}},
                         "advantages": {"all" | TYPE: {"adv_raw" | "adv": {STAT: curve}}}}},
     "probability_of_improvement": {NAME: {METRIC: {"value", "ci", "n_x", "n_y",
                                                    "mean_difference": {"value", "ci",
                                                                        "relative",
                                                                        "relative_ci"},
                                                    "p_value", "test": {...},
                                                    primary: "p_holm", "shown", "direction";
                                                    others: "exploratory": true}}},
     "primary_metric": METRIC, "comparisons": [{"variant", "baseline", "metric", "value",
     "ci", "mean_difference", "p_value", "p_holm", "shown", "direction", "test",
     "left_out": None | {"reason": "a/a" | "repeat", "why", "repeats"}}],
     "one_configuration": [[NAME, NAME, ...], ...] (arms whose evaluation figures are
     identical on every seed; comparisons among them, or repeating one another, are left out
     of the Holm family),
     "decision_rule": {...}, "commits": [sha, ...],
     "verdicts": [sentences], "runs": [{"variant", "seed", "status", "error", ...}],
     "warnings": [...], "commands": {...}, "environment": {...}, "plots": [...]}

CIs are ``[low, high]`` or ``None`` (fewer than two runs).
"""

from __future__ import annotations

import os
from typing import Any

# marl.experiments.compare calls report.stats.check_dependencies()
from marl.experiments import stats as stats
from marl.experiments.report.markdown import write_report
from marl.experiments.report.metrics import (
    ADV_STATS,
    CURVE_KEYS,
    CURVE_POINTS,
    DEFAULT_PRIMARY,
    DESCRIPTIVE_METRICS,
    LAST_EVALS,
    METRICS,
)
from marl.experiments.report.plots import compact_png, make_plots, save_png
from marl.experiments.report.provenance import PACKAGES, MixedCodeError, environment_info
from marl.experiments.report.runs_csv import RUNS_CSV_COLUMNS, write_runs_csv
from marl.experiments.report.summary import build_summary, jsonable, round_plotted, summary_text
from marl.run.rundir import atomic_write_text

__all__ = [
    "METRICS",
    "DESCRIPTIVE_METRICS",
    "MixedCodeError",
    "build_summary",
    "write_all",
    "write_runs_csv",
    "write_report",
    "make_plots",
    "ADV_STATS",
    "CURVE_KEYS",
    "CURVE_POINTS",
    "DEFAULT_PRIMARY",
    "LAST_EVALS",
    "PACKAGES",
    "RUNS_CSV_COLUMNS",
    "compact_png",
    "environment_info",
    "save_png",
]


def write_all(summary: dict[str, Any], out: str, *, plots: bool = True) -> dict[str, Any]:
    """Write plots (unless ``plots=False``), ``summary.json`` (in
    :func:`~marl.experiments.report.summary.summary_text`'s layout, its plotted-only curves at
    :data:`~marl.experiments.report.summary.PLOTTED_DIGITS` significant digits; the returned
    summary keeps every digit), ``report.md`` and ``runs.csv`` (:func:`write_runs_csv`) into
    ``out``."""
    os.makedirs(out, exist_ok=True)
    summary["plots"] = make_plots(summary, out) if plots else []
    text = summary_text(round_plotted(jsonable(summary)))
    atomic_write_text(os.path.join(out, "summary.json"), text)
    write_report(summary, out)
    write_runs_csv(summary, out)
    return summary
