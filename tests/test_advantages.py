"""marl.core.advantages against hand-worked examples and sequential numpy float64 loops."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from marl.core.advantages import (
    constant,
    discounted_returns,
    gae,
    group_relative_advantages,
    kl_k3,
    linear_decay,
    make_schedule,
    process_advantages,
    shape_with_penalty,
    zero_std_mask,
)
from marl.core.whitening import is_whitened, whiten


def ref_gae(r, v, nv, term, trunc, gamma, lam):
    """Sequential numpy float64 GAE, one column at a time."""
    r, v, nv = (np.asarray(a, np.float64) for a in (r, v, nv))
    term, trunc = np.asarray(term, bool), np.asarray(trunc, bool)
    adv = np.zeros_like(r)
    for col in np.ndindex(r.shape[1:]):
        idx = (slice(None),) + col
        rr, vv, nn, te, tr = r[idx], v[idx], nv[idx], term[idx], trunc[idx]
        last = 0.0
        for t in reversed(range(len(rr))):
            bootstrap = 0.0 if te[t] else nn[t]
            delta = rr[t] + gamma * bootstrap - vv[t]
            if te[t] or tr[t]:
                last = 0.0
            last = delta + gamma * lam * last
            adv[idx][t] = last
    return adv, adv + v


def test_gae_hand_worked_termination_and_truncation_inside_window() -> None:
    # T = 5: episode A = steps 0-1 (terminated at 1), episode B = steps 2-3 (truncated at
    # 3, final obs value 4.0), episode C starts at 4 and runs past the window (bootstrap 2).
    rewards = torch.tensor([1.0, 2.0, 0.0, 1.0, 3.0])
    values = torch.tensor([0.5, 1.0, 2.0, 1.0, 1.5])
    next_values = torch.tensor([1.0, 9.0, 1.0, 4.0, 2.0])  # 9.0 must be ignored (terminal)
    terminated = torch.tensor([False, True, False, False, False])
    truncated = torch.tensor([False, False, False, True, False])
    gamma, lam = 0.9, 0.5
    adv, ret = gae(rewards, values, next_values, terminated, truncated, gamma=gamma, lam=lam)
    # by hand:
    d4 = 3.0 + 0.9 * 2.0 - 1.5  # 3.3
    d3 = 1.0 + 0.9 * 4.0 - 1.0  # 3.6  (truncated: bootstrap from the final obs value)
    d2 = 0.0 + 0.9 * 1.0 - 2.0  # -1.1
    d1 = 2.0 + 0.0 - 1.0  # 1.0   (terminated: no bootstrap)
    d0 = 1.0 + 0.9 * 1.0 - 0.5  # 1.4
    a4, a3 = d4, d3  # recursion cut at 3
    a2 = d2 + 0.45 * a3
    a1 = d1  # recursion cut at 1
    a0 = d0 + 0.45 * a1
    expected = torch.tensor([a0, a1, a2, a3, a4])
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, expected + values)


def test_gae_lambda_one_is_bootstrapped_discounted_return() -> None:
    r = torch.tensor([1.0, 1.0, 1.0])
    v = torch.tensor([0.3, -2.0, 5.0])
    nv = torch.tensor([-2.0, 5.0, 10.0])
    no = torch.zeros(3, dtype=torch.bool)
    _, ret = gae(r, v, nv, no, no, gamma=0.5, lam=1.0)
    torch.testing.assert_close(ret, torch.tensor([1.75 + 1.25, 1.5 + 2.5, 1.0 + 5.0]))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gae_matches_sequential_reference(seed) -> None:
    gen = torch.Generator().manual_seed(seed)
    shape = (40, 3, 2)
    r = torch.randn(shape, generator=gen)
    v = torch.randn(shape, generator=gen)
    nv = torch.randn(shape, generator=gen)
    term = torch.rand(shape, generator=gen) < 0.1
    trunc = (torch.rand(shape, generator=gen) < 0.1) & ~term
    adv, ret = gae(r, v, nv, term, trunc.float(), gamma=0.97, lam=0.9)
    ea, er = ref_gae(r, v, nv, term, trunc, 0.97, 0.9)
    np.testing.assert_allclose(adv.numpy(), ea, atol=1e-5)
    np.testing.assert_allclose(ret.numpy(), er, atol=1e-5)


def test_gae_bad_input() -> None:
    x = torch.zeros(4, 2)
    flag = torch.zeros(4, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"values has shape \(4, 3\).*\(4, 2\)"):
        gae(x, torch.zeros(4, 3), x, flag, flag, gamma=0.9, lam=0.9)
    with pytest.raises(ValueError, match="gamma"):
        gae(x, x, x, flag, flag, gamma=1.5, lam=0.9)
    with pytest.raises(ValueError, match="lam"):
        gae(x, x, x, flag, flag, gamma=0.9, lam=-0.1)
    with pytest.raises(ValueError, match="NaN"):
        gae(x + float("nan"), x, x, flag, flag, gamma=0.9, lam=0.9)
    with pytest.raises(ValueError, match="0/1"):
        gae(x, x, x, flag.float() + 2, flag, gamma=0.9, lam=0.9)


def test_discounted_returns() -> None:
    r = torch.tensor([[1.0], [2.0], [3.0], [4.0]])
    dones = torch.tensor([[False], [True], [False], [False]])
    out = discounted_returns(r, dones, 0.5)
    torch.testing.assert_close(out, torch.tensor([[2.0], [2.0], [5.0], [4.0]]))
    out = discounted_returns(r, dones, 0.5, bootstrap=torch.tensor([8.0]))
    torch.testing.assert_close(out[2:], torch.tensor([[3.0 + 0.5 * 8.0], [8.0]]))
    with pytest.raises(ValueError, match="bootstrap"):
        discounted_returns(r, dones, 0.5, bootstrap=torch.zeros(2))


# ----------------------------------------------------------------------------- GRPO


def ref_grpo(returns, groups, scale_std=True, loo=False, eps=1e-8):
    returns, groups = np.asarray(returns, np.float64), np.asarray(groups)
    out = np.zeros_like(returns)
    zero = 0
    uniq = np.unique(groups)
    for g in uniq:
        sel = groups == g
        v = returns[sel]
        n = v.size
        if n <= 1 or v.std() == 0:
            zero += 1
            continue
        if loo:
            baseline = (v.sum() - v) / (n - 1)
            a = v - baseline
        else:
            a = v - v.mean()
        out[sel] = a / (v.std() + eps) if scale_std else a
    return out, zero / len(uniq)


@pytest.mark.parametrize("scale_std", [True, False])
@pytest.mark.parametrize("loo", [False, True])
def test_group_relative_matches_reference(scale_std, loo) -> None:
    returns = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 5.0, 3.0, 1.0, 7.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 2, 3, 3, 3])
    adv, frac = group_relative_advantages(returns, groups, scale_std=scale_std, leave_one_out=loo)
    expected, frac_ref = ref_grpo(returns, groups, scale_std, loo)
    np.testing.assert_allclose(adv.numpy(), expected, atol=1e-6)
    assert frac == pytest.approx(frac_ref) == pytest.approx(0.5)
    assert torch.all(adv[4:8] == 0)  # zero-variance and single-episode groups


def test_group_relative_hand_worked() -> None:
    adv, frac = group_relative_advantages(torch.tensor([1.0, 3.0]), torch.tensor([4, 4]))
    torch.testing.assert_close(adv, torch.tensor([-1.0, 1.0]))  # population std = 1
    assert frac == 0.0
    adv, _ = group_relative_advantages(
        torch.tensor([1.0, 3.0, 5.0]),
        torch.tensor([0, 0, 0]),
        leave_one_out=True,
        scale_std=False,
    )
    torch.testing.assert_close(adv, torch.tensor([-3.0, 0.0, 3.0]))  # 1 - (3+5)/2 = -3


def test_group_relative_mask_and_errors() -> None:
    returns = torch.tensor([1.0, 2.0, float("nan"), 3.0])
    mask = torch.tensor([True, True, False, True])
    adv, frac = group_relative_advantages(returns, torch.tensor([0, 0, -1, 1]), mask=mask)
    torch.testing.assert_close(adv, torch.tensor([-1.0, 1.0, 0.0, 0.0]))
    assert frac == 0.5
    with pytest.raises(ValueError, match="NaN"):
        group_relative_advantages(returns, torch.tensor([0, 0, 1, 1]))
    with pytest.raises(TypeError, match="integer"):
        group_relative_advantages(returns, torch.zeros(4))
    with pytest.raises(ValueError, match="eps"):
        group_relative_advantages(returns, torch.tensor([0, 0, 1, 1]), mask=mask, eps=0)


def test_process_advantages_matches_reference() -> None:
    gen = torch.Generator().manual_seed(3)
    T, N = 6, 5
    r = torch.randn(T, N, generator=gen)
    lengths = torch.tensor([6, 4, 2, 6, 5])
    mask = torch.arange(T).unsqueeze(1) < lengths
    groups = torch.tensor([0, 0, 0, 1, 1])
    adv, frac = process_advantages(r, mask, groups)
    expected = np.zeros((T, N))
    rn, m = r.double().numpy(), mask.numpy()
    for g in (0, 1):
        cols = np.where(groups.numpy() == g)[0]
        vals = np.concatenate([rn[m[:, c], c] for c in cols])
        for c in cols:
            norm = np.where(m[:, c], (rn[:, c] - vals.mean()) / (vals.std() + 1e-8), 0.0)
            expected[:, c] = np.cumsum(norm[::-1])[::-1] * m[:, c]
    np.testing.assert_allclose(adv.numpy(), expected, atol=1e-5)
    assert frac == 0.0
    with pytest.raises(ValueError, match="group_ids"):
        process_advantages(r, mask, torch.tensor([0, 1]))


# ----------------------------------------------------------------- penalty, KL


def test_schedules() -> None:
    s = linear_decay(start=0.5, floor=0.1, total=100)
    for t in (0, 10, 50, 79, 80, 81, 100, 500):
        assert s(t) == pytest.approx(max(0.1, 0.5 * (1 - t / 100)))
    assert constant(0.3)(12345) == 0.3
    assert make_schedule(0.2)(7) == 0.2
    assert make_schedule("0.25")(7) == 0.25
    assert make_schedule("constant:0.4")(1) == 0.4
    parsed = make_schedule("linear_decay:start=0.5,floor=0.1,total=100")
    assert parsed(60) == pytest.approx(0.2)
    assert make_schedule({"kind": "linear_decay", "total": 10})(5) == pytest.approx(0.25)
    assert make_schedule(lambda t: 2.0 * t)(3) == 6.0
    with pytest.raises(ValueError, match="unknown schedule"):
        make_schedule("cosine:1")
    with pytest.raises(ValueError, match="total"):
        linear_decay(total=0)
    with pytest.raises(ValueError, match="bad arguments"):
        make_schedule({"kind": "constant", "bogus": 1})


def test_shape_with_penalty() -> None:
    adv = torch.tensor([1.0, 2.0])
    pen = torch.tensor([-1.0, 0.5])
    torch.testing.assert_close(shape_with_penalty(adv, pen, 0.5), torch.tensor([1.5, 1.75]))
    torch.testing.assert_close(
        shape_with_penalty(adv, pen, torch.tensor([1.0, 2.0])), torch.tensor([2.0, 1.0])
    )
    with pytest.raises(ValueError, match=r"\(3,\).*\(2,\)"):
        shape_with_penalty(adv, torch.zeros(3), 0.1)
    with pytest.raises(ValueError, match="beta"):
        shape_with_penalty(adv, pen, -1.0)
    with pytest.raises(ValueError, match="penalty holds NaN"):
        shape_with_penalty(adv, torch.tensor([0.0, float("nan")]), 0.1)


def test_kl_k3() -> None:
    logp = torch.tensor([-1.0, -2.0, -0.5])
    ref = torch.tensor([-1.5, -2.0, -0.1])
    d = (ref - logp).double().numpy()
    np.testing.assert_allclose(kl_k3(logp, ref).numpy(), np.exp(d) - d - 1, rtol=1e-6)
    assert kl_k3(logp, ref)[1] == 0 and torch.all(kl_k3(logp, ref) >= 0)
    # unbiased: E_pi[k3] = KL(pi || ref) for categorical distributions
    p = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
    q = torch.tensor([0.4, 0.4, 0.2], dtype=torch.float64)
    expected = float((p * (p / q).log()).sum())
    assert float((p * kl_k3(p.log(), q.log())).sum()) == pytest.approx(expected)
    with pytest.raises(ValueError, match="ref_logp"):
        kl_k3(logp, ref[:2])


def test_grpo_outputs_can_be_whitened_by_a_scheme() -> None:
    adv, _ = group_relative_advantages(torch.tensor([1.0, 2.0, 4.0]), torch.tensor([0, 0, 0]))
    assert not is_whitened(adv)
    torch.testing.assert_close(whiten(adv), adv)  # already mean 0 / std 1 within the group
    adv, _ = group_relative_advantages(
        torch.tensor([1.0, 2.0, 4.0]), torch.tensor([0, 0, 0]), leave_one_out=True
    )
    assert not is_whitened(adv)


def test_zero_std_mask_marks_degenerate_groups() -> None:
    returns = torch.tensor([1.0, 1.0, 2.0, 3.0, 4.0, 9.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 3])
    mask = torch.tensor([True, True, True, True, True, False])
    out = zero_std_mask(returns, groups, mask=mask)
    assert out.tolist() == [True, True, False, False, True, False]
