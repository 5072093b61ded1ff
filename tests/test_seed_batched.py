"""marl.core.seed_batched against per-seed references (issue 37's foundation layer).

Two kinds of check:

- against independent per-seed references: S plain torch modules (``nn.Linear``,
  ``nn.GRU``, the backbones of ``seqmodels.backbones``), ``torch.nn.utils.clip_grad_norm_``,
  S separate ``torch.optim.Adam``, a numpy float64 whitening loop; float32 results must agree
  to a tight tolerance (bit-equality with the plain modules is pinned only where noted);
- the property the many-seeds trainer rests on: seed k's results are *bit-equal* whether
  seed k is computed in a stack of 16 seeds or in a stack of one (``--seeds 0-15`` vs
  ``--seeds k``). These run on one torch thread, the setting of the many-seeds benchmark
  (``one_thread`` fixture); with two threads the GEMMs may split differently by batch size
  (see ``test_two_threads_report``, which records what holds and asserts nothing about bits).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from marl.core.losses import ppo_surrogate
from marl.core.seed_batched import (
    SeedGRU,
    SeedLinear,
    SeedMLP,
    SeedViews,
    clip_grad_norm_per_seed_,
    per_seed_grad_norm,
    run_seed_mlp,
    seed_group_key,
    stack_modules,
    unstack,
    whiten_per_seed,
)
from marl.core.whitening import RunningMoments, group_moments, whiten
from seqmodels.backbones import GRUBackbone, MLPBackbone

RTOL, ATOL = 1e-5, 1e-6


def actor_torso(obs_dim: int, hidden: int, n_actions: int, activation: str) -> nn.Sequential:
    """A feed-forward actor as the project builds it: MLPBackbone's layers, then a head."""
    backbone = MLPBackbone(obs_dim, hidden, num_layers=2, activation=activation)
    return nn.Sequential(*backbone.net, nn.Linear(hidden, n_actions))


def grads_of(module: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in module.parameters()]


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL)


# ------------------------------------------------------------------------------------------
# layers against per-seed torch modules
# ------------------------------------------------------------------------------------------


def test_seed_linear_matches_per_seed_linear(one_thread) -> None:
    torch.manual_seed(0)
    S, N, D, O = 5, 33, 13, 7
    layers = [nn.Linear(D, O) for _ in range(S)]
    stacked = stack_modules(layers)
    assert isinstance(stacked, SeedLinear)
    x = torch.randn(S, N, D, requires_grad=True)
    upstream = torch.randn(S, N, O)
    y = stacked(x)
    (y * upstream).sum().backward()
    for k in range(S):
        xk = x.detach()[k].clone().requires_grad_()
        yk = layers[k](xk)
        (yk * upstream[k]).sum().backward()
        # float32 rounding: the batched GEMM need not block the sums as addmm's does (bit-
        # equal for 64-wide layers on this machine, not for every shape), and autograd's bmm
        # backward multiplies x^T @ grad where addmm's takes (grad^T @ x)^T
        assert_close(y[k], yk)
        assert_close(x.grad[k], xk.grad)
        assert_close(stacked.bias.grad[k], layers[k].bias.grad)
        assert_close(stacked.weight.grad[k], layers[k].weight.grad)


def test_seed_linear_leading_dims_and_no_bias() -> None:
    torch.manual_seed(1)
    layers = [nn.Linear(4, 3, bias=False) for _ in range(2)]
    stacked = SeedLinear.from_modules(layers)
    x = torch.randn(2, 5, 6, 4)
    y = stacked(x)
    assert y.shape == (2, 5, 6, 3)
    for k in range(2):
        assert_close(y[k], layers[k](x[k]))
    direct = SeedLinear(torch.randn(3, 2, 4), torch.zeros(3, 2))
    assert (direct.num_seeds, direct.out_features, direct.in_features) == (3, 2, 4)
    with pytest.raises(ValueError, match="bias must have shape"):
        SeedLinear(torch.randn(3, 2, 4), torch.zeros(2))


