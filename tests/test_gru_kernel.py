"""The GRU recurrence in numba (:mod:`marl.core.kernels.gru_numba`, ``SeedGRU``'s default on
CPU) against independent references: a numpy float64 loop written from the GRU equations
(forward), torch's numerical Jacobian (``gradcheck``: the hand-derived backward), and
``SeedGRU``'s readable torch loop (``fused=False``, itself bit-equal to ``nn.GRU``:
tests/test_seed_batched.py); and the many-seeds property: seed k's numbers are bit-equal in
a stack of any size."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from marl.core.kernels import gru_numba
from marl.core.seed_batched import SeedGRU, stack_modules

pytestmark = pytest.mark.skipif(not gru_numba.AVAILABLE, reason="numba not importable")


def _numpy_recurrence(gi, w_hh, b_hh, h0, resets):
    """The GRU equations in float64, one seed, row and step at a time."""
    S, L, B, three_h = gi.shape
    H = three_h // 3
    y = np.zeros((S, L, B, H))
    sig = lambda v: 1.0 / (1.0 + np.exp(-v))  # noqa: E731
    for s in range(S):
        for b in range(B):
            h = h0[s, b].astype(np.float64)
            for t in range(L):
                if resets is not None and resets[s, b, t]:
                    h = np.zeros(H)
                gh = w_hh[s].astype(np.float64) @ h + b_hh[s]
                g = gi[s, t, b]
                r = sig(g[:H] + gh[:H])
                z = sig(g[H : 2 * H] + gh[H : 2 * H])
                n = np.tanh(g[2 * H :] + r * gh[2 * H :])
                h = (1.0 - z) * n + z * h
                y[s, t, b] = h
    return y


def _inputs(S, L, B, H, dtype, seed=0, reset_p=0.15):
    g = torch.Generator().manual_seed(seed)
    gi = torch.randn(S, L, B, 3 * H, generator=g, dtype=dtype)
    w = 0.4 * torch.randn(S, 3 * H, H, generator=g, dtype=dtype)
    b = torch.randn(S, 3 * H, generator=g, dtype=dtype)
    h0 = torch.randn(S, B, H, generator=g, dtype=dtype)
    resets = torch.rand(S, B, L, generator=g) < reset_p
    resets[0, 0, min(2, L - 1)] = True  # at least one reset
    return gi, w, b, h0, resets


@pytest.mark.parametrize("with_resets", [True, False])
def test_forward_equals_the_equations_in_float64(with_resets: bool) -> None:
    gi, w, b, h0, resets = _inputs(2, 9, 3, 5, torch.float64)
    resets = resets if with_resets else None
    y = gru_numba.gru_recurrence(gi, w, b, h0, resets)
    ref = _numpy_recurrence(gi.numpy(), w.numpy(), b.numpy(), h0.numpy(),
                            None if resets is None else resets.numpy())  # fmt: skip
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-12, atol=1e-13)


def test_backward_equals_the_numerical_jacobian() -> None:
    gi, w, b, h0, resets = _inputs(2, 5, 2, 3, torch.float64, seed=1, reset_p=0.2)
    args = [t.requires_grad_() for t in (gi, w, b, h0)]
    fn = lambda *a: gru_numba.gru_recurrence(*a, resets)  # noqa: E731
    assert torch.autograd.gradcheck(fn, args, eps=1e-6, atol=1e-8, rtol=1e-6)
    assert torch.autograd.gradcheck(lambda *a: gru_numba.gru_recurrence(*a, None), args)


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
@pytest.mark.parametrize("num_layers", [1, 2])
def test_fused_seed_gru_equals_its_readable_loop(dtype, tol: float, num_layers: int) -> None:
    """The module's outputs and every gradient (input, state, parameters), with resets."""
    torch.manual_seed(2)
    S, B, L, I, H = 3, 5, 23, 7, 16
    gru = stack_modules([nn.GRU(I, H, num_layers, batch_first=True) for _ in range(S)])
    gru = gru.to(dtype)
    x = torch.randn(S, B, L, I, dtype=dtype)
    h0 = torch.randn(S, B, num_layers, H, dtype=dtype)
    resets = torch.rand(S, B, L) < 0.1
    weights = torch.randn(S, B, L, H, dtype=dtype)
    results = []
    for fused in (False, True):
        gru.zero_grad()
        xs, hs = x.clone().requires_grad_(), h0.clone().requires_grad_()
        y, h = gru(xs, hs, resets, fused=fused)
        ((y * weights).sum() + h.square().sum()).backward()
        grads = [p.grad.clone() for p in gru.parameters()]
        results.append([y.detach(), h.detach(), xs.grad, hs.grad, *grads])
    for loop, fused in zip(*results, strict=True):
        scale = loop.abs().max().clamp_min(1.0)
        assert (fused - loop).abs().max() <= tol * scale


