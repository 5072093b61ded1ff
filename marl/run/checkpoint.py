"""Checkpoints of a run directory: atomic writes, the last K kept, loading with fallback.

Layout (docs/CONTRACTS.md section 4)::

    RUN_DIR/checkpoints/ckpt_<update>.pt   the last K checkpoints (K = --keep-checkpoints)
    RUN_DIR/checkpoints/latest.pt          the newest of them (a hard link; a copy where the
                                           file system has no hard links), for older tools

A checkpoint is a dict saved with ``torch.save`` (a pickle: the optimiser and RNG states, the
whole algorithm state), read only by ``marl.train --resume`` of the run's own directory; the
trained policy is also written apart, without pickles, as the run's policy artifact
(``RUN_DIR/policy/``, :mod:`marl.run.artifact`), which is what ``marl.load_policy``,
``marl.evaluate`` and ``marl.export`` read. :func:`save_checkpoint` never leaves a
partially written file at its path: the bytes are serialised in memory, written to a temporary
file in the same folder, fsynced, then renamed over the target, so a crash or a full disk
keeps the previous checkpoint. A failed write raises ``OSError`` naming the checkpoint's path
and the cause (``errno.ENOSPC``: no space left on device).

:func:`load_newest_checkpoint` loads the newest checkpoint that loads; each one that does not
(truncated, corrupt) is reported by its file name and the next older one is tried.

``RUN_DIR/.lock`` is held (``fcntl.flock``) by the one process training in a run directory:
:func:`lock_run_dir` takes it, :func:`wait_for_run_dir` waits until nobody holds it.
"""

from __future__ import annotations

import contextlib
import io
import os
import random
import re
import shutil
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from marl.run.rundir import (
    RunDirBusyError,
    atomic_write,
    atomic_write_bytes,
    lock_run_dir,
    wait_for_run_dir,
)

__all__ = [
    "DEFAULT_KEEP",
    "CheckpointError",
    "RunDirBusyError",
    "save_checkpoint",
    "load_checkpoint",
    "rng_state",
    "set_rng_state",
    "latest_path",
    "checkpoint_path",
    "list_checkpoints",
    "numbered_checkpoints",
    "save_run_checkpoint",
    "write_atomic_bytes",
    "load_newest_checkpoint",
    "lock_run_dir",
    "wait_for_run_dir",
]

#: checkpoints kept by default (``--keep-checkpoints``)
DEFAULT_KEEP = 3
_CKPT_RE = re.compile(r"^ckpt_(\d+)\.pt$")
#: keys every training checkpoint holds
REQUIRED_KEYS = ("algo", "update", "env_steps", "elapsed", "rng")


class CheckpointError(RuntimeError):
    """No usable checkpoint: every candidate failed to load (each is named in the message)."""


def latest_path(run_dir: str) -> str:
    """``RUN_DIR/checkpoints/latest.pt``."""
    return os.path.join(run_dir, "checkpoints", "latest.pt")


def checkpoint_path(run_dir: str, update: int) -> str:
    """``RUN_DIR/checkpoints/ckpt_<update>.pt``."""
    return os.path.join(run_dir, "checkpoints", f"ckpt_{int(update)}.pt")


def numbered_checkpoints(run_dir: str) -> list[tuple[int, str]]:
    """(update, path) of the ``ckpt_<update>.pt`` files, newest first."""
    folder = os.path.join(run_dir, "checkpoints")
    try:
        names = os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = [(int(m.group(1)), name) for name in names if (m := _CKPT_RE.match(name))]
    return [(u, os.path.join(folder, name)) for u, name in sorted(found, reverse=True)]


def list_checkpoints(run_dir: str) -> list[str]:
    """The run's checkpoint files, newest first: ``ckpt_<update>.pt`` by update, then
    ``latest.pt`` when it is a file of its own (a run written before numbered checkpoints)."""
    paths = [p for _, p in numbered_checkpoints(run_dir)]
    latest = latest_path(run_dir)
    if os.path.isfile(latest) and not any(_same_file(latest, p) for p in paths):
        paths.append(latest)
    return paths


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


#: :func:`marl.run.rundir.atomic_write_bytes` (tmp file in the same folder, fsync, rename), by
#: its older name
write_atomic_bytes = atomic_write_bytes


