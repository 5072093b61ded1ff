"""GRPO for S seeds at once: S independent runs batched through one collection and one update.

Each seed k is a whole :class:`~marl.algos.grpo.GRPO` run (``runs[k]``: its group seeds,
advantages, second-stage whitener, reference policy and metrics are that run's own); the
collection and the policy update run for every seed at once (:mod:`marl.algos.seeds`)::

    collect: every seed's P groups x G episodes stepped together
             (marl.rollout.seed_collect.collect_seed_group_episodes; seed k stops when its
             episodes end)
    advantages, reference log-probs, metrics     per seed (runs[k]: one run's code)
    units: each seed's whole episodes, padded to the env's episode cap (max_cycles)
    epochs of minibatches (SeedBatch.policy_epochs): loss per seed, backward, per-seed
             clipping, optimizer.step()

Padding: seed k's episodes last T_k steps; they are padded (loss mask off) to the env's
``max_cycles``, a length that does not depend on the other seeds, so that seed k's update has
the same shapes in any batch and equals ``--seeds k`` bit for bit. An env without
``max_cycles`` pads to the longest episode of the batch: then a batch agrees with ``--seeds
k`` to float32 rounding only.

Each seed's env steps per update vary (episodes end when they end), so each seed spends its
budget at its own update; a seed that has spent it steps no more (``done``). Not batched: the
reference policy's log-probs (each seed's own module, one after another).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import fields, replace

import numpy as np
import torch
from torch import Tensor

from marl.algos.grpo import GRPO, GRPOConfig, episode_units, group_seeds
from marl.algos.ppo import Minibatch, PPOLossConfig
from marl.algos.seeds import SeedBatch, SeedMinibatch
from marl.core.losses import NonFiniteError, linear_schedule
from marl.rollout.collect import GroupBatch, limit_of
from marl.rollout.seed_collect import collect_seed_group_episodes

__all__ = ["SeedGRPO", "pad_episodes"]

#: the value each field of a padded step takes (the loss mask keeps it out of the loss)
_PAD = {"action_mask": True, "loss_mask": False, "resets": False, "agent_mask": False}


def pad_episodes(mb: Minibatch, length: int) -> Minibatch:
    """Whole-episode units ``[E, T, ...]`` padded to ``length`` steps along dim 1: padded
    steps allow every action, enter no loss (``loss_mask`` False) and reset nothing."""
    T = mb.obs.shape[1]
    if length < T:
        raise ValueError(f"episodes of {T} steps exceed the padding length {length}")
    if length == T:
        return mb
    pad = _padding(mb, length - T)
    return replace(mb, **{name: torch.cat([getattr(mb, name), value], dim=1)
                          for name, value in pad.items()})  # fmt: skip


def _padding(mb: Minibatch, steps: int) -> dict[str, Tensor]:
    """``steps`` padding steps of each per-step field of ``mb`` (the initial state and the
    burn-in lengths are per unit, not per step)."""
    out = {}
    for f in fields(mb):
        value = getattr(mb, f.name)
        if value is None or f.name in ("state", "burn_in"):
            continue
        shape = (value.shape[0], steps, *value.shape[2:])
        out[f.name] = torch.full(shape, _PAD.get(f.name, 0), dtype=value.dtype,
                                 device=value.device)  # fmt: skip
    return out


class SeedGRPO(SeedBatch):
    """S GRPO runs (``cfgs[k]``: seed k's config, equal but for ``seed`` and ``run_dir``)
    trained in one process; see the module docstring."""

    def __init__(
        self,
        cfgs: Sequence[GRPOConfig],
        device: torch.device | str = "cpu",
        algorithm: type[GRPO] = GRPO,
    ) -> None:
        super().__init__(algorithm, cfgs, device)  # the objective has the runs' KL hook
        vec = self.runs[0].vec
        #: the episodes' padded length (None: the longest episode of each collection)
        self.pad_to = limit_of(vec) if hasattr(vec, "max_cycles") else None

    def iteration(self, progress: float | Sequence[float]) -> list[dict[str, float]]:
        """Collect each training seed's P groups of G whole episodes, compute its advantages
        and update every seed's policy; returns each seed's metrics ({} for a seed that no
        longer trains)."""
        progress = self.per_seed(progress)
        t0 = time.perf_counter()
        seeds = [
            group_seeds(run.cfg.seed, run.updates, run.num_groups) if self.training(k) else None
            for k, run in enumerate(self.runs)
        ]
        self.policy.eval()
        try:
            batches = collect_seed_group_episodes(
                [r.vec for r in self.runs],
                self.layout,
                self.policy,
                seeds,
                self.cfg.group_size,
                self.generators,
                device=self.device,
            )
        finally:
            self.policy.train()
        t_collect = time.perf_counter() - t0
        metrics = self.update(batches, progress)
        for row in metrics:
            if row:
                row["time/collect_s"] = t_collect
                row["time/update_s"] = time.perf_counter() - t0 - t_collect
        return metrics

    def update(
        self, batches: list[GroupBatch | None], progress: Sequence[float]
    ) -> list[dict[str, float]]:
        """Advantages, reference log-probs and metrics per seed (:meth:`GRPO.update`'s
        parts, one run's code), then the policy epochs of every seed."""
        cfg, S = self.cfg, self.num_seeds
        metrics: list[dict[str, float]] = [{} for _ in range(S)]
        units: list[dict[str, Minibatch] | None] = [None] * S
        for k, (run, batch) in enumerate(zip(self.runs, batches, strict=True)):
            if batch is None or not self.training(k):
                continue
            try:
                adv, info = run.advantages(batch, progress[k])
            except NonFiniteError as exc:
                self._stop(k, exc.quantity)
                continue
            metrics[k] = run.advantage_metrics(batch, adv, info)
            refresh = cfg.ref_refresh and run.updates > 0 and run.updates % cfg.ref_refresh == 0
            if run.reference is not None and refresh:
                self.sync(k)  # the reference takes the stack's current policy
            ref_logp = run.reference_step(batch, metrics[k])
            units[k] = episode_units(batch, adv, self.layout, run.policy, ref_logp)
        if all(u is None for u in units):  # no seed trains (all stopped here)
            return [{} for _ in range(S)]
        rates = self.set_lr(self.policy_opt, cfg.lr, progress)
        coefs = [
            PPOLossConfig(cfg.clip_low, cfg.clip_high, cfg.dual_clip,
                          linear_schedule(cfg.ent_coef, cfg.ent_coef_final, p))
            for p in progress
        ]  # fmt: skip
        stacked = self.stack_units(units)
        E = next(iter(stacked.values())).num_units
        orders = [
            torch.stack(
                [
                    torch.randperm(E, generator=g) if self.training(k) else torch.arange(E)
                    for k, g in enumerate(self.generators)
                ]
            )  # fmt: skip
            for _ in range(cfg.epochs)
        ]
        # a seed draws its epochs' permutations epoch by epoch, as PolicyUpdate.run does
        policy_metrics, stops = self.policy_epochs(stacked, coefs, orders)
        for k, reason in sorted(stops.items()):
            self._stop(k, reason)
        for k, (run, batch) in enumerate(zip(self.runs, batches, strict=True)):
            if not self.training(k) or not metrics[k]:
                metrics[k] = {}
                continue
            row = metrics[k]
            row.update({key: float(v[k]) for key, v in policy_metrics.items()})
            row["lr"] = rates[k]
            if self.runs[k].offset is not None:
                row["optimism_offset"] = float(self.runs[k].offset.b.detach())
            row["ent_coef"] = float(coefs[k].ent_coef)
            if batch.episodes:
                for key in batch.episodes[0]:
                    row[f"episode/{key}"] = float(np.mean([e[key] for e in batch.episodes]))
            row["episodes"] = float(len(batch.episodes))
            run.updates += 1
        return metrics

    def stack_units(self, units: list[dict[str, Minibatch] | None]) -> dict[str, SeedMinibatch]:
        """Every seed's episode units, padded to :attr:`pad_to` (or the longest) and stacked;
        a seed without units (it no longer trains) gets padding only."""
        present = [u for u in units if u is not None]
        if not present:
            raise RuntimeError("no seed of the batch trains any more")
        length = self.pad_to or max(next(iter(u.values())).obs.shape[1] for u in present)
        template = present[0]
        out = {}
        for name in template:
            per_seed = []
            for u in units:
                mb = u[name] if u is not None else _empty_like(template[name])
                per_seed.append(pad_episodes(mb, length))
            out[name] = SeedMinibatch.stack(per_seed)
        return out


def _empty_like(mb: Minibatch) -> Minibatch:
    """Units of ``mb``'s shape that enter no loss: one padding step (padded further later)."""
    return replace(mb, **_padding(mb, 1))
