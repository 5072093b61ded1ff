"""Old import path, kept for existing code: the same module as :mod:`marl.collect`."""

import sys

import marl.collect as _module

sys.modules[__name__] = _module
