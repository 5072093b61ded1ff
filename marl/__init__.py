"""coopsearch's trainers: MAPPO and GRPO for cooperating agents, grouped advantage whitening.

``marl.load_policy(run_dir)`` loads a trained policy (:mod:`marl.run.policy_api`); the layers are
``marl.core`` (advantage library), ``marl.adapters`` (the env contract, outside envs),
``marl.models`` (actors, critic), ``marl.rollout`` (the collector), ``marl.algos``, ``marl.run``
and ``marl.experiments``.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["load_policy", "__version__"]


def __getattr__(name: str) -> Any:
    # imported on first use, so that ``import marl.whitening`` stays light
    if name == "load_policy":
        from marl.run.policy_api import load_policy

        return load_policy
    raise AttributeError(f"module 'marl' has no attribute {name!r}")
