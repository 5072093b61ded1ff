"""``python -m marl.compare``: the command-line entry point (see the module it re-exports)."""

from marl.experiments.compare import *  # noqa: F403
from marl.experiments.compare import __all__, main  # noqa: F401

if __name__ == "__main__":
    raise SystemExit(main())
