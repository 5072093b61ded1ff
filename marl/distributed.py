"""Old import path, kept for existing code: the same module as :mod:`marl.run.distributed`."""

import sys

from marl.run import distributed as _module

sys.modules[__name__] = _module
