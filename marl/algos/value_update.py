"""The value update of MAPPO's centralised critic, for S runs at once (one run: S = 1).

:meth:`marl.algos.mappo.SeedMAPPO.value_epochs_run` (S runs; a plain run is a batch of one)
ends here, as the policy's side ends in :class:`marl.algos.ppo.PolicyUpdate`. Each value
epoch, per minibatch::

    pred = critic(states)                              [S, b, G * K], [S, b, N, K]
    loss = value_loss(team) + value_loss(individual)   [S]: each run's (clipped) mean
    optimizer.zero_grad(); loss.sum().backward()       (run k's parameters get d loss[k])
    average_gradients (distributed, one run per rank)
    clip each run's gradients by its own norm; optimizer.step()

Each run's critic is its slice of the stack (its parameters are views of the stacked ones),
and the optimizer is a stock Adam with one param group per run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from marl.algos.ppo import alias_parameters, take_rows
from marl.core.losses import value_loss
from marl.core.seed_batched import SeedViews, clip_grad_norm_per_seed_
from marl.models.critics import CentralCritic, GroupedCritic
from marl.models.seed_policies import stack_critics
from marl.run.distributed import DistContext, average_gradients

__all__ = ["ValueTargets", "ValueUpdate"]


class ValueTargets:
    """One rollout's value-update data of S runs (``M = T * E`` states each): ``states [S,
    M, D_s]``, the critic's old outputs ``old_team [S, M, G * K]`` and ``old_ind [S, M, N, K]``,
    the (normalised) targets of the same shapes, and ``active [S, M, N, 1]`` bool (None:
    every agent counts)."""

    def __init__(
        self,
        states: Tensor,
        old_team: Tensor,
        old_ind: Tensor,
        target_team: Tensor,
        target_ind: Tensor,
        active: Tensor | None = None,
    ) -> None:
        # contiguous once, so that each minibatch's rows are one index_select
        self.states = states.contiguous()
        self.old_team, self.old_ind = old_team.contiguous(), old_ind.contiguous()
        self.target_team, self.target_ind = target_team.contiguous(), target_ind.contiguous()
        self.active = active

    @property
    def num_states(self) -> int:
        return int(self.states.shape[1])


class ValueUpdate:
    """Adam on S runs' critics (:class:`CentralCritic` or :class:`GroupedCritic`, stacked)
    and their value epochs (see the module docstring)."""

    def __init__(
        self,
        critic: CentralCritic | GroupedCritic | Sequence[CentralCritic | GroupedCritic],
        *,
        lr: float,
        num_minibatches: int,
        max_grad_norm: float | None,
        value_clip: float | None,
        ctx: DistContext | None = None,
    ) -> None:
        self.critics = [critic] if isinstance(critic, torch.nn.Module) else list(critic)
        self.num_runs = len(self.critics)
        self.ctx = ctx
        self.distributed = ctx is not None and ctx.enabled
        if self.distributed and self.num_runs > 1:
            raise ValueError(f"distributed training updates one run, got {self.num_runs}")
        self.num_minibatches, self.max_grad_norm = num_minibatches, max_grad_norm
        self.value_clip = value_clip
        #: the runs' critics stacked: ``[S, ...]`` parameters
        self.stack = stack_critics(self.critics)
        names = {one: stacked for stacked, one in self.stack.single_seed_names().items()}
        stacked = dict(self.stack.named_parameters())
        self.views = SeedViews([stacked[names[n]] for n, _ in self.critics[0].named_parameters()])
        for critic_k, views_k in zip(self.critics, self.views.per_seed, strict=True):
            alias_parameters(critic_k, views_k)  # run k's critic is its slice of the stack
        groups = [{"params": list(views_k)} for views_k in self.views.per_seed]
        self.optimizer = torch.optim.Adam(groups, lr=lr, eps=1e-5, fused=True)

    @classmethod
    def from_config(
        cls,
        critic: CentralCritic | GroupedCritic | Sequence[CentralCritic | GroupedCritic],
        cfg: Any,
        *,
        ctx: DistContext | None = None,
    ) -> ValueUpdate:
        """The value update a MAPPO config asks for: the critic's learning rate, the
        minibatches, the gradient clip and the value clip."""
        return cls(
            critic,
            lr=cfg.resolved_critic_lr,
            num_minibatches=cfg.num_minibatches,
            max_grad_norm=cfg.max_grad_norm,
            value_clip=cfg.value_clip,
            ctx=ctx,
        )

    def set_lr(self, lr: float | Sequence[float]) -> None:
        """Every run's learning rate (a number), or run k's ``lr[k]``."""
        rates = [lr] * self.num_runs if isinstance(lr, (int, float)) else list(lr)
        for group, rate in zip(self.optimizer.param_groups, rates, strict=True):
            group["lr"] = float(rate)

    def epochs_of_minibatches(
        self,
        data: ValueTargets,
        orders: Sequence[Tensor],
        training: Sequence[bool] | None = None,
    ) -> tuple[dict[str, Tensor], dict[int, str]]:
        """One value epoch per ``orders[e] [S, M]`` (run s's permutation of its states; runs
        not ``training`` are left as they are); returns ``loss/value`` and
        ``value_grad_norm``, each run's mean over the minibatches ``[S]``, and the runs that
        stopped (index -> the quantity that turned non-finite)."""
        M, S = data.num_states, self.num_runs
        size = max(1, math.ceil(M / self.num_minibatches))
        total, grad_norms = torch.zeros(S), torch.zeros(S)
        steps, stops = 0, {}
        for order in orders:
            for start in range(0, M, size):
                idx = order[:, start : start + size].to(data.states.device)
                loss, norms = self.minibatch_step(data, idx, stops, training)
                total += loss.cpu()
                grad_norms += norms.cpu()
                steps += 1
        metrics = {
            "loss/value": total / max(steps, 1),
            "value_grad_norm": grad_norms / max(steps, 1),
        }
        return metrics, stops

    def minibatch_step(
        self,
        data: ValueTargets,
        idx: Tensor,
        stops: dict[int, str],
        training: Sequence[bool] | None = None,
    ) -> tuple[Tensor, Tensor]:
        """One optimiser step of every run on its states ``idx [S, b]``; returns the loss and
        the gradient norm before clipping, ``[S]`` each."""
        S = self.num_runs
        pred_team, pred_ind = self.stack(take_rows(data.states, idx))
        active = None if data.active is None else take_rows(data.active, idx)
        loss = value_loss(
            pred_team,
            take_rows(data.old_team, idx),
            take_rows(data.target_team, idx),
            value_clip=self.value_clip,
            runs=S,
        ) + value_loss(
            pred_ind,
            take_rows(data.old_ind, idx),
            take_rows(data.target_ind, idx),
            value_clip=self.value_clip,
            mask=active,
            runs=S,
        )
        self.views.zero_grad()
        loss.sum().backward()  # run k's parameters receive d loss[k]
        if self.distributed:
            average_gradients(self.views.stacked, self.ctx, weight=float(idx.shape[1]))
        norms = clip_grad_norm_per_seed_(self.views.stacked, self.max_grad_norm)
        finite = (torch.isfinite(loss.detach()) & torch.isfinite(norms)).cpu()
        steps = []
        for k in range(S):
            if (training is None or training[k]) and k not in stops and not finite[k]:
                stops[k] = ("loss" if not torch.isfinite(loss[k]) else "grad_norm") + " (value)"
            steps.append((training is None or training[k]) and k not in stops)
        self.views.attach_grads(steps)
        self.optimizer.step()
        return loss.detach(), norms.detach()
