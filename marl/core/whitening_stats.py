"""Per-group statistics of grouped whitening (:mod:`marl.core.whitening`, which re-exports
every name here): the input checks and flattening of one call, the three passes (the torch
functions ``_count_and_sum``, ``_centred_sums`` and ``_apply``, the specification, and
their numba twins in :mod:`marl.core.kernels.whitening_numba`, with the choice between them),
the two-pass float64 moments ``_moments`` with the non-finite checks, and their exact sum over
the ranks of the default torch.distributed process group.

See the module doc of :mod:`marl.core.whitening` for the definition and the contract.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import Tensor

from marl.core.kernels import whitening_numba

#: Above this many groups (and above numel // 4) ids are compacted with torch.unique.
_DENSE_GROUP_LIMIT = 1 << 20
#: Largest number of groups accepted with distributed=True.
_DIST_GROUP_LIMIT = 1 << 22


# ------------------------------------------------------------------------------ validation


def _check_float_tensor(x: Any, name: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    return x


def _check_int_tensor(t: Any, name: str) -> Tensor:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be an integer torch.Tensor, got {type(t).__name__}")
    if t.dtype == torch.bool or t.is_floating_point() or t.is_complex():
        raise TypeError(f"{name} must be an integer tensor, got dtype {t.dtype}")
    return t


def _check_eps(eps: float) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"eps must be a positive float, got {type(eps).__name__}")
    if not (eps > 0.0 and math.isfinite(eps)):
        raise ValueError(f"eps must be a finite float > 0, got {eps}")
    return float(eps)


def _broadcast_flat(t: Tensor, x: Tensor, name: str) -> Tensor:
    """``t`` expanded to x's shape and flattened to ``[N]`` (contiguous), or ValueError."""
    if t.device != x.device:
        raise ValueError(f"{name} is on {t.device} but x is on {x.device}")
    try:
        return t.expand(x.shape).reshape(-1).contiguous()
    except RuntimeError:
        raise ValueError(
            f"{name} has shape {tuple(t.shape)}, which does not broadcast to x's shape "
            f"{tuple(x.shape)}"
        ) from None


