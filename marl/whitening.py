"""Public import path of the whitening library (implemented in :mod:`marl.core.whitening`)."""

from marl.core.whitening import *  # noqa: F403
from marl.core.whitening import __all__  # noqa: F401
