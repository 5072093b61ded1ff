"""The training loop's checkpointing: where a run starts (:class:`Start`: update 0, or the
checkpoint a resumed run continues), when the loop evaluates and checkpoints
(:class:`Cadence`), and the checkpoints it writes with the policy artifact beside each
(:class:`Checkpoints`).

:mod:`marl.run.train` and :mod:`marl.run.train_seeds` (a Start and Checkpoints per seed) use
them; the checkpoint files themselves (atomic writes, the last K kept, loading with fallback) are
:mod:`marl.run.checkpoint`'s.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from marl.algos import Algorithm
from marl.core.losses import NonFiniteError
from marl.run.artifact import write_policy_artifact
from marl.run.checkpoint import rng_state, save_run_checkpoint
from marl.run.config import BaseConfig, config_to_dict
from marl.run.progress import TrainingClock
from marl.run.rundir import RunDir
from marl.run.runlog import RunLogger

__all__ = ["Cadence", "Checkpoints", "Start"]


@dataclass(frozen=True)
class Start:
    """Where the loop starts: update 0 of a new run, or the checkpoint (``payload``, read from
    ``path``) that a resumed run continues; ``keep``: how many checkpoints the run keeps."""

    keep: int
    payload: dict[str, Any] | None = None
    path: str | None = None

    @property
    def resumed(self) -> bool:
        return self.payload is not None

    @property
    def update(self) -> int:
        return int(self.payload["update"]) if self.payload else 0

    @property
    def env_steps(self) -> int:
        return int(self.payload["env_steps"]) if self.payload else 0

    @property
    def elapsed(self) -> float:
        """Wall seconds of training in earlier invocations."""
        return float(self.payload["elapsed"]) if self.payload else 0.0

    @property
    def cpu(self) -> float:
        """CPU seconds of training in earlier invocations. Checkpoints from before the CPU-time
        budget have none: their wall time bounds the CPU time of a one-thread run from above (no
        run goes over its --max-cpu-time for the missing key)."""
        return float(self.payload.get("cpu_elapsed", self.elapsed)) if self.payload else 0.0

    @property
    def position(self) -> tuple[int, float, float]:
        """(env steps, wall seconds, CPU seconds) of training done before this invocation."""
        return self.env_steps, self.elapsed, self.cpu

    @property
    def wandb_run_id(self) -> str | None:
        return self.payload.get("wandb_run_id") if self.payload else None

    @property
    def provenance(self) -> list[dict[str, Any]]:
        """The :func:`marl.run.provenance.provenance` records of the earlier invocations."""
        return list(self.payload.get("provenance") or []) if self.payload else []


class Checkpoints:
    """The run's checkpoints (rank 0 writes them; :func:`marl.run.checkpoint.save_run_checkpoint`),
    each with the policy artifact of its update beside it (``policy/``, no pickle: an
    interrupted run can be evaluated and exported too), and what a failed run says it kept."""

    def __init__(
        self,
        cfg: BaseConfig,
        algo: Algorithm,
        run: RunDir,
        start: Start,
        logger: RunLogger,
        history: list[dict[str, Any]],
        *,
        enabled: bool,
        rng: Callable[[], dict[str, Any]] = rng_state,
    ) -> None:
        self.cfg, self.algo, self.run, self.keep = cfg, algo, run, start.keep
        self.logger, self.history, self.enabled = logger, history, enabled
        #: the RNG states a checkpoint holds (a seed of a batch: its own generator as torch's)
        self.rng = rng
        self.wandb_resume_id = start.wandb_run_id
        #: the newest checkpoint written (or resumed from) and its update
        self.path: str | None = start.path
        self.update: int | None = start.update if start.resumed else None

    def save(self, update: int, env_steps: int, clock: TrainingClock) -> None:
        """Checkpoint ``update`` unless it is the newest checkpoint already; NonFiniteError
        (nothing written) when the policy's parameters are not finite."""
        if not self.enabled or self.update == update:
            return
        for p in self.algo.policy.parameters():
            if not torch.isfinite(p).all():
                raise NonFiniteError("policy parameters (checkpoint not written)")
        payload = {
            "algo": self.algo.state_dict(),
            "update": update,
            "env_steps": env_steps,
            "elapsed": clock.elapsed(),
            "cpu_elapsed": clock.cpu(),
            "rng": self.rng(),
            "config": config_to_dict(self.cfg),
            "keep_checkpoints": self.keep,
            # kept through resumes without --wandb, for a later one with it
            "wandb_run_id": self.logger.wandb_run_id or self.wandb_resume_id,
            "provenance": self.history,
        }
        self.logger.flush()  # the TensorBoard events up to this update are on disk first
        self.path = save_run_checkpoint(self.run.path, update, payload, self.keep)
        self.update = update
        self.write_policy(update, env_steps)

    def write_policy(self, update: int, env_steps: int) -> None:
        """The policy artifact of ``update`` (no final evaluation yet)."""
        write_policy_artifact(
            self.run.path,
            self.algo.policy,
            self.cfg,
            update=update,
            env_steps=env_steps,
            provenance=self.history[-1],
        )

    def relative_path(self) -> str | None:
        """The newest checkpoint's path in the run directory (None before the first)."""
        return self.path and os.path.relpath(self.path, self.run.path)

    def kept_note(self) -> str:
        """What a failed run kept: its newest good checkpoint, or that it had none yet."""
        if self.path is not None:
            return (
                f"The last good checkpoint is kept: {self.path} (update {self.update}); "
                f"python -m marl.train --resume {self.run.path} continues from it."
            )
        return (
            "No checkpoint was kept: the run stopped before its first checkpoint (due at update "
            f"{self.cfg.checkpoint_every}, --checkpoint-every)."
        )


@dataclass(frozen=True)
class Cadence:
    """When the loop evaluates (every ``--eval-every`` updates, 0: never; on rank 0) and when
    it checkpoints (every ``--checkpoint-every`` updates; and once more at its end)."""

    eval_every: int
    checkpoint_every: int
    evaluates: bool

    def evaluate_at(self, update: int) -> bool:
        return self.evaluates and bool(self.eval_every) and update % self.eval_every == 0

    def checkpoint_at(self, update: int) -> bool:
        return update % self.checkpoint_every == 0
