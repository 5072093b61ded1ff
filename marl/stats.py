"""Old import path, kept for existing code: the same module as :mod:`marl.experiments.stats`."""

import sys

from marl.experiments import stats as _module

sys.modules[__name__] = _module
