"""Worker processes for the adapter (``--env.adapter_workers W``): W processes each step a
contiguous slice of the copies with the same :class:`marl.adapters.CopyBatch` as in-process
stepping, so the results are identical; the main process sends actions and gathers arrays.

Worth it only for envs whose step costs much more than the round trip (a message per worker
and step, plus pickling each copy's arrays) and when cores are free: ``benchmarks/adapters.py``
measures it (figures in BENCHMARKS.md and docs/results/adapters/).

Workers start with ``spawn`` (safe with torch's threads; a script read from standard input
cannot start them, a limitation of Python's ``spawn``) and ignore SIGINT and SIGTERM: the
trainer handles both by finishing its update and writing a checkpoint, so its workers must
live until it closes them, also when the signal goes to the whole process group (Ctrl-C in a
terminal, ``kill -TERM -PGID``, torchrun stopping its ranks). They are shut down by
``close()``, when the vector env is garbage-collected or the process exits, and exit by
themselves when the process that started them is gone (killed by SIGKILL, say): an idle
worker sees its pipe close, a busy one is caught by a watchdog thread within
:data:`ORPHAN_CHECK_S` seconds. A vector env with workers cannot be pickled: a resumed run
resets its envs.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import threading
import time
import traceback
import weakref
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from marl.adapters.batching import BatchStep, CopyBatch
from marl.adapters.inspection import CopyFactory, EnvSpec

__all__ = ["WorkerBatch", "WorkerError", "ORPHAN_CHECK_S"]

#: How often (seconds) a worker checks that the process that started it is still its parent.
ORPHAN_CHECK_S = 0.5


class WorkerError(RuntimeError):
    """An exception inside a worker process (the message holds its traceback)."""


def _exit_when_orphaned(parent_pid: int) -> None:
    """Watchdog thread of a worker: end the process at once when ``parent_pid`` is no longer its
    parent (the trainer died without closing it, e.g. by SIGKILL during a long env step)."""
    while True:
        time.sleep(ORPHAN_CHECK_S)
        if os.getppid() != parent_pid:
            os._exit(1)


def _worker_main(
    conn: Connection,
    make_copy: CopyFactory,
    spec: EnvSpec,
    n: int,
    autoreset: bool,
    parent_pid: int | None,
) -> None:
    """A worker's loop: build ``n`` copies, then answer (command, payload) messages.
    ``parent_pid``: the trainer's pid, watched (None: no watchdog, e.g. under a forkserver)."""
    # the trainer stops on SIGINT / SIGTERM after its update: the workers must outlive that
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if parent_pid is not None:
        if os.getppid() != parent_pid:  # the trainer died while this worker started
            return
        threading.Thread(target=_exit_when_orphaned, args=(parent_pid,), daemon=True).start()
    try:
        batch = CopyBatch(
            [make_copy() for _ in range(n)],
            spec,
            autoreset=autoreset,
            eager_state=spec.state_method != "obs",
        )
        conn.send(("ok", None))
    except BaseException:  # noqa: BLE001 - reported to the main process
        conn.send(("error", traceback.format_exc()))
        return
    while True:
        try:
            command, payload = conn.recv()
        except (EOFError, OSError):  # the main process is gone
            return
        try:
            if command == "close":
                batch.close()
                conn.send(("ok", None))
                return
            handler = {
                "reset": lambda p: batch.reset(*p),
                "step": batch.step,
                "state": lambda _p: batch.state(),
                "render": batch.render,
            }[command]
            conn.send(("ok", handler(payload)))
        except Exception:  # noqa: BLE001 - reported to the main process
            conn.send(("error", traceback.format_exc()))


def _shutdown(processes: list[Any], conns: list[Connection]) -> None:
    for conn in conns:
        with contextlib.suppress(BrokenPipeError, OSError):
            conn.send(("close", None))
    for process in processes:
        process.join(timeout=5)
        if process.is_alive():  # stuck in an env step; SIGTERM is ignored there
            process.kill()
            process.join(timeout=5)
    for conn in conns:
        conn.close()


class WorkerBatch:
    """``num_envs`` copies split over ``workers`` processes; the interface of
    :class:`marl.adapters.CopyBatch` (``reset``, ``step``, ``state``, ``render``, ``close``)."""

    def __init__(
        self,
        make_copy: CopyFactory,
        spec: EnvSpec,
        num_envs: int,
        workers: int,
        *,
        autoreset: bool,
        start_method: str = "spawn",
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        workers = min(workers, num_envs)
        self.n = num_envs
        base, extra = divmod(num_envs, workers)
        self.sizes = [base + (w < extra) for w in range(workers)]
        self.bounds = np.concatenate([[0], np.cumsum(self.sizes)]).astype(int)
        context = mp.get_context(start_method)
        # spawn and fork start the workers as children of this process (a forkserver does not)
        parent_pid = os.getpid() if start_method in ("spawn", "fork") else None
        self._processes, self._conns = [], []
        for size in self.sizes:
            parent, child = context.Pipe()
            process = context.Process(
                target=_worker_main,
                args=(child, make_copy, spec, size, autoreset, parent_pid),
                daemon=True,
            )
            process.start()
            child.close()
            self._processes.append(process)
            self._conns.append(parent)
        self._finalizer = weakref.finalize(self, _shutdown, self._processes, self._conns)
        self._gather()

    def _gather(self) -> list[Any]:
        """Receive one answer from every worker (each was sent one message)."""
        answers, errors = [], []
        for w, conn in enumerate(self._conns):
            try:
                status, value = conn.recv()
            except (EOFError, OSError):  # closed or reset: the worker died (e.g. SIGKILL)
                self._processes[w].join(timeout=1.0)
                code = self._processes[w].exitcode
                status, value = "error", f"worker {w} exited unexpectedly (exit code {code})"
            if status == "error":
                errors.append(f"worker {w}:\n{value}")
            answers.append(value)
        if errors:
            self.close()
            raise WorkerError("adapter worker failed: " + "\n".join(errors))
        return answers

    def _call(self, command: str, payloads: Sequence[Any]) -> list[Any]:
        for conn, payload in zip(self._conns, payloads, strict=True):
            with contextlib.suppress(OSError):  # a dead worker: _gather reports it
                conn.send((command, payload))
        return self._gather()

    def _slices(self) -> list[slice]:
        return [
            slice(int(a), int(b)) for a, b in zip(self.bounds[:-1], self.bounds[1:], strict=True)
        ]

    def reset(self, seeds: Sequence[int | None], options: dict | None = None) -> BatchStep:
        seeds = list(seeds)
        parts = self._call("reset", [(seeds[s], options) for s in self._slices()])
        return BatchStep.concat(parts)

    def step(self, actions: np.ndarray) -> BatchStep:
        return BatchStep.concat(self._call("step", [actions[s] for s in self._slices()]))

    def state(self) -> np.ndarray:
        return np.concatenate(self._call("state", [None] * len(self._conns)))

    def render(self, index: int) -> Any:
        w = int(np.searchsorted(self.bounds, index, side="right") - 1)
        self._conns[w].send(("render", index - int(self.bounds[w])))
        status, value = self._conns[w].recv()
        if status == "error":
            raise WorkerError(f"adapter worker {w} failed:\n{value}")
        return value

    def close(self) -> None:
        self._finalizer()

    def __getstate__(self) -> dict:
        raise TypeError("a vector env with adapter worker processes cannot be pickled")
