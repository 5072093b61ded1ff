"""Old import path, kept for existing code: the same module as :mod:`marl.core.advantages`."""

import sys

from marl.core import advantages as _module

sys.modules[__name__] = _module