@pytest.mark.parametrize("activation", ["tanh", "relu", "silu", "gelu"])
def test_seed_mlp_matches_per_seed_actor(one_thread, activation: str) -> None:
    torch.manual_seed(2)
    S, N, D, H, A = 4, 96, 11, 64, 5
    nets = [actor_torso(D, H, A, activation) for _ in range(S)]
    stacked = stack_modules(nets)
    assert isinstance(stacked, SeedMLP)
    x = torch.randn(S, N, D, requires_grad=True)
    stacked(x).sin().sum().backward()
    for k in range(S):
        xk = x.detach()[k].clone().requires_grad_()
        out = nets[k](xk)
        out.sin().sum().backward()
        # forward, input gradient and every parameter's gradient to float32 rounding (the
        # forward is bit-equal here except with silu, which SeedMLP computes through exp;
        # the head's weight gradient may differ in the last bits: autograd's bmm backward
        # multiplies in the other orientation than addmm's)
        assert_close(stacked(x.detach())[k], out.detach())
        assert_close(x.grad[k], xk.grad)
        for p_stacked, p in zip(stacked.parameters(), nets[k].parameters(), strict=True):
            assert_close(p_stacked.grad[k], p.grad)


def test_seed_mlp_refuses_layers_with_parameters() -> None:
    nets = [nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4)) for _ in range(2)]
    with pytest.raises(TypeError, match="LayerNorm"):
        stack_modules(nets)
    with pytest.raises(TypeError, match="same type|one type"):
        stack_modules([nn.Linear(2, 2), nn.GRU(2, 2)])
    with pytest.raises(TypeError, match="cannot stack"):
        stack_modules([nn.Conv1d(1, 1, 1)])


@pytest.mark.parametrize("num_layers", [1, 2])
def test_seed_gru_matches_nn_gru(one_thread, num_layers: int) -> None:
    torch.manual_seed(3)
    S, B, L, I, H = 4, 7, 6, 13, 24
    grus = [nn.GRU(I, H, num_layers, batch_first=True) for _ in range(S)]
    stacked = stack_modules(grus)
    assert isinstance(stacked, SeedGRU)
    stacked.fused = False  # the readable loop (the numba recurrence: tests/test_gru_kernel.py)
    x = torch.randn(S, B, L, I, requires_grad=True)
    h0 = torch.randn(S, B, num_layers, H, requires_grad=True)
    y, h = stacked(x, h0)
    assert y.shape == (S, B, L, H) and h.shape == (S, B, num_layers, H)
    (y.square().sum() + h.sum()).backward()
    for k in range(S):
        xk = x.detach()[k].clone().requires_grad_()
        hk0 = h0.detach()[k].transpose(0, 1).contiguous().requires_grad_()  # [layers, B, H]
        yk, hk = grus[k](xk, hk0)
        (yk.square().sum() + hk.sum()).backward()
        # bit-equal on this machine: the same GEMMs and the same row-wise gate operations
        # in the same order as torch's CPU GRU (time-major input projection included)
        assert torch.equal(y[k], yk)
        assert torch.equal(h[k], hk.transpose(0, 1))
        assert torch.equal(x.grad[k], xk.grad)
        assert torch.equal(h0.grad[k], hk0.grad.transpose(0, 1))
        for name in stacked._param_names():
            assert torch.equal(getattr(stacked, name).grad[k], getattr(grus[k], name).grad)


def test_seed_gru_resets_match_gru_backbone(one_thread) -> None:
    """The project's recurrent policy (GRUBackbone: proj, activation, nn.GRU, state zeroed at
    episode starts) per seed vs its stacked parts (SeedMLP proj, SeedGRU with resets)."""
    torch.manual_seed(4)
    S, B, L, D, H = 3, 5, 9, 6, 16
    backbones = [GRUBackbone(D, H, num_layers=2, activation="tanh") for _ in range(S)]
    proj = stack_modules([b.proj for b in backbones])
    gru = stack_modules([b.gru for b in backbones])
    gru.fused = False  # the readable loop, bit-equal to nn.GRU
    x = torch.randn(S, B, L, D, requires_grad=True)
    h0 = torch.randn(S, B, 2, H)
    resets = torch.rand(S, B, L) < 0.25
    resets[:, 0, 3] = True  # a reset in every seed
    y, h = gru(proj(x), h0, resets)
    y.square().sum().backward()
    for k in range(S):
        xk = x.detach()[k].clone().requires_grad_()
        yk, (hk,) = backbones[k](xk, (h0[k],), resets[k])
        yk.square().sum().backward()
        # the backbone cuts the window at reset steps: the same values, the input
        # projection's gradient summed per segment (rounding may differ)
        assert torch.equal(y[k], yk.detach())
        assert torch.equal(h[k], hk.detach())
        assert_close(x.grad[k], xk.grad)
        for name in gru._param_names():
            assert_close(getattr(gru, name).grad[k], getattr(backbones[k].gru, name).grad)
    # one rollout step: reset [S, B]
    step_in, reset = torch.randn(S, B, D), torch.tensor([[True, False] * 2 + [True]] * S)
    with torch.no_grad():
        y_step, h_step = gru.step(proj(step_in), h0, reset)
        for k in range(S):
            yk, (hk,) = backbones[k].step(step_in[k], (h0[k],), reset[k])
            assert torch.equal(y_step[k], yk) and torch.equal(h_step[k], hk)


