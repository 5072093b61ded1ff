"""numba CPU kernels for :mod:`seqmodels.scan` (imported lazily: numba is needed only here).

Forward kernels return the outputs, the last state and the states at every ``every``-th step
(checkpoints, ``[B, L / every, ...]``); backward kernels recompute one chunk of states at a
time from those checkpoints and run the reverse recurrence. Parallel over the batch rows (each
thread owns its rows, so the sums over channels into dB / dC need no atomics); the gradient of
A is returned per row and summed by the caller.
"""

from __future__ import annotations

import math
import os

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload

prange = numba.prange

# Only FMA contraction ("contract") of the fast-math flags: a fused multiply-add rounds once
# instead of twice (never less accurate), keeps NaN / inf / signed-zero semantics and lets LLVM
# emit vfmadd on AVX2 (measured: ~1.25x on the scan kernels). The reassociating flags are not
# used, so float64 results stay within 1e-10 of the reference loop.
_FM = {"contract"}

# numba's default threading layer here is GNU OpenMP, whose idle workers busy-wait after each
# parallel kernel and steal the core from the torch ops that follow (measured: a Mamba.step
# at B=1024 went from ~12 ms to ~110 ms of CPU). The workqueue layer's workers sleep. The
# kernels hold the GIL, so two Python threads never launch them concurrently (workqueue's one
# restriction). A user's NUMBA_THREADING_LAYER wins. (Set through the environment: numba
# re-reads its configuration from it when it compiles.)
if "NUMBA_THREADING_LAYER" not in os.environ:
    os.environ["NUMBA_THREADING_LAYER"] = "workqueue"
    numba.config.reload_config()


# --- vectorisable exp -----------------------------------------------------------------------
# fexp(x) = 2^k * exp(r), k = round(x / ln2), r = x - k ln2 (Cody-Waite split of ln2), exp(r) by
# its Taylor polynomial on |r| <= ln2/2 (degree 7 in float32: relative error < 1e-7; degree 12
# in float64: < 3e-16), 2^k assembled in the exponent bits of the rounding shifter. Pure
# arithmetic and bit casts, so LLVM vectorises the loops that call it without fastmath (libm's
# exp is a scalar call). x is clamped to [xmin, xmax]: exp(xmin) ~ 1e-38 (float32) / 1e-308
# (float64) stands for 0 (the scans only ever need x = dt * A <= 0).


@intrinsic
def _float_bits(typingctx, x):
    """Reinterpret a float32 / float64 as int32 / int64 (an LLVM bitcast)."""
    if x == types.float32:
        width, ret = 32, types.int32
    elif x == types.float64:
        width, ret = 64, types.int64
    else:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(width))

    return ret(x), codegen


@intrinsic
def _bits_float(typingctx, x):
    """Reinterpret an int32 / int64 as float32 / float64 (an LLVM bitcast)."""
    if x == types.int32:
        llty, ret = ir.FloatType(), types.float32
    elif x == types.int64:
        llty, ret = ir.DoubleType(), types.float64
    else:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], llty)

    return ret(x), codegen


def fexp(x):
    """exp(x) for float32/float64 scalars inside the kernels (see the comment above)."""
    return math.exp(x)


_F32 = np.float32
_LOG2E_32, _SHIFT_32 = _F32(1.4426950408889634), _F32(12582912.0)  # 1.5 * 2**23
_LN2_HI_32, _LN2_LO_32 = _F32(0.693359375), _F32(-2.12194440e-4)
_XMIN_32, _XMAX_32 = _F32(-87.0), _F32(88.0)
_C32 = [_F32(1.0 / math.factorial(i)) for i in range(8)]
_C32_2, _C32_3, _C32_4, _C32_5, _C32_6, _C32_7 = _C32[2:]
_ONE_32 = _F32(1.0)
_LOG2E_64, _SHIFT_64 = 1.4426950408889634, 6755399441055744.0  # 1.5 * 2**52
_LN2_HI_64, _LN2_LO_64 = 6.93147180369123816490e-01, 1.90821492927058770002e-10
_C64 = [1.0 / math.factorial(i) for i in range(13)]
(_C64_2, _C64_3, _C64_4, _C64_5, _C64_6, _C64_7, _C64_8, _C64_9, _C64_10, _C64_11, _C64_12) = _C64[
    2:
]


