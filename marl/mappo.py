"""Old import path, kept for existing code: the same module as :mod:`marl.algos.mappo`."""

import sys

from marl.algos import mappo as _module

sys.modules[__name__] = _module
