"""The run directory's layout and its guards, without torch: what a finished run holds, its
lock, and atomic writes.

A run directory (docs/CONTRACTS.md section 4) holds ``config.yaml``, ``metrics.jsonl``,
``eval.json``, ``checkpoints/``, ``policy/``, ``plots/``, ``tb/``, ``episode.gif`` and, written
last by a run that trained to its end, :data:`FINISHED_MARKER`. A training process holds
``RUN_DIR/.lock`` (:func:`lock_run_dir`); ``marl.compare`` waits on it before it resumes a run
(:func:`wait_for_run_dir`). Importing this module is cheap: ``marl.compare`` uses it without
loading the trainer.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "FINISHED_MARKER",
    "RunDirBusyError",
    "atomic_write_text",
    "atomic_write_json",
    "lock_run_dir",
    "wait_for_run_dir",
]

#: Written last by a run that trained to its end (update, env_steps, time_s, commit, ...):
#: ``marl.compare`` takes a run directory holding it as finished.
FINISHED_MARKER = "finished.json"


class RunDirBusyError(RuntimeError):
    """Another process holds the run directory's lock (it is training there)."""


def atomic_write_text(path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically (a temporary file beside it, then a rename): a
    reader sees the old file or the new one, never half of one. An OSError names ``path``."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise OSError(exc.errno, exc.strerror or str(exc), path) from exc


def atomic_write_json(path: str, obj: Any) -> None:
    """``obj`` as indented JSON (with a final newline), written with :func:`atomic_write_text`."""
    atomic_write_text(path, json.dumps(obj, indent=2) + "\n")


def _lock_path(run_dir: str) -> str:
    return os.path.join(run_dir, ".lock")


@contextlib.contextmanager
def lock_run_dir(run_dir: str) -> Iterator[None]:
    """Hold ``RUN_DIR/.lock`` (exclusive ``flock``) for the duration; raises
    :class:`RunDirBusyError` naming the holder's pid when another process holds it. A no-op
    where ``fcntl`` is missing (Windows)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    fh = open(_lock_path(run_dir), "a+")  # noqa: SIM115 - held for the duration
    try:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "unknown"
            raise RunDirBusyError(
                f"run directory {run_dir!r} is in use by another process (pid {holder}); wait "
                "for it to end or use another --run-dir"
            ) from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"{os.getpid()}\n")
        fh.flush()
        yield
    finally:
        fh.close()  # releases the lock


def wait_for_run_dir(run_dir: str, poll_s: float = 0.2, on_wait: Callable[[], None] | None = None):
    """Block until no process holds ``RUN_DIR/.lock`` (returns at once when none does);
    ``on_wait`` is called once if it has to wait."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        return
    path = _lock_path(run_dir)
    waited = False
    while os.path.isfile(path):
        with open(path) as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                pass
        if not waited and on_wait is not None:
            on_wait()
        waited = True
        time.sleep(poll_s)
