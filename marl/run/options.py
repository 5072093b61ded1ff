"""How to run a configuration, apart from what it trains: the train flags outside the config.

:func:`marl.run.config.parse_train_args` returns a :class:`RunOptions` beside the config, and
:func:`marl.run.train.train` takes it: whether to continue a run (``--resume``) or start one
over an existing one (``--overwrite``), how many checkpoints to keep, where to log to W&B.
None of it is written to config.yaml or changes a result.
"""

from __future__ import annotations

from dataclasses import dataclass

from marl.run.runlog import WandbOptions

__all__ = ["RunOptions"]


@dataclass(frozen=True)
class RunOptions:
    """The options of one invocation of the trainer (``python -m marl.train``)."""

    resume: str | None = None
    """``--resume RUN_DIR``: the run directory continued (also the config's ``run_dir``);
    None: a new run."""
    overwrite: bool = False
    """``--overwrite``: a new run may replace a run in its ``--run-dir`` (deleting that run's
    files only)."""
    keep_checkpoints: int | None = None
    """``--keep-checkpoints K``; None: the resumed run's value, else
    :data:`marl.run.checkpoint.DEFAULT_KEEP`."""
    explicit: frozenset[str] = frozenset()
    """The config fields set explicitly (``--config`` file or flags; env kwargs as ``"env"``),
    the others being defaults, recipe values or the resumed run's own."""
    wandb: WandbOptions | None = None
    """``--wandb`` and its ``--wandb-*`` flags; None: no W&B logging."""

    @property
    def resuming(self) -> bool:
        """Whether this invocation continues a run."""
        return self.resume is not None
