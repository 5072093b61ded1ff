"""summary.json: :func:`build_summary` assembles every figure of a comparison (the layout is in
:mod:`marl.experiments.report`'s docstring); :func:`jsonable` makes it JSON-ready."""

from __future__ import annotations

import datetime
import json
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from marl.experiments import significance, stats
from marl.experiments.report.aggregation import (
    _load_runs,
    _variant_entry,
    _variant_scores,
    _warn_run_counts,
)
from marl.experiments.report.comparisons import (
    _Compared,
    _decision_rule,
    _primary_family,
    _verdict_sentences,
)
from marl.experiments.report.metrics import (
    _ALL_METRICS,
    DESCRIPTIVE_METRICS,
    _metric_label,
    _primary_metric,
    _reported_metrics,
)
from marl.experiments.report.provenance import _check_commits, environment_info

if TYPE_CHECKING:
    from marl.experiments.spec import CompareSpec


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


#: Significant digits of the numbers summary.json only plots (each variant's ``curves`` and
#: ``advantages``): within 5e-5 relative of the computed values, a hundredth of a pixel on a
#: panel whose y axis ends near the largest value (about 450 pixels tall); 7 digits until
#: the studies of issues 47 and 48 needed the room (issue 51's budget: 0.8 MB fewer over
#: docs/results' summaries). A regenerated report whose value falls on the other
#: side of a rounding boundary moves by one unit of the last digit, 1e-4 of the value: within
#: the regeneration rule (1% of the panel's y range) while the panel's range is at least 1%
#: of its largest value. Every number a table, test or verdict reads stays as computed.
PLOTTED_DIGITS = 5

#: The sections of a variant's summary entry that are only plotted
PLOTTED_SECTIONS = ("curves", "advantages")


def _rounded(obj: Any) -> Any:
    if isinstance(obj, float) and math.isfinite(obj):
        return float(f"{obj:.{PLOTTED_DIGITS}g}")
    if isinstance(obj, Mapping):
        return {k: _rounded(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_rounded(v) for v in obj]
    return obj


def round_plotted(summary: Mapping[str, Any]) -> dict[str, Any]:
    """``summary`` (plain JSON values) with the numbers of :data:`PLOTTED_SECTIONS` at
    :data:`PLOTTED_DIGITS` significant digits; every other value, and the key order, as they
    are. Rounding twice gives the same summary."""
    out = dict(summary)
    variants = summary.get("variants")
    if isinstance(variants, Mapping):
        out["variants"] = {
            name: (
                {k: _rounded(v) if k in PLOTTED_SECTIONS else v for k, v in entry.items()}
                if isinstance(entry, Mapping)
                else entry
            )
            for name, entry in variants.items()
        }
    return out


def summary_text(summary: Mapping[str, Any], *, allow_nan: bool = False) -> str:
    """``summary`` (plain JSON values) as summary.json's text: indented by one space per
    level, keys in their order, and every list of plain values (numbers, strings, booleans,
    null) on one line. ``json.loads`` of it gives ``summary`` back, every float to the last
    digit; the lists on one line take about 30% fewer bytes than one value per line
    (issue 51's budget) and still diff by row."""

    def text(value: Any, depth: int) -> str:
        inner, outer = " " * (depth + 1), " " * depth
        if isinstance(value, Mapping) and value:
            items = (f"{inner}{json.dumps(str(k))}: {text(v, depth + 1)}" for k, v in value.items())
            return "{\n" + ",\n".join(items) + "\n" + outer + "}"
        if isinstance(value, list) and any(isinstance(v, Mapping | list) for v in value):
            items = (inner + text(v, depth + 1) for v in value)
            return "[\n" + ",\n".join(items) + "\n" + outer + "]"
        return json.dumps(value, separators=(",", ": "), allow_nan=allow_nan)

    return text(summary, 0) + "\n"


def jsonable(obj: Any) -> Any:
    """Plain JSON values: numpy scalars/arrays converted, NaN and infinities as None."""
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | np.ndarray):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not np.isfinite(obj):
        return None
    return obj
