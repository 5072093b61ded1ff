"""marl.core.whitening against a numpy float64 reference, both backends (numba loops, torch)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from marl.core import whitening as W
from marl.core.whitening import (
    SCHEMES,
    AdvantageWhitener,
    GroupKeys,
    RunningMoments,
    advantage_stats,
    chunk_key,
    combine_keys,
    is_whitened,
    mix_team_individual,
    parse_scheme,
    position_key,
    sequence_key,
    type_key,
    whiten,
)

BACKENDS = ["numba", "torch"]


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


def run(backend: str, x, **kw) -> torch.Tensor:
    kw.setdefault("eps", 1e-8)
    kw.setdefault("center", True)
    kw.setdefault("scale", True)
    kw.setdefault("mask", None)
    kw.setdefault("group", None)
    return W._whiten_impl(x, distributed=False, backend=backend, **kw)


# ------------------------------------------------------------------- core kernel


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("use_mask", [False, True])
@pytest.mark.parametrize("n_groups", [0, 1, 3, 17])
def test_whiten_matches_numpy(backend, dtype, use_mask, n_groups) -> None:
    gen = torch.Generator().manual_seed(n_groups + 7 * use_mask)
    x = (torch.randn(6, 50, generator=gen, dtype=torch.float64) * 3 + 20).to(dtype)
    mask = torch.rand(6, 50, generator=gen) > 0.3 if use_mask else None
    group = torch.randint(0, n_groups, (6, 50), generator=gen) if n_groups else None
    for center, scale in [(True, True), (False, True), (True, False)]:
        out = run(backend, x, mask=mask, group=group, center=center, scale=scale)
        assert out.dtype == dtype and out.shape == x.shape
        expected = ref_whiten(
            x.double().numpy(),
            None if mask is None else mask.numpy(),
            None if group is None else group.numpy(),
            center=center,
            scale=scale,
        )
        tol = 1e-5 if dtype == torch.float32 else 1e-12
        np.testing.assert_allclose(out.double().numpy(), expected, rtol=0, atol=tol)


def test_backends_agree_exactly_enough() -> None:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(5000, generator=gen, dtype=torch.float64) + 1e3
    group = torch.randint(0, 40, (5000,), generator=gen)
    mask = torch.rand(5000, generator=gen) > 0.1
    a = run("numba", x, mask=mask, group=group)
    b = run("torch", x, mask=mask, group=group)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-11)


@pytest.mark.parametrize("backend", BACKENDS)
def test_masked_entries_zero_even_if_nan(backend) -> None:
    x = torch.tensor([1.0, float("nan"), 3.0, float("inf"), 5.0])
    mask = torch.tensor([True, False, True, False, True])
    group = torch.tensor([0, -1, 0, -7, 0])  # garbage ids at masked entries are ignored
    out = run(backend, x, mask=mask, group=group)
    np.testing.assert_allclose(out.numpy(), ref_whiten([1, 0, 3, 0, 5], mask.numpy()), atol=1e-6)
    assert out[1] == 0 and out[3] == 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_constant_group_gives_exact_zero(backend, dtype) -> None:
    x = torch.full((1001,), 1000.1, dtype=dtype)
    x[:500] = torch.linspace(-3, 7, 500, dtype=dtype)
    group = torch.zeros(1001, dtype=torch.int64)
    group[500:] = 1
    for center, scale in [(True, True), (False, True), (True, False)]:
        out = run(backend, x, group=group, center=center, scale=scale)
        assert torch.all(out[500:] == 0), out[500:].abs().max()
        assert torch.isfinite(out).all()
    # the naive E[x^2]-E[x]^2 float32 formula explodes on this group (why we do not use it)
    c = torch.full((1001,), 1000.1, dtype=torch.float32)
    naive_var = (c * c).mean() - c.mean() ** 2
    assert naive_var != 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_single_entry_and_empty_groups_give_zero(backend) -> None:
    x = torch.tensor([5.0, 1.0, 2.0, 3.0, 9.0])
    group = torch.tensor([0, 3, 3, 3, 7])  # groups 1, 2, 4..6 empty; 0 and 7 single
    out = run(backend, x, group=group)
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


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_float32_accuracy_1e7_entries_far_from_zero(backend, big_far_from_zero) -> None:
    x, group, expected = big_far_from_zero
    out = run(backend, x, group=group)
    err = np.abs(out.double().numpy() - expected).max()
    assert err < 1e-4, err
    if backend == "numba":
        # float32 E[x^2] - E[x]^2 (the failure this kernel avoids) is far off here
        naive_var = (x * x).mean() - x.mean() ** 2
        assert abs(float(naive_var) - 0.25) > 1e-2


def test_empty_and_all_masked_inputs() -> None:
    assert whiten(torch.zeros(0)).shape == (0,)
    assert whiten(torch.tensor(3.0)).item() == 0.0
    out = whiten(torch.randn(4), mask=torch.zeros(4, dtype=torch.bool), group=torch.full((4,), -1))
    assert torch.equal(out, torch.zeros(4))


def test_broadcast_group_and_mask() -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(8, 5, generator=gen)
    group = torch.tensor([0, 0, 1, 1, 2])  # per column, broadcast over rows
    mask = (torch.arange(8) < 6).unsqueeze(1)  # [8, 1]
    out = whiten(x, mask=mask, group=group)
    expected = ref_whiten(x.numpy(), mask.numpy(), group.numpy())
    np.testing.assert_allclose(out.numpy(), expected, atol=1e-5)


def test_sparse_large_ids_are_compacted() -> None:
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(300, generator=gen, dtype=torch.float64)
    dense = torch.randint(0, 5, (300,), generator=gen)
    sparse = torch.tensor([0, 10**12, 7, 2**40, 3 * 10**15])[dense]
    torch.testing.assert_close(whiten(x, group=sparse), whiten(x, group=dense))


def test_low_precision_input_keeps_dtype() -> None:
    x = torch.randn(64, dtype=torch.float64)
    out = whiten(x.to(torch.bfloat16))
    assert out.dtype == torch.bfloat16
    expected = ref_whiten(x.to(torch.bfloat16).double().numpy())
    np.testing.assert_allclose(out.double().numpy(), expected, atol=2e-2)


def test_output_is_detached_and_input_untouched() -> None:
    x = torch.randn(10, requires_grad=True)
    before = x.detach().clone()
    out = whiten(x)
    assert not out.requires_grad
    assert torch.equal(x.detach(), before)


def test_group_moments_reports_population_stats() -> None:
    x = torch.tensor([1.0, 2.0, 3.0, 10.0, 20.0])
    m = W.group_moments(x, group=torch.tensor([0, 0, 0, 2, 2]))
    np.testing.assert_allclose(m.count.numpy(), [3, 0, 2])
    np.testing.assert_allclose(m.mean.numpy(), [2.0, 0.0, 15.0])
    np.testing.assert_allclose(m.var.numpy(), [2 / 3, 0.0, 25.0])


# -------------------------------------------------------------------- bad input


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_or_inf_among_valid_entries_raises(backend) -> None:
    for bad in (float("nan"), float("inf"), -float("inf")):
        x = torch.tensor([1.0, 2.0, bad, 4.0])
        with pytest.raises(ValueError, match="NaN or inf"):
            run(backend, x, group=torch.tensor([0, 0, 1, 1]))
        with pytest.raises(ValueError, match="NaN or inf"):
            run(backend, x)


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
    with pytest.raises(TypeError, match="floating"):
        whiten(torch.arange(4))
    with pytest.raises(ValueError, match="only 0 and 1"):
        whiten(x, mask=torch.full((4, 3), 0.5))
    with pytest.raises(TypeError, match="Tensor"):
        whiten(np.zeros(3))  # type: ignore[arg-type]


def test_integer_and_float_01_masks_are_accepted() -> None:
    x = torch.randn(6)
    m = torch.tensor([1, 0, 1, 1, 0, 1])
    torch.testing.assert_close(whiten(x, mask=m), whiten(x, mask=m.bool()))
    torch.testing.assert_close(whiten(x, mask=m.float()), whiten(x, mask=m.bool()))
    with pytest.raises(ValueError, match="0 and 1"):
        whiten(x, mask=torch.tensor([2, 0, 1, 1, 0, 1]))


# ----------------------------------------------------------- double-whitening guard


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
    np.testing.assert_allclose(whiten(out, allow_rewhiten=True).numpy(), ref_whiten(out), atol=1e-5)
    whiten(out.clone())  # a new tensor carries no tag


# ----------------------------------------------------------------- team/individual


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


# ------------------------------------------------------------------ running moments


def test_running_exact_equals_concatenation() -> None:
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
    assert rm.count[3] == 0
    new = torch.randn(50, generator=gen, dtype=torch.float64)
    new_g = torch.randint(0, 4, (50,), generator=gen)
    out = rm.whiten(new, group=new_g)
    mean, std = rm.mean.numpy()[new_g], np.sqrt(rm.var.numpy())[new_g]
    expected = np.where(new_g.numpy() == 3, 0.0, (new.numpy() - mean) / (std + 1e-8))
    np.testing.assert_allclose(out.numpy(), expected, atol=1e-12)


def test_running_ema_follows_formula() -> None:
    gen = torch.Generator().manual_seed(6)
    rm = RunningMoments(num_groups=2, momentum=0.9)
    mean = np.zeros(2)
    var = np.zeros(2)
    seen = np.zeros(2, bool)
    for step in range(4):
        x = torch.randn(20, generator=gen, dtype=torch.float64) * (step + 1) + step
        g = torch.zeros(20, dtype=torch.int64) if step == 0 else torch.randint(0, 2, (20,))
        rm.update(x, group=g)
        for k in range(2):
            v = x[g == k].numpy()
            if v.size == 0:
                continue
            if not seen[k]:
                mean[k], var[k], seen[k] = v.mean(), v.var(), True
            else:
                mean[k] = 0.9 * mean[k] + 0.1 * v.mean()
                var[k] = 0.9 * var[k] + 0.1 * v.var()
        np.testing.assert_allclose(rm.mean.numpy(), mean, rtol=1e-12)
        np.testing.assert_allclose(rm.var.numpy(), var, rtol=1e-12)


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


def test_running_bad_input() -> None:
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
    assert out.tolist() == [-1.0, 0.0]


# ------------------------------------------------------------------ keys and schemes


def test_key_helpers() -> None:
    assert type_key(["scout_0", "scout_1", "rescuer_0"]).tolist() == [0, 0, 1]
    assert type_key(["scout_0", "rescuer_0"], types=["rescuer", "scout"]).tolist() == [1, 0]
    with pytest.raises(ValueError, match="not in types"):
        type_key(["medic_0"], types=["scout"])
    pos = position_key(4, 3, time_dim=0, length=6)
    assert pos.shape == (6, 1, 1) and pos.flatten().tolist() == [0, 1, 2, 3, 0, 1]
    assert chunk_key(torch.arange(7), 3).tolist() == [0, 0, 0, 1, 1, 1, 2]
    with pytest.raises(ValueError, match="chunk_size"):
        chunk_key(torch.arange(3), 0)
    combined = combine_keys(torch.tensor([[0], [1]]), torch.tensor([0, 1, 2]), 3)
    assert combined.tolist() == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(ValueError, match="num_b"):
        combine_keys(torch.tensor([0]), torch.tensor([3]), 3)
    seq = sequence_key((5, 2, 3))
    assert seq.shape == (1, 2, 3) and seq.flatten().tolist() == list(range(6))


def test_parse_scheme() -> None:
    assert parse_scheme("Team-Individual") == "team_individual"
    assert parse_scheme("dr_grpo") == "center"
    for name in SCHEMES:
        assert parse_scheme(name) == name
    with pytest.raises(ValueError, match="known schemes: none, batch"):
        parse_scheme("per_moon_phase")


def _keys(T: int = 6, E: int = 3, A: int = 4) -> tuple[GroupKeys, torch.Tensor]:
    type_id = torch.tensor([0, 0, 1, 1])[:A].reshape(1, 1, A)
    keys = GroupKeys(
        type_id=type_id,
        position=position_key(T, 3),
        sequence_id=sequence_key((T, E, A)),
    )
    return keys, type_id


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_scheme_matches_reference(scheme) -> None:
    T, E, A = 6, 3, 4
    gen = torch.Generator().manual_seed(8)
    team = torch.randn(T, E, A, generator=gen) * 3 + 1
    ind = torch.randn(T, E, A, generator=gen) - 2
    mask = torch.rand(T, E, A, generator=gen) > 0.15
    keys, type_id = _keys(T, E, A)
    shape = (T, E, A)
    pos = np.broadcast_to(np.arange(T).reshape(T, 1, 1), shape)
    typ = np.broadcast_to(type_id.numpy(), shape)
    seq = np.broadcast_to(np.arange(E * A).reshape(1, E, A), shape)
    total, m = (team + ind).numpy(), mask.numpy()
    w = AdvantageWhitener(scheme, alpha=0.25, inner="type", chunk_size=4, num_groups=2)
    out = w(team, ind, mask=mask, keys=keys).numpy()
    expected = {
        "none": np.where(m, total, 0.0),
        "batch": ref_whiten(total, m),
        "type": ref_whiten(total, m, typ),
        "position": ref_whiten(total, m, pos),
        "chunk": ref_whiten(total, m, pos // 4),
        "sequence": ref_whiten(total, m, seq),
        "type_position": ref_whiten(total, m, typ * T + pos),
        "running": ref_whiten(total, m, typ),  # first call: running stats = batch stats
        "running_ema": ref_whiten(total, m, typ),
        "team_individual": 0.25 * ref_whiten(team.numpy(), m, typ)
        + 0.75 * ref_whiten(ind.numpy(), m, typ),
        "center": ref_whiten(total, m, scale=False),
    }[scheme]
    np.testing.assert_allclose(out, expected, atol=1e-5)


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


def test_clip_and_clip_fraction() -> None:
    x = torch.tensor([0.0] * 8 + [10.0, -10.0])
    mask = torch.ones(10, dtype=torch.bool)
    mask[0] = False
    w = AdvantageWhitener("batch", clip_range=1.5)
    out = w(x, mask=mask)
    expected = np.clip(ref_whiten(x.numpy(), mask.numpy()), -1.5, 1.5)
    np.testing.assert_allclose(out.numpy(), expected, atol=1e-6)
    assert w.last_clip_frac == pytest.approx(2 / 9)
    assert is_whitened(out)
    assert AdvantageWhitener("batch")(x).abs().max() > 1.5


def test_whitener_bad_config_and_missing_keys() -> None:
    with pytest.raises(ValueError, match="known schemes"):
        AdvantageWhitener("bogus")
    with pytest.raises(ValueError, match="inner"):
        AdvantageWhitener(inner="running")
    with pytest.raises(ValueError, match="alpha"):
        AdvantageWhitener(alpha=2.0)
    with pytest.raises(ValueError, match="clip_range"):
        AdvantageWhitener(clip_range=0.0)
    with pytest.raises(ValueError, match="keys.type_id"):
        AdvantageWhitener("type")(torch.randn(3))
    with pytest.raises(ValueError, match="individual"):
        AdvantageWhitener("team_individual")(torch.randn(3))


# ------------------------------------------------------------------- statistics


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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_torch_backend_matches_cpu() -> None:
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(10_000, generator=gen) * 3 + 500
    group = torch.randint(0, 50, (10_000,), generator=gen)
    mask = torch.rand(10_000, generator=gen) > 0.2
    out = whiten(x.cuda(), mask=mask.cuda(), group=group.cuda())
    assert out.device.type == "cuda"
    expected = ref_whiten(x.numpy(), mask.numpy(), group.numpy())
    np.testing.assert_allclose(out.cpu().double().numpy(), expected, atol=1e-5)
    rm = RunningMoments(num_groups=50)
    rm.update(x.cuda(), mask=mask.cuda(), group=group.cuda())
    np.testing.assert_allclose(
        rm.whiten(x.cuda(), mask=mask.cuda(), group=group.cuda()).cpu().numpy(), expected, atol=1e-5
    )


def test_env_var_selects_torch_backend(monkeypatch) -> None:
    monkeypatch.setenv("MARL_WHITEN_BACKEND", "torch")
    W._numba_kernels.cache_clear()
    try:
        assert W._numba_kernels() is None
        assert not W._use_numba(torch.zeros(3), "auto")
        with pytest.raises(ValueError, match="numba"):
            W._use_numba(torch.zeros(3), "numba")
        x = torch.randn(40)
        np.testing.assert_allclose(whiten(x).numpy(), ref_whiten(x.numpy()), atol=1e-5)
    finally:
        monkeypatch.delenv("MARL_WHITEN_BACKEND")
        W._numba_kernels.cache_clear()
    assert W._numba_kernels() is not None


@pytest.mark.parametrize("backend", BACKENDS)
def test_more_groups_than_unrolled_tables(backend) -> None:
    # ids up to ~70000 > _NB_UNROLL_MAX_GROUPS: the single-table scatter loops
    gen = torch.Generator().manual_seed(12)
    x = torch.randn(3000, generator=gen, dtype=torch.float64)
    group = torch.randint(0, 40, (3000,), generator=gen) * 1750
    assert int(group.max()) + 1 > W._NB_UNROLL_MAX_GROUPS
    mask = torch.rand(3000, generator=gen) > 0.2
    out = run(backend, x, mask=mask, group=group)
    expected = ref_whiten(x.numpy(), mask.numpy(), group.numpy())
    np.testing.assert_allclose(out.numpy(), expected, atol=1e-12)
