"""Old import path, kept for existing code: the same module as :mod:`marl.experiments.studies`."""

import sys

from marl.experiments import studies as _module

sys.modules[__name__] = _module
