"""Old import path, kept for existing code: the same module as :mod:`marl.core.whitening`."""

import sys

from marl.core import whitening as _module

sys.modules[__name__] = _module
