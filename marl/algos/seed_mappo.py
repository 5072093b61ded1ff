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

Independence: nothing of seed k depends on another seed. Parameter init, env seeds and the
random draws (rollout noise, minibatch orders) come from seed k's run seed and its own
generator, which continues where a single-seed run's global generator stands; statistics
(whitening, ValueNorm, every metric) are computed by seed k's own ``MAPPO`` object; every
batched operation is a per-seed GEMM or a row-wise / elementwise operation whose bits do not
depend on S, so at one torch thread seed k inside ``--seeds 0-15`` equals ``--seeds k`` bit
for bit (tests/test_seed_mappo.py). Against a plain ``--seed k`` run it agrees to float32
rounding (batched GEMMs in place of ``addmm``, per-seed sums): the test pins the first
updates' parameters to a tolerance, not bits.

A seed whose loss, gradient norm or advantages turn non-finite stops (:attr:`stopped` says
why): its parameters and optimiser state stay as they were before that step, the others go on.

Not batched here: distributed training (torchrun), the optimism offset and truncated BPTT
(``tbptt_chunk``) are refused with ``--seeds``; ``parallel_update`` runs the value epochs
beside the policy epochs (the agent types' actors run in turn).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor

from marl.algos.base import ConfigError
from marl.algos.mappo import MAPPO, MAPPOAdvantages, MAPPOConfig
from marl.algos.parallel import side_by_side
from marl.algos.ppo import Minibatch, PPOLossConfig
from marl.core.losses import NonFiniteError, explained_variance, linear_schedule
from marl.core.seed_batched import SeedViews, clip_grad_norm_per_seed_
from marl.seed_collect import SeedRolloutBatch, SeedRolloutCollector
from marl.seed_policies import SeedCentralCritic, SeedMultiAgentPolicy

__all__ = ["SeedMinibatch", "SeedMAPPO", "unsupported_with_seeds"]


@dataclass
class SeedMinibatch(Minibatch):
    """:class:`Minibatch` with a leading seed axis on every field: ``obs [S, B, P + L, n, D]``,
    ``loss_mask [S, B, L]``, ``burn_in [S, B]``, the state a tuple of ``[S, B * n, ...]``.
    :meth:`select` takes each seed's own units, ``idx [S, b]``."""

    @property
    def num_units(self) -> int:
        return int(self.obs.shape[1])

    @property
    def n_agents(self) -> int:
        return int(self.obs.shape[3])

    @classmethod
    def stack(cls, per_seed: Sequence[Minibatch]) -> SeedMinibatch:
        """S single-seed minibatches of one shape -> one with the seed axis first."""

        def stacked(name: str) -> Any:
            values = [getattr(mb, name) for mb in per_seed]
            if values[0] is None:
                return None
            if name == "state":
                return tuple(torch.stack(parts) for parts in zip(*values, strict=True))
            return torch.stack(values)

        return cls(**{f.name: stacked(f.name) for f in fields(Minibatch)})

    def select(self, idx: Tensor) -> SeedMinibatch:
        """Seed s's units ``idx[s]`` (``idx [S, b]`` long) of every seed."""
        seeds = torch.arange(idx.shape[0], device=idx.device)[:, None]
        taken = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                taken[f.name] = None
            elif f.name == "state":
                n = self.n_agents
                rows = (idx[..., None] * n + torch.arange(n, device=idx.device)).flatten(1)
                taken[f.name] = tuple(s[seeds, rows] for s in value)
            else:
                taken[f.name] = value[seeds, idx]
        return replace(self, **taken)


def unsupported_with_seeds(cfg: Any, *, distributed: bool = False) -> list[str]:
    """The options of ``cfg`` that ``--seeds`` cannot train, each with why (empty: fine)."""
    problems = []
    if cfg.algo != "mappo":
        problems.append(f"--algo {cfg.algo}: --seeds trains MAPPO only so far (not yet GRPO)")
    if distributed:
        problems.append("torchrun: --seeds runs in one process (not distributed)")
    if getattr(cfg, "optimism_offset", None) is not None:
        problems.append("--optimism-offset: not batched over seeds (leave it unset)")
    if getattr(cfg, "tbptt_chunk", None) is not None:
        problems.append("--tbptt-chunk: not batched over seeds (leave it unset)")
    return problems


def _ordered_views(stacked: torch.nn.Module, names: dict[str, str], single: torch.nn.Module):
    """:class:`SeedViews` over ``stacked``'s parameters in the order of the single-seed module
    ``single``'s parameters (``names``: stacked name -> single-seed name), so that seed k's
    views line up with a single-seed run's optimizer parameters."""
    by_single = {single_name: name for name, single_name in names.items()}
    params = dict(stacked.named_parameters())
    return SeedViews([params[by_single[name]] for name, _ in single.named_parameters()])


def _policy_names(policy: SeedMultiAgentPolicy) -> dict[str, str]:
    """Stacked parameter name -> the ``MultiAgentPolicy``'s name."""
    return {f"actors.{t}.{stacked}": f"actors.{t}.{single}"
            for t, actor in policy.actors.items()
            for stacked, single in actor.single_seed_names().items()}  # fmt: skip


class SeedMAPPO:
    """S MAPPO runs (``cfgs[k]``: seed k's config, equal but for ``seed`` and ``run_dir``)
    trained in one process; see the module docstring."""

    def __init__(self, cfgs: Sequence[MAPPOConfig], device: torch.device | str = "cpu") -> None:
        cfgs = list(cfgs)
        if not cfgs:
            raise ConfigError("--seeds must name at least one seed")
        problems = unsupported_with_seeds(cfgs[0])
        if problems:
            raise ConfigError("; ".join(problems))
        self.cfg, self.device = cfgs[0], torch.device(device)
        self.seeds = [int(c.seed) for c in cfgs]
        #: seed k's run: its own env, whitener, ValueNorm and single-seed modules (kept in
        #: step with the stack by :meth:`sync`, for evaluation and checkpoints)
        self.runs: list[MAPPO] = []
        generators = []
        for cfg in cfgs:
            with _forked_global_rngs():
                _seed_everything(cfg.seed)  # as marl.run.train seeds a single-seed run
                self.runs.append(MAPPO(cfg, None, self.device))
                generator = torch.Generator()
                generator.set_state(torch.get_rng_state())
                generators.append(generator)
        #: seed k's stand-in for the global generator a single-seed run draws from
        self.generators = generators
        first = self.runs[0]
        self.layout = first.layout
        self.policy = SeedMultiAgentPolicy([r.policy for r in self.runs]).to(self.device)
        self.critic = SeedCentralCritic([r.critic for r in self.runs]).to(self.device)
        self.policy_views = _ordered_views(self.policy, _policy_names(self.policy), first.policy)
        self.critic_views = _ordered_views(
            self.critic, self.critic.single_seed_names(), first.critic
        )
        self.policy_opt = torch.optim.Adam(
            self.policy_views.parameters(), lr=self.cfg.lr, eps=1e-5, fused=True
        )
        self.critic_opt = torch.optim.Adam(
            self.critic_views.parameters(), lr=self.cfg.resolved_critic_lr, eps=1e-5, fused=True
        )
        self.objective = first.objective_class()
        self.collector = SeedRolloutCollector(
            [r.vec for r in self.runs],
            self.layout,
            self.policy,
            seeds=self.seeds,
            generators=self.generators,
            device=self.device,
        )
        #: the quantity that turned non-finite and stopped seed k (None: it trains)
        self.stopped: list[str | None] = [None] * len(self.runs)

    @property
    def num_seeds(self) -> int:
        return len(self.runs)

    @property
    def live(self) -> Tensor:
        """``[S]`` bool: the seeds still training."""
        return torch.tensor([reason is None for reason in self.stopped])

    def _stop(self, k: int, reason: str) -> None:
        if self.stopped[k] is None:
            self.stopped[k] = reason

    # -- one iteration ---------------------------------------------------------------------
    def iteration(self, progress: float) -> list[dict[str, float]]:
        """One rollout of ``T x E`` env steps per seed and the update on it; returns each
        seed's metrics ({} for a seed that has stopped)."""
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

    def update(self, batch: SeedRolloutBatch, progress: float) -> list[dict[str, float]]:
        """Advantages per seed, then the policy epochs and the value epochs of every seed."""
        cfg, S = self.cfg, self.num_seeds
        advs: list[MAPPOAdvantages | None] = []
        metrics: list[dict[str, float]] = []
        for k, run in enumerate(self.runs):
            adv = None
            if self.stopped[k] is None:
                try:
                    adv = run.advantages(batch.seed(k), progress)
                except NonFiniteError as exc:
                    self._stop(k, exc.quantity)
            advs.append(adv)
            metrics.append({} if adv is None else run.advantage_metrics(adv))
        ent_coef = linear_schedule(cfg.ent_coef, cfg.ent_coef_final, progress)
        lr_scale = max(1.0 - progress, 0.0) if cfg.lr_schedule == "linear" else 1.0
        for group in self.policy_opt.param_groups:
            group["lr"] = cfg.lr * lr_scale
        for group in self.critic_opt.param_groups:
            group["lr"] = cfg.resolved_critic_lr * lr_scale
        units = self.policy_units(batch, advs)
        coef = PPOLossConfig(cfg.clip_low, cfg.clip_high, cfg.dual_clip, ent_coef)
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
                lambda: self.policy_epochs(units, coef, policy_orders_t),
                lambda: self.value_epochs_run(batch, advs, value_orders_t),
            ],
            parallel=bool(cfg.parallel_update),
        )
        for k, reason in sorted({**value_stops, **policy_stops}.items()):
            self._stop(k, reason)
        for k in range(S):
            if self.stopped[k] is not None:
                metrics[k] = {}
                continue
            row = metrics[k]
            row.update({key: float(v[k]) for key, v in policy_metrics.items()})
            row.update({key: float(v[k]) for key, v in value_metrics.items()})
            row["lr"] = cfg.lr * lr_scale
            row["ent_coef"] = ent_coef
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
        that has stopped gets zero advantages (its steps are masked out of the update)."""
        per_seed = []
        for k, (run, adv) in enumerate(zip(self.runs, advs, strict=True)):
            one = batch.seed(k)
            final = adv.final if adv is not None else torch.zeros_like(one.reward_individual)
            per_seed.append(run.policy_units(one, final))
        return {
            name: SeedMinibatch.stack([units[name] for units in per_seed]) for name in per_seed[0]
        }

    def policy_epochs(
        self, units: dict[str, SeedMinibatch], coef: PPOLossConfig, orders: list[Tensor]
    ) -> tuple[dict[str, Tensor], dict[int, str]]:
        """``epochs`` passes over every seed's minibatches (``orders[e] [S, U]``: seed s's
        permutation of its units in epoch e); returns each metric's mean over the
        minibatches, ``[S]``, and the seeds that stopped (index -> why)."""
        U = next(iter(units.values())).num_units
        size = max(1, math.ceil(U / self.cfg.num_minibatches))
        sums: dict[str, Tensor] = {}
        steps, stops = 0, {}
        for order in orders:
            for start in range(0, U, size):
                idx = order[:, start : start + size].to(self.device)
                batch = {name: mb.select(idx) for name, mb in units.items()}
                for key, value in self.policy_step(batch, coef, stops).items():
                    sums[key] = sums[key] + value if key in sums else value
                steps += 1
        return {key: value / max(steps, 1) for key, value in sums.items()}, stops

    def policy_step(
        self, batch: dict[str, SeedMinibatch], coef: PPOLossConfig, stops: dict[int, str]
    ) -> dict[str, Tensor]:
        """One optimiser step of every seed on its minibatch; returns the metrics ``[S]``
        (every term summed over the agent types, and ``grad_norm`` before clipping). A seed
        whose loss or gradient norm is not finite is added to ``stops`` and steps no more."""
        count = sum(mb.sample_mask().flatten(1).sum(1) for mb in batch.values())
        count = count.clamp_min(1).float()  # [S]: each seed's denominator
        self.policy_views.zero_grad()
        terms = {}
        loss = torch.zeros(self.num_seeds, device=self.device)
        for name, mb in batch.items():
            terms[name] = self.objective(self.policy.actors[name], mb, coef, count=count)
            loss = loss + self.objective.total(terms[name])
        loss.sum().backward()  # seed k's parameters receive d loss[k]
        norms = self._step(self.policy_views, self.policy_opt, loss, "policy", stops)
        keys = sorted({k for t in terms.values() for k in t} - set(self.objective.INTERMEDIATES))
        metrics = {key: sum(t[key].detach() for t in terms.values() if key in t) for key in keys}
        metrics["grad_norm"] = norms
        return metrics

    def _step(
        self,
        views: SeedViews,
        optimizer: torch.optim.Optimizer,
        loss: Tensor,
        what: str,
        stops: dict[int, str],
    ) -> Tensor:
        """Clip each seed's gradients by its own norm and step the seeds that train and whose
        loss and norm are finite (one that is not is added to ``stops``; its parameters and
        optimiser state stay as they are); returns the norms ``[S]``."""
        norms = clip_grad_norm_per_seed_(views.stacked, self.cfg.max_grad_norm)
        finite = (torch.isfinite(loss.detach()) & torch.isfinite(norms)).cpu()
        for k in range(self.num_seeds):
            if self.stopped[k] is None and k not in stops and not bool(finite[k]):
                bad = "loss" if not torch.isfinite(loss[k]) else "grad_norm"
                stops[k] = f"{bad} ({what})"
        step = [self.stopped[k] is None and k not in stops for k in range(self.num_seeds)]
        views.attach_grads(step)
        optimizer.step()
        return norms.detach()

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
        states = batch.state.reshape(S, M, -1)
        old_team = batch.values_team.reshape(S, M, K)
        old_ind = batch.values_individual.reshape(S, M, N, K)
        active = None if batch.active is None else batch.active.reshape(S, M, N, 1)
        seeds = torch.arange(S, device=self.device)[:, None]
        size = max(1, math.ceil(M / cfg.num_minibatches))
        total = torch.zeros(S)
        grad_norms = torch.zeros(S)
        steps, stops = 0, {}
        for order in orders:
            for start in range(0, M, size):
                idx = order[:, start : start + size].to(self.device)
                pred_team, pred_ind = self.critic(states[seeds, idx])
                loss = _seed_value_loss(
                    pred_team, old_team[seeds, idx], target_team[seeds, idx], cfg.value_clip
                ) + _seed_value_loss(
                    pred_ind,
                    old_ind[seeds, idx],
                    target_ind[seeds, idx],
                    cfg.value_clip,
                    mask=None if active is None else active[seeds, idx],
                )
                self.critic_views.zero_grad()
                loss.sum().backward()
                norms = self._step(self.critic_views, self.critic_opt, loss, "value", stops)
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
        """Seed k's run brought up to date with the stack (its policy, critic, optimisers):
        a single-seed ``MAPPO`` to evaluate, checkpoint or plot."""
        run = self.runs[k]
        run.policy.load_state_dict(self.policy.seed_state_dict(k))
        run.critic.load_state_dict(self.critic.seed_state_dict(k))
        run.policy_update.optimizer.load_state_dict(
            self.policy_views.seed_state_dict(self.policy_opt, k)
        )
        run.critic_opt.load_state_dict(self.critic_views.seed_state_dict(self.critic_opt, k))
        return run

    def seed_state_dict(self, k: int) -> dict[str, Any]:
        """Seed k's checkpoint state exactly as a single-seed ``MAPPO.state_dict()`` holds it
        (a plain ``--resume`` of ``seed_<k>/`` continues it as a single-seed run)."""
        state = self.sync(k).state_dict()
        state["collector"] = self.collector.seed_state_dict(k)
        return state

    def generator_state(self, k: int) -> Tensor:
        """Seed k's generator: a single-seed run's global torch generator state."""
        return self.generators[k].get_state()

    def load_seed_state(self, k: int, state: dict[str, Any], torch_rng: Tensor) -> None:
        """Restore seed k from a single-seed checkpoint's ``algo`` state and its torch RNG
        state; the stack takes seed k's parameters and optimiser state from it."""
        run = self.runs[k]
        run.load_state_dict(state)
        with torch.no_grad():
            for view, p in zip(self.policy_views.per_seed[k], run.policy.parameters(), strict=True):
                view.copy_(p)
            for view, p in zip(self.critic_views.per_seed[k], run.critic.parameters(), strict=True):
                view.copy_(p)
        _load_views_state(
            self.policy_opt, self.policy_views.per_seed[k], run.policy_update.optimizer
        )
        _load_views_state(self.critic_opt, self.critic_views.per_seed[k], run.critic_opt)
        self.generators[k].set_state(torch_rng)
        self.collector.load_seed_state_dict(k, state["collector"], vec=run.collector.vec)


