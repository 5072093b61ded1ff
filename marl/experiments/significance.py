"""Hypothesis tests and multiple-comparison control for ``python -m marl.compare``.

A study makes several pre-registered *primary* comparisons (each variant against the
reference, plus any ``--comparison A:B`` pairs), all on one primary metric. For each:

* :func:`permutation_test`: a two-sided permutation test of the difference of means. When the
  design pairs runs (every variant runs the same seeds, so seed k of one arm and seed k of the
  other share their environment seeds), the test flips the signs of the per-seed differences;
  otherwise it permutes the arm labels. Exact (every arrangement) up to
  :data:`EXACT_LIMIT` arrangements, else :data:`RESAMPLES` random ones, with the
  ``(1 + hits) / (1 + resamples)`` estimate that keeps the test valid;
* :func:`holm`: the Holm-Bonferroni adjustment of the study's primary p-values (it controls
  the probability of any false "shown" in the study at ``alpha``, whatever the dependence
  between the comparisons);
* :func:`decide`: the rule. A comparison is *shown* only when its Holm-adjusted p-value is
  below ``alpha`` **and** the bootstrap CI of P(improvement) lies on the same side of 0.5 as
  the observed difference. Everything else is "nothing shown";
* :func:`identical_arms` and :func:`family_repeats`: arms whose per-seed results are identical
  on every seed are one configuration (two runs of the same training); a comparison between
  two of them is an A/A test, and one that repeats another comparison (the same two
  configurations) tests nothing new: both are left out of the Holm family.

:func:`min_attainable_p` and :func:`can_conclude` tell, before anything runs, whether a design
can ever reach "shown": with 3 paired seeds the smallest two-sided p-value is 2/8 = 0.25,
whatever the data. :func:`simulate_aa` estimates the rule's study-wise false-positive rate on
A/A studies (identical arms); docs/results/README.md lists the rates.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "ALPHA",
    "EXACT_LIMIT",
    "RESAMPLES",
    "permutation_test",
    "permutation_p_values",
    "min_attainable_p",
    "can_conclude",
    "holm",
    "decide",
    "identical_arms",
    "family_repeats",
    "simulate_aa",
]

#: Study-wise error rate of the rule ("shown" when the Holm-adjusted p-value is below it).
ALPHA = 0.05
#: Largest number of arrangements enumerated exactly (2**16: 16 paired seeds).
EXACT_LIMIT = 2**16
#: Random arrangements of a Monte-Carlo permutation test (more arrangements than EXACT_LIMIT).
RESAMPLES = 20_000
#: Relative tolerance under which a permuted statistic counts as equal to the observed one.
_TIE_RTOL = 1e-9


def _scores(values: Sequence[float] | np.ndarray, what: str) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{what}: scores must be finite, got {arr.tolist()}")
    return arr


def _arrangements(n_x: int, n_y: int, paired: bool) -> int:
    return 2**n_x if paired else math.comb(n_x + n_y, n_x)


@functools.lru_cache(maxsize=8)
def _all_signs(n: int) -> np.ndarray:
    """``[2**n, n]``: every sign pattern (+1/-1) of n paired differences."""
    codes = np.arange(2**n, dtype=np.int64)[:, None]
    bits = (codes >> np.arange(n, dtype=np.int64)[None, :]) & 1
    signs = 1.0 - 2.0 * bits
    signs.setflags(write=False)
    return signs


@functools.lru_cache(maxsize=8)
def _all_relabellings(n_x: int, n_y: int) -> np.ndarray:
    """``[C(n_x + n_y, n_x), n_x + n_y]`` weights, one row per relabelling: ``1/n_x`` on the
    runs labelled x, ``-1/n_y`` on the others (the row times the pooled scores is the
    difference of means of that relabelling)."""
    total = n_x + n_y
    picks = np.array(list(itertools.combinations(range(total), n_x)), dtype=np.int64)
    weights = np.full((picks.shape[0], total), -1.0 / n_y)
    np.put_along_axis(weights, picks, 1.0 / n_x, axis=1)
    weights.setflags(write=False)
    return weights


def _null_matrix(
    n_x: int, n_y: int, paired: bool, resamples: int, rng: np.random.Generator
) -> tuple[np.ndarray, bool]:
    """The arrangements of the test as a matrix (rows: arrangements) and whether it is exact.

    Paired: ``[R, n]`` signs applied to the differences (divided by n for their mean).
    Unpaired: ``[R, n_x + n_y]`` weights applied to the pooled scores."""
    if _arrangements(n_x, n_y, paired) <= EXACT_LIMIT:
        if paired:
            return _all_signs(n_x) / n_x, True
        return _all_relabellings(n_x, n_y), True
    if paired:
        return rng.choice(np.array([-1.0, 1.0]), size=(resamples, n_x)) / n_x, False
    picks = np.argsort(rng.random((resamples, n_x + n_y)), axis=1)[:, :n_x]
    weights = np.full((resamples, n_x + n_y), -1.0 / n_y)
    np.put_along_axis(weights, picks, 1.0 / n_x, axis=1)
    return weights, False


def permutation_p_values(
    x: np.ndarray, y: np.ndarray, *, paired: bool, resamples: int = RESAMPLES, seed: int = 0
) -> tuple[np.ndarray, bool, int]:
    """Two-sided permutation p-values of many comparisons of one design at once.

    ``x: [C, n_x]``, ``y: [C, n_y]`` (C comparisons; paired: ``n_x == n_y``, column i of both
    one pair). All C share one set of arrangements (each p-value is valid on its own). Returns
    ``(p [C], exact, arrangements)``.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    n_x, n_y = x.shape[1], y.shape[1]
    rng = np.random.default_rng(seed)
    null_matrix, exact = _null_matrix(n_x, n_y, paired, resamples, rng)
    if paired:
        data = x - y  # [C, n]
        observed = data.mean(axis=1)
    else:
        data = np.concatenate([x, y], axis=1)  # [C, n_x + n_y]
        observed = x.mean(axis=1) - y.mean(axis=1)
    null = null_matrix @ data.T  # [R, C]
    scale = np.maximum(np.abs(data).max(axis=1), 1e-300)
    hits = np.sum(np.abs(null) >= (np.abs(observed) - _TIE_RTOL * scale)[None, :], axis=0)
    count = null.shape[0]
    p = hits / count if exact else (1 + hits) / (1 + count)
    return p, exact, count


