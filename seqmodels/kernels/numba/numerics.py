"""The scalar functions and reductions every numba kernel of :mod:`seqmodels.kernels.numba`
calls: a vectorisable exp (:func:`fexp`, :func:`fexp2`, :func:`exp_scale`) and softplus
(:func:`fsoftplus`), two sums over a row (:func:`lane_sum`, :func:`dot`), a prefetch hint
(:func:`prefetch_row`) and the fast-math flags the kernels compile with (:data:`FASTMATH`).
No kernel of its own: every function here is inlined into, or called from, the kernels of the
sibling modules, so it is on whichever path its caller is.
"""

from __future__ import annotations

import math
import platform

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload

_X86_64 = platform.machine().lower() in ("x86_64", "amd64")

# Only FMA contraction ("contract") of the fast-math flags: a fused multiply-add rounds once
# instead of twice (never less accurate), keeps NaN / inf / signed-zero semantics and lets LLVM
# emit vfmadd on AVX2 (faster scan kernels). The reassociating flags are not
# used, so float64 results stay within 1e-10 of the reference loop.
FASTMATH = {"contract"}

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
def prefetch_row(a):
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


@numba.njit(cache=True, fastmath=FASTMATH, inline="always")
def _scale_exp32(p, s, keep):
    """p * 2^k for p in [0.7, 1.42], k the integer in s = k + 1.5 * 2**23 (|k| <= 127): k added to
    the exponent bits of p (the shifter's bits, shifted left by 23, are k's); 0 where not keep
    (a bit mask: a branch here trips numba's SSA check inside parallel loops)."""
    bits = np.int64(_float_bits(p)) + (np.int64(_float_bits(s)) << 23)
    return _bits_float(np.int32(bits & -np.int64(keep)))


@numba.njit(cache=True, fastmath=FASTMATH, inline="always")
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


@numba.njit(cache=True, fastmath=FASTMATH, inline="always")
def lane_sum(v):
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


# Reassociation ("reassoc") lets LLVM vectorise a sum over an array (several vector partial sums
# added at the end). It is allowed only in this helper, which holds nothing but the sum of
# products (in the kernels it would also reorder the exp's argument reduction): it changes the
# order of one dot product's additions, an error within d * eps * sum |a b| like the sequential
# sum's. Not inlined at numba's level, so its flags stay its own (LLVM inlines it, flags kept).
FASTMATH_SUM = {"contract", "reassoc"}


@numba.njit(cache=True, fastmath=FASTMATH_SUM)
def dot(a, b):
    """sum(a * b) of two 1-D arrays of the same length (vectorised, see FASTMATH_SUM)."""
    s = a.dtype.type(0)
    for i in range(a.shape[0]):
        s += a[i] * b[i]
    return s


# hot path: no kernel here; each helper is on the paths of the kernels that call it
HOT_PATH: tuple[str, ...] = ()

__all__ = [
    "FASTMATH",
    "FASTMATH_SUM",
    "HOT_PATH",
    "dot",
    "exp_scale",
    "fexp",
    "fexp2",
    "fsoftplus",
    "lane_sum",
    "prefetch_row",
]
