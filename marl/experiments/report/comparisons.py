"""Comparisons and verdicts: P(improvement), the difference of means and the permutation test of
two variants on one metric; the Holm-adjusted family of primary comparisons with the ones left
out of it; the decision rule; and the plain sentences that state the verdicts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from marl.experiments import significance, stats
from marl.experiments.report.metrics import METRICS, _metric_label

if TYPE_CHECKING:
    from marl.experiments.spec import CompareSpec


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


def _fmt_ci(value: float | None, ci: Sequence[float] | None, digits: int = 3) -> str:
    if value is None:
        return "n/a"
    if ci is None:
        return f"{value:.{digits}f} (no CI)"
    return f"{value:.{digits}f} [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]"


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
