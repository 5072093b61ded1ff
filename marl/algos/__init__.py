"""Algorithms: the :class:`~marl.algos.base.Algorithm` interface, the shared PPO-style policy
update (:mod:`marl.algos.ppo`), and MAPPO / GRPO, each with its own configuration class.

:data:`ALGORITHMS` maps ``--algo`` names to algorithm classes; :func:`register_algorithm`
adds one (its ``config_class`` declares its options). The registry lives in
:mod:`marl.algos.base`; it is the one way a name becomes an algorithm and its config class:
``BaseConfig(algo=NAME, **fields)`` builds ``BaseConfig.for_algo(NAME)``, which is
``resolve_algorithm(NAME).config_class`` (``marl.run.config.TrainConfig`` is ``BaseConfig``
under the name the CLI contract uses, not another way).
"""

from __future__ import annotations

from marl.algos.base import (
    ALGORITHMS,
    Algorithm,
    BaseConfig,
    register_algorithm,
    resolve_algorithm,
)
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

register_algorithm(MAPPO)
register_algorithm(GRPO)
