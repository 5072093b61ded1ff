"""MAPPO for S seeds at once: S independent runs batched through one rollout and one update.

``python -m marl.train --seeds 0-15`` (:mod:`marl.run.train_seeds`) trains with this. Each seed
``k`` is a whole :class:`~marl.algos.mappo.MAPPO` run (``self.runs[k]``: its config, env,
whitener, ValueNorm, penalty schedule, advantages and metrics are that run's own), and the
expensive parts run for all seeds together on stacked modules (a leading seed axis,
:mod:`marl.models.seed_policies`):

- the rollout: :class:`marl.rollout.seed_collect.SeedRolloutCollector` steps every seed's envs and
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

The policy epochs are :class:`marl.algos.ppo.PolicyUpdate`'s and the value epochs
:class:`marl.algos.value_update.ValueUpdate`'s: the same update a single run (a batch of one)
trains with. Not batched over seeds: distributed training (torchrun) is refused with
``--seeds``; ``parallel_update`` runs the value epochs beside the policy epochs (the agent
types' actors run in turn).
"""

from __future__ import annotations

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
)
from marl.algos.value_update import ValueTargets, ValueUpdate
from marl.core.losses import NonFiniteError, linear_schedule
from marl.rollout.seed_collect import SeedRolloutBatch, SeedRolloutCollector

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
        #: the value update of every seed at once (each run's critic is its slice)
        self.value_update = ValueUpdate.from_config([r.critic for r in self.runs], self.cfg)
        self.critic = self.value_update.stack
        self.critic_views = self.value_update.views
        self.critic_opt = self.value_update.optimizer
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
            if self.runs[k].offset is not None:
                row["optimism_offset"] = float(self.runs[k].offset.b.detach())
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
        S = self.num_seeds
        T, E, N = batch.num_steps, batch.num_envs, self.layout.n_agents
        M = T * E
        targets_team, targets_ind, ev = [], [], []
        for k, (run, adv) in enumerate(zip(self.runs, advs, strict=True)):
            if adv is None:  # a stopped seed: targets equal to its old values (no loss)
                targets_team.append(batch.values_team[k].reshape(M, -1))
                targets_ind.append(batch.values_individual[k].reshape(M, N, -1))
                ev.append(float("nan"))
                continue
            ev.append(adv.explained_variance())
            team, ind = run.value_targets(adv)
            targets_team.append(team.reshape(M, -1))
            targets_ind.append(ind.reshape(M, N, -1))
        data = ValueTargets(
            batch.state.reshape(S, M, -1),
            batch.values_team.reshape(S, M, -1),
            batch.values_individual.reshape(S, M, N, -1),
            torch.stack(targets_team),
            torch.stack(targets_ind),
            None if batch.active is None else batch.active.reshape(S, M, N, 1),
        )
        training = [self.training(k) for k in range(S)]
        metrics, stops = self.value_update.epochs_of_minibatches(data, orders, training)
        metrics["explained_variance"] = torch.tensor(ev)
        return metrics, stops

    # -- the runs' own state ---------------------------------------------------------------
    def sync(self, k: int) -> MAPPO:
        """Seed k's run brought up to date with the stack (policy, critic, optimisers)."""
        run = super().sync(k)  # its critic is seed k's slice of the stack already
        run.critic_opt.load_state_dict(self.critic_views.seed_state_dict(self.critic_opt, k))
        return run

    def seed_state_dict(self, k: int) -> dict[str, Any]:
        state = super().seed_state_dict(k)
        state["collector"] = self.collector.seed_state_dict(k)
        return state

    def load_seed_state(self, k: int, state: dict[str, Any], torch_rng: Tensor) -> None:
        super().load_seed_state(k, state, torch_rng)
        run = self.runs[k]
        load_views_state(self.critic_opt, self.critic_views.per_seed[k], run.critic_opt)
        self.collector.load_seed_state_dict(k, state["collector"], vec=run.collector.vec)