def save_checkpoint(path: str, payload: dict[str, Any]) -> None:
    """Write ``payload`` to ``path`` atomically (serialised in memory first, then a tmp file in
    the same folder, fsync, replace); an ``OSError`` names ``path`` and keeps the old file."""
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    atomic_write_bytes(path, buffer.getbuffer())


def _link_latest(run_dir: str, path: str) -> None:
    """Point ``latest.pt`` at ``path`` atomically (hard link; a copy without hard links)."""

    def link(tmp: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        try:
            os.link(path, tmp)
        except OSError:  # no hard links here (some network / FAT file systems): copy
            shutil.copyfile(path, tmp)

    atomic_write(latest_path(run_dir), link)


def save_run_checkpoint(run_dir: str, update: int, payload: dict[str, Any], keep: int) -> str:
    """Write ``ckpt_<update>.pt`` atomically, point ``latest.pt`` at it, then delete all but
    the ``keep`` newest (and any numbered after ``update``: a timeline abandoned when the run
    resumed from an older checkpoint). Returns the new checkpoint's path. The older
    checkpoints are touched only after the new one is safely written."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    path = checkpoint_path(run_dir, update)
    save_checkpoint(path, payload)
    _link_latest(run_dir, path)
    numbered = numbered_checkpoints(run_dir)
    older = [(u, p) for u, p in numbered if u < update]
    stale = [p for u, p in numbered if u > update] + [p for _, p in older[keep - 1 :]]
    for p in stale:
        with contextlib.suppress(FileNotFoundError):
            os.remove(p)
    return path


def load_checkpoint(path: str, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint`: an unpickling, which runs any code
    the file names, so only for a run's own files (``--resume``, and ``marl.load_policy`` /
    ``marl.evaluate`` / ``marl.export`` when told to trust a run written before policy
    artifacts)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no checkpoint at {path!r}")
    return torch.load(path, map_location=map_location, weights_only=False)


def _check_payload(payload: Any) -> None:
    if not isinstance(payload, dict):
        raise ValueError(f"not a training checkpoint (a {type(payload).__name__})")
    missing = [k for k in REQUIRED_KEYS if k not in payload]
    if missing:
        raise ValueError(f"not a training checkpoint (missing {', '.join(missing)})")


def describe_checkpoint(run_dir: str, path: str) -> str:
    """``checkpoints/ckpt_40.pt`` (and ``= latest.pt`` when latest.pt is that file)."""
    rel = os.path.relpath(path, run_dir)
    latest = latest_path(run_dir)
    if os.path.basename(path) != "latest.pt" and _same_file(path, latest):
        rel += " (= checkpoints/latest.pt)"
    return rel


def load_newest_checkpoint(
    run_dir: str,
    map_location: str | torch.device = "cpu",
    *,
    warn: Callable[[str], None] | None = None,
) -> tuple[dict[str, Any], str, list[str]]:
    """``(payload, path, failed)``: the newest checkpoint of ``run_dir`` that loads and holds a
    training state. Each newer one that fails is reported through ``warn`` (by file name and
    cause) and listed in ``failed``. Raises :class:`CheckpointError` when none loads (or there
    is none)."""
    candidates = list_checkpoints(run_dir)
    if not candidates:
        raise CheckpointError(
            f"no checkpoint in {os.path.join(run_dir, 'checkpoints')!r} (the run stopped before "
            "its first checkpoint)"
        )
    failed: list[str] = []
    reasons: list[str] = []
    for path in candidates:
        name = describe_checkpoint(run_dir, path)
        try:
            payload = load_checkpoint(path, map_location)
            _check_payload(payload)
        except Exception as exc:  # noqa: BLE001 - any failure to load: try the next older one
            cause = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            reasons.append(f"{name}: {cause}")
            failed.append(path)
            if warn is not None:
                warn(f"checkpoint {name} could not be loaded ({cause}); trying the next older one")
            continue
        return payload, path, failed
    raise CheckpointError(f"no checkpoint of {run_dir!r} could be loaded: " + "; ".join(reasons))


# ------------------------------------------------------------------------------------------
# the run directory's lock
# ------------------------------------------------------------------------------------------
def rng_state() -> dict[str, Any]:
    """The global RNG states of torch (CPU and CUDA), numpy and Python's ``random``."""
    state = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore :func:`rng_state` output."""
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
