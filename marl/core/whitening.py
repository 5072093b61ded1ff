"""Grouped advantage whitening: one exact, scatter-based kernel for every scheme.

Every whitening scheme in this suite is *grouped whitening with a group key*: statistics
(count, mean, population variance) are computed over the valid entries (``mask``) of each
group and applied to that group. Per batch, per agent type, per position in a sequence
window, per chunk of positions, per sequence, and combinations (type x position) differ
only in the integer group key passed as ``group``.

Core contract (see ``shared/DESIGN.md``)::

    whiten(x, *, mask=None, group=None, eps=1e-8, center=True, scale=True,
           distributed=False) -> Tensor
    RunningMoments(num_groups=1, momentum=None)   # .update / .whiten / state_dict
    mix_team_individual(team, individual, alpha, **whiten_kw)

Numerics
--------
* Statistics are accumulated in float64 with a two-pass centred variance: pass 1 gives
  per-group counts and sums (so the mean), pass 2 the sums of ``d = x - mean_g`` and of
  ``d**2``; the shifted-sums correction ``var = E[d^2] - E[d]^2`` (with ``mean += E[d]``)
  makes a constant group exactly zero-variance, so it whitens to exactly 0 (the
  ``E[x^2] - E[x]^2`` float32 formula leaves a residual std there and explodes the output).
* NaN/inf among valid entries are detected from the per-group float64 sums (a non-finite
  value makes its group's sum non-finite), not by a separate ``isfinite`` pass, and raise
  ``ValueError``. Values at masked-out entries are never read into the statistics, so
  padding may hold NaN.
* A group with a single valid entry or zero variance whitens to 0, never inf/NaN.

Speed
-----
On CPU the passes (min/max of the ids, sums, centred sums, apply) run as fused numba
loops over ``x`` and the group ids (compiled on first use and cached on disk): no Python
loop over groups, no ``[N, num_groups]`` intermediate, and the time hardly depends on the
number of groups (up to 65536 groups the scatter loops keep four accumulator tables so
that runs of one group do not serialise on one memory slot). On other devices (or with numba
missing, or ``MARL_WHITEN_BACKEND=torch``) the same passes run as torch scatter ops
(``index_add_`` on float64 accumulators). Both backends are tested against a numpy float64
reference and against each other.

Masks and group ids
-------------------
Masks: bool (or 0/1 numeric) tensors broadcastable to ``x``. Group ids: integer tensors
broadcastable to ``x``, non-negative at valid entries (ids at masked-out
entries are ignored, so ``-1`` padding is fine). Ids index the accumulators directly, so
their range, not their number, sets the accumulator size; when the largest id exceeds
``max(2**20, numel // 4)`` the ids are first compacted with ``torch.unique`` (a sort:
correct but slower; pass dense ids for speed). With ``distributed=True`` ids must be
consistent across ranks and below ``2**22`` (compaction is rank-local, so it is refused).

Double-whitening guard
----------------------
Every whitened output (``whiten``, ``mix_team_individual``, ``RunningMoments.whiten``,
``AdvantageWhitener`` except scheme ``none``) carries the attribute ``_marl_whitened``;
``whiten`` (and everything built on it) refuses such a tensor with a ``ValueError``. The
tag lives on the tensor object: arithmetic, views and clones give untagged tensors, so the
guard catches passing the *same* whitened advantages back in (the seed's troubleshooting
item), not every re-normalisation. Escape hatch: pass
``allow_rewhiten=True``, or whiten ``x.clone()`` (new tensors never carry the tag).

Gradients: whitening treats advantages as constants; the output is detached.
"""

from __future__ import annotations

import functools
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "SCHEMES",
    "AdvantageWhitener",
    "GroupKeys",
    "GroupMoments",
    "RunningMoments",
    "advantage_stats",
    "chunk_key",
    "combine_keys",
    "group_moments",
    "is_whitened",
    "mix_team_individual",
    "parse_scheme",
    "position_key",
    "sequence_key",
    "symmetric_clip",
    "type_key",
    "whiten",
]

#: Attribute set on every whitened output (the double-whitening guard reads it).
WHITENED_ATTR = "_marl_whitened"

#: Above this many groups (and above numel // 4) ids are compacted with torch.unique.
_DENSE_GROUP_LIMIT = 1 << 20
#: Largest number of groups accepted with distributed=True.
_DIST_GROUP_LIMIT = 1 << 22

SCHEMES: tuple[str, ...] = (
    "none",
    "batch",
    "type",
    "position",
    "chunk",
    "sequence",
    "type_position",
    "running",
    "running_ema",
    "team_individual",
    "center",
)

#: Accepted spellings of scheme names (case and ``-``/``_`` are normalised first).
_SCHEME_ALIASES: dict[str, str] = {
    "agent_type": "type",
    "action_space": "type",
    "per_type": "type",
    "per_position": "position",
    "chunked": "chunk",
    "per_sequence": "sequence",
    "layernorm": "sequence",
    "ema": "running_ema",
    "running_exact": "running",
    "centre": "center",
    "center_only": "center",
    "dr_grpo": "center",
    "off": "none",
    "identity": "none",
    "global": "batch",
}

#: Schemes usable as the ``inner`` grouping of team_individual / running.
GROUPING_SCHEMES: tuple[str, ...] = (
    "batch",
    "type",
    "position",
    "chunk",
    "sequence",
    "type_position",
)
_GROUPING_SCHEMES = GROUPING_SCHEMES


# ----------------------------------------------------------------------------- validation


def _check_float_tensor(x: Any, name: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    return x


def _check_eps(eps: float) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"eps must be a positive float, got {type(eps).__name__}")
    eps = float(eps)
    if not (eps > 0.0 and math.isfinite(eps)):
        raise ValueError(f"eps must be a finite float > 0, got {eps}")
    return eps


def _broadcast_to(t: Tensor, shape: torch.Size, name: str, x_name: str = "x") -> Tensor:
    """Expand ``t`` to ``shape`` (broadcasting rules) or raise a ValueError naming both."""
    if t.shape == shape:
        return t
    try:
        return t.expand(shape)
    except RuntimeError:
        raise ValueError(
            f"{name} has shape {tuple(t.shape)}, which does not broadcast to {x_name}'s "
            f"shape {tuple(shape)}"
        ) from None


