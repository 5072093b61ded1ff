"""Grouped advantage whitening: one scatter-based kernel for every scheme.

Every whitening scheme in this suite is *grouped whitening with a group key*: statistics
(count, mean, population variance) are computed over the valid entries (``mask``) of each
group and applied to that group. Per batch, per agent type, per position in a sequence
window, per chunk of positions, per sequence, and combinations (type x position) differ
only in the integer group key passed as ``group``.

Core contract (docs/CONTRACTS.md section 2)::

    whiten(x, *, mask=None, group=None, eps=1e-8, center=True, scale=True,
           distributed=False, allow_rewhiten=False) -> Tensor
    RunningMoments(num_groups=1, momentum=None)   # .update / .whiten / state_dict
    mix_team_individual(team, individual, alpha, **whiten_kw)

The specification
-----------------
The torch functions ``_count_and_sum``, ``_centred_sums`` and ``_apply`` below, composed by
``_moments`` and ``_whiten_full``, *are* the definition of ``whiten``: for group g with
``n_g`` valid entries,

1. ``n_g`` and ``S_g = sum x`` by scatter-add (``index_add_``) into float64 ``[G]`` tables;
2. ``m_g = S_g / n_g``; then ``D_g = sum d`` and ``Q_g = sum d**2`` with ``d = x - m_g``
   (a second pass: the centred, two-pass variance);
3. ``mean_g = m_g + D_g / n_g`` and ``var_g = Q_g / n_g - (D_g / n_g)**2`` (population,
   ddof 0; the ``D_g`` terms remove the rounding error of ``m_g``: the corrected two-pass
   algorithm of Chan, Golub & LeVeque, so a constant group has variance exactly 0);
4. ``out = (x - mean_g) / (std_g + eps)`` at valid entries, 0 elsewhere; a group with one
   valid entry or zero variance gives 0 (never inf/NaN). ``center=False`` drops the
   ``- mean_g``, ``scale=False`` the division.

With ``distributed=True`` the tables of step 1, then those of step 2, are summed over the
default torch.distributed process group, so every rank gets exactly the statistics of the
concatenation of all ranks' data, whatever the counts per rank and per group.

NaN/inf among valid entries make their group's float64 sum non-finite and raise
``ValueError``. Values at masked-out entries are never read into the statistics (padding
may hold NaN), nor are their group ids (``-1`` padding is fine).

Fast path
---------
On CPU tensors the same three passes run as fused numba loops
(:mod:`marl.core.kernels.whitening_numba`: no float64 copy of ``x``, no gathered
intermediates; faster than the torch functions: BENCHMARKS.md, ``benchmarks/whitening.py``);
tests check them against the torch
functions. ``MARL_WHITEN_BACKEND=torch`` selects the torch functions on CPU too
(``=numba`` insists on the loops: an error where they cannot run); CUDA always uses torch.

Group ids
---------
Integer tensors broadcastable to ``x``, non-negative at valid entries. Ids index the
``[G]`` tables directly (``G = max id + 1``), so their range, not their number, sets the
table size; when the largest id exceeds ``max(2**20, numel // 4)`` they are first compacted
with ``torch.unique`` (correct but slower: pass dense ids). With ``distributed=True`` ids
must mean the same on every rank and stay below ``2**22`` (no rank-local compaction).

Double-whitening guard
----------------------
Every whitened output (``whiten``, ``mix_team_individual``, ``RunningMoments.whiten``,
``AdvantageWhitener`` except scheme ``none``) carries the attribute ``_marl_whitened``, and
``whiten`` refuses such a tensor with a ``ValueError``. The tag lives on the tensor object:
arithmetic, views and clones give untagged tensors, so the guard catches passing the *same*
whitened advantages back in (the seed's troubleshooting item). Escape hatch:
``allow_rewhiten=True`` (or whiten ``x.clone()``).

Gradients: whitening treats advantages as constants; outputs are detached.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import Tensor

from marl.core.kernels import whitening_numba

__all__ = [
    "GROUPING_SCHEMES",
    "SCHEMES",
    "AdvantageWhitener",
    "GroupKeys",
    "GroupMoments",
    "RunningMoments",
    "advantage_stats",
    "group_moments",
    "is_whitened",
    "mix_team_individual",
    "symmetric_clip",
    "whiten",
]

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

#: Schemes usable as the ``inner`` grouping of team_individual / running / running_ema.
GROUPING_SCHEMES: tuple[str, ...] = (
    "batch",
    "type",
    "position",
    "chunk",
    "sequence",
    "type_position",
)

#: Attribute set on every whitened output (the double-whitening guard reads it).
_WHITENED_ATTR = "_marl_whitened"
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


def _check_alpha(alpha: float) -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise TypeError(f"alpha must be a float in [0, 1], got {type(alpha).__name__}")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    return float(alpha)


def _check_clip(clip_range: float) -> float:
    if isinstance(clip_range, bool) or not isinstance(clip_range, (int, float)):
        raise TypeError(f"clip_range must be a positive float, got {type(clip_range).__name__}")
    if not clip_range > 0:
        raise ValueError(f"clip_range must be > 0, got {clip_range}")
    return float(clip_range)


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


# ------------------------------------------------------------------------ whitening guard


def is_whitened(x: Tensor) -> bool:
    """True when ``x`` is the output of a whitening call (the guard's tag)."""
    return bool(getattr(x, _WHITENED_ATTR, False))


def _tag(out: Tensor) -> Tensor:
    setattr(out, _WHITENED_ATTR, True)
    return out


def _guard(x: Tensor, name: str, allow_rewhiten: bool) -> None:
    if not allow_rewhiten and is_whitened(x):
        raise ValueError(
            f"{name} is already the output of whitening; whitening it again is almost "
            "always a bug (statistics of whitened data are ~0/1 and hide the raw "
            "distribution). Pass allow_rewhiten=True, or whiten x.clone(), if you mean it."
        )


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


def _whiten_full(
    x: Tensor,
    *,
    mask: Tensor | None,
    group: Tensor | None,
    eps: float,
    center: bool,
    scale: bool,
    distributed: bool,
) -> tuple[Tensor, GroupMoments, _Flat]:
    """Whitened ``x`` ``[*S]`` (untagged) with the group moments and the flat inputs
    (``flat.ids`` index the moments; for :mod:`marl.core.advantages`)."""
    flat = _flatten_agreed(x, mask, group, num_groups=None, distributed=distributed, eps=eps)
    moments = _moments(flat, distributed)
    shift = moments.mean if center else torch.zeros_like(moments.mean)
    out = flat.passes.apply(flat.x, flat.ids, flat.mask, shift, _scale_table(moments, eps, scale))
    return out.to(x.dtype).reshape(x.shape), moments, flat


# ------------------------------------------------------------------------- public kernel


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
        mask: bool ``[*S]`` (or broadcastable; 0/1 numeric accepted), True where valid;
            None = all valid.
        group: integer ids ``[*S]`` (or broadcastable), >= 0 at valid entries; None = one
            group. Statistics are computed separately for each distinct id.
        eps: > 0, added to the population std (ddof 0) before dividing.
        center: subtract the group mean (False: ``x / (std_g + eps)``, std still about
            the mean).
        scale: divide by ``std_g + eps`` (False: ``x - mean_g``, centre only).
        distributed: reduce the statistics over the default torch.distributed process
            group: every rank's output equals whitening the concatenation of all ranks'
            data (unequal counts per rank, groups absent on some ranks included). Every
            rank must call with the same ``center``/``scale``/``eps``.
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
    out, _, _ = _whiten_full(
        x,
        mask=mask,
        group=group,
        eps=eps,
        center=bool(center),
        scale=bool(scale),
        distributed=bool(distributed),
    )
    return _tag(out)


def group_moments(
    x: Tensor,
    *,
    mask: Tensor | None = None,
    group: Tensor | None = None,
    num_groups: int | None = None,
    distributed: bool = False,
) -> GroupMoments:
    """Per-group count, mean and population variance (``.m2``: count * var) of the valid
    entries of ``x`` ``[*S]``, the statistics ``whiten`` uses.

    Args:
        x: float ``[*S]``; mask: bool ``[*S]`` (broadcastable); group: integer ids ``[*S]``
            (broadcastable), None = one group.
        num_groups: fix the number of groups (ids must be below it); default max id + 1
            (sparse large ids are then compacted and the tables indexed by rank of id).
        distributed: reduce over the default process group (exact concatenation).

    Returns:
        GroupMoments of float64 CPU tensors ``[num_groups]``.
    """
    flat = _flatten_agreed(x, mask, group, num_groups=num_groups, distributed=distributed)
    return GroupMoments(*(t.cpu() for t in _moments(flat, distributed)))


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
    alpha = _check_alpha(alpha)
    known = {"mask", "group", "eps", "center", "scale", "distributed", "allow_rewhiten"}
    unknown = set(whiten_kw) - known
    if unknown:
        raise TypeError(f"mix_team_individual got unknown whiten keyword(s) {sorted(unknown)}")
    out = alpha * whiten(team, **whiten_kw) + (1.0 - alpha) * whiten(individual, **whiten_kw)
    return _tag(out)


# ------------------------------------------------------------------------ running moments


class RunningMoments:
    """Running per-group mean and variance (float64, CPU), for whitening with running
    statistics.

    ``momentum=None``: exact statistics of everything seen (Chan et al.'s parallel merge),
    so whitening with them equals whitening with the statistics of the concatenation of all
    updates. ``momentum=m`` (float in [0, 1)): the first update of a group takes the batch's
    mean and variance; later ones an EMA of the mixture ``m * old + (1 - m) * batch``::

        mean' = m * mean + (1 - m) * batch_mean
        var'  = m * (var + (mean - mean')**2) + (1 - m) * (batch_var + (batch_mean - mean')**2)

    (population variances; the squared shifts are the spread between the two means).
    Groups absent from a batch keep their statistics. ``count`` is the number of valid
    entries seen per group.
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

    def update(
        self,
        x: Tensor,
        *,
        mask: Tensor | None = None,
        group: Tensor | None = None,
        distributed: bool = False,
    ) -> RunningMoments:
        """Merge the valid entries of ``x`` ``[*S]`` (ids < num_groups) into the statistics.

        With ``distributed=True`` the batch statistics are first reduced over the default
        process group (exactly, as in ``whiten``), so all ranks stay identical.
        """
        flat = _flatten_agreed(x, mask, group, num_groups=self.num_groups, distributed=distributed)
        batch = GroupMoments(*(t.cpu() for t in _moments(flat, distributed)))
        seen = batch.count > 0
        if self.momentum is None:  # exact merge of (count, mean, M2)
            n = self.count + batch.count
            safe_n = n.clamp_min(1.0)
            delta = batch.mean - self.mean
            mean = self.mean + delta * batch.count / safe_n
            m2 = self.count * self.var + batch.m2 + delta**2 * self.count * batch.count / safe_n
            var = m2 / safe_n
        else:
            m = self.momentum
            first = self.count == 0
            mean = torch.where(first, batch.mean, m * self.mean + (1 - m) * batch.mean)
            mixture_var = m * (self.var + (self.mean - mean) ** 2) + (1 - m) * (
                batch.var + (batch.mean - mean) ** 2
            )
            var = torch.where(first, batch.var, mixture_var)
        self.mean = torch.where(seen, mean, self.mean)
        self.var = torch.where(seen, var, self.var)
        self.count = self.count + batch.count
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
        """``(x - mean_g) / (std_g + eps)`` ``[*S]`` with the running statistics; 0 where
        masked, and for groups never updated or with zero running variance.

        Ids must be below ``num_groups``. The output is tagged as whitened.
        """
        eps = _check_eps(eps)
        _check_float_tensor(x, "x")
        _guard(x, "x", allow_rewhiten)
        flat = _flatten(x, mask, group, num_groups=self.num_groups)
        device = flat.x.device
        stats = GroupMoments(self.count, self.mean, self.var)
        shift = self.mean if center else torch.zeros_like(self.mean)
        scale_table = _scale_table(stats, eps, bool(scale))
        out = flat.passes.apply(
            flat.x, flat.ids, flat.mask, shift.to(device), scale_table.to(device)
        )
        if not bool(torch.isfinite(out).all()):  # masked-out entries are already 0
            raise ValueError(
                "x holds NaN or inf among the valid (masked-in) entries; fix the advantages "
                "or mask those entries out"
            )
        return _tag(out.to(x.dtype).reshape(x.shape))

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


# ------------------------------------------------------------------------ named schemes


@dataclass
class GroupKeys:
    """Group keys for the named schemes; each an int64 tensor broadcastable to the
    advantage shape, or None when unused."""

    type_id: Tensor | None = None
    position: Tensor | None = None  # position within the training window
    sequence_id: Tensor | None = None


class AdvantageWhitener:
    """Whitening by a named scheme (a config string), with optional symmetric clip.

    Schemes (``SCHEMES``):

    =============== =================================================================
    none            no whitening: ``team + individual`` (masked-out entries set to 0)
    batch           one group
    type            ``keys.type_id``
    position        ``keys.position``
    chunk           ``keys.position // chunk_size``
    sequence        ``keys.sequence_id`` (LayerNorm-like)
    type_position   ``type_id * (max position + 1) + position``
    running         exact running statistics (``RunningMoments(num_groups)``); grouped by
                    the ``inner`` key when ``num_groups > 1``, else one group. Each call
                    updates the statistics with the batch, then whitens with them.
    running_ema     as running with ``momentum``
    team_individual ``mix_team_individual(team, individual, alpha)`` grouped by ``inner``
    center          centre only over the batch (Dr. GRPO): ``x - mean``
    =============== =================================================================

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
        if scheme not in SCHEMES:
            raise ValueError(
                f"unknown whitening scheme {scheme!r}; known schemes: {', '.join(SCHEMES)}"
            )
        if inner not in GROUPING_SCHEMES:
            raise ValueError(f"inner must be one of {', '.join(GROUPING_SCHEMES)}, got {inner!r}")
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"chunk_size must be an int >= 1, got {chunk_size!r}")
        self.scheme = scheme
        self.inner = inner
        self.alpha = _check_alpha(alpha)
        self.chunk_size = chunk_size
        self.clip_range = None if clip_range is None else _check_clip(clip_range)
        self.eps = _check_eps(eps)
        self.distributed = bool(distributed)
        self.num_groups = num_groups
        self.momentum = momentum
        self.running: RunningMoments | None = None
        if scheme in ("running", "running_ema"):
            self.running = RunningMoments(
                num_groups, momentum=None if scheme == "running" else momentum
            )
        self.last_clip_frac = 0.0

    def __repr__(self) -> str:
        return (
            f"AdvantageWhitener(scheme={self.scheme!r}, alpha={self.alpha}, "
            f"inner={self.inner!r}, clip_range={self.clip_range})"
        )

    def _group_key(self, scheme: str, keys: GroupKeys) -> Tensor | None:
        """The group ids of the grouping ``scheme``, from ``keys`` (None = one group)."""

        def need(name: str) -> Tensor:
            value = getattr(keys, name)
            if value is None:
                raise ValueError(f"whitening scheme {scheme!r} needs keys.{name}")
            return _check_int_tensor(value, f"keys.{name}").long()

        if scheme == "batch":
            return None
        if scheme == "type":
            return need("type_id")
        if scheme == "position":
            return need("position")
        if scheme == "chunk":
            return torch.div(need("position"), self.chunk_size, rounding_mode="floor")
        if scheme == "sequence":
            return need("sequence_id")
        # type_position: the same number of positions on every rank keeps ids consistent
        type_id, position = need("type_id"), need("position")
        num_positions = int(position.max()) + 1 if position.numel() else 1
        if self.distributed:
            num_positions = _all_reduce_max([num_positions], position.device)[0]
        return type_id * num_positions + position

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
        scheme, opts = self.scheme, {"eps": self.eps, "distributed": self.distributed}
        if scheme == "team_individual":
            if individual is None:
                raise ValueError("scheme 'team_individual' needs individual advantages")
            group = self._group_key(self.inner, keys)
            out = mix_team_individual(team, individual, self.alpha, mask=mask, group=group, **opts)
        else:
            _guard(team, "team", False)
            if individual is not None:
                _guard(individual, "individual", False)
            total = team if individual is None else team + individual
            if scheme == "none":
                out = total.detach().clone()
                if mask is not None:
                    out = torch.where(_flat_mask(mask, out).view_as(out), out, 0.0)
            elif scheme == "center":
                out = whiten(total, mask=mask, scale=False, **opts)
            elif self.running is not None:
                group = self._group_key(self.inner, keys) if self.num_groups > 1 else None
                self.running.update(total, mask=mask, group=group, distributed=self.distributed)
                out = self.running.whiten(total, mask=mask, group=group, eps=self.eps)
            else:
                out = whiten(total, mask=mask, group=self._group_key(scheme, keys), **opts)
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


