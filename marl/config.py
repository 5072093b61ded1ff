"""Old import path, kept for existing code: the same module as :mod:`marl.run.config`."""

import sys

from marl.run import config as _module

sys.modules[__name__] = _module
