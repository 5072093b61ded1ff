"""Episode resets of seqmodels.Mamba / Mamba2 against an independent numpy step loop, and the
edge cases of issue 19: non-finite values before a reset, batch size 0, input dtypes.

The numpy loop (float64) is written from mamba-ssm's step semantics (``mamba_simple.py`` /
``mamba2.py`` ``step``) and shares no code with seqmodels: the conv window is an explicit array
of the last d_conv inputs, and a reset *assigns* zeros to that row's window and SSM state.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from seqmodels import Mamba, Mamba2
from seqmodels.kernels import numba_ops

F64 = torch.float64
CPU_BACKENDS = ["reference", "chunked", "numba"]
D_MODEL, D_CONV = 6, 4


def _silu(v: np.ndarray) -> np.ndarray:
    return v / (1.0 + np.exp(-v))


def _softplus(v: np.ndarray) -> np.ndarray:
    return np.where(v > 20.0, v, np.log1p(np.exp(np.minimum(v, 20.0))))


def _params(m: torch.nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().double().numpy() for k, v in m.state_dict().items()}


def np_mamba_run(m: Mamba, x: np.ndarray, resets: np.ndarray, state=None):
    """Mamba step by step: x [B, L, d_model], resets [B, L] -> (y [B, L, d_model], state)."""
    p = _params(m)
    batch, length, _ = x.shape
    d_inner, d_state, rank = m.d_inner, m.d_state, m.dt_rank
    window = np.zeros((batch, d_inner, m.d_conv)) if state is None else state[0].copy()
    h = np.zeros((batch, d_inner, d_state)) if state is None else state[1].copy()
    A = -np.exp(p["A_log"])
    ys = np.zeros((batch, length, m.d_model))
    for t in range(length):
        window[resets[:, t]] = 0.0
        h[resets[:, t]] = 0.0
        xz = x[:, t] @ p["in_proj.weight"].T
        window = np.concatenate([window[:, :, 1:], xz[:, :d_inner, None]], axis=2)
        u = _silu((window * p["conv1d.weight"][:, 0, :]).sum(-1) + p["conv1d.bias"])
        dbl = u @ p["x_proj.weight"].T
        dt, Bt, Ct = dbl[:, :rank], dbl[:, rank : rank + d_state], dbl[:, rank + d_state :]
        delta = _softplus(dt @ p["dt_proj.weight"].T + p["dt_proj.bias"])
        h = np.exp(delta[:, :, None] * A) * h + (delta * u)[:, :, None] * Bt[:, None, :]
        y = (h * Ct[:, None, :]).sum(-1) + p["D"] * u
        ys[:, t] = (y * _silu(xz[:, d_inner:])) @ p["out_proj.weight"].T
    return ys, (window, h)


def np_mamba2_run(m: Mamba2, x: np.ndarray, resets: np.ndarray, state=None):
    """Mamba2 (d_ssm = d_inner, rmsnorm, norm after the gate) step by step."""
    p = _params(m)
    batch, length, _ = x.shape
    H, P, G, N = m.nheads, m.headdim, m.ngroups, m.d_state
    d_ssm, conv_dim = m.d_ssm, m.conv_dim
    window = np.zeros((batch, conv_dim, m.d_conv)) if state is None else state[0].copy()
    h = np.zeros((batch, H, P, N)) if state is None else state[1].copy()
    A = -np.exp(p["A_log"])
    ys = np.zeros((batch, length, m.d_model))
    for t in range(length):
        window[resets[:, t]] = 0.0
        h[resets[:, t]] = 0.0
        zxbcdt = x[:, t] @ p["in_proj.weight"].T
        z, xBC, dt = (
            zxbcdt[:, :d_ssm],
            zxbcdt[:, d_ssm : d_ssm + conv_dim],
            zxbcdt[:, d_ssm + conv_dim :],
        )
        window = np.concatenate([window[:, :, 1:], xBC[:, :, None]], axis=2)
        xBC = _silu((window * p["conv1d.weight"][:, 0, :]).sum(-1) + p["conv1d.bias"])
        xh = xBC[:, :d_ssm].reshape(batch, H, P)
        Bt = xBC[:, d_ssm : d_ssm + G * N].reshape(batch, G, N)
        Ct = xBC[:, d_ssm + G * N :].reshape(batch, G, N)
        dt = _softplus(dt + p["dt_bias"])
        y = np.zeros((batch, H, P))
        for hh in range(H):
            g = hh // (H // G)
            decay = np.exp(dt[:, hh] * A[hh])[:, None, None]
            h[:, hh] = decay * h[:, hh] + (dt[:, hh, None] * xh[:, hh])[..., None] * Bt[:, g, None]
            y[:, hh] = (h[:, hh] * Ct[:, g, None]).sum(-1) + p["D"][hh] * xh[:, hh]
        gated = (y.reshape(batch, d_ssm) * _silu(z)).reshape(batch, G, d_ssm // G)
        normed = gated / np.sqrt((gated**2).mean(-1, keepdims=True) + 1e-5)
        ys[:, t] = (normed.reshape(batch, d_ssm) * p["norm.weight"]) @ p["out_proj.weight"].T
    return ys, (window, h)


def _make(kind: str, backend: str) -> torch.nn.Module:
    torch.manual_seed(11)
    if kind == "mamba":
        m = Mamba(D_MODEL, d_state=3, d_conv=D_CONV, dtype=F64, backend=backend)
    else:
        m = Mamba2(
            D_MODEL, d_state=3, d_conv=D_CONV, headdim=4, ngroups=3, dtype=F64, backend=backend
        )
        with torch.no_grad():
            m.norm.weight.uniform_(0.5, 1.5)
    with torch.no_grad():
        m.D.uniform_(0.5, 1.5)
    return m


def _np_run(m, x, resets, state=None):
    run = np_mamba_run if isinstance(m, Mamba) else np_mamba2_run
    return run(m, x, resets, state)


def _random_state(m, batch: int, seed: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(t.shape, generator=g, dtype=F64) for t in m.initial_state(batch))


def _run(m, x, state, resets, mode: str):
    """(y [B, L, d_model], state) by one forward or by a loop of steps."""
    if mode == "forward":
        return m(x, state, resets)
    ys = []
    with torch.no_grad():  # rollouts: the fused numba step kernels on the numba backend
        for t in range(x.shape[1]):
            y, state = m.step(x[:, t], state, resets[:, t])
            ys.append(y)
    return torch.stack(ys, 1), state


# last reset of each row: d_conv - 1 = 3 steps from the end, 2, the very last step, and the
# last two steps (a reset right after a reset); the initial state is random, so inputs from
# before each reset sit in the conv window and the SSM state when it comes
L1, L2 = 12, 5
LAST_RESETS = [[L1 - 3], [L1 - 2], [L1 - 1], [L1 - 2, L1 - 1]]


@pytest.mark.parametrize("mode", ["forward", "step"])
@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("kind", ["mamba", "mamba2"])
def test_reset_in_last_conv_window_starts_fresh(kind, backend, mode):
    """Outputs from a reset in the last d_conv - 1 steps on, and after the returned state is
    carried into the next window, equal a fresh run started at the reset (numpy loop);
    the returned states equal the fresh run's."""
    m = _make(kind, backend)
    batch = len(LAST_RESETS)
    g = torch.Generator().manual_seed(5)
    x1 = torch.randn(batch, L1, D_MODEL, generator=g, dtype=F64)
    x2 = torch.randn(batch, L2, D_MODEL, generator=g, dtype=F64)
    resets = torch.zeros(batch, L1, dtype=torch.bool)
    for b, ts in enumerate(LAST_RESETS):
        resets[b, ts] = True
    state0 = _random_state(m, batch)
    y1, state1 = _run(m, x1, state0, resets, mode)
    y2, state2 = _run(m, x2, state1, torch.zeros(batch, L2, dtype=torch.bool), mode)
    y = torch.cat([y1, y2], dim=1)
    x = torch.cat([x1, x2], dim=1).numpy()
    for b, ts in enumerate(LAST_RESETS):
        start = ts[-1]
        fresh = x[b : b + 1, start:]
        want_y, (want_conv, want_ssm) = _np_run(m, fresh, np.zeros(fresh.shape[:2], bool))
        _, (conv1, ssm1) = _np_run(m, x[b : b + 1, start:L1], np.zeros((1, L1 - start), bool))
        tol = dict(rtol=1e-9, atol=1e-10)
        np.testing.assert_allclose(y[b : b + 1, start:].detach().numpy(), want_y, **tol)
        np.testing.assert_allclose(state1[0][b : b + 1].detach().numpy(), conv1, **tol)
        np.testing.assert_allclose(state1[1][b : b + 1].detach().numpy(), ssm1, **tol)
        np.testing.assert_allclose(state2[0][b : b + 1].detach().numpy(), want_conv, **tol)
        np.testing.assert_allclose(state2[1][b : b + 1].detach().numpy(), want_ssm, **tol)
    # before the resets: the numpy loop from the same initial state
    want_all, _ = _np_run(m, x1.numpy(), resets.numpy(), tuple(s.numpy() for s in state0))
    np.testing.assert_allclose(y1.detach().numpy(), want_all, rtol=1e-9, atol=1e-10)


