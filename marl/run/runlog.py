"""Run logging: ``metrics.jsonl`` (one flat JSON object per update), TensorBoard events and,
optionally, Weights & Biases.

Keys are documented in ``docs/metrics.md``. Only the main process (rank 0) writes; other
ranks get a logger with ``enabled=False`` whose methods do nothing.

W&B (``python -m marl.train --wandb``, :class:`WandbOptions`; needs ``pip install
'coopsearch[wandb]'``) gets the same scalars as TensorBoard, in one ``run.log`` call per update,
charted against ``env_steps`` (TensorBoard's step); its files go to ``RUN_DIR/wandb/``. The mode
is ``--wandb-mode``, else ``WANDB_MODE``, else ``online`` when an API key is found
(``WANDB_API_KEY`` or a ``wandb login`` entry in ``~/.netrc``) and ``offline`` otherwise
(``wandb sync RUN_DIR/wandb/offline-run-*`` uploads such a run later). A resumed run continues
the same W&B run: its id is kept in the checkpoints (updates that the interrupted process
logged after its last checkpoint stay in W&B's history, at the same env steps).

A resumed run continues both logs from its checkpoint: the rows of metrics.jsonl and the
TensorBoard events written after it (by the run that was killed) are dropped first, so both
hold each update once, as an uninterrupted run would (:func:`trim_tensorboard`).
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import netrc
import os
import struct
import sys
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from marl.run.rundir import atomic_write_bytes, atomic_write_text

__all__ = [
    "RunLogger",
    "WandbOptions",
    "WandbError",
    "WANDB_MODES",
    "add_wandb_arguments",
    "wandb_options_from_args",
    "import_wandb",
    "read_metrics",
    "TIMING_KEYS",
    "read_tensorboard_events",
    "trim_tensorboard",
]

#: metrics.jsonl keys that measure time (wall, CPU, rates): they differ between two runs of
#: the same trajectory, every other key of a row is reproducible
TIMING_KEYS = frozenset({"time_s", "cpu_s", "sps", "agent_sps", "time/collect_s", "time/update_s"})

#: ``--wandb-mode`` values (wandb.init's ``mode``)
WANDB_MODES = ("online", "offline", "disabled")


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN/inf; None marks "not available"
    return value


def _scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """The scalars TensorBoard and W&B get from one update's row: every finite number but
    ``update`` (TensorBoard's step is ``env_steps``)."""
    return {
        key: float(value)
        for key, value in metrics.items()
        if isinstance(value, (int, float)) and math.isfinite(value) and key != "update"
    }


# ------------------------------------------------------------------------------------------
# Weights & Biases
# ------------------------------------------------------------------------------------------
class WandbError(RuntimeError):
    """W&B could not be used as asked (the package is missing, or ``wandb.init`` failed)."""


@dataclass(frozen=True)
class WandbOptions:
    """Where and how a run logs to Weights & Biases (the ``--wandb*`` train flags)."""

    project: str = "coopsearch"
    """W&B project."""
    entity: str | None = None
    """W&B entity (user or team); None: the account's default."""
    run_name: str | None = None
    """Display name of the W&B run; None: the run directory's name."""
    mode: str | None = None
    """online, offline or disabled; None: WANDB_MODE, else online with an API key, else offline."""

    def resolved_mode(self) -> str:
        """The mode wandb.init gets (see :attr:`mode`)."""
        if self.mode is not None:
            return self.mode
        env_mode = os.environ.get("WANDB_MODE", "").strip().lower()
        if env_mode in WANDB_MODES:
            return env_mode
        if env_mode == "dryrun":
            return "offline"
        return "online" if _have_wandb_api_key() else "offline"


def _have_wandb_api_key() -> bool:
    """An API key in ``WANDB_API_KEY`` or in ``~/.netrc`` (where ``wandb login`` puts it)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        return netrc.netrc().authenticators(host or "api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False


def import_wandb() -> Any:
    """The ``wandb`` module; :class:`WandbError` saying how to install it when it is missing."""
    try:
        import wandb
    except ImportError as exc:
        raise WandbError(
            "--wandb needs the wandb package, which is not installed: pip install "
            "'coopsearch[wandb]' (or pip install wandb)"
        ) from exc
    return wandb


def add_wandb_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``--wandb*`` flags (train flags outside the config: they change no result)."""
    group = parser.add_argument_group(
        "Weights & Biases (optional; pip install 'coopsearch[wandb]')"
    )
    group.add_argument(
        "--wandb",
        action="store_true",
        help="Also log every update's scalars (those TensorBoard gets) to W&B; files in "
        "RUN_DIR/wandb/.",
    )
    group.add_argument("--wandb-project", default=None, help="W&B project [default: coopsearch]")
    group.add_argument(
        "--wandb-entity", default=None, help="W&B entity (user or team) [default: the account's]"
    )
    group.add_argument(
        "--wandb-run-name", default=None, help="W&B run name [default: the run directory's name]"
    )
    group.add_argument(
        "--wandb-mode",
        default=None,
        choices=WANDB_MODES,
        help="[default: WANDB_MODE, else online when an API key is found (WANDB_API_KEY or "
        "wandb login), else offline; upload an offline run later with wandb sync]",
    )


def wandb_options_from_args(ns: argparse.Namespace) -> WandbOptions | None:
    """The options of parsed ``--wandb*`` flags; None without ``--wandb``. A ``--wandb-*``
    option without ``--wandb`` is an error (``ValueError``)."""
    given = {
        "project": ns.wandb_project,
        "entity": ns.wandb_entity,
        "run_name": ns.wandb_run_name,
        "mode": ns.wandb_mode,
    }
    if not ns.wandb:
        extra = [f"--wandb-{k.replace('_', '-')}" for k, v in given.items() if v is not None]
        if extra:
            raise ValueError(f"{', '.join(extra)} without --wandb: add --wandb to log to W&B")
        return None
    return WandbOptions(**{k: v for k, v in given.items() if v is not None})


def _start_wandb(
    options: WandbOptions, run_dir: str, config: dict[str, Any] | None, resume_id: str | None
) -> Any:
    """``wandb.init`` for a run directory (a resumed run continues W&B run ``resume_id``)."""
    wandb = import_wandb()
    mode = options.resolved_mode()
    if mode == "offline" and options.mode is None and "WANDB_MODE" not in os.environ:
        print(
            "[marl.train] W&B: no API key found, logging offline to "
            f"{os.path.join(run_dir, 'wandb')} (upload later: wandb sync "
            f"{os.path.join(run_dir, 'wandb', 'offline-run-*')})",
            file=sys.stderr,
            flush=True,
        )
    try:
        run = wandb.init(
            project=options.project,
            entity=options.entity,
            name=options.run_name or os.path.basename(os.path.abspath(run_dir)),
            mode=mode,
            dir=run_dir,
            config=config,
            id=resume_id,
            resume="allow" if resume_id else None,
            settings=wandb.Settings(console="off", quiet=True),
        )
    except Exception as exc:  # noqa: BLE001 - wandb's own errors (network, auth, usage)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise WandbError(
            f"W&B: wandb.init failed ({first}); check the project/entity and the API key, or "
            "log locally with --wandb-mode offline"
        ) from exc
    run.define_metric("env_steps")
    run.define_metric("*", step_metric="env_steps")
    return run


