"""Fused CPU operations on compiled numba kernels, each the twin of a readable torch op.

Every public function here has the signature of its readable twin and an equivalence test
against it (float64 outputs, states and, for the sequence ops, gradients:
``tests/test_seqmodels.py``, ``tests/test_seqmodels_kernels.py``, which also checks the
signatures):

======================================  =========================================================
fused (this module)                     readable twin
======================================  =========================================================
``selective_scan_numba``                ``seqmodels.scan.selective_scan_reference``
``ssd_scan_numba`` (D skip fused)       ``seqmodels.scan.ssd_scan_reference``
``selective_state_update_numba``        ``seqmodels.scan.selective_state_update_reference``
``selective_state_update_gated_numba``  ``seqmodels.scan.selective_state_update_gated_reference``
``ssd_state_update_numba``              ``seqmodels.scan.ssd_state_update_reference``
``conv_silu_numba``                     ``seqmodels.ops.conv_silu_reference``
``conv_step_silu_numba``                ``seqmodels.ops.conv_step_silu_reference``
``rmsnorm_gated_numba``                 ``seqmodels.ops.rmsnorm_gated_reference``
``rmsnorm_numba``                       ``seqmodels.ops.rmsnorm_reference``
``mamba_inner_numba``                   ``seqmodels.ops.mamba_inner_reference``
``mamba_block_numba``                   ``seqmodels.ops.mamba_block_reference``
======================================  =========================================================

Besides them, ``seqmodels.Mamba.step``'s rollout entry (not in ``__all__``):
``mamba_step_views`` (numpy views of a block's step parameters: no copies, nothing computed
from them, so in-place optimizer updates are read as they happen; the module keys its cache on
the parameters' ``data_ptr``) and ``mamba_step_numba_views`` (``mamba_step_numba``'s kernel on
those views, A = -exp(A_log) computed in the kernel), tested through ``Mamba.step`` against
the twin, after in-place and replaced parameter updates too. ``seqmodels.Mamba2.step``'s
likewise: ``mamba2_step_views`` and ``mamba2_step_numba_views`` (the whole step after in_proj
in one kernel, ``numba.block_step.mamba2_step_fused``), tested through ``Mamba2.step`` against its
general path (``tests/test_mamba2_step_fused.py``).

The sequence ops are ``torch.autograd.Function``s whose backward is its own kernel: the
forward keeps only per-chunk checkpoint states (every ``NUMBA_CHECKPOINT_EVERY`` steps), the
backward recomputes one chunk of states at a time and runs the reverse recurrence. The step ops
(rollouts) have no backward: the dispatchers in :mod:`seqmodels.scan` / :mod:`seqmodels.ops`
use them only when no gradient is taken. float32 and float64 CPU tensors; the kernels run with
as many threads as torch uses (:func:`seqmodels.kernels.numba_runtime.torch_thread_count`).

Reading in place: the conv, the gated inner part and the gated norm read their input (z, or
the conv's channels) as a channel slice of the in_proj output without copying it
(:func:`_row_buffer`, which reads the view's ``_base``: private torch API, kept to this
package).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any, NamedTuple, TypeVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from seqmodels.kernels.numba_runtime import torch_thread_count

# Time steps between stored states in the numba forward (the backward recomputes one chunk of
# states at a time from them). Memory of the checkpoints: [B, L / 64, D, N].
NUMBA_CHECKPOINT_EVERY = 64
# Tokens (batch rows x time steps) per window of the numba Mamba block (mamba_block_numba):
# windows of max(1, MAMBA_BLOCK_TOKENS // B) steps. Its forward keeps no [B, L, d_inner]
# activation and its backward recomputes one window at a time, so the peak memory of a training
# step is about 2 [B, L, d_model] tensors (output, input gradient) plus one window's worth of
# intermediates (measured at B=32, L=1024, d_model=64: 2048 tokens ~ 37 MB, 8192 ~ 81 MB, at
# the same speed).
MAMBA_BLOCK_TOKENS = 2048
# mamba_block_numba (seqmodels.Mamba's numba path) takes those windows from B * L tokens on;
# below, the whole sequence at once (_NumbaMambaBlockFull), which keeps 4 [B, L, d_inner]
# activations but recomputes no in_proj / conv / x_proj output in backward (faster than the
# windowed path where both fit: measured with benchmarks/seqmodels.py).
MAMBA_WINDOWED_MIN_TOKENS = 65536


class _Kernels(NamedTuple):
    """The kernel modules of :mod:`seqmodels.kernels.numba`, one per op family."""

    conv: ModuleType
    norm: ModuleType
    scan: ModuleType
    ssd: ModuleType
    block_step: ModuleType


@functools.lru_cache(maxsize=1)
def _jit() -> _Kernels:
    """The compiled loops by op family (numba imported on first use; each kernel compiled, or
    loaded from numba's disk cache, on its first call)."""
    try:  # optional dependency: only this backend needs numba
        from seqmodels.kernels.numba import block_step, conv, norm, scan, ssd
    except ImportError as err:  # pragma: no cover - numba is a declared dependency
        raise ImportError(
            "the numba backend needs numba: pip install numba (or use backend='chunked')"
        ) from err
    return _Kernels(conv=conv, norm=norm, scan=scan, ssd=ssd, block_step=block_step)


_Fn = TypeVar("_Fn", bound=Callable[..., Any])


def _torch_threads(fn: _Fn) -> _Fn:
    """Run ``fn`` (an autograd Function's forward or backward) under torch_thread_count."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with torch_thread_count():
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def _np(t: Tensor) -> Any:
    return t.detach().contiguous().numpy()


def _np_view(t: Tensor) -> Any:
    """A numpy view of t with t's strides (no copy: a kernel's writes land in t)."""
    return t.detach().numpy()


_NP_DTYPES = {torch.float32: np.float32, torch.float64: np.float64}


def _absent(dtype: torch.dtype) -> Any:
    """What the gated inner part's kernels take for an optional ``[B, L, D]`` array that is
    not given or not wanted (pre, the output before the gate; y in the backward): a
    ``[0, 0, 0]`` array of the kernel's dtype."""
    return np.empty((0, 0, 0), dtype=_NP_DTYPES[dtype])


def _detach_block_inputs(
    x, W_in, b_in, w_conv, b_conv, W_x, Wt_dt, b_dt, At, D, W_out, b_out, keep
) -> tuple[Any, ...]:
    """A Mamba block Function's inputs detached, in the same order; the small per-channel
    parameters (and ``keep``) also contiguous, as the kernels read them; absent biases stay
    None."""
    x, W_in, W_x, W_out = (t.detach() for t in (x, W_in, W_x, W_out))
    b_in = None if b_in is None else b_in.detach()
    b_out = None if b_out is None else b_out.detach()
    w_conv, b_conv, Wt_dt, b_dt, At, D, keep = (
        t.detach().contiguous() for t in (w_conv, b_conv, Wt_dt, b_dt, At, D, keep)
    )
    return x, W_in, b_in, w_conv, b_conv, W_x, Wt_dt, b_dt, At, D, W_out, b_out, keep


