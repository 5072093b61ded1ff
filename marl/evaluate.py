"""``python -m marl.evaluate``: the command-line entry point (see the module it re-exports)."""

from marl.run.evaluate import *  # noqa: F403
from marl.run.evaluate import __all__, main  # noqa: F401

if __name__ == "__main__":
    raise SystemExit(main())
