"""Size numba's thread pool to the run's thread count, before numba is imported.

numba fixes its pool size (``NUMBA_NUM_THREADS``, default: every core) when it is imported, and
seqmodels' parallel kernels then run with ``min(torch threads, pool size)`` threads
(:func:`seqmodels.kernels.numba_runtime.torch_thread_count`). A pool larger than the threads a
run uses still hands every kernel launch to a pool worker, and on a loaded machine each
hand-over waits for the scheduler: on a loaded 2-core machine a mamba MAPPO iteration took many
times longer with a 2-thread pool and 1 torch thread than with a 1-thread pool
(``benchmarks/train_mappo.py``). The training entry point (``python -m marl.train``,
``coopsearch-train``) therefore sets ``NUMBA_NUM_THREADS`` to the run's thread count before
anything imports numba, unless the user set it. This module imports neither numba nor torch.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

__all__ = ["default_threads", "size_numba_pool"]


def default_threads() -> int:
    """The trainer's default thread count per process: up to 2, the cores shared among
    torchrun's local ranks (``LOCAL_WORLD_SIZE``)."""
    local_world = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    return max(1, min(2, (os.cpu_count() or 1) // local_world))


def _threads_from_argv(argv: Sequence[str]) -> int | None:
    """``--torch-threads N`` / ``--torch-threads=N`` from a command line (None: absent,
    ``none``/``0`` or not an integer; the CLI parser reports bad values itself)."""
    value = None
    for i, arg in enumerate(argv):
        if arg == "--torch-threads" and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith("--torch-threads="):
            value = arg.split("=", 1)[1]
    try:
        n = int(value) if value is not None else 0
    except ValueError:
        return None
    return n if n >= 1 else None


def size_numba_pool(argv: Sequence[str]) -> int | None:
    """Set ``NUMBA_NUM_THREADS`` for this process from the command line's ``--torch-threads``
    (else :func:`default_threads`); returns the value set, or None when the user's own
    ``NUMBA_NUM_THREADS`` stands or numba is already imported (too late to size its pool)."""
    if "NUMBA_NUM_THREADS" in os.environ or "numba" in sys.modules:
        return None
    threads = _threads_from_argv(argv) or default_threads()
    os.environ["NUMBA_NUM_THREADS"] = str(threads)
    return threads
