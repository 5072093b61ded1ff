"""Advantage estimation: GAE(lambda), discounted returns, group-relative (GRPO) advantages,
penalty shaping with beta schedules, and the k3 KL estimator.

All sequence functions are **time-major**: tensors ``[T, ...]`` with any trailing batch
dimensions (envs, agents). Group statistics for GRPO come from the whitening kernel
(``marl.core.whitening``): one source of truth for grouped means and variances.

Termination vs truncation (GAE): ``next_values[t]`` is the value of the observation that
follows step t; on the step where an episode ends it is the value of that episode's final
observation (the trainer fills it from ``vec.final_obs``), otherwise usually ``values[t+1]``.
``terminated[t]``: the episode ended in a terminal state, nothing to bootstrap (the value
after it is 0). ``truncated[t]``: the episode was cut (time limit, end of the rollout is
*not* a truncation: the last step simply bootstraps from ``next_values[T-1]``); the target
bootstraps from ``next_values[t]``. Both stop the recursion (the next step belongs to a
new episode).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from marl.core.whitening import (
    GroupMoments,
    _check_eps,
    _check_float_tensor,
    _whiten_full,
)

__all__ = [
    "constant",
    "discounted_returns",
    "gae",
    "group_relative_advantages",
    "kl_k3",
    "linear_decay",
    "make_schedule",
    "process_advantages",
    "shape_with_penalty",
    "zero_std_mask",
]


def _check_unit(value: float, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float in [0, 1], got {type(value).__name__}")
    value = float(value)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value}")
    return value


def _check_same_shape(ref: Tensor, ref_name: str, **others: Tensor) -> None:
    for name, t in others.items():
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.shape != ref.shape:
            raise ValueError(
                f"{name} has shape {tuple(t.shape)} but {ref_name} has shape {tuple(ref.shape)}"
            )


def _as_flag(t: Tensor, name: str) -> Tensor:
    """Bool flags from a bool or 0/1 tensor."""
    if t.dtype == torch.bool:
        return t
    if t.is_complex():
        raise TypeError(f"{name} must be a bool or 0/1 tensor, got dtype {t.dtype}")
    if t.numel() and bool(((t != 0) & (t != 1)).any()):
        raise ValueError(f"{name} must hold only 0/1 (or bool) values")
    return t != 0


def _check_finite(t: Tensor, name: str) -> None:
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} holds NaN or inf")


@torch.no_grad()
def gae(
    rewards: Tensor,
    values: Tensor,
    next_values: Tensor,
    terminated: Tensor,
    truncated: Tensor,
    *,
    gamma: float,
    lam: float,
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation with separate termination and truncation.

    ``delta_t = r_t + gamma * (1 - terminated_t) * next_values[t] - values[t]`` and
    ``A_t = delta_t + gamma * lam * (1 - done_t) * A_{t+1}`` with
    ``done_t = terminated_t or truncated_t`` and ``A_T = 0``.

    Args:
        rewards: ``[T, *B]`` float.
        values: ``[T, *B]`` V(s_t).
        next_values: ``[T, *B]`` value of the observation after step t (the final
            observation's value where an episode ended at t).
        terminated: ``[T, *B]`` bool (or 0/1): no bootstrap at t.
        truncated: ``[T, *B]`` bool (or 0/1): bootstrap from ``next_values[t]``, stop the
            recursion.
        gamma: discount in [0, 1].
        lam: GAE lambda in [0, 1].

    Returns:
        ``(advantages, returns)``, both ``[T, *B]`` with rewards' dtype;
        ``returns = advantages + values`` (the value targets).
    """
    _check_float_tensor(rewards, "rewards")
    _check_float_tensor(values, "values")
    _check_float_tensor(next_values, "next_values")
    _check_same_shape(
        rewards,
        "rewards",
        values=values,
        next_values=next_values,
        terminated=terminated,
        truncated=truncated,
    )
    if rewards.dim() < 1 or rewards.shape[0] == 0:
        raise ValueError(
            f"rewards must be time-major [T, ...] with T >= 1, got {tuple(rewards.shape)}"
        )
    gamma = _check_unit(gamma, "gamma")
    lam = _check_unit(lam, "lam")
    term = _as_flag(terminated, "terminated")
    done = term | _as_flag(truncated, "truncated")
    for name, t in (("rewards", rewards), ("values", values), ("next_values", next_values)):
        _check_finite(t, name)
    # float64 recursion; cast back at the end.
    r, v, nv = rewards.double(), values.double(), next_values.double()
    not_term = (~term).double()
    carry = (~done).double() * (gamma * lam)
    delta = r + gamma * not_term * nv - v
    adv = torch.empty_like(delta)
    last = torch.zeros_like(delta[0])
    for t in range(delta.shape[0] - 1, -1, -1):
        last = delta[t] + carry[t] * last
        adv[t] = last
    returns = adv + v
    return adv.to(rewards.dtype), returns.to(rewards.dtype)


