"""Algorithms: the :class:`~marl.algos.base.Algorithm` interface, the shared PPO-style policy
update (:mod:`marl.algos.ppo`), and MAPPO / GRPO, each with its own configuration class.

:data:`ALGORITHMS` maps ``--algo`` names to algorithm classes; :func:`register_algorithm`
adds one (its ``config_class`` declares its options).
"""

from __future__ import annotations

import importlib
from typing import Any

from marl.algos.base import Algorithm, BaseConfig, ConfigError
from marl.algos.grpo import GRPO, GRPOConfig
from marl.algos.mappo import MAPPO, MAPPOConfig

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "BaseConfig",
    "GRPO",
    "GRPOConfig",
    "MAPPO",
    "MAPPOConfig",
    "register_algorithm",
    "resolve_algorithm",
]

#: ``--algo`` name -> algorithm class
ALGORITHMS: dict[str, type[Algorithm]] = {"mappo": MAPPO, "grpo": GRPO}


def register_algorithm(cls: Any, name: str | None = None) -> type[Algorithm]:
    """Make ``cls`` (an :class:`Algorithm` with a ``config_class``) available as ``--algo NAME``
    to ``python -m marl.train``, ``marl.evaluate``, ``marl.load_policy`` and ``marl.compare``.

    ``NAME`` is ``name``, else ``cls.name``. Returns ``cls``, so it also works as a class
    decorator. (``register_algorithm("name", cls)`` is accepted too.)
    """
    if isinstance(cls, str):  # register_algorithm("name", cls)
        cls, name = name, cls
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        raise TypeError(f"register_algorithm: expected an Algorithm subclass, got {cls!r}")
    name = name or getattr(cls, "name", "")
    if not name:
        raise TypeError(
            f"register_algorithm({cls.__name__}): give a name, or set the class attribute "
            "`name` (the --algo value)"
        )
    ALGORITHMS[name] = cls
    return cls


def resolve_algorithm(spec: str) -> type[Algorithm]:
    """The algorithm ``--algo spec`` names: a registered name (:data:`ALGORITHMS`), or
    ``package.module:Class`` for one defined outside the package (the module is imported and
    the class registered under ``spec``, so that config.yaml's ``algo: package.module:Class``
    finds it again in a new process). Raises ConfigError with the allowed values."""
    if spec in ALGORITHMS:
        return ALGORITHMS[spec]
    module_name, sep, attr = spec.partition(":")
    if not sep:
        raise ConfigError(
            f"--algo: invalid value {spec!r}; allowed: {', '.join(ALGORITHMS)}, or "
            "package.module:Class for an algorithm defined in your own module"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"--algo {spec!r}: cannot import {module_name!r} ({exc})") from None
    cls = getattr(module, attr, None)
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        raise ConfigError(
            f"--algo {spec!r}: {module_name} has no Algorithm subclass named {attr!r}"
        )
    ALGORITHMS[spec] = cls
    return cls
