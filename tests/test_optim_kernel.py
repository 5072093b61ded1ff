"""marl.core.kernels.optim (the fast optimiser step) equals its readable twin, torch's
clip_grad_norm_ + Adam.step(), bit for bit; and a MAPPO update with either is the same."""

from __future__ import annotations

import pytest
import torch
from test_mappo import _cfg

from marl.algos.mappo import MAPPO
from marl.core.kernels.optim import adam_step, clip_grad_norm


@pytest.mark.parametrize("max_norm", [0.5, 100.0, None])
def test_clip_grad_norm_matches_torch(max_norm):
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s)) for s in [(5, 3), (3,), (7, 2, 2)]]
    for p in params:
        p.grad = torch.randn_like(p)
    ref_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for p, q in zip(ref_params, params, strict=True):
        p.grad = q.grad.clone()
    want = torch.nn.utils.clip_grad_norm_(
        ref_params, float("inf") if max_norm is None else max_norm
    )
    got = clip_grad_norm([p.grad for p in params], max_norm)
    assert torch.equal(got, want)
    for p, q in zip(params, ref_params, strict=True):
        assert torch.equal(p.grad, q.grad)
    # mixed dtypes go through torch's grouping: same norm, gradients clipped in place
    mixed = [torch.randn(4, dtype=torch.float64), torch.randn(3)]
    ref_mixed = [torch.nn.Parameter(g.clone()) for g in mixed]
    for p, g in zip(ref_mixed, mixed, strict=True):
        p.grad = g.clone()
    want = torch.nn.utils.clip_grad_norm_(ref_mixed, 1.0)
    assert torch.equal(clip_grad_norm(mixed, 1.0), want)
    for g, p in zip(mixed, ref_mixed, strict=True):
        assert torch.equal(g, p.grad)


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_adam_step_matches_optimizer_step(weight_decay):
    torch.manual_seed(0)
    shapes = [(16, 9), (16,), (3, 16), (3,)]
    a = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    opt_a = torch.optim.Adam(a, lr=3e-3, eps=1e-5, weight_decay=weight_decay, fused=True)
    opt_b = torch.optim.Adam(b, lr=3e-3, eps=1e-5, weight_decay=weight_decay, fused=True)
    for k in range(6):
        for p, q in zip(a, b, strict=True):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
        if k == 3:  # a learning-rate schedule changes the group's lr between steps
            for opt in (opt_a, opt_b):
                opt.param_groups[0]["lr"] = 1e-3
        opt_a.step()
        adam_step(opt_b)  # the first call goes through opt_b.step() (creates the state)
    for p, q in zip(a, b, strict=True):
        assert torch.equal(p, q)
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(opt_a.state[p][key], opt_b.state[q][key])


def test_mappo_updates_equal_with_the_fast_and_the_readable_step():
    results = []
    for fast in (True, False):
        torch.manual_seed(0)
        algo = MAPPO(_cfg(max_grad_norm=0.5, seed=1), None)
        algo.policy_update.fast_step = fast
        metrics = [algo.iteration(0.0) for _ in range(2)]
        results.append((algo, metrics))
    (a, ma), (b, mb) = results
    for x, y in zip(a.policy.parameters(), b.policy.parameters(), strict=True):
        assert torch.equal(x, y)
    for x, y in zip(a.critic.parameters(), b.critic.parameters(), strict=True):
        assert torch.equal(x, y)
    assert [m["grad_norm"] for m in ma] == [m["grad_norm"] for m in mb]