def _load_views_state(
    optimizer: torch.optim.Optimizer, views: Sequence[Tensor], single: torch.optim.Optimizer
) -> None:
    """Give ``views`` (one seed's) the per-parameter state of a single-seed optimizer over the
    same parameters in the same order."""
    params = [p for group in single.param_groups for p in group["params"]]
    for view, p in zip(views, params, strict=True):
        state = single.state.get(p)
        if state:
            optimizer.state[view] = {
                key: value.clone() if isinstance(value, Tensor) else value
                for key, value in state.items()
            }
        else:
            optimizer.state.pop(view, None)


def _seed_value_loss(
    values: Tensor,
    old: Tensor,
    returns: Tensor,
    value_clip: float | None,
    mask: Tensor | None = None,
) -> Tensor:
    """:func:`marl.core.losses.value_loss` of each seed, ``[S]`` (``values [S, ...]``)."""
    err = (values - returns) ** 2
    if value_clip is not None:
        clipped = old + (values - old).clamp(-value_clip, value_clip)
        err = torch.max(err, (clipped - returns) ** 2)
    S = err.shape[0]
    if mask is None:
        return 0.5 * err.reshape(S, -1).mean(1)
    m = mask.to(err.dtype).expand_as(err).reshape(S, -1)
    return 0.5 * (err.reshape(S, -1) * m).sum(1) / m.sum(1).clamp_min(1.0)


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


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


class _forked_global_rngs:
    """Python's, numpy's and torch's global generators restored on exit."""

    def __enter__(self) -> None:
        self.states = (random.getstate(), np.random.get_state(), torch.get_rng_state())

    def __exit__(self, *exc: object) -> None:
        random.setstate(self.states[0])
        np.random.set_state(self.states[1])
        torch.set_rng_state(self.states[2])
