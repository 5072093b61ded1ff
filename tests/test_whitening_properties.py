"""Hypothesis property tests of grouped whitening (small example counts: fast in CI)."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from marl.core.whitening import whiten

SETTINGS = settings(
    max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)


@st.composite
def grouped_data(draw):
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
        torch.tensor(values, dtype=torch.float64),
        torch.tensor(groups, dtype=torch.int64),
        torch.tensor(mask, dtype=torch.bool),
    )


def _clearly_spread(v: np.ndarray) -> bool:
    """Variance well above float64 rounding of the values (the whitened std is then 1)."""
    return v.size > 1 and v.std() > 1e-6 * max(1.0, np.abs(v).max())


@SETTINGS
@given(grouped_data())
def test_masked_entries_are_zero_and_groups_are_standardised(data) -> None:
    x, group, mask = data
    out = whiten(x, mask=mask, group=group, eps=1e-12).numpy()
    xn, g, m = x.numpy(), group.numpy(), mask.numpy()
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
