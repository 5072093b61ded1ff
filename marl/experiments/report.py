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

import csv
import datetime
import io
import json
import os
import platform
import re
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from marl.experiments import significance, stats
from marl.run.provenance import cpu_model, git_state, package_versions
from marl.run.rundir import atomic_write_text

if TYPE_CHECKING:
    from marl.experiments.spec import CompareSpec

__all__ = [
    "METRICS",
    "DESCRIPTIVE_METRICS",
    "MixedCodeError",
    "build_summary",
    "write_all",
    "write_runs_csv",
    "write_report",
    "make_plots",
]

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


class MixedCodeError(ValueError):
    """The runs of a study come from different code commits (``--allow-mixed-code`` accepts)."""


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
PACKAGES = (
    "torch",
    "numpy",
    "scipy",
    "rliable",
    "arch",
    "pandas",
    "matplotlib",
    "pettingzoo",
    "gymnasium",
    "einops",
    "numba",
    "pyyaml",
    "tqdm",
    "mamba-ssm",
)
CURVE_POINTS = 50


# ------------------------------------------------------------------------------------------
# environment
# ------------------------------------------------------------------------------------------
def environment_info() -> dict[str, Any]:
    """Python, platform, CPU count, package versions and the git commit of the code."""
    versions = package_versions(PACKAGES)
    git = git_state()
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model(),
        "packages": versions,
        "git": git,
    }


# ------------------------------------------------------------------------------------------
# summary
# ------------------------------------------------------------------------------------------
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


def _agent_types(records: Sequence[Mapping[str, Any]]) -> list[str]:
    pattern = re.compile(r"^adv(?:_raw)?/([^/]+)/mean$")
    found: set[str] = set()
    for row in records:
        for key in row:
            m = pattern.match(key)
            if m:
                found.add(m.group(1))
    return sorted(found)


def _mean_curves(
    runs: Sequence[stats.RunData], key: str, num_points: int = CURVE_POINTS
) -> dict[str, Any] | None:
    """Mean over runs (no CI) of a metrics.jsonl curve on the common env-step grid."""
    curves = [stats.learning_curve(r.records, key) for r in runs]
    curves = [c for c in curves if c[0].size]
    resampled = stats.resample_curves(curves, num_points)
    if resampled is None:
        return None
    grid, values = resampled
    return {"env_steps": grid.tolist(), "mean": values.mean(axis=0).tolist(), "n": len(curves)}


def _metric_label(metric: str, at_env_steps: int | None) -> str:
    """The metric's label; scored at N env steps, "final ..." becomes "... at N env steps"."""
    label = _ALL_METRICS[metric][2]
    if at_env_steps is None:
        return label
    if _ALL_METRICS[metric][0] == "auc":
        return f"{label} up to {at_env_steps} env steps"
    return f"{label.removeprefix('final ')} at {at_env_steps} env steps"


def _load_runs(
    spec: CompareSpec,
    records: Sequence[Mapping[str, Any]],
    at_env_steps: int | None,
    warnings: list[str],
) -> tuple[dict[str, list[stats.RunData]], list[dict[str, Any]]]:
    """The finished runs' data per variant (as they stood at ``at_env_steps`` when given) and
    one row per run for summary.json; unreadable or short runs become ``failed`` / ``short``
    rows with a warning."""
    loaded: dict[str, list[stats.RunData]] = {v.name: [] for v in spec.variants}
    run_rows = []
    for rec in records:
        row = dict(rec)
        row["run_dir"] = os.path.relpath(rec["run_dir"], spec.out)
        run_rows.append(row)
        if rec["status"] != "finished":
            continue
        label = f"{rec['variant']}/seed_{rec['seed']}"
        try:
            run: stats.RunData | None = stats.load_run(rec["run_dir"])
        except ValueError as exc:
            row.update(status="failed", error=f"unreadable results: {exc}")
            continue
        if at_env_steps is not None:
            run, reason = stats.run_at_env_steps(run, at_env_steps)
            if run is None:
                row.update(status="short", error=reason)
                warnings.append(f"run {label} is excluded at {at_env_steps} env steps: {reason}")
                continue
            row["eval_env_steps"] = run.eval["env_steps"]
            budget_bound = {
                k: (run.config or {}).get(k)
                for k, free in stats.BUDGET_FREE_SETTINGS.items()
                if (run.config or {}).get(k, free) != free
            }
            if budget_bound:
                warnings.append(
                    f"run {label} has a schedule over training progress ({budget_bound}): its "
                    f"state at {at_env_steps} env steps depends on its total budget"
                )
        loaded[rec["variant"]].append(run)
        row["eval"] = run.eval
        steps = [r.get("env_steps") for r in run.records]
        steps = [x for x in steps if isinstance(x, int | float)]
        row["env_steps"] = max(steps) if steps else None
        if run.bad_lines:
            warnings.append(f"{label}: {run.bad_lines} unparsable metrics.jsonl line(s) skipped")
    return loaded, run_rows


def _warn_run_counts(
    spec: CompareSpec, run_rows: Sequence[Mapping[str, Any]], warnings: list[str]
) -> None:
    """Warnings for failed and missing runs, and for too few seeds."""
    for row in run_rows:
        if row["status"] == "failed":
            first = (row.get("error") or "").splitlines()[:1]
            warnings.append(
                f"run {row['variant']}/seed_{row['seed']} failed and is excluded from the "
                f"statistics ({first[0] if first else 'no error text'}); log: {row['log']}"
            )
        elif row["status"] == "missing":
            warnings.append(
                f"run {row['variant']}/seed_{row['seed']} has not finished (not run yet or "
                "interrupted) and is excluded; rerun the same command to complete it"
            )
    if len(spec.seeds) < 2:
        warnings.append(
            f"only {len(spec.seeds)} seed per variant: figures are point estimates without "
            "confidence intervals; use --seeds 5 or more for claims"
        )
    elif len(spec.seeds) < 5:
        warnings.append(
            f"only {len(spec.seeds)} seeds per variant: bootstrap CIs from so few runs are "
            "too narrow (a percentile bootstrap cannot see beyond the observed runs); treat "
            "the verdicts as indicative and use --seeds 5 or more for claims"
        )


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


def _variant_scores(
    name: str, runs: Sequence[stats.RunData], reported: Sequence[str], warnings: list[str]
) -> tuple[dict[str, list[float]], dict[str, dict[int, float]]]:
    """Per metric: the runs' scores (runs without one left out, with a warning) and the same
    keyed by seed (for tests paired by seed)."""
    scores: dict[str, list[float]] = {}
    by_seed: dict[str, dict[int, float]] = {}
    for metric in reported:
        values = [_run_score(r, metric) for r in runs]
        present = [x for x in values if x is not None]
        if len(present) < len(values):
            warnings.append(
                f"{name}: {len(values) - len(present)} finished run(s) lack "
                f"{_ALL_METRICS[metric][1]!r}; left out of {metric}"
            )
        scores[metric] = present
        by_seed[metric] = {
            int(r.config["seed"]): x
            for r, x in zip(runs, values, strict=True)
            if x is not None and r.config and isinstance(r.config.get("seed"), int)
        }
    return scores, by_seed


