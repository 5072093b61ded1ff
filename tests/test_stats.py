"""marl.experiments.stats against hand-worked examples and an independent numpy bootstrap."""

from __future__ import annotations

import json

import numpy as np
import pytest

from marl.experiments import stats

# ------------------------------------------------------------------------------------------
# independent numpy reference of the stratified percentile bootstrap (one task)
# ------------------------------------------------------------------------------------------


def ref_iqm(values: np.ndarray) -> float:
    """25% trimmed mean by hand: sort, drop floor(n/4) from each end, average."""
    v = np.sort(np.asarray(values, dtype=np.float64))
    k = int(np.floor(0.25 * v.size))
    return float(v[k : v.size - k].mean())


def ref_poi(x: np.ndarray, y: np.ndarray) -> float:
    """P(X > Y) over all pairs, ties one half (sequential double loop)."""
    total = 0.0
    for a in x:
        for b in y:
            total += 1.0 if a > b else 0.5 if a == b else 0.0
    return total / (len(x) * len(y))


def ref_bootstrap(
    samples: list[np.ndarray], statistic, reps: int, seed: int, confidence: float = 0.95
) -> np.ndarray:
    """Resample each sample's runs with replacement (numpy's legacy global stream, one
    ``choice(n, (n, 1))`` per sample per replicate, the draw order rliable uses), apply the
    statistic, take the percentile interval. Returns [2, k] (low, high)."""
    np.random.seed(seed)
    results = []
    for _ in range(reps):
        resampled = []
        for s in samples:
            idx = np.random.choice(len(s), (len(s), 1), replace=True)
            resampled.append(s[idx[:, 0]])
        results.append(np.atleast_1d(statistic(*resampled)))
    results = np.asarray(results)
    alpha = (1 - confidence) / 2
    return np.percentile(results, [100 * alpha, 100 * (1 - alpha)], axis=0)


# ------------------------------------------------------------------------------------------
# point estimates
# ------------------------------------------------------------------------------------------


def test_iqm_hand_computed() -> None:
    # n=5: floor(5/4)=1 dropped per side -> mean(3, 5, 7) = 5
    assert stats.iqm([10.0, 1.0, 7.0, 3.0, 5.0]) == pytest.approx(5.0)
    # n=8: sorted -50, 1, 2, 3, 4, 5, 6, 100; 2 dropped per side -> mean(2, 3, 4, 5) = 3.5
    assert stats.iqm([1, 2, 3, 4, 5, 6, 100, -50]) == pytest.approx(3.5)
    # n=3: nothing dropped -> plain mean
    assert stats.iqm([0.0, 0.3, 0.9]) == pytest.approx(0.4)


def test_poi_hand_computed() -> None:
    # x = 0.5 beats 0.1, 0.2, 0.3 (3); 0.6 beats three and ties 0.6 (3.5); 0.7 beats all (4)
    res = stats.probability_of_improvement([0.5, 0.6, 0.7], [0.1, 0.6, 0.2, 0.3], reps=50, seed=0)
    assert res["value"] == pytest.approx(10.5 / 12)
    # symmetric case: (1 + 1.5 + 2) / 9 = 0.5
    res = stats.probability_of_improvement([1, 2, 3], [0, 2, 5], reps=50, seed=0)
    assert res["value"] == pytest.approx(0.5)


# ------------------------------------------------------------------------------------------
# seeded bootstrap against the numpy reference
# ------------------------------------------------------------------------------------------