@torch.no_grad()
def discounted_returns(
    rewards: Tensor,
    dones: Tensor,
    gamma: float,
    *,
    bootstrap: Tensor | None = None,
) -> Tensor:
    """Discounted returns ``G_t = r_t + gamma * (1 - done_t) * G_{t+1}``, time-major.

    Args:
        rewards: ``[T, *B]`` float.
        dones: ``[T, *B]`` bool (or 0/1): the episode ended at t (nothing after it counts).
        gamma: discount in [0, 1].
        bootstrap: ``[*B]`` value used as ``G_T`` (after the last step, where not done);
            default 0 (Monte-Carlo returns of complete episodes).

    Returns:
        ``[T, *B]`` returns with rewards' dtype.
    """
    _check_float_tensor(rewards, "rewards")
    _check_same_shape(rewards, "rewards", dones=dones)
    if rewards.dim() < 1 or rewards.shape[0] == 0:
        raise ValueError(
            f"rewards must be time-major [T, ...] with T >= 1, got {tuple(rewards.shape)}"
        )
    gamma = _check_unit(gamma, "gamma")
    _check_finite(rewards, "rewards")
    keep = (~_as_flag(dones, "dones")).double() * gamma
    r = rewards.double()
    if bootstrap is None:
        last = torch.zeros_like(r[0])
    else:
        _check_float_tensor(bootstrap, "bootstrap")
        if bootstrap.shape != rewards.shape[1:]:
            raise ValueError(
                f"bootstrap has shape {tuple(bootstrap.shape)} but must be rewards.shape[1:] = "
                f"{tuple(rewards.shape[1:])}"
            )
        _check_finite(bootstrap, "bootstrap")
        last = bootstrap.double()
    out = torch.empty_like(r)
    for t in range(r.shape[0] - 1, -1, -1):
        last = r[t] + keep[t] * last
        out[t] = last
    return out.to(rewards.dtype)


@torch.no_grad()
def group_relative_advantages(
    returns: Tensor,
    group_ids: Tensor,
    *,
    mask: Tensor | None = None,
    scale_std: bool = True,
    leave_one_out: bool = False,
    eps: float = 1e-8,
    distributed: bool = False,
) -> tuple[Tensor, float]:
    """GRPO outcome advantages: returns normalised within groups of episodes.

    A group is the set of episodes started from the same reset seed (same ``group_ids``).

    * default: ``(R_i - mean_g) / (std_g + eps)`` (``scale_std=False``: ``R_i - mean_g``,
      Dr. GRPO);
    * ``leave_one_out=True`` (RLOO): the baseline excludes the episode itself,
      ``R_i - mean_{g, -i} = n_g / (n_g - 1) * (R_i - mean_g)``; with ``scale_std`` that
      is divided by ``std_g + eps``, the population std (ddof 0) of the *whole* group
      (the same std as without leave-one-out, so the two differ exactly by n/(n-1)).

    std is the population std (ddof 0) of the group's valid returns, as in ``whiten``
    (TRL uses ddof 1; the two differ by sqrt(n/(n-1))). Groups with a single valid episode
    or zero variance give 0 and are counted in ``frac_zero_std``.

    Args:
        returns: ``[N]`` (or any shape ``[*S]``) float episode returns.
        group_ids: integer ``[*S]`` (broadcastable), >= 0 at valid entries.
        mask: optional bool ``[*S]``; invalid entries give 0 and are not counted.
        scale_std: divide by the group std.
        leave_one_out: RLOO baseline (see above).
        eps: > 0 added to the std.
        distributed: group statistics over all ranks (ids must agree across ranks).

    Returns:
        ``(advantages [*S], frac_zero_std)`` where frac_zero_std is the fraction of groups
        present (>= 1 valid episode) whose variance is zero (single-episode groups
        included). The advantages are *not* tagged as whitened: group normalisation is
        advantage estimation, and whitening them afterwards (e.g. ``AdvantageWhitener``
        with scheme ``batch`` or ``team_individual``) is a legitimate scheme to compare.
    """
    _check_float_tensor(returns, "returns")
    eps = _check_eps(eps)
    if group_ids is None:
        raise TypeError("group_ids must be an integer tensor, got None")
    adv, moments, prep = _whiten_full(
        returns,
        mask=mask,
        group=group_ids,
        eps=eps,
        center=True,
        scale=bool(scale_std),
        distributed=bool(distributed),
    )
    if leave_one_out:
        n = moments.count
        factor = torch.where(n > 1, n / (n - 1).clamp_min(1.0), torch.zeros_like(n))
        ids = prep.ids
        if prep.mask is not None:
            ids = torch.where(prep.mask, ids, torch.zeros_like(ids))
        per_entry = factor.to(adv.device).index_select(0, ids).reshape(adv.shape)
        adv = (adv.double() * per_entry).to(adv.dtype)
    return adv, _zero_std_fraction(moments)


