"""Re-decide published studies under the study protocol (issue 36), from their summary.json.

    python benchmarks/recheck_studies.py docs/results/*/summary.json \
        docs/results/memory_study/*/summary.json [--metric success_rate]

For every study: its comparisons of each variant with the reference on one primary metric
(default success_rate, the final evaluation), each with a permutation-test p-value (paired
by seed on the seeds both variants finished), Holm-adjusted over the study's comparisons, and
the verdict of the rule (``marl.experiments.significance.decide``: shown only when p_holm <
0.05 and the bootstrap CI of P(improvement), as published, agrees). It prints one markdown
table per study, with each difference of means and its bootstrap CI as published. The
per-seed values come from summary.json's ``metrics[...]["values"]`` and ``["seeds"]``;
nothing is retrained.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from marl.experiments import significance


def recheck(path: str, metric: str, reference: str | None = None) -> tuple[str, list[dict]]:
    with open(path) as fh:
        s = json.load(fh)
    ref = reference or s["reference"]
    variants = s["variants"]
    rows = []
    for name, v in variants.items():
        if name == ref or metric not in v["metrics"]:
            continue
        mine, theirs = v["metrics"][metric], variants[ref]["metrics"][metric]
        x = dict(zip(mine.get("seeds") or [], mine["values"], strict=False))
        y = dict(zip(theirs.get("seeds") or [], theirs["values"], strict=False))
        common = sorted(set(x) & set(y) - {None})
        if len(common) >= 2:
            test = significance.permutation_test(
                [x[k] for k in common], [y[k] for k in common], paired=True
            )
        else:
            test = significance.permutation_test(mine["values"], theirs["values"])
        poi = _poi(s, name, ref, metric, mine["values"], theirs["values"])
        rows.append(
            {
                "variant": name,
                "baseline": ref,
                "n": f"{len(mine['values'])} vs {len(theirs['values'])}",
                "paired": test["paired"],
                "p": test["p_value"],
                "poi": poi.get("value"),
                "ci": poi.get("ci"),
                "diff": (poi.get("mean_difference") or {}).get("value"),
                "diff_ci": (poi.get("mean_difference") or {}).get("ci"),
            }
        )
    for row, p_holm in zip(rows, significance.holm([r["p"] for r in rows]), strict=True):
        row["p_holm"] = p_holm
        row.update(significance.decide(p_holm, row["ci"], row["diff"]))
    return s.get("title") or path, rows


def _poi(s: dict, name: str, ref: str, metric: str, x: list, y: list) -> dict:
    """The published P(improvement) entry, or (another reference) one computed here."""
    if ref == s["reference"]:
        return s["probability_of_improvement"][name][metric]
    from marl.experiments import stats

    poi = stats.probability_of_improvement(x, y, reps=2000, seed=0)
    poi["mean_difference"] = stats.mean_difference(x, y, reps=2000, seed=0)
    return poi


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("summaries", nargs="+", help="summary.json files of marl.compare")
    parser.add_argument("--metric", default="success_rate", help="The primary metric.")
    parser.add_argument("--reference", help="Compare with this variant instead of the study's.")
    args = parser.parse_args(argv)
    for path in args.summaries:
        if not os.path.isfile(path):
            print(f"recheck_studies.py: no such file: {path}", file=sys.stderr)
            return 2
        title, rows = recheck(path, args.metric, args.reference)
        print(f"\n### {os.path.dirname(path)} ({title})\n")
        if not rows:
            print(f"(no comparison on {args.metric})")
            continue
        print("| variant | vs | runs | P(improvement) [CI] | diff [CI] | p | p_holm | verdict |")
        print("|---|---|---|---|---|---|---|---|")
        for r in rows:
            ci = "" if r["ci"] is None else f" [{r['ci'][0]:.2f}, {r['ci'][1]:.2f}]"
            poi = "n/a" if r["poi"] is None else f"{r['poi']:.2f}{ci}"
            diff = "n/a" if r["diff"] is None else f"{r['diff']:+.3f}"
            if r["diff"] is not None and r["diff_ci"] is not None:
                diff += f" [{r['diff_ci'][0]:+.3f}, {r['diff_ci'][1]:+.3f}]"
            p = "n/a" if r["p"] is None else f"{r['p']:.3g}"
            ph = "n/a" if r["p_holm"] is None else f"{r['p_holm']:.3g}"
            verdict = f"**shown {r['direction']}**" if r["shown"] else "nothing shown"
            print(
                f"| {r['variant']} | {r['baseline']} | {r['n']} | {poi} | {diff} | {p} | "
                f"{ph} | {verdict} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