def test_seed_k_is_bit_equal_in_a_stack_of_any_size(one_thread) -> None:
    """One torch thread, as tests/test_seed_batched.py: with two, torch's GEMMs of the input
    projection may split their work by the stack's size; the recurrence itself is one thread."""
    torch.manual_seed(3)
    S, B, L, I, H = 5, 4, 17, 6, 12
    grus = [nn.GRU(I, H, batch_first=True) for _ in range(S)]
    x = torch.randn(S, B, L, I)
    resets = torch.rand(S, B, L) < 0.1

    def run(indices):
        gru = stack_modules([grus[i] for i in indices])
        xs = x[indices].clone().requires_grad_()
        y, h = gru(xs, None, resets[indices])
        (y.square().sum() + h.sum()).backward()
        return y.detach(), xs.grad, [p.grad for p in gru.parameters()]

    y_all, gx_all, g_all = run(list(range(S)))
    for k in range(S):
        y_k, gx_k, g_k = run([k])
        assert torch.equal(y_all[k], y_k[0]) and torch.equal(gx_all[k], gx_k[0])
        assert all(torch.equal(a[k], b[0]) for a, b in zip(g_all, g_k, strict=True))


def test_the_default_and_its_switch() -> None:
    """fused by default on CPU float32; ``fused = False`` on the module gives the loop bit
    for bit (so the readable twin stays reachable); a step is always the loop (rollouts
    bit-equal to nn.GRU); float16 falls back to the loop."""
    assert SeedGRU.fused is True
    torch.manual_seed(4)
    nets = [nn.GRU(3, 4, batch_first=True) for _ in range(2)]
    gru = stack_modules(nets)
    x = torch.randn(2, 3, 6, 3)
    with torch.no_grad():
        fused_y, _ = gru(x)
        loop_y, _ = gru(x, fused=False)
        gru.fused = False
        assert torch.equal(gru(x)[0], loop_y)
        gru.fused = True
        assert torch.equal(gru(x)[0], fused_y)
        torch.testing.assert_close(fused_y, loop_y)
        y_step, _ = gru.step(x[:, :, 0])
        for k in range(2):
            ref, _ = nets[k](x[k, :, :1])
            assert torch.equal(y_step[k], ref[:, 0])
        half = stack_modules([n.to(torch.float16) for n in nets])
        y_half, _ = half(x.half())
        assert torch.equal(y_half, half(x.half(), fused=False)[0])


def test_nan_and_inf_go_where_the_equations_send_them() -> None:
    """A diverging run must not be hidden: the compiled exp clamps its argument, so the gates
    pass NaN on explicitly; infinities saturate the gates as torch's do."""
    gi = torch.zeros(1, 3, 1, 6)
    gi[0, 1, 0, 0] = float("nan")  # r gate of unit 0 at step 1
    gi[0, 1, 0, 5] = float("inf")  # n gate of unit 1
    gi[0, 2, 0, 3] = -float("inf")  # z gate of unit 1 at step 2
    w, b, h0 = torch.zeros(1, 6, 2), torch.zeros(1, 6), torch.zeros(1, 1, 2)
    w[0, :, 1] = 0.5  # at step 2 both units read NaN through W_hh (0 * NaN is NaN)
    fused = gru_numba.gru_recurrence(gi, w, b, h0, None)
    with np.errstate(over="ignore", invalid="ignore"):
        ref = torch.from_numpy(
            _numpy_recurrence(gi.numpy(), w.numpy(), b.numpy(), h0.numpy(), None)
        )
    assert torch.isnan(fused[0, 1, 0, 0]) and torch.isnan(fused[0, 2, 0, 0])
    assert torch.equal(torch.isnan(fused), torch.isnan(ref))
    finite = ~torch.isnan(fused)
    assert finite.sum() == 3
    torch.testing.assert_close(fused[finite], ref.float()[finite])