@torch.no_grad()
def zero_std_mask(
    returns: Tensor,
    group_ids: Tensor,
    *,
    mask: Tensor | None = None,
    distributed: bool = False,
) -> Tensor:
    """Bool ``[*S]``: True at valid entries whose group has one valid entry or zero variance.

    For GRPO's optional filtering: such groups carry no learning signal (their advantages
    are 0), so a trainer may drop them from the loss (``loss_mask & ~zero_std_mask(...)``).
    Uses the same group statistics as ``group_relative_advantages``.
    """
    _check_float_tensor(returns, "returns")
    _, moments, prep = _whiten_full(
        returns,
        mask=mask,
        group=group_ids,
        eps=1.0,
        center=True,
        scale=True,
        distributed=bool(distributed),
    )
    degenerate = (moments.count <= 1) | (moments.var <= 0)
    ids = prep.ids
    if prep.mask is not None:
        ids = torch.where(prep.mask, ids, torch.zeros_like(ids))
    out = degenerate.to(ids.device).index_select(0, ids)
    if prep.mask is not None:
        out = out & prep.mask
    return out.reshape(returns.shape)


def _zero_std_fraction(moments: GroupMoments) -> float:
    """Fraction of present groups (>= 1 valid entry) with one entry or zero variance."""
    present = moments.count > 0
    zero = present & ((moments.count <= 1) | (moments.var <= 0))
    n_present = int(present.sum())
    return float(zero.sum()) / n_present if n_present else 0.0


@torch.no_grad()
def process_advantages(
    step_rewards: Tensor,
    mask: Tensor,
    group_ids: Tensor,
    *,
    scale_std: bool = True,
    eps: float = 1e-8,
    distributed: bool = False,
) -> tuple[Tensor, float]:
    """GRPO process-supervision advantages (Shao et al. 2024, section 4.1.3).

    Step rewards are normalised with the mean and population std of *all valid steps of
    all episodes in the group*, then summed from t on:
    ``A[t, i] = sum_{s >= t, valid} (r[s, i] - mean_g) / (std_g + eps)``.

    Args:
        step_rewards: ``[T, N]`` float, N episodes.
        mask: ``[T, N]`` bool, valid steps (False after the episode ended).
        group_ids: ``[N]`` integer group of each episode.
        scale_std: divide by the group std (False: centre only).
        eps: > 0.
        distributed: group statistics over all ranks.

    Returns:
        ``(advantages [T, N], frac_zero_std)``; 0 at invalid steps.
    """
    _check_float_tensor(step_rewards, "step_rewards")
    if step_rewards.dim() != 2:
        raise ValueError(f"step_rewards must be [T, N], got shape {tuple(step_rewards.shape)}")
    if not isinstance(mask, Tensor):
        raise TypeError(f"mask must be a bool tensor [T, N], got {type(mask).__name__}")
    _check_same_shape(step_rewards, "step_rewards", mask=mask)
    if not isinstance(group_ids, Tensor):
        raise TypeError(f"group_ids must be an integer tensor [N], got {type(group_ids).__name__}")
    if group_ids.shape != step_rewards.shape[1:]:
        raise ValueError(
            f"group_ids has shape {tuple(group_ids.shape)} but step_rewards has shape "
            f"{tuple(step_rewards.shape)}; expected group_ids of shape ({step_rewards.shape[1]},)"
        )
    valid = _as_flag(mask, "mask")
    groups = group_ids.unsqueeze(0).expand(step_rewards.shape)
    norm, moments, _ = _whiten_full(
        step_rewards,
        mask=valid,
        group=groups,
        eps=eps,
        center=True,
        scale=bool(scale_std),
        distributed=bool(distributed),
    )
    adv = norm.double().flip(0).cumsum(0).flip(0)
    adv = torch.where(valid, adv, torch.zeros((), dtype=adv.dtype)).to(step_rewards.dtype)
    return adv, _zero_std_fraction(moments)


# ------------------------------------------------------------------- penalty shaping

Schedule = Callable[[float], float]


class constant:  # noqa: N801 - reads as a function in configs: constant(0.1)
    """Schedule returning ``beta`` at every step."""

    def __init__(self, beta: float) -> None:
        self.beta = _check_beta(beta, "beta")

    def __call__(self, t: float) -> float:
        return self.beta

    def __repr__(self) -> str:
        return f"constant({self.beta})"


