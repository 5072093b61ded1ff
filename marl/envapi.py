"""The environment contract the trainers depend on (docs/CONTRACTS.md section 1), as a typed
Protocol, and the one place that builds a vector env from ``--env-fn module:factory``.

The trainers (:mod:`marl.collect`, :mod:`marl.algos`) use only what :class:`VectorEnv`
declares, never an environment's internals. ``envs.multisearch_v0.vector_env`` is the native
implementation; any object with these attributes and methods works.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = ["VectorEnv", "resolve_env_fn", "make_vector_env", "agent_type"]

#: obs[agent] = {"observation": float32 [N, obs_dim], "action_mask": int8 [N, n_actions]}
ObsDict = dict[str, dict[str, np.ndarray]]


@runtime_checkable
class VectorEnv(Protocol):
    """N copies of a cooperative multi-agent env stepped together (docs/CONTRACTS.md s. 1).

    All agents of one env end their episode together. With ``autoreset`` (the default) an env
    whose episode ends at a step returns that step's rewards, flags and infos, but the next
    episode's observation; the final observation and state are in :attr:`final_obs` and
    :attr:`final_state`. ``infos[agent]`` carries ``reward_team``, ``reward_individual`` and
    ``reward_penalty`` (``rewards = team + individual + penalty``) and episode metrics.
    Agent type = ``name.rsplit("_", 1)[0]``.
    """

    num_envs: int
    possible_agents: list[str]
    max_cycles: int
    #: single-env Box(float32, (state_dim,)) of :meth:`state`
    state_space: Any
    #: like ``obs``; rows whose episode ended at the last step hold its final observation
    final_obs: ObsDict
    #: float32 [N, state_dim], likewise
    final_state: np.ndarray

    def observation_space(self, agent: str) -> Any:
        """Single-env Dict(observation=Box(float32, (obs_dim,)), action_mask=Box(int8, (A,)))."""

    def action_space(self, agent: str) -> Any:
        """Single-env Discrete(n_actions)."""

    def reset(
        self, seed: int | Sequence[int] | None = None, options: dict | None = None
    ) -> tuple[ObsDict, dict[str, dict[str, np.ndarray]]]:
        """``seed=s`` seeds env i with ``s + i``; a sequence seeds each env; None: unseeded."""

    def step(
        self, actions: Mapping[str, np.ndarray]
    ) -> tuple[
        ObsDict,
        dict[str, np.ndarray],
        dict[str, np.ndarray],
        dict[str, np.ndarray],
        dict[str, dict[str, np.ndarray]],
    ]:
        """``actions[agent]``: int array [N] -> (obs, rewards [N], terminations [N] bool,
        truncations [N] bool, infos[agent][key] [N])."""

    def state(self) -> np.ndarray:
        """float32 [N, state_dim]: the global state for centralised critics."""


def agent_type(name: str) -> str:
    """The agent type of an agent name: the prefix before the last ``_``."""
    return name.rsplit("_", 1)[0]


def resolve_env_fn(env_fn: str) -> Callable[..., Any]:
    """Import ``'module:function'`` (ValueError naming what is wrong)."""
    if ":" not in env_fn:
        raise ValueError(f"env_fn must be 'module:function', got {env_fn!r}")
    module_name, fn_name = env_fn.split(":", 1)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"env_fn {env_fn!r}: cannot import module {module_name!r}: {exc}") from exc
    fn = getattr(module, fn_name, None)
    if fn is None:
        raise ValueError(f"env_fn {env_fn!r}: module {module_name!r} has no {fn_name!r}")
    return fn


def make_vector_env(
    env_fn: str, num_envs: int, env_kwargs: Mapping[str, Any], *, autoreset: bool = True
) -> VectorEnv:
    """``env_fn(num_envs, autoreset=autoreset, **env_kwargs)``, checked against
    :class:`VectorEnv`."""
    vec = resolve_env_fn(env_fn)(num_envs, autoreset=autoreset, **env_kwargs)
    missing = [
        name
        for name in ("num_envs", "possible_agents", "observation_space", "action_space")
        + ("state_space", "reset", "step", "state")
        if not hasattr(vec, name)
    ]
    if missing:
        raise ValueError(
            f"env_fn {env_fn!r} returned a {type(vec).__name__}, which lacks {missing} of the "
            "vector-env contract (docs/CONTRACTS.md section 1)"
        )
    return vec
