"""numba CPU loops for the passes of grouped whitening (:mod:`marl.core.whitening`).

The torch functions in :mod:`marl.core.whitening` (``_count_and_sum``, ``_centred_sums``,
``_apply``) are the specification; each function here computes the same thing in one fused
loop over ``x`` and the group ids: no float64 copy of ``x``, no gathered ``[N]``
intermediates, no ``[N, num_groups]`` table. Accumulation is float64. Compiled on first use
and cached on disk (``__pycache__`` beside this file).

Inputs are flat contiguous CPU tensors: ``x`` ``[N]`` float32/float64, ``ids`` ``[N]`` int64
(or None: one group), ``mask`` ``[N]`` bool (or None: all valid). Ids are read only where
``mask`` is True and must lie in ``[0, num_groups)`` there (the caller checks).

``AVAILABLE`` is False when numba cannot be imported; the caller then uses torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

try:
    import numba
except ImportError:  # pragma: no cover - numba is a core dependency
    numba = None

__all__ = ["AVAILABLE", "apply", "centred_sums", "count_and_sum", "id_range"]

AVAILABLE = numba is not None

#: Up to this many groups the scatter loops spread consecutive entries over four
#: accumulator tables (see ``_count_and_sum_loop``).
UNROLL_MAX_GROUPS = 1 << 16


def _jit(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``numba.njit`` with an on-disk cache (no cache when no writable location exists)."""
    if numba is None:  # pragma: no cover
        return fn
    try:
        return numba.njit(cache=True, nogil=True)(fn)
    except RuntimeError:  # pragma: no cover - no writable cache location
        return numba.njit(nogil=True)(fn)


@_jit
def _id_range_loop(ids, mask, has_mask):  # pragma: no cover - compiled by numba
    lo = np.iinfo(np.int64).max
    hi = np.iinfo(np.int64).min
    n = 0
    for i in range(ids.shape[0]):
        if has_mask and not mask[i]:
            continue
        v = ids[i]
        lo = min(lo, v)
        hi = max(hi, v)
        n += 1
    return lo, hi, n


@_jit
def _count_and_sum_loop(x, ids, mask, has_ids, has_mask, num_groups):  # pragma: no cover
    count = np.zeros(num_groups, np.float64)
    total = np.zeros(num_groups, np.float64)
    n = x.shape[0]
    if not has_ids:  # one group: register accumulators
        c = 0.0
        t = 0.0
        for i in range(n):
            if has_mask and not mask[i]:
                continue
            c += 1.0
            t += x[i]
        count[0] = c
        total[0] = t
        return count, total
    if num_groups > UNROLL_MAX_GROUPS:
        for i in range(n):
            if has_mask and not mask[i]:
                continue
            k = ids[i]
            count[k] += 1.0
            total[k] += x[i]
        return count, total
    # Entry i updates table i % 4: runs of one group then update four memory slots, so the
    # add -> store -> load chains of consecutive entries do not wait on each other.
    count4 = np.zeros((4, num_groups), np.float64)
    total4 = np.zeros((4, num_groups), np.float64)
    for i in range(n):
        if has_mask and not mask[i]:
            continue
        k = ids[i]
        u = i & 3
        count4[u, k] += 1.0
        total4[u, k] += x[i]
    for u in range(4):
        count += count4[u]
        total += total4[u]
    return count, total


@_jit
def _centred_sums_loop(x, ids, mask, has_ids, has_mask, mean):  # pragma: no cover
    num_groups = mean.shape[0]
    sum_d = np.zeros(num_groups, np.float64)
    sum_d2 = np.zeros(num_groups, np.float64)
    n = x.shape[0]
    if not has_ids:
        m = mean[0]
        s1 = 0.0
        s2 = 0.0
        for i in range(n):
            if has_mask and not mask[i]:
                continue
            d = x[i] - m
            s1 += d
            s2 += d * d
        sum_d[0] = s1
        sum_d2[0] = s2
        return sum_d, sum_d2
    if num_groups > UNROLL_MAX_GROUPS:
        for i in range(n):
            if has_mask and not mask[i]:
                continue
            k = ids[i]
            d = x[i] - mean[k]
            sum_d[k] += d
            sum_d2[k] += d * d
        return sum_d, sum_d2
    sum_d4 = np.zeros((4, num_groups), np.float64)
    sum_d24 = np.zeros((4, num_groups), np.float64)
    for i in range(n):
        if has_mask and not mask[i]:
            continue
        k = ids[i]
        u = i & 3
        d = x[i] - mean[k]
        sum_d4[u, k] += d
        sum_d24[u, k] += d * d
    for u in range(4):
        sum_d += sum_d4[u]
        sum_d2 += sum_d24[u]
    return sum_d, sum_d2


@_jit
def _apply_loop(x, ids, mask, has_ids, has_mask, shift, scale, out):  # pragma: no cover
    for i in range(x.shape[0]):
        if has_mask and not mask[i]:
            out[i] = 0.0
            continue
        k = ids[i] if has_ids else 0
        out[i] = (x[i] - shift[k]) * scale[k]


_NO_IDS = np.zeros(1, np.int64)
_NO_MASK = np.ones(1, np.bool_)


def _arrays(ids: Tensor | None, mask: Tensor | None) -> tuple[np.ndarray, np.ndarray, bool, bool]:
    """numpy views (placeholders for None) and the (has_ids, has_mask) flags."""
    return (
        _NO_IDS if ids is None else ids.numpy(),
        _NO_MASK if mask is None else mask.numpy(),
        ids is not None,
        mask is not None,
    )


def id_range(ids: Tensor, mask: Tensor | None) -> tuple[int, int, int]:
    """(smallest id, largest id, number of valid entries) over the valid entries."""
    mask_np = _NO_MASK if mask is None else mask.numpy()
    lo, hi, n = _id_range_loop(ids.numpy(), mask_np, mask is not None)
    return int(lo), int(hi), int(n)


def count_and_sum(
    x: Tensor, ids: Tensor | None, mask: Tensor | None, num_groups: int
) -> tuple[Tensor, Tensor]:
    """Per-group count and sum of the valid entries, float64 ``[num_groups]`` each."""
    count, total = _count_and_sum_loop(x.numpy(), *_arrays(ids, mask), num_groups)
    return torch.from_numpy(count), torch.from_numpy(total)


def centred_sums(
    x: Tensor, ids: Tensor | None, mask: Tensor | None, mean: Tensor
) -> tuple[Tensor, Tensor]:
    """Per-group sums of ``d`` and ``d**2``, ``d = x - mean[group]``, float64 ``[G]``."""
    sum_d, sum_d2 = _centred_sums_loop(x.numpy(), *_arrays(ids, mask), mean.numpy())
    return torch.from_numpy(sum_d), torch.from_numpy(sum_d2)


def apply(
    x: Tensor, ids: Tensor | None, mask: Tensor | None, shift: Tensor, scale: Tensor
) -> Tensor:
    """``(x - shift[group]) * scale[group]`` at valid entries, 0 elsewhere; ``[N]``, x's
    dtype (arithmetic in float64)."""
    out = torch.empty_like(x)
    arrays = _arrays(ids, mask)
    _apply_loop(x.numpy(), *arrays, shift.numpy(), scale.numpy(), out.numpy())
    return out
