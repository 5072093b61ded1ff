"""numba compilation in a training process: one line per kernel family when one of its kernels
is compiled, and the seconds spent compiling, which the trainer keeps off the time budget.

The numba kernels of this package (the multisearch and websearch dynamics, the whitening
passes, the Mamba / Mamba2 scans) are compiled on first use and cached on disk
(``cache=True``): a fresh install, or an edit to a kernel's source, compiles them once (seconds
for an env, one to two minutes for the Mamba family on a 2-core machine); later processes load
them from the cache in milliseconds and print nothing. numba announces each actual
compilation, not a cache load, as a ``numba:compile`` event (:mod:`numba.core.event`), with the
dispatcher compiled; :class:`CompileClock` listens to those events.

:func:`compile_clock` returns the process's clock, registered with numba on the first call
(:func:`marl.run.train.train` calls it before its budget clock starts)::

    clock = compile_clock()
    wall0 = clock.wall_s
    ...  # train
    trained_s = time.perf_counter() - t_start - (clock.wall_s - wall0)
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

try:
    from numba.core import event as numba_event
except ImportError:  # pragma: no cover - numba is a core dependency
    numba_event = None

__all__ = ["KERNEL_FAMILIES", "CompileClock", "compile_clock", "kernel_family"]

#: (module prefix, family named in the line) of this package's kernels; a kernel of any other
#: module (an outside env's own numba code) is named by its top-level package
KERNEL_FAMILIES: tuple[tuple[str, str], ...] = (
    ("envs.websearch", "websearch env"),
    ("envs._multisearch_core", "multisearch env"),
    ("envs._multisearch_kernels", "multisearch env"),
    ("envs.baselines", "multisearch heuristic"),
    ("marl.core.kernels.gru_numba", "GRU recurrence"),
    ("marl.core.kernels", "whitening"),
    ("seqmodels.kernels", "Mamba / Mamba2"),
)

COMPILE_EVENT = "numba:compile"


def kernel_family(module: str) -> str | None:
    """The family of a kernel defined in ``module`` (:data:`KERNEL_FAMILIES`); None for numba's
    own functions, which it compiles as part of compiling a kernel that calls them."""
    for prefix, family in KERNEL_FAMILIES:
        if module == prefix or module.startswith(prefix + "."):
            return family
    package = module.split(".")[0]
    return None if package in ("", "numba") else package


def _announce_on_stderr(family: str) -> None:
    print(
        f"[marl] compiling the {family} kernels (numba): once, later runs load them from "
        "numba's cache; a training budget does not count this time",
        file=sys.stderr,
        flush=True,
    )


class CompileClock:
    """Wall and CPU seconds this process spent compiling numba kernels (a kernel's callees,
    compiled inside its compilation, counted once), and ``announce(family)`` the first time a
    kernel of each family (:func:`kernel_family`) is compiled.

    numba compiles under one process-wide lock, so compilations never overlap across threads;
    the CPU seconds are the compiling thread's (``time.thread_time``), so that other threads'
    work during a compilation stays counted.
    """

    def __init__(self, announce: Callable[[str], None] = _announce_on_stderr) -> None:
        self.wall_s = 0.0
        self.cpu_s = 0.0
        self.families: set[str] = set()
        self._announce = announce
        self._local = threading.local()  # per thread: depth of nested compilations, start

    def start(self, module: str) -> None:
        """A compilation of a kernel of ``module`` begins."""
        family = kernel_family(module)
        if family is not None and family not in self.families:
            self.families.add(family)
            self._announce(family)
        depth = getattr(self._local, "depth", 0)
        if depth == 0:
            self._local.started = (time.perf_counter(), time.thread_time())
        self._local.depth = depth + 1

    def end(self) -> None:
        """The compilation begun last ends (compiled or failed)."""
        self._local.depth -= 1
        if self._local.depth == 0:
            wall0, cpu0 = self._local.started
            self.wall_s += time.perf_counter() - wall0
            self.cpu_s += time.thread_time() - cpu0


def _module_of(data: Any) -> str:
    """The module of the kernel a ``numba:compile`` event compiles."""
    dispatcher = data.get("dispatcher") if isinstance(data, dict) else None
    py_func = getattr(dispatcher, "py_func", None)
    return str(getattr(py_func, "__module__", None) or "numba")


if numba_event is not None:

    class _Listener(numba_event.Listener):
        """Feeds numba's ``numba:compile`` events to a :class:`CompileClock`."""

        def __init__(self, clock: CompileClock) -> None:
            self.clock = clock

        def on_start(self, event: Any) -> None:
            self.clock.start(_module_of(event.data))

        def on_end(self, event: Any) -> None:  # noqa: ARG002
            self.clock.end()


@functools.lru_cache(maxsize=1)
def compile_clock() -> CompileClock:
    """This process's :class:`CompileClock`, fed by numba from the first call on (a clock that
    stays at zero where numba is not installed)."""
    clock = CompileClock()
    if numba_event is not None:
        numba_event.register(COMPILE_EVENT, _Listener(clock))
    return clock
