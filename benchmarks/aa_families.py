"""What the published study families decide without their A/A comparisons (issue 51 item 4).

    python benchmarks/aa_families.py [SUMMARY.json ...]

Default: the GRPO whitening_scales studies (x10, x100), the calibration ladders (sparse,
websearch_v2) and whitening_sparse_grpo. For each study, from its summary.json only (nothing
is retrained): the arms whose per-seed results are identical on every seed (every evaluation
figure, :func:`marl.experiments.significance.identical_arms`: one configuration trained
twice), the
comparisons that are A/A or repeat another (:func:`~marl.experiments.significance.
family_repeats`), and each primary comparison's Holm-adjusted p-value over the published
family against the same over the family without them. The p-values themselves do not change.
Verdicts follow :func:`marl.experiments.significance.decide` with the published bootstrap CI of
P(improvement).

A study written before the protocol (no ``comparisons`` in summary.json: whitening_sparse_grpo)
gets its family as ``benchmarks/recheck_studies.py`` builds it: each variant against the
reference on success_rate, a permutation test paired by seed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from marl.experiments import significance

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = [
    "docs/results/whitening_scales/grpo_x10/summary.json",
    "docs/results/whitening_scales/grpo_x100/summary.json",
    "docs/results/calibration_ladder/sparse/summary.json",
    "docs/results/calibration_ladder/websearch_v2/summary.json",
    "docs/results/whitening_sparse_grpo/summary.json",
]


def per_seed(summary: dict[str, Any]) -> dict[str, dict[str, dict[int, float]]]:
    """variant -> metric -> seed -> value, from each metric's published values and seeds."""
    out: dict[str, dict[str, dict[int, float]]] = {}
    for name, variant in summary["variants"].items():
        out[name] = {}
        for metric, entry in variant["metrics"].items():
            seeds = entry.get("seeds") or []
            out[name][metric] = {
                int(k): float(x)
                for k, x in zip(seeds, entry["values"], strict=False)
                if k is not None
            }
    return out


def _recomputed_family(
    summary: dict[str, Any], values: dict[str, dict[str, dict[int, float]]], primary: str
) -> list[dict[str, Any]]:
    """Each variant vs the reference on ``primary`` (a study without published p-values)."""
    ref = summary["reference"]
    family = []
    for name in summary["variants"]:
        if name == ref:
            continue
        x, y = values[name][primary], values[ref][primary]
        common = sorted(set(x) & set(y))
        test = significance.permutation_test(
            [x[k] for k in common], [y[k] for k in common], paired=True
        )
        poi = summary["probability_of_improvement"][name][primary]
        family.append(
            {
                "variant": name,
                "baseline": ref,
                "p_value": test["p_value"],
                "ci": poi.get("ci"),
                "mean_difference": poi.get("mean_difference") or {},
                "p_holm": None,  # not published
            }
        )
    return family


def _verdict(shown: bool | None, direction: str | None) -> str:
    if shown is None:
        return "none"
    return f"shown {direction}" if shown else "nothing shown"


def families(path: str) -> dict[str, Any]:
    """The study's family with and without its A/A comparisons (rows for the table)."""
    with open(path) as fh:
        summary = json.load(fh)
    primary = summary.get("primary_metric") or "success_rate"
    values = per_seed(summary)
    evaluation = [m for m, d in summary["metrics"].items() if d["source"] in ("eval", "last")]
    groups = significance.identical_arms(values, primary, evaluation)
    published = bool(summary.get("comparisons"))
    family = summary["comparisons"] if published else _recomputed_family(summary, values, primary)
    pairs = [(e["variant"], e["baseline"]) for e in family]
    left_out = significance.family_repeats(pairs, groups)
    everything = significance.holm([e["p_value"] for e in family])
    kept = [i for i, why in enumerate(left_out) if why is None]
    without = dict(zip(kept, significance.holm([family[i]["p_value"] for i in kept]), strict=True))
    rows = []
    for i, (e, why) in enumerate(zip(family, left_out, strict=True)):
        diff = (e.get("mean_difference") or {}).get("value")
        before = significance.decide(everything[i], e.get("ci"), diff)
        if published:
            before = {"shown": e["shown"], "direction": e["direction"]}
        row = {
            "comparison": f"{e['variant']} vs {e['baseline']}",
            "p": e["p_value"],
            "p_holm_published": e["p_holm"],
            "p_holm_all": everything[i],
            "before": _verdict(before["shown"], before["direction"]),
        }
        if why is None:
            after = significance.decide(without[i], e.get("ci"), diff)
            row.update(
                p_holm_without=without[i], after=_verdict(after["shown"], after["direction"])
            )
        elif why["reason"] == "a/a":
            row.update(p_holm_without=None, after="left out: A/A (no verdict)")
        else:
            j = why["repeats"]  # an earlier row that stays: its verdict is this one's
            repeated = f"{pairs[j][0]} vs {pairs[j][1]}" + (" reversed" if why["reversed"] else "")
            after = f"left out: repeats {repeated} ({rows[j]['after']})"
            row.update(p_holm_without=without[j], after=after)
        rows.append(row)
    return {"title": summary.get("title"), "primary": primary, "groups": groups,
            "published": published, "rows": rows}  # fmt: skip


def _p(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("summaries", nargs="*", help="summary.json files (default: the five)")
    args = parser.parse_args(argv)
    paths = args.summaries or [os.path.join(REPO, p) for p in DEFAULT]
    for path in paths:
        if not os.path.isfile(path):
            print(f"aa_families.py: no such file: {path}", file=sys.stderr)
            return 2
        study = families(path)
        name = os.path.relpath(os.path.dirname(path), REPO)
        groups = "; ".join(" = ".join(g) for g in study["groups"]) or "none"
        print(f"\n### {name} ({study['title']}, primary `{study['primary']}`)\n")
        print(f"Identical on every seed (one configuration): {groups}.")
        if not study["published"]:
            print("No p-values published (pre-protocol study): p and p_holm (all) recomputed.")
        print()
        print("| comparison | p | p_holm published | p_holm without A/A | verdict | change |")
        print("|---|---|---|---|---|---|")
        for r in study["rows"]:
            published = r["p_holm_published"]
            shown_before = _p(published) if study["published"] else f"n/a ({_p(r['p_holm_all'])})"
            if study["published"] and published is not None:
                assert abs(published - r["p_holm_all"]) < 1e-12, (name, r)  # Holm as published
            change = "" if r["after"].startswith("left out") or r["after"] == r["before"] else (
                f"{r['before']} -> {r['after']}")  # fmt: skip
            verdict = r["after"] if r["after"].startswith("left out") else r["before"]
            print(
                f"| {r['comparison']} | {_p(r['p'])} | {shown_before} | "
                f"{_p(r['p_holm_without'])} | {verdict} | {change or 'none'} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