class RunLogger:
    """Appends metrics to ``RUN_DIR/metrics.jsonl`` and ``RUN_DIR/tb``.

    ``resume_update``: when continuing a run, lines with ``update`` greater than this (written
    after the checkpoint the run resumes from) are dropped first, and so are the TensorBoard
    events whose step (``env_steps``) is past ``resume_env_steps`` (default: the last kept
    row's), so both match an uninterrupted run. Write failures raise ``OSError`` naming the file.

    ``wandb``: also log to W&B (:class:`WandbOptions`; ``wandb_config`` becomes the W&B run's
    config, ``wandb_resume_id`` the W&B run a resumed run continues; :attr:`wandb_run_id` is
    the id to keep in its checkpoints).
    """

    def __init__(
        self,
        run_dir: str,
        *,
        enabled: bool = True,
        tensorboard: bool = True,
        resume_update: int | None = None,
        resume_env_steps: int | None = None,
        wandb: WandbOptions | None = None,
        wandb_config: dict[str, Any] | None = None,
        wandb_resume_id: str | None = None,
    ) -> None:
        self.enabled = enabled
        self.path = os.path.join(run_dir, "metrics.jsonl")
        self.writer = None
        self.wandb_run: Any = None
        self.closed = not enabled
        if not enabled:
            return
        os.makedirs(run_dir, exist_ok=True)
        if resume_update is not None:
            kept = []
            if os.path.exists(self.path):
                kept = [r for r in read_metrics(self.path) if r.get("update", 0) <= resume_update]
                atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))
            last_step = resume_env_steps
            if last_step is None:
                last_step = max((int(r.get("env_steps", 0)) for r in kept), default=0)
            trim_tensorboard(os.path.join(run_dir, "tb"), last_step)
        elif resume_update is None and os.path.exists(self.path):
            os.remove(self.path)
        if wandb is not None:  # first: a failing wandb.init leaves no file open
            self.wandb_run = _start_wandb(wandb, run_dir, wandb_config, wandb_resume_id)
        self._fh = open(self.path, "a")  # noqa: SIM115 - kept open for the run
        if tensorboard:
            try:
                from torch.utils.tensorboard.writer import FileWriter
            except ImportError:  # an optional extra: the run goes on without tb/
                print(
                    "[marl.train] TensorBoard is not installed: no tb/ events "
                    "(pip install 'coopsearch[tensorboard]')",
                    file=sys.stderr,
                )
            else:
                self.writer = FileWriter(os.path.join(run_dir, "tb"))

    @property
    def wandb_run_id(self) -> str | None:
        """The W&B run's id (None without W&B)."""
        return None if self.wandb_run is None else str(self.wandb_run.id)

    def log(self, metrics: dict[str, Any]) -> None:
        """Write one update's metrics (flat dict; ``update`` and ``env_steps`` expected)."""
        if not self.enabled:
            return
        row = {k: _clean(v) for k, v in metrics.items()}
        try:
            self._fh.write(json.dumps(row) + "\n")
            self._fh.flush()
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror or str(exc), self.path) from exc
        wanted = self.writer is not None or self.wandb_run is not None
        scalars = _scalars(metrics) if wanted else {}
        if self.writer is not None:
            from tensorboard.compat.proto.summary_pb2 import Summary

            step = int(metrics.get("env_steps", metrics.get("update", 0)))
            # every scalar of the update in one event (one event per scalar, as add_scalar
            # writes them, costs a queue hand-off to the writer thread each)
            values = [Summary.Value(tag=k, simple_value=v) for k, v in scalars.items()]
            self.writer.add_summary(Summary(value=values), step)
        if self.wandb_run is not None:
            self.wandb_run.log(scalars)  # one call per update, charted against env_steps

    def flush(self) -> None:
        """Make everything logged so far durable (TensorBoard's queue written out): called
        before each checkpoint, so that a run killed after it lost no logged update."""
        if self.enabled and self.writer is not None:
            self.writer.flush()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self._fh.close()
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror or str(exc), self.path) from exc
        finally:
            if self.writer is not None:
                self.writer.flush()
                self.writer.close()
            if self.wandb_run is not None:
                self.wandb_run.finish()


