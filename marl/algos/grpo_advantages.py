"""GRPO's advantages (step 2 of :meth:`marl.algos.grpo.GRPO.iteration`; the variants and
their maths are described in the module doc of :mod:`marl.algos.grpo`, which re-exports every
name here): the episode returns of a :class:`GroupBatch`, the team and individual channels
normalised within groups (``outcome``: per episode; ``process``: per step, summed from t)
and mixed by alpha, the zero-signal groups, and the normalised penalty cost for penalty
shaping. The normalisation maths itself is in :mod:`marl.core.advantages`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from marl.core.advantages import group_relative_advantages, process_advantages
from marl.rollout.episodes import GroupBatch

#: the inner groupings of the individual channel: group x agent type, or the group
_GRPO_INNER = ("type", "batch")


def episode_returns(batch: GroupBatch) -> tuple[Tensor, Tensor, Tensor]:
    """Undiscounted returns per episode: team ``[E]``, individual ``[E, N]``, penalty
    ``[E, N]`` (float64; the penalty channel is *not* folded into the individual one)."""
    v = batch.valid.to(torch.float64)
    team = (batch.reward_team.double() * v).sum(0)
    ind = (batch.reward_individual.double() * v[..., None]).sum(0)
    pen = (batch.reward_penalty.double() * v[..., None]).sum(0)
    return team, ind, pen


def _type_key(group_ids: Tensor, type_ids: Tensor, n_types: int, inner: str) -> Tensor:
    """Group key ``[E, N]`` of the individual channel: group x type (or the group)."""
    if inner == "type":
        return group_ids[:, None] * n_types + type_ids[None, :].to(group_ids.device)
    if inner == "batch":
        return group_ids[:, None].expand(-1, type_ids.numel())
    raise ValueError(f"inner must be one of {_GRPO_INNER}, got {inner!r}")


def _check_alpha(alpha: float) -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise TypeError(f"alpha must be a float in [0, 1], got {type(alpha).__name__}")
    if not 0.0 <= float(alpha) <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    return float(alpha)


def _check_ids(group_ids: Tensor, type_ids: Tensor, E: int, N: int) -> None:
    for name, ids, n in (("group_ids", group_ids, E), ("type_ids", type_ids, N)):
        if not isinstance(ids, Tensor) or ids.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{name} must be an integer tensor")
        if tuple(ids.shape) != (n,):
            raise ValueError(f"{name} must have shape ({n},), got {tuple(ids.shape)}")


def zero_signal_groups(
    team_adv: Tensor, individual_adv: Tensor, group_ids: Tensor, alpha: float, num_groups: int
) -> Tensor:
    """Groups whose mixed advantage carries no signal: bool ``[num_groups]``.

    A channel of a group has zero variance exactly when all its group-relative advantages
    are 0 (centred values of equal returns; for the process variant the sums from t are all
    0 only if every normalised step reward is). A group is zero-signal when every channel
    that enters the mix (team if alpha > 0, individual if alpha < 1) has zero variance.

    Args:
        team_adv: ``[E, ...]`` team-channel advantages, env dim first (0 at padding).
        individual_adv: ``[E, ...]`` individual-channel advantages, env dim first.
        group_ids: ``[E]`` long.
    """
    E = group_ids.numel()

    def channel_max(x: Tensor) -> Tensor:
        # max |x| per env (over time and agents), then per group: [num_groups]
        if x.shape[0] != E:
            raise ValueError(f"advantages must have the env dim first ({E}), got {tuple(x.shape)}")
        per_env = x.detach().abs().double().reshape(E, -1).amax(1)
        out = torch.zeros(num_groups, dtype=torch.float64, device=per_env.device)
        return out.scatter_reduce(0, group_ids.to(per_env.device), per_env, "amax")

    zero = torch.ones(num_groups, dtype=torch.bool, device=group_ids.device)
    if alpha > 0.0:
        zero &= (channel_max(team_adv) == 0).to(zero.device)
    if alpha < 1.0:
        zero &= (channel_max(individual_adv) == 0).to(zero.device)
    return zero


def outcome_advantages(
    team_return: Tensor,
    individual_return: Tensor,
    group_ids: Tensor,
    type_ids: Tensor,
    *,
    alpha: float = 0.5,
    scale_std: bool = True,
    leave_one_out: bool = False,
    inner: str = "type",
    eps: float = 1e-8,
) -> tuple[Tensor, dict[str, Any]]:
    """GRPO outcome advantages per agent-episode.

    Args:
        team_return: ``[E]`` float, the team return of each episode.
        individual_return: ``[E, N]`` float, each agent's individual return.
        group_ids: ``[E]`` long, the group (reset seed) of each episode.
        type_ids: ``[N]`` long, the agent type of each agent.
        alpha: team weight of the mix.
        scale_std: divide by the group std (False: Dr. GRPO, centre only).
        leave_one_out: RLOO baseline (``marl.core.advantages.group_relative_advantages``).
        inner: ``"type"``: individual returns grouped by group x agent type; ``"batch"``: by
            group only.
        eps: added to the std.

    Returns:
        ``(advantages [E, N], info)`` with info keys ``team [E]``, ``individual [E, N]``
        (the per-channel advantages), ``frac_zero_std_team``, ``frac_zero_std_individual``
        (from the library), ``zero_groups`` (bool ``[P]``, see :func:`zero_signal_groups`)
        and ``frac_zero_std`` (its mean).
    """
    alpha = _check_alpha(alpha)
    if team_return.dim() != 1 or individual_return.dim() != 2:
        raise ValueError(
            f"team_return must be [E] and individual_return [E, N], got "
            f"{tuple(team_return.shape)} and {tuple(individual_return.shape)}"
        )
    E, N = individual_return.shape
    if team_return.shape[0] != E:
        raise ValueError(f"team_return has {team_return.shape[0]} episodes, individual_return {E}")
    _check_ids(group_ids, type_ids, E, N)
    n_types = int(type_ids.max()) + 1
    team_adv, frac_team = group_relative_advantages(
        team_return, group_ids, scale_std=scale_std, leave_one_out=leave_one_out, eps=eps
    )
    key = _type_key(group_ids, type_ids, n_types, inner)
    ind_adv, frac_ind = group_relative_advantages(
        individual_return, key, scale_std=scale_std, leave_one_out=leave_one_out, eps=eps
    )
    team_b = team_adv[:, None].expand(E, N)
    mixed = alpha * team_b + (1.0 - alpha) * ind_adv
    P = int(group_ids.max()) + 1
    zero = zero_signal_groups(team_b, ind_adv, group_ids, alpha, P)
    info = {
        "team": team_adv,
        "individual": ind_adv,
        "frac_zero_std_team": frac_team,
        "frac_zero_std_individual": frac_ind,
        "zero_groups": zero,
        "frac_zero_std": float(zero.double().mean()),
    }
    return mixed, info


def process_step_advantages(
    team_rewards: Tensor,
    individual_rewards: Tensor,
    valid: Tensor,
    group_ids: Tensor,
    type_ids: Tensor,
    *,
    alpha: float = 0.5,
    scale_std: bool = True,
    inner: str = "type",
    eps: float = 1e-8,
) -> tuple[Tensor, dict[str, Any]]:
    """GRPO process-supervision advantages per agent-step.

    Args:
        team_rewards: ``[T, E]`` team step rewards.
        individual_rewards: ``[T, E, N]`` individual step rewards.
        valid: ``[T, E]`` bool, the env was running at step t.
        group_ids: ``[E]`` long; type_ids: ``[N]`` long; alpha, scale_std, inner, eps as in
            :func:`outcome_advantages`.

    Returns:
        ``(advantages [T, E, N], info)`` (0 at invalid steps); info as in
        :func:`outcome_advantages` with per-channel ``team [T, E]``, ``individual [T, E, N]``.
    """
    alpha = _check_alpha(alpha)
    if team_rewards.dim() != 2 or individual_rewards.dim() != 3:
        raise ValueError(
            f"team_rewards must be [T, E] and individual_rewards [T, E, N], got "
            f"{tuple(team_rewards.shape)} and {tuple(individual_rewards.shape)}"
        )
    T, E, N = individual_rewards.shape
    if tuple(team_rewards.shape) != (T, E) or tuple(valid.shape) != (T, E):
        raise ValueError(
            f"team_rewards {tuple(team_rewards.shape)} and valid {tuple(valid.shape)} must be "
            f"({T}, {E}) like individual_rewards' first two dims"
        )
    _check_ids(group_ids, type_ids, E, N)
    n_types = int(type_ids.max()) + 1
    team_adv, frac_team = process_advantages(
        team_rewards, valid, group_ids, scale_std=scale_std, eps=eps
    )
    key = _type_key(group_ids, type_ids, n_types, inner).reshape(E * N)
    ind_adv, frac_ind = process_advantages(
        individual_rewards.reshape(T, E * N),
        valid[:, :, None].expand(T, E, N).reshape(T, E * N),
        key,
        scale_std=scale_std,
        eps=eps,
    )
    ind_adv = ind_adv.reshape(T, E, N)
    team_b = team_adv[:, :, None].expand(T, E, N)
    mixed = alpha * team_b + (1.0 - alpha) * ind_adv
    P = int(group_ids.max()) + 1
    zero = zero_signal_groups(
        team_adv.transpose(0, 1), ind_adv.transpose(0, 1), group_ids, alpha, P
    )
    info = {
        "team": team_adv,
        "individual": ind_adv,
        "frac_zero_std_team": frac_team,
        "frac_zero_std_individual": frac_ind,
        "zero_groups": zero,
        "frac_zero_std": float(zero.double().mean()),
    }
    return mixed, info


def grpo_advantages(
    batch: GroupBatch,
    type_ids: Tensor,
    *,
    variant: str = "outcome",
    alpha: float = 0.5,
    scale_std: bool = True,
    leave_one_out: bool = False,
    inner: str = "type",
    penalty_channel: str = "individual",
    penalty_shaping: bool = False,
    eps: float = 1e-8,
) -> tuple[Tensor, dict[str, Any]]:
    """Advantages ``[T, E, N]`` of a :class:`GroupBatch` (0 at invalid steps), before the
    optional second-stage whitening and the penalty shaping.

    ``penalty_shaping=False``: the penalty channel is added to the individual one when
    ``penalty_channel == 'individual'`` (dropped for ``'none'``). ``penalty_shaping=True``:
    the penalty channel is kept apart and ``info["penalty"]`` holds the normalised penalty
    cost ``[T, E, N]``: ``-reward_penalty`` normalised within group x type (outcome: episode
    sums, broadcast; process: step costs normalised and summed from t). The caller shapes
    ``A - beta(t) * info["penalty"]`` (``marl.core.advantages.shape_with_penalty``).

    Returns ``(adv [T, E, N], info)``; info as :func:`outcome_advantages` plus ``raw`` (the
    mixed raw returns broadcast to valid steps, for "before whitening" statistics).
    """
    if variant not in ("outcome", "process"):
        raise ValueError(f"variant must be 'outcome' or 'process', got {variant!r}")
    if penalty_channel not in ("individual", "none"):
        raise ValueError(f"penalty_channel must be 'individual' or 'none', got {penalty_channel!r}")
    T, E = batch.num_steps, batch.num_envs
    N = type_ids.numel()
    valid = batch.valid
    shaping = bool(penalty_shaping)
    fold_penalty = not shaping and penalty_channel == "individual"
    vmask = valid[:, :, None].expand(T, E, N)
    team_ret, ind_ret, pen_ret = episode_returns(batch)
    if fold_penalty:
        ind_ret = ind_ret + pen_ret
    raw = alpha * team_ret[:, None] + (1.0 - alpha) * ind_ret  # [E, N]
    raw = torch.where(vmask, raw[None].expand(T, E, N), torch.zeros((), dtype=raw.dtype))
    if variant == "outcome":
        adv_ep, info = outcome_advantages(
            team_ret,
            ind_ret,
            batch.group_ids,
            type_ids,
            alpha=alpha,
            scale_std=scale_std,
            leave_one_out=leave_one_out,
            inner=inner,
            eps=eps,
        )
        adv = torch.where(vmask, adv_ep[None].expand(T, E, N), torch.zeros((), dtype=adv_ep.dtype))
    else:
        if leave_one_out:
            raise ValueError("leave_one_out applies to the outcome variant only")
        r_ind = batch.reward_individual.double()
        if fold_penalty:
            r_ind = r_ind + batch.reward_penalty.double()
        adv, info = process_step_advantages(
            batch.reward_team.double(),
            r_ind,
            valid,
            batch.group_ids,
            type_ids,
            alpha=alpha,
            scale_std=scale_std,
            inner=inner,
            eps=eps,
        )
    info["raw"] = raw.float()
    adv = adv.float()
    if shaping:
        n_types = int(type_ids.max()) + 1
        key = _type_key(batch.group_ids, type_ids, n_types, inner)
        if variant == "outcome":
            cost, _ = group_relative_advantages(-pen_ret, key, eps=eps)
            cost = torch.where(vmask, cost[None].expand(T, E, N), torch.zeros((), dtype=cost.dtype))
        else:
            cost, _ = process_advantages(
                -batch.reward_penalty.double().reshape(T, E * N),
                vmask.reshape(T, E * N),
                key.reshape(E * N),
                eps=eps,
            )
            cost = cost.reshape(T, E, N)
        info["penalty"] = cost.float()
    return adv, info