def test_stack_unstack_round_trip() -> None:
    torch.manual_seed(5)
    for modules in (
        [nn.Linear(3, 4) for _ in range(3)],
        [actor_torso(5, 8, 2, "relu") for _ in range(3)],
        [nn.GRU(4, 6, 2, batch_first=True) for _ in range(3)],
    ):
        originals = copy.deepcopy(modules)
        back = unstack(stack_modules(modules))
        assert len(back) == 3
        for m, b in zip(originals, back, strict=True):
            assert type(m) is type(b)
            sd_m, sd_b = m.state_dict(), b.state_dict()
            assert sd_m.keys() == sd_b.keys()
            assert all(torch.equal(sd_m[key], sd_b[key]) for key in sd_m)
    with pytest.raises(TypeError, match="unstack takes"):
        unstack(nn.Linear(2, 2))


# ------------------------------------------------------------------------------------------
# the key property: a seed's results do not depend on the other seeds in the stack
# ------------------------------------------------------------------------------------------


def run_stack(modules: list[nn.Module], x: torch.Tensor, loss) -> tuple:
    stacked = stack_modules(modules)
    x = x.clone().requires_grad_()
    out = stacked(x)
    loss(out).backward()
    out = out[0] if isinstance(out, tuple) else out
    return out.detach(), x.grad, [p.grad for p in stacked.parameters()]


ACTIVATIONS = ["tanh", "relu", "silu", "gelu"]


@pytest.mark.parametrize(
    "kind",
    [f"mlp-{a}" for a in ACTIVATIONS] + [f"mlp-{a}-odd" for a in ACTIVATIONS] + ["gru", "gru-odd"],
)
def test_seed_result_independent_of_stack_size(one_thread, kind: str) -> None:
    """Seed k computed in a stack of 16 == seed k computed alone (a stack of one), forward
    and every gradient, bit for bit. ``-odd``: widths and row counts that are no multiple
    of the vector width (the scalar tails of elementwise kernels fall elsewhere); the GRUs
    have two layers and episode resets."""
    torch.manual_seed(6)
    S = 16
    if kind.startswith("mlp"):
        activation = kind.split("-")[1]
        N, D, H, A = (7, 13, 24, 5) if kind.endswith("odd") else (128, 20, 64, 5)
        modules = [actor_torso(D, H, A, activation) for _ in range(S)]
        inputs = torch.randn(S, N, D)

        def loss(out):
            return out.sin().sum()

        def run(stacked, x, seeds):
            return stacked(x)
    else:
        B, L, I, H = (7, 5, 13, 24) if kind.endswith("odd") else (64, 8, 64, 64)
        modules = [nn.GRU(I, H, 2, batch_first=True) for _ in range(S)]
        inputs = torch.randn(S, B, L, I)
        resets = torch.rand(S, B, L) < 0.2

        def loss(out):
            return out[0].square().sum() + out[1].sum()

        def run(stacked, x, seeds):
            return stacked(x, None, resets[seeds])

    def results(seeds: slice):
        stacked = stack_modules(modules[seeds])
        x = inputs[seeds].clone().requires_grad_()
        out = run(stacked, x, seeds)
        loss(out).backward()
        out = out[0] if isinstance(out, tuple) else out
        return out.detach(), x.grad, [p.grad for p in stacked.parameters()]

    y, gx, gp = results(slice(None))
    for k in range(S):
        y1, gx1, gp1 = results(slice(k, k + 1))
        assert torch.equal(y[k], y1[0]), f"seed {k}: forward differs"
        assert torch.equal(gx[k], gx1[0]), f"seed {k}: input gradient differs"
        for i, (g, g1) in enumerate(zip(gp, gp1, strict=True)):
            assert torch.equal(g[k], g1[0]), f"seed {k}: gradient of parameter {i} differs"


