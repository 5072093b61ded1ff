"""A whole Mamba / Mamba2 block's step after in_proj, in one kernel each: the rollout path
(``Mamba.step`` and ``Mamba2.step`` under ``torch.no_grad`` on the numba backend, with the
parameters read in place through cached numpy views).

=====================  ===================================================  =====================
kernel                 op (:mod:`seqmodels.kernels.numba_ops`)              call path
=====================  ===================================================  =====================
``mamba_step_fused``   ``mamba_step_numba_views`` (``Mamba.step``),         rollout step of
                       ``mamba_step_numba`` (``seqmodels.ops.mamba_step``)  Mamba (hot)
``mamba2_step_fused``  ``mamba2_step_numba_views`` (``Mamba2.step``)        rollout step of
                                                                            Mamba2 (hot)
=====================  ===================================================  =====================

Each composes the per-row bodies of its op families, inlined: the conv step
(:func:`~seqmodels.kernels.numba.conv.conv_silu_step_row`, shared with ``conv_step_silu``), the
step size before softplus (:func:`~seqmodels.kernels.numba.scan.dt_proj_row`, shared with the
Mamba training kernels), Mamba2's head update
(:func:`~seqmodels.kernels.numba.ssd.ssd_head_update`, shared with ``ssd_step``) and gated
norm (:func:`~seqmodels.kernels.numba.norm.rmsnorm_gated_row`, shared with
``rmsnorm_gated_fwd``). Mamba's state update stays here: it takes the exp and sums C . h
differently from ``mamba_step`` / ``mamba_step_gated`` (see :mod:`seqmodels.kernels.numba.scan`).
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import prange

from seqmodels.kernels.numba.conv import conv_silu_step_row
from seqmodels.kernels.numba.norm import rmsnorm_gated_row
from seqmodels.kernels.numba.numerics import FASTMATH, dot, exp_scale, fexp, fexp2, fsoftplus
from seqmodels.kernels.numba.scan import dt_proj_row
from seqmodels.kernels.numba.ssd import ssd_head_update

# hot path: both kernels (every rollout step of a Mamba / Mamba2 policy)
HOT_PATH = ("mamba_step_fused", "mamba2_step_fused")


@numba.njit(parallel=True, cache=True, fastmath=FASTMATH)
def mamba_step_fused(
    xz, conv_state, ssm_state, reset, conv_w, conv_b, W_x, W_dt, b_dt, A, Dv, a_is_log
):
    """A whole Mamba step after in_proj (rollouts, no autograd): conv + SiLU, x_proj, dt_proj +
    softplus, state update, C . h + D skip, SiLU gate; the rows that reset start from zero
    states (replaced, not multiplied by 0).

    xz [B, 2 D] (in_proj output: x | z); conv_state [B, D, W], ssm_state [B, D, N]
    (mamba-ssm layouts); reset [B] bool; conv_w [D, W]; conv_b [D]; W_x [R + 2 N, D];
    W_dt [D, R]; b_dt, Dv [D]; A [D, N], or A_log [D, N] when a_is_log (A = -exp(A_log) is
    then computed here: the caller may pass views of the parameters, nothing derived from
    them). Returns y [B, D] (out_proj's input), the new conv state and the new SSM state.

    Same arithmetic, in the same order, as the training kernels (conv_silu_fwd's taps oldest
    first after the bias; mamba_fused_fwd's bias + dt_low . W_dt, softplus, fexp2 decays,
    C . h summed over n in order, then + D u, times silu(z)), so a step loop reproduces the
    forward to float rounding (x_proj is a dot product here, a matmul there; C . h a vectorised
    dot product over n per channel here, a sum over n in order there).
    """
    batch, d_inner, width = conv_state.shape
    d_state = ssm_state.shape[2]
    rank = W_dt.shape[1]
    n_dbl = W_x.shape[0]
    dtype = xz.dtype
    one = dtype.type(1)
    y = np.empty((batch, d_inner), dtype=dtype)
    new_conv = np.empty_like(conv_state)
    new_ssm = np.empty_like(ssm_state)
    a_scaled = np.empty((d_inner, d_state), dtype=dtype)
    for d in range(d_inner):
        for n in range(d_state):
            a = -math.exp(A[d, n]) if a_is_log else A[d, n]
            a_scaled[d, n] = a * exp_scale(a)
    Wt = np.empty((rank, d_inner), dtype=dtype)
    for d in range(d_inner):
        for r in range(rank):
            Wt[r, d] = W_dt[d, r]
    zero_conv = np.zeros((d_inner, width), dtype=dtype)
    zero_ssm = np.zeros((d_inner, d_state), dtype=dtype)
    for b in prange(batch):
        xs = np.empty(d_inner, dtype=dtype)
        dl = np.empty(d_inner, dtype=dtype)
        acc = np.empty(d_inner, dtype=dtype)
        dbl = np.empty(n_dbl, dtype=dtype)
        old_conv = zero_conv if reset[b] else conv_state[b]
        xr = xz[b]
        conv_silu_step_row(old_conv, xr, 0, conv_w, conv_b, new_conv[b], xs, one)
        for j in range(n_dbl):
            dbl[j] = dot(W_x[j], xs)
        dt_proj_row(dl, b_dt, dbl, Wt)
        for d in range(d_inner):
            dl[d] = fsoftplus(dl[d])
        h_old = zero_ssm if reset[b] else ssm_state[b]  # (see the package docstring)
        h_new = new_ssm[b]
        Bv = dbl[rank : rank + d_state]
        Cv = dbl[rank + d_state : rank + 2 * d_state]
        for d in range(d_inner):
            dtv = dl[d]
            dtx = dtv * xs[d]
            a_row, h_row, new_row = a_scaled[d], h_old[d], h_new[d]
            for n in range(d_state):
                new_row[n] = fexp2(dtv * a_row[n]) * h_row[n] + dtx * Bv[n]
            acc[d] = dot(new_row, Cv)
        yr = y[b]
        for d in range(d_inner):  # D skip and gate in their own loop, which vectorises
            zv = xr[d_inner + d]
            yr[d] = (acc[d] + Dv[d] * xs[d]) * (zv / (one + fexp(-zv)))
    return y, new_conv, new_ssm


@numba.njit(parallel=True, cache=True, fastmath=FASTMATH)
def mamba2_step_fused(
    zxbcdt,
    conv_state,
    ssm_state,
    reset,
    conv_w,
    conv_b,
    dt_bias,
    A_log,
    Dv,
    norm_w,
    eps,
    norm_before_gate,
    dt_min,
    dt_max,
    clamp_dt,
):
    """A whole Mamba2 step after in_proj (rollouts, no autograd): conv + SiLU, softplus step
    size, SSD state update, C . h + D skip, gated RMSNorm (or the SiLU gate) and the gated-MLP
    channels; the rows that reset start from zero states (replaced, not multiplied by 0).

    zxbcdt [B, 2 d_mlp + d_ssm + conv_dim + H] (in_proj output: z0 | x0 | z | xBC | dt, read
    in place: no channel slice is copied); conv_state [B, conv_dim, W], ssm_state [B, H, P, N]
    (mamba-ssm layouts; conv_dim = d_ssm + 2 G N, d_ssm = H P); reset [B] bool;
    conv_w [conv_dim, W]; conv_b [conv_dim]; dt_bias, A_log [H] (A = -exp(A_log) computed
    here: the caller may pass views of the parameters, nothing derived from them); Dv [H], or
    [d_ssm] (D_has_hdim); norm_w [d_ssm], or [0] for no norm (y * silu(z)), RMS over G groups
    of d_ssm / G channels with eps, norm_before_gate as ``RMSNormGated``; the step size
    clamped to [dt_min, dt_max] when clamp_dt. G and d_mlp follow from the shapes.
    Returns y [B, d_mlp + d_ssm] (out_proj's input: silu(z0) x0 | normed y), the new conv
    state and the new SSM state.

    Same arithmetic as the training kernels (conv_silu_fwd's taps oldest first after the bias;
    ssd_fwd_t's decay exp(dt A) per head and h = a h + (dt x) B, then D x + C . h;
    rmsnorm_gated_fwd's group RMS), so a step loop reproduces the forward to float rounding
    (C . h a vectorised dot product over n here, a sum over n in order there).
    """
    batch, conv_dim, width = conv_state.shape
    nheads, headdim, d_state = ssm_state.shape[1], ssm_state.shape[2], ssm_state.shape[3]
    d_ssm = nheads * headdim
    ngroups = (conv_dim - d_ssm) // (2 * d_state)
    heads_per_group = nheads // ngroups
    d_mlp = (zxbcdt.shape[1] - conv_dim - d_ssm - nheads) // 2
    z_off = 2 * d_mlp
    xbc_off = z_off + d_ssm
    dt_off = xbc_off + conv_dim
    c_off = d_ssm + ngroups * d_state  # C's offset in the conv output (B's is d_ssm)
    dtype = zxbcdt.dtype
    one = dtype.type(1)
    lo, hi = dtype.type(dt_min), dtype.type(dt_max)
    rmsnorm = norm_w.shape[0] > 0
    group_size = d_ssm // ngroups
    A = np.empty(nheads, dtype=dtype)
    for hh in range(nheads):
        A[hh] = -math.exp(A_log[hh])
    Dq = np.empty(d_ssm, dtype=dtype)  # the skip D per channel
    d_per_channel = Dv.shape[0] == d_ssm
    for c in range(d_ssm):
        Dq[c] = Dv[c] if d_per_channel else Dv[c // headdim]
    y = np.empty((batch, d_mlp + d_ssm), dtype=dtype)
    new_conv = np.empty_like(conv_state)
    new_ssm = np.empty_like(ssm_state)
    zero_conv = np.zeros((conv_dim, width), dtype=dtype)
    zero_ssm = np.zeros((nheads, headdim, d_state), dtype=dtype)
    for b in prange(batch):
        xbc = np.empty(conv_dim, dtype=dtype)
        step = np.empty(nheads, dtype=dtype)
        ys = np.empty(d_ssm, dtype=dtype)
        sz = np.empty(d_ssm, dtype=dtype)
        sq = np.empty(d_ssm, dtype=dtype)
        rstd = np.empty(d_ssm, dtype=dtype)
        row = zxbcdt[b]
        old_conv = zero_conv if reset[b] else conv_state[b]
        conv_silu_step_row(old_conv, row, xbc_off, conv_w, conv_b, new_conv[b], xbc, one)
        for hh in range(nheads):
            v = fsoftplus(row[dt_off + hh] + dt_bias[hh])
            step[hh] = min(max(v, lo), hi) if clamp_dt else v
        h_old = zero_ssm if reset[b] else ssm_state[b]  # (see the package docstring)
        h_new = new_ssm[b]
        for hh in range(nheads):
            g = hh // heads_per_group
            Bv = xbc[d_ssm + g * d_state : d_ssm + (g + 1) * d_state]
            Cv = xbc[c_off + g * d_state : c_off + (g + 1) * d_state]
            dtv = step[hh]
            decay = math.exp(dtv * A[hh])
            c0 = hh * headdim  # the head's first channel
            ssd_head_update(h_old[hh], xbc[c0 : c0 + headdim], dtv, decay, Bv, h_new[hh])
            for p in range(headdim):
                c = c0 + p
                ys[c] = Dq[c] * xbc[c] + dot(h_new[hh, p], Cv)
        yr = y[b]
        for c in range(d_mlp):  # the gated-MLP channels
            zv = row[c]
            yr[c] = zv / (one + fexp(-zv)) * row[d_mlp + c]
        for c in range(d_ssm):
            zv = row[z_off + c]
            sz[c] = zv / (one + fexp(-zv))
        out = yr[d_mlp:]
        if rmsnorm:  # (ys is rmsnorm_gated_row's scratch u: each entry read before written)
            rmsnorm_gated_row(ys, sz, norm_w, group_size, eps, norm_before_gate, ys, sq, rstd, out)
        else:
            for c in range(d_ssm):
                out[c] = ys[c] * sz[c]
    return y, new_conv, new_ssm


__all__ = ["HOT_PATH", "mamba2_step_fused", "mamba_step_fused"]