# ------------------------------------------------------------------- clip and statistics


def symmetric_clip(
    x: Tensor, clip_range: float, mask: Tensor | None = None
) -> tuple[Tensor, float]:
    """Clamp ``x`` ``[*S]`` to ``[-clip_range, clip_range]``.

    Returns ``(clipped [*S], fraction of valid entries whose |x| exceeded clip_range)``.
    Keeps the whitened tag of ``x``.
    """
    c = _check_clip(clip_range)
    valid = _flat_mask(mask, x)
    over = x.detach().abs().reshape(-1) > c
    if valid is not None:
        over = over & valid
    n = x.numel() if valid is None else int(valid.sum())
    frac = float(over.sum()) / n if n else 0.0
    out = x.clamp(-c, c)
    return (_tag(out) if is_whitened(x) else out), frac


def advantage_stats(x: Tensor, mask: Tensor | None = None) -> dict[str, float]:
    """Summary of the valid entries of ``x`` ``[*S]`` for logging (float64 arithmetic).

    Keys: ``mean``, ``std`` (population), ``pos_frac``/``neg_frac`` (fraction of valid
    entries > 0 / < 0), ``pos_mean``/``neg_mean`` (mean of those entries; 0.0 when there
    are none), ``max_abs``. With no valid entries every value is 0.0. NaN/inf are
    reported, not raised (this is a monitor).
    """
    _check_float_tensor(x, "x")
    valid = _flat_mask(mask, x)
    v = x.detach().reshape(-1).double()
    if valid is not None:
        v = v[valid]
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