def test_two_threads_report(capsys) -> None:
    """With two torch threads: does the S=16 vs S=1 bit-equality still hold? Recorded (the
    many-seeds runs use one thread per process); only closeness is asserted."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        torch.manual_seed(7)
        report = {}
        cases = {
            "mlp 64-wide, 512 rows": (
                [actor_torso(20, 64, 5, "tanh") for _ in range(16)],
                torch.randn(16, 512, 20),
                lambda out: out.sin().sum(),
            ),
            "gru 64 rows, hidden 64": (
                [nn.GRU(64, 64, 1, batch_first=True) for _ in range(16)],
                torch.randn(16, 64, 4, 64),
                lambda out: out[0].square().sum(),
            ),
            "gru 7 rows, hidden 24": (
                [nn.GRU(13, 24, 1, batch_first=True) for _ in range(16)],
                torch.randn(16, 7, 4, 13),
                lambda out: out[0].square().sum(),
            ),
        }
        for name, (modules, x, loss) in cases.items():
            y, gx, gp = run_stack(modules, x, loss)
            equal = True
            for k in range(16):
                y1, gx1, gp1 = run_stack(modules[k : k + 1], x[k : k + 1], loss)
                assert_close(y[k], y1[0])
                equal &= torch.equal(y[k], y1[0]) and torch.equal(gx[k], gx1[0])
                equal &= all(torch.equal(g[k], g1[0]) for g, g1 in zip(gp, gp1, strict=True))
            report[name] = equal
        with capsys.disabled():
            print(f"\n[two threads] S=16 vs S=1 bit-equal: {report}")
    finally:
        torch.set_num_threads(before)


# ------------------------------------------------------------------------------------------
# per-seed clipping, optimiser, step mask
# ------------------------------------------------------------------------------------------


def fill_grads(params: list[nn.Parameter], scales: torch.Tensor) -> None:
    """Random gradients, seed s's scaled by ``scales[s]`` (so some seeds clip, some not)."""
    for p in params:
        g = torch.randn_like(p)
        p.grad = g * scales.view(-1, *([1] * (p.dim() - 1)))


def test_per_seed_clip_matches_clip_grad_norm(one_thread) -> None:
    torch.manual_seed(8)
    S = 6
    stacked = stack_modules([actor_torso(9, 32, 4, "tanh") for _ in range(S)])
    params = list(stacked.parameters())
    fill_grads(params, torch.tensor([0.001, 0.01, 0.1, 1.0, 10.0, 100.0]))
    per_seed = [[p.grad[k].clone() for p in params] for k in range(S)]
    norms = per_seed_grad_norm(params)
    returned = clip_grad_norm_per_seed_(params, max_norm=0.5)
    assert torch.equal(norms, returned)
    for k in range(S):
        leaves = [nn.Parameter(torch.zeros_like(g)) for g in per_seed[k]]
        for leaf, g in zip(leaves, per_seed[k], strict=True):
            leaf.grad = g
        ref_norm = nn.utils.clip_grad_norm_(leaves, max_norm=0.5)
        assert torch.equal(norms[k], ref_norm)  # bit-equal on this machine
        for p, leaf in zip(params, leaves, strict=True):
            assert torch.equal(p.grad[k], leaf.grad)
    # no clipping: norms only, gradients untouched
    before = [p.grad.clone() for p in params]
    clip_grad_norm_per_seed_(params, None)
    assert all(torch.equal(p.grad, b) for p, b in zip(params, before, strict=True))