def _interval_entry(
    name: str,
    metric: str,
    runs: Sequence[stats.RunData],
    values: Sequence[float],
    by_seed: Mapping[int, float],
    reps: int,
    seed: int,
    confidence: float,
) -> dict[str, Any]:
    """IQM and mean with bootstrap CIs of one variant's scores on one metric, and their seeds."""
    est = stats.interval_estimates(
        values,
        reps=reps,
        seed=stats.derive_seed(seed, "interval", name, metric),
        confidence=confidence,
    )
    if runs:
        with_score = [_run_score(r, metric) is not None for r in runs]
        est["seeds"] = [
            int(r.config.get("seed")) if r.config and "seed" in r.config else None
            for r, has in zip(runs, with_score, strict=True)
            if has
        ]
    return est


def _curves(
    name: str, runs: Sequence[stats.RunData], reps: int, seed: int, confidence: float
) -> dict[str, Any]:
    """Learning curves (:data:`CURVE_KEYS`) on a common env-step grid, with bootstrap bands."""
    curves: dict[str, Any] = {}
    for key in CURVE_KEYS:
        raw = [stats.learning_curve(r.records, key) for r in runs]
        resampled = stats.resample_curves([c for c in raw if c[0].size], CURVE_POINTS)
        if resampled is None:
            continue
        grid, values = resampled
        band = stats.curve_bands(
            values,
            reps=max(1, min(reps, 1000)),
            seed=stats.derive_seed(seed, "curve", name, key),
            confidence=confidence,
        )
        curves[key] = {"env_steps": grid.tolist(), "n": int(values.shape[0]), **band}
    return curves


def _stability_and_advantages(
    runs: Sequence[stats.RunData], entropy_threshold: float
) -> dict[str, Any]:
    """Stability figures (per run and aggregated) and the advantage statistics over training
    per agent type (mean curves, before and after whitening)."""
    per_run = [
        stats.stability_figures(r.records, entropy_threshold=entropy_threshold) for r in runs
    ]
    types = sorted({t for r in runs for t in _agent_types(r.records)})
    advantages: dict[str, Any] = {}
    for group in ["all", *types]:
        advantages[group] = {}
        for prefix in ("adv_raw", "adv"):
            base = prefix if group == "all" else f"{prefix}/{group}"
            advantages[group][prefix] = {
                stat: _mean_curves(runs, f"{base}/{stat}") for stat in ADV_STATS
            }
    return {
        "stability": stats.aggregate_stability(per_run) if runs else None,
        "stability_per_run": per_run,
        "advantages": advantages,
        "agent_types": types,
    }


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


def _check_commits(
    spec: CompareSpec, loaded: Mapping[str, Sequence[stats.RunData]], warnings: list[str]
) -> list[str]:
    """The distinct git commits of the finished runs (finished.json), sorted.

    Runs of different commits (or one run resumed under another commit) raise
    :class:`MixedCodeError` unless ``spec.allow_mixed_code``; then, as runs from a tree with
    uncommitted changes or with no recorded commit, they produce a warning.
    """
    seen: dict[str, list[str]] = {}
    unknown: list[str] = []
    dirty: list[str] = []
    for name, runs in loaded.items():
        for run in runs:
            label = f"{name}/{os.path.basename(run.run_dir)}"
            marker = run.marker or {}
            run_commits = marker.get("commits") or (
                [marker["commit"]] if marker.get("commit") else []
            )
            if not run_commits:
                unknown.append(label)
            for commit in run_commits:
                seen.setdefault(str(commit), []).append(label)
            if marker.get("dirty"):
                dirty.append(label)
    commits = sorted(seen)
    if len(commits) > 1:
        detail = "; ".join(f"{c[:12]}: {len(v)} run(s), e.g. {v[0]}" for c, v in seen.items())
        if not getattr(spec, "allow_mixed_code", False):
            raise MixedCodeError(
                f"the runs come from {len(commits)} code commits ({detail}): their differences "
                "may be the code's, not the variants'. Rerun them at one commit, or pass "
                "--allow-mixed-code to aggregate anyway (the report then says so)"
            )
        warnings.append(
            f"mixed code (--allow-mixed-code): the runs come from {len(commits)} commits "
            f"({detail}); differences between variants may be the code's"
        )
    if unknown:
        warnings.append(
            f"{len(unknown)} run(s) record no git commit (trained outside a git checkout or "
            f"before runs recorded it), e.g. {unknown[0]}: same code is not established"
        )
    if dirty:
        warnings.append(
            f"{len(dirty)} run(s) ran from a tree with uncommitted changes, e.g. {dirty[0]}: "
            "their commit does not identify their code"
        )
    return commits


def _work(runs: Sequence[stats.RunData]) -> dict[str, Any]:
    """The work the runs consumed (finished.json): env steps, wall and CPU seconds, and the
    throughput (env steps per wall second), each as mean / min / max over runs."""

    def spread(values: list[float]) -> dict[str, float] | None:
        if not values:
            return None
        return {"mean": float(np.mean(values)), "min": min(values), "max": max(values)}

    def numbers(key: str) -> list[float]:
        out = []
        for run in runs:
            value = (run.marker or {}).get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                out.append(float(value))
        return out

    rates = [
        float(m["env_steps"]) / float(m["time_s"])
        for m in (run.marker or {} for run in runs)
        if isinstance(m.get("env_steps"), int | float) and m.get("time_s")
    ]
    return {
        "env_steps": spread(numbers("env_steps")),
        "wall_s": spread(numbers("time_s")),
        "cpu_s": spread(numbers("cpu_s")),
        "env_steps_per_s": spread(rates),
    }


class _Compared:
    """One comparison of two variants on one metric: P(improvement) and the difference of
    means with bootstrap CIs, and the permutation test's p-value (paired by seed on the seeds
    both variants finished when there are at least two, else unpaired)."""

    def __init__(
        self,
        scores: Mapping[str, Mapping[str, list[float]]],
        by_seed: Mapping[str, Mapping[str, Mapping[int, float]]],
        reps: int,
        seed: int,
        confidence: float,
    ) -> None:
        self.scores, self.by_seed = scores, by_seed
        self.reps, self.seed, self.confidence = reps, seed, confidence

    def __call__(self, name: str, baseline: str, metric: str) -> dict[str, Any]:
        x, y = self.scores[name][metric], self.scores[baseline][metric]
        poi = stats.probability_of_improvement(
            x,
            y,
            reps=self.reps,
            seed=stats.derive_seed(self.seed, "poi", name, baseline, metric),
            confidence=self.confidence,
        )
        poi["mean_difference"] = stats.mean_difference(
            x,
            y,
            reps=self.reps,
            seed=stats.derive_seed(self.seed, "diff", name, baseline, metric),
            confidence=self.confidence,
        )
        sx, sy = self.by_seed[name][metric], self.by_seed[baseline][metric]
        common = sorted(set(sx) & set(sy))
        paired = len(common) >= 2
        if paired:
            test = significance.permutation_test(
                [sx[k] for k in common],
                [sy[k] for k in common],
                paired=True,
                seed=stats.derive_seed(self.seed, "perm", name, baseline, metric),
            )
        else:
            test = significance.permutation_test(
                x, y, seed=stats.derive_seed(self.seed, "perm", name, baseline, metric)
            )
        poi["p_value"] = test["p_value"]
        poi["test"] = {
            "paired": test["paired"],
            "n_pairs": len(common) if paired else None,
            "exact": test["exact"],
            "arrangements": test["resamples"],
            "min_p": test["min_p"],
        }
        return poi


