"""MAPPO for S seeds at once: S independent runs batched through one rollout and one update.

``python -m marl.train --seeds 0-15`` (:mod:`marl.run.train_seeds`) trains with this. Each seed
``k`` is a whole :class:`~marl.algos.mappo.MAPPO` run (``self.runs[k]``: its config, env,
whitener, ValueNorm, penalty schedule, advantages and metrics are that run's own), and the
expensive parts run for all seeds together on stacked modules (a leading seed axis,
:mod:`marl.seed_policies`):

- the rollout: :class:`marl.seed_collect.SeedRolloutCollector` steps every seed's envs and
  runs every seed's actor and critic in one batched call per step;
- the update, which reads as :meth:`MAPPO.update`::

      advantages, whitening and metrics      per seed (runs[k].advantages: one run's code)
      epochs of minibatches (per-seed permutations, drawn from seed k's generator):
          loss per seed [S]                   (ClipPPOObjective with a per-seed count)
          zero_grad; loss.sum().backward()    (seed k's parameters get seed k's gradient)
          clip_grad_norm_per_seed_            (each seed by its own norm, never the stack's)
          optimizer.step()                    (a stock Adam over per-seed views: each seed's
                                               step count and moments are its own)
      value epochs: the same, on the stacked critic

Independence, equality and stopping: :mod:`marl.algos.seeds` (the shared part). The
critic's values, ValueNorm and the value loss are per seed like everything else.

Not batched here: distributed training (torchrun), the optimism offset and truncated BPTT
(``tbptt_chunk``) are refused with ``--seeds``; ``parallel_update`` runs the value epochs
beside the policy epochs (the agent types' actors run in turn).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from marl.algos.mappo import MAPPO, MAPPOAdvantages, MAPPOConfig
from marl.algos.parallel import side_by_side
from marl.algos.ppo import PPOLossConfig
from marl.algos.seeds import (
    SeedBatch,
    SeedMinibatch,
    load_views_state,
    ordered_views,
    per_seed_adam,
    take_rows,
)
from marl.core.losses import NonFiniteError, explained_variance, linear_schedule, value_loss
from marl.seed_collect import SeedRolloutBatch, SeedRolloutCollector
from marl.seed_policies import SeedCentralCritic

__all__ = ["SeedMAPPO"]


class SeedMAPPO(SeedBatch):
    """S MAPPO runs (``cfgs[k]``: seed k's config, equal but for ``seed`` and ``run_dir``;
    ``algorithm``: MAPPO or a subclass, e.g. one of docs/extending.md's) trained in one
    process; see the module docstring."""

    def __init__(
        self,
        cfgs: Sequence[MAPPOConfig],
        device: torch.device | str = "cpu",
        algorithm: type[MAPPO] = MAPPO,
    ) -> None:
        super().__init__(algorithm, cfgs, device)
        first = self.runs[0]
        self.critic = SeedCentralCritic([r.critic for r in self.runs]).to(self.device)
        self.critic_views = ordered_views(
            self.critic, self.critic.single_seed_names(), first.critic
        )
        self.critic_opt = per_seed_adam(self.critic_views, self.cfg.resolved_critic_lr)
        self.collector = SeedRolloutCollector(
            [r.vec for r in self.runs],
            self.layout,
            self.policy,
            seeds=self.seeds,
            generators=self.generators,
            device=self.device,
        )

    # -- one iteration ---------------------------------------------------------------------
    def iteration(self, progress: float | Sequence[float]) -> list[dict[str, float]]:
        """One rollout of ``T x E`` env steps per seed and the update on it (``progress[k]``:
        seed k's budget progress); returns each seed's metrics ({} for a seed that no longer
        trains)."""
        progress = self.per_seed(progress)
        t0 = time.perf_counter()
        self.policy.eval()
        try:
            batch = self.collector.collect(
                self.cfg.rollout_steps,
                value_fn=self.values,
                window_state_steps=self.runs[0].window_starts,
                reuse_buffers=True,
            )
        finally:
            self.policy.train()
        t_collect = time.perf_counter() - t0
        metrics = self.update(batch, progress)
        t_update = time.perf_counter() - t0 - t_collect
        for row in metrics:
            if row:
                row["time/collect_s"] = t_collect
                row["time/update_s"] = t_update
                row["env_steps_delta"] = float(batch.num_steps * batch.num_envs)
        return metrics

    @torch.no_grad()
    def values(self, state: Tensor) -> tuple[Tensor, Tensor]:
        """``state [S, M, D_s]`` -> critic outputs ``[S, M, K]``, ``[S, M, N, K]``."""
        return self.critic(state)

    def update(self, batch: SeedRolloutBatch, progress: Sequence[float]) -> list[dict[str, float]]:
        """Advantages per seed (``runs[k].advantages``: one run's code), then the policy
        epochs and the value epochs of every seed, side by side with ``parallel_update``."""
        cfg, S = self.cfg, self.num_seeds
        advs: list[MAPPOAdvantages | None] = []
        metrics: list[dict[str, float]] = []
        for k, run in enumerate(self.runs):
            adv = None
            if self.training(k):
                try:
                    adv = run.advantages(batch.seed(k), progress[k])
                except NonFiniteError as exc:
                    self._stop(k, exc.quantity)
            advs.append(adv)
            metrics.append({} if adv is None else run.advantage_metrics(adv))
        rates = self.set_lr(self.policy_opt, cfg.lr, progress)
        self.set_lr(self.critic_opt, cfg.resolved_critic_lr, progress)
        coefs = [
            PPOLossConfig(cfg.clip_low, cfg.clip_high, cfg.dual_clip,
                          linear_schedule(cfg.ent_coef, cfg.ent_coef_final, p))
            for p in progress
        ]  # fmt: skip
        units = self.policy_units(batch, advs)
        # each seed draws what its single-seed run draws, in its order: the critic's
        # minibatch orders, then one permutation of the policy's units per epoch
        M, U = batch.num_steps * batch.num_envs, next(iter(units.values())).num_units
        value_orders, policy_orders = [], []
        for g in self.generators:
            value_orders.append([torch.randperm(M, generator=g) for _ in range(self.value_epochs)])
            policy_orders.append([torch.randperm(U, generator=g) for _ in range(cfg.epochs)])
        policy_orders_t = [torch.stack([o[e] for o in policy_orders]) for e in range(cfg.epochs)]
        value_orders_t = [
            torch.stack([o[e] for o in value_orders]) for e in range(self.value_epochs)
        ]
        (policy_metrics, policy_stops), (value_metrics, value_stops) = side_by_side(
            [
                lambda: self.policy_epochs(units, coefs, policy_orders_t),
                lambda: self.value_epochs_run(batch, advs, value_orders_t),
            ],
            parallel=bool(cfg.parallel_update),
        )
        for k, reason in sorted({**value_stops, **policy_stops}.items()):
            self._stop(k, reason)
        for k in range(S):
            if not self.training(k):
                metrics[k] = {}
                continue
            row = metrics[k]
            row.update({key: float(v[k]) for key, v in policy_metrics.items()})
            row.update({key: float(v[k]) for key, v in value_metrics.items()})
            row["lr"] = rates[k]
            row["ent_coef"] = float(coefs[k].ent_coef)
            episodes = batch.episodes[k]
            if episodes:
                for key in episodes[0]:
                    row[f"episode/{key}"] = float(np.mean([e[key] for e in episodes]))
            row["episodes"] = float(len(episodes))
        return metrics

    @property
    def value_epochs(self) -> int:
        return self.cfg.resolved_value_epochs

    # -- policy ----------------------------------------------------------------------------
    def policy_units(
        self, batch: SeedRolloutBatch, advs: Sequence[MAPPOAdvantages | None]
    ) -> dict[str, SeedMinibatch]:
        """Every seed's units (:meth:`MAPPO.policy_units`), stacked per agent type; a seed
        that no longer trains gets zero advantages (its steps are masked out of the update)."""
        per_seed = []
        for k, (run, adv) in enumerate(zip(self.runs, advs, strict=True)):
            one = batch.seed(k)
            final = adv.final if adv is not None else torch.zeros_like(one.reward_individual)
            per_seed.append(run.policy_units(one, final))
        return {
            name: SeedMinibatch.stack([units[name] for units in per_seed]) for name in per_seed[0]
        }

    # -- critic ----------------------------------------------------------------------------
    def value_epochs_run(
        self,
        batch: SeedRolloutBatch,
        advs: Sequence[MAPPOAdvantages | None],
        orders: list[Tensor],
    ) -> tuple[dict[str, Tensor], dict[int, str]]:
        """ValueNorm update per seed, then one value epoch per ``orders[e] [S, T * E]`` on the
        stacked critic (:meth:`MAPPO.update_critic` for every seed); metrics ``[S]`` and the
        seeds that stopped (index -> why)."""
        cfg, S = self.cfg, self.num_seeds
        T, E, N = batch.num_steps, batch.num_envs, self.layout.n_agents
        M = T * E
        targets_team, targets_ind, ev = [], [], []
        for k, (run, adv) in enumerate(zip(self.runs, advs, strict=True)):
            if adv is None:  # a stopped seed: targets equal to its old values (no loss)
                targets_team.append(batch.values_team[k].reshape(M, -1))
                targets_ind.append(batch.values_individual[k].reshape(M, N, -1))
                ev.append(float("nan"))
                continue
            ev.append(_explained_variance(adv))
            if run.value_norm_team is not None:
                run.value_norm_team.update(adv.returns_team.reshape(-1, 1))
                run.value_norm_ind.update(adv.returns_individual.transpose(-1, -2).reshape(-1, N))
            team, ind = run._normalize(adv.returns_team, adv.returns_individual)
            targets_team.append(team.reshape(M, -1))
            targets_ind.append(ind.reshape(M, N, -1))
        target_team, target_ind = torch.stack(targets_team), torch.stack(targets_ind)
        K = target_team.shape[-1]
        # contiguous once (the rollout's seed blocks are padded for alignment), so that each
        # minibatch's rows are one index_select, not a copy of the whole rollout
        states = batch.state.reshape(S, M, -1).contiguous()
        old_team = batch.values_team.reshape(S, M, K).contiguous()
        old_ind = batch.values_individual.reshape(S, M, N, K).contiguous()
        active = None if batch.active is None else batch.active.reshape(S, M, N, 1)
        size = max(1, math.ceil(M / cfg.num_minibatches))
        total = torch.zeros(S)
        grad_norms = torch.zeros(S)
        steps, stops = 0, {}
        for order in orders:
            for start in range(0, M, size):
                idx = order[:, start : start + size].to(self.device)
                pred_team, pred_ind = self.critic(take_rows(states, idx))
                loss = value_loss(
                    pred_team,
                    take_rows(old_team, idx),
                    take_rows(target_team, idx),
                    value_clip=cfg.value_clip,
                    runs=S,
                ) + value_loss(
                    pred_ind,
                    take_rows(old_ind, idx),
                    take_rows(target_ind, idx),
                    value_clip=cfg.value_clip,
                    mask=None if active is None else take_rows(active, idx),
                    runs=S,
                )
                self.critic_views.zero_grad()
                loss.sum().backward()
                norms = self.step_seeds(self.critic_views, self.critic_opt, loss, "value", stops)
                grad_norms += norms.cpu()
                total += loss.detach().cpu()
                steps += 1
        metrics = {
            "loss/value": total / max(steps, 1),
            "value_grad_norm": grad_norms / max(steps, 1),
            "explained_variance": torch.tensor(ev),
        }
        return metrics, stops

    # -- the runs' own state ---------------------------------------------------------------
    def sync(self, k: int) -> MAPPO:
        """Seed k's run brought up to date with the stack (policy, critic, optimisers)."""
        run = super().sync(k)
        run.critic.load_state_dict(self.critic.seed_state_dict(k))
        run.critic_opt.load_state_dict(self.critic_views.seed_state_dict(self.critic_opt, k))
        return run

    def seed_state_dict(self, k: int) -> dict[str, Any]:
        state = super().seed_state_dict(k)
        state["collector"] = self.collector.seed_state_dict(k)
        return state

    def load_seed_state(self, k: int, state: dict[str, Any], torch_rng: Tensor) -> None:
        super().load_seed_state(k, state, torch_rng)
        run = self.runs[k]
        with torch.no_grad():
            for view, p in zip(self.critic_views.per_seed[k], run.critic.parameters(), strict=True):
                view.copy_(p)
        load_views_state(self.critic_opt, self.critic_views.per_seed[k], run.critic_opt)
        self.collector.load_seed_state_dict(k, state["collector"], vec=run.collector.vec)


def _explained_variance(adv: MAPPOAdvantages) -> float:
    """:meth:`MAPPO.update_critic`'s explained variance of one seed."""
    return explained_variance(
        torch.cat(
            [adv.values_team.mean(-1).reshape(-1), adv.values_individual.mean(-1).reshape(-1)]
        ),
        torch.cat(
            [adv.returns_team.mean(-1).reshape(-1), adv.returns_individual.mean(-1).reshape(-1)]
        ),
    )
