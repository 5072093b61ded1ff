"""marl.experiments.significance: permutation tests, Holm, the decision rule, A/A studies.

References: brute-force loops over every arrangement (itertools), statsmodels' Holm, scipy's
permutation test, hand-worked designs.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from marl.experiments import significance as sg


def brute_paired(x: np.ndarray, y: np.ndarray) -> float:
    d = x - y
    obs = abs(d.mean())
    hits = 0
    for signs in itertools.product((1.0, -1.0), repeat=d.size):
        hits += abs(np.mean(np.array(signs) * d)) >= obs - 1e-12
    return hits / 2**d.size


def brute_unpaired(x: np.ndarray, y: np.ndarray) -> float:
    pooled = np.concatenate([x, y])
    obs = abs(x.mean() - y.mean())
    hits = total = 0
    for pick in itertools.combinations(range(pooled.size), x.size):
        mask = np.zeros(pooled.size, bool)
        mask[list(pick)] = True
        hits += abs(pooled[mask].mean() - pooled[~mask].mean()) >= obs - 1e-12
        total += 1
    return hits / total


@pytest.mark.parametrize("seed", range(4))
def test_exact_p_values_match_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    x, y = rng.random(7), rng.random(7) + 0.2 * seed
    paired = sg.permutation_test(x, y, paired=True)
    assert paired["exact"] and paired["resamples"] == 2**7
    assert paired["p_value"] == pytest.approx(brute_paired(x, y), abs=1e-12)
    x5, y6 = rng.random(5), rng.random(6) + 0.1 * seed
    unpaired = sg.permutation_test(x5, y6)
    assert unpaired["exact"] and unpaired["resamples"] == math.comb(11, 5)
    assert unpaired["p_value"] == pytest.approx(brute_unpaired(x5, y6), abs=1e-12)


def test_ties_and_discrete_scores() -> None:
    # success rates on a 1/32 grid with many ties: still the brute-force value
    x = np.array([28, 30, 30, 31, 32, 29]) / 32
    y = np.array([27, 30, 28, 31, 30, 29]) / 32
    assert sg.permutation_test(x, y, paired=True)["p_value"] == pytest.approx(brute_paired(x, y))
    assert sg.permutation_test(x, y)["p_value"] == pytest.approx(brute_unpaired(x, y))
    same = np.full(4, 0.5)
    assert sg.permutation_test(same, same, paired=True)["p_value"] == 1.0


def test_monte_carlo_p_value_close_to_scipy_exact() -> None:
    from scipy import stats as sps

    rng = np.random.default_rng(7)
    x, y = rng.normal(0.3, 1, 18), rng.normal(0, 1, 18)
    mc = sg.permutation_test(x, y, paired=True, resamples=20_000, seed=1)
    assert not mc["exact"] and mc["resamples"] == 20_000
    exact = sps.permutation_test(
        (x - y,),
        np.mean,
        permutation_type="samples",
        n_resamples=np.inf,
        alternative="two-sided",
    ).pvalue
    se = math.sqrt(exact * (1 - exact) / 20_000)
    assert abs(mc["p_value"] - exact) < 4 * se + 1e-4


def test_min_attainable_p_is_reached() -> None:
    # five paired seeds, every difference positive and distinct: only the observed pattern
    # and its mirror reach |mean|: p = 2/32, the design's floor
    x, y = np.array([1.0, 2, 3, 4, 5]), np.zeros(5)
    res = sg.permutation_test(x, y, paired=True)
    assert res["p_value"] == pytest.approx(2 / 32) == res["min_p"]
    assert sg.min_attainable_p(3, 3, paired=True) == pytest.approx(0.25)
    assert sg.min_attainable_p(3, 3, paired=False) == pytest.approx(2 / 20)
    assert sg.min_attainable_p(3, 4, paired=False) == pytest.approx(1 / 35)
    assert sg.min_attainable_p(1, 5, paired=False) == 1.0
    # unpaired, complete separation of equal arms: the two extreme labellings
    u = sg.permutation_test([5.0, 6, 7, 8], [1.0, 2, 3, 4])
    assert u["p_value"] == pytest.approx(2 / math.comb(8, 4))


def test_can_conclude() -> None:
    # Holm over 24 comparisons needs p < 0.05/24 = 0.00208: 2/2**n below it from n = 10
    assert not sg.can_conclude(9, 24) and sg.can_conclude(10, 24)
    assert not sg.can_conclude(3, 1)  # 2/8 = 0.25: three seeds can never show anything
    assert not sg.can_conclude(5, 1) and sg.can_conclude(6, 1)  # 2/32 > 0.05 > 2/64


def test_holm_matches_statsmodels() -> None:
    multipletests = pytest.importorskip("statsmodels.stats.multitest").multipletests
    rng = np.random.default_rng(3)
    for _ in range(20):
        p = rng.random(rng.integers(1, 30)) ** 3
        ours = sg.holm(list(p))
        ref = multipletests(p, method="holm")[1]
        assert ours == pytest.approx(list(ref), abs=1e-12)
    # hand-worked: sorted 0.005, 0.01, 0.03, 0.04 (m = 4) -> 0.02, 0.03, 0.06, 0.06
    assert sg.holm([0.01, 0.04, 0.03, None, 0.005]) == pytest.approx([0.03, 0.06, 0.06, None, 0.02])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        sg.holm([0.5, 1.5])


def test_decide_needs_both_p_holm_and_an_agreeing_ci() -> None:
    assert sg.decide(0.01, [0.7, 0.95], 0.1) == {"shown": True, "direction": "better"}
    assert sg.decide(0.01, [0.05, 0.3], -0.1) == {"shown": True, "direction": "worse"}
    assert not sg.decide(0.06, [0.7, 0.95], 0.1)["shown"]  # p_holm too large
    assert not sg.decide(0.01, [0.45, 0.95], 0.1)["shown"]  # the CI includes 0.5
    assert not sg.decide(0.01, [0.7, 0.95], -0.1)["shown"]  # the CI disagrees with the sign
    assert not sg.decide(None, None, None)["shown"]


# the two largest designs simulate for most of a minute: slow tier (tests/run.sh -m slow, CI)
@pytest.mark.parametrize(
    "n_seeds",
    [3, 5, 8, pytest.param(16, marks=pytest.mark.slow), pytest.param(32, marks=pytest.mark.slow)],
)
def test_aa_studies_stay_within_the_error_rate(n_seeds: int) -> None:
    studies = 300
    bound = sg.ALPHA + 3 * math.sqrt(sg.ALPHA * (1 - sg.ALPHA) / studies)
    for sampler in ("beta", "binomial"):
        res = sg.simulate_aa(n_seeds, 24, studies, sampler=sampler, reps=400, seed=n_seeds)
        assert res["rate"] <= bound, res
        if n_seeds >= 16:  # without the correction, 24 tests at 0.05 fire in most studies
            assert res["raw_any"] > 0.5


def test_the_rule_detects_a_real_effect() -> None:
    # the complement of the A/A check: a large true difference at 16 paired seeds is shown
    rng = np.random.default_rng(0)
    shown = 0
    for trial in range(20):
        x = rng.beta(8, 2, 16)
        y = rng.beta(3, 3, 16)
        p = sg.holm([sg.permutation_test(x, y, paired=True, seed=trial)["p_value"]] * 1)
        from marl.experiments.stats import probability_of_improvement

        ci = probability_of_improvement(x, y, reps=300, seed=trial)["ci"]
        shown += sg.decide(p[0], ci, float(x.mean() - y.mean()))["shown"]
    assert shown >= 18
