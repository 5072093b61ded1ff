"""``marl.whitening``: the public import path of :mod:`marl.core.whitening` (a project contract:
checks outside the package import ``marl.whitening``); the same module object."""

import sys

from marl.core import whitening as _module

sys.modules[__name__] = _module
