"""The run directory: its layout, the rules for starting or continuing a run in it, its lock,
and the one atomic write every writer of the package uses; without torch.

A run directory (docs/CONTRACTS.md section 4) holds ``config.yaml``, ``metrics.jsonl``,
``eval.json``, ``checkpoints/``, ``policy/``, ``plots/``, ``tb/``, ``episode.gif`` and, written
last by a run that trained to its end, :data:`FINISHED_MARKER`: :class:`RunDir` names them.
A new run is refused in a directory that holds a run (:meth:`RunDir.check_new`) unless told to
overwrite it, which deletes those files only (:meth:`RunDir.remove_run_files`). A training
process holds ``RUN_DIR/.lock`` (:func:`lock_run_dir`, :meth:`RunDir.claim`); ``marl.compare``
waits on it before it resumes a run (:func:`wait_for_run_dir`). Importing this module is
cheap: ``marl.compare`` uses it without loading the trainer.

Every file the package replaces is written with :func:`atomic_write` (a temporary file beside
it, then one rename): a reader, or a crash, sees the old file or the new one, never half of
one; :func:`atomic_write_text`, :func:`atomic_write_json` and :func:`atomic_write_bytes` are
its common cases.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = [
    "FINISHED_MARKER",
    "RUN_FILES",
    "RUN_FOLDERS",
    "RunDir",
    "RunDirBusyError",
    "RunDirError",
    "atomic_write",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "lock_run_dir",
    "run_dir_contents",
    "wait_for_run_dir",
]

#: Written last by a run that trained to its end (update, env_steps, time_s, commit, ...):
#: ``marl.compare`` takes a run directory holding it as finished.
FINISHED_MARKER = "finished.json"

#: The files and folders a run writes in its directory: a directory holding any of them is a
#: run (and is refused as the --run-dir of a new run without --overwrite).
RUN_FILES = ("config.yaml", "metrics.jsonl", "eval.json", "episode.gif", FINISHED_MARKER)
RUN_FOLDERS = ("checkpoints", "policy", "tb", "plots")


class RunDirBusyError(RuntimeError):
    """Another process holds the run directory's lock (it is training there)."""


class RunDirError(ValueError):
    """The run directory cannot be used as asked: it holds a run and overwriting was not asked
    for, or a file stands where it should be."""


# ------------------------------------------------------------------------------------------
# atomic writes
# ------------------------------------------------------------------------------------------
def atomic_write(
    path: str, write: Callable[[str], object], *, suffix: str = "", parents: bool = False
) -> None:
    """Write ``path`` atomically: ``write(tmp)`` writes the whole file at ``tmp``, a temporary
    path beside ``path`` (``.NAME.tmpPID`` and ``suffix``, e.g. ``.gif`` for a writer that
    chooses the format by the extension), which then replaces ``path`` in one rename.

    ``parents``: create the folders above ``path`` first. Whatever ``write`` raises, the
    temporary file is removed and any previous file at ``path`` is left as it was; an
    ``OSError`` is raised again naming ``path`` (and its cause: ``ENOSPC``, ``EACCES``, ...).
    """
    folder, name = os.path.split(os.path.abspath(path))
    tmp = os.path.join(folder, f".{name}.tmp{os.getpid()}{suffix}")
    try:
        if parents:
            os.makedirs(folder, exist_ok=True)
        write(tmp)
        os.replace(tmp, path)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror or str(exc), path) from exc
    finally:
        with contextlib.suppress(OSError):
            if os.path.lexists(tmp):
                os.remove(tmp)


def atomic_write_text(path: str, text: str) -> None:
    """Write ``text`` to ``path`` with :func:`atomic_write`."""

    def write(tmp: str) -> None:
        with open(tmp, "w") as fh:
            fh.write(text)

    atomic_write(path, write)


def atomic_write_json(path: str, obj: Any, *, final_newline: bool = True) -> None:
    """``obj`` as indented JSON (with a final newline unless ``final_newline`` is False),
    written with :func:`atomic_write`."""
    atomic_write_text(path, json.dumps(obj, indent=2) + ("\n" if final_newline else ""))


def atomic_write_bytes(path: str, data: bytes | memoryview) -> None:
    """Write ``data`` to ``path`` with :func:`atomic_write`, the folders above it created, the
    bytes on disk (fsync) before the rename: what checkpoints and weights files use."""

    def write(tmp: str) -> None:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)

    atomic_write(path, write, parents=True)


