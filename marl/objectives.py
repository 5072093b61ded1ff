"""Old import path, kept for existing code: the same module as :mod:`marl.core.losses`."""

import sys

from marl.core import losses as _module

sys.modules[__name__] = _module
