"""Algorithms: the :class:`~marl.algos.base.Algorithm` interface, the shared PPO-style policy
update (:mod:`marl.algos.ppo`), and MAPPO / GRPO, each with its own configuration class.

:data:`ALGORITHMS` maps ``--algo`` names to algorithm classes; :func:`register_algorithm`
adds one (its ``config_class`` declares its options).
"""

from __future__ import annotations

from marl.algos.base import Algorithm, BaseConfig
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
]

#: ``--algo`` name -> algorithm class
ALGORITHMS: dict[str, type[Algorithm]] = {"mappo": MAPPO, "grpo": GRPO}


def register_algorithm(name: str, cls: type[Algorithm]) -> None:
    """Make ``cls`` (an :class:`Algorithm` with a ``config_class``) available as ``--algo
    name``."""
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        raise TypeError(
            f"register_algorithm({name!r}): expected an Algorithm subclass, got {cls!r}"
        )
    ALGORITHMS[name] = cls