@pytest.mark.parametrize("num_params", [3, 20, 33])
def test_per_seed_norm_of_a_seed_is_its_norm_alone(one_thread, num_params) -> None:
    """Seed k's total norm inside a stack of S is bit-equal to the same seed in a stack of
    one (``--seeds k`` alone), and equal to a float64 reference within float32 rounding.
    With a reduction across the seed axis, seed k's norm differed from its norm alone in
    the last bits from about 20 parameters on (issue 46)."""
    torch.manual_seed(num_params)
    S = 5
    shapes = [(7, 3), (11,), (4, 5, 2)]
    params = [nn.Parameter(torch.zeros(S, *shapes[i % len(shapes)])) for i in range(num_params)]
    fill_grads(params, torch.tensor([0.3, 1.0, 3.0, 10.0, 30.0]))
    norms = per_seed_grad_norm(params)
    for k in range(S):
        alone = [nn.Parameter(p[k : k + 1].detach().clone()) for p in params]
        for leaf, p in zip(alone, params, strict=True):
            leaf.grad = p.grad[k : k + 1].clone()
        assert torch.equal(per_seed_grad_norm(alone)[0], norms[k])
        reference = np.sqrt(sum(float((p.grad[k].double() ** 2).sum()) for p in params))
        assert float(norms[k]) == pytest.approx(reference, rel=1e-6)
    clipped = [nn.Parameter(p.detach().clone()) for p in params]
    for leaf, p in zip(clipped, params, strict=True):
        leaf.grad = p.grad.clone()
    clip_grad_norm_per_seed_(clipped, max_norm=1.0)
    for k in range(S):
        alone = [nn.Parameter(p[k : k + 1].detach().clone()) for p in params]
        for leaf, p in zip(alone, params, strict=True):
            leaf.grad = p.grad[k : k + 1].clone()
        clip_grad_norm_per_seed_(alone, max_norm=1.0)  # binds for every seed here
        for leaf, c in zip(alone, clipped, strict=True):
            assert torch.equal(leaf.grad[0], c.grad[k])


def test_per_seed_clip_keeps_a_non_finite_seed_to_itself() -> None:
    torch.manual_seed(9)
    params = [nn.Parameter(torch.zeros(3, 4, 5)), nn.Parameter(torch.zeros(3, 4))]
    fill_grads(params, torch.ones(3))
    params[0].grad[1, 2, 3] = float("nan")
    clean = [p.grad.clone() for p in params]
    norms = clip_grad_norm_per_seed_(params, max_norm=1.0)
    assert torch.isnan(norms[1]) and torch.isfinite(norms[[0, 2]]).all()
    for k in (0, 2):
        coef = min(1.0 / (float(norms[k]) + 1e-6), 1.0)
        for p, c in zip(params, clean, strict=True):
            assert_close(p.grad[k], c[k] * coef)


@pytest.mark.parametrize("impl", ["fused", "foreach", "for-loop"])
def test_stacked_adam_equals_separate_adams(one_thread, impl: str) -> None:
    """A stock Adam over the stacked parameters is elementwise: seed k's slice follows seed
    k's own Adam (while every seed steps); bit for bit with the foreach and for-loop
    implementations, to float32 rounding with the fused one, whose vector and scalar-tail
    arithmetic differ in the last bit and whose tails fall elsewhere in a stack (Adam over
    :class:`SeedViews` is bit-equal with fused too: one tensor per seed)."""
    torch.manual_seed(10)
    S = 5
    kw = {"fused": {"fused": True}, "foreach": {"foreach": True}, "for-loop": {"foreach": False}}
    stacked = stack_modules([actor_torso(7, 24, 3, "tanh") for _ in range(S)])
    separate = [list(m.parameters()) for m in unstack(stacked)]
    opt = torch.optim.Adam(stacked.parameters(), lr=1e-2, eps=1e-5, **kw[impl])
    opts = [torch.optim.Adam(ps, lr=1e-2, eps=1e-5, **kw[impl]) for ps in separate]
    for _ in range(4):
        fill_grads(list(stacked.parameters()), torch.ones(S))
        for k in range(S):
            for p, ps in zip(stacked.parameters(), separate[k], strict=True):
                ps.grad = p.grad[k].clone()
            opts[k].step()
        opt.step()
    for k in range(S):
        for p, ps in zip(stacked.parameters(), separate[k], strict=True):
            if impl == "fused":
                assert_close(p.detach()[k], ps.detach())
            else:
                assert torch.equal(p.detach()[k], ps.detach())


