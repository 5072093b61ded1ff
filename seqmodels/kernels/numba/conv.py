"""Depthwise causal conv + SiLU: over a sequence (forward and backward, the training path of
Mamba and Mamba2) and one step at a time (rollouts).

=====================  ===========================================  ===========================
kernel                 op (:mod:`seqmodels.kernels.numba_ops`)      call path
=====================  ===========================================  ===========================
``conv_silu_fwd``      ``conv_silu_numba``, ``mamba_block_numba``   training forward (hot)
``conv_silu_bwd``      ``conv_silu_numba``, ``mamba_block_numba``   training backward (hot)
``conv_step_silu``     ``conv_step_silu_numba``                     ``Mamba2.step``'s general
                                                                    path only (see
                                                                    the package docstring)
=====================  ===========================================  ===========================

:func:`conv_silu_step_row` (one row of a step) is shared with the whole-block step kernels of
:mod:`seqmodels.kernels.numba.block_step`, which are the rollout path; :func:`_conv_taps` (the
tap sum of one time step) is shared by the forward and the backward.

Sequences, ``[B, L, C]`` layout: input channel c of row (b, t) is ``src[b, t, off + c]``: src is
the whole in_proj output, read in place (no copy of the conv's channel slice). Tap j of the W
taps reads the input W-1-j steps back; a tap that reaches before the latest episode start at or
before t reads zero (inputs before t = 0 come from the history: the W-1 previous inputs, valid
until the first reset).
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

from seqmodels.kernels.numba.numerics import FASTMATH, fexp

# hot path: training forward and backward (conv_step_silu is a fallback of Mamba2.step)
HOT_PATH = ("conv_silu_fwd", "conv_silu_bwd")


@numba.njit(cache=True, fastmath=FASTMATH, inline="always")
def _conv_taps(acc, src, b, t, off, w, bias, hist, first):
    """acc [C] = bias + the taps ``first`` .. W-1 of step t of row b, oldest first (src
    [B, L, S], w [W, C], bias [C], hist [B, W-1, C] as :func:`conv_silu_fwd`; taps before
    ``first`` reach before the latest episode start and read zero)."""
    width, channels = w.shape
    for c in range(channels):
        acc[c] = bias[c]
    for j in range(first, width):
        s = t - (width - 1) + j
        row = src[b, s, off : off + channels] if s >= 0 else hist[b, s + width - 1]
        wj = w[j]
        for c in range(channels):
            acc[c] += wj[c] * row[c]


@numba.njit(parallel=True, cache=True, fastmath=FASTMATH)
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
            _conv_taps(acc, src, b, t, off, w, bias, hist, max(0, start - t + width - 1))
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


@numba.njit(parallel=True, cache=True, fastmath=FASTMATH)
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
            _conv_taps(acc, src, b, t, off, w, bias, hist, first)
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


@numba.njit(cache=True, fastmath=FASTMATH, inline="always")
def conv_silu_step_row(old, src, off, w, bias, new, out, one):
    """One row of a causal-conv step then SiLU, for the step kernels: old, new [C, W] (the
    row's conv state before / after: the oldest input dropped, src[off + c] appended), w [C, W]
    (tap W-1 reads the current input), bias [C]; out [C] = silu(conv output); one: 1 in the
    arrays' dtype. The taps are summed oldest first after the bias, as conv_silu_fwd sums them.
    The default width (4) is unrolled (measured faster than the loop over taps)."""
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


@numba.njit(parallel=True, cache=True, fastmath=FASTMATH)
def conv_step_silu(conv_state, x, w, bias):
    """One step of the depthwise causal conv followed by SiLU (no autograd).

    conv_state [B, C, W] (last column the most recent input); x [B, C]; w [C, W]; bias [C].
    Returns the new conv state [B, C, W] and silu(conv output) [B, C].
    """
    batch, channels, width = conv_state.shape
    new_state = np.empty_like(conv_state)
    out = np.empty((batch, channels), dtype=x.dtype)
    one = x.dtype.type(1)  # (a literal 1 would make the float32 SiLU a float64 one)
    for b in prange(batch):
        conv_silu_step_row(conv_state[b], x[b], 0, w, bias, new_state[b], out[b], one)
    return new_state, out


__all__ = ["HOT_PATH", "conv_silu_bwd", "conv_silu_fwd", "conv_silu_step_row", "conv_step_silu"]
