"""Is a diversity difference more than an entropy difference? (issue 36 item 5d)

    python benchmarks/diversity_websearch.py OUT --variant calibrated --baseline baseline \
        [--episodes 32] [--metric search_diversity] [--json FILE]

OUT is a ``marl.compare`` directory whose two arms (e.g. ``--recipe=calibrated`` and
``--recipe=baseline`` on websearch_v2) trained the same seeds. Every run is evaluated again on
its validation seeds, two episodes per seed, in three conditions:

* ``greedy``: greedy actions. Two episodes from one seed are then identical, so diversity
  across attempts is 0 for both arms by construction; within-episode query diversity
  (``query_jaccard_diversity``) is what remains to compare;
* ``sampled``: each arm's own distribution (temperature 1), as training evaluated it;
* ``matched``: the variant at temperature 1, each baseline run at the temperature that
  raises (or lowers) its policy entropy to the variant's mean entropy (bisection on
  ``log T``). A diversity difference that remains is not just entropy.

For each condition the script compares the variant with the baseline on the diversity metric
(paired by seed: a permutation test, Holm over the conditions' comparisons, and the bootstrap
CI of P(improvement); ``marl.experiments.significance.decide`` says "shown" or not), prints a
table and writes every figure as JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable

# the repository first: run as `python benchmarks/diversity_websearch.py`, this folder leads
# sys.path, and its seqmodels.py (a benchmark) would shadow the seqmodels package
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from marl.experiments import significance, stats  # noqa: E402
from marl.run.evaluate import evaluate_policy, load_run_policy  # noqa: E402

CONDITIONS = ("greedy", "sampled", "matched")


def matching_temperature(
    entropy_at: Callable[[float], float],
    target: float,
    *,
    low: float = 0.25,
    high: float = 8.0,
    tolerance: float = 0.01,
    steps: int = 12,
) -> float:
    """The temperature in [low, high] whose entropy ``entropy_at(T)`` is ``target`` (within
    ``tolerance`` nats), by bisection on log T (entropy grows with T); the nearer end when the
    target lies outside the range."""
    lo, hi = math.log(low), math.log(high)
    if entropy_at(math.exp(lo)) >= target:
        return math.exp(lo)
    if entropy_at(math.exp(hi)) <= target:
        return math.exp(hi)
    mid = 0.5 * (lo + hi)
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        value = entropy_at(math.exp(mid))
        if abs(value - target) <= tolerance:
            break
        lo, hi = (mid, hi) if value < target else (lo, mid)
    return math.exp(mid)


def evaluate_run(run_dir: str, episodes: int, **kwargs) -> dict:
    policy, cfg, _ = load_run_policy(run_dir)
    seeds = list(range(cfg.eval_seed, cfg.eval_seed + episodes))
    return evaluate_policy(policy, cfg.env_fn, cfg.env, seeds, repeats=2, **kwargs)


def seed_of(run_dir: str) -> int:
    return int(os.path.basename(os.path.normpath(run_dir)).removeprefix("seed_"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("out", help="a marl.compare output directory")
    p.add_argument("--variant", default="calibrated")
    p.add_argument("--baseline", default="baseline")
    p.add_argument("--episodes", type=int, default=32, help="validation seeds per run")
    p.add_argument("--metric", default="search_diversity", help="the diversity figure")
    p.add_argument("--json", default=None, help="where to write the figures (default: OUT)")
    args = p.parse_args(argv)
    arms = {}
    for arm in (args.variant, args.baseline):
        folder = os.path.join(args.out, "runs", arm)
        if not os.path.isdir(folder):
            print(f"error: {folder} does not exist (no runs of {arm!r})", file=sys.stderr)
            return 2
        arms[arm] = sorted(
            (os.path.join(folder, d) for d in os.listdir(folder)), key=lambda d: seed_of(d)
        )
    figures: dict = {c: {arm: {} for arm in arms} for c in CONDITIONS}
    for arm, runs in arms.items():
        for run in runs:
            k = seed_of(run)
            figures["greedy"][arm][k] = evaluate_run(run, args.episodes, deterministic=True)
            figures["sampled"][arm][k] = evaluate_run(run, args.episodes)
    target = sum(r["entropy"] for r in figures["sampled"][args.variant].values()) / len(
        figures["sampled"][args.variant]
    )
    figures["matched"][args.variant] = figures["sampled"][args.variant]
    for run in arms[args.baseline]:
        k = seed_of(run)
        t = matching_temperature(
            lambda temp, run=run: evaluate_run(run, args.episodes, temperature=temp)["entropy"],
            target,
        )
        figures["matched"][args.baseline][k] = evaluate_run(run, args.episodes, temperature=t)
    comparisons = []
    for condition in CONDITIONS:
        metric = "query_jaccard_diversity" if condition == "greedy" else args.metric
        x, y = figures[condition][args.variant], figures[condition][args.baseline]
        common = sorted(set(x) & set(y))
        xs = [x[k][metric] for k in common]
        ys = [y[k][metric] for k in common]
        poi = stats.probability_of_improvement(xs, ys, seed=len(comparisons))
        test = significance.permutation_test(xs, ys, paired=True)
        comparisons.append(
            {
                "condition": condition,
                "metric": metric,
                "n_pairs": len(common),
                "variant_mean": sum(xs) / len(xs),
                "baseline_mean": sum(ys) / len(ys),
                "difference": test["statistic"],
                "p_value": test["p_value"],
                "poi": poi["value"],
                "ci": poi["ci"],
                "entropy": {
                    args.variant: sum(x[k]["entropy"] for k in common) / len(common),
                    args.baseline: sum(y[k]["entropy"] for k in common) / len(common),
                },
            }
        )
    for entry, p_holm in zip(
        comparisons, significance.holm([c["p_value"] for c in comparisons]), strict=True
    ):
        entry["p_holm"] = p_holm
        entry.update(significance.decide(p_holm, entry["ci"], entry["difference"]))
    print("| condition | metric | variant | baseline | entropy (v / b) | p_holm | verdict |")
    print("|---|---|---|---|---|---|---|")
    for c in comparisons:
        verdict = f"**shown {c['direction']}**" if c["shown"] else "nothing shown"
        ent = c["entropy"]
        p_holm = "n/a" if c["p_holm"] is None else f"{c['p_holm']:.3g}"
        print(
            f"| {c['condition']} | {c['metric']} | {c['variant_mean']:.3f} | "
            f"{c['baseline_mean']:.3f} | {ent[args.variant]:.2f} / {ent[args.baseline]:.2f} | "
            f"{p_holm} | {verdict} |"
        )
    path = args.json or os.path.join(args.out, "diversity_websearch.json")
    with open(path, "w") as fh:
        json.dump({"target_entropy": target, "comparisons": comparisons, "runs": figures}, fh,
                  indent=1, default=float)  # fmt: skip
    print(f"figures: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
