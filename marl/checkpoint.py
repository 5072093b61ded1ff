"""Old import path, kept for existing code: the same module as :mod:`marl.run.checkpoint`."""

import sys

from marl.run import checkpoint as _module

sys.modules[__name__] = _module
