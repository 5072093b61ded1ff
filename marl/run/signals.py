"""Stopping a training run by a signal: SIGINT (Ctrl-C) and SIGTERM (schedulers, ``timeout``,
``marl.compare``) finish the update in progress; the trainer then writes a checkpoint and exits
:data:`marl.run.config.EXIT_INTERRUPTED`.

A second SIGINT stops at once (``KeyboardInterrupt``); repeated SIGTERMs do not (a scheduler
or a dying parent may send several). Once the run is :attr:`StopSignals.finishing` (its final
evaluation: the final checkpoint is already written) either signal stops at once.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from types import FrameType
from typing import Any

__all__ = ["StopSignals"]

HANDLED = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    """A context manager: inside it SIGINT and SIGTERM ask the run to stop (:attr:`requested`)
    instead of killing it; on exit the previous handlers are back. Python takes signal handlers
    in the main thread only: elsewhere it installs nothing and the signals keep their handlers.

    ``announce``: say on stderr that a signal was received (rank 0 of a distributed run).
    """

    def __init__(self, announce: bool = True) -> None:
        self.announce = announce
        #: a signal asked the run to stop after its update
        self.requested = False
        #: the name of that signal ("SIGINT", "SIGTERM") and when it came (perf_counter)
        self.signal: str | None = None
        self.at: float | None = None
        #: the final evaluation runs: a signal stops at once
        self.finishing = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in HANDLED}
        return self

    def __exit__(self, *exc: object) -> None:
        for s, previous in self._previous.items():
            signal.signal(s, previous)
        self._previous = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:  # noqa: ARG002
        if self.finishing or (signum == signal.SIGINT and self.requested):
            raise KeyboardInterrupt
        if self.requested:
            return
        self.requested = True
        self.signal, self.at = signal.Signals(signum).name, time.perf_counter()
        if self.announce:
            print(
                f"\n[marl.train] {self.signal} received: stopping after this update "
                "and writing a checkpoint (Ctrl-C again to stop at once)",
                file=sys.stderr,
                flush=True,
            )

    def since(self) -> str:
        """`` 1.2s after SIGTERM`` (the time since the signal), or '' when none came."""
        if self.at is None:
            return ""
        return f" {time.perf_counter() - self.at:.1f}s after {self.signal}"