def permutation_test(
    x: Sequence[float] | np.ndarray,
    y: Sequence[float] | np.ndarray,
    *,
    paired: bool = False,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> dict[str, Any]:
    """Two-sided permutation test of ``mean(x) - mean(y)``.

    ``paired=True``: ``x[i]`` and ``y[i]`` are one pair (the same seed in both arms); the
    statistic is the mean of the differences and the null distribution flips their signs.
    ``paired=False``: the pooled runs are relabelled (``n_x`` as x, the rest as y).

    Returns ``{"p_value", "statistic", "paired", "n_x", "n_y", "exact", "resamples",
    "min_p"}``; ``p_value`` (and ``min_p``) is None when a side has fewer than two runs.
    ``resamples``: the arrangements used (all of them when ``exact``). The p-value counts
    arrangements whose statistic is at least as far from 0 as the observed one (ties within a
    relative 1e-9 count); a Monte-Carlo p-value is ``(1 + hits) / (1 + resamples)``.
    """
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    sx, sy = _scores(x, "permutation_test x"), _scores(y, "permutation_test y")
    if paired and sx.shape != sy.shape:
        raise ValueError(
            f"a paired test needs as many x as y scores (one pair per seed), got "
            f"{sx.size} and {sy.size}"
        )
    out: dict[str, Any] = {
        "p_value": None,
        "statistic": None,
        "paired": bool(paired),
        "n_x": int(sx.size),
        "n_y": int(sy.size),
        "exact": None,
        "resamples": None,
        "min_p": None,
    }
    if sx.size == 0 or sy.size == 0:
        return out
    out["statistic"] = float(sx.mean() - sy.mean())
    if sx.size < 2 or sy.size < 2:
        return out
    p, exact, count = permutation_p_values(
        sx[None, :], sy[None, :], paired=paired, resamples=resamples, seed=seed
    )
    out["exact"] = exact
    out["resamples"] = count
    out["p_value"] = float(p[0])
    out["min_p"] = min_attainable_p(sx.size, sy.size, paired=paired, resamples=resamples)
    return out


def min_attainable_p(n_x: int, n_y: int, *, paired: bool, resamples: int = RESAMPLES) -> float:
    """The smallest p-value :func:`permutation_test` can return for this design, whatever the
    scores: 2 / 2**n paired (an arrangement and its mirror image always tie), 2 / C(2n, n)
    unpaired with equal arms (1 / C(n_x + n_y, n_x) otherwise); a Monte-Carlo test adds the
    floor ``1 / (1 + resamples)``. 1.0 when a side has fewer than two runs."""
    if n_x < 2 or n_y < 2 or (paired and n_x != n_y):
        return 1.0
    count = _arrangements(n_x, n_y, paired)
    ties = 2 if (paired or n_x == n_y) else 1
    p = ties / count
    if count > EXACT_LIMIT:
        p = max(p, 1.0 / (1 + resamples))
    return float(p)


def can_conclude(
    n_seeds: int, comparisons: int, *, paired: bool = True, alpha: float = ALPHA
) -> bool:
    """Whether a study with ``n_seeds`` per arm and ``comparisons`` primary comparisons can
    show anything at all: Holm's first step needs the smallest p-value below
    ``alpha / comparisons``."""
    if comparisons < 1:
        raise ValueError(f"comparisons must be >= 1, got {comparisons}")
    return min_attainable_p(n_seeds, n_seeds, paired=paired) < alpha / comparisons


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm-Bonferroni adjusted p-values, in the order given (None stays None and does not
    count as a comparison).

    With the m p-values sorted ascending, ``p_holm[(i)] = max_{j <= i} min(1, (m - j + 1)
    p[(j)])``: rejecting where ``p_holm < alpha`` controls the family-wise error rate at alpha.
    """
    present = [(p, i) for i, p in enumerate(p_values) if p is not None]
    for p, _ in present:
        if not 0.0 <= p <= 1.0 or math.isnan(p):
            raise ValueError(f"p-values must lie in [0, 1], got {p}")
    m = len(present)
    out: list[float | None] = [None] * len(p_values)
    running = 0.0
    for rank, (p, i) in enumerate(sorted(present)):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


def decide(
    p_holm: float | None,
    poi_ci: Sequence[float] | None,
    difference: float | None,
    *,
    alpha: float = ALPHA,
) -> dict[str, Any]:
    """The rule: ``{"shown": bool, "direction": "better" | "worse" | None}``.

    Shown only when ``p_holm < alpha`` and the CI of P(improvement) lies wholly above 0.5
    ("better") or wholly below ("worse") on the side of the observed ``difference`` of means.
    """
    direction = None
    if poi_ci is not None and difference is not None:
        if poi_ci[0] > 0.5 and difference > 0:
            direction = "better"
        elif poi_ci[1] < 0.5 and difference < 0:
            direction = "worse"
    shown = p_holm is not None and p_holm < alpha and direction is not None
    return {"shown": bool(shown), "direction": direction if shown else None}


def _identical(
    a: Mapping[str, Mapping[int, float]],
    b: Mapping[str, Mapping[int, float]],
    primary: str,
    figures: Collection[str] | None,
) -> bool:
    """Whether two arms' per-seed figures (metric -> seed -> value) agree exactly on every
    seed both ran, for ``primary`` and each of ``figures`` (None: every metric) that both
    report, with at least one such seed on ``primary``."""
    if not set(a.get(primary, {})) & set(b.get(primary, {})):
        return False
    compared = set(a) & set(b) if figures is None else set(a) & set(b) & {primary, *figures}
    for metric in compared:
        x, y = a[metric], b[metric]
        if any(x[seed] != y[seed] for seed in set(x) & set(y)):
            return False
    return True


def identical_arms(
    per_seed: Mapping[str, Mapping[str, Mapping[int, float]]],
    primary: str,
    figures: Collection[str] | None = None,
) -> list[list[str]]:
    """The groups of arms whose results are identical on every seed: one configuration each.

    ``per_seed``: arm -> metric -> seed -> value. Two arms are identical when the primary
    metric and every one of ``figures`` (the evaluation figures; None: every metric) that both
    report are equal, exactly (identical training gives identical numbers), on every seed both
    ran, and they share a seed on ``primary``. Groups are the connected sets of identical
    arms, each of two or more, arms in ``per_seed``'s order."""
    names = list(per_seed)
    group = {name: i for i, name in enumerate(names)}
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if group[a] != group[b] and _identical(per_seed[a], per_seed[b], primary, figures):
                old, new = group[b], group[a]
                group = {n: new if g == old else g for n, g in group.items()}
    members: dict[int, list[str]] = {}
    for name in names:
        members.setdefault(group[name], []).append(name)
    return [m for m in members.values() if len(m) > 1]


def family_repeats(
    pairs: Sequence[tuple[str, str]], groups: Sequence[Sequence[str]]
) -> list[dict[str, Any] | None]:
    """Which primary comparisons ``(variant, baseline)`` leave the Holm family, given the
    groups of arms that are one configuration (:func:`identical_arms`).

    For each pair, in order: None (it stays), ``{"reason": "a/a", "repeats": None}`` when
    both arms are one configuration, or ``{"reason": "repeat", "repeats": j, "reversed":
    bool}`` when an earlier pair ``j`` that stays compares the same two configurations (the
    same order, or the opposite one: ``reversed``): its data are the same, so it adds a test
    of nothing new to the family."""
    config = {name: i for i, members in enumerate(groups) for name in members}

    def of(name: str) -> Any:
        return config.get(name, ("arm", name))

    kept: dict[tuple[Any, Any], int] = {}
    out: list[dict[str, Any] | None] = []
    for j, (variant, baseline) in enumerate(pairs):
        a, b = of(variant), of(baseline)
        if a == b:
            out.append({"reason": "a/a", "repeats": None})
        elif (a, b) in kept:
            out.append({"reason": "repeat", "repeats": kept[(a, b)], "reversed": False})
        elif (b, a) in kept:
            out.append({"reason": "repeat", "repeats": kept[(b, a)], "reversed": True})
        else:
            kept[(a, b)] = j
            out.append(None)
    return out


def _poi_ci(
    x: np.ndarray, y: np.ndarray, reps: int, confidence: float, seed: int
) -> list[float] | None:
    from marl.experiments.stats import probability_of_improvement

    return probability_of_improvement(x, y, reps=reps, seed=seed, confidence=confidence)["ci"]


def simulate_aa(
    n_seeds: int,
    comparisons: int = 24,
    studies: int = 400,
    *,
    sampler: str = "beta",
    paired: bool = True,
    alpha: float = ALPHA,
    reps: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict[str, Any]:
    """The rule's study-wise false-positive rate on simulated A/A studies.

    Each study draws ``comparisons`` independent pairs of arms from one distribution (the
    null is true everywhere), tests each with :func:`permutation_test` (``paired``), adjusts
    with :func:`holm` and applies :func:`decide` (the bootstrap CI is only needed where
    ``p_holm < alpha``). ``sampler``: ``"beta"`` (continuous success rates, Beta(5, 2)) or
    ``"binomial"`` (success over 32 episodes of a per-run rate drawn from Beta(5, 2): ties and
    a discrete scale, as real evaluations have).

    Returns ``{"n_seeds", "comparisons", "studies", "rate", "mc_se", "any_shown",
    "raw_any"}``: ``rate`` the fraction of studies with any "shown", ``mc_se`` its Monte-Carlo
    standard error, ``raw_any`` the fraction where any unadjusted p-value was below alpha.
    """
    if sampler not in ("beta", "binomial"):
        raise ValueError(f"sampler must be 'beta' or 'binomial', got {sampler!r}")
    rng = np.random.default_rng(seed)
    any_shown = 0
    raw_any = 0
    for study in range(studies):
        rates = rng.beta(5.0, 2.0, size=(comparisons, 2, n_seeds))
        if sampler == "binomial":
            rates = rng.binomial(32, rates) / 32.0
        p_arr, _, _ = permutation_p_values(
            rates[:, 0], rates[:, 1], paired=paired, seed=seed * 1_000_003 + study
        )
        p_values = [float(p) for p in p_arr]
        raw_any += any(p is not None and p < alpha for p in p_values)
        adjusted = holm(p_values)
        for c, p in enumerate(adjusted):
            if p is None or p >= alpha:
                continue
            x, y = rates[c, 0], rates[c, 1]
            ci = _poi_ci(x, y, reps, confidence, seed=study * 131 + c)
            if decide(p, ci, float(x.mean() - y.mean()), alpha=alpha)["shown"]:
                any_shown += 1
                break
    rate = any_shown / studies
    return {
        "n_seeds": n_seeds,
        "comparisons": comparisons,
        "studies": studies,
        "sampler": sampler,
        "paired": paired,
        "rate": rate,
        "mc_se": math.sqrt(max(rate * (1 - rate), 1e-12) / studies),
        "any_shown": any_shown,
        "raw_any": raw_any / studies,
    }


def describe_rule(alpha: float = ALPHA) -> str:
    """One sentence stating the decision rule (for reports)."""
    return (
        f"A comparison is 'shown' only when its permutation-test p-value, Holm-Bonferroni "
        f"adjusted over the study's primary comparisons, is below {alpha:g} and the 95% "
        "bootstrap CI of P(improvement) lies on the same side of 0.5 as the difference; "
        "secondary metrics are exploratory (unadjusted p-values, no verdict)."
    )


def summarize_family(entries: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Counts of a family's outcomes: ``{"comparisons", "shown", "better", "worse",
    "left_out"}``; the entries with a ``left_out`` reason (:func:`family_repeats`) are not in
    the family and count only in ``left_out``."""
    family = [e for e in entries if not e.get("left_out")]
    shown = [e for e in family if e.get("shown")]
    return {
        "comparisons": len(family),
        "shown": len(shown),
        "better": sum(e.get("direction") == "better" for e in shown),
        "worse": sum(e.get("direction") == "worse" for e in shown),
        "left_out": len(entries) - len(family),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m marl.experiments.significance``: the A/A table of docs/results/README.md."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m marl.experiments.significance",
        description="Study-wise false-positive rate of the decision rule on simulated A/A "
        "studies (identical arms), per number of seeds.",
    )
    parser.add_argument("--seeds", default="3,5,8,16,32", help="Seeds per arm, comma-separated.")
    parser.add_argument("--comparisons", type=int, default=24, help="Comparisons per study.")
    parser.add_argument("--studies", type=int, default=2000, help="Simulated studies per row.")
    parser.add_argument("--reps", type=int, default=1000, help="Bootstrap resamples of the CI.")
    args = parser.parse_args(argv)
    print(
        f"| seeds per arm | any 'shown' (rule), beta | binomial | any raw p < {ALPHA:g} "
        f"(no correction) | smallest attainable p |"
    )
    print("|---|---|---|---|---|")
    for n in (int(k) for k in args.seeds.split(",")):
        rows = [
            simulate_aa(n, args.comparisons, args.studies, sampler=s, reps=args.reps, seed=n)
            for s in ("beta", "binomial")
        ]
        cells = [f"{r['rate']:.3f} ± {r['mc_se']:.3f}" for r in rows]
        print(
            f"| {n} | {cells[0]} | {cells[1]} | {rows[0]['raw_any']:.3f} | "
            f"{min_attainable_p(n, n, paired=True):.2g} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
