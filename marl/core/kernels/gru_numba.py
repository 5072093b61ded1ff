"""numba CPU loops for the recurrence of a seed-stacked GRU (``SeedGRU``).

:meth:`SeedGRU.forward`'s torch loop is the specification (``fused=False``): per step one
``baddbmm`` for the hidden gates and torch's GRU cell, which autograd differentiates node by
node. On the small matrices of a training minibatch (a few rows, 64 units) the cost is
torch's per-operation overhead, about a dozen operations a step forward and more backward,
not the arithmetic. Here the whole recurrence of one layer is one compiled loop forward and
one backward (hand-derived BPTT), wrapped as one autograd node (:class:`GRURecurrence`);
the input projections of the whole sequence stay one ``baddbmm`` in torch.

Per seed ``s``, row ``b`` and step ``t`` (gate order r, z, n as nn.GRU), with ``gi`` the
input gates ``W_ih x_t + b_ih`` and ``hp`` the state before the step (zeroed where
``resets[s, b, t]``)::

    gh = W_hh hp + b_hh
    r = sigmoid(gi_r + gh_r);  z = sigmoid(gi_z + gh_z);  n = tanh(gi_n + r * gh_n)
    h = (hp - n) * z + n

Each seed is computed alone, in an order that does not depend on how many seeds are
stacked, so seed k's numbers are bit-equal in a stack of any size (the many-seeds contract).
They are not bit-equal to torch's (other summation order and ``exp``): equal to the
specification within float rounding (``tests/test_gru_kernel.py``). Compiled on first use and
cached on disk (``__pycache__`` beside this file). ``AVAILABLE`` is False without numba.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

try:
    import numba

    from seqmodels.kernels.numba.numerics import fexp
except ImportError:  # pragma: no cover - numba is a core dependency
    numba = None

__all__ = ["AVAILABLE", "GRURecurrence", "gru_recurrence"]

AVAILABLE = numba is not None

#: the loops' flags: reassociation lets the row updates use vector lanes; NaN and inf keep
#: their meaning
_FASTMATH = {"reassoc", "contract", "nsz", "arcp"}
#: the gates' flags, FMA contraction only (as seqmodels' kernels): reassociation would undo
#: the exact range reduction of ``fexp``. The gates are their own compiled functions, not
#: inlined by numba, so the loops' flags never reach them (LLVM's inlining keeps each
#: instruction's own flags)
_GATE_FASTMATH = {"contract"}


def _jit(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``numba.njit`` with an on-disk cache (no cache when no writable location exists)."""
    if numba is None:  # pragma: no cover
        return fn
    try:
        return numba.njit(cache=True, nogil=True, fastmath=_FASTMATH)(fn)
    except RuntimeError:  # pragma: no cover - no writable cache location
        return numba.njit(nogil=True, fastmath=_FASTMATH)(fn)


def _gate_jit(fn: Callable[..., Any]) -> Callable[..., Any]:
    if numba is None:  # pragma: no cover
        return fn
    return numba.njit(cache=True, nogil=True, fastmath=_GATE_FASTMATH)(fn)


@_gate_jit
def _sigmoid(x):  # pragma: no cover - compiled by numba
    s = 1.0 / (1.0 + fexp(-x))
    return s if x == x else x  # fexp clamps its argument: NaN passed on here, as torch does


@_gate_jit
def _tanh(x):  # pragma: no cover - compiled by numba
    t = 2.0 / (1.0 + fexp(-2.0 * x)) - 1.0
    return t if x == x else x


@_jit
def _forward_loop(gi, w_hh, b_hh, h0, resets, has_resets):  # pragma: no cover
    """gi [S, L, B, 3H], w_hh [S, 3H, H], b_hh [S, 3H], h0 [S, B, H], resets [S, B, L] ->
    y [S, L, B, H] and what the backward reads: hp, r, z, n, ghn (each [S, L, B, H]).
    Row by row (tiles of rows sharing W_hh's reads measured slower here)."""
    S, L, B, three_h = gi.shape
    H = three_h // 3
    dt = gi.dtype
    y = np.empty((S, L, B, H), dt)
    hp_all = np.empty((S, L, B, H), dt)
    r_all = np.empty((S, L, B, H), dt)
    z_all = np.empty((S, L, B, H), dt)
    n_all = np.empty((S, L, B, H), dt)
    ghn_all = np.empty((S, L, B, H), dt)
    gh = np.empty(three_h, dt)
    w_t = np.empty((H, three_h), dt)  # W_hh transposed: gh accumulates rows, no reductions
    for s in range(S):
        w_t[:] = w_hh[s].T
        for t in range(L):
            for b in range(B):
                hp = hp_all[s, t, b]
                if has_resets and resets[s, b, t]:
                    hp[:] = 0.0
                elif t == 0:
                    hp[:] = h0[s, b]
                else:
                    hp[:] = y[s, t - 1, b]
                gh[:] = b_hh[s]
                for k in range(H):
                    hk = hp[k]
                    wk = w_t[k]
                    for j in range(three_h):
                        gh[j] += wk[j] * hk
                g = gi[s, t, b]
                for k in range(H):
                    r = _sigmoid(g[k] + gh[k])
                    z = _sigmoid(g[H + k] + gh[H + k])
                    n = _tanh(g[2 * H + k] + r * gh[2 * H + k])
                    r_all[s, t, b, k] = r
                    z_all[s, t, b, k] = z
                    n_all[s, t, b, k] = n
                    ghn_all[s, t, b, k] = gh[2 * H + k]
                    y[s, t, b, k] = (hp[k] - n) * z + n
    return y, hp_all, r_all, z_all, n_all, ghn_all


