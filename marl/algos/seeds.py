"""What the trainers of S runs share (:class:`marl.algos.mappo.SeedMAPPO`,
:class:`marl.algos.grpo.SeedGRPO`).

``python -m marl.train --seeds 0-15`` trains S independent runs in one process, and a plain
run trains as a batch of one (:meth:`SeedBatch.of_run`: the run's own parts, torch's global
generator). Each seed k
is a whole single-seed algorithm object (``runs[k]``, a ``MAPPO`` or ``GRPO`` built exactly as
a single-seed run builds it: its config, env, whitener, ValueNorm, schedules, advantages and
metrics are that run's own), and the expensive parts run for every seed at once on stacked
modules with a leading seed axis (:mod:`marl.models.seed_policies`). :class:`SeedBatch` holds the
runs and their policy update, :class:`marl.algos.ppo.PolicyUpdate` over all S policies: the
update a single run trains with too (as a batch of one)::

    epochs of minibatches (each seed's permutation from its own generator):
        loss per seed [S]                   (ClipPPOObjective with a per-seed count)
        zero_grad; loss.sum().backward()    (seed k's parameters get d loss[k])
        clip each seed by its own norm      (never the stack's)
        optimizer.step()                    (a stock Adam over per-seed views, one param
                                             group per seed: each seed's step count, moments
                                             and learning rate are its own)

Each run's policy (``runs[k].policy``) is seed k's slice of the stack: its parameters are
views of the stacked ones, so evaluating or checkpointing a run reads the stack.

Independence: seed k's random draws come from its own generator, which continues where a
single-seed run's global generator stands after building its modules; every batched operation
is a per-seed GEMM or a row-wise / elementwise operation whose bits do not depend on S, and
every reduction (the gradient norm included) runs over one seed's own contiguous row, never
across the seed axis, whose vectorised order would depend on S. So at one torch thread seed
k inside ``--seeds 0-15`` equals ``--seeds k`` bit for bit; against a plain ``--seed k`` run
it agrees to float32 rounding (tests/test_seed_mappo.py, tests/test_seed_grpo.py).

A seed whose advantages, loss or gradient norm turn non-finite stops (:attr:`SeedBatch.stopped`
names the quantity): its parameters and optimiser state stay as they were, the others go on. A
seed that has spent its budget (``done``) steps no more either. A plain run raises
:class:`~marl.core.losses.NonFiniteError` instead (:meth:`SeedBatch.plain_row`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, Self

import numpy as np
import torch
from torch import Tensor

from marl.algos.base import Algorithm, ConfigError, resolve_algorithm
from marl.algos.ppo import PolicyUpdate, SeedMinibatch, take_rows
from marl.core.losses import NonFiniteError

__all__ = ["SeedBatch", "SeedMinibatch", "take_rows", "unsupported_with_seeds", "seeded_build"]


def unsupported_with_seeds(cfg: Any, *, distributed: bool = False) -> list[str]:
    """The options of ``cfg`` that ``--seeds`` cannot train, each with why (empty: fine)."""
    problems = []
    try:
        cls = resolve_algorithm(cfg.algo)
    except (ValueError, ImportError) as exc:
        return [str(exc)]
    if cls.batch_class() is None:
        problems.append(
            f"--algo {cfg.algo}: --seeds trains MAPPO and GRPO and their subclasses, not "
            f"{cls.__name__}"
        )
    if distributed:
        problems.append("torchrun: --seeds runs in one process (not distributed)")
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
        built = [seeded_build(cls, cfg, torch.device(device)) for cfg in cfgs]
        runs = [run for run, _ in built]
        first = runs[0]
        # the runs' objective: its class and its hooks (GRPO's KL term, an algorithm's own
        # terms: docs/extending.md), shared by the seeds, so a hook holds no run's state
        objective = first.policy_update.objective
        policy_update = PolicyUpdate(
            [r.policy for r in runs],
            lr=first.cfg.lr,
            epochs=first.cfg.epochs,
            num_minibatches=first.cfg.num_minibatches,
            max_grad_norm=first.cfg.max_grad_norm,
            objective=type(objective)(
                tbptt_chunk=objective.tbptt_chunk, extra_terms=objective.extra_terms
            ),
            offsets=None if first.offset is None else [r.offset for r in runs],
        )
        self._attach(runs, [generator for _, generator in built], policy_update, own=False)

    @classmethod
    def of_run(cls, run: Any) -> Self:
        """``run``, an algorithm object already built (a plain run's: ``python -m marl.train
        --seed k``, distributed too), as a batch of one that trains with the run's own parts:
        its policy update (a stack of one already), its value update and collector, its
        random draws from torch's global generator. A plain run trains through this, so a
        run alone and a run in ``--seeds`` take the same path."""
        batch = cls.__new__(cls)
        batch._attach([run], [None], run.policy_update, own=True)
        return batch

    def _attach(
        self,
        runs: list[Any],
        generators: list[torch.Generator | None],
        policy_update: PolicyUpdate,
        *,
        own: bool,
    ) -> None:
        """The runs, their generators (None: torch's global one) and the policy update that
        holds their policies; ``own``: the one run's own parts (:meth:`of_run`)."""
        first = runs[0]
        self.cfg, self.device = first.cfg, torch.device(first.device)
        self.seeds = [int(r.cfg.seed) for r in runs]
        #: seed k's run: its own env, statistics and single-seed modules (kept in step with
        #: the stack by :meth:`sync`, for evaluation and checkpoints)
        self.runs = runs
        #: S, the runs of the batch
        self.num_seeds = len(runs)
        #: seed k's stand-in for the global generator a single-seed run draws from (None:
        #: the global generator itself, a plain run's)
        self.generators = generators
        #: the batch trains with its one run's own parts (:meth:`of_run`): nothing to sync
        self.own = own
        self.layout = first.layout
        #: the policy update of every seed at once: each run's policy becomes its slice of
        #: the stack (``runs[k].policy`` reads the stack's parameters)
        self.policy_update = policy_update
        self.policy = policy_update.stack
        self.policy_views = policy_update.views
        self.policy_opt = policy_update.optimizer
        self.objective = policy_update.objective
        #: the quantity that turned non-finite and stopped seed k (None: it trains)
        self.stopped: list[str | None] = [None] * len(runs)
        #: seeds that spent their budget (they step no more)
        self.done: set[int] = set()

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

    def plain_row(self, rows: list[dict[str, float]]) -> dict[str, float]:
        """A plain run's metrics row (the batch of one's only row, :meth:`of_run`); raises
        :class:`~marl.core.losses.NonFiniteError` naming the quantity that turned NaN or inf
        instead (the step that met it was not taken), as a plain run stops on it."""
        reason = self.stopped[0]
        if reason is not None:
            self.stopped[0] = None  # the run is as it was: a caller may go on
            raise NonFiniteError(reason)
        return rows[0]

    # -- the runs' own state ---------------------------------------------------------------
    def sync(self, k: int) -> Any:
        """Seed k's run brought up to date with the stack (its policy and optimiser): a
        single-seed algorithm object to evaluate, checkpoint or plot."""
        run = self.runs[k]  # its policy is seed k's slice of the stack already
        if self.own:
            return run
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
        generator = self.generators[k]
        return torch.get_rng_state() if generator is None else generator.get_state()

    def load_seed_state(self, k: int, state: dict[str, Any], torch_rng: Tensor) -> None:
        """Restore seed k from a single-seed checkpoint's ``algo`` state and its torch RNG
        state; the stack takes seed k's parameters and optimiser state from it."""
        run = self.runs[k]
        run.load_state_dict(state)  # its policy is seed k's slice of the stack
        if self.own:
            torch.set_rng_state(torch_rng)
            return
        load_views_state(
            self.policy_opt, self.policy_views.per_seed[k], run.policy_update.optimizer
        )
        self.generators[k].set_state(torch_rng)