def _flat_mask(mask: Tensor | None, x: Tensor) -> Tensor | None:
    """Bool ``[N]`` from a bool (or 0/1 numeric) mask broadcastable to ``x``; None = all."""
    if mask is None:
        return None
    if not isinstance(mask, Tensor):
        raise TypeError(f"mask must be a bool torch.Tensor or None, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        if mask.is_complex():
            raise TypeError(f"mask must be a bool (or 0/1 numeric) tensor, got dtype {mask.dtype}")
        if bool(((mask != 0) & (mask != 1)).any()):
            raise ValueError(
                f"a non-bool mask must hold only 0 and 1 (got dtype {mask.dtype} with other "
                "values); pass a bool tensor"
            )
        mask = mask != 0
    return _broadcast_flat(mask, x, "mask")


# ------------------------------------------------------------ the specification (torch)


def _gather(table: Tensor, ids: Tensor | None) -> Tensor:
    """``table[ids]`` ``[N]`` (``table[0]`` when ids is None: one group)."""
    return table[0] if ids is None else table.index_select(0, ids)


def _scatter_sum(values: Tensor, ids: Tensor | None, num_groups: int) -> Tensor:
    """Per-group sums of ``values`` ``[N]`` into a ``[num_groups]`` table (one pass)."""
    if ids is None:
        return values.sum().reshape(1)
    return values.new_zeros(num_groups).index_add_(0, ids, values)


def _count_and_sum(
    x: Tensor, ids: Tensor | None, mask: Tensor | None, num_groups: int
) -> tuple[Tensor, Tensor]:
    """Pass 1: per-group count and sum of the valid entries, float64 ``[G]`` each.

    ``x`` ``[N]`` float, ``ids`` ``[N]`` int64 in ``[0, G)`` (None: one group), ``mask``
    ``[N]`` bool (None: all valid).
    """
    x = x.double()
    if mask is None:
        weight = torch.ones_like(x)
    else:
        weight, x = mask.double(), torch.where(mask, x, 0.0)  # padding may hold NaN
    return _scatter_sum(weight, ids, num_groups), _scatter_sum(x, ids, num_groups)


def _centred_sums(
    x: Tensor, ids: Tensor | None, mask: Tensor | None, mean: Tensor
) -> tuple[Tensor, Tensor]:
    """Pass 2: per-group sums of ``d`` and ``d**2``, ``d = x - mean[group]``, float64 ``[G]``."""
    d = x.double() - _gather(mean, ids)
    if mask is not None:
        d = torch.where(mask, d, 0.0)
    return _scatter_sum(d, ids, mean.numel()), _scatter_sum(d * d, ids, mean.numel())


def _apply(
    x: Tensor, ids: Tensor | None, mask: Tensor | None, shift: Tensor, scale: Tensor
) -> Tensor:
    """Pass 3: ``(x - shift[group]) * scale[group]`` at valid entries, 0 elsewhere; ``[N]``
    with x's dtype (arithmetic in float64)."""
    out = (x.double() - _gather(shift, ids)) * _gather(scale, ids)
    if mask is not None:
        out = torch.where(mask, out, 0.0)
    return out.to(x.dtype)


class _Passes(NamedTuple):
    """One implementation of the three passes (same signatures, same results)."""

    count_and_sum: Callable[..., tuple[Tensor, Tensor]]
    centred_sums: Callable[..., tuple[Tensor, Tensor]]
    apply: Callable[..., Tensor]


_TORCH_PASSES = _Passes(_count_and_sum, _centred_sums, _apply)
_NUMBA_PASSES = _Passes(
    whitening_numba.count_and_sum, whitening_numba.centred_sums, whitening_numba.apply
)


class GroupMoments(NamedTuple):
    """Per-group statistics of the valid entries, float64 ``[num_groups]`` each.

    Absent groups have count 0, mean 0 and var 0.
    """

    count: Tensor
    mean: Tensor
    var: Tensor  # population variance (ddof 0)

    @property
    def m2(self) -> Tensor:
        """Sum of squared deviations from the group mean, ``count * var``."""
        return self.count * self.var


class _Flat(NamedTuple):
    """Validated, flattened inputs of one call."""

    x: Tensor  # [N] float32/float64, detached, contiguous (float64 on the torch passes)
    ids: Tensor | None  # [N] int64 in [0, num_groups) at valid entries; None = one group
    mask: Tensor | None  # [N] bool, True = valid; None = all valid
    num_groups: int
    passes: _Passes


def _select_passes(x: Tensor) -> _Passes:
    """The numba loops for CPU tensors (faster at every size measured by
    ``benchmarks/whitening.py``, from a few hundred entries on), torch elsewhere."""
    setting = os.environ.get("MARL_WHITEN_BACKEND", "auto").lower()
    if setting not in ("auto", "numba", "torch"):
        raise ValueError(f"MARL_WHITEN_BACKEND must be auto, numba or torch, got {setting!r}")
    numba_ok = x.device.type == "cpu" and whitening_numba.AVAILABLE
    if setting == "numba" and not numba_ok:
        raise ValueError("MARL_WHITEN_BACKEND=numba needs CPU tensors and an importable numba")
    return _TORCH_PASSES if setting == "torch" or not numba_ok else _NUMBA_PASSES


def _flatten(
    x: Tensor,
    mask: Tensor | None,
    group: Tensor | None,
    *,
    num_groups: int | None,
    compact: bool = True,
) -> _Flat:
    """Check and flatten one call's inputs; fix the number of groups.

    ``num_groups`` None: ``max id + 1`` over the valid entries (sparse large ids are
    compacted when ``compact``); else ids must be below it.
    """
    _check_float_tensor(x, "x")
    flat_mask = _flat_mask(mask, x)
    passes = _select_passes(x)
    xf = x.detach().reshape(-1)
    if passes is _TORCH_PASSES or xf.dtype not in (torch.float32, torch.float64):
        xf = xf.double()
    xf = xf.contiguous()
    if group is None:
        return _Flat(xf, None, flat_mask, 1, passes)

    ids = _broadcast_flat(_check_int_tensor(group, "group ids"), x, "group").long()
    if passes is _NUMBA_PASSES:  # one fused pass; ids at masked-out entries stay unread
        lo, hi, n_valid = whitening_numba.id_range(ids, flat_mask)
        lo, hi = (lo, hi) if n_valid else (0, 0)
    else:
        if flat_mask is not None:
            ids = torch.where(flat_mask, ids, 0)  # the torch passes index with every id
        lo, hi = (int(v) for v in torch.aminmax(ids)) if ids.numel() else (0, 0)
    if lo < 0:
        raise ValueError(
            f"group ids must be non-negative at valid entries, got minimum {lo} "
            "(negative ids are allowed only where mask is False)"
        )
    size = hi + 1
    if num_groups is not None:
        if size > num_groups:
            raise ValueError(f"group ids must be < num_groups={num_groups}, got maximum id {hi}")
        size = num_groups
    elif compact and size > max(_DENSE_GROUP_LIMIT, xf.numel() // 4):  # sparse large ids
        source = ids if flat_mask is None else torch.where(flat_mask, ids, ids[flat_mask].min())
        unique, ids = torch.unique(source, return_inverse=True)
        size = unique.numel()
    return _Flat(xf, ids.contiguous(), flat_mask, size, passes)


def _flatten_agreed(
    x: Tensor,
    mask: Tensor | None,
    group: Tensor | None,
    *,
    num_groups: int | None,
    distributed: bool,
    eps: float | None = None,
) -> _Flat:
    """``_flatten`` (and the eps check); with ``distributed=True`` the number of groups is
    the largest over the ranks, and an input error on any rank raises on every rank (one
    MAX all_reduce of ``[num_groups, failed]``) instead of leaving the others waiting."""
    if not distributed:
        if eps is not None:
            _check_eps(eps)
        return _flatten(x, mask, group, num_groups=num_groups)
    _require_process_group()
    device = x.device if isinstance(x, Tensor) else torch.device("cpu")
    try:
        if eps is not None:
            _check_eps(eps)
        flat = _flatten(x, mask, group, num_groups=num_groups, compact=False)
    except (TypeError, ValueError):
        _all_reduce_max([0, 1], device)
        raise
    size, failed = _all_reduce_max([flat.num_groups, 0], device)
    if failed:
        raise ValueError("whitening input was invalid on another rank (see that rank's error)")
    if size > _DIST_GROUP_LIMIT:
        raise ValueError(
            f"distributed whitening needs group ids < {_DIST_GROUP_LIMIT}, got {size} groups; "
            "compact the ids consistently on every rank"
        )
    return flat._replace(num_groups=size)


def _raise_if_not_finite(
    table: Tensor, flat: _Flat | None = None, what: str = "sum", distributed: bool = False
) -> None:
    """ValueError naming the groups whose float64 ``what`` is NaN/inf: either a non-finite
    valid entry, or (all valid entries of ``flat`` finite) finite values whose ``what``
    overflowed float64, named so."""
    if not bool(torch.isfinite(table).all()):
        groups = torch.nonzero(~torch.isfinite(table)).flatten()[:5].tolist()
        where = f" (groups {groups})" if table.numel() > 1 else ""
        if flat is not None:
            valid = flat.x if flat.mask is None else flat.x[flat.mask]
            if distributed and bool(torch.isfinite(valid).all()):
                raise ValueError(
                    f"the float64 {what} over all ranks is NaN or inf{where} while this rank's "
                    "valid entries are finite: another rank holds NaN or inf (see its error), "
                    "or the sum overflowed; fix the advantages or mask those entries out"
                )
            if valid.numel() and bool(torch.isfinite(valid).all()):
                largest = float(valid.abs().max())
                raise ValueError(
                    f"x is finite but too large to whiten: the float64 {what} of the valid "
                    f"entries overflowed{where} (largest |x| = {largest:.3g}; float64 holds up "
                    "to 1.8e308); rescale the advantages (e.g. divide by a constant) first"
                )
        raise ValueError(
            f"x holds NaN or inf among the valid (masked-in) entries{where}; fix the "
            "advantages or mask those entries out"
        )


def _moments(flat: _Flat, distributed: bool) -> GroupMoments:
    """Two-pass float64 per-group moments of ``flat`` (summed over ranks when distributed);
    ``[G]`` tables on x's device."""
    passes = flat.passes
    count, total = passes.count_and_sum(flat.x, flat.ids, flat.mask, flat.num_groups)
    if distributed:
        count, total = _all_reduce_sum(count, total)
    _raise_if_not_finite(total, flat, "sum", distributed)
    n = count.clamp_min(1.0)  # absent groups: all sums 0, so mean 0 and var 0
    first_mean = total / n
    sum_d, sum_d2 = passes.centred_sums(flat.x, flat.ids, flat.mask, first_mean)
    if distributed:
        sum_d, sum_d2 = _all_reduce_sum(sum_d, sum_d2)
    _raise_if_not_finite(sum_d2, flat, "sum of squared deviations from the mean", distributed)
    correction = sum_d / n  # mean of d: the rounding error of first_mean
    var = (sum_d2 / n - correction * correction).clamp_min(0.0)
    return GroupMoments(count, first_mean + correction, var)


def _scale_table(moments: GroupMoments, eps: float, scale: bool) -> Tensor:
    """``1 / (std + eps)`` per group (1 when ``scale=False``), 0 for groups with one
    entry or zero variance."""
    inv = 1.0 / (moments.var.sqrt() + eps) if scale else torch.ones_like(moments.var)
    degenerate = (moments.count <= 1) | (moments.var <= 0)
    return torch.where(degenerate, 0.0, inv)


# ----------------------------------------------------------------------- torch.distributed


def _require_process_group() -> None:
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(
            "distributed=True needs an initialised default torch.distributed process group "
            "(torch.distributed.init_process_group)"
        )


def _all_reduce_max(values: list[int], device: torch.device) -> list[int]:
    """Element-wise MAX of small integers over the ranks."""
    _require_process_group()
    t = torch.tensor(values, dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [int(v) for v in t.tolist()]


def _all_reduce_sum(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """Sums over the ranks of two ``[G]`` float64 tables (one all_reduce)."""
    both = torch.stack([a, b])
    dist.all_reduce(both, op=dist.ReduceOp.SUM)
    return both[0], both[1]