@overload(fexp, inline="always")
def _fexp_impl(x):
    if x == types.float32:

        def impl32(x):
            v = min(max(x, _XMIN_32), _XMAX_32)
            s = v * _LOG2E_32 + _SHIFT_32
            k = s - _SHIFT_32
            r = (v - k * _LN2_HI_32) - k * _LN2_LO_32
            p = _C32_7 * r + _C32_6
            p = p * r + _C32_5
            p = p * r + _C32_4
            p = p * r + _C32_3
            p = p * r + _C32_2
            p = p * r + _ONE_32
            p = p * r + _ONE_32
            bits = (np.int64(_float_bits(s)) - 0x4B400000 + 127) << 23
            return p * _bits_float(np.int32(bits))

        return impl32
    if x == types.float64:

        def impl64(x):
            v = min(max(x, -708.0), 709.0)
            s = v * _LOG2E_64 + _SHIFT_64
            k = s - _SHIFT_64
            r = (v - k * _LN2_HI_64) - k * _LN2_LO_64
            p = _C64_12 * r + _C64_11
            p = p * r + _C64_10
            p = p * r + _C64_9
            p = p * r + _C64_8
            p = p * r + _C64_7
            p = p * r + _C64_6
            p = p * r + _C64_5
            p = p * r + _C64_4
            p = p * r + _C64_3
            p = p * r + _C64_2
            p = p * r + 1.0
            p = p * r + 1.0
            bits = (_float_bits(s) - 0x4338000000000000 + 1023) << 52
            return p * _bits_float(bits)

        return impl64
    return None


@numba.njit(parallel=True, cache=True, fastmath=_FM)
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
            for n in range(d_state):
                bn = Bm[b, t, n]
                cn = Cm[b, t, n]
                for d in range(d_inner):
                    hv = fexp(dl[d] * At[n, d]) * h[n, d] + dtu[d] * bn
                    h[n, d] = hv
                    acc[d] += hv * cn
            for d in range(d_inner):
                y[b, t, d] = acc[d]
        h_last[b] = h
    return y, h_last, ckpt


@numba.njit(cache=True, fastmath=_FM, inline="always")
def _lane_sum(v):
    """Sum of a 1-D array with 8 independent partial sums (vectorisable without fastmath)."""
    n = v.shape[0]
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = v.dtype.type(0)
    stop = n - n % 8
    for i in range(0, stop, 8):
        s0 += v[i]
        s1 += v[i + 1]
        s2 += v[i + 2]
        s3 += v[i + 3]
        s4 += v[i + 4]
        s5 += v[i + 5]
        s6 += v[i + 6]
        s7 += v[i + 7]
    for i in range(stop, n):
        s0 += v[i]
    return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))


@numba.njit(parallel=True, cache=True, fastmath=_FM)
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
        dA_b = dA[b]
        for c in range(n_ckpt - 1, -1, -1):
            start = c * every
            stop = min(length, start + every)
            hs[0] = ckpt[b, c]
            for i in range(stop - start):
                t = start + i
                k = keep[b, t]
                for d in range(d_inner):
                    dl[d] = delta[b, t, d]
                    dtu[d] = delta[b, t, d] * u[b, t, d]
                for n in range(d_state):
                    bn = Bm[b, t, n]
                    for d in range(d_inner):
                        a = k * fexp(dl[d] * At[n, d])
                        decays[i, n, d] = a
                        hs[i + 1, n, d] = a * hs[i, n, d] + dtu[d] * bn
            for i in range(stop - start - 1, -1, -1):
                t = start + i
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
                        tmp = ghn * hs[i, n, d] * a
                        ddt[d] += tmp * At[n, d] + ghn * u[b, t, d] * bn
                        dA_b[n, d] += tmp * delta[b, t, d]
                        prod_b[d] = ghn * dtu[d]
                        dxs[d] += ghn * bn
                        gh[n, d] = ghn * a
                    dC[b, t, n] = _lane_sum(prod_c)
                    dB[b, t, n] = _lane_sum(prod_b)
                for d in range(d_inner):
                    ddelta[b, t, d] = ddt[d]
                    du[b, t, d] = dxs[d] * delta[b, t, d]
        dh0[b] = gh
    return du, ddelta, dA, dB, dC, dh0


