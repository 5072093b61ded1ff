"""``python -m marl.export``: the command-line entry point (see the module it re-exports)."""

from marl.run.export import *  # noqa: F403
from marl.run.export import __all__, main  # noqa: F401

if __name__ == "__main__":
    raise SystemExit(main())
