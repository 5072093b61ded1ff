"""marl.core.whitening against numpy float64 references, on both implementations.

``backend`` runs a test on the numba loops and on the torch functions that are the
specification (``MARL_WHITEN_BACKEND``); every expected value comes from numpy (a loop over
groups, or a hand-worked example), never from the code under test.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import marl.whitening
from marl.core import whitening as W
from marl.core.kernels import whitening_numba
from marl.core.whitening import (
    GROUPING_SCHEMES,
    SCHEMES,
    AdvantageWhitener,
    GroupKeys,
    RunningMoments,
    advantage_stats,
    group_moments,
    is_whitened,
    mix_team_individual,
    symmetric_clip,
    whiten,
)


def ref_whiten(x, mask=None, group=None, eps=1e-8, center=True, scale=True) -> np.ndarray:
    """Independent reference: a Python loop over groups in numpy float64."""
    x = np.asarray(x, dtype=np.float64)
    mask = np.ones(x.shape, bool) if mask is None else np.broadcast_to(np.asarray(mask), x.shape)
    group = np.zeros(x.shape, np.int64) if group is None else np.asarray(group)
    group = np.broadcast_to(group, x.shape)
    out = np.zeros_like(x)
    for g in np.unique(group[mask]):
        sel = mask & (group == g)
        v = x[sel]
        mean, std = v.mean(), v.std()
        if v.size <= 1 or std == 0:
            continue
        num = v - mean if center else v
        out[sel] = num / (std + eps) if scale else num
    return out


@pytest.fixture(params=["numba", "torch"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("MARL_WHITEN_BACKEND", request.param)
    return request.param


def _np(t: torch.Tensor | None) -> np.ndarray | None:
    return None if t is None else t.double().numpy() if t.is_floating_point() else t.numpy()


# ----------------------------------------------------------------------------- whiten


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("use_mask", [False, True])
@pytest.mark.parametrize("n_groups", [0, 1, 3, 17])
def test_whiten_matches_numpy(backend, dtype, use_mask, n_groups) -> None:
    gen = torch.Generator().manual_seed(n_groups + 7 * use_mask)
    x = (torch.randn(6, 50, generator=gen, dtype=torch.float64) * 3 + 20).to(dtype)
    mask = torch.rand(6, 50, generator=gen) > 0.3 if use_mask else None
    group = torch.randint(0, n_groups, (6, 50), generator=gen) if n_groups else None
    for center, scale in [(True, True), (False, True), (True, False), (False, False)]:
        out = whiten(x, mask=mask, group=group, center=center, scale=scale)
        assert out.dtype == dtype and out.shape == x.shape
        expected = ref_whiten(_np(x), _np(mask), _np(group), center=center, scale=scale)
        tol = 1e-5 if dtype == torch.float32 else 1e-12
        np.testing.assert_allclose(out.double().numpy(), expected, rtol=0, atol=tol)


def test_masked_entries_are_zero_and_never_read(backend) -> None:
    x = torch.tensor([1.0, float("nan"), 3.0, float("inf"), 5.0])
    mask = torch.tensor([True, False, True, False, True])
    group = torch.tensor([0, -1, 0, -7, 0])  # garbage ids at masked entries are ignored
    out = whiten(x, mask=mask, group=group)
    expected = ref_whiten([1.0, 0.0, 3.0, 0.0, 5.0], mask.numpy())
    np.testing.assert_allclose(out.numpy(), expected, atol=1e-6)
    assert out[1] == 0 and out[3] == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_constant_group_gives_exact_zero(backend, dtype) -> None:
    x = torch.full((1001,), 1000.1, dtype=dtype)
    x[:500] = torch.linspace(-3, 7, 500, dtype=dtype)
    group = torch.zeros(1001, dtype=torch.int64)
    group[500:] = 1
    for center, scale in [(True, True), (False, True), (True, False)]:
        out = whiten(x, group=group, center=center, scale=scale)
        assert torch.all(out[500:] == 0), out[500:].abs().max()
        assert torch.isfinite(out).all()
    np.testing.assert_allclose(out[:500].double().numpy(), ref_whiten(x[:500], scale=False))
    # the naive E[x^2] - E[x]^2 float32 formula leaves a residual on this group
    c = torch.full((1001,), 1000.1, dtype=torch.float32)
    assert (c * c).mean() - c.mean() ** 2 != 0


def test_single_entry_and_empty_groups_give_zero(backend) -> None:
    x = torch.tensor([5.0, 1.0, 2.0, 3.0, 9.0])
    group = torch.tensor([0, 3, 3, 3, 7])  # groups 1, 2, 4..6 empty; 0 and 7 single
    out = whiten(x, group=group)
    assert out[0] == 0 and out[4] == 0
    np.testing.assert_allclose(out[1:4].numpy(), ref_whiten([1.0, 2.0, 3.0]), atol=1e-6)


@pytest.fixture(scope="module")
def big_far_from_zero() -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """10**7 float32 entries with mean 1e4, 8 groups, and the float64 reference output."""
    n = 10_000_000
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(n, generator=gen) * 0.5 + 1.0e4).float()
    group = torch.randint(0, 8, (n,), generator=gen)
    xd, g = x.double().numpy(), group.numpy()
    cnt = np.bincount(g, minlength=8)
    mean = np.bincount(g, weights=xd, minlength=8) / cnt
    d = xd - mean[g]
    std = np.sqrt(np.bincount(g, weights=d * d, minlength=8) / cnt)
    return x, group, d / (std[g] + 1e-8)


def test_float32_accuracy_1e7_entries_far_from_zero(backend, big_far_from_zero) -> None:
    x, group, expected = big_far_from_zero
    out = whiten(x, group=group)
    assert np.abs(out.double().numpy() - expected).max() < 1e-4
    naive_var = (x * x).mean() - x.mean() ** 2  # float32 E[x^2] - E[x]^2: far off (true 0.25)
    assert abs(float(naive_var) - 0.25) > 1e-2


def test_empty_scalar_and_all_masked_inputs(backend) -> None:
    assert whiten(torch.zeros(0)).shape == (0,)
    assert whiten(torch.zeros(0, 3), group=torch.zeros(0, 3, dtype=torch.int64)).shape == (0, 3)
    assert whiten(torch.tensor(3.0)).item() == 0.0
    out = whiten(torch.randn(4), mask=torch.zeros(4, dtype=torch.bool), group=torch.full((4,), -1))
    assert torch.equal(out, torch.zeros(4))


def test_broadcast_group_and_mask(backend) -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(8, 5, generator=gen)
    group = torch.tensor([0, 0, 1, 1, 2])  # per column, broadcast over rows
    mask = (torch.arange(8) < 6).unsqueeze(1)  # [8, 1]
    out = whiten(x, mask=mask, group=group)
    np.testing.assert_allclose(out.numpy(), ref_whiten(x, mask, group), atol=1e-5)


def test_sparse_large_ids_are_compacted(backend) -> None:
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(300, generator=gen, dtype=torch.float64)
    dense = torch.randint(0, 5, (300,), generator=gen)
    sparse = torch.tensor([0, 10**12, 7, 2**40, 3 * 10**15])[dense]
    mask = torch.rand(300, generator=gen) > 0.2
    expected = ref_whiten(x, mask, sparse)
    np.testing.assert_allclose(whiten(x, mask=mask, group=sparse).numpy(), expected, atol=1e-12)


def test_low_precision_input_keeps_dtype(backend) -> None:
    x = torch.randn(64, dtype=torch.float64).to(torch.bfloat16)
    out = whiten(x)
    assert out.dtype == torch.bfloat16
    np.testing.assert_allclose(out.double().numpy(), ref_whiten(_np(x)), atol=2e-2)


def test_output_is_detached_and_input_untouched() -> None:
    x = torch.randn(10, requires_grad=True)
    before = x.detach().clone()
    out = whiten(x)
    assert not out.requires_grad
    assert torch.equal(x.detach(), before)


def test_more_groups_than_unrolled_tables(backend) -> None:
    # ids up to ~70000 > UNROLL_MAX_GROUPS: the numba loops' single-table branch
    gen = torch.Generator().manual_seed(12)
    x = torch.randn(3000, generator=gen, dtype=torch.float64)
    group = torch.randint(0, 40, (3000,), generator=gen) * 1750
    assert int(group.max()) + 1 > whitening_numba.UNROLL_MAX_GROUPS
    mask = torch.rand(3000, generator=gen) > 0.2
    out = whiten(x, mask=mask, group=group)
    np.testing.assert_allclose(out.numpy(), ref_whiten(x, mask, group), atol=1e-12)


def test_group_moments_reports_population_stats(backend) -> None:
    x = torch.tensor([1.0, 2.0, 3.0, 10.0, 20.0, 99.0])
    group = torch.tensor([0, 0, 0, 2, 2, 1])
    mask = torch.tensor([True, True, True, True, True, False])
    m = group_moments(x, mask=mask, group=group)
    np.testing.assert_allclose(m.count.numpy(), [3, 0, 2])
    np.testing.assert_allclose(m.mean.numpy(), [2.0, 0.0, 15.0])
    np.testing.assert_allclose(m.var.numpy(), [2 / 3, 0.0, 25.0])
    np.testing.assert_allclose(m.m2.numpy(), [2.0, 0.0, 50.0])
    assert group_moments(x, mask=mask, group=group, num_groups=5).count.shape == (5,)
    with pytest.raises(ValueError, match="num_groups=2"):
        group_moments(x, group=group, num_groups=2)


# ------------------------------------------------- numba loops == torch specification


def test_numba_passes_equal_the_torch_specification() -> None:
    gen = torch.Generator().manual_seed(13)
    for dtype in (torch.float32, torch.float64):
        for num_groups in (1, 7, 300):
            n = 4099  # not a multiple of the loops' four tables
            x = (torch.randn(n, generator=gen, dtype=torch.float64) * 5 + 300).to(dtype)
            ids = torch.randint(0, num_groups, (n,), generator=gen)
            mask = torch.rand(n, generator=gen) > 0.25
            for ids_, mask_ in ((ids, mask), (ids, None), (None, mask), (None, None)):
                g = num_groups if ids_ is not None else 1
                safe = None if ids_ is None or mask_ is None else torch.where(mask_, ids_, 0)
                spec = ids_ if safe is None else safe
                x64 = x.double()
                c_t, s_t = W._count_and_sum(x64, spec, mask_, g)
                c_n, s_n = whitening_numba.count_and_sum(x, ids_, mask_, g)
                torch.testing.assert_close(c_n, c_t, rtol=0, atol=0)
                torch.testing.assert_close(s_n, s_t, rtol=1e-13, atol=1e-9)
                mean = s_t / c_t.clamp_min(1)
                d_t, q_t = W._centred_sums(x64, spec, mask_, mean)
                d_n, q_n = whitening_numba.centred_sums(x, ids_, mask_, mean)
                torch.testing.assert_close(d_n, d_t, rtol=1e-9, atol=1e-9)
                torch.testing.assert_close(q_n, q_t, rtol=1e-12, atol=1e-9)
                shift = torch.randn(g, dtype=torch.float64, generator=gen)
                scale = torch.rand(g, dtype=torch.float64, generator=gen)
                out_t = W._apply(x64, spec, mask_, shift, scale).to(dtype)
                out_n = whitening_numba.apply(x, ids_, mask_, shift, scale)
                assert out_n.dtype == dtype
                torch.testing.assert_close(out_n, out_t, rtol=0, atol=0)


def test_whiten_is_the_same_on_both_implementations(monkeypatch) -> None:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(5000, generator=gen, dtype=torch.float64) + 1e3
    group = torch.randint(0, 40, (5000,), generator=gen)
    mask = torch.rand(5000, generator=gen) > 0.1
    out = {}
    for backend in ("numba", "torch"):
        monkeypatch.setenv("MARL_WHITEN_BACKEND", backend)
        out[backend] = whiten(x, mask=mask, group=group)
    torch.testing.assert_close(out["numba"], out["torch"], rtol=0, atol=1e-11)
    np.testing.assert_allclose(out["torch"].numpy(), ref_whiten(x, mask, group), atol=1e-11)


def test_backend_setting(monkeypatch) -> None:
    x = torch.randn(40)
    monkeypatch.delenv("MARL_WHITEN_BACKEND", raising=False)
    assert W._select_passes(x) is W._NUMBA_PASSES  # CPU default
    monkeypatch.setenv("MARL_WHITEN_BACKEND", "Torch")
    assert W._select_passes(x) is W._TORCH_PASSES
    np.testing.assert_allclose(whiten(x).numpy(), ref_whiten(x), atol=1e-5)
    monkeypatch.setenv("MARL_WHITEN_BACKEND", "fast")
    with pytest.raises(ValueError, match="MARL_WHITEN_BACKEND"):
        whiten(x)


# ------------------------------------------------------------------------- bad input


def test_nan_or_inf_among_valid_entries_raises(backend) -> None:
    for bad in (float("nan"), float("inf"), -float("inf")):
        x = torch.tensor([1.0, 2.0, bad, 4.0])
        with pytest.raises(ValueError, match=r"NaN or inf.*groups \[1\]"):
            whiten(x, group=torch.tensor([0, 0, 1, 1]))
        with pytest.raises(ValueError, match="NaN or inf"):
            whiten(x)
    with pytest.raises(ValueError, match="too large to whiten"):  # finite: their squares overflow
        whiten(torch.tensor([1e200, -1e200], dtype=torch.float64))


def test_bad_inputs_are_clear_errors() -> None:
    x = torch.randn(4, 3)
    with pytest.raises(ValueError, match=r"\(4, 2\).*\(4, 3\)"):
        whiten(x, mask=torch.ones(4, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"\(5,\).*\(4, 3\)"):
        whiten(x, group=torch.zeros(5, dtype=torch.int64))
    with pytest.raises(TypeError, match="integer"):
        whiten(x, group=torch.zeros(4, 3))
    with pytest.raises(TypeError, match="integer"):
        whiten(x, group=torch.zeros(4, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="non-negative"):
        whiten(x, group=torch.tensor([0, -1, 2]))
    with pytest.raises(ValueError, match="eps"):
        whiten(x, eps=0.0)
    with pytest.raises(ValueError, match="eps"):
        whiten(x, eps=-1e-8)
    with pytest.raises(TypeError, match="eps"):
        whiten(x, eps="small")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="floating"):
        whiten(torch.arange(4))
    with pytest.raises(ValueError, match="only 0 and 1"):
        whiten(x, mask=torch.full((4, 3), 0.5))
    with pytest.raises(TypeError, match="Tensor"):
        whiten(np.zeros(3))  # type: ignore[arg-type]


def test_integer_and_float_01_masks_are_accepted() -> None:
    x = torch.randn(6)
    m = torch.tensor([1, 0, 1, 1, 0, 1])
    expected = ref_whiten(x, m.numpy().astype(bool))
    np.testing.assert_allclose(whiten(x, mask=m).numpy(), expected, atol=1e-6)
    np.testing.assert_allclose(whiten(x, mask=m.float()).numpy(), expected, atol=1e-6)
    with pytest.raises(ValueError, match="0 and 1"):
        whiten(x, mask=torch.tensor([2, 0, 1, 1, 0, 1]))


# ------------------------------------------------------------- double-whitening guard


def test_guard_refuses_whitening_twice_with_escape_hatches() -> None:
    x = torch.randn(20)
    out = whiten(x)
    assert is_whitened(out) and not is_whitened(x)
    with pytest.raises(ValueError, match="already the output of whitening"):
        whiten(out)
    with pytest.raises(ValueError, match="already"):
        mix_team_individual(out, x, 0.5)
    with pytest.raises(ValueError, match="already"):
        AdvantageWhitener("batch")(out)
    rm = RunningMoments()
    rm.update(x)
    with pytest.raises(ValueError, match="already"):
        rm.whiten(out)
    np.testing.assert_allclose(whiten(out, allow_rewhiten=True).numpy(), ref_whiten(out), atol=1e-5)
    whiten(out.clone())  # a new tensor carries no tag


# --------------------------------------------------------------------- team/individual


def test_mix_team_individual_matches_reference() -> None:
    gen = torch.Generator().manual_seed(4)
    team, ind = torch.randn(30, generator=gen) * 4 + 2, torch.randn(30, generator=gen) - 1
    group = torch.randint(0, 3, (30,), generator=gen)
    mask = torch.rand(30, generator=gen) > 0.2
    out = mix_team_individual(team, ind, 0.3, mask=mask, group=group)
    expected = 0.3 * ref_whiten(team, mask, group) + 0.7 * ref_whiten(ind, mask, group)
    np.testing.assert_allclose(out.numpy(), expected, atol=1e-5)
    assert is_whitened(out)


def test_mix_team_individual_bad_input() -> None:
    t = torch.randn(5)
    for alpha in (-0.1, 1.5):
        with pytest.raises(ValueError, match="alpha"):
            mix_team_individual(t, t, alpha)
    with pytest.raises(ValueError, match=r"\(5,\).*\(4,\)"):
        mix_team_individual(t, torch.randn(4), 0.5)
    with pytest.raises(TypeError, match="unknown"):
        mix_team_individual(t, t, 0.5, grup=None)


# ---------------------------------------------------------------------- running moments


def test_running_exact_equals_concatenation(backend) -> None:
    gen = torch.Generator().manual_seed(5)
    rm = RunningMoments(num_groups=4)
    xs, gs, ms = [], [], []
    for size, shift in ((13, 0.0), (1, 5.0), (40, -3.0), (7, 100.0)):
        x = torch.randn(size, generator=gen, dtype=torch.float64) + shift
        g = torch.randint(0, 3, (size,), generator=gen)  # group 3 never seen
        m = torch.rand(size, generator=gen) > 0.2
        rm.update(x, mask=m, group=g)
        xs.append(x), gs.append(g), ms.append(m)
    x, g, m = torch.cat(xs), torch.cat(gs), torch.cat(ms)
    for k in range(3):
        v = x[m & (g == k)].numpy()
        assert rm.count[k] == v.size
        assert rm.mean[k].item() == pytest.approx(v.mean(), rel=1e-12)
        assert rm.var[k].item() == pytest.approx(v.var(), rel=1e-10)
    assert rm.count[3] == 0 and rm.mean[3] == 0 and rm.var[3] == 0
    new = torch.randn(50, generator=gen, dtype=torch.float64)
    new_g = torch.randint(0, 4, (50,), generator=gen)
    out = rm.whiten(new, group=new_g)
    mean, std = rm.mean.numpy()[new_g], np.sqrt(rm.var.numpy())[new_g]
    expected = np.where(new_g.numpy() == 3, 0.0, (new.numpy() - mean) / (std + 1e-8))
    np.testing.assert_allclose(out.numpy(), expected, atol=1e-12)
    assert is_whitened(out)


def test_running_ema_hand_worked_example() -> None:
    """Two equal-size batches with momentum 0.5: the EMA is the 50/50 mixture, whose mean
    and variance are those of the concatenation [0, 2, 10, 14]: mean 6.5, var 32.75.

    By hand: batch 1 mean 1, var 1; batch 2 mean 12, var 4; new mean 0.5*1 + 0.5*12 = 6.5;
    var 0.5*(1 + 5.5**2) + 0.5*(4 + 5.5**2) = 32.75 (ignoring the shift of the mean would
    give 0.5*1 + 0.5*4 = 2.5).
    """
    rm = RunningMoments(momentum=0.5)
    rm.update(torch.tensor([0.0, 2.0], dtype=torch.float64))
    assert rm.mean.item() == 1.0 and rm.var.item() == 1.0  # first update: the batch's stats
    rm.update(torch.tensor([10.0, 14.0], dtype=torch.float64))
    both = np.array([0.0, 2.0, 10.0, 14.0])
    assert rm.mean.item() == pytest.approx(6.5) == pytest.approx(both.mean())
    assert rm.var.item() == pytest.approx(32.75) == pytest.approx(both.var())
    assert rm.count.item() == 4


def ref_ema(batches, momentum: float, num_groups: int) -> tuple[np.ndarray, np.ndarray]:
    """numpy float64 loop: EMA of each group's mixture mean and variance."""
    mean, var = np.zeros(num_groups), np.zeros(num_groups)
    seen = np.zeros(num_groups, bool)
    for x, g, m in batches:
        for k in range(num_groups):
            v = x[m & (g == k)]
            if v.size == 0:
                continue
            if not seen[k]:
                mean[k], var[k], seen[k] = v.mean(), v.var(), True
                continue
            new_mean = momentum * mean[k] + (1 - momentum) * v.mean()
            var[k] = momentum * (var[k] + (mean[k] - new_mean) ** 2) + (1 - momentum) * (
                v.var() + (v.mean() - new_mean) ** 2
            )
            mean[k] = new_mean
    return mean, var