def _primary_family(
    spec: CompareSpec,
    primary: str,
    improvement: dict[str, dict[str, Any]],
    compared: _Compared,
    groups: Sequence[Sequence[str]] = (),
) -> list[dict[str, Any]]:
    """The study's primary comparisons on ``primary``: every variant against the reference,
    then the pre-registered ``spec.comparisons`` pairs; Holm-adjusted together, each decided
    by :func:`marl.experiments.significance.decide`. The entries against the reference are
    also written into ``improvement[variant][primary]`` (``p_holm``, ``shown``, ...).

    ``groups``: the arms that are one configuration (identical results on every seed,
    :func:`marl.experiments.significance.identical_arms`). A comparison between two of them
    (A/A) and one that repeats an earlier comparison of the same two configurations
    (:func:`marl.experiments.significance.family_repeats`) are left out of the Holm family:
    each carries ``left_out`` (``reason`` "a/a" or "repeat", ``why``, ``repeats``: the
    repeated comparison's variant and baseline, None for an A/A) and the repeated comparison's
    ``p_holm`` and verdict (an A/A: None for both); the others carry ``left_out: None``."""
    entries: list[dict[str, Any]] = []
    for name, per_metric in improvement.items():
        if primary in per_metric:
            entries.append({"variant": name, "baseline": spec.reference, **per_metric[primary]})
    for name, baseline in getattr(spec, "comparisons", None) or []:
        if baseline == spec.reference or any(
            e["variant"] == name and e["baseline"] == baseline for e in entries
        ):
            continue
        entries.append({"variant": name, "baseline": baseline, **compared(name, baseline, primary)})
    left_out = significance.family_repeats([(e["variant"], e["baseline"]) for e in entries], groups)
    kept = [i for i, why in enumerate(left_out) if why is None]
    adjusted = significance.holm([entries[i]["p_value"] for i in kept])
    for i, p_holm in zip(kept, adjusted, strict=True):
        entry = entries[i]
        entry.update(metric=primary, p_holm=p_holm, left_out=None)
        entry.update(
            significance.decide(p_holm, entry.get("ci"), entry["mean_difference"]["value"])
        )
    for entry, why in zip(entries, left_out, strict=True):
        if why is not None:
            entry.update(metric=primary, **_left_out_verdict(entry, why, entries, groups))
    for entry in entries:
        if entry["baseline"] == spec.reference:
            target = improvement[entry["variant"]][primary]
            target.update(
                p_holm=entry["p_holm"], shown=entry["shown"], direction=entry["direction"]
            )
            if entry["left_out"] is not None:
                target["left_out"] = entry["left_out"]
    return entries


def _left_out_verdict(
    entry: Mapping[str, Any],
    why: Mapping[str, Any],
    entries: Sequence[Mapping[str, Any]],
    groups: Sequence[Sequence[str]],
) -> dict[str, Any]:
    """A comparison left out of the Holm family: its ``left_out`` record, and the verdict it
    carries (the repeated comparison's; none for an A/A)."""
    name, baseline = entry["variant"], entry["baseline"]
    if why["reason"] == "a/a":
        text = f"{name} and {baseline} gave identical results on every seed: one configuration"
        record = {"reason": "a/a", "why": text + ", so this is an A/A comparison", "repeats": None}
        return {"left_out": record, "p_holm": None, "shown": None, "direction": None}
    repeated = entries[why["repeats"]]
    other = (repeated["variant"], repeated["baseline"])
    if why["reversed"]:
        other = other[::-1]
    same = [
        f"{mine} and {theirs}"
        for mine, theirs in zip((name, baseline), other, strict=True)
        if mine != theirs and any(mine in g and theirs in g for g in groups)
    ]
    text = f"{name} vs {baseline} repeats {repeated['variant']} vs {repeated['baseline']}"
    text += " (reversed)" if why["reversed"] else ""
    if same:
        text += f": {' and '.join(same)} gave identical results on every seed (one configuration)"
    else:
        text += ": the same two-sided test"
    direction = repeated["direction"]
    if why["reversed"] and direction is not None:
        direction = "worse" if direction == "better" else "better"
    return {
        "left_out": {
            "reason": "repeat",
            "why": text,
            "repeats": {"variant": repeated["variant"], "baseline": repeated["baseline"]},
        },
        "p_holm": repeated["p_holm"],
        "shown": repeated["shown"],
        "direction": direction,
    }


def _verdict_sentences(
    spec: CompareSpec,
    family: Sequence[Mapping[str, Any]],
    improvement: Mapping[str, Mapping[str, Any]],
    primary: str,
    at_env_steps: int | None,
) -> list[str]:
    """Plain sentences: one per primary comparison ("shown better/worse" or "nothing shown",
    with P(improvement), the difference and p_holm), then the secondary metrics' figures
    labelled exploratory."""
    label = _metric_label(primary, at_env_steps)
    out = []
    for e in family:
        figure = _comparison_figures(e)
        if e.get("left_out"):
            verdict = "no verdict"
            if e["left_out"]["reason"] == "repeat":
                verdict = f"its verdict is that comparison's ({_verdict_text(e)})"
            out.append(
                f"left out of the Holm family: {e['variant']} vs {e['baseline']} on {label}: "
                f"{e['left_out']['why']}; {verdict}."
            )
        elif e["shown"]:
            word = "better than" if e["direction"] == "better" else "worse than"
            out.append(f"**shown**: {e['variant']} is {word} {e['baseline']} on {label}: {figure}.")
        else:
            out.append(f"nothing shown: {e['variant']} vs {e['baseline']} on {label}: {figure}.")
    for name, per_metric in improvement.items():
        for metric, poi in per_metric.items():
            if metric == primary or metric not in METRICS:
                continue
            out.append(
                f"exploratory: {name} vs {spec.reference} on "
                f"{_metric_label(metric, at_env_steps)}: {_comparison_figures(poi)}."
            )
    return out


def _verdict_text(e: Mapping[str, Any]) -> str:
    """``**shown better**`` or ``nothing shown``."""
    return f"**shown {e['direction']}**" if e.get("shown") else "nothing shown"


def _comparison_figures(e: Mapping[str, Any]) -> str:
    """``P = 0.81 [0.60, 0.97], difference +0.123 [..], p = 0.004, p_holm = 0.02``."""
    parts = []
    if e.get("value") is not None:
        parts.append(f"P(improvement) = {_fmt_ci(e['value'], e.get('ci'), 2)}")
    diff = e.get("mean_difference") or {}
    if diff.get("value") is not None:
        text = f"difference {diff['value']:+.3f}"
        if diff.get("ci") is not None:
            text += f" [{diff['ci'][0]:+.3f}, {diff['ci'][1]:+.3f}]"
        parts.append(text)
    if e.get("p_value") is not None:
        parts.append(f"p = {e['p_value']:.3g}")
    if e.get("p_holm") is not None:
        parts.append(f"p_holm = {e['p_holm']:.3g}")
    return ", ".join(parts) or "no finished runs to compare"