def _keep_or_ones(resets: Tensor | None, like: Tensor) -> Tensor:
    """[B, L] multiplier of like's dtype: 0 where an episode starts, 1 elsewhere."""
    if resets is None:
        return like.new_ones(like.shape[0], like.shape[1])
    return (~resets).to(like.dtype)


# --------------------------------------------------------------------------------------------
# sequence ops (training): autograd Functions with kernel backward
# --------------------------------------------------------------------------------------------


class _NumbaSelectiveScan(torch.autograd.Function):
    """Mamba scan on CPU: the kernels keep the state as [N, D] (channels innermost)."""

    @staticmethod
    @_torch_threads
    def forward(ctx, u, delta, A, Bm, Cm, keep, h0):  # type: ignore[override]
        kern = _jit()
        every = NUMBA_CHECKPOINT_EVERY
        At = A.t().contiguous()
        # contiguous once, saved as such: the backward reads the same memory without copying
        u, delta, Bm, Cm, keep = (t.detach().contiguous() for t in (u, delta, Bm, Cm, keep))
        arrays = [_np(t) for t in (u, delta, At, Bm, Cm, keep, h0.transpose(1, 2))]
        y, h_last, ckpt = kern.scan.mamba_fwd_t(*arrays, every)
        ctx.every = every
        ctx.save_for_backward(u, delta, At, Bm, Cm, keep, torch.from_numpy(ckpt))
        return torch.from_numpy(y), torch.from_numpy(h_last).transpose(1, 2)

    @staticmethod
    @_torch_threads
    def backward(ctx, dy, dh_last):  # type: ignore[override]
        u, delta, At, Bm, Cm, keep, ckpt = ctx.saved_tensors
        if dy is None:
            dy = torch.zeros_like(u)
        if dh_last is None:
            dh_last = u.new_zeros(u.shape[0], At.shape[1], At.shape[0])
        kern = _jit()
        arrays = [_np(t) for t in (u, delta, At, Bm, Cm, keep, ckpt, dy, dh_last.transpose(1, 2))]
        du, ddelta, dA, dB, dC, dh0 = kern.scan.mamba_bwd_t(*arrays, ctx.every)
        t = torch.from_numpy
        return t(du), t(ddelta), t(dA).sum(0).t(), t(dB), t(dC), None, t(dh0).transpose(1, 2)