class linear_decay:  # noqa: N801
    """``beta(t) = max(floor, start * (1 - t / total))`` (seed 003, docs/seeds.md: start 0.5,
    floor 0.1)."""

    def __init__(self, start: float = 0.5, floor: float = 0.1, total: float = 1.0) -> None:
        self.start = _check_beta(start, "start")
        self.floor = _check_beta(floor, "floor")
        if isinstance(total, bool) or not isinstance(total, (int, float)) or not total > 0:
            raise ValueError(f"total must be a number > 0, got {total!r}")
        self.total = float(total)

    def __call__(self, t: float) -> float:
        return max(self.floor, self.start * (1.0 - float(t) / self.total))

    def __repr__(self) -> str:
        return f"linear_decay(start={self.start}, floor={self.floor}, total={self.total})"


def _check_beta(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value}")
    return value


_SCHEDULES: dict[str, type] = {"constant": constant, "linear_decay": linear_decay}


def make_schedule(spec: float | str | Mapping[str, Any] | Schedule) -> Schedule:
    """Build a beta schedule ``t -> beta`` from a config value.

    Accepted: a number (``constant``); a callable (used as is); a mapping
    ``{"kind": "linear_decay", "start": 0.5, "floor": 0.1, "total": 1000}``; a string
    ``"constant:0.2"``, ``"0.2"`` or ``"linear_decay:start=0.5,floor=0.1,total=1000"``.
    """
    if callable(spec) and not isinstance(spec, (str, bytes)):
        return spec
    if isinstance(spec, bool):
        raise TypeError("a beta schedule spec must not be a bool")
    if isinstance(spec, (int, float)):
        return constant(spec)
    if isinstance(spec, Mapping):
        kw = dict(spec)
        kind = kw.pop("kind", None)
        if kind not in _SCHEDULES:
            raise ValueError(f"schedule kind must be one of {sorted(_SCHEDULES)}, got {kind!r}")
        try:
            return _SCHEDULES[kind](**kw)
        except TypeError as err:
            raise ValueError(f"bad arguments for schedule {kind!r}: {err}") from None
    if isinstance(spec, str):
        text = spec.strip()
        try:
            return constant(float(text))
        except ValueError:
            pass
        kind, _, rest = text.partition(":")
        kind = kind.strip()
        if kind not in _SCHEDULES:
            raise ValueError(
                f"unknown schedule {spec!r}; use a number, 'constant:B' or "
                "'linear_decay:start=S,floor=F,total=T'"
            )
        args: list[float] = []
        kwargs: dict[str, float] = {}
        for part in filter(None, (p.strip() for p in re.split(r",", rest))):
            key, eq, val = part.partition("=")
            try:
                if eq:
                    kwargs[key.strip()] = float(val)
                else:
                    args.append(float(key))
            except ValueError:
                raise ValueError(f"cannot parse schedule argument {part!r} in {spec!r}") from None
        try:
            return _SCHEDULES[kind](*args, **kwargs)
        except TypeError as err:
            raise ValueError(f"bad arguments for schedule {spec!r}: {err}") from None
    raise TypeError(
        f"a beta schedule must be a number, str, mapping or callable, got {type(spec).__name__}"
    )


def shape_with_penalty(adv: Tensor, penalty: Tensor, beta: float | Tensor) -> Tensor:
    """Penalty shaping ``adv - beta * penalty`` (seed 003's "GRPO" variant).

    Args:
        adv: ``[*S]`` advantages.
        penalty: ``[*S]`` penalty reward (or its return), same shape.
        beta: a float >= 0 (e.g. ``schedule(update)``) or a tensor broadcastable to
            ``[*S]``.
    """
    _check_float_tensor(adv, "adv")
    _check_float_tensor(penalty, "penalty")
    _check_same_shape(adv, "adv", penalty=penalty)
    _check_finite(adv, "adv")
    _check_finite(penalty, "penalty")
    if isinstance(beta, Tensor):
        if torch.broadcast_shapes(beta.shape, adv.shape) != adv.shape:
            raise ValueError(
                f"beta has shape {tuple(beta.shape)}, which does not broadcast to adv's "
                f"shape {tuple(adv.shape)}"
            )
        _check_finite(beta, "beta")
        return adv - beta.to(adv.dtype) * penalty
    beta = _check_beta(beta, "beta")
    return adv - beta * penalty


def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k3 estimator of KL(pi || pi_ref) from samples of pi (Schulman 2020).

    ``exp(ref_logp - logp) - (ref_logp - logp) - 1`` (>= 0, unbiased); elementwise,
    differentiable in ``logp``. Both ``[*S]`` with the same shape.
    """
    _check_float_tensor(logp, "logp")
    _check_float_tensor(ref_logp, "ref_logp")
    _check_same_shape(logp, "logp", ref_logp=ref_logp)
    log_ratio = ref_logp - logp
    return torch.exp(log_ratio) - log_ratio - 1.0