@_jit
def _backward_loop(
    dy, w_hh, hp_all, r_all, z_all, n_all, ghn_all, resets, has_resets
):  # pragma: no cover
    """The gradients of :func:`_forward_loop` with respect to gi, h0, w_hh and b_hh, from the
    gradient ``dy [S, L, B, H]`` of its outputs (the final state is ``y[:, -1]``)."""
    S, L, B, H = dy.shape
    three_h = 3 * H
    dt = dy.dtype
    dgi = np.empty((S, L, B, three_h), dt)
    dh0 = np.empty((S, B, H), dt)
    dw = np.zeros((S, three_h, H), dt)
    db = np.zeros((S, three_h), dt)
    dh = np.empty((B, H), dt)
    dhp = np.empty(H, dt)
    dgh = np.empty(three_h, dt)
    for s in range(S):
        w = w_hh[s]
        dh[:] = 0.0
        for t in range(L - 1, -1, -1):
            for b in range(B):
                hp = hp_all[s, t, b]
                dg = dgi[s, t, b]  # [3H]: the input gates' gradient
                for k in range(H):
                    d = dh[b, k] + dy[s, t, b, k]
                    r = r_all[s, t, b, k]
                    z = z_all[s, t, b, k]
                    n = n_all[s, t, b, k]
                    da_n = d * (1.0 - z) * (1.0 - n * n)
                    dg[k] = da_n * ghn_all[s, t, b, k] * r * (1.0 - r)
                    dg[H + k] = d * (hp[k] - n) * z * (1.0 - z)
                    dg[2 * H + k] = da_n
                    dhp[k] = d * z
                # gh's gradient: r's and z's are the input gates', n's is scaled by r
                for k in range(H):
                    dgh[k] = dg[k]
                    dgh[H + k] = dg[H + k]
                    dgh[2 * H + k] = dg[2 * H + k] * r_all[s, t, b, k]
                for j in range(three_h):
                    d = dgh[j]
                    db[s, j] += d
                    dwj = dw[s, j]
                    wj = w[j]
                    for k in range(H):
                        dwj[k] += d * hp[k]
                        dhp[k] += wj[k] * d
                if has_resets and resets[s, b, t]:
                    dh[b, :] = 0.0
                else:
                    dh[b, :] = dhp
        dh0[s] = dh
    return dgi, dh0, dw, db


def _numpy(x: Tensor) -> np.ndarray:
    return x.detach().contiguous().numpy()


class GRURecurrence(torch.autograd.Function):
    """One layer's recurrence as one autograd node: ``(gi [S, L, B, 3H], w_hh [S, 3H, H],
    b_hh [S, 3H], h0 [S, B, H], resets [S, B, L] bool or None) -> y [S, L, B, H]`` (the state
    after each step; the final state is ``y[:, -1]``). CPU tensors of one float dtype."""

    @staticmethod
    def forward(
        ctx: Any, gi: Tensor, w_hh: Tensor, b_hh: Tensor, h0: Tensor, resets: Tensor | None
    ) -> Tensor:
        S, _, B, _ = gi.shape
        has_resets = resets is not None
        flags = _numpy(resets) if has_resets else np.zeros((S, B, 1), np.bool_)
        w = _numpy(w_hh)
        y, *saved = _forward_loop(_numpy(gi), w, _numpy(b_hh), _numpy(h0), flags, has_resets)
        if any(ctx.needs_input_grad):  # no graph (torch.no_grad): nothing kept
            ctx.kernel_saved = (w, *saved, flags, has_resets)
        return torch.from_numpy(y)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, dy: Tensor) -> tuple[Tensor | None, ...]:
        w, hp, r, z, n, ghn, flags, has_resets = ctx.kernel_saved
        dgi, dh0, dw, db = _backward_loop(_numpy(dy), w, hp, r, z, n, ghn, flags, has_resets)
        return (torch.from_numpy(dgi), torch.from_numpy(dw), torch.from_numpy(db),
                torch.from_numpy(dh0), None)  # fmt: skip


def gru_recurrence(
    gi: Tensor, w_hh: Tensor, b_hh: Tensor, h0: Tensor, resets: Tensor | None
) -> Tensor:
    """:class:`GRURecurrence` applied (see there for the shapes)."""
    return GRURecurrence.apply(gi, w_hh, b_hh, h0, resets)