def build_summary(
    spec: CompareSpec,
    records: Sequence[Mapping[str, Any]],
    *,
    reps: int = stats.DEFAULT_REPS,
    seed: int = 0,
    confidence: float = 0.95,
    entropy_threshold: float = 0.1,
    command: str | None = None,
    wall_s: float | None = None,
    title: str | None = None,
    at_env_steps: int | None = None,
) -> dict[str, Any]:
    """All figures of a comparison as one JSON-able mapping (see the module docstring).

    ``records`` are :func:`marl.experiments.compare.collect_runs` rows. Only finished runs enter the
    statistics; failed and missing runs are listed with their errors and counted, and produce
    warnings. Each bootstrap uses a seed derived from ``seed`` and the figure's name, so the
    summary is reproducible and independent of the variants' order.

    ``at_env_steps=N`` scores every run as it stood after N env steps
    (:func:`marl.experiments.stats.run_at_env_steps`: the validation evaluation logged last at
    or before N instead of eval.json, the curves up to N): equal samples from runs trained on
    a time budget. Runs that stopped before N, or logged no evaluation by then, get the status
    ``short`` and are excluded; runs whose config ties a schedule to the budget are named in a
    warning.
    """
    if at_env_steps is not None and at_env_steps < 1:
        raise ValueError(f"at_env_steps must be a positive number of env steps, got {at_env_steps}")
    warnings: list[str] = []
    loaded, run_rows = _load_runs(spec, records, at_env_steps, warnings)
    _warn_run_counts(spec, run_rows, warnings)
    reported = _reported_metrics(spec, loaded, warnings)
    primary = _primary_metric(spec, reported)
    commits = _check_commits(spec, loaded, warnings)
    variants: dict[str, Any] = {}
    scores: dict[str, dict[str, list[float]]] = {}
    by_seed: dict[str, dict[str, dict[int, float]]] = {}
    for v in spec.variants:
        runs = loaded[v.name]
        scores[v.name], by_seed[v.name] = _variant_scores(v.name, runs, reported, warnings)
        if len(runs) == 1 and len(spec.seeds) >= 2:
            warnings.append(f"{v.name}: only 1 finished run: its figures have no CI")
        statuses = [r["status"] for r in run_rows if r["variant"] == v.name]
        variants[v.name] = _variant_entry(
            v.args, runs, statuses, reported, scores[v.name], by_seed[v.name], v.name,
            reps=reps, seed=seed, confidence=confidence, entropy_threshold=entropy_threshold,
        )  # fmt: skip

    ref = spec.reference
    compared = _Compared(scores, by_seed, reps, seed, confidence)
    improvement: dict[str, Any] = {}
    for v in spec.variants:
        if v.name != ref:
            improvement[v.name] = {m: compared(v.name, ref, m) for m in reported}
    evaluation = [m for m in reported if _ALL_METRICS[m][0] in ("eval", "last")]
    one_configuration = significance.identical_arms(by_seed, primary, evaluation)
    family = _primary_family(spec, primary, improvement, compared, one_configuration)
    for entry in improvement.values():
        for metric, poi in entry.items():
            if metric != primary:
                poi["exploratory"] = True
    sentences = _verdict_sentences(spec, family, improvement, primary, at_env_steps)
    for name, entry in variants.items():
        entry["probability_of_improvement"] = improvement.get(name)  # None for the reference

    if title is None:
        title = f"Study '{spec.study}'" if spec.study else "Comparison of variants"
        if at_env_steps is not None:
            title += f" at {at_env_steps} env steps"
    return {
        **_study_header(spec, title, at_env_steps),
        "primary_metric": primary,
        "decision_rule": _decision_rule(family),
        "comparisons": family,
        "one_configuration": one_configuration,
        "commits": commits,
        "bootstrap": {
            "reps": reps,
            "seed": seed,
            "confidence": confidence,
            "method": "percentile, stratified over runs (rliable)",
        },
        "entropy_threshold": entropy_threshold,
        "metrics": _metric_descriptions(reported, at_env_steps),
        "variants": variants,
        "probability_of_improvement": improvement,
        "verdicts": sentences,
        "runs": run_rows,
        "warnings": warnings,
        "commands": {
            "compare": command,
            "train": {f"{r['variant']}/seed_{r['seed']}": r["command"] for r in run_rows},
        },
        "wall_s": wall_s,
        "environment": environment_info(),
    }


def _variant_entry(
    args: list[str],
    runs: list[Any],
    statuses: list[str],
    reported: Sequence[str],
    scores: Mapping[str, list[float]],
    by_seed: Mapping[str, dict[int, float]],
    name: str,
    *,
    reps: int,
    seed: int,
    confidence: float,
    entropy_threshold: float,
) -> dict[str, Any]:
    """One variant's section of summary.json: its arguments, work, run counts, each metric's
    interval, its curves, stability and advantage statistics (the probability of improvement
    is added by :func:`build_summary`)."""
    return {
        "args": args,
        "work": _work(runs),
        "n_runs": len(statuses),
        "n_finished": len(runs),
        "n_failed": statuses.count("failed"),
        "n_missing": statuses.count("missing"),
        "n_short": statuses.count("short"),
        "metrics": {
            metric: _interval_entry(
                name, metric, runs, scores[metric], by_seed[metric], reps, seed, confidence
            )
            for metric in reported
        },
        "curves": _curves(name, runs, reps, seed, confidence),
        **_stability_and_advantages(runs, entropy_threshold),
    }


def _study_header(spec: CompareSpec, title: str, at_env_steps: int | None) -> dict[str, Any]:
    """summary.json's opening keys: what was compared, on what budget and seeds."""
    return {
        "schema_version": 1,
        "title": title,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "algo": spec.algo,
        "study": spec.study,
        "config": spec.config,
        "common": spec.common,
        "budget": {
            "total_steps": spec.total_steps,
            "max_time": spec.max_time,
            "max_cpu_time": spec.max_cpu_time,
        },
        "at_env_steps": at_env_steps,
        "seeds": spec.seeds,
        "jobs": spec.jobs,
        "reference": spec.reference,
    }


def _decision_rule(family: list[dict[str, Any]]) -> dict[str, Any]:
    """The rule a verdict follows (test, correction, alpha) and its outcome on ``family``."""
    return {
        "alpha": significance.ALPHA,
        "correction": "holm",
        "test": "two-sided permutation test of the difference of means (paired by seed where "
        "both arms ran the seed: sign flips of the per-seed differences; else relabelling), "
        f"exact up to {significance.EXACT_LIMIT} arrangements, else "
        f"{significance.RESAMPLES} random ones",
        "text": significance.describe_rule(),
        "outcome": significance.summarize_family(family),
    }


