"""The error type and argument checks both env cores share (``envs._multisearch_core``,
``envs.websearch``): a wrong type or an unknown argument is an :class:`ArgumentTypeError`, an
impossible value a ``ValueError``, each naming the argument and what is allowed."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["ArgumentTypeError", "check_float_field", "check_int_field"]


class ArgumentTypeError(TypeError, ValueError):
    """An argument of the wrong type (or an unknown argument). Both a ``TypeError`` and a
    ``ValueError``, so callers catching either see it."""


def check_int_field(config: Any, name: str, lo: int, hi: int | None = None) -> None:
    """Check that ``config.<name>`` is an int in [lo, hi] (no upper bound when hi is None) and
    store it as a Python int; ArgumentTypeError for a non-int (bool included), ValueError out of
    range, each naming the field and what is allowed."""
    value = getattr(config, name)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ArgumentTypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    setattr(config, name, int(value))
    if value < lo or (hi is not None and value > hi):
        allowed = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{name} must be {allowed}, got {value}")


def check_float_field(config: Any, name: str, lo: float, hi: float | None = None) -> None:
    """Check that ``config.<name>`` is a finite number in [lo, hi] and store it as a float;
    errors as :func:`check_int_field`'s."""
    value = getattr(config, name)
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
        raise ArgumentTypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    value = float(value)
    setattr(config, name, value)
    if not math.isfinite(value) or value < lo or (hi is not None and value > hi):
        allowed = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{name} must be a finite number {allowed}, got {value}")
