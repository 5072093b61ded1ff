"""Hypothesis property tests of grouped whitening, on the numba loops and on the torch
specification (small example counts: fast in CI)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from marl.core.whitening import RunningMoments, whiten

SETTINGS = settings(
    max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
BACKENDS = ("numba", "torch")


@contextmanager
def backend(name: str) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MARL_WHITEN_BACKEND", name)
        yield


def ref_whiten(x: np.ndarray, mask: np.ndarray, group: np.ndarray, eps: float) -> np.ndarray:
    """numpy float64 loop over groups (population std; one entry or zero spread gives 0)."""
    out = np.zeros(x.shape, np.float64)
    for k in np.unique(group[mask]):
        sel = mask & (group == k)
        v = x[sel].astype(np.float64)
        if v.size > 1 and v.std() > 0:
            out[sel] = (v - v.mean()) / (v.std() + eps)
    return out


@st.composite
def grouped_data(draw, dtype=torch.float64):
    n = draw(st.integers(1, 60))
    n_groups = draw(st.integers(1, 6))
    values = draw(
        st.lists(
            st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False, width=64),
            min_size=n,
            max_size=n,
        )
    )
    groups = draw(st.lists(st.integers(0, n_groups - 1), min_size=n, max_size=n))
    mask = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    return (
        torch.tensor(values, dtype=torch.float64).to(dtype),
        torch.tensor(groups, dtype=torch.int64),
        torch.tensor(mask, dtype=torch.bool),
    )


def _clearly_spread(v: np.ndarray) -> bool:
    """Variance well above float64 rounding of the values (the whitened std is then 1)."""
    return v.size > 1 and v.std() > 1e-6 * max(1.0, np.abs(v).max())


@SETTINGS
@given(grouped_data())
def test_matches_numpy_and_both_implementations_agree(data) -> None:
    x, group, mask = data
    xn, g, m = x.numpy(), group.numpy(), mask.numpy()
    outs = {}
    for name in BACKENDS:
        with backend(name):
            outs[name] = whiten(x, mask=mask, group=group, eps=1e-3).numpy()
    np.testing.assert_allclose(outs["numba"], outs["torch"], rtol=1e-10, atol=1e-10)
    spread = [k for k in np.unique(g[m]) if _clearly_spread(xn[m & (g == k)])]
    sel = m & np.isin(g, spread)
    expected = ref_whiten(xn, m, g, 1e-3)
    np.testing.assert_allclose(outs["torch"][sel], expected[sel], rtol=1e-7, atol=1e-9)


@SETTINGS
@given(grouped_data(dtype=torch.float32))
def test_float32_implementations_agree(data) -> None:
    x, group, mask = data
    outs = {}
    for name in BACKENDS:
        with backend(name):
            outs[name] = whiten(x, mask=mask, group=group)
    assert outs["numba"].dtype == torch.float32
    torch.testing.assert_close(outs["numba"], outs["torch"], rtol=1e-6, atol=1e-6)


@SETTINGS
@given(grouped_data())
def test_masked_entries_are_zero_and_groups_are_standardised(data) -> None:
    x, group, mask = data
    xn, g, m = x.numpy(), group.numpy(), mask.numpy()
    for name in BACKENDS:
        with backend(name):
            out = whiten(x, mask=mask, group=group, eps=1e-12).numpy()
        assert np.all(out[~m] == 0)
        assert np.all(np.isfinite(out))
        for k in np.unique(g[m]):
            sel = m & (g == k)
            if _clearly_spread(xn[sel]):
                assert abs(out[sel].mean()) < 1e-9
                assert abs(out[sel].std() - 1.0) < 1e-6
            elif xn[sel].std() == 0:
                assert np.all(out[sel] == 0)


@SETTINGS
@given(
    grouped_data(),
    st.lists(st.floats(0.01, 100.0), min_size=6, max_size=6),
    st.lists(st.floats(-1e3, 1e3), min_size=6, max_size=6),
)
def test_invariant_to_per_group_positive_affine_maps(data, scales, shifts) -> None:
    x, group, mask = data
    a = torch.tensor(scales, dtype=torch.float64)[group]
    b = torch.tensor(shifts, dtype=torch.float64)[group]
    base = whiten(x, mask=mask, group=group, eps=1e-12).numpy()
    moved = whiten(a * x + b, mask=mask, group=group, eps=1e-12).numpy()
    xn, g, m = x.numpy(), group.numpy(), mask.numpy()
    for k in np.unique(g[m]):
        sel = m & (g == k)
        if _clearly_spread(xn[sel]):
            np.testing.assert_allclose(moved[sel], base[sel], atol=1e-6)


@SETTINGS
@given(grouped_data(), st.randoms(use_true_random=False))
def test_permutation_equivariant(data, rnd) -> None:
    x, group, mask = data
    perm = list(range(x.numel()))
    rnd.shuffle(perm)
    p = torch.tensor(perm)
    out = whiten(x, mask=mask, group=group)
    out_perm = whiten(x[p], mask=mask[p], group=group[p])
    torch.testing.assert_close(out_perm, out[p], rtol=0, atol=1e-9)


@SETTINGS
@given(grouped_data(), st.integers(0, 3))
def test_relabelling_groups_changes_nothing(data, offset) -> None:
    x, group, mask = data
    relabelled = (group * 3 + offset) % 1000  # injective for ids < 6
    torch.testing.assert_close(
        whiten(x, mask=mask, group=relabelled), whiten(x, mask=mask, group=group)
    )


@SETTINGS
@given(grouped_data(), st.lists(st.integers(0, 60), min_size=1, max_size=4))
def test_running_exact_merge_equals_numpy_over_any_split(data, cuts) -> None:
    x, group, mask = data
    bounds = [0, *sorted(min(c, x.numel()) for c in cuts), x.numel()]
    rm = RunningMoments(num_groups=6)
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        rm.update(x[lo:hi], mask=mask[lo:hi], group=group[lo:hi])
    xn, g, m = x.numpy(), group.numpy(), mask.numpy()
    for k in range(6):
        v = xn[m & (g == k)]
        assert rm.count[k].item() == v.size
        if v.size:
            assert rm.mean[k].item() == pytest.approx(v.mean(), rel=1e-9, abs=1e-9)
            assert rm.var[k].item() == pytest.approx(v.var(), rel=1e-7, abs=1e-6)