@numba.njit(parallel=True, cache=True, fastmath=_FM)
def ssd_fwd_t(x, dt, A, Bm, Cm, keep, h0, every):
    """Mamba2 (SSD) forward with the state laid out [H, N, P] (head channels innermost).

    x [B, L, H, P]; dt [B, L, H]; A [H]; Bm, Cm [B, L, G, N]; keep [B, L]; h0 [B, H, N, P].
    Returns y [B, L, H, P], h_last [B, H, N, P], checkpoints [B, ceil(L / every), H, N, P].
    """
    batch, length, nheads, headdim = x.shape
    ngroups = Bm.shape[2]
    d_state = Bm.shape[3]
    heads_per_group = nheads // ngroups
    n_ckpt = (length + every - 1) // every
    y = np.empty((batch, length, nheads, headdim), dtype=x.dtype)
    h_last = np.empty((batch, nheads, d_state, headdim), dtype=x.dtype)
    ckpt = np.empty((batch, n_ckpt, nheads, d_state, headdim), dtype=x.dtype)
    for b in prange(batch):
        h = h0[b].copy()
        dtx = np.empty(headdim, dtype=x.dtype)
        acc = np.empty(headdim, dtype=x.dtype)
        for t in range(length):
            if t % every == 0:
                ckpt[b, t // every] = h
            if keep[b, t] == 0:
                h[:, :, :] = 0
            for hh in range(nheads):
                g = hh // heads_per_group
                dtv = dt[b, t, hh]
                a = math.exp(dtv * A[hh])
                for p in range(headdim):
                    dtx[p] = dtv * x[b, t, hh, p]
                    acc[p] = 0
                for n in range(d_state):
                    bn = Bm[b, t, g, n]
                    cn = Cm[b, t, g, n]
                    for p in range(headdim):
                        hv = a * h[hh, n, p] + dtx[p] * bn
                        h[hh, n, p] = hv
                        acc[p] += hv * cn
                for p in range(headdim):
                    y[b, t, hh, p] = acc[p]
        h_last[b] = h
    return y, h_last, ckpt


@numba.njit(parallel=True, cache=True, fastmath=_FM)
def ssd_bwd_t(x, dt, A, Bm, Cm, keep, ckpt, dy, dh_last, every):
    """Backward of :func:`ssd_fwd_t` (dh_last [B, H, N, P]).

    Returns dx [B, L, H, P]; ddt [B, L, H]; dA per row [B, H]; dB, dC [B, L, G, N];
    dh0 [B, H, N, P].
    """
    batch, length, nheads, headdim = x.shape
    ngroups = Bm.shape[2]
    d_state = Bm.shape[3]
    heads_per_group = nheads // ngroups
    n_ckpt = ckpt.shape[1]
    dx = np.empty_like(x)
    ddt = np.empty_like(dt)
    dA = np.zeros((batch, nheads), dtype=x.dtype)
    dB = np.zeros((batch, length, ngroups, d_state), dtype=x.dtype)
    dC = np.zeros((batch, length, ngroups, d_state), dtype=x.dtype)
    dh0 = np.empty((batch, nheads, d_state, headdim), dtype=x.dtype)
    for b in prange(batch):
        gh = dh_last[b].copy()
        hs = np.empty((every + 1, nheads, d_state, headdim), dtype=x.dtype)
        decays = np.empty((every, nheads), dtype=x.dtype)
        dtx = np.empty(headdim, dtype=x.dtype)
        gy = np.empty(headdim, dtype=x.dtype)
        dxs = np.empty(headdim, dtype=x.dtype)
        dprev = np.empty(headdim, dtype=x.dtype)
        prod_b = np.empty(headdim, dtype=x.dtype)
        prod_c = np.empty(headdim, dtype=x.dtype)
        for c in range(n_ckpt - 1, -1, -1):
            start = c * every
            stop = min(length, start + every)
            hs[0] = ckpt[b, c]
            for i in range(stop - start):
                t = start + i
                k = keep[b, t]
                for hh in range(nheads):
                    g = hh // heads_per_group
                    dtv = dt[b, t, hh]
                    a = k * math.exp(dtv * A[hh])
                    decays[i, hh] = a
                    for p in range(headdim):
                        dtx[p] = dtv * x[b, t, hh, p]
                    for n in range(d_state):
                        bn = Bm[b, t, g, n]
                        for p in range(headdim):
                            hs[i + 1, hh, n, p] = a * hs[i, hh, n, p] + dtx[p] * bn
            for i in range(stop - start - 1, -1, -1):
                t = start + i
                for hh in range(nheads):
                    g = hh // heads_per_group
                    dtv = dt[b, t, hh]
                    a = decays[i, hh]
                    for p in range(headdim):
                        gy[p] = dy[b, t, hh, p]
                        dxs[p] = 0
                        dprev[p] = 0
                    d_dt_inp = x.dtype.type(0)
                    for n in range(d_state):
                        bn = Bm[b, t, g, n]
                        cn = Cm[b, t, g, n]
                        for p in range(headdim):
                            ghn = gh[hh, n, p] + gy[p] * cn
                            prod_c[p] = gy[p] * hs[i + 1, hh, n, p]
                            dprev[p] += ghn * hs[i, hh, n, p]
                            prod_b[p] = ghn * x[b, t, hh, p]
                            dxs[p] += ghn * bn
                            gh[hh, n, p] = ghn * a
                        sb = _lane_sum(prod_b)
                        dC[b, t, g, n] += _lane_sum(prod_c)
                        dB[b, t, g, n] += dtv * sb
                        d_dt_inp += bn * sb
                    for p in range(headdim):
                        dx[b, t, hh, p] = dxs[p] * dtv
                    d_log = _lane_sum(dprev) * a  # d loss / d (dt * A)
                    ddt[b, t, hh] = d_log * A[hh] + d_dt_inp
                    dA[b, hh] += d_log * dtv
        dh0[b] = gh
    return dx, ddt, dA, dB, dC, dh0


@numba.njit(parallel=True, cache=True, fastmath=_FM)
def mamba_step(h, dt, xs, A, Bm, Cm):
    """One Mamba state update (rollouts, no autograd).

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
            y[b, d] = _lane_sum(prod)
    return h_new, y


@numba.njit(parallel=True, cache=True, fastmath=_FM)
def ssd_step(h, dt, x, A, Bm, Cm):
    """One Mamba2 state update (rollouts, no autograd).

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
            for p in range(headdim):
                dtx = dtv * x[b, hh, p]
                for n in range(d_state):
                    hv = a * h[b, hh, p, n] + dtx * Bm[b, g, n]
                    h_new[b, hh, p, n] = hv
                    prod[n] = hv * Cm[b, g, n]
                y[b, hh, p] = _lane_sum(prod)
    return h_new, y


@numba.njit(parallel=True, cache=True, fastmath=_FM)
def conv_step_silu(conv_state, x, w, bias):
    """One step of the depthwise causal conv followed by SiLU (rollouts, no autograd).

    conv_state [B, C, W] (last column the most recent input); x [B, C]; w [C, W]; bias [C].
    Returns the new conv state [B, C, W] and silu(conv output) [B, C].
    """
    batch, channels, width = conv_state.shape
    new_state = np.empty_like(conv_state)
    out = np.empty((batch, channels), dtype=x.dtype)
    for b in prange(batch):
        for c in range(channels):
            acc = bias[c]
            for k in range(width - 1):
                v = conv_state[b, c, k + 1]
                new_state[b, c, k] = v
                acc += v * w[c, k]
            v = x[b, c]
            new_state[b, c, width - 1] = v
            acc += v * w[c, width - 1]
            out[b, c] = acc
        for c in range(channels):  # SiLU in its own loop, which vectorises
            v = out[b, c]
            out[b, c] = v / (1 + fexp(-v))
    return new_state, out


@numba.njit(parallel=True, cache=True, fastmath=_FM)
def mamba_step_gated(h, dt, xs, z, A, Dv, Bm, Cm):
    """One fused Mamba step (rollouts, no autograd): state update, D skip and SiLU gate.

    h [B, D, N] (mamba-ssm layout); dt (after softplus), xs, z [B, D]; Dv [D]; A [D, N];
    Bm, Cm [B, N]. Returns new h [B, D, N] and y = (C . h + D * xs) * silu(z) [B, D].
    """
    batch, d_inner, d_state = h.shape
    h_new = np.empty_like(h)
    y = np.empty((batch, d_inner), dtype=h.dtype)
    for b in prange(batch):
        prod = np.empty(d_state, dtype=h.dtype)
        for d in range(d_inner):
            dtv = dt[b, d]
            xv = xs[b, d]
            dtx = dtv * xv
            for n in range(d_state):
                hv = fexp(dtv * A[d, n]) * h[b, d, n] + dtx * Bm[b, n]
                h_new[b, d, n] = hv
                prod[n] = hv * Cm[b, n]
            y[b, d] = _lane_sum(prod) + Dv[d] * xv
        for d in range(d_inner):  # the gate in its own loop, which vectorises
            zv = z[b, d]
            y[b, d] *= zv / (1 + fexp(-zv))
    return h_new, y
