"""RMSNorm kernels: the gated RMSNorm of Mamba2's output and the plain RMSNorm of the
backbones' pre-block and final norms, forward and backward over rows of a sequence.

=====================  ==============================  ========================================
kernel                 op (``numba_ops``)              call path
=====================  ==============================  ========================================
``rmsnorm_gated_fwd``  ``rmsnorm_gated_numba``         Mamba2 training forward (hot)
``rmsnorm_gated_bwd``  ``rmsnorm_gated_numba``         Mamba2 training backward (hot)
``rmsnorm_fwd``        ``rmsnorm_numba``               the backbones' norms on a sequence:
                                                       training forward (hot), and a sequence
                                                       forward without autograd
``rmsnorm_bwd``        ``rmsnorm_numba``               training backward (hot)
=====================  ==============================  ========================================

:func:`rmsnorm_gated_row` (one row of the gated norm) is shared by ``rmsnorm_gated_fwd`` and
Mamba2's whole-block step (:func:`seqmodels.kernels.numba.block_step.mamba2_step_fused`, the
rollout path). A rollout step's own norms (``[B, C]`` inputs) run torch's ops, not these.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import prange

from seqmodels.kernels.numba.numerics import FASTMATH, dot, fexp, lane_sum

# hot path: all four kernels (training forward and backward)
HOT_PATH = ("rmsnorm_gated_fwd", "rmsnorm_gated_bwd", "rmsnorm_fwd", "rmsnorm_bwd")


@numba.njit(cache=True, fastmath=FASTMATH, inline="always")
def _group_rstd(u, sq, rstd, group_size, eps):
    """rstd[c] = 1 / sqrt(mean of u^2 over c's group + eps) (u, sq, rstd [C]; sq: scratch)."""
    channels = u.shape[0]
    for c in range(channels):
        sq[c] = u[c] * u[c]
    for lo in range(0, channels, group_size):
        r = 1 / math.sqrt(lane_sum(sq[lo : lo + group_size]) / group_size + eps)
        for c in range(lo, lo + group_size):
            rstd[c] = r  # (rounded to the array's dtype)


@numba.njit(cache=True, fastmath=FASTMATH, inline="always")
def rmsnorm_gated_row(x, sz, weight, group_size, eps, norm_before_gate, u, sq, rstd, out):
    """One row of the gated RMSNorm: x, sz = silu(z), weight, out [C]; RMS over groups of
    group_size channels. norm_before_gate: out = rmsnorm(x) * weight * sz, else
    rmsnorm(x * sz) * weight. u, sq, rstd [C]: scratch (u may be x itself: each entry is read
    before it is written)."""
    channels = x.shape[0]
    if norm_before_gate:
        _group_rstd(x, sq, rstd, group_size, eps)
        for c in range(channels):
            out[c] = x[c] * rstd[c] * weight[c] * sz[c]
    else:
        for c in range(channels):
            u[c] = x[c] * sz[c]
        _group_rstd(u, sq, rstd, group_size, eps)
        for c in range(channels):
            out[c] = u[c] * rstd[c] * weight[c]


@numba.njit(parallel=True, cache=True, fastmath=FASTMATH)
def rmsnorm_gated_fwd(x, src, off, weight, group_size, eps, norm_before_gate):
    """x [B, L, C]; the gate z[b, t, c] = src[b, t, off + c] (src [B, L, S]); weight [C]; RMS
    over groups of group_size channels. norm_before_gate: rmsnorm(x) * weight * silu(z), else
    rmsnorm(x * silu(z)) * weight. Returns [B, L, C]."""
    batch, length, channels = x.shape
    out = np.empty_like(x)
    one = x.dtype.type(1)
    for b in prange(batch):
        u = np.empty(channels, dtype=x.dtype)
        sz = np.empty(channels, dtype=x.dtype)
        sq = np.empty(channels, dtype=x.dtype)
        rstd = np.empty(channels, dtype=x.dtype)
        for t in range(length):
            zr = src[b, t, off : off + channels]
            for c in range(channels):
                zv = zr[c]
                sz[c] = zv / (one + fexp(-zv))
            rmsnorm_gated_row(
                x[b, t], sz, weight, group_size, eps, norm_before_gate, u, sq, rstd, out[b, t]
            )
    return out


@numba.njit(parallel=True, cache=True, fastmath=FASTMATH)
def rmsnorm_gated_bwd(x, src, off, weight, group_size, eps, norm_before_gate, dout):
    """Backward of :func:`rmsnorm_gated_fwd` (dout [B, L, C]): dx, dz [B, L, C] and dweight
    per row [B, C]."""
    batch, length, channels = x.shape
    dx = np.empty_like(x)
    dz = np.empty_like(x)
    dweight = np.zeros((batch, channels), dtype=x.dtype)
    one = x.dtype.type(1)
    for b in prange(batch):
        u = np.empty(channels, dtype=x.dtype)
        sz = np.empty(channels, dtype=x.dtype)
        dsz = np.empty(channels, dtype=x.dtype)  # silu'(z)
        sq = np.empty(channels, dtype=x.dtype)
        rstd = np.empty(channels, dtype=x.dtype)
        gu = np.empty(channels, dtype=x.dtype)  # d loss / d (u * rstd)
        dw_b = dweight[b]
        for t in range(length):
            xr = x[b, t]
            zr = src[b, t, off : off + channels]
            gr = dout[b, t]
            for c in range(channels):
                zv = zr[c]
                sig = one / (one + fexp(-zv))
                sz[c] = zv * sig
                dsz[c] = sig * (one + zv * (one - sig))
            if norm_before_gate:
                u[:] = xr
            else:
                for c in range(channels):
                    u[c] = xr[c] * sz[c]
            _group_rstd(u, sq, rstd, group_size, eps)
            dzr = dz[b, t]
            if norm_before_gate:
                for c in range(channels):
                    normed = u[c] * rstd[c] * weight[c]
                    dzr[c] = gr[c] * normed * dsz[c]
                    g = gr[c] * sz[c]
                    dw_b[c] += g * u[c] * rstd[c]
                    gu[c] = g * weight[c]
            else:
                for c in range(channels):
                    dw_b[c] += gr[c] * u[c] * rstd[c]
                    gu[c] = gr[c] * weight[c]
            for c in range(channels):
                sq[c] = gu[c] * u[c]
            for lo in range(0, channels, group_size):
                r = rstd[lo]
                proj = lane_sum(sq[lo : lo + group_size]) * r * r / group_size
                for c in range(lo, lo + group_size):
                    gu[c] = r * (gu[c] - u[c] * proj)  # now d loss / d u
            dxr = dx[b, t]
            if norm_before_gate:
                dxr[:] = gu
            else:
                for c in range(channels):
                    dxr[c] = gu[c] * sz[c]
                    dzr[c] = gu[c] * xr[c] * dsz[c]
    return dx, dz, dweight


# --- RMSNorm over the last dimension (the backbones' pre-block and final norms) -------------


@numba.njit(parallel=True, cache=True, fastmath=FASTMATH)
def rmsnorm_fwd(x, weight, eps):
    """x [M, C] rows; weight [C]. Returns out = x * rstd * weight [M, C] and rstd [M], with
    rstd = 1 / sqrt(mean(x^2) + eps) per row."""
    rows, channels = x.shape
    out = np.empty_like(x)
    rstd = np.empty(rows, dtype=x.dtype)
    for i in prange(rows):
        xr = x[i]
        r = 1 / math.sqrt(dot(xr, xr) / channels + eps)
        rstd[i] = r  # (rounded to the array's dtype)
        orow = out[i]
        for c in range(channels):
            orow[c] = xr[c] * rstd[i] * weight[c]
    return out, rstd


@numba.njit(parallel=True, cache=True, fastmath=FASTMATH)
def rmsnorm_bwd(x, weight, rstd, dout, n_parts):
    """Backward of :func:`rmsnorm_fwd` (dout [M, C]): dx [M, C] and the weight's gradient in
    ``n_parts`` partial sums [n_parts, C] over consecutive blocks of rows (summed by the
    caller; a fixed partition, so the result does not depend on the thread count).

    With xhat = x * r and gu = dout * weight: dx = r * (gu - xhat * mean(gu * xhat))
    = r * (gu - x * r^2 * (gu . x) / C); dweight = sum over rows of dout * xhat."""
    rows, channels = x.shape
    dx = np.empty_like(x)
    dweight = np.zeros((n_parts, channels), dtype=x.dtype)
    per = (rows + n_parts - 1) // n_parts
    for p in prange(n_parts):
        dw = dweight[p]
        gu = np.empty(channels, dtype=x.dtype)
        for i in range(p * per, min(rows, (p + 1) * per)):
            xr = x[i]
            gr = dout[i]
            r = rstd[i]
            for c in range(channels):
                dw[c] += gr[c] * (xr[c] * r)
                gu[c] = gr[c] * weight[c]
            proj = dot(gu, xr) * r * r / channels
            dxr = dx[i]
            for c in range(channels):
                dxr[c] = r * (gu[c] - xr[c] * proj)
    return dx, dweight


__all__ = [
    "HOT_PATH",
    "rmsnorm_bwd",
    "rmsnorm_fwd",
    "rmsnorm_gated_bwd",
    "rmsnorm_gated_fwd",
    "rmsnorm_gated_row",
]