def _metric_descriptions(reported: Sequence[str], at_env_steps: int | None) -> dict[str, Any]:
    """Where each reported metric comes from, its label, and whether it is descriptive."""
    return {
        k: {
            "source": _ALL_METRICS[k][0],
            "key": _ALL_METRICS[k][1],
            "label": _metric_label(k, at_env_steps),
            "descriptive": k in DESCRIPTIVE_METRICS,
        }
        for k in reported
    }


# ------------------------------------------------------------------------------------------
# report.md
# ------------------------------------------------------------------------------------------
def _fmt(x: float | None, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _fmt_ci(value: float | None, ci: Sequence[float] | None, digits: int = 3) -> str:
    if value is None:
        return "n/a"
    if ci is None:
        return f"{value:.{digits}f} (no CI)"
    return f"{value:.{digits}f} [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]"


def _phase(d: Mapping[str, Any] | None) -> str:
    if not d or d.get("first_quarter") is None:
        return "n/a"
    return f"{d['first_quarter']:.2f} → {d['last_quarter']:.2f}"


def _seed_claim_section(s: Mapping[str, Any]) -> list[str]:
    """For the calibration study: seed 000's (docs/seeds.md) "+22% success" claim against the
    measurement."""
    poi_all = s.get("probability_of_improvement") or {}
    if s.get("study") != "calibration" or s.get("reference") != "baseline":
        return []
    if "success_rate" not in poi_all.get("calibrated", {}):
        return []
    poi = poi_all["calibrated"]["success_rate"]
    diff = poi["mean_difference"]
    conf = f"{100 * s['bootstrap']['confidence']:g}%"
    lines = ["## The seed's claim", ""]
    if diff["value"] is None:
        return [*lines, "No finished runs of calibrated or baseline: nothing to test.", ""]
    text = (
        "Seed 000 reports that its calibrated recipe reaches a success rate about 22% higher "
        "than the baseline. Measured here (final success rate on the validation seeds): "
        f"calibrated − baseline = {100 * diff['value']:+.1f} percentage points"
    )
    if diff["ci"] is not None:
        text += f" [{100 * diff['ci'][0]:+.1f}, {100 * diff['ci'][1]:+.1f}] ({conf} CI)"
    if diff["relative"] is not None:
        text += f", {100 * diff['relative']:+.0f}% relative to the baseline's mean"
        if diff.get("relative_ci") is not None:
            low, high = diff["relative_ci"]
            text += f" [{100 * low:+.0f}%, {100 * high:+.0f}%]"
    text += ". " + stats.verdict("calibrated", "baseline", "final success rate", poi)
    return [*lines, text, ""]


def _primary_section(s: Mapping[str, Any]) -> list[str]:
    """The table of primary comparisons with their p-values and verdicts."""
    family = s.get("comparisons") or []
    lines = ["## Primary comparisons", ""]
    if not family:
        return [*lines, "(only one variant: nothing to compare)", ""]
    outcome = s["decision_rule"]["outcome"]
    lines += [
        f"{outcome['comparisons']} primary comparison(s) on `{s['primary_metric']}`, "
        f"Holm-adjusted together: **{outcome['shown']} shown** ({outcome['better']} better, "
        f"{outcome['worse']} worse)" + (", nothing shown." if outcome["shown"] == 0 else "."),
        "",
    ]
    groups = s.get("one_configuration") or []
    if groups:
        lines += [
            "**One configuration**: "
            + "; ".join(" = ".join(g) for g in groups)
            + " gave identical results on every seed (every evaluation figure, seed for seed): "
            "each group "
            "is one configuration trained more than once. Comparisons within a group are A/A, "
            f"and comparisons that repeat another are no new test: {outcome.get('left_out', 0)} "
            "left out of the Holm family (marked below).",
            "",
        ]
    lines += [
        "| variant | baseline | P(improvement) | mean difference | p | p_holm | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for e in family:
        diff = e.get("mean_difference") or {}
        verdict = _verdict_text(e)
        if e.get("left_out"):
            repeats = e["left_out"]["repeats"]
            verdict = (
                "left out: A/A (one configuration)"
                if repeats is None
                else f"left out: repeats {repeats['variant']} vs {repeats['baseline']} ({verdict})"
            )
        p = "n/a" if e.get("p_value") is None else f"{e['p_value']:.3g}"
        p_holm = "n/a" if e.get("p_holm") is None else f"{e['p_holm']:.3g}"
        lines.append(
            f"| {e['variant']} | {e['baseline']} | {_fmt_ci(e.get('value'), e.get('ci'), 2)} | "
            f"{_fmt_ci(diff.get('value'), diff.get('ci'))} | {p} | {p_holm} | {verdict} |"
        )
    return [*lines, ""]


def _header_section(s: Mapping[str, Any]) -> list[str]:
    """The title, the design in one paragraph, the statistics and the rule."""
    conf = f"{100 * s['bootstrap']['confidence']:g}%"
    lines: list[str] = [f"# {s['title']}", ""]
    budget = s["budget"]
    budget_text = (
        f"{budget['total_steps']} env steps per run"
        if budget["total_steps"] is not None
        else f"{budget['max_time']:g} s wall clock per run"
        if budget["max_time"] is not None
        else f"{budget['max_cpu_time']:g} CPU s per run"
        if budget.get("max_cpu_time") is not None
        else "the config's budget per run"
    )
    lines += [
        f"Algorithm `{s['algo']}`, {len(s['variants'])} variants x {len(s['seeds'])} seeds "
        f"(seeds {s['seeds'][0]}..{s['seeds'][-1]}), budget: {budget_text}, "
        f"{s['jobs']} run(s) at once. Reference variant: **{s['reference']}**. "
        f"Generated {s['created']}.",
        "",
        f"Statistics: IQM (interquartile mean) and mean over seeds with {conf} stratified "
        f"bootstrap confidence intervals ({s['bootstrap']['reps']} resamples, seed "
        f"{s['bootstrap']['seed']}, rliable); probability of improvement P(X > baseline) for "
        "one run of each, with its CI. Primary metric: "
        f"**{s['metrics'].get(s.get('primary_metric'), {}).get('label', s.get('primary_metric'))}**"
        f" (`{s.get('primary_metric')}`). " + s["decision_rule"]["text"],
        "",
    ]
    at_steps = s.get("at_env_steps")
    if at_steps is not None:
        lines += [
            f"**Scored at {at_steps} env steps**, not at the end of the runs: each run's "
            f"validation evaluation logged last at or before {at_steps} env steps (runs "
            "evaluate every `eval_every` updates: the counts are in the last column of the "
            "variants table) stands in for its eval.json, and the curves stop there. Runs that "
            "stopped before that count are excluded (status `short`).",
            "",
        ]
    return lines


def _warnings_section(s: Mapping[str, Any]) -> list[str]:
    """The warnings, if any."""
    lines: list[str] = []
    if s["warnings"]:
        lines += ["## Warnings", ""]
        lines += [f"- {w}" for w in s["warnings"]]
        lines.append("")
    return lines


def _exploratory_section(s: Mapping[str, Any]) -> list[str]:
    """The secondary metrics' comparisons: figures without verdicts."""
    lines: list[str] = []
    exploratory = [v for v in s["verdicts"] if v.startswith("exploratory")]
    if exploratory:
        lines += [
            "## Exploratory comparisons (secondary metrics)",
            "",
            "Unadjusted p-values and no verdict: these suggest where to look next, they show "
            "nothing.",
            "",
        ]
        lines += [f"- {v.removeprefix('exploratory: ')}" for v in exploratory]
        lines.append("")
    return lines


def _variants_section(s: Mapping[str, Any]) -> list[str]:
    """Each variant's options, run counts, env steps and throughput."""
    lines: list[str] = []
    at_steps = s.get("at_env_steps")
    budget = s["budget"]
    steps_column = "env steps reached" if at_steps is None else "evaluated at (env steps)"
    lines += [
        "## Variants",
        "",
        f"| variant | options | finished | failed | missing | {steps_column} | "
        "env steps/s | CPU s per run |",
        "|---|---|---|---|---|---|---|---|",
    ]
    step_key = "env_steps" if at_steps is None else "eval_env_steps"
    for name, v in s["variants"].items():
        opts = " ".join(v["args"]) or "(none)"
        mark = " (reference)" if name == s["reference"] else ""
        steps = [
            r[step_key] for r in s["runs"] if r["variant"] == name and r.get(step_key) is not None
        ]
        steps_text = "-" if not steps else f"{min(steps):.0f}–{max(steps):.0f}"
        work = v.get("work") or {}
        rate = (work.get("env_steps_per_s") or {}).get("mean")
        cpu = (work.get("cpu_s") or {}).get("mean")
        lines.append(
            f"| {name}{mark} | `{opts}` | {v['n_finished']} | {v['n_failed']} | "
            f"{v['n_missing'] + v.get('n_short', 0)} | {steps_text} | "
            f"{'-' if rate is None else f'{rate:.0f}'} | {'-' if cpu is None else f'{cpu:.0f}'} |"
        )
    if at_steps is not None:
        lines += [
            "",
            f"Every run is scored at the same sample count ({at_steps} env steps), whatever its "
            "budget let it reach: the comparison is per env step, not per unit of time.",
        ]
    elif budget["max_time"] is not None:
        lines += [
            "",
            "The budget is wall-clock time: runs that shared the CPU with others reached "
            "fewer env steps (see the last column), so the comparison is per time, not per step.",
        ]
    elif budget.get("max_cpu_time") is not None:
        lines += [
            "",
            "The budget is CPU time (each run's own, unaffected by other jobs on the cores): "
            "variants that compute more per step reached fewer env steps (see the last column), "
            "so the comparison is per unit of compute, not per step.",
        ]
    if s.get("common"):
        lines += ["", f"Options common to all variants: `{' '.join(s['common'])}`."]
    lines.append("")
    return lines


def _results_section(s: Mapping[str, Any]) -> list[str]:
    """One table per metric: IQM and mean with CIs, per seed, P(improvement)."""
    lines: list[str] = []
    conf = f"{100 * s['bootstrap']['confidence']:g}%"
    at_steps = s.get("at_env_steps")
    lines += ["## Results", ""]
    for metric, meta in s["metrics"].items():
        if meta["source"] != "eval":
            source = f"step-weighted mean of `{meta['key']}` over training (metrics.jsonl)"
        elif at_steps is None:
            source = f"`{meta['key']}` of eval.json"
        else:
            source = f"`eval/{meta['key']}` of the evaluation at {at_steps} env steps"
        lines += [f"### {meta['label']} ({source})", ""]
        compare = f"P(improvement over {s['reference']})"
        if meta.get("descriptive"):
            lines += ["Descriptive: no verdict (higher is not better by itself).", ""]
            compare = f"P(higher than {s['reference']})"
        lines += [
            f"| variant | n | IQM [{conf} CI] | mean [{conf} CI] | per seed | "
            f"{compare} | mean − {s['reference']} (relative) |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, v in s["variants"].items():
            m = v["metrics"][metric]
            per_seed = ", ".join(f"{x:.3g}" for x in m["values"]) or "-"
            if name == s["reference"]:
                poi_text = diff_text = "(reference)"
            else:
                poi = s["probability_of_improvement"][name][metric]
                poi_text = _fmt_ci(poi["value"], poi["ci"], 2)
                diff = poi["mean_difference"]
                diff_text = _fmt_ci(diff["value"], diff["ci"])
                if diff["relative"] is not None:
                    rel = f"{100 * diff['relative']:+.0f}%"
                    if diff.get("relative_ci") is not None:
                        low, high = diff["relative_ci"]
                        rel += f" [{100 * low:+.0f}%, {100 * high:+.0f}%]"
                    diff_text += f" ({rel})"
            lines.append(
                f"| {name} | {m['n']} | {_fmt_ci(m['iqm'], m['iqm_ci'])} | "
                f"{_fmt_ci(m['mean'], m['mean_ci'])} | {per_seed} | {poi_text} | {diff_text} |"
            )
        lines.append("")
    return lines


def _stability_section(s: Mapping[str, Any]) -> list[str]:
    """Entropy collapse, advantage clipping and advantage statistics."""
    lines: list[str] = []
    lines += [
        "## Stability",
        "",
        f"Entropy collapse: runs whose policy entropy fell below {s['entropy_threshold']:g} "
        "nats (median update of the collapse). Advantage clip active: fraction of updates with "
        "`adv_clip_frac` > 0. Positive fraction of advantages before (`adv_raw`) and after "
        "(`adv`) whitening, first quarter → last quarter of training; mean of the negative "
        "advantages after whitening over training.",
        "",
        "| variant | entropy collapse | final entropy | adv clip active | adv_raw pos frac | "
        "adv pos frac | adv neg mean |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, v in s["variants"].items():
        st = v["stability"]
        if st is None:
            lines.append(f"| {name} | n/a | n/a | n/a | n/a | n/a | n/a |")
            continue
        if st["runs_with_entropy"] == 0:
            collapse = "not logged"
        else:
            collapse = f"{st['collapsed_runs']}/{st['runs_with_entropy']} runs"
            if st["collapse_update_median"] is not None:
                collapse += f" (update {st['collapse_update_median']:g})"
        adv = st["advantage"]
        lines.append(
            f"| {name} | {collapse} | {_fmt(st['final_entropy_mean'])} | "
            f"{_fmt(st['adv_clip_active_frac'], 2)} | {_phase(adv['adv_raw']['pos_frac'])} | "
            f"{_phase(adv['adv']['pos_frac'])} | {_fmt(adv['adv']['neg_mean']['mean'], 2)} |"
        )
    lines.append("")
    return lines


def _failed_section(s: Mapping[str, Any]) -> list[str]:
    """The failed runs with the tails of their logs."""
    lines: list[str] = []
    failed = [r for r in s["runs"] if r["status"] == "failed"]
    if failed:
        lines += ["## Failed runs (excluded from the statistics)", ""]
        for r in failed:
            lines += [
                f"### {r['variant']}/seed_{r['seed']}",
                "",
                f"Log: `{r['log']}` (relative to this directory)",
                "",
                "```",
                (r.get("error") or "").rstrip(),
                "```",
                "",
            ]
    return lines


def _plots_section(s: Mapping[str, Any]) -> list[str]:
    """The plots."""
    lines: list[str] = []
    plots = s.get("plots") or []
    if plots:
        lines += ["## Plots", ""]
        for rel in plots:
            lines += [f"![{os.path.basename(rel)}]({rel})", ""]
    return lines


def _runs_section(s: Mapping[str, Any]) -> list[str]:
    """Every run's figures (collapsed)."""
    lines: list[str] = []
    lines += [
        "<details><summary>Every run</summary>",
        "",
        "| run | status | success | solved | return | env steps | wall s | attempts |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in s["runs"]:
        ev = r.get("eval") or {}

        def num(key: str, ev: Mapping[str, Any] = ev) -> str:
            value = ev.get(key)
            return f"{value:.3f}" if isinstance(value, int | float) else "-"

        steps = f"{r['env_steps']:.0f}" if r.get("env_steps") is not None else "-"
        wall = f"{r['wall_s']:.0f}" if r.get("wall_s") is not None else "-"
        lines.append(
            f"| {r['variant']}/seed_{r['seed']} | {r['status']} | {num('success_rate')} | "
            f"{num('solved_rate')} | {num('mean_return')} | {steps} | {wall} | "
            f"{r.get('attempts', 0)} |"
        )
    lines += ["", "</details>", ""]
    return lines


def _commands_section(s: Mapping[str, Any]) -> list[str]:
    """The compare command and every train command."""
    lines: list[str] = []
    lines += ["## Commands", "", "```", s["commands"]["compare"] or "(API call)", "```", ""]
    lines += ["<details><summary>Train command of every run</summary>", "", "```"]
    lines += [f"{key}: {cmd}" for key, cmd in s["commands"]["train"].items()]
    lines += ["```", "", "</details>", ""]
    return lines


def _environment_section(s: Mapping[str, Any]) -> list[str]:
    """Python, platform, packages and the runs' commits."""
    lines: list[str] = []
    env = s["environment"]
    lines += [
        "## Environment",
        "",
        f"- Python {env['python']} on {env['platform']} ({env['cpu_count']} CPUs)",
        f"- git commit: {env['git']['commit'] or 'unknown'}"
        + (" (uncommitted changes)" if env["git"]["dirty"] else ""),
        "- packages: " + ", ".join(f"{k} {v}" for k, v in env["packages"].items() if v is not None),
        "- commits of the runs (finished.json): "
        + (", ".join(f"`{c}`" for c in s.get("commits") or []) or "none recorded"),
    ]
    if s.get("wall_s") is not None:
        lines.append(f"- compare wall time (this invocation): {s['wall_s']:.0f} s")
    lines.append("")
    return lines


def write_report(summary: Mapping[str, Any], out: str) -> str:
    """Write ``out/report.md`` from a summary, section by section; returns its path."""
    sections = (
        _header_section,
        _warnings_section,
        _primary_section,
        _exploratory_section,
        _seed_claim_section,
        _variants_section,
        _results_section,
        _stability_section,
        _failed_section,
        _plots_section,
        _runs_section,
        _commands_section,
        _environment_section,
    )
    lines = [line for section in sections for line in section(summary)]
    path = os.path.join(out, "report.md")
    atomic_write_text(path, "\n".join(lines))
    return path


# ------------------------------------------------------------------------------------------
# plots
# ------------------------------------------------------------------------------------------
def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _colors(names: Sequence[str]) -> dict[str, Any]:
    plt = _plt()
    cmap = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")
    return {name: cmap(i % cmap.N) for i, name in enumerate(names)}


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", name)


def save_png(fig: Any, path: str, *, dpi: int) -> None:
    """Write ``fig`` to ``path`` as a PNG of at most 256 colours (optimised). A plot is flat
    colours, lines and their anti-aliasing, which a palette keeps to the eye at about a
    quarter of matplotlib's RGBA bytes (issue 51's results budget)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    buffer.seek(0)
    compact_png(buffer, path)


def compact_png(source: Any, dest: str) -> int:
    """Re-encode the PNG ``source`` (a path or a binary file) into ``dest`` with a palette of
    at most 256 colours; a PNG already in palette form is copied unchanged. Returns the bytes
    written."""
    from PIL import Image

    with Image.open(source) as image:
        image.load()
        if image.mode == "P":
            palette = image.copy()
        else:
            palette = image.convert("RGB").quantize(256, method=Image.Quantize.FASTOCTREE)
    buffer = io.BytesIO()
    palette.save(buffer, format="PNG", optimize=True)
    data = buffer.getvalue()
    tmp = f"{dest}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, dest)
    return len(data)


def summary_text(summary: Mapping[str, Any]) -> str:
    """``summary.json``'s text: compact JSON (no indentation; readers parse it, people read
    report.md), one trailing newline."""
    return json.dumps(_jsonable(summary), separators=(",", ":"), allow_nan=False) + "\n"


def make_plots(summary: Mapping[str, Any], out: str) -> list[str]:
    """Write the PNG plots under ``out/plots``; returns their paths relative to ``out``:
    learning curves, aggregate intervals, probability of improvement, and each variant's
    advantage distribution over training (a plot with nothing to show is left out)."""
    plt = _plt()
    plot_dir = os.path.join(out, "plots")
    os.makedirs(plot_dir, exist_ok=True)
    names = list(summary["variants"])
    colors = _colors(names)
    written: list[str] = []

    def save(filename: str, fig: Any, dpi: int = 110) -> None:
        if fig is None:
            return
        fig.tight_layout()
        path = os.path.join(plot_dir, filename)
        save_png(fig, path, dpi=dpi)
        plt.close(fig)
        written.append(os.path.relpath(path, out))

    save("learning_curves.png", _plot_learning_curves(plt, summary, names, colors))
    save("aggregate_intervals.png", _plot_intervals(plt, summary, names, colors))
    save("probability_of_improvement.png", _plot_improvement(plt, summary, names, colors))
    for name in names:
        save(f"advantages_{_safe(name)}.png", _plot_advantages(plt, summary, name), dpi=100)
    return written


def _plot_learning_curves(
    plt: Any, summary: Mapping[str, Any], names: list[str], colors: Mapping[str, Any]
) -> Any:
    """Each curve key's mean over seeds with its CI band, one panel per key (None: no
    variant logged a curve)."""
    keys = [k for k in CURVE_KEYS if any(k in v["curves"] for v in summary["variants"].values())]
    if not keys:
        return None
    ncols = min(3, len(keys))
    nrows = -(-len(keys) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(6 * ncols, 4 * nrows), squeeze=False)
    for ax in axes.flat[len(keys) :]:
        ax.set_visible(False)
    for ax, key in zip(axes.flat, keys, strict=False):
        for name in names:
            c = summary["variants"][name]["curves"].get(key)
            if c is None:
                continue
            x = np.asarray(c["env_steps"])
            ax.plot(x, c["mean"], color=colors[name], label=f"{name} (n={c['n']})")
            if c["mean_ci"] is not None:
                ax.fill_between(x, c["mean_ci"][0], c["mean_ci"][1], color=colors[name], alpha=0.2)
        ax.set_xlabel("env steps")
        ax.set_ylabel(key)
        ax.set_title(f"{key}: mean over seeds, {summary['bootstrap']['confidence']:.0%} CI")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return fig


def _plot_intervals(
    plt: Any, summary: Mapping[str, Any], names: list[str], colors: Mapping[str, Any]
) -> Any:
    """Aggregate interval estimates: one panel per metric x (IQM, mean), a bar per variant."""
    metrics = list(summary["metrics"])
    fig, axes = plt.subplots(
        len(metrics),
        2,
        figsize=(10, 0.5 + 0.45 * len(names) * len(metrics) + len(metrics)),
        squeeze=False,
    )
    for row, metric in enumerate(metrics):
        for col, stat_name in enumerate(("iqm", "mean")):
            ax = axes[row][col]
            for i, name in enumerate(names):
                m = summary["variants"][name]["metrics"][metric]
                if m[stat_name] is None:
                    ax.text(
                        0.02,
                        i,
                        "no finished runs",
                        va="center",
                        fontsize=8,
                        transform=ax.get_yaxis_transform(),
                    )
                    continue
                ci = m[f"{stat_name}_ci"]
                if ci is not None:
                    ax.barh(i, ci[1] - ci[0], left=ci[0], height=0.6, color=colors[name], alpha=0.6)
                ax.plot([m[stat_name]], [i], "k|", markersize=14)
            ax.set_yticks(range(len(names)))
            ax.set_yticklabels(names if col == 0 else [""] * len(names))
            ax.set_title(
                f"{stat_name.upper()} of {summary['metrics'][metric]['label']}", fontsize=9
            )
            ax.grid(axis="x", alpha=0.3)
    return fig


def _plot_improvement(
    plt: Any, summary: Mapping[str, Any], names: list[str], colors: Mapping[str, Any]
) -> Any:
    """P(variant > reference) with its CI, one panel per metric (None: no other variant)."""
    others = [n for n in names if n != summary["reference"]]
    if not others:
        return None
    metrics = list(summary["metrics"])
    fig, axes = plt.subplots(
        1,
        len(metrics),
        figsize=(3.2 * len(metrics), 0.8 + 0.45 * len(others)),
        squeeze=False,
    )
    for ax, metric in zip(axes[0], metrics, strict=True):
        for i, name in enumerate(others):
            poi = summary["probability_of_improvement"][name][metric]
            if poi["value"] is None:
                continue
            if poi["ci"] is not None:
                lo, hi = poi["ci"]
                ax.barh(i, hi - lo, left=lo, height=0.6, color=colors[name], alpha=0.6)
            ax.plot([poi["value"]], [i], "k|", markersize=14)
        ax.axvline(0.5, color="grey", linestyle="--", linewidth=1)
        ax.set_xlim(0, 1)
        ax.set_yticks(range(len(others)))
        ax.set_yticklabels(others if ax is axes[0][0] else [""] * len(others))
        ax.set_title(summary["metrics"][metric]["label"], fontsize=9)
    fig.suptitle(f"P(variant > {summary['reference']})", fontsize=10)
    return fig


def _plot_advantages(plt: Any, summary: Mapping[str, Any], name: str) -> Any:
    """Variant ``name``'s advantage distribution over training, per agent type, before and
    after whitening (None: it logged none)."""
    adv = summary["variants"][name]["advantages"]
    groups = [g for g in adv if any(adv[g][p]["mean"] for p in ("adv_raw", "adv"))]
    if not groups:
        return None
    fig, axes = plt.subplots(
        len(groups), 2, figsize=(11, 2.8 * len(groups)), squeeze=False, sharex=True
    )
    for row, group in enumerate(groups):
        for col, prefix in enumerate(("adv_raw", "adv")):
            ax = axes[row][col]
            curves = adv[group][prefix]
            mean, std = curves["mean"], curves["std"]
            if mean is None:
                ax.set_visible(False)
                continue
            x = np.asarray(mean["env_steps"])
            mu = np.asarray(mean["mean"])
            ax.plot(x, mu, color="C0", label="mean")
            if std is not None and len(std["mean"]) == len(mu):
                sd = np.asarray(std["mean"])
                ax.fill_between(x, mu - sd, mu + sd, color="C0", alpha=0.2, label="± std")
            for stat_name, color in (("pos_mean", "C2"), ("neg_mean", "C3")):
                c = curves[stat_name]
                if c is not None:
                    ax.plot(c["env_steps"], c["mean"], color=color, linestyle="--", label=stat_name)
            pos = curves["pos_frac"]
            if pos is not None:
                twin = ax.twinx()
                twin.plot(pos["env_steps"], pos["mean"], color="C1", linestyle=":")
                twin.set_ylim(0, 1)
                twin.set_ylabel("pos_frac (dotted)", color="C1", fontsize=8)
            when = "before whitening" if prefix == "adv_raw" else "after whitening"
            ax.set_title(f"{name}: {group}, {when}", fontsize=9)
            ax.grid(alpha=0.3)
            if row == len(groups) - 1:
                ax.set_xlabel("env steps")
            if row == 0 and col == 0:
                ax.legend(fontsize=7, loc="upper right")
    return fig


def _jsonable(obj: Any) -> Any:
    """Plain JSON values: numpy scalars/arrays converted, NaN and infinities as None."""
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | np.ndarray):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not np.isfinite(obj):
        return None
    return obj


#: runs.csv's first columns; one per endpoint metric of the summary follows.
RUNS_CSV_COLUMNS = ("variant", "seed", "status", "commit", "env_steps")


def write_runs_csv(summary: Mapping[str, Any], out: str) -> str:
    """Write ``out/runs.csv``, one row per run of ``summary["runs"]``: variant, seed, status,
    commit (``;`` between several), env steps, then each endpoint metric of
    ``summary["metrics"]`` for that run, taken from the summary's per-seed values (empty where
    the run has none: not finished, or no such figure). Returns its path."""
    metrics = list(summary["metrics"])
    per_seed: dict[tuple[str, Any, str], float] = {}
    for name, variant in summary["variants"].items():
        for metric in metrics:
            entry = variant["metrics"].get(metric) or {}
            seeds, values = entry.get("seeds") or [], entry.get("values") or []
            for seed, value in zip(seeds, values, strict=False):
                per_seed[(name, seed, metric)] = value
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow([*RUNS_CSV_COLUMNS, *metrics])
    for row in summary["runs"]:
        key = (row["variant"], row["seed"])
        writer.writerow(
            [row["variant"], row["seed"], row["status"], ";".join(row.get("commits") or []),
             row.get("env_steps"), *(per_seed.get((*key, m)) for m in metrics)]
        )  # fmt: skip
    path = os.path.join(out, "runs.csv")
    atomic_write_text(path, buffer.getvalue())
    return path


def write_all(summary: dict[str, Any], out: str, *, plots: bool = True) -> dict[str, Any]:
    """Write plots (unless ``plots=False``), ``summary.json``, ``report.md`` and ``runs.csv``
    (:func:`write_runs_csv`) into ``out``."""
    os.makedirs(out, exist_ok=True)
    summary["plots"] = make_plots(summary, out) if plots else []
    atomic_write_text(os.path.join(out, "summary.json"), summary_text(summary))
    write_report(summary, out)
    write_runs_csv(summary, out)
    return summary