# ------------------------------------------------------------------------------------------
# issue 19: a reset isolates non-finite values before it
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["forward", "step"])
@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("kind", ["mamba", "mamba2"])
def test_reset_isolates_non_finite_values_before_it(kind, backend, mode):
    """NaN / inf in the inputs or the state before a reset do not reach outputs or states
    from the reset on (the state is replaced by zeros, not multiplied by 0)."""
    m = _make(kind, backend)
    batch, length, start = 3, 10, 6
    g = torch.Generator().manual_seed(8)
    x = torch.randn(batch, length, D_MODEL, generator=g, dtype=F64)
    x[0, 2] = float("nan")  # a NaN input four steps before the reset
    x[1, start - 1, 0] = float("inf")  # an inf input right before it
    state = list(_random_state(m, batch))
    state[1][2] = float("nan")  # a NaN state (row 2)
    state[0][2, 0] = float("-inf")
    resets = torch.zeros(batch, length, dtype=torch.bool)
    resets[:, start] = True
    y, (conv, ssm) = _run(m, x, tuple(state), resets, mode)
    fresh = x[:, start:].numpy()
    want_y, (want_conv, want_ssm) = _np_run(m, fresh, np.zeros(fresh.shape[:2], bool))
    tol = dict(rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(y[:, start:].detach().numpy(), want_y, **tol)
    np.testing.assert_allclose(conv.detach().numpy(), want_conv, **tol)
    np.testing.assert_allclose(ssm.detach().numpy(), want_ssm, **tol)


@pytest.mark.parametrize("start", [6, 8])  # inside a recomputed chunk of 4 steps / at its start
@pytest.mark.parametrize("backend", [*CPU_BACKENDS, "numba-windowed"])
@pytest.mark.parametrize("kind", ["mamba", "mamba2"])
def test_reset_isolates_non_finite_values_from_input_gradients(kind, backend, start, monkeypatch):
    """The gradients w.r.t. the inputs from a reset on are those of a fresh run started there,
    with NaN / inf in the inputs and the state before it (the backward kernels recompute the
    states from checkpoints: every 4 steps here)."""
    if backend == "numba-windowed":
        if kind == "mamba2":
            pytest.skip("Mamba2 has no windowed block")
        monkeypatch.setattr(numba_ops, "MAMBA_WINDOWED_MIN_TOKENS", 0)
        monkeypatch.setattr(numba_ops, "MAMBA_BLOCK_TOKENS", 15)  # windows of 5 steps
        backend = "numba"
    monkeypatch.setattr(numba_ops, "NUMBA_CHECKPOINT_EVERY", 4)
    m = _make(kind, backend)
    batch, length = 3, 13
    g = torch.Generator().manual_seed(9)
    x = torch.randn(batch, length, D_MODEL, generator=g, dtype=F64)
    x[0, start - 3] = float("nan")
    x[1, start - 1, 2] = float("inf")
    state = list(_random_state(m, batch))
    state[1][2] = float("nan")
    resets = torch.zeros(batch, length, dtype=torch.bool)
    resets[:, start] = True

    def input_grads(x, state, resets):
        x = x.clone().requires_grad_(True)
        y, (conv, ssm) = m(x, state, resets)
        y = y[:, -(length - start) :]
        outs = [y, conv, ssm]
        loss = sum(
            (o * torch.cos(torch.arange(o.numel(), dtype=F64)).view_as(o)).sum() for o in outs
        )
        return torch.autograd.grad(loss, x)[0][:, -(length - start) :]

    got = input_grads(x, tuple(state), resets)
    want = input_grads(x[:, start:], None, None)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("kind", ["mamba", "mamba2"])
def test_step_reset_replaces_a_non_finite_state(kind, backend):
    m = _make(kind, backend)
    x = torch.randn(2, D_MODEL, generator=torch.Generator().manual_seed(1), dtype=F64)
    bad = tuple(torch.full_like(t, float("nan")) for t in m.initial_state(2))
    for grad in (False, True):  # the numba step kernel (no grad) and the torch ops
        with torch.set_grad_enabled(grad):
            y, (conv, ssm) = m.step(x, bad, torch.tensor([True, True]))
            y_fresh, (conv_fresh, ssm_fresh) = m.step(x, m.initial_state(2))
        assert torch.isfinite(y).all() and torch.isfinite(ssm).all()
        torch.testing.assert_close(y, y_fresh, rtol=0, atol=0)
        torch.testing.assert_close(conv, conv_fresh, rtol=0, atol=0)
        torch.testing.assert_close(ssm, ssm_fresh, rtol=0, atol=0)


# ------------------------------------------------------------------------------------------
# issue 19: batch size 0, input dtypes
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("kind", ["mamba", "mamba2"])
def test_batch_size_zero_returns_empty_outputs(kind, backend):
    m = _make(kind, backend).float()
    shapes = [tuple(t.shape[1:]) for t in m.initial_state(1)]
    for length in (0, 1, 7):
        x = torch.randn(0, length, D_MODEL, requires_grad=True)
        resets = torch.zeros(0, length, dtype=torch.bool)
        y, state = m(x, m.initial_state(0), resets)
        assert y.shape == (0, length, D_MODEL)
        assert [tuple(t.shape) for t in state] == [(0, *s) for s in shapes]
        y.sum().backward()
        assert x.grad is not None and x.grad.shape == x.shape
    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            y, state = m.step(
                torch.randn(0, D_MODEL), m.initial_state(0), torch.zeros(0, dtype=bool)
            )
        assert y.shape == (0, D_MODEL)
        assert [tuple(t.shape) for t in state] == [(0, *s) for s in shapes]


@pytest.mark.parametrize("x_dtype", [torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("kind", ["mamba", "mamba2"])
def test_input_dtype_other_than_the_modules_is_a_clear_error(kind, x_dtype):
    m = _make(kind, "auto").float()
    pattern = rf"x has dtype {x_dtype} but the module's parameters are torch.float32"
    with pytest.raises(ValueError, match=pattern):
        m(torch.randn(2, 3, D_MODEL).to(x_dtype))
    with pytest.raises(ValueError, match=pattern):
        m.step(torch.randn(2, D_MODEL).to(x_dtype), m.initial_state(2))
    m64 = _make(kind, "auto")  # float64 module, float32 input
    with pytest.raises(
        ValueError, match="torch.float32 but the module's parameters are torch.float64"
    ):
        m64(torch.randn(2, 3, D_MODEL))
