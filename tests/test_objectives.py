"""marl.core.losses against hand-worked numbers and numpy float64 references."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from marl.core.losses import (
    NonFiniteError,
    OptimismOffset,
    ValueNorm,
    explained_variance,
    linear_schedule,
    masked_mean,
    ppo_policy_loss,
    value_loss,
)


def _np_ppo(logp, old, adv, lo, hi, dual=None):
    ratio = np.exp(logp - old)
    s = np.minimum(ratio * adv, np.clip(ratio, 1 - lo, 1 + hi) * adv)
    if dual is not None:
        s = np.where(adv < 0, np.maximum(s, dual * adv), s)
    return -s.mean(), ratio


def test_ppo_loss_asymmetric_clip_matches_numpy():
    rng = np.random.default_rng(0)
    logp = rng.normal(size=200) * 0.3
    old = rng.normal(size=200) * 0.3
    adv = rng.normal(size=200)
    loss, stats = ppo_policy_loss(
        torch.tensor(logp), torch.tensor(old), torch.tensor(adv), clip_low=0.1, clip_high=0.3
    )
    ref, ratio = _np_ppo(logp, old, adv, 0.1, 0.3)
    assert float(loss) == pytest.approx(ref, rel=1e-10)
    # the fractions where a bound binds: below 1 - clip_low only matters for A < 0, above
    # 1 + clip_high only for A > 0
    assert float(stats["clip_frac_low"]) == pytest.approx(np.mean((ratio < 0.9) & (adv < 0)))
    assert float(stats["clip_frac_high"]) == pytest.approx(np.mean((ratio > 1.3) & (adv > 0)))
    assert float(stats["approx_kl"]) == pytest.approx(np.mean(ratio - 1 - np.log(ratio)))


def test_ppo_loss_hand_worked_clip_and_dual_clip():
    # ratio 2 with A=+1 clipped at 1.2 -> surrogate 1.2; ratio 4 with A=-1: min(-4, -1.2) = -4,
    # dual clip c=3 bounds it at -3.
    logp = torch.log(torch.tensor([2.0, 4.0]))
    old = torch.zeros(2)
    adv = torch.tensor([1.0, -1.0])
    loss, _ = ppo_policy_loss(logp, old, adv, clip_low=0.2, clip_high=0.2)
    assert float(loss) == pytest.approx(-(1.2 - 4.0) / 2)
    loss, stats = ppo_policy_loss(logp, old, adv, clip_low=0.2, clip_high=0.2, dual_clip=3.0)
    assert float(loss) == pytest.approx(-(1.2 - 3.0) / 2)
    assert float(stats["dual_clip_frac"]) == pytest.approx(0.5)


def test_ppo_loss_mask_and_errors():
    logp = torch.tensor([0.1, 0.0, 5.0])
    old = torch.zeros(3)
    adv = torch.tensor([1.0, 2.0, 100.0])
    mask = torch.tensor([True, True, False])
    loss, _ = ppo_policy_loss(logp, old, adv, mask=mask)
    ref, _ = _np_ppo(np.array([0.1, 0.0]), np.zeros(2), np.array([1.0, 2.0]), 0.2, 0.2)
    assert float(loss) == pytest.approx(ref)
    with pytest.raises(ValueError, match="clip_low"):
        ppo_policy_loss(logp, old, adv, clip_low=1.5)
    with pytest.raises(ValueError, match="dual_clip"):
        ppo_policy_loss(logp, old, adv, dual_clip=0.5)
    with pytest.raises(ValueError, match="shapes"):
        ppo_policy_loss(logp, old[:2], adv)


def test_value_loss_clipped_matches_numpy():
    rng = np.random.default_rng(1)
    v, v_old, ret = rng.normal(size=(3, 50))
    got = value_loss(torch.tensor(v), torch.tensor(v_old), torch.tensor(ret), value_clip=0.1)
    clipped = v_old + np.clip(v - v_old, -0.1, 0.1)
    ref = 0.5 * np.maximum((v - ret) ** 2, (clipped - ret) ** 2).mean()
    assert float(got) == pytest.approx(ref, rel=1e-10)
    plain = value_loss(torch.tensor(v), torch.tensor(v_old), torch.tensor(ret))
    assert float(plain) == pytest.approx(0.5 * ((v - ret) ** 2).mean(), rel=1e-10)


def test_value_norm_is_the_debiased_ema():
    rng = np.random.default_rng(2)
    beta = 0.9
    norm = ValueNorm(2, beta=beta)
    m = np.zeros(2)
    m2 = np.zeros(2)
    d = 0.0
    for _ in range(5):
        x = rng.normal(3.0, 2.0, size=(40, 2))
        norm.update(torch.tensor(x, dtype=torch.float32))
        m = beta * m + (1 - beta) * x.mean(0)
        m2 = beta * m2 + (1 - beta) * (x**2).mean(0)
        d = beta * d + (1 - beta)
    mean, var = m / d, np.maximum(m2 / d - (m / d) ** 2, 1e-2)
    y = torch.tensor([[1.0, -2.0]])
    np.testing.assert_allclose(
        norm.normalize(y).numpy()[0], (np.array([1, -2]) - mean) / np.sqrt(var), rtol=1e-5
    )
    np.testing.assert_allclose(norm.denormalize(norm.normalize(y)).numpy(), y.numpy(), rtol=1e-5)
    sd = norm.state_dict()
    other = ValueNorm(2, beta=beta)
    other.load_state_dict(sd)
    np.testing.assert_allclose(other.normalize(y).numpy(), norm.normalize(y).numpy())


def test_optimism_offset_shifts_and_learns_the_zero_point():
    off = OptimismOffset(0.5)
    adv = torch.tensor([1.0, -1.0, 0.4])  # mean 0.1333
    assert torch.allclose(off(adv), adv + 0.5)
    opt = torch.optim.SGD(off.parameters(), lr=0.2)
    for _ in range(200):
        opt.zero_grad()
        off.loss(adv).backward()
        opt.step()
    assert off.b.item() == pytest.approx(-float(adv.mean()), abs=1e-4)
    # the policy-facing output carries no gradient to b
    assert not off(adv).requires_grad


def test_stacked_optimism_offsets_are_each_runs_own():
    """b [S]: run s's advantages get b[s], and the loss is each run's masked mean, squared
    (the same numbers as S one-run offsets, hand-computed for run 1)."""
    runs = [OptimismOffset(v) for v in (0.5, -0.25, 1.0)]
    stacked = OptimismOffset.stack(runs)
    assert stacked.b.shape == (3,)
    g = torch.Generator().manual_seed(0)
    adv = torch.randn(3, 4, 5, generator=g)
    mask = torch.rand(3, 4, 5, generator=g) > 0.4
    out = stacked(adv)
    loss = stacked.loss(adv, mask)
    assert loss.shape == (3,)
    for s, one in enumerate(runs):
        torch.testing.assert_close(out[s], one(adv[s]))
        torch.testing.assert_close(loss[s], one.loss(adv[s], mask[s]))
    kept = adv[1][mask[1]].double()
    assert float(loss[1]) == pytest.approx(float((kept - 0.25).mean() ** 2), rel=1e-5)
    loss.sum().backward()  # run s's term moves b[s] alone
    expected = 2 * ((adv[1][mask[1]] - 0.25).mean())
    assert float(stacked.b.grad[1]) == pytest.approx(float(expected), rel=1e-5)


def test_small_helpers():
    assert float(masked_mean(torch.tensor([1.0, 3.0, 100.0]), torch.tensor([1, 1, 0]).bool())) == 2
    assert linear_schedule(0.01, 0.0, 0.5) == pytest.approx(0.005)
    assert linear_schedule(0.01, None, 0.9) == 0.01
    assert linear_schedule(1.0, 0.0, 3.0) == 0.0
    t = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert explained_variance(t, t) == pytest.approx(1.0)
    assert explained_variance(torch.zeros(4), t) == pytest.approx(0.0)
    assert "loss/value" in str(NonFiniteError("loss/value"))
