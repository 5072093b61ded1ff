"""``marl.advantages``: the public import path of :mod:`marl.core.advantages` (a project contract:
checks outside the package import ``marl.advantages``); the same module object."""

import sys

from marl.core import advantages as _module

sys.modules[__name__] = _module
