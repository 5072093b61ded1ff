"""Mamba's selective scan, the state of a block laid out ``[N, D]`` (its D channels innermost,
so the inner loops run over channels and vectorise): the fused inner part of the training
path, the plain scan and the single-step state updates.

=====================  ======================================  ===============================
kernel                 op (:mod:`seqmodels.kernels.numba_ops`)  call path
=====================  ======================================  ===============================
``mamba_fused_fwd``    ``mamba_block_numba``,                  Mamba training forward (hot)
                       ``mamba_inner_numba``
``mamba_fused_bwd``    ``mamba_block_numba``,                  Mamba training backward (hot)
                       ``mamba_inner_numba``
``mamba_fwd_t``        ``selective_scan_numba``                tests and the public scan op
                                                               only: no model runs it
``mamba_bwd_t``        ``selective_scan_numba``                tests and the public scan op
                                                               only
``mamba_step``         ``selective_state_update_numba``        tests and the public op only
``mamba_step_gated``   ``selective_state_update_gated_numba``  tests and the public op only
=====================  ======================================  ===============================

``seqmodels.Mamba`` runs the fused kernels through ``mamba_block_numba``;
``mamba_inner_numba`` (the inner part as an op of its own, reached from
``seqmodels.ops.mamba_inner`` on the numba backend) runs the same two. Mamba's rollout step is
:func:`seqmodels.kernels.numba.block_step.mamba_step_fused`, which uses :func:`dt_proj_row`.

Shared bodies (inlined; results bit-identical to the loops they replaced): :func:`scan_step`
(the forward recurrence of one time step) in ``mamba_fwd_t`` and ``mamba_fused_fwd``;
:func:`scan_recompute_step` (the backward kernels' forward recomputation of one step) in
``mamba_bwd_t`` and ``mamba_fused_bwd``; :func:`dt_proj_row` (dt_low @ W_dt^T + dt_bias) in
``mamba_fused_fwd``, ``mamba_fused_bwd`` and the rollout step. Not shared, because their
arithmetic differs and sharing would change their results: the reverse recurrences of
``mamba_bwd_t`` and ``mamba_fused_bwd`` (two state rows at a time in the fused one), and the
state updates of ``mamba_step``, ``mamba_step_gated`` and ``mamba_step_fused`` (fexp or
fexp2; C . h summed by ``lane_sum``, by eight accumulators or by ``dot``).
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

from seqmodels.kernels.numba.numerics import (
    FASTMATH,
    dot,
    exp_scale,
    fexp,
    fexp2,
    fsoftplus,
    lane_sum,
    prefetch_row,
)

# hot path: the training forward and backward of seqmodels.Mamba
HOT_PATH = ("mamba_fused_fwd", "mamba_fused_bwd")


@numba.njit(cache=True, fastmath=FASTMATH, inline="always")
def _decay(x, base2):
    """exp(x) for x = delta * A: fexp2(x) when base2 (A pre-scaled by ``exp_scale``, as the
    fused kernels keep it), else fexp(x). base2 is a constant of the caller, so the branch
    compiles away."""
    return fexp2(x) if base2 else fexp(x)


@numba.njit(cache=True, fastmath=FASTMATH, inline="always")
def dt_proj_row(dl, bias, dt_low, Wt):
    """The step size before its softplus for one row: dl [D] = bias [D] + the sum over r of
    dt_low[r] * Wt[r] (Wt [R, D]: dt_proj's weight transposed; dt_low [>= R], its first R
    entries read), summed over r in order."""
    d_inner = dl.shape[0]
    for d in range(d_inner):
        dl[d] = bias[d]
    for r in range(Wt.shape[0]):
        dr = dt_low[r]
        wr = Wt[r]
        for d in range(d_inner):
            dl[d] += dr * wr[d]


@numba.njit(cache=True, fastmath=FASTMATH, inline="always")
def scan_step(h, delta, A, dtu, b_row, c_row, acc, base2):
    """One time step of the recurrence, in place: for each state row n,
    h[n] = exp(delta * A[n]) * h[n] + dtu * B[n], then acc += h[n] * C[n].

    h, A [N, D]; delta, dtu (= delta * u), acc [D]; b_row, c_row [N]. base2: A is pre-scaled
    and the exp is fexp2 (see :func:`_decay`)."""
    d_state, d_inner = h.shape
    for n in range(d_state):
        bn = b_row[n]
        cn = c_row[n]
        an = A[n]
        hn = h[n]
        for d in range(d_inner):
            hv = _decay(delta[d] * an[d], base2) * hn[d] + dtu[d] * bn
            hn[d] = hv
            acc[d] += hv * cn


@numba.njit(cache=True, fastmath=FASTMATH, inline="always")
def scan_recompute_step(h_prev, h_next, decay, delta, A, dtu, b_row, k, base2):
    """:func:`scan_step`'s state update for the backward kernels, which keep what they
    recompute: decay[n] = k * exp(delta * A[n]), h_next[n] = decay[n] * h_prev[n] + dtu * B[n].

    h_prev, h_next, decay, A [N, D]; delta, dtu [D]; b_row [N]; k = keep[b, t] (0 at a reset
    step, whose h_prev the caller passes as a zero array); base2 as :func:`scan_step`."""
    d_state, d_inner = h_prev.shape
    for n in range(d_state):
        bn = b_row[n]
        an = A[n]
        for d in range(d_inner):
            a = k * _decay(delta[d] * an[d], base2)
            decay[n, d] = a
            h_next[n, d] = a * h_prev[n, d] + dtu[d] * bn


# --- fused inner part (training path) --------------------------------------------------------
# delta = softplus(dt_low @ W_dt^T + dt_bias) computed in the kernel (dt_rank FMAs per channel),
# the scan, then y = (C . h + D * u) * silu(z): the [B, L, D] tensors delta, C . h, the skip and
# the gate never exist; the backward recomputes all of them from u, dt_low, B, C, z and the
# checkpoint states.


@numba.njit(parallel=True, cache=True, fastmath=FASTMATH)
def mamba_fused_fwd(u, dtl, Wt, dbias, At, Bm, Cm, zsrc, zoff, Dv, keep, h0, every, pre):
    """u [B, L, D]; dtl [B, L, R]; Wt [R, D] (dt_proj weight transposed); dbias [D];
    At [N, D]; Bm, Cm [B, L, N]; the gate z[b, t, d] = zsrc[b, t, zoff + d] (zsrc [B, L, S]);
    Dv [D]; keep [B, L]; h0 [B, N, D]. Returns y = (C . h + D * u) * silu(z) [B, L, D],
    h_last [B, N, D] and checkpoints [B, ceil(L / every), N, D]. When pre [B, L, D] has the
    shape of u, the output before the gate, C . h + D * u, is written into it (for the
    backward; else pass a [0, 0, 0] array)."""
    batch, length, d_inner = u.shape
    store_pre = pre.shape[0] == batch
    d_state = At.shape[0]
    n_ckpt = (length + every - 1) // every
    one = u.dtype.type(1)
    y = np.empty((batch, length, d_inner), dtype=u.dtype)
    h_last = np.empty((batch, d_state, d_inner), dtype=u.dtype)
    ckpt = np.empty((batch, n_ckpt, d_state, d_inner), dtype=u.dtype)
    A2 = At * exp_scale(one)  # exp(dt * A) = fexp2(dt * A2)
    for b in prange(batch):
        h = h0[b].copy()
        dl = np.empty(d_inner, dtype=u.dtype)
        dtu = np.empty(d_inner, dtype=u.dtype)
        acc = np.empty(d_inner, dtype=u.dtype)
        for t in range(length):
            if t % every == 0:
                ckpt[b, t // every] = h
            if keep[b, t] == 0:
                h[:, :] = 0
            ur = u[b, t]
            dt_proj_row(dl, dbias, dtl[b, t], Wt)
            for d in range(d_inner):
                delta = fsoftplus(dl[d])
                dl[d] = delta
                dtu[d] = delta * ur[d]
                acc[d] = 0
            scan_step(h, dl, A2, dtu, Bm[b, t], Cm[b, t], acc, True)
            zr = zsrc[b, t, zoff : zoff + d_inner]
            yr = y[b, t]
            for d in range(d_inner):
                zv = zr[d]
                v = acc[d] + Dv[d] * ur[d]
                acc[d] = v
                yr[d] = v * (zv / (one + fexp(-zv)))
            if store_pre:
                pre[b, t] = acc
        h_last[b] = h
    return y, h_last, ckpt


@numba.njit(parallel=True, cache=True, fastmath=FASTMATH)
def mamba_fused_bwd(
    u,
    dtl,
    Wt,
    dbias,
    At,
    Bm,
    Cm,
    zsrc,
    zoff,
    Dv,
    keep,
    ckpt,
    dy,
    dh_last,
    every,
    dzdst,
    dzoff,
    ddtl,
    dB,
    dC,
    du,
    y,
    pre,
):
    """Backward of :func:`mamba_fused_fwd` (dy [B, L, D], dh_last [B, N, D]; pre [B, L, D],
    the forward's output before the gate when it kept it, else a [0, 0, 0] array: it is then
    recomputed from the states).

    Writes dz into dzdst[b, t, dzoff + d] (dzdst [B, L, S'], e.g. the gradient of the whole
    in_proj output), the gradients of dtl, Bm, Cm into ddtl [B, L, R], dB, dC [B, L, N] (the
    caller's arrays: e.g. views of one [B, L, R + 2 N] buffer, the gradient of the x_proj
    output), the gradient of u into du [B, L, D] (may be dy's own array: each step reads its
    row of dy before it writes its row of du) and, when y has the shape of u, the forward's
    output into y (recomputed on the way, for out_proj's weight gradient when the caller did
    not keep it; pass a [0, 0, 0] array otherwise).
    Returns per row (summed by the caller): dWt [B, R, D], ddbias [B, D], dA [B, N, D],
    dD [B, D]; and dh0 [B, N, D].

    Per chunk of ``every`` steps: the states and decays recomputed forward from the checkpoint
    (hs [every + 1, N, D], decays [every, N, D]), then the reverse recurrence. Its loop over
    the channels takes two state rows at a time, so the per-channel sums over n (ddt, dxs) are
    loaded and stored once per two rows (the loop is store-bound: 3 stores per row and
    channel instead of 7); the sums over channels (dB, dC, ddtl) are separate vectorised dot
    products (:func:`dot`) instead of product arrays summed by :func:`lane_sum`:
    dC[n] = gy . h[n], dB[n] = (gh[n] + gy C[n]) . dtu = gh[n] . dtu + C[n] (gy . dtu) with gh
    the state gradient before the step's update.

    The reverse pass reads the per-step rows (u, z, dy, the saved output, C) from the last step
    back, an order the hardware prefetcher does not follow: each step prefetches the rows of
    the step before (their cache misses were a measurable part of the kernel's time).
    """
    batch, length, d_inner = u.shape
    d_state = At.shape[0]
    rank = Wt.shape[0]
    n_ckpt = ckpt.shape[1]
    n_pairs = d_state - d_state % 2
    one = u.dtype.type(1)
    store_y = y.shape[0] == batch
    have_pre = pre.shape[0] == batch
    dWt = np.zeros((batch, rank, d_inner), dtype=u.dtype)
    ddbias = np.zeros((batch, d_inner), dtype=u.dtype)
    dA = np.zeros((batch, d_state, d_inner), dtype=u.dtype)
    dD = np.zeros((batch, d_inner), dtype=u.dtype)
    dh0 = np.empty((batch, d_state, d_inner), dtype=u.dtype)
    A2 = At * exp_scale(one)  # exp(dt * A) = fexp2(dt * A2)
    for b in prange(batch):
        gh = dh_last[b].copy()
        hs = np.empty((every + 1, d_state, d_inner), dtype=u.dtype)
        decays = np.empty((every, d_state, d_inner), dtype=u.dtype)
        deltas = np.empty((every, d_inner), dtype=u.dtype)
        dsoft = np.empty((every, d_inner), dtype=u.dtype)  # softplus' = sigmoid(pre-softplus)
        dl = np.empty(d_inner, dtype=u.dtype)
        dtu = np.empty(d_inner, dtype=u.dtype)
        gy = np.empty(d_inner, dtype=u.dtype)
        sz = np.empty(d_inner, dtype=u.dtype)  # sigmoid(z)
        yacc = np.empty(d_inner, dtype=u.dtype)
        ddt = np.empty(d_inner, dtype=u.dtype)
        dxs = np.empty(d_inner, dtype=u.dtype)
        zero_state = np.zeros((d_state, d_inner), dtype=u.dtype)
        dA_b = dA[b]
        dW_b = dWt[b]
        db_b = ddbias[b]
        dD_b = dD[b]
        for c in range(n_ckpt - 1, -1, -1):
            start = c * every
            stop = min(length, start + every)
            hs[0] = ckpt[b, c]
            for i in range(stop - start):
                t = start + i
                k = keep[b, t]
                h_prev = hs[i] if k != 0 else zero_state  # (see the package docstring)
                ur = u[b, t]
                dt_proj_row(dl, dbias, dtl[b, t], Wt)
                for d in range(d_inner):
                    v = dl[d]
                    delta = fsoftplus(v)
                    deltas[i, d] = delta
                    dsoft[i, d] = one / (one + fexp(-v))
                    dtu[d] = delta * ur[d]
                scan_recompute_step(
                    h_prev, hs[i + 1], decays[i], deltas[i], A2, dtu, Bm[b, t], k, True
                )
            for i in range(stop - start - 1, -1, -1):
                t = start + i
                if t > 0:  # the rows of the step before, ahead of their reads (see the docstring)
                    prefetch_row(zsrc[b, t - 1, zoff : zoff + d_inner])
                    prefetch_row(dy[b, t - 1])
                    prefetch_row(u[b, t - 1])
                    if have_pre:
                        prefetch_row(pre[b, t - 1])
                    prefetch_row(Cm[b, t - 1])
                ur = u[b, t]
                zr = zsrc[b, t, zoff : zoff + d_inner]
                dyr = dy[b, t]
                delr = deltas[i]
                h_now = hs[i + 1]
                h_before = hs[i] if keep[b, t] != 0 else zero_state
                dec = decays[i]
                for d in range(d_inner):
                    zv = zr[d]
                    sig = one / (one + fexp(-zv))
                    sz[d] = sig
                    gy[d] = dyr[d] * (zv * sig)  # d loss / d (C . h + D u)
                    dtu[d] = delr[d] * ur[d]
                    ddt[d] = 0
                    dxs[d] = 0
                # (gh is still the gradient after this step: dB's part of it first)
                gy_dtu = dot(gy, dtu)
                for n in range(d_state):
                    dC[b, t, n] = dot(gy, h_now[n])
                    dB[b, t, n] = dot(gh[n], dtu) + Cm[b, t, n] * gy_dtu
                if not have_pre:
                    yacc[:] = 0
                    for n in range(d_state):
                        cn = Cm[b, t, n]
                        hr = h_now[n]
                        for d in range(d_inner):
                            yacc[d] += hr[d] * cn
                    for d in range(d_inner):
                        yacc[d] = yacc[d] + Dv[d] * ur[d]  # the output before the gate
                pv = pre[b, t] if have_pre else yacc
                for n in range(0, n_pairs, 2):
                    m = n + 1
                    b0, b1 = Bm[b, t, n], Bm[b, t, m]
                    c0, c1 = Cm[b, t, n], Cm[b, t, m]
                    for d in range(d_inner):
                        g = gy[d]
                        g0 = gh[n, d] + g * c0  # d loss / d h[n] after the step
                        g1 = gh[m, d] + g * c1
                        q0 = g0 * dec[n, d]  # ... before the step
                        q1 = g1 * dec[m, d]
                        gh[n, d] = q0
                        gh[m, d] = q1
                        p0 = q0 * h_before[n, d]  # d loss / d (dt A[n]) = q h_before
                        p1 = q1 * h_before[m, d]
                        dA_b[n, d] += p0 * delr[d]
                        dA_b[m, d] += p1 * delr[d]
                        # (+ u * dxs below: the input's part of d loss / d dt)
                        ddt[d] = (ddt[d] + p0 * At[n, d]) + p1 * At[m, d]
                        dxs[d] = (dxs[d] + g0 * b0) + g1 * b1
                for n in range(n_pairs, d_state):  # an odd last row
                    bn = Bm[b, t, n]
                    cn = Cm[b, t, n]
                    for d in range(d_inner):
                        g0 = gh[n, d] + gy[d] * cn
                        q0 = g0 * dec[n, d]
                        gh[n, d] = q0
                        p0 = q0 * h_before[n, d]
                        dA_b[n, d] += p0 * delr[d]
                        ddt[d] += p0 * At[n, d]
                        dxs[d] += g0 * bn
                dur = du[b, t]
                dzr = dzdst[b, t, dzoff : dzoff + d_inner]
                dsr = dsoft[i]
                for d in range(d_inner):
                    sig = sz[d]
                    dzr[d] = dyr[d] * pv[d] * sig * (one + zr[d] * (one - sig))
                if store_y:
                    yr = y[b, t]
                    for d in range(d_inner):
                        yr[d] = pv[d] * zr[d] * sz[d]
                for d in range(d_inner):
                    g = gy[d]
                    dD_b[d] += g * ur[d]
                    dur[d] = dxs[d] * delr[d] + g * Dv[d]
                    dv = (ddt[d] + ur[d] * dxs[d]) * dsr[d]  # d loss / d (dt_low W^T + bias)
                    ddt[d] = dv
                    db_b[d] += dv
                for r in range(rank):
                    dr = dtl[b, t, r]
                    dWr = dW_b[r]
                    for d in range(d_inner):
                        dWr[d] += ddt[d] * dr
                    ddtl[b, t, r] = dot(ddt, Wt[r])
        dh0[b] = gh
    return dWt, ddbias, dA, dD, dh0


# --- the plain scan (selective_scan_numba) and the single-step updates ---------------------


@numba.njit(parallel=True, cache=True, fastmath=FASTMATH)
def mamba_fwd_t(u, delta, At, Bm, Cm, keep, h0, every):
    """Mamba forward with the state laid out [N, D] (channels innermost, vectorised).

    u, delta [B, L, D]; At [N, D] (A transposed); Bm, Cm [B, L, N]; keep [B, L]; h0 [B, N, D];
    Returns y [B, L, D],
    h_last [B, N, D], checkpoints [B, ceil(L / every), N, D] (state before steps 0, every, ...).
    """
    batch, length, d_inner = u.shape
    d_state = At.shape[0]
    n_ckpt = (length + every - 1) // every
    y = np.empty((batch, length, d_inner), dtype=u.dtype)
    h_last = np.empty((batch, d_state, d_inner), dtype=u.dtype)
    ckpt = np.empty((batch, n_ckpt, d_state, d_inner), dtype=u.dtype)
    for b in prange(batch):
        h = h0[b].copy()
        dl = np.empty(d_inner, dtype=u.dtype)
        dtu = np.empty(d_inner, dtype=u.dtype)
        acc = np.empty(d_inner, dtype=u.dtype)
        for t in range(length):
            if t % every == 0:
                ckpt[b, t // every] = h
            if keep[b, t] == 0:
                h[:, :] = 0
            for d in range(d_inner):
                dl[d] = delta[b, t, d]
                dtu[d] = delta[b, t, d] * u[b, t, d]
                acc[d] = 0
            scan_step(h, dl, At, dtu, Bm[b, t], Cm[b, t], acc, False)
            for d in range(d_inner):
                y[b, t, d] = acc[d]
        h_last[b] = h
    return y, h_last, ckpt


@numba.njit(parallel=True, cache=True, fastmath=FASTMATH)
def mamba_bwd_t(u, delta, At, Bm, Cm, keep, ckpt, dy, dh_last, every):
    """Backward of :func:`mamba_fwd_t` (layouts as there; dh_last [B, N, D]).

    Returns du, ddelta [B, L, D]; dA per row [B, N, D]; dB, dC [B, L, N]; dh0 [B, N, D].
    """
    batch, length, d_inner = u.shape
    d_state = At.shape[0]
    n_ckpt = ckpt.shape[1]
    du = np.empty_like(u)
    ddelta = np.empty_like(delta)
    dA = np.zeros((batch, d_state, d_inner), dtype=u.dtype)
    dB = np.empty((batch, length, d_state), dtype=u.dtype)
    dC = np.empty((batch, length, d_state), dtype=u.dtype)
    dh0 = np.empty((batch, d_state, d_inner), dtype=u.dtype)
    for b in prange(batch):
        gh = dh_last[b].copy()
        hs = np.empty((every + 1, d_state, d_inner), dtype=u.dtype)
        decays = np.empty((every, d_state, d_inner), dtype=u.dtype)
        dl = np.empty(d_inner, dtype=u.dtype)
        dtu = np.empty(d_inner, dtype=u.dtype)
        ddt = np.empty(d_inner, dtype=u.dtype)
        dxs = np.empty(d_inner, dtype=u.dtype)
        prod_b = np.empty(d_inner, dtype=u.dtype)
        prod_c = np.empty(d_inner, dtype=u.dtype)
        zero_state = np.zeros((d_state, d_inner), dtype=u.dtype)
        dA_b = dA[b]
        for c in range(n_ckpt - 1, -1, -1):
            start = c * every
            stop = min(length, start + every)
            hs[0] = ckpt[b, c]
            for i in range(stop - start):
                t = start + i
                k = keep[b, t]
                h_prev = hs[i] if k != 0 else zero_state  # (see the package docstring)
                for d in range(d_inner):
                    dl[d] = delta[b, t, d]
                    dtu[d] = delta[b, t, d] * u[b, t, d]
                scan_recompute_step(h_prev, hs[i + 1], decays[i], dl, At, dtu, Bm[b, t], k, False)
            for i in range(stop - start - 1, -1, -1):
                t = start + i
                h_prev = hs[i] if keep[b, t] != 0 else zero_state
                for d in range(d_inner):
                    dtu[d] = delta[b, t, d] * u[b, t, d]
                    ddt[d] = 0
                    dxs[d] = 0
                for n in range(d_state):
                    bn = Bm[b, t, n]
                    cn = Cm[b, t, n]
                    for d in range(d_inner):
                        g = dy[b, t, d]
                        ghn = gh[n, d] + g * cn
                        prod_c[d] = g * hs[i + 1, n, d]
                        a = decays[i, n, d]
                        tmp = ghn * h_prev[n, d] * a
                        ddt[d] += tmp * At[n, d] + ghn * u[b, t, d] * bn
                        dA_b[n, d] += tmp * delta[b, t, d]
                        prod_b[d] = ghn * dtu[d]
                        dxs[d] += ghn * bn
                        gh[n, d] = ghn * a
                    dC[b, t, n] = lane_sum(prod_c)
                    dB[b, t, n] = lane_sum(prod_b)
                for d in range(d_inner):
                    ddelta[b, t, d] = ddt[d]
                    du[b, t, d] = dxs[d] * delta[b, t, d]
        dh0[b] = gh
    return du, ddelta, dA, dB, dC, dh0


@numba.njit(parallel=True, cache=True, fastmath=FASTMATH)
def mamba_step(h, dt, xs, A, Bm, Cm):
    """One Mamba state update (no autograd).

    h [B, D, N] (mamba-ssm layout); dt, xs [B, D]; A [D, N]; Bm, Cm [B, N].
    Returns new h [B, D, N] and y = C . h [B, D].
    """
    batch, d_inner, d_state = h.shape
    h_new = np.empty_like(h)
    y = np.empty((batch, d_inner), dtype=h.dtype)
    for b in prange(batch):
        prod = np.empty(d_state, dtype=h.dtype)
        for d in range(d_inner):
            dtv = dt[b, d]
            dtx = dtv * xs[b, d]
            for n in range(d_state):
                hv = fexp(dtv * A[d, n]) * h[b, d, n] + dtx * Bm[b, n]
                h_new[b, d, n] = hv
                prod[n] = hv * Cm[b, n]
            y[b, d] = lane_sum(prod)
    return h_new, y


@numba.njit(parallel=True, cache=True, fastmath=FASTMATH)
def mamba_step_gated(h, dt, dt_bias, softplus, xs, z, A, Dv, Bm, Cm):
    """One fused Mamba step (no autograd): step size, state update, D skip and gate.

    h [B, D, N] (mamba-ssm layout); dt, xs, z [B, D]; dt_bias, Dv [D]; A [D, N]; Bm, Cm
    [B, N]. The step size is softplus(dt + dt_bias) when softplus, else dt + dt_bias.
    Returns new h [B, D, N] and y = (C . h + D * xs) * silu(z) [B, D].

    The exp of the state update runs in one flat loop over the D * N entries of a row (a loop
    over N alone, 16 long, is too short for the vectoriser), as fexp2(dt * A * log2 e) (float32;
    float64 fexp, see exp_scale). C . h runs over blocks of 8 channels with one accumulator each:
    eight independent FMA chains instead of one serial chain per channel (without reassociating
    fast-math a single chain is latency-bound: measured faster). Each channel still sums over n
    in order.
    """
    batch, d_inner, d_state = h.shape
    size = d_inner * d_state
    one = h.dtype.type(1)
    h_new = np.empty_like(h)
    y = np.empty((batch, d_inner), dtype=h.dtype)
    a_scaled = np.empty(size, dtype=h.dtype)
    for d in range(d_inner):
        for n in range(d_state):
            a_scaled[d * d_state + n] = A[d, n] * exp_scale(A[d, n])
    stop = d_inner - d_inner % 8
    for b in prange(batch):
        step = np.empty(d_inner, dtype=h.dtype)
        arg = np.empty(size, dtype=h.dtype)
        inp = np.empty(size, dtype=h.dtype)
        for d in range(d_inner):
            v = dt[b, d] + dt_bias[d]
            step[d] = fsoftplus(v) if softplus else v
        for d in range(d_inner):
            dtv = step[d]
            dtx = dtv * xs[b, d]
            for n in range(d_state):
                arg[d * d_state + n] = dtv * a_scaled[d * d_state + n]
                inp[d * d_state + n] = dtx * Bm[b, n]
        h_row = h[b].reshape(size)
        new_row = h_new[b].reshape(size)
        for j in range(size):
            new_row[j] = fexp2(arg[j]) * h_row[j] + inp[j]
        hn = h_new[b]
        for d0 in range(0, stop, 8):
            a0 = Dv[d0] * xs[b, d0]
            a1 = Dv[d0 + 1] * xs[b, d0 + 1]
            a2 = Dv[d0 + 2] * xs[b, d0 + 2]
            a3 = Dv[d0 + 3] * xs[b, d0 + 3]
            a4 = Dv[d0 + 4] * xs[b, d0 + 4]
            a5 = Dv[d0 + 5] * xs[b, d0 + 5]
            a6 = Dv[d0 + 6] * xs[b, d0 + 6]
            a7 = Dv[d0 + 7] * xs[b, d0 + 7]
            for n in range(d_state):
                c = Cm[b, n]
                a0 += hn[d0, n] * c
                a1 += hn[d0 + 1, n] * c
                a2 += hn[d0 + 2, n] * c
                a3 += hn[d0 + 3, n] * c
                a4 += hn[d0 + 4, n] * c
                a5 += hn[d0 + 5, n] * c
                a6 += hn[d0 + 6, n] * c
                a7 += hn[d0 + 7, n] * c
            step[d0] = a0
            step[d0 + 1] = a1
            step[d0 + 2] = a2
            step[d0 + 3] = a3
            step[d0 + 4] = a4
            step[d0 + 5] = a5
            step[d0 + 6] = a6
            step[d0 + 7] = a7
        for d in range(stop, d_inner):
            acc = Dv[d] * xs[b, d]
            for n in range(d_state):
                acc += hn[d, n] * Cm[b, n]
            step[d] = acc
        for d in range(d_inner):  # the gate in its own loop, which vectorises
            zv = z[b, d]
            y[b, d] = step[d] * (zv / (one + fexp(-zv)))
    return h_new, y


__all__ = [
    "HOT_PATH",
    "dt_proj_row",
    "mamba_bwd_t",
    "mamba_fused_bwd",
    "mamba_fused_fwd",
    "mamba_fwd_t",
    "mamba_step",
    "mamba_step_gated",
    "scan_recompute_step",
    "scan_step",
]
