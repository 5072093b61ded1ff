"""Old import path, kept for existing code: the same module as :mod:`marl.run.plots`."""

import sys

from marl.run import plots as _module

sys.modules[__name__] = _module
