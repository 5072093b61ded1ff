"""The compiled numba loops behind :mod:`seqmodels.kernels.numba_ops` (imported lazily from there:
numba is needed only here). Importing this module compiles nothing (numba compiles, or loads from
its disk cache, on a kernel's first call) and changes no numba setting.

Forward kernels return the outputs, the last state and the states at every ``every``-th step
(checkpoints, ``[B, L / every, ...]``); backward kernels recompute one chunk of states at a
time from those checkpoints and run the reverse recurrence. Parallel over the batch rows (each
thread owns its rows, so the sums over channels into dB / dC need no atomics); the gradient of
A is returned per row and summed by the caller.

Resets (``keep[b, t] == 0``): the state a reset step starts from is replaced by zeros (the
forward kernels zero it; the backward kernels, which keep the state before the step for the
step before, read a zero array instead), never multiplied by 0: a NaN or inf before a reset
reaches neither the outputs and states from it on nor the gradients of the inputs from it on.
"""

from __future__ import annotations

import math
import platform

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload

prange = numba.prange
_X86_64 = platform.machine().lower() in ("x86_64", "amd64")

# Only FMA contraction ("contract") of the fast-math flags: a fused multiply-add rounds once
# instead of twice (never less accurate), keeps NaN / inf / signed-zero semantics and lets LLVM
# emit vfmadd on AVX2 (faster scan kernels). The reassociating flags are not
# used, so float64 results stay within 1e-10 of the reference loop.
_FM = {"contract"}

# --- vectorisable exp -----------------------------------------------------------------------
# fexp(x) = 2^k * exp(r), k = round(x / ln2), r = x - k ln2 (Cody-Waite split of ln2); fexp2(t)
# = 2^k * 2^f, k = round(t), f = t - k (exact). exp(r) on |r| <= ln2/2 and 2^f on |f| <= 1/2 by
# polynomials: float32 minimax, degree 6 for exp (relative error < 2e-9 before rounding; results
# within 1.1e-7 of exp) and degree 5 for 2^f (9.2e-8; results within 1.9e-7, 1.6 ulp: one FMA
# less in the scans' inner loops); float64 Taylor to degree 12 (< 3e-16). Pure arithmetic, so LLVM
# vectorises the loops that call them without fastmath (libm's exp is a scalar call). float32
# scales by 2^k by adding k to the exponent bits of the polynomial's value (an integer add, no
# multiply); where exp is not a normal float fexp gives 0 (x < -87.34) and fexp2 a value below
# 2^-126 (t in (-127, -126), 0 from -127 on): error < 1.2e-38, no denormal arithmetic later;
# large arguments are clamped (88 / 127: never +inf). float64 multiplies
# by 2^k built in the exponent bits of the rounding shifter, x clamped to [-708, 709].
# The scans need exp(dt * A) (dt * A <= 0) for every state entry: they call
# fexp2(dt * (A * exp_scale(dt))), exp_scale = log2(e) for float32 (the reduction costs one add
# and one subtraction instead of three FMAs) and 1 for float64 (fexp2 = fexp there, so the
# float64 kernels compute exactly what they computed with fexp).


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


@intrinsic
def _opaque(typingctx, x):
    """x itself, through ``llvm.arithmetic.fence`` (a no-op on the value). For the float32
    polynomial constants below: LLVM keeps a constant splat as a constant-pool operand and, in
    numba's JIT (large code model), reloads it in every iteration of a vectorised loop (a
    64-bit address move and a broadcast per constant: 18 of the 36 instructions of the backward
    scan's exp loop). An opaque value is computed once, outside the loop, and stays in a vector
    register (measured: that loop 36 -> 23 instructions; results bit-identical). Only on
    x86-64, where it was measured; elsewhere x itself."""
    if x not in (types.float32, types.float64):
        return None

    def codegen(context, builder, signature, args):
        if not _X86_64:
            return args[0]
        llty = args[0].type
        fence = builder.module.declare_intrinsic(
            "llvm.arithmetic.fence", [llty], ir.FunctionType(llty, [llty])
        )
        return builder.call(fence, [args[0]])

    return x(x), codegen


