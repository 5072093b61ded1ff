"""Old import path, kept for existing code: the same module as :mod:`marl.algos.grpo`."""

import sys

from marl.algos import grpo as _module

sys.modules[__name__] = _module
