"""numba's runtime settings, on the caller's terms: seqmodels itself never changes them.

numba picks its threading layer (the thread pool its parallel kernels run on) once per process,
the first time a parallel kernel launches, from ``numba.config.THREADING_LAYER`` (the
``NUMBA_THREADING_LAYER`` environment variable, ``"default"`` unless set: tbb, else omp, else
workqueue). The choice matters for rollouts: GNU OpenMP's idle workers busy-wait after every
parallel kernel and take the cores from the torch ops between kernels, while workqueue's
workers sleep (``benchmarks/seqmodels.py --compare-threading-layers`` measures it: on omp
``Mamba.step`` at a large batch takes several times workqueue's time under load, and Mamba /
Mamba2 training is slower).
With a pool of one thread it is the other way round: omp runs a one-thread parallel region in
the calling thread (no worker exists to busy-wait), while workqueue still hands every kernel to
its one worker thread and waits for it (the fused Mamba step and a whole mamba MAPPO
iteration at one thread are slower on workqueue).
:func:`auto_threading_layer` picks by the pool size.

A program that wants a layer chooses it for its own process with
:func:`set_numba_threading_layer` before the first kernel runs; importing or running seqmodels
leaves the choice to numba.

Thread count: each kernel call runs with ``min(torch.get_num_threads(), NUMBA_NUM_THREADS)``
threads (:func:`torch_thread_count`) and restores the calling thread's numba thread count when
it returns, so ``torch.set_num_threads`` bounds both libraries and numba's own setting is left
as found.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Iterator
from types import ModuleType

import torch

#: Concrete layers (numba's names) and the behaviours numba resolves to one of them.
THREADING_LAYERS = ("workqueue", "omp", "tbb", "default", "safe", "threadsafe", "forksafe")

# the concrete layers that satisfy a requested name (numba's rules, Linux: GNU OpenMP is not
# fork-safe there)
_SATISFIES = {
    "workqueue": ("workqueue",),
    "omp": ("omp",),
    "tbb": ("tbb",),
    "default": ("tbb", "omp", "workqueue"),
    "safe": ("tbb",),
    "threadsafe": ("tbb", "omp"),
    "forksafe": ("tbb", "workqueue"),
}

# numba's module for each concrete layer (what numba itself imports when it starts the pool)
_LAYER_MODULES = {
    "workqueue": "numba.np.ufunc.workqueue",
    "omp": "numba.np.ufunc.omppool",
    "tbb": "numba.np.ufunc.tbbpool",
}


@functools.lru_cache(maxsize=1)
def numba_available() -> bool:
    """True when numba can be imported (the compiled CPU backend is usable)."""
    try:
        importlib.import_module("numba")
    except ImportError:  # pragma: no cover - numba is a declared dependency
        return False
    return True


def _numba() -> ModuleType:
    """The numba module, or an ImportError that says how to get it."""
    try:
        return importlib.import_module("numba")
    except ImportError as err:  # pragma: no cover - numba is a declared dependency
        raise ImportError(
            "seqmodels' compiled CPU kernels need numba: pip install numba "
            "(or use backend='chunked')"
        ) from err


def numba_threading_layer() -> str | None:
    """The threading layer numba's parallel kernels run on in this process ("workqueue",
    "omp" or "tbb"), or None while numba has not started its thread pool yet."""
    numba = _numba()
    try:
        return numba.threading_layer()
    except ValueError:  # "Threading layer is not initialized."
        return None


def numba_thread_safe() -> bool:
    """True when two Python threads may run numba's parallel kernels at the same time in this
    process: the threading layer numba runs on is omp or tbb or, while its pool has not
    started, the layer it will pick (``numba.config.THREADING_LAYER`` resolved as numba
    resolves it: the first loadable of the layers that satisfy it) is one of those. False for
    workqueue, which aborts the process when entered from two threads at once."""
    current = numba_threading_layer()
    if current is None:
        requested = str(_numba().config.THREADING_LAYER)
        candidates = _SATISFIES.get(requested, ())  # a name numba would refuse: unsafe
        current = next((n for n in candidates if _layer_loadable(n)), "workqueue")
    return current in _SATISFIES["threadsafe"]


def set_numba_threading_layer(name: str) -> None:
    """Choose numba's threading layer for this process (a program's own choice, e.g. the
    trainer's command line; seqmodels never calls it).

    Args:
        name: one of :data:`THREADING_LAYERS`: "workqueue" (workers sleep when idle: fastest
            for rollouts mixing small kernels and torch ops; numba aborts the process if two
            Python threads launch its kernels at the same time), "omp" (GNU OpenMP:
            thread-safe, idle workers busy-wait), "tbb" (needs the tbb package), or numba's
            behaviours "default", "safe", "threadsafe", "forksafe".

    Must run before numba starts its thread pool (the first Mamba / Mamba2 forward or step on
    the numba backend, or any other numba parallel function): calling it again with a layer
    that is already the one running (or one the running layer satisfies) is a no-op; any other
    name then raises RuntimeError. It sets ``numba.config.THREADING_LAYER`` (which takes
    precedence over ``NUMBA_THREADING_LAYER``); child processes do not inherit it.

    Raises:
        ValueError: ``name`` is not a threading layer, or its library cannot be loaded here.
        RuntimeError: numba already runs on another layer.
    """
    if name not in THREADING_LAYERS:
        raise ValueError(f"threading layer must be one of {THREADING_LAYERS}, got {name!r}")
    numba = _numba()
    current = numba_threading_layer()
    if current is not None:
        if current in _SATISFIES[name]:
            return
        raise RuntimeError(
            f"numba's threading layer is already initialised as {current!r}, cannot switch "
            f"to {name!r}: call set_numba_threading_layer({name!r}) before the first numba "
            f"kernel runs (or start the process with NUMBA_THREADING_LAYER={name})"
        )
    if name in _LAYER_MODULES:
        try:
            importlib.import_module(_LAYER_MODULES[name])
        except ImportError as err:
            hint = " (pip install tbb)" if name == "tbb" else ""
            raise ValueError(
                f"numba's {name!r} threading layer cannot be loaded here: {err}{hint}"
            ) from err
    numba.config.THREADING_LAYER = name


def auto_threading_layer(pool_threads: int | None = None) -> str:
    """The faster threading layer for a process whose numba pool has ``pool_threads`` threads
    (default: numba's ``NUMBA_NUM_THREADS``): "omp" for a one-thread pool (each kernel runs in
    the calling thread; see the module docstring), else "workqueue" (idle workers sleep);
    "workqueue" too where numba's omp layer cannot be loaded (no GNU OpenMP).

    Raises:
        ValueError: ``pool_threads`` is not an integer >= 1.
    """
    if pool_threads is None:
        pool_threads = int(_numba().config.NUMBA_NUM_THREADS)
    if isinstance(pool_threads, bool) or not isinstance(pool_threads, int) or pool_threads < 1:
        raise ValueError(f"pool_threads must be an integer >= 1, got {pool_threads!r}")
    if pool_threads == 1 and _layer_loadable("omp"):
        return "omp"
    return "workqueue"


def _layer_loadable(name: str) -> bool:
    """True when numba's module for the concrete layer ``name`` imports here."""
    try:
        importlib.import_module(_LAYER_MODULES[name])
    except ImportError:
        return False
    return True


@contextlib.contextmanager
def torch_thread_count() -> Iterator[None]:
    """Run the enclosed numba kernels with as many threads as torch uses (at most numba's
    ``NUMBA_NUM_THREADS``); the calling thread's numba thread count is restored on exit.
    (Starts numba's thread pool if it is not running yet, as the kernel's launch would.)"""
    numba = _numba()
    before = numba.get_num_threads()
    wanted = max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS))
    if wanted == before:
        yield
        return
    numba.set_num_threads(wanted)
    try:
        yield
    finally:
        numba.set_num_threads(before)


__all__ = [
    "THREADING_LAYERS",
    "auto_threading_layer",
    "numba_available",
    "numba_thread_safe",
    "numba_threading_layer",
    "set_numba_threading_layer",
    "torch_thread_count",
]
