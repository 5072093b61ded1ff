"""What the seed-batched algorithms share (:mod:`marl.algos.seed_mappo`, ``seed_grpo``).

``python -m marl.train --seeds 0-15`` trains S independent runs in one process. Each seed k
is a whole single-seed algorithm object (``runs[k]``, a ``MAPPO`` or ``GRPO`` built exactly as
a single-seed run builds it: its config, env, whitener, ValueNorm, schedules, advantages and
metrics are that run's own), and the expensive parts run for every seed at once on stacked
modules with a leading seed axis (:mod:`marl.seed_policies`). :class:`SeedBatch` holds the
runs, the stacked policy and its optimiser, and the policy update, which reads as
:class:`marl.algos.ppo.PolicyUpdate`::

    epochs of minibatches (each seed's permutation from its own generator):
        loss per seed [S]                   (ClipPPOObjective with a per-seed count)
        zero_grad; loss.sum().backward()    (seed k's parameters get d loss[k])
        clip_grad_norm_per_seed_            (each seed by its own norm, never the stack's)
        optimizer.step()                    (a stock Adam over per-seed views, one param
                                             group per seed: each seed's step count, moments
                                             and learning rate are its own)

Independence: seed k's random draws come from its own generator, which continues where a
single-seed run's global generator stands after building its modules; every batched operation
is a per-seed GEMM or a row-wise / elementwise operation whose bits do not depend on S. So at
one torch thread seed k inside ``--seeds 0-15`` equals ``--seeds k`` bit for bit; against a
plain ``--seed k`` run it agrees to float32 rounding (tests/test_seed_mappo.py,
tests/test_seed_grpo.py).

A seed whose advantages, loss or gradient norm turn non-finite stops (:attr:`SeedBatch.stopped`
names the quantity): its parameters and optimiser state stay as they were, the others go on. A
seed that has spent its budget (``done``) steps no more either.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from marl.algos.base import Algorithm, ConfigError, resolve_algorithm
from marl.algos.ppo import Minibatch, PPOLossConfig
from marl.core.seed_batched import SeedViews, clip_grad_norm_per_seed_
from marl.seed_policies import SeedMultiAgentPolicy

__all__ = ["SeedBatch", "SeedMinibatch", "take_rows", "unsupported_with_seeds", "seeded_build"]


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
        """Seed s's units ``idx[s]`` (``idx [S, b]`` long) of every seed (one ``index_select``
        of whole rows per field: the seed and unit axes flattened)."""
        taken = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                taken[f.name] = None
            elif f.name == "state":
                n = self.n_agents
                rows = (idx[..., None] * n + torch.arange(n, device=idx.device)).flatten(1)
                taken[f.name] = tuple(take_rows(s, rows) for s in value)
            else:
                taken[f.name] = take_rows(value, idx)
        return replace(self, **taken)


def take_rows(x: Tensor, idx: Tensor) -> Tensor:
    """``x [S, U, ...]`` at ``idx [S, b]`` along dim 1 -> ``[S, b, ...]`` (``x[s, idx[s]]``)."""
    S, U = x.shape[:2]
    flat = (idx + torch.arange(S, device=idx.device)[:, None] * U).reshape(-1)
    return x.reshape(S * U, *x.shape[2:]).index_select(0, flat).reshape(S, -1, *x.shape[2:])


def unsupported_with_seeds(cfg: Any, *, distributed: bool = False) -> list[str]:
    """The options of ``cfg`` that ``--seeds`` cannot train, each with why (empty: fine)."""
    from marl.algos.grpo import GRPO
    from marl.algos.mappo import MAPPO

    problems = []
    try:
        cls = resolve_algorithm(cfg.algo)
    except (ValueError, ImportError) as exc:
        return [str(exc)]
    if not issubclass(cls, (MAPPO, GRPO)):
        problems.append(
            f"--algo {cfg.algo}: --seeds trains MAPPO and GRPO and their subclasses, not "
            f"{cls.__name__}"
        )
    if distributed:
        problems.append("torchrun: --seeds runs in one process (not distributed)")
    if getattr(cfg, "optimism_offset", None) is not None:
        problems.append("--optimism-offset: not batched over seeds (leave it unset)")
    if getattr(cfg, "tbptt_chunk", None) is not None:
        problems.append("--tbptt-chunk: not batched over seeds (leave it unset)")
    return problems


def seeded_build(
    cls: type[Algorithm], cfg: Any, device: torch.device
) -> tuple[Any, torch.Generator]:
    """``cls(cfg)`` built as :mod:`marl.run.train` builds a single-seed run (Python's, numpy's
    and torch's generators seeded with ``cfg.seed``), and a generator in the state torch's
    global generator has after it; the global generators are left as they were."""
    states = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    try:
        random.seed(cfg.seed)
        np.random.seed(cfg.seed % (2**32))
        torch.manual_seed(cfg.seed)
        run = cls(cfg, None, device)
        generator = torch.Generator()
        generator.set_state(torch.get_rng_state())
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
    return run, generator


def ordered_views(stacked: nn.Module, names: dict[str, str], single: nn.Module) -> SeedViews:
    """:class:`SeedViews` over ``stacked``'s parameters in the order of the single-seed module
    ``single``'s parameters (``names``: stacked name -> single-seed name), so that seed k's
    views line up with a single-seed run's optimizer parameters."""
    by_single = {single_name: name for name, single_name in names.items()}
    params = dict(stacked.named_parameters())
    return SeedViews([params[by_single[name]] for name, _ in single.named_parameters()])


def policy_names(policy: SeedMultiAgentPolicy) -> dict[str, str]:
    """Stacked parameter name -> the ``MultiAgentPolicy``'s name."""
    return {f"actors.{t}.{stacked}": f"actors.{t}.{single}"
            for t, actor in policy.actors.items()
            for stacked, single in actor.single_seed_names().items()}  # fmt: skip


def per_seed_adam(views: SeedViews, lr: float) -> torch.optim.Adam:
    """A stock Adam (``eps=1e-5``, fused, as the single-seed update's) with one param group
    per seed: each seed's own learning rate and state."""
    groups = [{"params": list(seed_views)} for seed_views in views.per_seed]
    return torch.optim.Adam(groups, lr=lr, eps=1e-5, fused=True)


def load_views_state(
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


class SeedBatch:
    """S single-seed runs of one algorithm (``runs[k]``) with their policies stacked, and the
    batched policy update (see the module docstring). Subclasses build the runs
    (:meth:`_build`) and add the rollout and the rest of the update."""

    def __init__(
        self, cls: type[Algorithm], cfgs: Sequence[Any], device: torch.device | str = "cpu"
    ) -> None:
        cfgs = list(cfgs)
        if not cfgs:
            raise ConfigError("--seeds must name at least one seed")
        problems = unsupported_with_seeds(cfgs[0])
        if problems:
            raise ConfigError("; ".join(problems))
        self.cfg, self.device = cfgs[0], torch.device(device)
        self.seeds = [int(c.seed) for c in cfgs]
        built = [seeded_build(cls, cfg, self.device) for cfg in cfgs]
        #: seed k's run: its own env, statistics and single-seed modules (kept in step with
        #: the stack by :meth:`sync`, for evaluation and checkpoints)
        self.runs = [run for run, _ in built]
        #: seed k's stand-in for the global generator a single-seed run draws from
        self.generators = [generator for _, generator in built]
        first = self.runs[0]
        self.layout = first.layout
        self.policy = SeedMultiAgentPolicy([r.policy for r in self.runs]).to(self.device)
        self.policy_views = ordered_views(self.policy, policy_names(self.policy), first.policy)
        self.policy_opt = per_seed_adam(self.policy_views, self.cfg.lr)
        # the runs' objective: its class and its hooks (GRPO's KL term, an algorithm's own
        # terms: docs/extending.md), shared by the seeds, so a hook holds no run's state
        objective = first.policy_update.objective
        self.objective = type(objective)(extra_terms=objective.extra_terms)
        #: the quantity that turned non-finite and stopped seed k (None: it trains)
        self.stopped: list[str | None] = [None] * len(self.runs)
        #: seeds that spent their budget (they step no more)
        self.done: set[int] = set()

    @property
    def num_seeds(self) -> int:
        return len(self.runs)

    def per_seed(self, progress: float | Sequence[float]) -> list[float]:
        """``progress`` for each seed (a number: the same for all)."""
        if isinstance(progress, (int, float)):
            return [float(progress)] * self.num_seeds
        progress = [float(p) for p in progress]
        if len(progress) != self.num_seeds:
            raise ValueError(f"need one progress per seed ({self.num_seeds}), got {len(progress)}")
        return progress

    def training(self, k: int) -> bool:
        """Whether seed k still trains (not stopped, budget not spent)."""
        return self.stopped[k] is None and k not in self.done

    def _stop(self, k: int, reason: str) -> None:
        if self.stopped[k] is None:
            self.stopped[k] = reason

    def set_lr(self, optimizer: torch.optim.Optimizer, base: float, progress: Sequence[float]):
        """Seed k's learning rate: ``base``, annealed linearly to 0 over its own progress with
        ``lr_schedule linear``; returns each seed's."""
        rates = [
            base * (max(1.0 - p, 0.0) if self.cfg.lr_schedule == "linear" else 1.0)
            for p in progress
        ]
        for group, lr in zip(optimizer.param_groups, rates, strict=True):
            group["lr"] = lr
        return rates

    # -- the policy update -----------------------------------------------------------------
    def policy_epochs(
        self, units: dict[str, SeedMinibatch], coefs: list[PPOLossConfig], orders: list[Tensor]
    ) -> tuple[dict[str, Tensor], dict[int, str]]:
        """``epochs`` passes over every seed's minibatches (``orders[e] [S, U]``: seed s's
        permutation of its units in epoch e; ``coefs[s]``: seed s's coefficients); returns
        each metric's mean over the minibatches, ``[S]``, and the seeds that stopped."""
        U = next(iter(units.values())).num_units
        size = max(1, math.ceil(U / self.cfg.num_minibatches))
        sums: dict[str, Tensor] = {}
        steps, stops = 0, {}
        for order in orders:
            for start in range(0, U, size):
                idx = order[:, start : start + size].to(self.device)
                batch = {name: mb.select(idx) for name, mb in units.items()}
                for key, value in self.policy_step(batch, coefs, stops).items():
                    sums[key] = sums[key] + value if key in sums else value
                steps += 1
        return {key: value / max(steps, 1) for key, value in sums.items()}, stops

    def policy_step(
        self, batch: dict[str, SeedMinibatch], coefs: list[PPOLossConfig], stops: dict[int, str]
    ) -> dict[str, Tensor]:
        """One optimiser step of every seed on its minibatch; returns the metrics ``[S]``
        (every term summed over the agent types, and ``grad_norm`` before clipping)."""
        count = sum(mb.sample_mask().flatten(1).sum(1) for mb in batch.values())
        count = count.clamp_min(1).float()  # [S]: each seed's denominator
        coef = _stacked_coef(coefs, self.device)
        self.policy_views.zero_grad()
        terms = {}
        loss = torch.zeros(self.num_seeds, device=self.device)
        for name, mb in batch.items():
            terms[name] = self.objective(self.policy.actors[name], mb, coef, count=count)
            loss = loss + self.objective.total(terms[name])
        loss.sum().backward()  # seed k's parameters receive d loss[k]
        norms = self.step_seeds(self.policy_views, self.policy_opt, loss, "policy", stops)
        keys = sorted({k for t in terms.values() for k in t} - set(self.objective.INTERMEDIATES))
        metrics = {key: sum(t[key].detach() for t in terms.values() if key in t) for key in keys}
        metrics["grad_norm"] = norms
        return metrics

    def step_seeds(
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
            if self.training(k) and k not in stops and not bool(finite[k]):
                bad = "loss" if not torch.isfinite(loss[k]) else "grad_norm"
                stops[k] = f"{bad} ({what})"
        views.attach_grads([self.training(k) and k not in stops for k in range(self.num_seeds)])
        optimizer.step()
        return norms.detach()

    # -- the runs' own state ---------------------------------------------------------------
    def sync(self, k: int) -> Any:
        """Seed k's run brought up to date with the stack (its policy and optimiser): a
        single-seed algorithm object to evaluate, checkpoint or plot."""
        run = self.runs[k]
        run.policy.load_state_dict(self.policy.seed_state_dict(k))
        run.policy_update.optimizer.load_state_dict(
            self.policy_views.seed_state_dict(self.policy_opt, k)
        )
        return run

    def seed_state_dict(self, k: int) -> dict[str, Any]:
        """Seed k's checkpoint state exactly as the single-seed ``state_dict()`` holds it (a
        plain ``--resume`` of ``seed_<k>/`` continues it as a single-seed run)."""
        return self.sync(k).state_dict()

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
        load_views_state(
            self.policy_opt, self.policy_views.per_seed[k], run.policy_update.optimizer
        )
        self.generators[k].set_state(torch_rng)


def _stacked_coef(coefs: list[PPOLossConfig], device: torch.device) -> PPOLossConfig:
    """One :class:`PPOLossConfig` for the stack: the seeds share the clip settings; the
    entropy coefficient (which may follow each seed's own schedule) as a ``[S]`` tensor when
    the seeds' differ."""
    first = coefs[0]
    ent = [c.ent_coef for c in coefs]
    if all(e == ent[0] for e in ent):
        return first
    return replace(first, ent_coef=torch.tensor(ent, device=device))