def read_metrics(path: str) -> list[dict[str, Any]]:
    """All rows of a metrics.jsonl (a truncated last line from a crash is skipped)."""
    rows = []
    with open(path) as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


# ------------------------------------------------------------------------------------------
# TensorBoard event files (TFRecord framing: u64 length, u32 crc, data, u32 crc)
# ------------------------------------------------------------------------------------------
def _records(path: str) -> tuple[list[bytes], bool]:
    """The complete raw records of an event file (framing included) and whether the file
    ended cleanly (False: a truncated last record, e.g. a run killed mid-write)."""
    with open(path, "rb") as fh:
        data = fh.read()
    out, pos = [], 0
    while pos < len(data):
        if pos + 12 > len(data):
            return out, False
        (length,) = struct.unpack("<Q", data[pos : pos + 8])
        end = pos + 12 + length + 4
        if end > len(data):
            return out, False
        out.append(data[pos:end])
        pos = end
    return out, True


def _event(record: bytes) -> Any:
    from tensorboard.compat.proto.event_pb2 import Event

    (length,) = struct.unpack("<Q", record[:8])
    return Event.FromString(record[12 : 12 + length])


def read_tensorboard_events(tb_dir: str) -> list[tuple[int, str, float]]:
    """``(step, tag, value)`` of every scalar in the event files of ``tb_dir`` (file order)."""
    out = []
    for path in sorted(glob.glob(os.path.join(tb_dir, "events.out.tfevents.*"))):
        for record in _records(path)[0]:
            event = _event(record)
            if event.HasField("summary"):
                step = int(event.step)
                out.extend((step, v.tag, float(v.simple_value)) for v in event.summary.value)
    return out


def trim_tensorboard(tb_dir: str, last_step: int) -> None:
    """Drop the summary events with ``step > last_step`` (and a truncated last record) from the
    event files of ``tb_dir``; each changed file is rewritten atomically in place."""
    for path in sorted(glob.glob(os.path.join(tb_dir, "events.out.tfevents.*"))):
        records, clean = _records(path)
        kept = []
        for record in records:
            try:
                event = _event(record)
            except Exception:  # noqa: BLE001 - a damaged record: it and the rest are dropped
                clean = False
                break
            if not (event.HasField("summary") and event.step > last_step):
                kept.append(record)
        if clean and len(kept) == len(records):
            continue
        atomic_write_bytes(path, b"".join(kept))