def _ssd_state_to_kernel(h: Tensor, ngroups: int) -> Tensor:
    """[B, H, P, N] (mamba-ssm layout) -> [B, G, N, Q] (the SSD kernels' layout, Q = H*P/G)."""
    batch, nheads, headdim, d_state = h.shape
    h = h.reshape(batch, ngroups, nheads // ngroups, headdim, d_state)
    q_len = nheads // ngroups * headdim
    return h.permute(0, 1, 4, 2, 3).reshape(batch, ngroups, d_state, q_len).contiguous()


def _ssd_state_from_kernel(h: Tensor, nheads: int) -> Tensor:
    """[B, G, N, Q] -> [B, H, P, N] (a view, not a copy)."""
    batch, ngroups, d_state, q_len = h.shape
    headdim = q_len * ngroups // nheads
    h = h.view(batch, ngroups, d_state, nheads // ngroups, headdim)
    return h.permute(0, 1, 3, 4, 2).reshape(batch, nheads, headdim, d_state)


class _NumbaSSDScan(torch.autograd.Function):
    """Mamba2 scan on CPU, D skip included (``Dq``: D per channel, ``[H * P]``). The kernels
    see x as ``[B, L, H * P]`` and keep the state of group g as ``[N, Q]``."""

    @staticmethod
    @_torch_threads
    def forward(ctx, x, dt, A, Bm, Cm, keep, h0, Dq):  # type: ignore[override]
        kern = _jit()
        every = NUMBA_CHECKPOINT_EVERY
        batch, length, nheads, headdim = x.shape
        ngroups = Bm.shape[2]
        x2 = x.detach().reshape(batch, length, nheads * headdim).contiguous()
        dt, Bm, Cm, keep = (t.detach().contiguous() for t in (dt, Bm, Cm, keep))
        h0k = _ssd_state_to_kernel(h0.detach(), ngroups)
        arrays = [_np(t) for t in (x2, dt, A, Dq, Bm, Cm, keep, h0k)]
        y, h_last, ckpt = kern.ssd.ssd_fwd_t(*arrays, every)
        ctx.every = every
        ctx.save_for_backward(x2, dt, A, Dq, Bm, Cm, keep, torch.from_numpy(ckpt))
        y = torch.from_numpy(y).view(batch, length, nheads, headdim)
        return y, _ssd_state_from_kernel(torch.from_numpy(h_last), nheads)

    @staticmethod
    @_torch_threads
    def backward(ctx, dy, dh_last):  # type: ignore[override]
        x2, dt, A, Dq, Bm, Cm, keep, ckpt = ctx.saved_tensors
        batch, length, channels = x2.shape
        nheads = dt.shape[2]
        ngroups = Bm.shape[2]
        if dy is None:
            dy = torch.zeros_like(x2)
        dy = dy.reshape(batch, length, channels)
        if dh_last is None:
            dhk = x2.new_zeros(batch, ngroups, Bm.shape[3], channels // ngroups)
        else:
            dhk = _ssd_state_to_kernel(dh_last, ngroups)
        kern = _jit()
        arrays = [_np(t) for t in (x2, dt, A, Dq, Bm, Cm, keep, ckpt, dy, dhk)]
        dx, ddt, dA, dD, dB, dC, dh0 = kern.ssd.ssd_bwd_t(*arrays, ctx.every)
        t = torch.from_numpy
        dx = t(dx).view(batch, length, nheads, channels // nheads)
        dh0 = _ssd_state_from_kernel(t(dh0), nheads)
        return dx, t(ddt), t(dA).sum(0), t(dB), t(dC), None, dh0, t(dD).sum(0)


def selective_scan_numba(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    Bm: Tensor,
    Cm: Tensor,
    h0: Tensor | None = None,
    resets: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Compiled CPU Mamba scan (forward + backward kernels); contract of the reference."""
    batch, _, d_inner = u.shape
    if h0 is None:
        h0 = u.new_zeros(batch, d_inner, A.shape[1])
    dtype = u.dtype
    A, Bm, Cm, h0 = (t.to(dtype) for t in (A, Bm, Cm, h0))
    return _NumbaSelectiveScan.apply(u, delta.to(dtype), A, Bm, Cm, _keep_or_ones(resets, u), h0)


def ssd_scan_numba(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    Bm: Tensor,
    Cm: Tensor,
    h0: Tensor | None = None,
    resets: Tensor | None = None,
    D: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Compiled CPU Mamba2 scan (forward + backward kernels); contract of the reference, plus
    the D skip fused when ``D`` (``[H]`` or ``[H, P]``) is given: y = C . h + D * x."""
    batch, _, nheads, headdim = x.shape
    if h0 is None:
        h0 = x.new_zeros(batch, nheads, headdim, Bm.shape[-1])
    dtype = x.dtype
    A, Bm, Cm, h0 = (t.to(dtype) for t in (A, Bm, Cm, h0))
    if D is None:
        Dq = x.new_zeros(nheads * headdim)
    else:
        Dq = D.to(dtype).reshape(nheads, -1).expand(nheads, headdim).reshape(-1)
    keep = _keep_or_ones(resets, x)
    return _NumbaSSDScan.apply(x, dt.to(dtype), A, Bm, Cm, keep, h0, Dq)


def _row_buffer(x: Tensor) -> tuple[Tensor, int]:
    """A C-contiguous ``[B, L, S]`` tensor and a channel offset such that
    ``x == buf[..., off : off + C]``: the tensor x is a channel slice of (a split of the
    in_proj output), else a contiguous copy of x with offset 0."""
    base = x._base
    if (
        base is not None
        and x.stride(-1) == 1
        and base.dim() == 3
        and base.is_contiguous()
        and base.shape[:2] == x.shape[:2]
        and x.stride(1) == base.shape[2]
        and x.stride(0) == base.stride(0)
    ):
        off = x.storage_offset() - base.storage_offset()
        if 0 <= off <= base.shape[2] - x.shape[2]:
            return base.detach(), off
    return x.detach().contiguous(), 0


class _NumbaConvSiLU(torch.autograd.Function):
    """Depthwise causal conv + SiLU on CPU in the [B, L, C] layout (taps masked at resets)."""

    @staticmethod
    @_torch_threads
    def forward(ctx, x, w, bias, hist, keep):  # type: ignore[override]
        src, off = _row_buffer(x)
        w, bias, hist, keep = (t.detach().contiguous() for t in (w, bias, hist, keep))
        arrays = [_np(t) for t in (w, bias, hist, keep)]
        out, state = _jit().conv.conv_silu_fwd(_np(src), off, *arrays)
        ctx.off = off
        ctx.save_for_backward(src, w, bias, hist, keep)
        return torch.from_numpy(out), torch.from_numpy(state)

    @staticmethod
    @_torch_threads
    def backward(ctx, dout, dstate):  # type: ignore[override]
        src, w, bias, hist, keep = ctx.saved_tensors
        batch, length = keep.shape
        width, channels = w.shape
        if dout is None:
            dout = src.new_zeros(batch, length, channels)
        if dstate is None:
            dstate = src.new_zeros(batch, channels, width)
        dx = src.new_empty(batch, length, channels)
        arrays = [_np(t) for t in (w, bias, hist, keep, dout.contiguous(), dstate.contiguous())]
        kernel = _jit().conv.conv_silu_bwd
        dw, dbias, dhist = kernel(_np(src), ctx.off, *arrays, _np(dx), 0)
        t = torch.from_numpy
        return dx, t(dw).sum(0), t(dbias).sum(0), t(dhist), None


def conv_silu_numba(
    x: Tensor, conv_state: Tensor, weight: Tensor, bias: Tensor | None, resets: Tensor | None
) -> tuple[Tensor, Tensor]:
    """silu(depthwise causal conv) over a sequence with compiled CPU kernels, taps masked at
    episode resets (contract of ``seqmodels.ops.conv_silu_reference``).

    x ``[B, L, C]`` (may be a channel slice of a larger ``[B, L, S]`` tensor: read in place);
    conv_state ``[B, C, W]``; weight ``[C, 1, W]``; bias ``[C]`` or None; resets ``[B, L]``.
    Returns silu(out) ``[B, L, C]`` and the new conv state ``[B, C, W]``.
    """
    dtype = x.dtype
    w = weight[:, 0, :].t().to(dtype)  # [W, C]
    b = x.new_zeros(w.shape[1]) if bias is None else bias.to(dtype)
    hist = conv_state[:, :, 1:].transpose(1, 2).to(dtype)  # [B, W-1, C]
    out, state = _NumbaConvSiLU.apply(x, w, b, hist, _keep_or_ones(resets, x))
    return out, state.to(conv_state.dtype)


class _NumbaRMSNormGated(torch.autograd.Function):
    """Gated RMSNorm on CPU (one kernel per direction; z read in place from its buffer)."""

    @staticmethod
    @_torch_threads
    def forward(ctx, x, z, weight, group_size, eps, norm_before_gate):  # type: ignore[override]
        src, off = _row_buffer(z)
        x, weight = x.detach().contiguous(), weight.detach().contiguous()
        args = (off, _np(weight), group_size, float(eps), bool(norm_before_gate))
        out = _jit().norm.rmsnorm_gated_fwd(_np(x), _np(src), *args)
        ctx.args = args[2:]
        ctx.off = off
        ctx.save_for_backward(x, src, weight)
        return torch.from_numpy(out)

    @staticmethod
    @_torch_threads
    def backward(ctx, dout):  # type: ignore[override]
        x, src, weight = ctx.saved_tensors
        arrays = (_np(x), _np(src), ctx.off, _np(weight), *ctx.args, _np(dout.contiguous()))
        dx, dz, dweight = _jit().norm.rmsnorm_gated_bwd(*arrays)
        t = torch.from_numpy
        return t(dx), t(dz), t(dweight).sum(0), None, None, None


def rmsnorm_gated_numba(
    x: Tensor, z: Tensor, weight: Tensor, group_size: int, eps: float, norm_before_gate: bool
) -> Tensor:
    """Gated RMSNorm (contract of ``seqmodels.ops.rmsnorm_gated_reference``) with compiled CPU
    kernels: x, z ``[B, L, C]`` (z may be a channel slice of a larger tensor), weight ``[C]``."""
    dtype = x.dtype
    return _NumbaRMSNormGated.apply(
        x, z.to(dtype), weight.to(dtype), group_size, eps, norm_before_gate
    )


# Blocks of rows whose weight gradients the RMSNorm backward sums separately (then added up
# here): up to 64 (enough for any thread count), of at least 64 rows each (a part's setup is
# not free); a function of the row count only, so the result does not depend on the threads.
_RMSNORM_PARTS = 64
_RMSNORM_PART_ROWS = 64


class _NumbaRMSNorm(torch.autograd.Function):
    """RMSNorm over the last dimension on CPU: one kernel per direction on the ``[M, C]`` rows;
    saves x and the per-row rstd."""

    @staticmethod
    @_torch_threads
    def forward(ctx, x, weight, eps):  # type: ignore[override]
        rows = x.detach().reshape(-1, x.shape[-1]).contiguous()
        weight = weight.detach().contiguous()
        out, rstd = _jit().norm.rmsnorm_fwd(_np(rows), _np(weight), float(eps))
        ctx.save_for_backward(rows, weight, torch.from_numpy(rstd))
        return torch.from_numpy(out).view(x.shape)

    @staticmethod
    @_torch_threads
    def backward(ctx, dout):  # type: ignore[override]
        rows, weight, rstd = ctx.saved_tensors
        parts = max(1, min(_RMSNORM_PARTS, rows.shape[0] // _RMSNORM_PART_ROWS))
        grad = _np(dout.reshape(rows.shape))
        dx, dweight = _jit().norm.rmsnorm_bwd(_np(rows), _np(weight), _np(rstd), grad, parts)
        return torch.from_numpy(dx).view(dout.shape), torch.from_numpy(dweight).sum(0), None


def rmsnorm_numba(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm over the last dimension (contract of ``seqmodels.ops.rmsnorm_reference``) with
    compiled CPU kernels: x ``[..., C]``, weight ``[C]`` -> ``[..., C]``. Without autograd
    the forward kernel alone."""
    weight = weight.to(x.dtype)
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return _NumbaRMSNorm.apply(x, weight, eps)
    rows = x.detach().reshape(-1, x.shape[-1]).contiguous()
    with torch_thread_count():
        out, _ = _jit().norm.rmsnorm_fwd(_np(rows), _np(weight), float(eps))
    return torch.from_numpy(out).view(x.shape)


class _NumbaMambaFused(torch.autograd.Function):
    """Mamba's inner part on CPU: softplus(dt_proj), the scan, the D skip and the SiLU gate in
    one kernel per direction. Saves u, the small x_proj outputs, the buffer z lives in (the
    in_proj output, which the conv kernel keeps anyway) and the checkpoint states."""

    @staticmethod
    @_torch_threads
    def forward(ctx, u, dt_low, W_dt, dt_bias, A, Bm, Cm, z, D, keep, h0):  # type: ignore[override]
        every = NUMBA_CHECKPOINT_EVERY
        zsrc, zoff = _row_buffer(z)
        u, dt_low, Bm, Cm, dt_bias, D, keep = (
            t.detach().contiguous() for t in (u, dt_low, Bm, Cm, dt_bias, D, keep)
        )
        Wt = W_dt.detach().t().contiguous()  # [R, D]
        At = A.detach().t().contiguous()  # [N, D]
        arrays = [_np(t) for t in (u, dt_low, Wt, dt_bias, At, Bm, Cm, zsrc)]
        tail = [_np(t) for t in (D, keep, h0.transpose(1, 2))]
        y, h_last, ckpt = _jit().scan.mamba_fused_fwd(*arrays, zoff, *tail, every, _absent(u.dtype))
        ctx.every, ctx.zoff = every, zoff
        ckpt = torch.from_numpy(ckpt)
        ctx.save_for_backward(u, dt_low, Wt, dt_bias, At, Bm, Cm, zsrc, D, keep, ckpt)
        return torch.from_numpy(y), torch.from_numpy(h_last).transpose(1, 2)

    @staticmethod
    @_torch_threads
    def backward(ctx, dy, dh_last):  # type: ignore[override]
        u, dt_low, Wt, dt_bias, At, Bm, Cm, zsrc, D, keep, ckpt = ctx.saved_tensors
        if dy is None:
            dy = torch.zeros_like(u)
        if dh_last is None:
            dh_last = u.new_zeros(u.shape[0], At.shape[1], At.shape[0])
        arrays = [_np(t) for t in (u, dt_low, Wt, dt_bias, At, Bm, Cm, zsrc)]
        tail = [_np(t) for t in (D, keep, ckpt, dy.contiguous(), dh_last.transpose(1, 2))]
        dz, du = torch.empty_like(u), torch.empty_like(u)
        ddtl, dB, dC = torch.empty_like(dt_low), torch.empty_like(Bm), torch.empty_like(Cm)
        outs = [_np(t) for t in (dz, ddtl, dB, dC, du)]
        tail += [ctx.every, outs[0], 0, *outs[1:], _absent(u.dtype), _absent(u.dtype)]
        grads = _jit().scan.mamba_fused_bwd(*arrays, ctx.zoff, *tail)
        dWt, ddbias, dA, dD, dh0 = (torch.from_numpy(g) for g in grads)
        return (
            du,
            ddtl,
            dWt.sum(0).t(),
            ddbias.sum(0),
            dA.sum(0).t(),
            dB,
            dC,
            dz,
            dD.sum(0),
            None,
            dh0.transpose(1, 2),
        )


def mamba_inner_numba(
    u: Tensor,
    dt_low: Tensor,
    dt_weight: Tensor,
    dt_bias: Tensor,
    A: Tensor,
    Bm: Tensor,
    Cm: Tensor,
    z: Tensor,
    D: Tensor,
    h0: Tensor | None = None,
    resets: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Mamba's gated SSM output with compiled CPU kernels (forward and backward):

        delta = softplus(dt_low @ dt_weight^T + dt_bias)
        y, h_last = selective_scan(u, delta, A, Bm, Cm, h0, resets)
        y = (y + D * u) * silu(z)

    u, z ``[B, L, D]`` (z may be a channel slice of the in_proj output: read in place);
    dt_low ``[B, L, R]``; dt_weight ``[D, R]``; dt_bias, D ``[D]``; A ``[D, N]``; Bm, Cm
    ``[B, L, N]``; h0 ``[B, D, N]`` or None; resets ``[B, L]``. Returns (y ``[B, L, D]``,
    h_last ``[B, D, N]``).
    """
    batch, _, d_inner = u.shape
    dtype = u.dtype
    if h0 is None:
        h0 = u.new_zeros(batch, d_inner, A.shape[1])
    cast = [t.to(dtype) for t in (dt_low, dt_weight, dt_bias, A, Bm, Cm, z, D, h0)]
    dt_low, dt_weight, dt_bias, A, Bm, Cm, z, D, h0 = cast
    keep = _keep_or_ones(resets, u)
    return _NumbaMambaFused.apply(u, dt_low, dt_weight, dt_bias, A, Bm, Cm, z, D, keep, h0)


class _NumbaMambaBlock(torch.autograd.Function):
    """A whole Mamba block on CPU (in_proj, conv + SiLU, x_proj, the gated inner part,
    out_proj), processed in windows of ``chunk`` time steps that carry the conv and SSM states
    from one to the next (exact: the split invariance of the block).

    Saved for backward: the input x, per window its starting conv state and the scan's
    checkpoint states. The backward walks the windows in reverse, recomputes a window's
    in_proj, conv and x_proj outputs, runs the fused backward kernels and the matmuls' weight
    gradients by hand; every [B, T, *] intermediate lives for one window only. Costs one extra
    in_proj, conv and x_proj forward; the scan's forward is not recomputed (its backward kernel
    recomputes states from the checkpoints and returns out_proj's input as a by-product).
    """

    @staticmethod
    @_torch_threads
    def forward(  # type: ignore[override]
        ctx,
        x,
        conv_state,
        h0,
        keep,
        W_in,
        b_in,
        w_conv,
        b_conv,
        W_x,
        Wt_dt,
        b_dt,
        At,
        D,
        W_out,
        b_out,
        dt_rank,
        chunk,
    ):
        kern = _jit()
        every = NUMBA_CHECKPOINT_EVERY
        (x, W_in, b_in, w_conv, b_conv, W_x, Wt_dt, b_dt, At, D, W_out, b_out, keep) = (
            _detach_block_inputs(
                x, W_in, b_in, w_conv, b_conv, W_x, Wt_dt, b_dt, At, D, W_out, b_out, keep
            )
        )
        batch, length, _ = x.shape
        d_inner = D.shape[0]
        d_state = At.shape[0]
        small = [_np(t) for t in (Wt_dt, b_dt, At)]
        conv_np = [_np(w_conv), _np(b_conv)]
        out = x.new_empty(batch, length, W_out.shape[0])
        state = conv_state.detach()
        h = h0.detach().transpose(1, 2).contiguous()  # [B, N, D]
        starts, ckpts = [], []
        for s in range(0, length, chunk):
            e = min(length, s + chunk)
            keep_c = keep[:, s:e].contiguous()
            xz = F.linear(x[:, s:e], W_in, b_in)  # [B, T, 2 D]
            hist = state[:, :, 1:].transpose(1, 2).contiguous()
            xs, new_state = kern.conv.conv_silu_fwd(_np(xz), 0, *conv_np, _np(hist), _np(keep_c))
            xs = torch.from_numpy(xs)
            dt_low, Bm, Cm = (
                t.contiguous()
                for t in torch.split(F.linear(xs, W_x), [dt_rank, d_state, d_state], dim=-1)
            )
            y, h_next, ckpt = kern.scan.mamba_fused_fwd(
                _np(xs), _np(dt_low), small[0], small[1], small[2], _np(Bm), _np(Cm), _np(xz),
                d_inner, _np(D), _np(keep_c), _np(h), every, _absent(x.dtype),
            )  # fmt: skip
            out[:, s:e] = F.linear(torch.from_numpy(y), W_out, b_out)
            starts.append(state)
            ckpts.append(torch.from_numpy(ckpt))
            state, h = torch.from_numpy(new_state), torch.from_numpy(h_next)
        ctx.dims = (dt_rank, chunk, every)
        ctx.starts, ctx.ckpts = starts, ckpts
        ctx.has_bias = (b_in is not None, b_out is not None)
        ctx.save_for_backward(x, keep, W_in, b_in, w_conv, b_conv, W_x, Wt_dt, b_dt, At, D, W_out)
        return out, state, h.transpose(1, 2)

    @staticmethod
    @_torch_threads
    def backward(ctx, dout, dstate, dh):  # type: ignore[override]
        kern = _jit()
        x, keep, W_in, b_in, w_conv, b_conv, W_x, Wt_dt, b_dt, At, D, W_out = ctx.saved_tensors
        dt_rank, chunk, every = ctx.dims
        batch, length, d_model = x.shape
        d_inner = D.shape[0]
        d_state, width = At.shape[0], w_conv.shape[0]
        if dout is None:
            dout = x.new_zeros(batch, length, W_out.shape[0])
        g_state = x.new_zeros(batch, d_inner, width) if dstate is None else dstate.contiguous()
        g_h = x.new_zeros(batch, d_state, d_inner) if dh is None else dh.transpose(1, 2)
        g_h = g_h.contiguous()
        small = [_np(t) for t in (Wt_dt, b_dt, At)]
        conv_np = [_np(w_conv), _np(b_conv)]
        dx = torch.empty_like(x)
        dW_in, dW_x, dW_out = (torch.zeros_like(t) for t in (W_in, W_x, W_out))
        db_in = x.new_zeros(W_in.shape[0])
        db_out = x.new_zeros(W_out.shape[0])
        per_row: list[Tensor | int] = [0] * 6  # dw_conv, db_conv, dWt, db_dt, dAt, dD
        for c in range(len(ctx.starts) - 1, -1, -1):
            s = c * chunk
            e = min(length, s + chunk)
            keep_c = keep[:, s:e].contiguous()
            x_c = x[:, s:e].reshape(-1, d_model)
            xz = F.linear(x_c, W_in, b_in).view(batch, e - s, 2 * d_inner)
            hist = ctx.starts[c][:, :, 1:].transpose(1, 2).contiguous()
            xs, _ = kern.conv.conv_silu_fwd(_np(xz), 0, *conv_np, _np(hist), _np(keep_c))
            xs = torch.from_numpy(xs).view(-1, d_inner)
            dt_low, Bm, Cm = (
                t.contiguous().view(batch, e - s, -1)
                for t in torch.split(F.linear(xs, W_x), [dt_rank, d_state, d_state], dim=-1)
            )
            dout_c = dout[:, s:e].reshape(-1, dout.shape[-1])
            g_y = (dout_c @ W_out).view(batch, e - s, d_inner)
            dxz = x.new_empty(batch, e - s, 2 * d_inner)  # d in_proj output: conv | gate
            d_dbl = x.new_empty(batch, e - s, W_x.shape[0])  # d x_proj output
            d_dtl, dB, dC = (_np_view(t) for t in d_dbl.split([dt_rank, d_state, d_state], dim=-1))
            y = torch.empty_like(xs).view(batch, e - s, d_inner)
            grads = kern.scan.mamba_fused_bwd(
                _np(xs.view(batch, e - s, d_inner)), _np(dt_low), small[0], small[1], small[2],
                _np(Bm), _np(Cm), _np(xz), d_inner, _np(D), _np(keep_c), _np(ctx.ckpts[c]),
                _np(g_y), _np(g_h), every, _np(dxz), d_inner, d_dtl, dB, dC, _np(g_y), _np(y),
                _absent(x.dtype),
            )  # fmt: skip
            du = g_y  # (the kernel wrote du over g_y)
            del dt_low, Bm, Cm
            dWt, ddbias, dAt, dDv, dh0 = map(torch.from_numpy, grads)
            dW_out.addmm_(dout_c.t(), y.view(-1, d_inner))
            if ctx.has_bias[1]:
                db_out += dout_c.sum(0)
            del y, dout_c
            d_dbl = d_dbl.view(-1, W_x.shape[0])
            dW_x.addmm_(d_dbl.t(), xs)
            dxs = du.view(-1, d_inner).addmm_(d_dbl, W_x).view(batch, e - s, d_inner)
            del xs, du, d_dbl
            conv_grads = kern.conv.conv_silu_bwd(
                _np(xz), 0, *conv_np, _np(hist), _np(keep_c), _np(dxs), _np(g_state), _np(dxz), 0
            )
            del xz, dxs
            dw_conv, db_conv, dhist = map(torch.from_numpy, conv_grads)
            dxz = dxz.view(-1, 2 * d_inner)
            dW_in.addmm_(dxz.t(), x_c)
            if ctx.has_bias[0]:
                db_in += dxz.sum(0)
            dx[:, s:e] = (dxz @ W_in).view(batch, e - s, d_model)
            del dxz
            for i, g in enumerate((dw_conv, db_conv, dWt, ddbias, dAt, dDv)):
                per_row[i] = per_row[i] + g.sum(0)
            g_h = dh0
            g_state = torch.cat([x.new_zeros(batch, d_inner, 1), dhist.transpose(1, 2)], dim=-1)
        dw_conv, db_conv, dWt, db_dt, dAt, dD = per_row
        return (
            dx, g_state, g_h.transpose(1, 2), None, dW_in, db_in if ctx.has_bias[0] else None,
            dw_conv, db_conv, dW_x, dWt, db_dt, dAt, dD, dW_out,
            db_out if ctx.has_bias[1] else None, None, None,
        )  # fmt: skip


class _NumbaMambaBlockFull(torch.autograd.Function):
    """A whole Mamba block on CPU over the whole sequence at once (in_proj, conv + SiLU,
    x_proj, the gated inner part, out_proj), keeping the activations its backward needs: the
    input, the two in_proj outputs (conv input and gate), the conv output, the x_proj output,
    the gated inner part's output before the gate and the scan's checkpoint states. Nothing
    is recomputed but the scan's states (from the checkpoints, in its backward kernel).

    Compared with the graph of fused ops it replaces (in_proj, conv, gated inner part,
    out_proj as four autograd nodes): the in_proj output is two ``[B, L, d_inner]`` tensors
    rather than one ``[B, L, 2 d_inner]`` (and so are their gradients), and no gradient is
    concatenated or accumulated by autograd. Fewer fresh large tensors: each costs page faults
    besides its writes (glibc serves allocations above 32 MiB, e.g. a float32
    ``[32, 1024, 256]``, with a fresh mmap on every call). The backward kernel reads the
    saved output before the gate instead of recomputing it from the states, and two of the
    backward's ``[B, L, d_inner]`` tensors serve twice: the scan input's gradient is written
    over the out_proj input's gradient, the conv input's gradient over the recomputed out_proj
    input once its weight gradient is taken (fewer page faults than fresh tensors).
    """

    @staticmethod
    @_torch_threads
    def forward(  # type: ignore[override]
        ctx, x, conv_state, h0, keep, W_in, b_in, w_conv, b_conv, W_x, Wt_dt, b_dt, At, D,
        W_out, b_out, dt_rank,
    ):  # fmt: skip
        kern = _jit()
        every = NUMBA_CHECKPOINT_EVERY
        (x, W_in, b_in, w_conv, b_conv, W_x, Wt_dt, b_dt, At, D, W_out, b_out, keep) = (
            _detach_block_inputs(
                x, W_in, b_in, w_conv, b_conv, W_x, Wt_dt, b_dt, At, D, W_out, b_out, keep
            )
        )
        batch, length, d_model = x.shape
        d_inner, d_state = D.shape[0], At.shape[0]
        x2 = x.reshape(-1, d_model)
        b_xs, b_z = (None, None) if b_in is None else b_in.split(d_inner)
        xs_in = F.linear(x2, W_in[:d_inner], b_xs).view(batch, length, d_inner)
        z = F.linear(x2, W_in[d_inner:], b_z).view(batch, length, d_inner)
        hist = conv_state.detach()[:, :, 1:].transpose(1, 2).contiguous()  # [B, W-1, D]
        xs, new_state = kern.conv.conv_silu_fwd(
            _np(xs_in), 0, _np(w_conv), _np(b_conv), _np(hist), _np(keep)
        )
        xs = torch.from_numpy(xs)
        dbl = F.linear(xs, W_x)  # [B, L, R + 2 N]: dt_low | B | C
        dtl, Bm, Cm = (_np_view(t) for t in dbl.split([dt_rank, d_state, d_state], dim=-1))
        pre = torch.empty_like(xs)  # the gated inner part's output before the gate
        y, h_last, ckpt = kern.scan.mamba_fused_fwd(
            _np(xs), dtl, _np(Wt_dt), _np(b_dt), _np(At), Bm, Cm, _np(z), 0, _np(D), _np(keep),
            _np(h0.detach().transpose(1, 2).contiguous()), every, _np(pre),
        )  # fmt: skip
        out = F.linear(torch.from_numpy(y), W_out, b_out)
        del y
        ctx.dims = (dt_rank, every)
        ctx.has_bias = (b_in is not None, b_out is not None)
        ctx.save_for_backward(
            x, xs_in, z, xs, dbl, pre, hist, keep, W_in, w_conv, b_conv, W_x, Wt_dt, b_dt, At,
            D, W_out, torch.from_numpy(ckpt),
        )  # fmt: skip
        return out, torch.from_numpy(new_state), torch.from_numpy(h_last).transpose(1, 2)

    @staticmethod
    @_torch_threads
    def backward(ctx, dout, dstate, dh):  # type: ignore[override]
        kern = _jit()
        saved = ctx.saved_tensors
        x, xs_in, z, xs, dbl, pre, hist, keep, W_in, w_conv, b_conv, W_x = saved[:12]
        Wt_dt, b_dt, At, D, W_out, ckpt = saved[12:]
        dt_rank, every = ctx.dims
        batch, length, d_model = x.shape
        d_inner, d_state, width = D.shape[0], At.shape[0], w_conv.shape[0]
        if dout is None:
            dout = x.new_zeros(batch, length, W_out.shape[0])
        dstate = x.new_zeros(batch, d_inner, width) if dstate is None else dstate.contiguous()
        dh = x.new_zeros(batch, d_inner, d_state) if dh is None else dh
        dh = dh.transpose(1, 2).contiguous()  # [B, N, D]
        dout2 = dout.reshape(-1, dout.shape[-1])
        g_y = (dout2 @ W_out).view(batch, length, d_inner)  # d out_proj input
        split = [dt_rank, d_state, d_state]
        dtl, Bm, Cm = (_np_view(t) for t in dbl.split(split, dim=-1))
        dz = torch.empty_like(z)
        d_dbl = torch.empty_like(dbl)  # dt_low | B | C
        d_dtl, dB, dC = (_np_view(t) for t in d_dbl.split(split, dim=-1))
        y = torch.empty_like(xs)  # out_proj's input, for its weight gradient
        g_y_np = _np(g_y)
        dWt, ddbias, dAt, dD, dh0 = map(
            torch.from_numpy,
            kern.scan.mamba_fused_bwd(
                _np(xs), dtl, _np(Wt_dt), _np(b_dt), _np(At), Bm, Cm, _np(z), 0, _np(D),
                _np(keep), _np(ckpt), g_y_np, _np(dh), every, _np(dz), 0, d_dtl, dB, dC,
                g_y_np, _np(y), _np(pre),
            ),
        )  # fmt: skip
        du = g_y  # (the kernel wrote du over g_y)
        dW_out = dout2.t() @ y.view(-1, d_inner)
        db_out = dout2.sum(0) if ctx.has_bias[1] else None
        flat_dbl = d_dbl.view(-1, d_dbl.shape[-1])
        dW_x = flat_dbl.t() @ xs.view(-1, d_inner)
        dxs = du.view(-1, d_inner).addmm_(flat_dbl, W_x).view(batch, length, d_inner)
        del du, flat_dbl, d_dbl
        dxs_in = y  # (y is read no more: the conv's input gradient goes into its memory)
        del y
        dw_conv, db_conv, dhist = map(
            torch.from_numpy,
            kern.conv.conv_silu_bwd(
                _np(xs_in), 0, _np(w_conv), _np(b_conv), _np(hist), _np(keep), _np(dxs),
                _np(dstate), _np(dxs_in), 0,
            ),
        )  # fmt: skip
        del dxs
        g_state = torch.cat([x.new_zeros(batch, d_inner, 1), dhist.transpose(1, 2)], dim=-1)
        x2 = x.reshape(-1, d_model)
        dxs_in, dz = dxs_in.view(-1, d_inner), dz.view(-1, d_inner)
        dW_in = torch.cat([dxs_in.t() @ x2, dz.t() @ x2])
        db_in = torch.cat([dxs_in.sum(0), dz.sum(0)]) if ctx.has_bias[0] else None
        dx = (dxs_in @ W_in[:d_inner]).addmm_(dz, W_in[d_inner:]).view(batch, length, d_model)
        return (
            dx, g_state, dh0.transpose(1, 2), None, dW_in, db_in, dw_conv.sum(0), db_conv.sum(0),
            dW_x, dWt.sum(0), ddbias.sum(0), dAt.sum(0), dD.sum(0), dW_out, db_out, None,
        )  # fmt: skip


def mamba_block_numba(
    x: Tensor,
    conv_state: Tensor,
    h0: Tensor,
    resets: Tensor | None,
    in_proj: tuple[Tensor, Tensor | None],
    conv: tuple[Tensor, Tensor | None],
    x_proj_weight: Tensor,
    dt_proj: tuple[Tensor, Tensor],
    A: Tensor,
    D: Tensor,
    out_proj: tuple[Tensor, Tensor | None],
) -> tuple[Tensor, Tensor, Tensor]:
    """A Mamba block's forward (``seqmodels.Mamba``'s, numba backend) as one autograd Function:
    below ``MAMBA_WINDOWED_MIN_TOKENS`` tokens (B * L) over the whole sequence, keeping the
    activations its backward needs; from there on in time windows of ``MAMBA_BLOCK_TOKENS // B``
    steps that keep no ``[B, L, d_inner]`` activation (the backward recomputes them).

    x ``[B, L, d_model]``; conv_state ``[B, d_inner, d_conv]``; h0 ``[B, d_inner, d_state]``;
    resets ``[B, L]`` or None; in_proj, conv (``[d_inner, 1, d_conv]`` weight), dt_proj and
    out_proj as (weight, bias); A ``[d_inner, d_state]`` (= -exp(A_log)); D ``[d_inner]``.
    Returns y ``[B, L, d_model]``, the new conv state and the last SSM state.
    """
    dtype = x.dtype
    d_inner = D.shape[0]
    W_in, b_in = (None if t is None else t.to(dtype) for t in in_proj)
    W_out, b_out = (None if t is None else t.to(dtype) for t in out_proj)
    conv_w, conv_b = conv
    w_conv = conv_w[:, 0, :].t().to(dtype)  # [W, d_inner]
    b_conv = x.new_zeros(d_inner) if conv_b is None else conv_b.to(dtype)
    Wt_dt = dt_proj[0].t().to(dtype)  # [R, d_inner]
    args = (
        x, conv_state.to(dtype), h0.to(dtype), _keep_or_ones(resets, x), W_in, b_in, w_conv,
        b_conv, x_proj_weight.to(dtype), Wt_dt, dt_proj[1].to(dtype), A.t().to(dtype),
        D.to(dtype), W_out, b_out, Wt_dt.shape[0],
    )  # fmt: skip
    if x.shape[0] * x.shape[1] < MAMBA_WINDOWED_MIN_TOKENS:
        out, state, h_last = _NumbaMambaBlockFull.apply(*args)
    else:
        out, state, h_last = _NumbaMambaBlock.apply(*args, max(1, MAMBA_BLOCK_TOKENS // x.shape[0]))
    return out, state.to(conv_state.dtype), h_last


# --------------------------------------------------------------------------------------------
# single-step ops (rollouts, no autograd)
# --------------------------------------------------------------------------------------------


def conv_step_silu_numba(
    conv_state: Tensor, x: Tensor, weight: Tensor, bias: Tensor | None
) -> tuple[Tensor, Tensor]:
    """One causal-conv step then SiLU in one kernel (contract of
    ``seqmodels.ops.conv_step_silu_reference``): conv_state ``[B, C, W]``, x ``[B, C]``,
    weight ``[C, 1, W]``, bias ``[C]`` or None -> (silu(out) ``[B, C]``, new state)."""
    dtype = x.dtype
    w = weight[:, 0, :]
    b = x.new_zeros(w.shape[0]) if bias is None else bias.to(dtype)
    arrays = [_np(t.to(dtype)) for t in (conv_state, x, w, b)]
    with torch_thread_count():
        new_state, out = _jit().conv.conv_step_silu(*arrays)
    return torch.from_numpy(out), torch.from_numpy(new_state).to(conv_state.dtype)


def selective_state_update_numba(
    h: Tensor, dt: Tensor, x: Tensor, A: Tensor, Bm: Tensor, Cm: Tensor
) -> tuple[Tensor, Tensor]:
    """One Mamba state update in one kernel (contract of
    ``seqmodels.scan.selective_state_update_reference``)."""
    dtype = x.dtype
    arrays = [_np(t.to(dtype)) for t in (h, dt, x, A, Bm, Cm)]
    with torch_thread_count():
        h_new, y = _jit().scan.mamba_step(*arrays)
    return torch.from_numpy(h_new), torch.from_numpy(y)


def selective_state_update_gated_numba(
    h: Tensor,
    dt: Tensor,
    x: Tensor,
    z: Tensor,
    A: Tensor,
    D: Tensor,
    Bm: Tensor,
    Cm: Tensor,
    dt_bias: Tensor | None = None,
    dt_softplus: bool = False,
) -> tuple[Tensor, Tensor]:
    """Step size, state update, D skip and SiLU gate of one Mamba step in one kernel (contract
    of ``seqmodels.scan.selective_state_update_gated_reference``)."""
    dtype = x.dtype
    bias = x.new_zeros(x.shape[-1]) if dt_bias is None else dt_bias.to(dtype)
    h_np, dt_np, bias_np = (_np(t.to(dtype)) for t in (h, dt, bias))
    rest = [_np(t.to(dtype)) for t in (x, z, A, D, Bm, Cm)]
    with torch_thread_count():
        h_new, y = _jit().scan.mamba_step_gated(h_np, dt_np, bias_np, bool(dt_softplus), *rest)
    return torch.from_numpy(h_new), torch.from_numpy(y)


def mamba_step_numba(
    xz: Tensor,
    conv_state: Tensor,
    ssm_state: Tensor,
    reset: Tensor | None,
    conv: tuple[Tensor, Tensor | None],
    x_proj_weight: Tensor,
    dt_proj: tuple[Tensor, Tensor],
    A: Tensor,
    D: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    """A Mamba step after in_proj in one kernel (contract of
    ``seqmodels.ops.mamba_step_reference``): xz ``[B, 2 d_inner]``; conv_state
    ``[B, d_inner, d_conv]``; ssm_state ``[B, d_inner, d_state]``; reset ``[B]`` bool or None;
    conv (``[d_inner, 1, d_conv]`` weight, bias) and dt_proj as (weight, bias); x_proj_weight;
    A ``[d_inner, d_state]``; D ``[d_inner]``. Returns (y ``[B, d_inner]``, new conv state,
    new SSM state); no copy of the states is made besides the new ones."""
    dtype = xz.dtype
    conv_w, conv_b = conv
    batch, d_inner = xz.shape[0], conv_w.shape[0]
    bias = xz.new_zeros(d_inner) if conv_b is None else conv_b
    flags = np.zeros(batch, dtype=np.bool_) if reset is None else _np(reset)
    arrays = [
        _np(t if t.dtype == dtype else t.to(dtype))
        for t in (
            xz, conv_state, ssm_state, conv_w.view(d_inner, -1), bias, x_proj_weight,
            dt_proj[0], dt_proj[1], A, D,
        )
    ]  # fmt: skip
    with torch_thread_count():
        y, new_conv, new_ssm = _jit().block_step.mamba_step_fused(
            *arrays[:3], flags, *arrays[3:], False
        )
    y, new_conv, new_ssm = (torch.from_numpy(t) for t in (y, new_conv, new_ssm))
    if new_conv.dtype != conv_state.dtype:
        new_conv = new_conv.to(conv_state.dtype)
    if new_ssm.dtype != ssm_state.dtype:
        new_ssm = new_ssm.to(ssm_state.dtype)
    return y, new_conv, new_ssm


def mamba_step_views(
    conv: tuple[Tensor, Tensor | None],
    x_proj_weight: Tensor,
    dt_proj: tuple[Tensor, Tensor],
    A_log: Tensor,
    D: Tensor,
) -> tuple[Any, ...] | None:
    """numpy views of a Mamba block's step parameters for :func:`mamba_step_numba_views` (no
    copies, nothing computed from them: an in-place update of a parameter, such as an
    optimizer step, is seen through the view; a parameter whose tensor is replaced has a new
    ``data_ptr``, which the caller keys its cache on). None unless every parameter is a
    contiguous CPU tensor of one floating dtype (the caller then takes the general path)."""
    conv_w, conv_b = conv
    params = [conv_w, x_proj_weight, *dt_proj, A_log, D]
    if conv_b is not None:
        params.append(conv_b)
    dtype = params[0].dtype
    if not dtype.is_floating_point or any(
        t.device.type != "cpu" or t.dtype != dtype or not t.is_contiguous() for t in params
    ):
        return None
    d_inner = conv_w.shape[0]
    bias = np.zeros(d_inner, dtype=_np(conv_w).dtype) if conv_b is None else _np(conv_b)
    w = _np(conv_w.view(d_inner, -1))
    return (w, bias, *(_np(t) for t in (x_proj_weight, *dt_proj, A_log, D)))


def mamba_step_numba_views(
    xz: Tensor, conv_state: Tensor, ssm_state: Tensor, reset: Tensor | None, views: tuple
) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`mamba_step_numba` with the parameters given as :func:`mamba_step_views` (A_log
    in place of A: the kernel computes A = -exp(A_log)); the rollout path of
    ``seqmodels.Mamba.step``, which keeps the views per parameter ``data_ptr``. xz and the
    states must have the views' dtype."""
    flags = np.zeros(xz.shape[0], dtype=np.bool_) if reset is None else _np(reset)
    with torch_thread_count():
        y, new_conv, new_ssm = _jit().block_step.mamba_step_fused(
            _np(xz), _np(conv_state), _np(ssm_state), flags, *views, True
        )
    return torch.from_numpy(y), torch.from_numpy(new_conv), torch.from_numpy(new_ssm)


def mamba2_step_views(
    conv: tuple[Tensor, Tensor | None],
    dt_bias: Tensor,
    A_log: Tensor,
    D: Tensor,
    norm_weight: Tensor | None,
) -> tuple[Any, ...] | None:
    """numpy views of a Mamba2 block's step parameters for :func:`mamba2_step_numba_views`
    (as :func:`mamba_step_views`: no copies, nothing computed from them; the caller keys its
    cache on the parameters' ``data_ptr``): conv (``[conv_dim, 1, d_conv]`` weight, bias or
    None), dt_bias, A_log ``[nheads]``, D ``[nheads]`` or ``[d_ssm]``, the gated norm's weight
    ``[d_ssm]`` or None (no norm). None unless every parameter is a contiguous CPU tensor of
    one floating dtype (the caller then takes the general path)."""
    conv_w, conv_b = conv
    params = [conv_w, dt_bias, A_log, D]
    params += [t for t in (conv_b, norm_weight) if t is not None]
    dtype = params[0].dtype
    if dtype not in _NP_DTYPES or any(
        t.device.type != "cpu" or t.dtype != dtype or not t.is_contiguous() for t in params
    ):
        return None
    np_dtype = _NP_DTYPES[dtype]
    conv_dim = conv_w.shape[0]
    bias = np.zeros(conv_dim, dtype=np_dtype) if conv_b is None else _np(conv_b)
    weight = np.zeros(0, dtype=np_dtype) if norm_weight is None else _np(norm_weight)
    return (_np(conv_w.view(conv_dim, -1)), bias, *(_np(t) for t in (dt_bias, A_log, D)), weight)


def mamba2_step_numba_views(
    zxbcdt: Tensor,
    conv_state: Tensor,
    ssm_state: Tensor,
    reset: Tensor | None,
    views: tuple,
    norm: tuple[float, bool],
    dt_limit: tuple[float, float],
) -> tuple[Tensor, Tensor, Tensor]:
    """A Mamba2 step after in_proj in one kernel (``numba.block_step.mamba2_step_fused``), the
    rollout path of ``seqmodels.Mamba2.step`` (its general path is the readable twin):
    zxbcdt ``[B, d_in_proj]`` (in_proj's output, read in place), conv_state ``[B, conv_dim,
    d_conv]``, ssm_state ``[B, nheads, headdim, d_state]``, reset ``[B]`` bool or None,
    views from :func:`mamba2_step_views`, norm (eps, norm_before_gate) of the gated RMSNorm,
    dt_limit (low, high) the step size's clamp ((0, inf): none). Returns (y ``[B, d_inner]``,
    out_proj's input; new conv state; new SSM state). zxbcdt and the states must have the
    views' dtype."""
    flags = np.zeros(zxbcdt.shape[0], dtype=np.bool_) if reset is None else _np(reset)
    eps, norm_before_gate = norm
    clamp = tuple(dt_limit) != (0.0, float("inf"))
    with torch_thread_count():
        y, new_conv, new_ssm = _jit().block_step.mamba2_step_fused(
            _np(zxbcdt), _np(conv_state), _np(ssm_state), flags, *views,
            float(eps), bool(norm_before_gate), float(dt_limit[0]), float(dt_limit[1]), clamp,
        )  # fmt: skip
    return torch.from_numpy(y), torch.from_numpy(new_conv), torch.from_numpy(new_ssm)


def ssd_state_update_numba(
    h: Tensor, dt: Tensor, x: Tensor, A: Tensor, Bm: Tensor, Cm: Tensor
) -> tuple[Tensor, Tensor]:
    """One Mamba2 state update in one kernel (contract of
    ``seqmodels.scan.ssd_state_update_reference``)."""
    dtype = x.dtype
    arrays = [_np(t.to(dtype)) for t in (h, dt, x, A, Bm, Cm)]
    with torch_thread_count():
        h_new, y = _jit().ssd.ssd_step(*arrays)
    return torch.from_numpy(h_new), torch.from_numpy(y)


__all__ = [
    "MAMBA_BLOCK_TOKENS",
    "MAMBA_WINDOWED_MIN_TOKENS",
    "NUMBA_CHECKPOINT_EVERY",
    "conv_silu_numba",
    "conv_step_silu_numba",
    "mamba_block_numba",
    "mamba_inner_numba",
    "mamba_step_numba",
    "rmsnorm_gated_numba",
    "rmsnorm_numba",
    "selective_scan_numba",
    "selective_state_update_gated_numba",
    "selective_state_update_numba",
    "ssd_scan_numba",
    "ssd_state_update_numba",
]
