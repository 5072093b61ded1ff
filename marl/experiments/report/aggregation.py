"""Per-variant aggregation: the finished runs loaded (as they stood at N env steps when asked),
their scores per metric with interval estimates, learning curves, stability and advantage
statistics, and the work they consumed."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from marl.experiments import stats
from marl.experiments.report.metrics import (
    _ALL_METRICS,
    ADV_STATS,
    CURVE_KEYS,
    CURVE_POINTS,
    _run_score,
)

if TYPE_CHECKING:
    from marl.experiments.spec import CompareSpec


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