# ------------------------------------------------------------------------------------------
# the layout and its rules
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunDir:
    """A run directory at ``path``: where each of its files lies, and the rules for a run that
    starts there (refused on an existing run unless overwriting; ``--overwrite`` deletes the
    run's files only) or continues there (``--resume``: the run's files are kept, its final
    outputs removed first)."""

    path: str

    def file(self, *parts: str) -> str:
        """``path/parts...``."""
        return os.path.join(self.path, *parts)

    @property
    def config_yaml(self) -> str:
        """``config.yaml``: the resolved configuration."""
        return self.file("config.yaml")

    @property
    def metrics_jsonl(self) -> str:
        """``metrics.jsonl``: one row per update."""
        return self.file("metrics.jsonl")

    @property
    def eval_json(self) -> str:
        """``eval.json``: the final evaluation."""
        return self.file("eval.json")

    @property
    def finished_json(self) -> str:
        """:data:`FINISHED_MARKER`, written last by a run that trained to its end."""
        return self.file(FINISHED_MARKER)

    @property
    def checkpoints(self) -> str:
        """``checkpoints/``: the resume states (:mod:`marl.run.checkpoint`)."""
        return self.file("checkpoints")

    @property
    def policy(self) -> str:
        """``policy/``: the policy artifact (:mod:`marl.run.artifact`)."""
        return self.file("policy")

    @property
    def plots(self) -> str:
        """``plots/``: learning curves and advantage histograms."""
        return self.file("plots")

    @property
    def episode_gif(self) -> str:
        """``episode.gif``: one evaluation episode."""
        return self.file("episode.gif")

    @property
    def lock_file(self) -> str:
        """``.lock``: held by the one process training here."""
        return self.file(".lock")

    def contents(self) -> list[str]:
        """The run files and folders present ([] for a missing or empty directory, or one
        holding only other files)."""
        if not os.path.isdir(self.path):
            return []
        return [n for n in RUN_FILES + RUN_FOLDERS if os.path.lexists(self.file(n))]

    def check_new(self, overwrite: bool) -> None:
        """A new run must not silently destroy an existing one: :class:`RunDirError` when a
        file stands at ``path``, or when it holds a run and ``overwrite`` is False."""
        if os.path.lexists(self.path) and not os.path.isdir(self.path):
            raise RunDirError(f"--run-dir {self.path!r} exists and is not a directory")
        found = self.contents()
        if found and not overwrite:
            raise RunDirError(
                f"--run-dir {self.path!r} already holds a run ({', '.join(found)}): continue it "
                f"with --resume {self.path}, or start it again with --overwrite (deletes those "
                "files), or choose another --run-dir"
            )

    def remove_run_files(self) -> None:
        """--overwrite: delete the previous run's files (only those; other files stay)."""
        for name in RUN_FOLDERS:
            path = self.file(name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            elif os.path.lexists(path):
                os.remove(path)
        for name in RUN_FILES:
            if os.path.lexists(self.file(name)):
                os.remove(self.file(name))

    @contextlib.contextmanager
    def claim(self, *, resume: bool, overwrite: bool) -> Iterator[None]:
        """Hold the directory for a run (created if missing; its lock held for the block) and
        clear what the run replaces: with ``overwrite`` the previous run's files; the final
        outputs of a finished run (finished.json, eval.json, and for a new run episode.gif),
        which a continued or restarted run writes again; and a new run's folders
        (checkpoints/, policy/, tb/, plots/)."""
        os.makedirs(self.path, exist_ok=True)
        with lock_run_dir(self.path):
            if not resume and overwrite:
                self.remove_run_files()
            outputs = (FINISHED_MARKER, "eval.json")
            for stale in outputs if resume else (*outputs, "episode.gif"):
                if os.path.exists(self.file(stale)):
                    os.remove(self.file(stale))
            if not resume:
                for stale_dir in ("tb", "checkpoints", "policy", "plots"):
                    shutil.rmtree(self.file(stale_dir), ignore_errors=True)
            yield


def run_dir_contents(run_dir: str) -> list[str]:
    """The run files and folders present in ``run_dir`` (:meth:`RunDir.contents`)."""
    return RunDir(run_dir).contents()


def _lock_path(run_dir: str) -> str:
    return RunDir(run_dir).lock_file


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