def test_seed_views_step_mask_leaves_stopped_seeds_unchanged(one_thread) -> None:
    """Adam over SeedViews: masked-out seeds keep parameters and optimiser state exactly (step
    count included); the others follow their own single-seed Adam, which skipped nothing."""
    torch.manual_seed(11)
    S = 4
    stacked = stack_modules([actor_torso(7, 24, 3, "tanh") for _ in range(S)])
    views = SeedViews(stacked.parameters())
    opt = torch.optim.Adam(views.parameters(), lr=1e-2, eps=1e-5, fused=True)
    separate = [list(m.parameters()) for m in unstack(stacked)]
    opts = [torch.optim.Adam(ps, lr=1e-2, eps=1e-5, fused=True) for ps in separate]
    masks = [[1, 1, 1, 1], [1, 0, 1, 1], [1, 0, 0, 1], [1, 1, 0, 1], [0, 1, 1, 1]]
    for mask in masks:
        views.zero_grad()
        fill_grads(views.stacked, torch.ones(S))
        params_before = [p.detach().clone() for p in views.stacked]
        state_before = {id(v): copy.deepcopy(opt.state.get(v, {})) for v in views.parameters()}
        views.attach_grads(torch.tensor(mask, dtype=torch.bool))
        opt.step()
        for k in range(S):
            if mask[k]:
                for p, ps in zip(views.stacked, separate[k], strict=True):
                    ps.grad = p.grad[k].clone()
                opts[k].step()
                continue
            for p, before in zip(views.stacked, params_before, strict=True):
                assert torch.equal(p.detach()[k], before[k])
            for v in views.per_seed[k]:
                now, then = opt.state.get(v, {}), state_before[id(v)]
                assert now.keys() == then.keys()
                assert all(torch.equal(now[key], then[key]) for key in now)
    for k in range(S):
        for p, ps in zip(views.stacked, separate[k], strict=True):
            assert torch.equal(p.detach()[k], ps.detach())
        # per-seed step counts: 5 steps minus that seed's masked ones
        steps = int(opt.state[views.per_seed[k][0]]["step"])
        assert steps == sum(m[k] for m in masks)
        # the seed's share of the optimiser loads into a single-seed Adam and matches
        single = torch.optim.Adam(separate[k], lr=1e-2, eps=1e-5, fused=True)
        single.load_state_dict(views.seed_state_dict(opt, k))
        ref = opts[k].state_dict()["state"]
        got = single.state_dict()["state"]
        assert ref.keys() == got.keys()
        for i in ref:
            assert all(torch.equal(ref[i][key], got[i][key]) for key in ref[i])


def test_seed_views_alias_the_stack() -> None:
    stacked = stack_modules([nn.Linear(4, 2) for _ in range(3)])
    views = SeedViews(stacked.parameters())
    with torch.no_grad():
        views.per_seed[2][0].add_(1.0)
    assert torch.equal(stacked.weight[2], views.per_seed[2][0])
    with pytest.raises(ValueError, match="one entry per seed"):
        views.attach_grads(torch.ones(2, dtype=torch.bool))


# ------------------------------------------------------------------------------------------
# one update, many seeds: the PPO actor step of the probe
# ------------------------------------------------------------------------------------------


