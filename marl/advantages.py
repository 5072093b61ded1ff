"""Public import path of the advantage estimators (implemented in :mod:`marl.core.advantages`)."""

from marl.core.advantages import *  # noqa: F403
from marl.core.advantages import __all__  # noqa: F401