@intrinsic
def _prefetch(typingctx, a, i):
    """Ask for the cache line holding a[i] (1-D array) ahead of a read (``llvm.prefetch``; a
    hint: no effect on results)."""
    if not isinstance(a, types.Array) or a.ndim != 1 or not isinstance(i, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        arr = context.make_array(signature.args[0])(context, builder, args[0])
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fn = builder.module.declare_intrinsic(
            "llvm.prefetch", [i8p], ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        )
        ptr = builder.bitcast(builder.gep(arr.data, [args[1]]), i8p)
        builder.call(fn, [ptr, i32(0), i32(3), i32(1)])  # read, keep in all levels, data
        return context.get_dummy_value()

    return types.none(a, i), codegen


@numba.njit(cache=True, inline="always")
def _prefetch_row(a):
    """Prefetch every 64-byte cache line of the contiguous 1-D array a."""
    for j in range(0, a.shape[0], 64 // a.itemsize):
        _prefetch(a, j)


def fexp(x):
    """exp(x) for float32/float64 scalars inside the kernels (see the comment above)."""
    return math.exp(x)


def fexp2(t):
    """2**t (float32) / exp(t) (float64) inside the kernels: exp(x) = fexp2(x * exp_scale(x))
    (see the comment above)."""
    return math.exp(t)


def exp_scale(x):
    """log2(e) as a float32 for a float32 x, 1.0 for a float64 (see :func:`fexp2`)."""
    return 1.0


_F32 = np.float32
_LOG2E_32, _SHIFT_32 = _F32(1.4426950408889634), _F32(12582912.0)  # 1.5 * 2**23
_LN2_HI_32, _LN2_LO_32 = _F32(0.693359375), _F32(-2.12194440e-4)
_XMIN_32, _XMAX_32, _XLOW_32 = _F32(-87.5), _F32(88.0), _F32(-87.33654)  # exp(_XLOW) ~ 2^-126
_TMIN_32, _TMAX_32 = _F32(-127.0), _F32(127.0)
# minimax coefficients of exp(r) = 1 + r q(r) on |r| <= ln2/2 and 2^f = 1 + f q(f) on |f| <= 1/2
_E1, _E2, _E3, _E4, _E5, _E6 = (
    _F32(c)
    for c in (
        1.000000032166063,
        0.4999999420896534,
        0.16666431257679418,
        0.04166800203203498,
        0.008374155741652806,
        0.0013843655228710514,
    )
)
_Q1, _Q2, _Q3, _Q4, _Q5 = (
    _F32(c)
    for c in (
        0.6931469775929374,
        0.24022242073257205,
        0.055507337458014616,
        0.00967151343541178,
        0.0013264729182036541,
    )
)
_ONE_32 = _F32(1.0)
_LOG2E_64, _SHIFT_64 = 1.4426950408889634, 6755399441055744.0  # 1.5 * 2**52
_LN2_HI_64, _LN2_LO_64 = 6.93147180369123816490e-01, 1.90821492927058770002e-10
_C64 = [1.0 / math.factorial(i) for i in range(13)]
(_C64_2, _C64_3, _C64_4, _C64_5, _C64_6, _C64_7, _C64_8, _C64_9, _C64_10, _C64_11, _C64_12) = _C64[
    2:
]


@numba.njit(cache=True, fastmath=_FM, inline="always")
def _scale_exp32(p, s, keep):
    """p * 2^k for p in [0.7, 1.42], k the integer in s = k + 1.5 * 2**23 (|k| <= 127): k added to
    the exponent bits of p (the shifter's bits, shifted left by 23, are k's); 0 where not keep
    (a bit mask: a branch here trips numba's SSA check inside parallel loops)."""
    bits = np.int64(_float_bits(p)) + (np.int64(_float_bits(s)) << 23)
    return _bits_float(np.int32(bits & -np.int64(keep)))


@numba.njit(cache=True, fastmath=_FM, inline="always")
def _fexp64(x):
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


@overload(fexp, inline="always")
def _fexp_impl(x):
    if x == types.float32:

        def impl32(x):
            v = min(max(x, _opaque(_XMIN_32)), _opaque(_XMAX_32))
            shift = _opaque(_SHIFT_32)
            s = v * _opaque(_LOG2E_32) + shift
            k = s - shift
            r = (v - k * _opaque(_LN2_HI_32)) - k * _opaque(_LN2_LO_32)
            q = _opaque(_E6) * r + _opaque(_E5)
            q = q * r + _opaque(_E4)
            q = q * r + _opaque(_E3)
            q = q * r + _opaque(_E2)
            q = q * r + _opaque(_E1)
            return _scale_exp32(q * r + _opaque(_ONE_32), s, x >= _opaque(_XLOW_32))

        return impl32
    if x == types.float64:
        return lambda x: _fexp64(x)
    return None


@overload(fexp2, inline="always")
def _fexp2_impl(t):
    if t == types.float32:

        def impl32(t):
            # clamped at -127: k = -127 comes with f >= 0 (p >= 1), and 2^-127 * p is assembled
            # with a zero exponent field (0 at t = -127 exactly, a value < 2^-126 above)
            v = min(max(t, _opaque(_TMIN_32)), _opaque(_TMAX_32))
            shift = _opaque(_SHIFT_32)
            s = v + shift
            f = v - (s - shift)
            q = _opaque(_Q5) * f + _opaque(_Q4)
            q = q * f + _opaque(_Q3)
            q = q * f + _opaque(_Q2)
            q = q * f + _opaque(_Q1)
            return _scale_exp32(q * f + _opaque(_ONE_32), s, True)

        return impl32
    if t == types.float64:
        return lambda t: _fexp64(t)
    return None


@overload(exp_scale, inline="always")
def _exp_scale_impl(x):
    if x == types.float32:
        return lambda x: _LOG2E_32
    if x == types.float64:
        return lambda x: 1.0
    return None


def fsoftplus(x):
    """softplus(x) = log(1 + exp(x)) for float32/float64 scalars inside the kernels: float64
    as torch computes it (log1p(exp(x)), x itself above 20); float32 vectorisable:
    max(x, 0) + log1p(e), e = exp(-|x|) in (0, 1], log1p(e) = 2 atanh(s), s = e / (2 + e) <= 1/3,
    by its odd series to s^13 (relative error < 2e-8)."""
    return math.log1p(math.exp(x))


_T20_32 = _F32(20.0)
_ZERO_32, _TWO_32 = _F32(0.0), _F32(2.0)
_S3, _S5, _S7, _S9, _S11, _S13 = (_F32(1.0 / k) for k in (3, 5, 7, 9, 11, 13))


@overload(fsoftplus, inline="always")
def _fsoftplus_impl(x):
    if x == types.float32:

        def impl32(x):
            two = _opaque(_TWO_32)
            e = fexp(-abs(x))
            s = e / (two + e)
            s2 = s * s
            p = _opaque(_S13) * s2 + _opaque(_S11)
            p = p * s2 + _opaque(_S9)
            p = p * s2 + _opaque(_S7)
            p = p * s2 + _opaque(_S5)
            p = p * s2 + _opaque(_S3)
            p = p * s2 + _opaque(_ONE_32)
            return max(x, _opaque(_ZERO_32)) + two * s * p

        return impl32
    if x == types.float64:

        def impl64(x):
            return x if x > 20.0 else math.log1p(math.exp(x))

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
        zero_state = np.zeros((d_state, d_inner), dtype=u.dtype)
        dA_b = dA[b]
        for c in range(n_ckpt - 1, -1, -1):
            start = c * every
            stop = min(length, start + every)
            hs[0] = ckpt[b, c]
            for i in range(stop - start):
                t = start + i
                k = keep[b, t]
                h_prev = hs[i] if k != 0 else zero_state  # (see the module docstring)
                for d in range(d_inner):
                    dl[d] = delta[b, t, d]
                    dtu[d] = delta[b, t, d] * u[b, t, d]
                for n in range(d_state):
                    bn = Bm[b, t, n]
                    for d in range(d_inner):
                        a = k * fexp(dl[d] * At[n, d])
                        decays[i, n, d] = a
                        hs[i + 1, n, d] = a * h_prev[n, d] + dtu[d] * bn
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
                    dC[b, t, n] = _lane_sum(prod_c)
                    dB[b, t, n] = _lane_sum(prod_b)
                for d in range(d_inner):
                    ddelta[b, t, d] = ddt[d]
                    du[b, t, d] = dxs[d] * delta[b, t, d]
        dh0[b] = gh
    return du, ddelta, dA, dB, dC, dh0


# The SSD kernels keep the state of group g as [N, Q] with Q = (heads per group) * headdim: the
# channels of all heads that read the same B_t, C_t innermost, so the inner loops run over Q
# (128 for 8 heads of 16 channels) rather than over one head's headdim (too short for the
# vectoriser: LLVM's vector body needs >= 32 float32 iterations). Channel c = h * P + p of the
# flat [B, L, H * P] input is entry c - g * Q of its group's rows.


@numba.njit(parallel=True, cache=True, fastmath=_FM)
def ssd_fwd_t(x, dt, A, Dq, Bm, Cm, keep, h0, every):
    """Mamba2 (SSD) forward, D skip included.

    x [B, L, C] (C = H * P, head h owns channels h * P .. h * P + P - 1); dt [B, L, H]; A [H];
    Dq [C] (the skip D per channel); Bm, Cm [B, L, G, N]; keep [B, L]; h0 [B, G, N, Q].
    Returns y = C . h + Dq * x [B, L, C], h_last [B, G, N, Q] and checkpoints
    [B, ceil(L / every), G, N, Q] (state before steps 0, every, ...).
    """
    batch, length, channels = x.shape
    nheads = dt.shape[2]
    ngroups = Bm.shape[2]
    d_state = Bm.shape[3]
    headdim = channels // nheads
    q_len = channels // ngroups
    n_ckpt = (length + every - 1) // every
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
            for hh in range(nheads):
                dtv = dt[b, t, hh]
                a = math.exp(dtv * A[hh])
                for p in range(hh * headdim, (hh + 1) * headdim):
                    aq[p] = a
                    dtx[p] = dtv * x[b, t, p]
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


@numba.njit(parallel=True, cache=True, fastmath=_FM)
def ssd_bwd_t(x, dt, A, Dq, Bm, Cm, keep, ckpt, dy, dh_last, every):
    """Backward of :func:`ssd_fwd_t` (layouts as there; dh_last [B, G, N, Q]).

    Returns dx [B, L, C]; ddt [B, L, H]; dA per row [B, H]; dD per row [B, C];
    dB, dC [B, L, G, N]; dh0 [B, G, N, Q].

    As :func:`mamba_fused_bwd`: the sums over channels are vectorised dot products
    (:func:`_dot`) taken before the reverse update, dC[n] = gy . h[n] and
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
                h_prev = hs[i] if k != 0 else zero_state  # (see the module docstring)
                for hh in range(nheads):
                    dtv = dt[b, t, hh]
                    a = k * math.exp(dtv * A[hh])
                    for p in range(hh * headdim, (hh + 1) * headdim):
                        aqs[i, p] = a
                        dtx[p] = dtv * x[b, t, p]
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
                    gy_dtx = _dot(gyg, dtxg)
                    for n in range(d_state):
                        dC[b, t, g, n] = _dot(gyg, h_now[n])
                        dB[b, t, g, n] = _dot(ghg[n], dtxg) + Cm[b, t, g, n] * gy_dtx
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
                    d_log = _lane_sum(dprev[lo:hi]) * aqs[i, lo]  # d loss / d (dt * A)
                    ddt[b, t, hh] = d_log * A[hh] + _lane_sum(prod_x[lo:hi])
                    dA_b[hh] += d_log * dtq[lo]
        dh0[b] = gh
    return dx, ddt, dA, dD, dB, dC, dh0


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


@numba.njit(cache=True, fastmath=_FM, inline="always")
def _conv_silu_step_row(old, src, off, w, bias, new, out, one):
    """One row of a causal-conv step then SiLU, for the step kernels: old, new [C, W] (the
    row's conv state before / after: the oldest input dropped, src[off + c] appended), w [C, W]
    (tap W-1 reads the current input), bias [C]; out [C] = silu(conv output). The taps are
    summed oldest first after the bias, as conv_silu_fwd sums them. The default width (4) is
    unrolled (measured 57 -> 25 us for the 160 channels of a Mamba2 step at B=128, float32;
    77 -> 25 us for conv_step_silu at C=128)."""
    channels, width = old.shape
    if width == 4:
        for c in range(channels):
            v1, v2, v3, v4 = old[c, 1], old[c, 2], old[c, 3], src[off + c]
            new[c, 0], new[c, 1], new[c, 2], new[c, 3] = v1, v2, v3, v4
            wc = w[c]
            out[c] = (((bias[c] + v1 * wc[0]) + v2 * wc[1]) + v3 * wc[2]) + v4 * wc[3]
    else:
        for c in range(channels):
            acc = bias[c]
            for k in range(width - 1):
                v = old[c, k + 1]
                new[c, k] = v
                acc += v * w[c, k]
            v = src[off + c]
            new[c, width - 1] = v
            out[c] = acc + v * w[c, width - 1]
    for c in range(channels):  # SiLU in its own loop, which vectorises
        v = out[c]
        out[c] = v / (one + fexp(-v))


@numba.njit(parallel=True, cache=True, fastmath=_FM)
def conv_step_silu(conv_state, x, w, bias):
    """One step of the depthwise causal conv followed by SiLU (rollouts, no autograd).

    conv_state [B, C, W] (last column the most recent input); x [B, C]; w [C, W]; bias [C].
    Returns the new conv state [B, C, W] and silu(conv output) [B, C].
    """
    batch, channels, width = conv_state.shape
    new_state = np.empty_like(conv_state)
    out = np.empty((batch, channels), dtype=x.dtype)
    one = x.dtype.type(1)  # (a literal 1 would make the float32 SiLU a float64 one)
    for b in prange(batch):
        _conv_silu_step_row(conv_state[b], x[b], 0, w, bias, new_state[b], out[b], one)
    return new_state, out


@numba.njit(parallel=True, cache=True, fastmath=_FM)
def mamba_step_gated(h, dt, dt_bias, softplus, xs, z, A, Dv, Bm, Cm):
    """One fused Mamba step (rollouts, no autograd): step size, state update, D skip and gate.

    h [B, D, N] (mamba-ssm layout); dt, xs, z [B, D]; dt_bias, Dv [D]; A [D, N]; Bm, Cm
    [B, N]. The step size is softplus(dt + dt_bias) when softplus, else dt + dt_bias.
    Returns new h [B, D, N] and y = (C . h + D * xs) * silu(z) [B, D].

    The exp of the state update runs in one flat loop over the D * N entries of a row (a loop
    over N alone, 16 long, is too short for the vectoriser), as fexp2(dt * A * log2 e) (float32;
    float64 fexp, see exp_scale). C . h runs over blocks of 8 channels with one accumulator each:
    eight independent FMA chains instead of one serial chain per channel (without reassociating
    fast-math a single chain is latency-bound; measured 6.9 -> 4.8 ms at B=1024, D=128, N=16).
    Each channel still sums over n in order.
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


# --- depthwise causal conv + SiLU over sequences, [B, L, C] layout -------------------------
# Input channel c of row (b, t) is src[b, t, off + c]: src is the whole in_proj output, read in
# place (no copy of the conv's channel slice). Tap j of the W taps reads the input W-1-j steps
# back; a tap that reaches before the latest episode start at or before t reads zero (inputs
# before t = 0 come from the history: the W-1 previous inputs, valid until the first reset).


@numba.njit(parallel=True, cache=True, fastmath=_FM)
def conv_silu_fwd(src, off, w, bias, hist, keep):
    """Forward: src [B, L, S]; off (channel offset); w [W, C] (tap W-1 reads the current
    input); bias [C]; hist [B, W-1, C] (previous inputs, oldest first); keep [B, L].

    Returns silu(conv) [B, L, C] and the new conv state [B, C, W] (the last W inputs, zero
    where they precede the latest episode start).
    """
    batch, length, _ = src.shape
    width, channels = w.shape
    out = np.empty((batch, length, channels), dtype=src.dtype)
    state = np.empty((batch, channels, width), dtype=src.dtype)
    one = src.dtype.type(1)
    for b in prange(batch):
        acc = np.empty(channels, dtype=src.dtype)
        start = -width  # the latest episode start (none yet: the history is valid)
        for t in range(length):
            if keep[b, t] == 0:
                start = t
            for c in range(channels):
                acc[c] = bias[c]
            for j in range(max(0, start - t + width - 1), width):
                s = t - (width - 1) + j
                row = src[b, s, off : off + channels] if s >= 0 else hist[b, s + width - 1]
                wj = w[j]
                for c in range(channels):
                    acc[c] += wj[c] * row[c]
            for c in range(channels):
                v = acc[c]
                out[b, t, c] = v / (one + fexp(-v))
        for j in range(width):
            s = length - width + j
            if s < start:
                state[b, :, j] = 0
            else:
                row = src[b, s, off : off + channels] if s >= 0 else hist[b, s + width - 1]
                state[b, :, j] = row
    return out, state


@numba.njit(parallel=True, cache=True, fastmath=_FM)
def conv_silu_bwd(src, off, w, bias, hist, keep, dout, dstate, dsrc, doff):
    """Backward of :func:`conv_silu_fwd` (dout [B, L, C], dstate [B, C, W]).

    Writes dx into dsrc[b, t, doff + c] (dsrc [B, L, S'], e.g. the gradient of the whole
    in_proj output). Returns dw per row [B, W, C], dbias per row [B, C], dhist [B, W-1, C].
    """
    batch, length, _ = src.shape
    width, channels = w.shape
    dw = np.zeros((batch, width, channels), dtype=src.dtype)
    dbias = np.zeros((batch, channels), dtype=src.dtype)
    dhist = np.zeros((batch, width - 1, channels), dtype=src.dtype)
    one = src.dtype.type(1)
    for b in prange(batch):
        for t in range(length):
            dsrc[b, t, doff : doff + channels] = 0
        acc = np.empty(channels, dtype=src.dtype)
        grad = np.empty(channels, dtype=src.dtype)
        dw_b = dw[b]
        db_b = dbias[b]
        start = -width
        for t in range(length):
            if keep[b, t] == 0:
                start = t
            first = max(0, start - t + width - 1)
            for c in range(channels):
                acc[c] = bias[c]
            for j in range(first, width):
                s = t - (width - 1) + j
                row = src[b, s, off : off + channels] if s >= 0 else hist[b, s + width - 1]
                wj = w[j]
                for c in range(channels):
                    acc[c] += wj[c] * row[c]
            for c in range(channels):
                v = acc[c]
                sig = one / (one + fexp(-v))
                g = dout[b, t, c] * sig * (one + v * (one - sig))
                grad[c] = g
                db_b[c] += g
            for j in range(first, width):
                s = t - (width - 1) + j
                row = src[b, s, off : off + channels] if s >= 0 else hist[b, s + width - 1]
                drow = dsrc[b, s, doff : doff + channels] if s >= 0 else dhist[b, s + width - 1]
                wj = w[j]
                dwj = dw_b[j]
                for c in range(channels):
                    dwj[c] += grad[c] * row[c]
                    drow[c] += grad[c] * wj[c]
        for j in range(width):
            s = length - width + j
            if s >= start:
                drow = dsrc[b, s, doff : doff + channels] if s >= 0 else dhist[b, s + width - 1]
                for c in range(channels):
                    drow[c] += dstate[b, c, j]
    return dw, dbias, dhist


# --- gated RMSNorm (Mamba2's output norm) ----------------------------------------------------


@numba.njit(cache=True, fastmath=_FM, inline="always")
def _group_rstd(u, sq, rstd, group_size, eps):
    """rstd[c] = 1 / sqrt(mean of u^2 over c's group + eps) (sq: scratch)."""
    channels = u.shape[0]
    for c in range(channels):
        sq[c] = u[c] * u[c]
    for lo in range(0, channels, group_size):
        r = 1 / math.sqrt(_lane_sum(sq[lo : lo + group_size]) / group_size + eps)
        for c in range(lo, lo + group_size):
            rstd[c] = r  # (rounded to the array's dtype)


@numba.njit(parallel=True, cache=True, fastmath=_FM)
def rmsnorm_gated_fwd(x, src, off, weight, group_size, eps, norm_before_gate):
    """x [B, L, C]; the gate z[b, t, c] = src[b, t, off + c]; weight [C]; RMS over groups of
    group_size channels. norm_before_gate: rmsnorm(x) * weight * silu(z), else
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
            xr = x[b, t]
            zr = src[b, t, off : off + channels]
            for c in range(channels):
                zv = zr[c]
                sz[c] = zv / (one + fexp(-zv))
            if norm_before_gate:
                u[:] = xr
            else:
                for c in range(channels):
                    u[c] = xr[c] * sz[c]
            _group_rstd(u, sq, rstd, group_size, eps)
            orow = out[b, t]
            if norm_before_gate:
                for c in range(channels):
                    orow[c] = u[c] * rstd[c] * weight[c] * sz[c]
            else:
                for c in range(channels):
                    orow[c] = u[c] * rstd[c] * weight[c]
    return out


@numba.njit(parallel=True, cache=True, fastmath=_FM)
def rmsnorm_gated_bwd(x, src, off, weight, group_size, eps, norm_before_gate, dout):
    """Backward of :func:`rmsnorm_gated_fwd`: dx, dz [B, L, C] and dweight per row [B, C]."""
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
                proj = _lane_sum(sq[lo : lo + group_size]) * r * r / group_size
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


@numba.njit(parallel=True, cache=True, fastmath=_FM)
def rmsnorm_fwd(x, weight, eps):
    """x [M, C] rows; weight [C]. Returns out = x * rstd * weight [M, C] and rstd [M], with
    rstd = 1 / sqrt(mean(x^2) + eps) per row."""
    rows, channels = x.shape
    out = np.empty_like(x)
    rstd = np.empty(rows, dtype=x.dtype)
    for i in prange(rows):
        xr = x[i]
        r = 1 / math.sqrt(_dot(xr, xr) / channels + eps)
        rstd[i] = r  # (rounded to the array's dtype)
        orow = out[i]
        for c in range(channels):
            orow[c] = xr[c] * rstd[i] * weight[c]
    return out, rstd


@numba.njit(parallel=True, cache=True, fastmath=_FM)
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
            proj = _dot(gu, xr) * r * r / channels
            dxr = dx[i]
            for c in range(channels):
                dxr[c] = r * (gu[c] - xr[c] * proj)
    return dx, dweight


# --- fused Mamba inner part (training path) --------------------------------------------------
# delta = softplus(dt_low @ W_dt^T + dt_bias) computed in the kernel (dt_rank FMAs per channel),
# the scan, then y = (C . h + D * u) * silu(z): the [B, L, D] tensors delta, C . h, the skip and
# the gate never exist; the backward recomputes all of them from u, dt_low, B, C, z and the
# checkpoint states.


@numba.njit(parallel=True, cache=True, fastmath=_FM)
def mamba_fused_fwd(u, dtl, Wt, dbias, At, Bm, Cm, zsrc, zoff, Dv, keep, h0, every, pre):
    """u [B, L, D]; dtl [B, L, R]; Wt [R, D] (dt_proj weight transposed); dbias [D];
    At [N, D]; Bm, Cm [B, L, N]; the gate z[b, t, d] = zsrc[b, t, zoff + d]; Dv [D]; keep [B, L];
    h0 [B, N, D]. Returns y = (C . h + D * u) * silu(z) [B, L, D], h_last [B, N, D] and
    checkpoints [B, ceil(L / every), N, D]. When pre has the shape of u, the output before
    the gate, C . h + D * u, is written into it (for the backward; else pass a [0, 0, 0]
    array)."""
    batch, length, d_inner = u.shape
    store_pre = pre.shape[0] == batch
    d_state = At.shape[0]
    rank = Wt.shape[0]
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
            for d in range(d_inner):
                dl[d] = dbias[d]
            for r in range(rank):
                dr = dtl[b, t, r]
                wr = Wt[r]
                for d in range(d_inner):
                    dl[d] += dr * wr[d]
            for d in range(d_inner):
                delta = fsoftplus(dl[d])
                dl[d] = delta
                dtu[d] = delta * ur[d]
                acc[d] = 0
            for n in range(d_state):
                bn = Bm[b, t, n]
                cn = Cm[b, t, n]
                an = A2[n]
                hn = h[n]
                for d in range(d_inner):
                    hv = fexp2(dl[d] * an[d]) * hn[d] + dtu[d] * bn
                    hn[d] = hv
                    acc[d] += hv * cn
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


# Reassociation ("reassoc") lets LLVM vectorise a sum over an array (several vector partial sums
# added at the end). It is allowed only in this helper, which holds nothing but the sum of
# products (in the kernels it would also reorder the exp's argument reduction): it changes the
# order of one dot product's additions, an error within d * eps * sum |a b| like the sequential
# sum's. Not inlined at numba's level, so its flags stay its own (LLVM inlines it, flags kept).
_FM_SUM = {"contract", "reassoc"}


@numba.njit(cache=True, fastmath=_FM_SUM)
def _dot(a, b):
    """sum(a * b) of two 1-D arrays of the same length (vectorised, see _FM_SUM)."""
    s = a.dtype.type(0)
    for i in range(a.shape[0]):
        s += a[i] * b[i]
    return s


@numba.njit(parallel=True, cache=True, fastmath=_FM)
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

    Writes dz into dzdst[b, t, dzoff + d] (e.g. the gradient of the whole in_proj output), the
    gradients of dtl, Bm, Cm into ddtl [B, L, R], dB, dC [B, L, N] (the caller's arrays: e.g.
    views of one [B, L, R + 2 N] buffer, the gradient of the x_proj output), the gradient of u
    into du [B, L, D] (may be dy's own array: each step reads its row of dy before it writes
    its row of du) and, when y has the shape of u, the forward's output into y (recomputed on
    the way, for out_proj's weight gradient when the caller did not keep it; pass a [0, 0, 0]
    array otherwise).
    Returns per row (summed by the caller): dWt [B, R, D], ddbias [B, D], dA [B, N, D],
    dD [B, D]; and dh0 [B, N, D].

    Per chunk of ``every`` steps: the states and decays recomputed forward from the checkpoint
    (hs [every + 1, N, D], decays [every, N, D]), then the reverse recurrence. Its loop over
    the channels takes two state rows at a time, so the per-channel sums over n (ddt, dxs) are
    loaded and stored once per two rows (the loop is store-bound: 3 stores per row and
    channel instead of 7); the sums over channels (dB, dC, ddtl) are separate vectorised dot
    products (:func:`_dot`) instead of product arrays summed by :func:`_lane_sum`:
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
                h_prev = hs[i] if k != 0 else zero_state  # (see the module docstring)
                ur = u[b, t]
                for d in range(d_inner):
                    dl[d] = dbias[d]
                for r in range(rank):
                    dr = dtl[b, t, r]
                    wr = Wt[r]
                    for d in range(d_inner):
                        dl[d] += dr * wr[d]
                for d in range(d_inner):
                    v = dl[d]
                    delta = fsoftplus(v)
                    deltas[i, d] = delta
                    dsoft[i, d] = one / (one + fexp(-v))
                    dtu[d] = delta * ur[d]
                for n in range(d_state):
                    bn = Bm[b, t, n]
                    an2 = A2[n]
                    for d in range(d_inner):
                        a = k * fexp2(deltas[i, d] * an2[d])
                        decays[i, n, d] = a
                        hs[i + 1, n, d] = a * h_prev[n, d] + dtu[d] * bn
            for i in range(stop - start - 1, -1, -1):
                t = start + i
                if t > 0:  # the rows of the step before, ahead of their reads (see the docstring)
                    _prefetch_row(zsrc[b, t - 1, zoff : zoff + d_inner])
                    _prefetch_row(dy[b, t - 1])
                    _prefetch_row(u[b, t - 1])
                    if have_pre:
                        _prefetch_row(pre[b, t - 1])
                    _prefetch_row(Cm[b, t - 1])
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
                gy_dtu = _dot(gy, dtu)
                for n in range(d_state):
                    dC[b, t, n] = _dot(gy, h_now[n])
                    dB[b, t, n] = _dot(gh[n], dtu) + Cm[b, t, n] * gy_dtu
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
                    ddtl[b, t, r] = _dot(ddt, Wt[r])
        dh0[b] = gh
    return dWt, ddbias, dA, dD, dh0


@numba.njit(parallel=True, cache=True, fastmath=_FM)
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
        _conv_silu_step_row(old_conv, xr, 0, conv_w, conv_b, new_conv[b], xs, one)
        for j in range(n_dbl):
            dbl[j] = _dot(W_x[j], xs)
        for d in range(d_inner):
            dl[d] = b_dt[d]
        for r in range(rank):
            dr = dbl[r]
            wr = Wt[r]
            for d in range(d_inner):
                dl[d] += dr * wr[d]
        for d in range(d_inner):
            dl[d] = fsoftplus(dl[d])
        h_old = zero_ssm if reset[b] else ssm_state[b]  # (see the module docstring)
        h_new = new_ssm[b]
        Bv = dbl[rank : rank + d_state]
        Cv = dbl[rank + d_state : rank + 2 * d_state]
        for d in range(d_inner):
            dtv = dl[d]
            dtx = dtv * xs[d]
            a_row, h_row, new_row = a_scaled[d], h_old[d], h_new[d]
            for n in range(d_state):
                new_row[n] = fexp2(dtv * a_row[n]) * h_row[n] + dtx * Bv[n]
            acc[d] = _dot(new_row, Cv)
        yr = y[b]
        for d in range(d_inner):  # D skip and gate in their own loop, which vectorises
            zv = xr[d_inner + d]
            yr[d] = (acc[d] + Dv[d] * xs[d]) * (zv / (one + fexp(-zv)))
    return y, new_conv, new_ssm


@numba.njit(parallel=True, cache=True, fastmath=_FM)
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
        _conv_silu_step_row(old_conv, row, xbc_off, conv_w, conv_b, new_conv[b], xbc, one)
        for hh in range(nheads):
            v = fsoftplus(row[dt_off + hh] + dt_bias[hh])
            step[hh] = min(max(v, lo), hi) if clamp_dt else v
        h_old = zero_ssm if reset[b] else ssm_state[b]  # (see the module docstring)
        h_new = new_ssm[b]
        for hh in range(nheads):
            g = hh // heads_per_group
            Bv = xbc[d_ssm + g * d_state : d_ssm + (g + 1) * d_state]
            Cv = xbc[c_off + g * d_state : c_off + (g + 1) * d_state]
            dtv = step[hh]
            decay = math.exp(dtv * A[hh])
            for p in range(headdim):
                c = hh * headdim + p
                dtx = dtv * xbc[c]
                h_row, new_row = h_old[hh, p], h_new[hh, p]
                for n in range(d_state):
                    new_row[n] = decay * h_row[n] + dtx * Bv[n]
                ys[c] = Dq[c] * xbc[c] + _dot(new_row, Cv)
        yr = y[b]
        for c in range(d_mlp):  # the gated-MLP channels
            zv = row[c]
            yr[c] = zv / (one + fexp(-zv)) * row[d_mlp + c]
        for c in range(d_ssm):
            zv = row[z_off + c]
            sz[c] = zv / (one + fexp(-zv))
        out = yr[d_mlp:]
        if not rmsnorm:
            for c in range(d_ssm):
                out[c] = ys[c] * sz[c]
        elif norm_before_gate:
            _group_rstd(ys, sq, rstd, group_size, eps)
            for c in range(d_ssm):
                out[c] = ys[c] * rstd[c] * norm_w[c] * sz[c]
        else:
            for c in range(d_ssm):
                ys[c] = ys[c] * sz[c]
            _group_rstd(ys, sq, rstd, group_size, eps)
            for c in range(d_ssm):
                out[c] = ys[c] * rstd[c] * norm_w[c]
    return y, new_conv, new_ssm