def test_running_ema_follows_the_mixture_formula(backend) -> None:
    gen = torch.Generator().manual_seed(6)
    rm = RunningMoments(num_groups=3, momentum=0.9)
    batches = []
    for step in range(5):
        x = torch.randn(20, generator=gen, dtype=torch.float64) * (step + 1) + 10 * step
        # step 0 has group 0 only; group 2 first appears at step 3
        high = 1 if step == 0 else 2 if step < 3 else 3
        g = torch.randint(0, high, (20,), generator=gen)
        m = torch.rand(20, generator=gen) > 0.2
        rm.update(x, mask=m, group=g)
        batches.append((x.numpy(), g.numpy(), m.numpy()))
        mean, var = ref_ema(batches, 0.9, 3)
        np.testing.assert_allclose(rm.mean.numpy(), mean, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(rm.var.numpy(), var, rtol=1e-12, atol=1e-12)
    total = sum(int(m.sum()) for _, _, m in batches)
    assert rm.count.sum().item() == total


def test_running_state_dict_roundtrip_and_validation() -> None:
    rm = RunningMoments(num_groups=3)
    rm.update(torch.randn(30), group=torch.randint(0, 3, (30,)))
    other = RunningMoments(num_groups=3)
    other.load_state_dict(rm.state_dict())
    for key in ("count", "mean", "var"):
        assert torch.equal(getattr(other, key), getattr(rm, key))
    before = {k: v.clone() for k, v in other.state_dict().items() if torch.is_tensor(v)}
    bad_shape = dict(rm.state_dict(), mean=torch.zeros(4, dtype=torch.float64))
    with pytest.raises(ValueError, match="shape"):
        other.load_state_dict(bad_shape)
    bad_var = dict(rm.state_dict(), var=-torch.ones(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="non-negative"):
        other.load_state_dict(bad_var)
    with pytest.raises(ValueError, match="missing"):
        other.load_state_dict({"mean": rm.mean})
    with pytest.raises(ValueError, match="num_groups"):
        RunningMoments(num_groups=2).load_state_dict(rm.state_dict())
    with pytest.raises(ValueError, match="momentum"):
        RunningMoments(num_groups=3, momentum=0.5).load_state_dict(rm.state_dict())
    for key, value in before.items():
        assert torch.equal(getattr(other, key), value)


def test_running_bad_input(backend) -> None:
    with pytest.raises(ValueError, match="num_groups"):
        RunningMoments(num_groups=0)
    with pytest.raises(ValueError, match="momentum"):
        RunningMoments(momentum=1.0)
    rm = RunningMoments(num_groups=2)
    with pytest.raises(ValueError, match="num_groups=2"):
        rm.update(torch.randn(3), group=torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="NaN"):
        rm.update(torch.tensor([1.0, float("nan")]))
    assert rm.count.sum() == 0
    rm.update(torch.tensor([1.0, 2.0, 4.0]), group=torch.tensor([0, 0, 1]))
    with pytest.raises(ValueError, match="NaN or inf"):
        rm.whiten(torch.tensor([1.0, float("inf")]), group=torch.tensor([0, 0]))
    out = rm.whiten(
        torch.tensor([1.0, float("nan")]),
        mask=torch.tensor([True, False]),
        group=torch.tensor([0, 0]),
    )
    assert out.tolist() == [-1.0, 0.0]  # (1 - 1.5) / 0.5; group 1 (one entry) would give 0


# ------------------------------------------------------------------- keys and schemes


def _keys(T: int, E: int, A: int) -> tuple[GroupKeys, dict[str, np.ndarray]]:
    """Keys as a trainer builds them, and the same ids in numpy (broadcast to [T, E, A])."""
    type_id = torch.tensor([0, 0, 1, 1])[:A].reshape(1, 1, A)
    position = torch.arange(T).reshape(T, 1, 1)
    sequence_id = torch.arange(E * A).reshape(1, E, A)
    keys = GroupKeys(type_id=type_id, position=position, sequence_id=sequence_id)
    shape = (T, E, A)
    ids = {
        "type": np.broadcast_to(type_id.numpy(), shape),
        "position": np.broadcast_to(position.numpy(), shape),
        "sequence": np.broadcast_to(sequence_id.numpy(), shape),
    }
    return keys, ids


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_scheme_matches_reference(backend, scheme) -> None:
    T, E, A = 6, 3, 4
    gen = torch.Generator().manual_seed(8)
    team = torch.randn(T, E, A, generator=gen) * 3 + 1
    ind = torch.randn(T, E, A, generator=gen) - 2
    mask = torch.rand(T, E, A, generator=gen) > 0.15
    keys, ids = _keys(T, E, A)
    typ, pos = ids["type"], ids["position"]
    total, m = (team + ind).numpy(), mask.numpy()
    w = AdvantageWhitener(scheme, alpha=0.25, inner="type", chunk_size=4, num_groups=2)
    out = w(team, ind, mask=mask, keys=keys)
    expected = {
        "none": np.where(m, total, 0.0),
        "batch": ref_whiten(total, m),
        "type": ref_whiten(total, m, typ),
        "position": ref_whiten(total, m, pos),
        "chunk": ref_whiten(total, m, pos // 4),
        "sequence": ref_whiten(total, m, ids["sequence"]),
        "type_position": ref_whiten(total, m, typ * T + pos),
        "running": ref_whiten(total, m, typ),  # first call: running stats = batch stats
        "running_ema": ref_whiten(total, m, typ),
        "team_individual": 0.25 * ref_whiten(team, m, typ) + 0.75 * ref_whiten(ind, m, typ),
        "center": ref_whiten(total, m, scale=False),
    }[scheme]
    np.testing.assert_allclose(out.numpy(), expected, atol=1e-5)
    assert is_whitened(out) == (scheme != "none")
    assert w.scheme == scheme and w.last_clip_frac == 0.0


def test_running_scheme_accumulates_across_calls() -> None:
    gen = torch.Generator().manual_seed(9)
    a, b = torch.randn(50, generator=gen), torch.randn(30, generator=gen) + 4
    w = AdvantageWhitener("running")
    w(a)
    out = w(b)
    both = torch.cat([a, b]).double().numpy()
    expected = (b.double().numpy() - both.mean()) / (both.std() + 1e-8)
    np.testing.assert_allclose(out.numpy(), expected, atol=1e-5)
    restored = AdvantageWhitener("running")
    restored.load_state_dict(w.state_dict())
    assert torch.equal(restored.running.mean, w.running.mean)
    with pytest.raises(ValueError, match="no state"):
        AdvantageWhitener("batch").load_state_dict(w.state_dict())


def test_running_ema_scheme_uses_the_mixture_ema() -> None:
    a = torch.tensor([0.0, 2.0], dtype=torch.float64)
    b = torch.tensor([10.0, 14.0], dtype=torch.float64)
    w = AdvantageWhitener("running_ema", momentum=0.5)
    w(a)
    out = w(b)  # statistics: mean 6.5, var 32.75 (see the hand-worked example above)
    expected = (b.numpy() - 6.5) / (np.sqrt(32.75) + 1e-8)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-12)
    assert w.running.momentum == 0.5


def test_clip_and_clip_fraction() -> None:
    x = torch.tensor([0.0] * 8 + [10.0, -10.0])
    mask = torch.ones(10, dtype=torch.bool)
    mask[0] = False
    w = AdvantageWhitener("batch", clip_range=1.5)
    out = w(x, mask=mask)
    expected = np.clip(ref_whiten(x, mask), -1.5, 1.5)
    np.testing.assert_allclose(out.numpy(), expected, atol=1e-6)
    assert w.last_clip_frac == pytest.approx(2 / 9)
    assert is_whitened(out)
    assert AdvantageWhitener("batch")(x).abs().max() > 1.5
    clipped, frac = symmetric_clip(torch.tensor([-3.0, 0.5, 2.0]), 1.0)
    assert clipped.tolist() == [-1.0, 0.5, 1.0] and frac == pytest.approx(2 / 3)
    assert not is_whitened(clipped)


def test_whitener_bad_config_and_missing_keys() -> None:
    with pytest.raises(ValueError, match="known schemes: none, batch"):
        AdvantageWhitener("bogus")
    with pytest.raises(ValueError, match="inner"):
        AdvantageWhitener(inner="running")
    with pytest.raises(ValueError, match="alpha"):
        AdvantageWhitener(alpha=2.0)
    with pytest.raises(ValueError, match="clip_range"):
        AdvantageWhitener(clip_range=0.0)
    with pytest.raises(ValueError, match="chunk_size"):
        AdvantageWhitener("chunk", chunk_size=0)
    with pytest.raises(ValueError, match="keys.type_id"):
        AdvantageWhitener("type")(torch.randn(3))
    with pytest.raises(TypeError, match="keys.position"):
        AdvantageWhitener("position")(torch.randn(3), keys=GroupKeys(position=torch.zeros(3)))
    with pytest.raises(ValueError, match="individual"):
        AdvantageWhitener("team_individual")(torch.randn(3))
    assert set(GROUPING_SCHEMES) < set(SCHEMES)


# ------------------------------------------------------------------------- statistics


def test_advantage_stats_matches_numpy() -> None:
    x = torch.tensor([3.0, -1.0, 0.0, 2.0, -5.0, 100.0])
    mask = torch.tensor([True, True, True, True, True, False])
    stats = advantage_stats(x, mask)
    v = np.array([3.0, -1.0, 0.0, 2.0, -5.0])
    assert stats["mean"] == pytest.approx(v.mean())
    assert stats["std"] == pytest.approx(v.std())
    assert stats["pos_frac"] == pytest.approx(2 / 5)
    assert stats["pos_mean"] == pytest.approx(2.5)
    assert stats["neg_frac"] == pytest.approx(2 / 5)
    assert stats["neg_mean"] == pytest.approx(-3.0)
    assert stats["max_abs"] == pytest.approx(5.0)
    assert set(stats) == {"mean", "std", "pos_frac", "pos_mean", "neg_frac", "neg_mean", "max_abs"}
    empty = advantage_stats(x, torch.zeros(6, dtype=torch.bool))
    assert all(v == 0.0 for v in empty.values())


def test_public_import_path_exports_the_contract() -> None:
    contract = {
        "whiten",
        "RunningMoments",
        "mix_team_individual",
        "AdvantageWhitener",
        "GroupKeys",
        "SCHEMES",
        "GROUPING_SCHEMES",
        "advantage_stats",
        "symmetric_clip",
        "group_moments",
        "GroupMoments",
    }
    assert contract <= set(marl.whitening.__all__)
    for name in marl.whitening.__all__:
        assert getattr(marl.whitening, name) is getattr(W, name)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_uses_the_torch_functions_and_matches_numpy() -> None:
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(10_000, generator=gen) * 3 + 500
    group = torch.randint(0, 50, (10_000,), generator=gen)
    mask = torch.rand(10_000, generator=gen) > 0.2
    out = whiten(x.cuda(), mask=mask.cuda(), group=group.cuda())
    assert out.device.type == "cuda"
    expected = ref_whiten(x, mask, group)
    np.testing.assert_allclose(out.cpu().double().numpy(), expected, atol=1e-5)
    m = group_moments(x.cuda(), mask=mask.cuda(), group=group.cuda())
    assert m.count.device.type == "cpu"
    rm = RunningMoments(num_groups=50)
    rm.update(x.cuda(), mask=mask.cuda(), group=group.cuda())
    out = rm.whiten(x.cuda(), mask=mask.cuda(), group=group.cuda())
    np.testing.assert_allclose(out.cpu().numpy(), expected, atol=1e-5)
    w = AdvantageWhitener("type_position")
    keys = GroupKeys(
        type_id=torch.tensor([0, 1]).reshape(1, 2).cuda(),
        position=torch.arange(5).reshape(5, 1).cuda(),
    )
    team = torch.randn(5, 2, generator=gen)
    ref = ref_whiten(team, None, np.array([[0, 5]]) + np.arange(5).reshape(5, 1))
    np.testing.assert_allclose(w(team.cuda(), keys=keys).cpu().numpy(), ref, atol=1e-5)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MARL_WHITEN_BACKEND", "numba")
        with pytest.raises(ValueError, match="CPU"):
            whiten(x.cuda())
