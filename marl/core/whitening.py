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
The torch functions ``_count_and_sum``, ``_centred_sums`` and ``_apply`` (with the per-group
statistics in :mod:`marl.core.whitening_stats`, re-exported here), composed by ``_moments``
there and ``_whiten_full`` below, *are* the definition of ``whiten``: for group g with
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

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

# the per-group statistics: every name of marl.core.whitening_stats is importable from here too
# (the re-exports are the imports marked noqa F401)
from marl.core.whitening_stats import (
    _DENSE_GROUP_LIMIT,  # noqa: F401
    _DIST_GROUP_LIMIT,  # noqa: F401
    _NUMBA_PASSES,  # noqa: F401
    _TORCH_PASSES,  # noqa: F401
    GroupMoments,
    _all_reduce_max,
    _all_reduce_sum,  # noqa: F401
    _apply,  # noqa: F401
    _broadcast_flat,  # noqa: F401
    _centred_sums,  # noqa: F401
    _check_eps,
    _check_float_tensor,
    _check_int_tensor,
    _count_and_sum,  # noqa: F401
    _Flat,
    _flat_mask,
    _flatten,
    _flatten_agreed,
    _gather,  # noqa: F401
    _moments,
    _Passes,  # noqa: F401
    _raise_if_not_finite,  # noqa: F401
    _require_process_group,  # noqa: F401
    _scale_table,
    _scatter_sum,  # noqa: F401
    _select_passes,  # noqa: F401
)

__all__ = [
    "GROUPING_SCHEMES",
    "SCHEMES",
    "AdvantageWhitener",
    "GroupKeys",
    "GroupMoments",
    "RunningMoments",
    "advantage_stats",
    "episode_segments",
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


# ------------------------------------------------------------------------------ validation


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


# ------------------------------------------------------------------------- public kernel


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


def episode_segments(episode_start: Tensor, window: int) -> Tensor:
    """Per step and env, an id of the (training window, episode) piece it belongs to.

    ``episode_start [T, E]`` bool -> ``[T, E]`` long: steps share an id when they are in the
    same window of ``window`` steps *and* the same episode (no autoreset between them), so a
    per-sequence statistic never mixes two episodes.
    """
    T, E = episode_start.shape
    position = torch.arange(T, device=episode_start.device) % window
    # a new piece starts at an episode start or at a window start
    starts = episode_start | (position == 0)[:, None]
    piece = torch.cumsum(starts.long(), dim=0) - 1  # [T, E], per env
    return piece * E + torch.arange(E, device=episode_start.device)[None, :]