def test_interval_estimates_match_numpy_reference() -> None:
    rng = np.random.default_rng(7)
    values = rng.beta(2, 5, size=7)
    out = stats.interval_estimates(values, reps=400, seed=11)
    assert out["n"] == 7
    assert out["iqm"] == pytest.approx(ref_iqm(values))
    assert out["mean"] == pytest.approx(values.mean())
    assert out["std"] == pytest.approx(np.std(values, ddof=1))
    ref = ref_bootstrap([values], lambda v: np.array([ref_iqm(v), v.mean()]), 400, 11)
    np.testing.assert_allclose(out["iqm_ci"], ref[:, 0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(out["mean_ci"], ref[:, 1], rtol=0, atol=1e-12)
    # a CI brackets its point estimate and is not degenerate for spread-out data
    assert out["mean_ci"][0] < out["mean"] < out["mean_ci"][1]


def test_poi_ci_matches_numpy_reference() -> None:
    x = np.array([0.42, 0.55, 0.31, 0.61, 0.47])
    y = np.array([0.40, 0.29, 0.35, 0.52])
    out = stats.probability_of_improvement(x, y, reps=300, seed=5)
    assert out["value"] == pytest.approx(ref_poi(x, y))
    ref = ref_bootstrap([x, y], ref_poi, 300, 5)
    np.testing.assert_allclose(out["ci"], ref[:, 0], rtol=0, atol=1e-12)
    assert out["ci"][0] <= out["value"] <= out["ci"][1]


def test_mean_difference_matches_numpy_reference() -> None:
    x = np.array([0.42, 0.55, 0.31, 0.61, 0.47])
    y = np.array([0.40, 0.29, 0.35, 0.52])
    out = stats.mean_difference(x, y, reps=300, seed=4)
    assert out["value"] == pytest.approx(x.mean() - y.mean())
    assert out["relative"] == pytest.approx(x.mean() / y.mean() - 1)
    ref = ref_bootstrap(
        [x, y], lambda a, b: np.array([a.mean() - b.mean(), a.mean() / b.mean() - 1]), 300, 4
    )
    np.testing.assert_allclose(out["ci"], ref[:, 0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(out["relative_ci"], ref[:, 1], rtol=0, atol=1e-12)
    assert out["relative_ci"][0] < out["relative"] < out["relative_ci"][1]
    assert stats.mean_difference([0.2], [0.0, 0.0], reps=10)["relative"] is None
    assert stats.mean_difference([0.2], [0.1, 0.3], reps=10)["ci"] is None


def test_curve_bands_match_numpy_reference() -> None:
    rng = np.random.default_rng(3)
    curves = rng.normal(size=(6, 4)).cumsum(axis=1)
    out = stats.curve_bands(curves, reps=200, seed=2)
    np.testing.assert_allclose(out["mean"], curves.mean(axis=0))
    np.testing.assert_allclose(out["iqm"], [ref_iqm(curves[:, j]) for j in range(4)])

    # pointwise bands: rliable's stratified bootstrap draws the runs independently at each
    # point (one index per run and point), so does this reference
    np.random.seed(2)
    results = []
    for _ in range(200):
        idx = np.random.choice(6, (6, 1, 4), replace=True)[:, 0, :]
        resampled = np.take_along_axis(curves, idx, axis=0)
        iqms = [ref_iqm(resampled[:, j]) for j in range(4)]
        results.append(np.concatenate([resampled.mean(axis=0), iqms]))
    ref = np.percentile(np.asarray(results), [2.5, 97.5], axis=0)
    np.testing.assert_allclose(out["mean_ci"], ref[:, :4], atol=1e-12)
    np.testing.assert_allclose(out["iqm_ci"], ref[:, 4:], atol=1e-12)


def test_bootstrap_reproducible_and_global_rng_restored() -> None:
    np.random.seed(123)
    expected_next = np.random.random_sample()
    np.random.seed(123)
    a = stats.interval_estimates([0.1, 0.4, 0.2, 0.8], reps=100, seed=9)
    assert np.random.random_sample() == expected_next  # caller's stream untouched
    b = stats.interval_estimates([0.1, 0.4, 0.2, 0.8], reps=100, seed=9)
    c = stats.interval_estimates([0.1, 0.4, 0.2, 0.8], reps=100, seed=10)
    assert a == b
    assert a["mean_ci"] != c["mean_ci"] or a["iqm_ci"] != c["iqm_ci"]


def test_fewer_than_two_runs_give_no_ci() -> None:
    one = stats.interval_estimates([0.3], reps=50)
    assert one["iqm"] == pytest.approx(0.3) and one["mean"] == pytest.approx(0.3)
    assert one["iqm_ci"] is None and one["mean_ci"] is None and one["std"] is None
    none = stats.interval_estimates([], reps=50)
    assert none["n"] == 0 and none["mean"] is None
    poi = stats.probability_of_improvement([0.5], [0.1, 0.2], reps=50)
    assert poi["value"] == pytest.approx(1.0) and poi["ci"] is None
    assert stats.probability_of_improvement([], [0.1], reps=50)["value"] is None
    band = stats.curve_bands(np.array([[0.0, 1.0]]), reps=50)
    assert band["mean"] == [0.0, 1.0] and band["mean_ci"] is None


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: stats.interval_estimates([0.1, float("nan")]), "finite"),
        (lambda: stats.interval_estimates([[0.1, 0.2]]), "1-D"),
        (lambda: stats.interval_estimates([0.1, 0.2], reps=0), "reps"),
        (lambda: stats.interval_estimates([0.1, 0.2], confidence=1.5), "confidence"),
        (lambda: stats.curve_bands(np.array([[0.0, np.nan]])), "finite"),
        (lambda: stats.normalized_auc(np.array([0.0, 1.0]), np.array([1.0])), "equal length"),
    ],
)
def test_bad_input_raises(call, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()


def test_seeded_global_rng_type_check() -> None:
    with pytest.raises(TypeError, match="seed must be an int"), stats.seeded_global_rng(1.5):  # type: ignore[arg-type]
        pass


# ------------------------------------------------------------------------------------------
# verdict sentences
# ------------------------------------------------------------------------------------------


def test_verdict_phrasing() -> None:
    beats = stats.verdict(
        "calibrated", "baseline", "final success", {"value": 0.83, "ci": [0.61, 0.97]}
    )
    assert beats == (
        "calibrated beats baseline on final success: P(improvement) = 0.83 [0.61, 0.97]."
    )
    unclear = stats.verdict("a", "b", "return", {"value": 0.7, "ci": [0.45, 0.9]})
    assert unclear.startswith("a does not clearly beat b on return") and "includes 0.5" in unclear
    worse = stats.verdict("a", "b", "return", {"value": 0.1, "ci": [0.0, 0.3]})
    assert worse.startswith("a is worse than b on return")
    few = {"value": 1.0, "ci": [1.0, 1.0], "n_x": 3, "n_y": 4}
    assert stats.verdict("a", "b", "return", few) == (
        "a beats b on return: P(improvement) = 1.00 [1.00, 1.00] (3 vs 4 runs: indicative only)."
    )
    no_ci = stats.verdict("a", "b", "return", {"value": 1.0, "ci": None})
    assert "no claim" in no_ci and "beats" not in no_ci


# ------------------------------------------------------------------------------------------
# per-run readers
# ------------------------------------------------------------------------------------------


def test_normalized_auc_hand_computed() -> None:
    # trapezoids: 10 * (0 + 1) / 2 + 20 * 1 = 25 over a range of 30
    assert stats.normalized_auc(np.array([0.0, 10.0, 30.0]), np.array([0.0, 1.0, 1.0])) == (
        pytest.approx(25 / 30)
    )
    assert stats.normalized_auc(np.array([5.0]), np.array([0.4])) == pytest.approx(0.4)
    assert stats.normalized_auc(np.array([]), np.array([])) is None


def test_learning_curve_skips_missing_and_nonfinite() -> None:
    rows = [
        {"env_steps": 20, "episode/success": 0.5},
        {"env_steps": 10, "episode/success": 0.25},
        {"env_steps": 30},  # no episode ended in this update
        {"env_steps": 40, "episode/success": float("nan")},
        {"env_steps": 50, "episode/success": None},
        {"env_steps": 60, "episode/success": 1.0},
    ]
    x, y = stats.learning_curve(rows, "episode/success")
    np.testing.assert_array_equal(x, [10, 20, 60])
    np.testing.assert_array_equal(y, [0.25, 0.5, 1.0])


def test_resample_curves_common_range() -> None:
    a = (np.array([0.0, 10.0, 20.0]), np.array([0.0, 1.0, 2.0]))
    b = (np.array([5.0, 15.0]), np.array([10.0, 20.0]))
    grid, values = stats.resample_curves([a, b], num_points=3)
    np.testing.assert_allclose(grid, [5.0, 10.0, 15.0])
    np.testing.assert_allclose(values, [[0.5, 1.0, 1.5], [10.0, 15.0, 20.0]])
    assert stats.resample_curves([(np.array([]), np.array([]))]) is None


def test_entropy_collapse_and_stability() -> None:
    rows = [
        {"update": 1, "env_steps": 100, "entropy": 1.2, "adv_clip_frac": 0.0},
        {"update": 2, "env_steps": 200, "entropy": 0.5, "adv_clip_frac": 0.1},
        {"update": 3, "env_steps": 300, "entropy": 0.05, "adv_clip_frac": 0.0},
        {"update": 4, "env_steps": 400, "entropy": 0.2, "adv_clip_frac": 0.3},
    ]
    for u, row in enumerate(rows):
        row["adv_raw/pos_frac"] = [0.1, 0.2, 0.3, 0.4][u]
        row["adv/pos_frac"] = 0.5
    col = stats.entropy_collapse(rows, 0.1)
    assert col["collapsed"] is True and col["update"] == 3 and col["env_steps"] == 300
    assert col["initial"] == 1.2 and col["final"] == 0.2 and col["min"] == 0.05
    assert stats.entropy_collapse(rows, 0.01)["collapsed"] is False
    assert stats.entropy_collapse([{"update": 1}], 0.1)["collapsed"] is None

    fig = stats.stability_figures(rows, entropy_threshold=0.1)
    assert fig["adv_clip_active_frac"] == pytest.approx(0.5)
    assert fig["adv_clip_frac_mean"] == pytest.approx(0.1)
    raw = fig["advantage"]["adv_raw"]["pos_frac"]
    assert raw == pytest.approx({"mean": 0.25, "first_quarter": 0.1, "last_quarter": 0.4})
    assert fig["advantage"]["adv"]["neg_mean"]["mean"] is None  # never logged

    other = stats.stability_figures(rows[:2], entropy_threshold=0.1)
    agg = stats.aggregate_stability([fig, other])
    assert agg["collapsed_runs"] == 1 and agg["runs_with_entropy"] == 2
    assert agg["collapse_update_median"] == 3
    assert agg["adv_clip_active_frac"] == pytest.approx((0.5 + 0.5) / 2)
    assert agg["final_entropy_mean"] == pytest.approx((0.2 + 0.5) / 2)


def test_load_run_tolerates_torn_metrics_line(tmp_path) -> None:
    (tmp_path / "metrics.jsonl").write_text(
        json.dumps({"update": 1, "env_steps": 8}) + "\n" + '{"update": 2, "env_st'
    )
    (tmp_path / "config.yaml").write_text("seed: 3\nalpha: 0.5\n")
    run = stats.load_run(tmp_path)
    assert not run.finished and run.records == [{"update": 1, "env_steps": 8}]
    assert run.bad_lines == 1 and run.config == {"seed": 3, "alpha": 0.5}
    (tmp_path / "eval.json").write_text("{not json")
    with pytest.raises(ValueError, match="eval.json"):
        stats.load_run(tmp_path)
    (tmp_path / "eval.json").write_text(json.dumps({"success_rate": 0.25}))
    assert stats.load_run(tmp_path).finished


def test_load_run_reads_gzipped_metrics_when_the_plain_file_is_absent(tmp_path) -> None:
    import gzip

    rows = [{"update": 1, "env_steps": 8}, {"update": 2, "env_steps": 16}]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    (tmp_path / "metrics.jsonl.gz").write_bytes(gzip.compress(text.encode()))
    assert stats.load_run(tmp_path).records == rows  # a run kept by persist_runs.sh
    (tmp_path / "metrics.jsonl").write_text(text + json.dumps({"update": 3}) + "\n")
    assert len(stats.load_run(tmp_path).records) == 3  # the live file wins
