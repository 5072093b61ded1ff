"""Mamba2's scan (SSD: one decay per head): the forward and backward of the training path,
D skip included, and the single-step state update.

===============  ===========================================  ===================================
kernel           op (:mod:`seqmodels.kernels.numba_ops`)      call path
===============  ===========================================  ===================================
``ssd_fwd_t``    ``ssd_scan_numba``                           Mamba2 training forward (hot)
``ssd_bwd_t``    ``ssd_scan_numba``                           Mamba2 training backward (hot)
``ssd_step``     ``ssd_state_update_numba``                   ``Mamba2.step``'s general path
                                                              only (see the package
                                                              docstring)
===============  ===========================================  ===================================

Mamba2's rollout step is :func:`seqmodels.kernels.numba.block_step.mamba2_step_fused`.

The sequence kernels keep the state of group g as ``[N, Q]`` with Q = (heads per group) *
headdim: the channels of all heads that read the same B_t, C_t innermost, so the inner loops
run over Q (128 for 8 heads of 16 channels) rather than over one head's headdim (too short for
the vectoriser: LLVM's vector body needs >= 32 float32 iterations). Channel c = h * P + p of
the flat ``[B, L, H * P]`` input is entry c - g * Q of its group's rows. The step kernels keep
mamba-ssm's ``[H, P, N]``.

Shared bodies (inlined; results bit-identical to the loops they replaced): :func:`_head_decays`
(each head's decay and dt * x of one time step) in ``ssd_fwd_t`` and ``ssd_bwd_t``;
:func:`ssd_head_update` (one head's state update in the step layout) in ``ssd_step`` and the
rollout step ``mamba2_step_fused``, which sum C . h differently (``lane_sum`` here, ``dot``
there) and so keep that sum to themselves.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import prange

from seqmodels.kernels.numba.numerics import FASTMATH, dot, lane_sum

# hot path: the training forward and backward of seqmodels.Mamba2
HOT_PATH = ("ssd_fwd_t", "ssd_bwd_t")


@numba.njit(cache=True, fastmath=FASTMATH, inline="always")
def _head_decays(dt_row, A, x_row, k, aq, dtx):
    """One time step's per-channel decay and input: for head h and each of its channels c,
    aq[c] = k * exp(dt[h] * A[h]) and dtx[c] = dt[h] * x[c] (dt_row, A [H]; x_row, aq, dtx
    [C]; k: 1, or keep[b, t] in the backward, which zeroes a reset step's decay)."""
    nheads = dt_row.shape[0]
    headdim = x_row.shape[0] // nheads
    for hh in range(nheads):
        dtv = dt_row[hh]
        a = k * math.exp(dtv * A[hh])
        for p in range(hh * headdim, (hh + 1) * headdim):
            aq[p] = a
            dtx[p] = dtv * x_row[p]


@numba.njit(cache=True, fastmath=FASTMATH, inline="always")
def ssd_head_update(h_old, x_head, dtv, decay, b_row, h_new):
    """One head's state update in the step layout: h_new[p] = decay * h_old[p] + (dt x[p]) B
    (h_old, h_new [P, N]; x_head [P]; dtv = dt, decay = exp(dt A) of the head; b_row [N], the
    head's group's B)."""
    headdim, d_state = h_old.shape
    for p in range(headdim):
        dtx = dtv * x_head[p]
        h_row, new_row = h_old[p], h_new[p]
        for n in range(d_state):
            new_row[n] = decay * h_row[n] + dtx * b_row[n]


@numba.njit(parallel=True, cache=True, fastmath=FASTMATH)
def ssd_fwd_t(x, dt, A, Dq, Bm, Cm, keep, h0, every):
    """Mamba2 (SSD) forward, D skip included.

    x [B, L, C] (C = H * P, head h owns channels h * P .. h * P + P - 1); dt [B, L, H]; A [H];
    Dq [C] (the skip D per channel); Bm, Cm [B, L, G, N]; keep [B, L]; h0 [B, G, N, Q].
    Returns y = C . h + Dq * x [B, L, C], h_last [B, G, N, Q] and checkpoints
    [B, ceil(L / every), G, N, Q] (state before steps 0, every, ...).
    """
    batch, length, channels = x.shape
    ngroups = Bm.shape[2]
    d_state = Bm.shape[3]
    q_len = channels // ngroups
    n_ckpt = (length + every - 1) // every
    one = x.dtype.type(1)
    y = np.empty((batch, length, channels), dtype=x.dtype)
    h_last = np.empty((batch, ngroups, d_state, q_len), dtype=x.dtype)
    ckpt = np.empty((batch, n_ckpt, ngroups, d_state, q_len), dtype=x.dtype)
    for b in prange(batch):
        h = h0[b].copy()
        aq = np.empty(channels, dtype=x.dtype)
        dtx = np.empty(channels, dtype=x.dtype)
        acc = np.empty(channels, dtype=x.dtype)
        for t in range(length):
            if t % every == 0:
                ckpt[b, t // every] = h
            if keep[b, t] == 0:
                h[:, :, :] = 0  # replaced, not multiplied by 0: a NaN before t stays there
            _head_decays(dt[b, t], A, x[b, t], one, aq, dtx)
            for c in range(channels):
                acc[c] = Dq[c] * x[b, t, c]
            for g in range(ngroups):
                hg = h[g]
                ag = aq[g * q_len : (g + 1) * q_len]
                dg = dtx[g * q_len : (g + 1) * q_len]
                yg = acc[g * q_len : (g + 1) * q_len]
                for n in range(d_state):
                    bn = Bm[b, t, g, n]
                    cn = Cm[b, t, g, n]
                    for q in range(q_len):
                        hv = ag[q] * hg[n, q] + dg[q] * bn
                        hg[n, q] = hv
                        yg[q] += hv * cn
            for c in range(channels):
                y[b, t, c] = acc[c]
        h_last[b] = h
    return y, h_last, ckpt


@numba.njit(parallel=True, cache=True, fastmath=FASTMATH)
def ssd_bwd_t(x, dt, A, Dq, Bm, Cm, keep, ckpt, dy, dh_last, every):
    """Backward of :func:`ssd_fwd_t` (layouts as there; dh_last [B, G, N, Q]).

    Returns dx [B, L, C]; ddt [B, L, H]; dA per row [B, H]; dD per row [B, C];
    dB, dC [B, L, G, N]; dh0 [B, G, N, Q].

    As :func:`mamba_fused_bwd`: the sums over channels are vectorised dot products
    (:func:`dot`) taken before the reverse update, dC[n] = gy . h[n] and
    dB[n] = (gh[n] + gy C[n]) . dtx = gh[n] . dtx + C[n] (gy . dtx) with gh the state gradient
    after the step; the reverse update takes two state rows at a time, so the per-channel sums
    over n (dprev, dxs) are loaded and stored once per two rows.
    """
    batch, length, channels = x.shape
    nheads = dt.shape[2]
    ngroups = Bm.shape[2]
    d_state = Bm.shape[3]
    headdim = channels // nheads
    q_len = channels // ngroups
    n_ckpt = ckpt.shape[1]
    n_pairs = d_state - d_state % 2
    dx = np.empty_like(x)
    ddt = np.empty_like(dt)
    dA = np.zeros((batch, nheads), dtype=x.dtype)
    dD = np.zeros((batch, channels), dtype=x.dtype)
    dB = np.empty((batch, length, ngroups, d_state), dtype=x.dtype)
    dC = np.empty((batch, length, ngroups, d_state), dtype=x.dtype)
    dh0 = np.empty((batch, ngroups, d_state, q_len), dtype=x.dtype)
    for b in prange(batch):
        gh = dh_last[b].copy()
        hs = np.empty((every + 1, ngroups, d_state, q_len), dtype=x.dtype)
        aqs = np.empty((every, channels), dtype=x.dtype)
        dtq = np.empty(channels, dtype=x.dtype)
        dtx = np.empty(channels, dtype=x.dtype)
        gy = np.empty(channels, dtype=x.dtype)
        dxs = np.empty(channels, dtype=x.dtype)
        dprev = np.empty(channels, dtype=x.dtype)
        prod_x = np.empty(channels, dtype=x.dtype)
        zero_state = np.zeros((ngroups, d_state, q_len), dtype=x.dtype)
        dD_b = dD[b]
        dA_b = dA[b]
        for c in range(n_ckpt - 1, -1, -1):
            start = c * every
            stop = min(length, start + every)
            hs[0] = ckpt[b, c]
            for i in range(stop - start):
                t = start + i
                k = keep[b, t]
                h_prev = hs[i] if k != 0 else zero_state  # (see the package docstring)
                _head_decays(dt[b, t], A, x[b, t], k, aqs[i], dtx)
                for g in range(ngroups):
                    ag = aqs[i, g * q_len : (g + 1) * q_len]
                    dg = dtx[g * q_len : (g + 1) * q_len]
                    for n in range(d_state):
                        bn = Bm[b, t, g, n]
                        for q in range(q_len):
                            hs[i + 1, g, n, q] = ag[q] * h_prev[g, n, q] + dg[q] * bn
            for i in range(stop - start - 1, -1, -1):
                t = start + i
                h_prev = hs[i] if keep[b, t] != 0 else zero_state
                for hh in range(nheads):
                    dtv = dt[b, t, hh]
                    for p in range(hh * headdim, (hh + 1) * headdim):
                        dtq[p] = dtv
                for c2 in range(channels):
                    gy[c2] = dy[b, t, c2]
                    dtx[c2] = dtq[c2] * x[b, t, c2]
                    dxs[c2] = 0
                    dprev[c2] = 0
                for g in range(ngroups):
                    lo = g * q_len
                    hi = lo + q_len
                    ag = aqs[i, lo:hi]
                    gyg = gy[lo:hi]
                    dtxg = dtx[lo:hi]
                    dxg = dxs[lo:hi]
                    dpg = dprev[lo:hi]
                    ghg = gh[g]
                    h_now = hs[i + 1, g]
                    h_before = h_prev[g]
                    # (ghg is still the gradient after this step: dB's part of it first)
                    gy_dtx = dot(gyg, dtxg)
                    for n in range(d_state):
                        dC[b, t, g, n] = dot(gyg, h_now[n])
                        dB[b, t, g, n] = dot(ghg[n], dtxg) + Cm[b, t, g, n] * gy_dtx
                    for n in range(0, n_pairs, 2):
                        m = n + 1
                        b0, b1 = Bm[b, t, g, n], Bm[b, t, g, m]
                        c0, c1 = Cm[b, t, g, n], Cm[b, t, g, m]
                        g0r, g1r = ghg[n], ghg[m]
                        hb0, hb1 = h_before[n], h_before[m]
                        for q in range(q_len):
                            gyq = gyg[q]
                            g0 = g0r[q] + gyq * c0  # d loss / d h[n] after the step
                            g1 = g1r[q] + gyq * c1
                            dpg[q] = (dpg[q] + g0 * hb0[q]) + g1 * hb1[q]
                            dxg[q] = (dxg[q] + g0 * b0) + g1 * b1
                            g0r[q] = g0 * ag[q]  # ... before the step
                            g1r[q] = g1 * ag[q]
                    for n in range(n_pairs, d_state):  # an odd last row
                        bn = Bm[b, t, g, n]
                        cn = Cm[b, t, g, n]
                        g0r = ghg[n]
                        hb0 = h_before[n]
                        for q in range(q_len):
                            g0 = g0r[q] + gyg[q] * cn
                            dpg[q] += g0 * hb0[q]
                            dxg[q] += g0 * bn
                            g0r[q] = g0 * ag[q]
                for c2 in range(channels):
                    xv = x[b, t, c2]
                    gyc = gy[c2]
                    dD_b[c2] += gyc * xv
                    dx[b, t, c2] = dxs[c2] * dtq[c2] + Dq[c2] * gyc
                    prod_x[c2] = xv * dxs[c2]
                for hh in range(nheads):
                    lo = hh * headdim
                    hi = lo + headdim
                    d_log = lane_sum(dprev[lo:hi]) * aqs[i, lo]  # d loss / d (dt * A)
                    ddt[b, t, hh] = d_log * A[hh] + lane_sum(prod_x[lo:hi])
                    dA_b[hh] += d_log * dtq[lo]
        dh0[b] = gh
    return dx, ddt, dA, dD, dB, dC, dh0


@numba.njit(parallel=True, cache=True, fastmath=FASTMATH)
def ssd_step(h, dt, x, A, Bm, Cm):
    """One Mamba2 state update (no autograd).

    h [B, H, P, N] (mamba-ssm layout); dt [B, H]; x [B, H, P]; A [H]; Bm, Cm [B, G, N].
    Returns new h [B, H, P, N] and y = C . h [B, H, P].
    """
    batch, nheads, headdim, d_state = h.shape
    heads_per_group = nheads // Bm.shape[1]
    h_new = np.empty_like(h)
    y = np.empty((batch, nheads, headdim), dtype=h.dtype)
    for b in prange(batch):
        prod = np.empty(d_state, dtype=h.dtype)
        for hh in range(nheads):
            g = hh // heads_per_group
            dtv = dt[b, hh]
            a = math.exp(dtv * A[hh])
            ssd_head_update(h[b, hh], x[b, hh], dtv, a, Bm[b, g], h_new[b, hh])
            for p in range(headdim):
                h_row = h_new[b, hh, p]
                for n in range(d_state):
                    prod[n] = h_row[n] * Cm[b, g, n]
                y[b, hh, p] = lane_sum(prod)
    return h_new, y


__all__ = ["HOT_PATH", "ssd_bwd_t", "ssd_fwd_t", "ssd_head_update", "ssd_step"]