def ppo_actor_loss(logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Clipped-surrogate loss with entropy bonus per seed: logits ``[S, N, A]`` -> ``[S]``
    (or ``[N, A]`` -> ``[]`` for one plain seed); the mean over the rows of each seed."""
    log_probs = torch.log_softmax(logits, dim=-1)
    logp = log_probs.gather(-1, batch["actions"].unsqueeze(-1)).squeeze(-1)
    surrogate, _ = ppo_surrogate(logp, batch["old_logp"], batch["advantages"])
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return -(surrogate + 0.01 * entropy).mean(dim=-1)


def make_batches(S: int, steps: int, N: int, D: int, A: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(12)
    return [
        {
            "obs": torch.randn(S, N, D, generator=g),
            "actions": torch.randint(0, A, (S, N), generator=g),
            "old_logp": torch.full((S, N), -float(np.log(A)))
            + 0.1 * torch.randn(S, N, generator=g),
            "advantages": torch.randn(S, N, generator=g),
        }
        for _ in range(steps)
    ]


def batched_update(nets, batches, max_norm, seeds: slice) -> list[torch.Tensor]:
    """``steps`` updates of the stacked actors of ``seeds``: zero_grad, backward of the
    summed per-seed losses, per-seed clip, views Adam step; returns the stacked parameters."""
    stacked = stack_modules(nets[seeds])
    views = SeedViews(stacked.parameters())
    opt = torch.optim.Adam(views.parameters(), lr=3e-3, eps=1e-5, fused=True)
    for batch in batches:
        part = {key: value[seeds] for key, value in batch.items()}
        views.zero_grad()
        losses = ppo_actor_loss(stacked(part["obs"]), part)
        losses.sum().backward()
        norms = clip_grad_norm_per_seed_(views.stacked, max_norm)
        views.attach_grads(torch.isfinite(norms))
        opt.step()
    return [p.detach() for p in stacked.parameters()]


def test_batched_ppo_update_equals_per_seed_updates(one_thread) -> None:
    torch.manual_seed(13)
    S, N, D, H, A = 6, 128, 10, 64, 5
    nets = [actor_torso(D, H, A, "tanh") for _ in range(S)]
    batches = make_batches(S, 4, N, D, A)
    stacked = batched_update(nets, batches, 0.5, slice(None))
    for k in range(S):
        # the same seed alone in a stack: bit-equal
        alone = batched_update(nets, batches, 0.5, slice(k, k + 1))
        assert all(torch.equal(p[k], q[0]) for p, q in zip(stacked, alone, strict=True))
        # the plain single-seed update (nn modules, clip_grad_norm_, Adam): float32 rounding
        net = copy.deepcopy(nets[k])
        opt = torch.optim.Adam(net.parameters(), lr=3e-3, eps=1e-5, fused=True)
        for batch in batches:
            part = {key: value[k] for key, value in batch.items()}
            opt.zero_grad()
            ppo_actor_loss(net(part["obs"]), part).backward()
            nn.utils.clip_grad_norm_(net.parameters(), 0.5)
            opt.step()
        for p, q in zip(stacked, net.parameters(), strict=True):
            torch.testing.assert_close(p[k], q.detach(), rtol=1e-4, atol=1e-5)


def test_non_finite_seed_stops_alone(one_thread) -> None:
    """A NaN in one seed's batch: that seed's gradients and norm are NaN, the others' are those
    of a clean run bit for bit; with the step mask the NaN seed is left unchanged."""
    torch.manual_seed(14)
    S, N, D, H, A = 4, 64, 10, 64, 5
    nets = [actor_torso(D, H, A, "tanh") for _ in range(S)]
    batch = make_batches(S, 1, N, D, A)[0]
    poisoned = {key: value.clone() for key, value in batch.items()}
    poisoned["obs"][2, 5, 1] = float("nan")
    results = []
    for data in (batch, poisoned):
        stacked = stack_modules(nets)
        views = SeedViews(stacked.parameters())
        opt = torch.optim.Adam(views.parameters(), lr=3e-3, eps=1e-5)
        losses = ppo_actor_loss(stacked(data["obs"]), data)
        losses.sum().backward()
        norms = clip_grad_norm_per_seed_(views.stacked, 0.5)
        views.attach_grads(torch.isfinite(norms))
        opt.step()
        results.append((losses.detach(), norms, [p.detach().clone() for p in views.stacked]))
    (clean_loss, clean_norms, clean_params), (loss, norms, params) = results
    assert torch.isnan(loss[2]) and torch.isnan(norms[2])
    keep = [0, 1, 3]
    assert torch.equal(loss[keep], clean_loss[keep]) and torch.equal(norms[keep], clean_norms[keep])
    original = [p.detach() for p in stack_modules(nets).parameters()]
    for p, clean, start in zip(params, clean_params, original, strict=True):
        assert torch.equal(p[keep], clean[keep])
        assert torch.equal(p[2], start[2])


# ------------------------------------------------------------------------------------------
# per-seed whitening: the seed folded into the group key
# ------------------------------------------------------------------------------------------


def ref_whiten_per_seed(x, mask, group, eps=1e-8) -> np.ndarray:
    """numpy float64: for each seed, for each group id of that seed, population whitening."""
    x, mask, group = (np.asarray(a) for a in (x, mask, group))
    out = np.zeros(x.shape, np.float64)
    for s in range(x.shape[0]):
        xs, ms, gs = x[s].astype(np.float64), mask[s], group[s]
        for g in np.unique(gs[ms]):
            sel = ms & (gs == g)
            v = xs[sel]
            if v.size > 1 and v.std() > 0:
                out[s][sel] = (v - v.mean()) / (v.std() + eps)
    return out


@pytest.fixture(params=["numba", "torch"])
def whiten_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("MARL_WHITEN_BACKEND", request.param)
    return request.param


def test_whiten_per_seed_matches_reference(whiten_backend: str) -> None:
    """Advantages ``[S, T, E, A]``, grouped by agent type (shared by the seeds) with padding
    ids -1 at masked-out entries: one whitening call == each seed whitened alone."""
    g = torch.Generator().manual_seed(15)
    S, T, E, A = 5, 16, 4, 3
    x = torch.randn(S, T, E, A, generator=g) * torch.tensor([0.1, 1.0, 3.0, 10.0, 50.0]).view(
        S, 1, 1, 1
    ) + torch.arange(S).view(S, 1, 1, 1)
    mask = torch.rand(S, T, E, A, generator=g) > 0.2
    type_id = torch.tensor([0, 0, 1])  # [A]: agents 0, 1 of type 0, agent 2 of type 1
    group = torch.where(mask, type_id.expand(S, T, E, A), -1)
    x = torch.where(mask, x, float("nan"))  # padding never read
    key = seed_group_key(x, group, num_groups=2)
    assert key.shape == (S, T, E, A) and int(key[~mask].max()) == -1
    out = whiten(x, mask=mask, group=key)
    assert torch.equal(out, whiten_per_seed(x, mask=mask, group=group, num_groups=2))
    expected = ref_whiten_per_seed(torch.nan_to_num(x).numpy(), mask.numpy(), group.numpy())
    np.testing.assert_allclose(out.double().numpy(), expected, rtol=1e-6, atol=1e-6)
    for s in range(S):  # and bit-equal to whitening seed s alone with its own group ids
        alone = whiten(x[s], mask=mask[s], group=group[s])
        assert torch.equal(out[s], alone)


def test_whiten_per_seed_one_group_per_seed(whiten_backend: str) -> None:
    g = torch.Generator().manual_seed(16)
    x = torch.randn(3, 50, generator=g) * torch.tensor([[1.0], [100.0], [0.01]])
    out = whiten_per_seed(x)
    expected = ref_whiten_per_seed(x.numpy(), np.ones(x.shape, bool), np.zeros(x.shape, int))
    np.testing.assert_allclose(out.double().numpy(), expected, rtol=1e-6, atol=1e-6)
    for s in range(3):
        assert_close(out[s], whiten(x[s]))


def test_running_moments_per_seed() -> None:
    """RunningMoments with S * G groups (seed folded in) == S RunningMoments of G groups."""
    g = torch.Generator().manual_seed(17)
    S, G = 3, 2
    batched = RunningMoments(S * G)
    alone = [RunningMoments(G) for _ in range(S)]
    for _ in range(4):
        x = torch.randn(S, 40, generator=g) * 3 + torch.arange(S).view(S, 1)
        group = torch.randint(0, G, (S, 40), generator=g)
        batched.update(x, group=seed_group_key(x, group, num_groups=G))
        for s in range(S):
            alone[s].update(x[s], group=group[s])
    for s in range(S):
        torch.testing.assert_close(batched.mean[s * G : (s + 1) * G], alone[s].mean)
        torch.testing.assert_close(batched.var[s * G : (s + 1) * G], alone[s].var)
        assert torch.equal(batched.count[s * G : (s + 1) * G], alone[s].count)
    moments = group_moments(x, group=seed_group_key(x, group, num_groups=G), num_groups=S * G)
    assert moments.mean.shape == (S * G,)


@pytest.mark.parametrize("activation", ["tanh", "silu", "gelu"])
def test_run_seed_mlp_is_the_module_call(one_thread, activation: str) -> None:
    """The rollout's fast path computes what the module calls compute, bit for bit."""
    torch.manual_seed(8)
    nets = [actor_torso(11, 32, 5, activation) for _ in range(3)]
    stacked = stack_modules(nets)
    x = torch.randn(3, 40, 11)
    assert torch.equal(run_seed_mlp(stacked, x), stacked(x))
    head = stack_modules([net[-1] for net in nets])
    h = torch.randn(3, 40, 32)
    assert torch.equal(run_seed_mlp(head, h), head(h))
    no_bias = SeedLinear(torch.randn(3, 4, 32))
    assert torch.equal(run_seed_mlp(no_bias, h), no_bias(h))
