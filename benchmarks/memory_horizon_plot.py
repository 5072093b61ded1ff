"""memory_horizon's answer across its parts (issue 48, item 3): success against H per backbone.

    python benchmarks/memory_horizon_plot.py [DIR]      # default docs/results/memory_horizon

Reads every finished part ``DIR/h<H>/summary.json`` (a ``marl.compare`` report) and writes

* ``DIR/success_vs_horizon.png``: final success rate (mean over seeds, 95% bootstrap interval
  of the mean, as in each part's report) against H, one line per backbone, chance marked;
* to stdout, a Markdown table: each backbone's success at each H with its interval, the
  pre-registered comparisons of the part (vs gru) with p_holm and verdict, and, exploratory,
  each backbone against mlp paired by seed (difference, its interval, permutation p; not in
  any Holm family): "at the mlp level" where that difference's interval includes 0.

Parts that have not finished are left out, and the table says which.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from envs import multisearch_recall_v1  # noqa: E402
from marl.experiments.significance import permutation_test  # noqa: E402
from marl.experiments.stats import mean_difference  # noqa: E402

BACKBONES = ("mlp", "gru", "mamba", "mamba2")
#: the task's chance level (the study keeps its default zones), from the env's own config
CHANCE = multisearch_recall_v1.make_config(memory_horizon=64).chance
METRIC = "success_rate"


def read_parts(root: str) -> dict[int, dict[str, Any]]:
    """``{H: summary}`` for every ``root/h<H>/summary.json``, by H."""
    parts: dict[int, dict[str, Any]] = {}
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        path = os.path.join(root, name, "summary.json")
        if name.startswith("h") and name[1:].isdigit() and os.path.isfile(path):
            with open(path) as f:
                parts[int(name[1:])] = json.load(f)
    return parts


def per_seed(summary: dict[str, Any], variant: str) -> dict[int, float]:
    """The variant's final success by seed."""
    metric = summary["variants"][variant]["metrics"][METRIC]
    return dict(zip(metric["seeds"], metric["values"], strict=True))


def against_mlp(summary: dict[str, Any], variant: str) -> dict[str, Any]:
    """Exploratory: ``variant - mlp`` paired by seed (the seeds both finished)."""
    x, y = per_seed(summary, variant), per_seed(summary, "mlp")
    seeds = sorted(set(x) & set(y))
    a, b = [x[s] for s in seeds], [y[s] for s in seeds]
    diff = mean_difference(a, b)
    return {
        "value": diff["value"],
        "ci": diff["ci"],
        "p": permutation_test(a, b, paired=True)["p_value"],
        "n": len(seeds),
    }


def table(parts: dict[int, dict[str, Any]]) -> str:
    """The Markdown answer table."""
    lines = [
        "| H | backbone | success [95% CI] | vs gru (pre-registered): difference, p_holm, "
        "verdict | vs mlp (exploratory): difference [95% CI], p |",
        "|---|---|---|---|---|",
    ]
    for horizon, summary in sorted(parts.items()):
        by_variant = {c["variant"]: c for c in summary["comparisons"] if c["metric"] == METRIC}
        for kind in BACKBONES:
            metric = summary["variants"][kind]["metrics"][METRIC]
            low, high = metric["mean_ci"]
            cell = f"{metric['mean']:.3f} [{low:.3f}, {high:.3f}]"
            pre = ""
            if kind in by_variant:
                c = by_variant[kind]
                diff = c["mean_difference"]["value"]
                verdict = "nothing shown"
                if c.get("shown"):  # the report's verdict: p_holm < 0.05
                    verdict = f"{kind} {'better' if diff > 0 else 'worse'} shown"
                pre = f"{diff:+.3f}, {c['p_holm']:.3g}, {verdict}"
            vs_mlp = ""
            if kind != "mlp":
                d = against_mlp(summary, kind)
                lo, hi = d["ci"]
                level = " (at the mlp level)" if lo <= 0.0 <= hi else ""
                vs_mlp = f"{d['value']:+.3f} [{lo:+.3f}, {hi:+.3f}], {d['p']:.3g}{level}"
            lines.append(f"| {horizon} | {kind} | {cell} | {pre} | {vs_mlp} |")
    return "\n".join(lines)


def plot(parts: dict[int, dict[str, Any]], path: str) -> None:
    """Success against H per backbone, with the intervals, chance dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from marl.experiments.report.plots import save_png

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    horizons = sorted(parts)
    for i, kind in enumerate(BACKBONES):
        means, lows, highs = [], [], []
        for horizon in horizons:
            metric = parts[horizon]["variants"][kind]["metrics"][METRIC]
            means.append(metric["mean"])
            lows.append(metric["mean"] - metric["mean_ci"][0])
            highs.append(metric["mean_ci"][1] - metric["mean"])
        shift = 1.0 + 0.03 * (i - 1.5)  # side by side on the log axis, so intervals show
        xs = [h * shift for h in horizons]
        ax.errorbar(xs, means, yerr=[lows, highs], marker="o", capsize=3, label=kind)
    ax.axhline(CHANCE, color="grey", linestyle="--", linewidth=1, label=f"chance ({CHANCE:.2f})")
    ax.set_xscale("log", base=2)
    ax.set_xticks(horizons, [str(h) for h in horizons])
    ax.set_xlabel("memory horizon H (steps between the cue and the answer)")
    ax.set_ylabel("final success rate (128 episodes)")
    ax.set_ylim(0.0, 1.05)
    ax.set_title("multisearch_recall_v1: success against memory horizon\n(mean over seeds, 95% CI)")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    save_png(fig, path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", nargs="?", default="docs/results/memory_horizon")
    args = parser.parse_args(argv)
    parts = read_parts(args.dir)
    if not parts:
        print(f"memory_horizon_plot: no finished part (h<H>/summary.json) under {args.dir}")
        return 1
    plot(parts, os.path.join(args.dir, "success_vs_horizon.png"))
    missing = [h for h in (64, 256, 1024, 4096) if h not in parts]
    print(table(parts))
    if missing:
        print(f"\nnot finished yet: H = {', '.join(map(str, missing))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
