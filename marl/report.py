"""Old import path, kept for existing code: the same module as :mod:`marl.experiments.report`."""

import sys

from marl.experiments import report as _module

sys.modules[__name__] = _module