def _prepare_mask(mask: Tensor | None, x: Tensor) -> Tensor | None:
    """Flat contiguous bool mask [N] (or None)."""
    if mask is None:
        return None
    if not isinstance(mask, Tensor):
        raise TypeError(f"mask must be a bool torch.Tensor or None, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        if mask.is_complex():
            raise TypeError(f"mask must be a bool (or 0/1 numeric) tensor, got dtype {mask.dtype}")
        if mask.numel() and bool(((mask != 0) & (mask != 1)).any()):
            raise ValueError(
                f"a non-bool mask must hold only 0 and 1 (got dtype {mask.dtype} with other "
                "values); pass a bool tensor"
            )
        mask = mask != 0
    if mask.device != x.device:
        raise ValueError(f"mask is on {mask.device} but x is on {x.device}")
    return _broadcast_to(mask, x.shape, "mask").reshape(-1).contiguous()


def _prepare_group(group: Tensor | None, x: Tensor) -> Tensor | None:
    """Flat contiguous int64 ids [N] (or None). Sign/range checks happen later."""
    if group is None:
        return None
    if not isinstance(group, Tensor):
        raise TypeError(
            f"group must be an integer torch.Tensor or None, got {type(group).__name__}"
        )
    if group.dtype == torch.bool or group.is_floating_point() or group.is_complex():
        raise TypeError(f"group ids must be an integer tensor, got dtype {group.dtype}")
    if group.device != x.device:
        raise ValueError(f"group is on {group.device} but x is on {x.device}")
    group = _broadcast_to(group, x.shape, "group")
    return group.reshape(-1).to(torch.int64).contiguous()


def is_whitened(x: Tensor) -> bool:
    """True when ``x`` is (in place of) the output of a whitening call."""
    return bool(getattr(x, WHITENED_ATTR, False))


def _tag(out: Tensor) -> Tensor:
    setattr(out, WHITENED_ATTR, True)
    return out


def _guard(x: Tensor, name: str, allow_rewhiten: bool) -> None:
    if not allow_rewhiten and is_whitened(x):
        raise ValueError(
            f"{name} is already the output of whitening; whitening it again is almost "
            "always a bug (statistics of whitened data are ~0/1 and hide the raw "
            "distribution). Pass allow_rewhiten=True, or whiten x.clone(), if you mean it."
        )


# ------------------------------------------------------------------------ numba backend


#: Up to this many groups the scatter loops keep four accumulator tables (see _nb_sums).
_NB_UNROLL_MAX_GROUPS = 1 << 16


def _nb_minmax(g, mask, has_mask):  # pragma: no cover - compiled by numba
    lo = np.int64(np.iinfo(np.int64).max)
    hi = np.int64(np.iinfo(np.int64).min)
    n = np.int64(0)
    if has_mask:
        for i in range(g.shape[0]):
            if mask[i]:
                v = g[i]
                lo = min(lo, v)
                hi = max(hi, v)
                n += 1
    else:
        for i in range(g.shape[0]):
            v = g[i]
            lo = min(lo, v)
            hi = max(hi, v)
        n = g.shape[0]
    return lo, hi, n


def _nb_sums(x, g, mask, has_group, has_mask, num_groups):  # pragma: no cover
    cnt = np.zeros(num_groups, np.float64)
    s1 = np.zeros(num_groups, np.float64)
    if not has_group:  # one group: register accumulators (no store-to-load chain)
        c = 0.0
        t = 0.0
        for i in range(x.shape[0]):
            if has_mask and not mask[i]:
                continue
            c += 1.0
            t += x[i]
        cnt[0] = c
        s1[0] = t
        return cnt, s1
    if num_groups > _NB_UNROLL_MAX_GROUPS:
        for i in range(x.shape[0]):
            if has_mask and not mask[i]:
                continue
            k = g[i]
            cnt[k] += 1.0
            s1[k] += x[i]
        return cnt, s1
    # Four accumulator tables, unrolled: consecutive entries of one group update different
    # memory, so the add -> store -> load chains run in parallel (few-group speed).
    c4 = np.zeros((4, num_groups), np.float64)
    t4 = np.zeros((4, num_groups), np.float64)
    n = x.shape[0]
    for j in range(n // 4):
        i = 4 * j
        if not (has_mask and not mask[i]):
            k = g[i]
            c4[0, k] += 1.0
            t4[0, k] += x[i]
        if not (has_mask and not mask[i + 1]):
            k = g[i + 1]
            c4[1, k] += 1.0
            t4[1, k] += x[i + 1]
        if not (has_mask and not mask[i + 2]):
            k = g[i + 2]
            c4[2, k] += 1.0
            t4[2, k] += x[i + 2]
        if not (has_mask and not mask[i + 3]):
            k = g[i + 3]
            c4[3, k] += 1.0
            t4[3, k] += x[i + 3]
    for i in range(4 * (n // 4), n):
        if not (has_mask and not mask[i]):
            k = g[i]
            c4[0, k] += 1.0
            t4[0, k] += x[i]
    for u in range(4):
        cnt += c4[u]
        s1 += t4[u]
    return cnt, s1


def _nb_centered(x, g, mask, has_group, has_mask, mean):  # pragma: no cover
    num_groups = mean.shape[0]
    sd = np.zeros(num_groups, np.float64)
    s2 = np.zeros(num_groups, np.float64)
    if not has_group:
        m = mean[0]
        t1 = 0.0
        t2 = 0.0
        for i in range(x.shape[0]):
            if has_mask and not mask[i]:
                continue
            d = x[i] - m
            t1 += d
            t2 += d * d
        sd[0] = t1
        s2[0] = t2
        return sd, s2
    if num_groups > _NB_UNROLL_MAX_GROUPS:
        for i in range(x.shape[0]):
            if has_mask and not mask[i]:
                continue
            k = g[i]
            d = x[i] - mean[k]
            sd[k] += d
            s2[k] += d * d
        return sd, s2
    a4 = np.zeros((4, num_groups), np.float64)
    b4 = np.zeros((4, num_groups), np.float64)
    n = x.shape[0]
    for j in range(n // 4):
        i = 4 * j
        if not (has_mask and not mask[i]):
            k = g[i]
            d = x[i] - mean[k]
            a4[0, k] += d
            b4[0, k] += d * d
        if not (has_mask and not mask[i + 1]):
            k = g[i + 1]
            d = x[i + 1] - mean[k]
            a4[1, k] += d
            b4[1, k] += d * d
        if not (has_mask and not mask[i + 2]):
            k = g[i + 2]
            d = x[i + 2] - mean[k]
            a4[2, k] += d
            b4[2, k] += d * d
        if not (has_mask and not mask[i + 3]):
            k = g[i + 3]
            d = x[i + 3] - mean[k]
            a4[3, k] += d
            b4[3, k] += d * d
    for i in range(4 * (n // 4), n):
        if not (has_mask and not mask[i]):
            k = g[i]
            d = x[i] - mean[k]
            a4[0, k] += d
            b4[0, k] += d * d
    for u in range(4):
        sd += a4[u]
        s2 += b4[u]
    return sd, s2


def _nb_apply(x, g, mask, has_group, has_mask, shift, inv, out):  # pragma: no cover
    if not has_group:
        m = shift[0]
        r = inv[0]
        for i in range(x.shape[0]):
            if has_mask and not mask[i]:
                out[i] = 0.0
            else:
                out[i] = (x[i] - m) * r
        return
    for i in range(x.shape[0]):
        if has_mask and not mask[i]:
            out[i] = 0.0
            continue
        k = g[i]
        out[i] = (x[i] - shift[k]) * inv[k]


@functools.lru_cache(maxsize=1)
def _numba_kernels() -> dict[str, Callable[..., Any]] | None:
    """Compile (lazily, cached on disk) the fused CPU loops; None when numba is missing."""
    if os.environ.get("MARL_WHITEN_BACKEND", "auto").lower() == "torch":
        return None
    try:
        import numba
    except ImportError:  # pragma: no cover - numba is a core dependency
        return None
    funcs = {
        "minmax": _nb_minmax,
        "sums": _nb_sums,
        "centered": _nb_centered,
        "apply": _nb_apply,
    }
    try:  # cache the machine code next to this file (or numba's fallback cache dir)
        return {name: numba.njit(cache=True, nogil=True)(f) for name, f in funcs.items()}
    except RuntimeError:  # pragma: no cover - no writable cache location: compile per process
        return {name: numba.njit(nogil=True)(f) for name, f in funcs.items()}


_DUMMY_IDS = np.zeros(1, np.int64)
_DUMMY_MASK = np.ones(1, np.bool_)


def _use_numba(x: Tensor, backend: str) -> bool:
    if backend not in ("auto", "numba", "torch"):
        raise ValueError(f"backend must be 'auto', 'numba' or 'torch', got {backend!r}")
    if backend == "torch":
        return False
    ok = x.device.type == "cpu" and _numba_kernels() is not None
    if backend == "numba" and not ok:
        raise ValueError("backend='numba' needs a CPU tensor and an importable numba")
    return ok


def _np(t: Tensor | None, dummy: np.ndarray) -> np.ndarray:
    return dummy if t is None else t.numpy()


# ------------------------------------------------------------------------- the kernel


class GroupMoments(NamedTuple):
    """Per-group statistics, all float64 ``[num_groups]`` (population variance)."""

    count: Tensor
    mean: Tensor
    var: Tensor


class _Prepared(NamedTuple):
    x: Tensor  # [N] float32/float64, contiguous, detached
    ids: Tensor | None  # [N] int64 in [0, num_groups) at valid entries, or None
    mask: Tensor | None  # [N] bool or None
    num_groups: int
    use_numba: bool
    cache: dict[str, Any]  # torch backend: float64 valid entries and their ids, reused


def _id_range(ids: Tensor, mask: Tensor | None, use_numba: bool) -> tuple[int, int, int]:
    """(min, max, number of valid entries) of the ids at valid entries."""
    if use_numba:
        lo, hi, n = _numba_kernels()["minmax"](  # type: ignore[index]
            ids.numpy(), _np(mask, _DUMMY_MASK), mask is not None
        )
        return int(lo), int(hi), int(n)
    valid = ids if mask is None else ids[mask]
    if valid.numel() == 0:
        return 0, -1, 0
    lo, hi = torch.aminmax(valid)
    return int(lo), int(hi), valid.numel()


def _prepare(
    x: Tensor,
    mask: Tensor | None,
    group: Tensor | None,
    *,
    num_groups: int | None,
    distributed: bool,
    backend: str,
    eps: float | None = None,
) -> _Prepared:
    """Validate and flatten inputs; fix the number of groups (agreed across ranks).

    With ``distributed=True`` a local input error is shared with the other ranks (one MAX
    all_reduce of ``[num_groups, failed]``), so every rank raises instead of the healthy
    ones waiting forever in the next collective.
    """
    if distributed:
        _dist_ready()
    try:
        if eps is not None:
            _check_eps(eps)
        p = _prepare_local(
            x, mask, group, num_groups=num_groups, distributed=distributed, backend=backend
        )
    except (ValueError, TypeError):
        if distributed:
            device = x.device if isinstance(x, Tensor) else torch.device("cpu")
            _all_reduce_max_ints([0, 1], device)
        raise
    if not distributed:
        return p
    n_groups, failed = _all_reduce_max_ints([p.num_groups, 0], p.x.device)
    if failed:
        raise ValueError("whitening input was invalid on another rank (see that rank's error)")
    if n_groups > _DIST_GROUP_LIMIT:
        raise ValueError(
            f"distributed whitening needs group ids < {_DIST_GROUP_LIMIT}, got "
            f"{n_groups} groups; compact the ids consistently on every rank"
        )
    return p._replace(num_groups=n_groups)


def _prepare_local(
    x: Tensor,
    mask: Tensor | None,
    group: Tensor | None,
    *,
    num_groups: int | None,
    distributed: bool,
    backend: str,
) -> _Prepared:
    _check_float_tensor(x, "x")
    flat_mask = _prepare_mask(mask, x)
    ids = _prepare_group(group, x)
    xf = x.detach().reshape(-1)
    if xf.dtype not in (torch.float32, torch.float64):
        xf = xf.to(torch.float32)
    xf = xf.contiguous()
    use_numba = _use_numba(xf, backend)

    if ids is None:
        n_groups = 1
    else:
        lo, hi, n_valid = _id_range(ids, flat_mask, use_numba)
        if n_valid and lo < 0:
            raise ValueError(
                f"group ids must be non-negative at valid entries, got minimum {lo} "
                "(negative ids are allowed only where mask is False)"
            )
        n_groups = hi + 1 if n_valid else 1
        if num_groups is not None:
            if n_groups > num_groups:
                raise ValueError(
                    f"group ids must be < num_groups={num_groups}, got maximum id {hi}"
                )
            n_groups = num_groups
        elif not distributed and n_groups > max(_DENSE_GROUP_LIMIT, xf.numel() // 4):
            # Sparse large ids: compact them (a sort; documented as the slow path).
            src = ids if flat_mask is None else torch.where(flat_mask, ids, lo)
            uniq, inverse = torch.unique(src, return_inverse=True)
            ids, n_groups = inverse.contiguous(), uniq.numel()
    return _Prepared(xf, ids, flat_mask, n_groups, use_numba, {})


def _dist_ready() -> None:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(
            "distributed=True needs an initialised default torch.distributed process group "
            "(torch.distributed.init_process_group)"
        )


def _all_reduce_max_ints(values: list[int], device: torch.device) -> list[int]:
    import torch.distributed as dist

    _dist_ready()
    t = torch.tensor(values, dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [int(v) for v in t.tolist()]


def _all_reduce_max_int(value: int, device: torch.device) -> int:
    return _all_reduce_max_ints([value], device)[0]


def _all_reduce_sum_(t: Tensor) -> Tensor:
    import torch.distributed as dist

    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def _local_sums(p: _Prepared) -> tuple[Tensor, Tensor]:
    """Pass 1: per-group valid count and sum, float64 [G] each."""
    if p.use_numba:
        cnt, s1 = _numba_kernels()["sums"](  # type: ignore[index]
            p.x.numpy(),
            _np(p.ids, _DUMMY_IDS),
            _np(p.mask, _DUMMY_MASK),
            p.ids is not None,
            p.mask is not None,
            p.num_groups,
        )
        return torch.from_numpy(cnt), torch.from_numpy(s1)
    ids, xs = _torch_valid(p)
    dev = p.x.device
    cnt = torch.zeros(p.num_groups, dtype=torch.float64, device=dev)
    s1 = torch.zeros(p.num_groups, dtype=torch.float64, device=dev)
    if ids is None:
        cnt[0] = xs.numel()
        s1[0] = xs.sum()
    else:
        cnt = torch.bincount(ids, minlength=p.num_groups).to(torch.float64)
        s1.index_add_(0, ids, xs)
    return cnt, s1


def _torch_valid(p: _Prepared) -> tuple[Tensor | None, Tensor]:
    """Valid entries as float64 (and their ids) for the torch backend, computed once."""
    if "valid" not in p.cache:
        if p.mask is None:
            ids, xs = p.ids, p.x
        else:
            ids = None if p.ids is None else p.ids[p.mask]
            xs = p.x[p.mask]
        p.cache["valid"] = (ids, xs.to(torch.float64))
    return p.cache["valid"]


def _local_centered(p: _Prepared, mean: Tensor) -> tuple[Tensor, Tensor]:
    """Pass 2: per-group sums of d and d^2 with d = x - mean_g, float64 [G] each."""
    if p.use_numba:
        sd, s2 = _numba_kernels()["centered"](  # type: ignore[index]
            p.x.numpy(),
            _np(p.ids, _DUMMY_IDS),
            _np(p.mask, _DUMMY_MASK),
            p.ids is not None,
            p.mask is not None,
            mean.numpy(),
        )
        return torch.from_numpy(sd), torch.from_numpy(s2)
    ids, xs = _torch_valid(p)
    mean = mean.to(p.x.device)
    sd = torch.zeros(p.num_groups, dtype=torch.float64, device=p.x.device)
    s2 = torch.zeros_like(sd)
    if ids is None:
        d = xs - mean[0]
        sd[0] = d.sum()
        s2[0] = d.square().sum()
    else:
        d = xs - mean.index_select(0, ids)
        sd.index_add_(0, ids, d)
        s2.index_add_(0, ids, d.square_())
    return sd, s2


def _raise_non_finite(bad: np.ndarray, grouped: bool) -> None:
    groups = np.flatnonzero(bad)[:5].tolist()
    where = f" (groups {groups})" if grouped else ""
    raise ValueError(
        "x holds NaN or inf among the valid (masked-in) entries" + where + "; fix the "
        "advantages or mask those entries out"
    )


def _to_np(t: Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def _moments(p: _Prepared, distributed: bool) -> GroupMoments:
    """Two-pass float64 per-group moments of the prepared input (reduced across ranks).

    The per-group arithmetic on the small ``[G]`` tables runs in numpy float64 (cheap for
    small calls); the passes over the data run on the backend.
    """
    cnt, s1 = _local_sums(p)
    if distributed:
        both = _all_reduce_sum_(torch.stack([cnt, s1]).to(p.x.device))
        cnt, s1 = both[0], both[1]
    cnt_np, s1_np = _to_np(cnt), _to_np(s1)
    bad = ~np.isfinite(s1_np)
    if bad.any():
        _raise_non_finite(bad, p.ids is not None)
    present = cnt_np > 0
    n = np.maximum(cnt_np, 1.0)
    mean0 = np.where(present, s1_np / n, 0.0)
    sd, s2 = _local_centered(p, torch.from_numpy(mean0))
    if distributed:
        both = _all_reduce_sum_(torch.stack([sd, s2]).to(p.x.device))
        sd, s2 = both[0], both[1]
    sd_np, s2_np = _to_np(sd), _to_np(s2)
    bad = ~np.isfinite(s2_np)
    if bad.any():
        _raise_non_finite(bad, p.ids is not None)
    corr = sd_np / n
    mean = np.where(present, mean0 + corr, mean0)
    var = np.where(present, np.maximum(s2_np / n - corr * corr, 0.0), 0.0)
    return GroupMoments(
        torch.from_numpy(np.ascontiguousarray(cnt_np, dtype=np.float64)),
        torch.from_numpy(mean),
        torch.from_numpy(var),
    )


def _apply(p: _Prepared, shift: Tensor, inv: Tensor, out_dtype: torch.dtype) -> Tensor:
    """Pass 3: out = (x - shift_g) * inv_g at valid entries, 0 elsewhere; flat [N]."""
    if p.use_numba:
        out = torch.empty(p.x.shape, dtype=p.x.dtype)
        _numba_kernels()["apply"](  # type: ignore[index]
            p.x.numpy(),
            _np(p.ids, _DUMMY_IDS),
            _np(p.mask, _DUMMY_MASK),
            p.ids is not None,
            p.mask is not None,
            shift.numpy(),
            inv.numpy(),
            out.numpy(),
        )
        return out.to(out_dtype)
    shift, inv = shift.to(p.x.device), inv.to(p.x.device)
    x64 = p.cache["valid"][1] if p.mask is None and "valid" in p.cache else p.x.double()
    if p.ids is None:
        out = (x64 - shift[0]) * inv[0]
    else:
        safe = p.ids if p.mask is None else torch.where(p.mask, p.ids, 0)
        out = (x64 - shift.index_select(0, safe)) * inv.index_select(0, safe)
    if p.mask is not None:
        out = torch.where(p.mask, out, torch.zeros((), dtype=out.dtype, device=out.device))
    return out.to(out_dtype)


def _scale_table(moments: GroupMoments, eps: float, scale: bool) -> Tensor:
    """1/(std+eps) (or 1 when scale=False), and 0 for single-entry/zero-variance groups."""
    count, var = _to_np(moments.count), _to_np(moments.var)
    degenerate = (count <= 1) | (var <= 0)
    inv = 1.0 / (np.sqrt(var) + eps) if scale else np.ones_like(var)
    return torch.from_numpy(np.where(degenerate, 0.0, inv))


def group_moments(
    x: Tensor,
    *,
    mask: Tensor | None = None,
    group: Tensor | None = None,
    num_groups: int | None = None,
    distributed: bool = False,
) -> GroupMoments:
    """Per-group count, mean and population variance of the valid entries of ``x``.

    Args:
        x: float tensor, any shape ``[*S]``.
        mask: bool ``[*S]`` (broadcastable), True = valid; None = all valid.
        group: integer ids ``[*S]`` (broadcastable); None = one group.
        num_groups: fix the number of groups (ids must be below it); default max id + 1.
        distributed: reduce over the default process group (exact concatenation).

    Returns:
        GroupMoments with float64 CPU tensors ``[num_groups]``; absent groups have count 0,
        mean 0 and var 0. (Sparse large ids are compacted when ``num_groups`` is None; the
        result is then indexed by the rank of the id among the distinct ids.)

    Raises:
        ValueError: NaN/inf among valid entries, negative ids, shapes that do not broadcast.
    """
    p = _prepare(x, mask, group, num_groups=num_groups, distributed=distributed, backend="auto")
    return _moments(p, distributed)


def _whiten_full(
    x: Tensor,
    *,
    mask: Tensor | None,
    group: Tensor | None,
    eps: float,
    center: bool,
    scale: bool,
    distributed: bool,
    backend: str = "auto",
) -> tuple[Tensor, GroupMoments, _Prepared]:
    """Whitened ``x`` (untagged) plus the group moments and the prepared flat inputs."""
    p = _prepare(x, mask, group, num_groups=None, distributed=distributed, backend=backend, eps=eps)
    eps = float(eps)
    moments = _moments(p, distributed)
    inv = _scale_table(moments, eps, scale)
    shift = moments.mean if center else torch.zeros_like(moments.mean)
    out = _apply(p, shift, inv, x.dtype)
    return out.reshape(x.shape), moments, p


def _whiten_impl(x: Tensor, **kw: Any) -> Tensor:
    return _whiten_full(x, **kw)[0]


def whiten(
    x: Tensor,
    *,
    mask: Tensor | None = None,
    group: Tensor | None = None,
    eps: float = 1e-8,
    center: bool = True,
    scale: bool = True,
    distributed: bool = False,
    allow_rewhiten: bool = False,
) -> Tensor:
    """Grouped whitening: ``(x - mean_g) / (std_g + eps)`` at valid entries, 0 elsewhere.

    Args:
        x: float tensor ``[*S]`` (e.g. advantages ``[T, E, A]``).
        mask: bool ``[*S]`` (or broadcastable), True where the entry is valid; None = all.
        group: integer group ids ``[*S]`` (or broadcastable), >= 0 at valid entries; None
            = one group. Statistics are computed separately for each distinct id.
        eps: > 0, added to the population std (ddof 0) before dividing.
        center: subtract the group mean (False: ``x / (std_g + eps)``, std still about
            the mean).
        scale: divide by ``std_g + eps`` (False: ``x - mean_g``, centre only).
        distributed: reduce the statistics over the default torch.distributed process
            group; every rank's output then equals whitening the concatenation of all
            ranks' data (unequal counts per rank, groups absent on some ranks included).
            Every rank must call with the same ``center``/``scale``/``eps``.
        allow_rewhiten: escape hatch for the double-whitening guard.

    Returns:
        Tensor ``[*S]`` with x's dtype, detached, tagged as whitened. A group with one
        valid entry or zero variance gives 0.

    Raises:
        TypeError: non-float x, non-integer group ids, non-bool mask.
        ValueError: NaN/inf among valid entries, eps <= 0, negative ids, shapes that do
            not broadcast (both shapes named), already-whitened input.
    """
    _check_float_tensor(x, "x")
    _guard(x, "x", allow_rewhiten)
    out = _whiten_impl(
        x,
        mask=mask,
        group=group,
        eps=eps,
        center=bool(center),
        scale=bool(scale),
        distributed=bool(distributed),
    )
    return _tag(out)


def mix_team_individual(team: Tensor, individual: Tensor, alpha: float, **whiten_kw: Any) -> Tensor:
    """``alpha * whiten(team) + (1 - alpha) * whiten(individual)``.

    Args:
        team: float ``[*S]`` team advantages.
        individual: float ``[*S]`` individual advantages (same shape as ``team``).
        alpha: weight of the team part, in [0, 1].
        **whiten_kw: passed to both ``whiten`` calls (mask, group, eps, center, scale,
            distributed, allow_rewhiten).

    Returns:
        Tensor ``[*S]``, tagged as whitened; 0 at masked-out entries.
    """
    _check_float_tensor(team, "team")
    _check_float_tensor(individual, "individual")
    if team.shape != individual.shape:
        raise ValueError(
            f"team and individual must have the same shape, got team {tuple(team.shape)} "
            f"and individual {tuple(individual.shape)}"
        )
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise TypeError(f"alpha must be a float in [0, 1], got {type(alpha).__name__}")
    alpha = float(alpha)
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    unknown = set(whiten_kw) - {
        "mask",
        "group",
        "eps",
        "center",
        "scale",
        "distributed",
        "allow_rewhiten",
    }
    if unknown:
        raise TypeError(f"mix_team_individual got unknown whiten keyword(s) {sorted(unknown)}")
    out = alpha * whiten(team, **whiten_kw) + (1.0 - alpha) * whiten(individual, **whiten_kw)
    return _tag(out)


# --------------------------------------------------------------------- running moments


class RunningMoments:
    """Running per-group mean and variance (float64), for whitening with running statistics.

    ``momentum=None``: exact statistics of everything seen (Chan et al.'s parallel merge),
    so whitening with them equals whitening with the statistics of the concatenation of all
    updates. ``momentum=m`` (float in [0, 1)): the first update of a group sets its mean and
    variance to the batch's; later ones set ``mean = m*mean + (1-m)*batch_mean`` and
    ``var = m*var + (1-m)*batch_var`` (population variances). Groups absent from a batch
    keep their statistics. ``count`` is the number of valid entries seen per group.
    """

    def __init__(self, num_groups: int = 1, momentum: float | None = None) -> None:
        if isinstance(num_groups, bool) or not isinstance(num_groups, int):
            raise TypeError(f"num_groups must be an int >= 1, got {type(num_groups).__name__}")
        if num_groups < 1:
            raise ValueError(f"num_groups must be >= 1, got {num_groups}")
        if momentum is not None:
            if isinstance(momentum, bool) or not isinstance(momentum, (int, float)):
                raise TypeError(f"momentum must be None or a float in [0, 1), got {momentum!r}")
            momentum = float(momentum)
            if not 0.0 <= momentum < 1.0:
                raise ValueError(f"momentum must be None or in [0, 1), got {momentum}")
        self.num_groups = num_groups
        self.momentum = momentum
        self.count = torch.zeros(num_groups, dtype=torch.float64)
        self.mean = torch.zeros(num_groups, dtype=torch.float64)
        self.var = torch.zeros(num_groups, dtype=torch.float64)

    def __repr__(self) -> str:
        return f"RunningMoments(num_groups={self.num_groups}, momentum={self.momentum})"

    @torch.no_grad()
    def update(
        self,
        x: Tensor,
        *,
        mask: Tensor | None = None,
        group: Tensor | None = None,
        distributed: bool = False,
    ) -> RunningMoments:
        """Merge the valid entries of ``x`` ``[*S]`` into the statistics (ids < num_groups).

        With ``distributed=True`` the batch statistics are first reduced over the default
        process group (exactly, as in ``whiten``), so all ranks stay identical.
        """
        p = _prepare(
            x, mask, group, num_groups=self.num_groups, distributed=distributed, backend="auto"
        )
        batch = _moments(p, distributed)
        nb = batch.count
        seen = nb > 0
        if self.momentum is None:
            na = self.count
            n = na + nb
            safe_n = n.clamp_min(1.0)
            delta = batch.mean - self.mean
            mean = self.mean + delta * nb / safe_n
            m2 = self.var * na + batch.var * nb + delta * delta * na * nb / safe_n
            self.mean = torch.where(seen, mean, self.mean)
            self.var = torch.where(seen, m2 / safe_n, self.var)
            self.count = n
        else:
            m = self.momentum
            first = seen & (self.count == 0)
            later = seen & (self.count > 0)
            self.mean = torch.where(
                first,
                batch.mean,
                torch.where(later, m * self.mean + (1 - m) * batch.mean, self.mean),
            )
            self.var = torch.where(
                first, batch.var, torch.where(later, m * self.var + (1 - m) * batch.var, self.var)
            )
            self.count = self.count + nb
        return self

    def whiten(
        self,
        x: Tensor,
        *,
        mask: Tensor | None = None,
        group: Tensor | None = None,
        eps: float = 1e-8,
        center: bool = True,
        scale: bool = True,
        allow_rewhiten: bool = False,
    ) -> Tensor:
        """``(x - mean_g) / (std_g + eps)`` with the running statistics; 0 where masked.

        Groups never updated, or with zero running variance, give 0. Ids must be below
        ``num_groups``. Returns a tensor ``[*S]`` tagged as whitened.
        """
        eps = _check_eps(eps)
        _check_float_tensor(x, "x")
        _guard(x, "x", allow_rewhiten)
        p = _prepare(x, mask, group, num_groups=self.num_groups, distributed=False, backend="auto")
        inv = _scale_table(GroupMoments(self.count, self.mean, self.var), eps, bool(scale))
        shift = self.mean if center else torch.zeros_like(self.mean)
        out = _apply(p, shift, inv, x.dtype)
        # No per-group sums here: check the output (masked-out entries are already 0).
        if not bool(torch.isfinite(out).all()):
            raise ValueError(
                "x holds NaN or inf among the valid (masked-in) entries; fix the advantages "
                "or mask those entries out"
            )
        return _tag(out.reshape(x.shape))

    def state_dict(self) -> dict[str, Any]:
        """Checkpointable state (float64 CPU tensors ``[num_groups]`` and the settings)."""
        return {
            "num_groups": self.num_groups,
            "momentum": self.momentum,
            "count": self.count.clone(),
            "mean": self.mean.clone(),
            "var": self.var.clone(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Load a ``state_dict``; validates keys/shapes and leaves state unchanged on error."""
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a mapping, got {type(state).__name__}")
        expected = {"num_groups", "momentum", "count", "mean", "var"}
        missing, extra = expected - set(state), set(state) - expected
        if missing or extra:
            raise ValueError(
                f"RunningMoments state_dict keys mismatch: missing {sorted(missing)}, "
                f"unexpected {sorted(extra)}"
            )
        if state["num_groups"] != self.num_groups:
            raise ValueError(
                f"state has num_groups={state['num_groups']}, this RunningMoments has "
                f"{self.num_groups}"
            )
        mom = state["momentum"]
        if (mom is None) != (self.momentum is None) or (
            mom is not None and float(mom) != self.momentum
        ):
            raise ValueError(f"state has momentum={mom}, this RunningMoments has {self.momentum}")
        new = {}
        for key in ("count", "mean", "var"):
            t = state[key]
            if not isinstance(t, Tensor) or t.shape != (self.num_groups,):
                shape = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
                raise ValueError(
                    f"state[{key!r}] must be a tensor of shape ({self.num_groups},), got {shape}"
                )
            new[key] = t.detach().to(device="cpu", dtype=torch.float64).clone()
            if not bool(torch.isfinite(new[key]).all()):
                raise ValueError(f"state[{key!r}] holds NaN or inf")
        if bool((new["count"] < 0).any()) or bool((new["var"] < 0).any()):
            raise ValueError("state count and var must be non-negative")
        self.count, self.mean, self.var = new["count"], new["mean"], new["var"]


# ----------------------------------------------------------------------- group keys


def type_key(agent_names: Sequence[str], types: Sequence[str] | None = None) -> Tensor:
    """Type id per agent ``[A]`` (int64) from names like ``scout_0`` / ``rescuer_1``.

    The type of a name is ``name.rsplit("_", 1)[0]``; ids follow ``types`` when given
    (every type must be listed), else the order of first appearance.
    """
    if isinstance(agent_names, str):
        raise TypeError("agent_names must be a sequence of names, not a single str")
    kinds = [str(name).rsplit("_", 1)[0] for name in agent_names]
    order = list(types) if types is not None else list(dict.fromkeys(kinds))
    index = {t: i for i, t in enumerate(order)}
    unknown = sorted(set(kinds) - set(index))
    if unknown:
        raise ValueError(f"agent types {unknown} are not in types={order}")
    return torch.tensor([index[k] for k in kinds], dtype=torch.int64)


def position_key(
    window: int, ndim: int = 1, *, time_dim: int = 0, length: int | None = None
) -> Tensor:
    """Position within the training window, shaped to broadcast against ``[..., T, ...]``.

    Args:
        window: window length T_window (>= 1).
        ndim: number of dimensions of the advantage tensor the key broadcasts against.
        time_dim: which of those dimensions is time.
        length: number of time steps (default ``window``); step t gets ``t % window``
            (a long rollout cut into consecutive windows).

    Returns:
        int64 tensor with ``length`` along ``time_dim`` and 1 elsewhere.
    """
    for name, v in (("window", window), ("ndim", ndim)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    length = window if length is None else length
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise ValueError(f"length must be an int >= 1, got {length!r}")
    if not -ndim <= time_dim < ndim:
        raise ValueError(f"time_dim must be in [-{ndim}, {ndim}), got {time_dim}")
    shape = [1] * ndim
    shape[time_dim] = length
    return (torch.arange(length, dtype=torch.int64) % window).reshape(shape)


def chunk_key(position: Tensor, chunk_size: int) -> Tensor:
    """Chunk id ``position // chunk_size`` (long trajectories: chunked statistics)."""
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be an int >= 1, got {chunk_size!r}")
    _check_int_key(position, "position")
    return torch.div(position, chunk_size, rounding_mode="floor")


def sequence_key(shape: Sequence[int], *, time_dim: int = 0) -> Tensor:
    """Distinct id per sequence (every index except time) for a tensor of ``shape``.

    Returns an int64 tensor of ``shape`` with 1 along ``time_dim`` (broadcasts over time).
    """
    shape = list(shape)
    if not shape:
        raise ValueError("shape must have at least one dimension")
    if not -len(shape) <= time_dim < len(shape):
        raise ValueError(f"time_dim must be in [-{len(shape)}, {len(shape)}), got {time_dim}")
    shape[time_dim] = 1
    return torch.arange(math.prod(shape), dtype=torch.int64).reshape(shape)


def _check_int_key(t: Any, name: str) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be an integer torch.Tensor, got {type(t).__name__}")
    if t.dtype == torch.bool or t.is_floating_point() or t.is_complex():
        raise TypeError(f"{name} must be an integer tensor, got dtype {t.dtype}")


def combine_keys(a: Tensor, b: Tensor, num_b: int | None = None) -> Tensor:
    """Combined key ``a * num_b + b`` (e.g. type x position), broadcasting a against b.

    ``num_b`` (default ``b.max() + 1``) must exceed every id of ``b``; pass it explicitly
    when keys must agree across processes or batches.
    """
    _check_int_key(a, "a")
    _check_int_key(b, "b")
    b_max = int(b.max()) if b.numel() else -1
    if num_b is None:
        num_b = b_max + 1
    elif isinstance(num_b, bool) or not isinstance(num_b, int) or num_b < 1:
        raise ValueError(f"num_b must be an int >= 1, got {num_b!r}")
    if b_max >= num_b:
        raise ValueError(f"b holds id {b_max} >= num_b={num_b}")
    return a.to(torch.int64) * num_b + b.to(torch.int64)


@dataclass
class GroupKeys:
    """Group keys for the named schemes; each an int64 tensor broadcastable to the
    advantage shape, or None when unused."""

    type_id: Tensor | None = None
    position: Tensor | None = None  # position within the training window
    sequence_id: Tensor | None = None


def parse_scheme(name: str) -> str:
    """Canonical scheme name (case/``-`` insensitive, a few aliases), else ValueError."""
    if not isinstance(name, str):
        raise TypeError(f"scheme must be a str, got {type(name).__name__}")
    key = re.sub(r"[\s\-]+", "_", name.strip().lower())
    key = _SCHEME_ALIASES.get(key, key)
    if key not in SCHEMES:
        raise ValueError(
            f"unknown whitening scheme {name!r}; known schemes: {', '.join(SCHEMES)} "
            f"(aliases: {', '.join(sorted(_SCHEME_ALIASES))})"
        )
    return key


# ------------------------------------------------------------------ clip and statistics


def symmetric_clip(
    x: Tensor, clip_range: float, mask: Tensor | None = None
) -> tuple[Tensor, float]:
    """Clamp to ``[-clip_range, clip_range]``; returns (clipped, fraction of valid entries
    whose |x| exceeded clip_range). Keeps the whitened tag of ``x``."""
    c = _check_clip(clip_range)
    flat_mask = _prepare_mask(mask, x)
    over = x.detach().abs() > c
    if flat_mask is not None:
        over = over.reshape(-1) & flat_mask
        n = int(flat_mask.sum())
    else:
        n = x.numel()
    frac = float(over.sum()) / n if n else 0.0
    out = x.clamp(-c, c)
    if is_whitened(x):
        _tag(out)
    return out, frac


def _check_clip(clip_range: float) -> float:
    if isinstance(clip_range, bool) or not isinstance(clip_range, (int, float)):
        raise TypeError(f"clip_range must be a positive float, got {type(clip_range).__name__}")
    c = float(clip_range)
    if not c > 0:
        raise ValueError(f"clip_range must be > 0, got {c}")
    return c


def advantage_stats(x: Tensor, mask: Tensor | None = None) -> dict[str, float]:
    """Summary of the valid entries of ``x`` ``[*S]`` for logging (float64 arithmetic).

    Keys: ``mean``, ``std`` (population), ``pos_frac``/``neg_frac`` (fraction of valid
    entries > 0 / < 0), ``pos_mean``/``neg_mean`` (mean of those entries; 0.0 when there
    are none), ``max_abs``. With no valid entries every value is 0.0. NaN/inf
    are reported, not raised (this is a monitor).
    """
    _check_float_tensor(x, "x")
    flat_mask = _prepare_mask(mask, x)
    v = x.detach().reshape(-1).to(torch.float64)
    if flat_mask is not None:
        v = v[flat_mask]
    n = v.numel()
    keys = ("mean", "std", "pos_frac", "pos_mean", "neg_frac", "neg_mean", "max_abs")
    if n == 0:
        return dict.fromkeys(keys, 0.0)
    pos, neg = v > 0, v < 0
    n_pos, n_neg = int(pos.sum()), int(neg.sum())
    mean = v.mean()
    return {
        "mean": float(mean),
        "std": float(((v - mean) ** 2).mean().sqrt()),
        "pos_frac": n_pos / n,
        "pos_mean": float(v[pos].mean()) if n_pos else 0.0,
        "neg_frac": n_neg / n,
        "neg_mean": float(v[neg].mean()) if n_neg else 0.0,
        "max_abs": float(v.abs().max()),
    }


# ------------------------------------------------------------------ named schemes


class AdvantageWhitener:
    """Whitening by a named scheme (a config string), with optional symmetric clip.

    Schemes (``SCHEMES``):

    ============== ==================================================================
    none           no whitening: ``team + individual`` (masked-out entries set to 0)
    batch          one group
    type           ``keys.type_id``
    position       ``keys.position``
    chunk          ``keys.position // chunk_size``
    sequence       ``keys.sequence_id`` (LayerNorm-like)
    type_position  ``type_id x position`` (``combine_keys``)
    running        exact running statistics (``RunningMoments(num_groups)``); grouped by
                   the ``inner`` key when ``num_groups > 1``, else one group. Each call
                   updates the statistics with the batch, then whitens with them.
    running_ema    as running with ``momentum``
    team_individual ``mix_team_individual(team, individual, alpha)`` grouped by ``inner``
    center         centre only over the batch (Dr. GRPO): ``x - mean``
    ============== ==================================================================

    Every scheme except team_individual whitens ``team + individual`` (``individual`` may
    be None). After whitening, ``clip_range`` clamps to ``[-clip_range, clip_range]``;
    ``last_clip_frac`` holds the fraction of valid entries that were clipped (0.0 without
    clip). Outputs are tagged as whitened, so passing one back in raises.
    """

    def __init__(
        self,
        scheme: str = "team_individual",
        *,
        alpha: float = 0.5,
        inner: str = "type",
        chunk_size: int = 64,
        clip_range: float | None = None,
        momentum: float = 0.99,
        num_groups: int = 1,
        eps: float = 1e-8,
        distributed: bool = False,
    ) -> None:
        self.scheme = parse_scheme(scheme)
        self.inner = parse_scheme(inner)
        if self.inner not in _GROUPING_SCHEMES:
            raise ValueError(f"inner must be one of {', '.join(_GROUPING_SCHEMES)}, got {inner!r}")
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
            raise TypeError(f"alpha must be a float in [0, 1], got {type(alpha).__name__}")
        if not 0.0 <= float(alpha) <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {alpha}")
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"chunk_size must be an int >= 1, got {chunk_size!r}")
        self.alpha = float(alpha)
        self.chunk_size = chunk_size
        self.clip_range = None if clip_range is None else _check_clip(clip_range)
        self.eps = _check_eps(eps)
        self.distributed = bool(distributed)
        self.num_groups = num_groups
        self.momentum = momentum
        self.running: RunningMoments | None = None
        if self.scheme in ("running", "running_ema"):
            self.running = RunningMoments(
                num_groups, momentum=None if self.scheme == "running" else momentum
            )
        self.last_clip_frac = 0.0

    def __repr__(self) -> str:
        return (
            f"AdvantageWhitener(scheme={self.scheme!r}, alpha={self.alpha}, "
            f"inner={self.inner!r}, clip_range={self.clip_range})"
        )

    def group_key(self, scheme: str, keys: GroupKeys) -> Tensor | None:
        """The group ids the grouping ``scheme`` uses, from ``keys`` (None = one group)."""

        def need(name: str) -> Tensor:
            value = getattr(keys, name)
            if value is None:
                raise ValueError(f"whitening scheme {scheme!r} needs keys.{name}")
            _check_int_key(value, f"keys.{name}")
            return value

        if scheme in ("batch", "center", "none"):
            return None
        if scheme == "type":
            return need("type_id")
        if scheme == "position":
            return need("position")
        if scheme == "chunk":
            return chunk_key(need("position"), self.chunk_size)
        if scheme == "sequence":
            return need("sequence_id")
        if scheme == "type_position":
            position = need("position")
            num_b = int(position.max()) + 1 if position.numel() else 1
            if self.distributed:
                num_b = _all_reduce_max_int(num_b, position.device)
            return combine_keys(need("type_id"), position, num_b)
        raise ValueError(f"scheme {scheme!r} has no group key")  # pragma: no cover

    def __call__(
        self,
        team: Tensor,
        individual: Tensor | None = None,
        *,
        mask: Tensor | None = None,
        keys: GroupKeys | None = None,
    ) -> Tensor:
        """Whiten advantages ``team`` (and ``individual``), both ``[*S]``; returns ``[*S]``."""
        keys = GroupKeys() if keys is None else keys
        _check_float_tensor(team, "team")
        if individual is not None:
            _check_float_tensor(individual, "individual")
            if individual.shape != team.shape:
                raise ValueError(
                    f"team and individual must have the same shape, got team "
                    f"{tuple(team.shape)} and individual {tuple(individual.shape)}"
                )
        scheme, wkw = self.scheme, {"eps": self.eps, "distributed": self.distributed}
        if scheme == "team_individual":
            if individual is None:
                raise ValueError("scheme 'team_individual' needs individual advantages")
            out = mix_team_individual(
                team,
                individual,
                self.alpha,
                mask=mask,
                group=self.group_key(self.inner, keys),
                **wkw,
            )
        else:
            total = team if individual is None else team + individual
            _guard(team, "team", False)
            if individual is not None:
                _guard(individual, "individual", False)
            if scheme == "none":
                if mask is None:
                    out = total.detach().clone()
                else:
                    valid = _prepare_mask(mask, total).reshape(total.shape)
                    out = torch.where(valid, total.detach(), torch.zeros((), dtype=total.dtype))
            elif scheme == "center":
                out = whiten(total, mask=mask, scale=False, **wkw)
            elif self.running is not None:
                group = self.group_key(self.inner, keys) if self.num_groups > 1 else None
                self.running.update(total, mask=mask, group=group, distributed=self.distributed)
                out = self.running.whiten(total, mask=mask, group=group, eps=self.eps)
            else:
                out = whiten(total, mask=mask, group=self.group_key(scheme, keys), **wkw)
        if self.clip_range is not None:
            out, self.last_clip_frac = symmetric_clip(out, self.clip_range, mask)
        else:
            self.last_clip_frac = 0.0
        return out

    def state_dict(self) -> dict[str, Any]:
        """Running statistics (empty dict for schemes without state)."""
        return {} if self.running is None else {"running": self.running.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Load ``state_dict()`` output; validates it against the scheme."""
        if self.running is None:
            if state:
                raise ValueError(f"scheme {self.scheme!r} has no state, got keys {sorted(state)}")
            return
        if set(state) != {"running"}:
            raise ValueError(f"expected state with key 'running', got keys {sorted(state)}")
        self.running.load_state_dict(state["running"])
