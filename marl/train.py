"""``python -m marl.train``: the command-line entry point (see :mod:`marl.run.train`).

:func:`main` sizes numba's thread pool to the run's threads before the trainer (and numba) is
imported (:mod:`marl.run.numba_pool`); every other name is :mod:`marl.run.train`'s, imported
on first use.
"""

from __future__ import annotations

import sys
from typing import Any


def main(argv: list[str] | None = None) -> int:
    """``python -m marl.train`` / ``coopsearch-train``: :func:`marl.run.train.main`, with
    numba's pool sized first."""
    from marl.run.numba_pool import size_numba_pool

    argv = sys.argv[1:] if argv is None else argv
    size_numba_pool(argv)
    if "-h" not in argv and "--help" not in argv:
        from marl.run.train_seeds import main as seeds_main  # --seeds: a batch of runs

        status = seeds_main(argv)
        if status is not None:
            return status
    from marl.run.train import main as run_main

    return run_main(argv)


def __getattr__(name: str) -> Any:  # the old import path: marl.train.<name>
    if name.startswith("__"):  # e.g. __path__, asked by `from marl.train import main`
        raise AttributeError(name)
    import marl.run.train as _train

    return getattr(_train, name)


if __name__ == "__main__":
    raise SystemExit(main())
