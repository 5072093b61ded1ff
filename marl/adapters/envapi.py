"""The environment contract the trainers depend on (docs/CONTRACTS.md section 1), as a typed
Protocol, and the one place that builds a vector env from ``--env-fn module:factory``.

The trainers (:mod:`marl.rollout.collect`, :mod:`marl.algos`) use only what :class:`VectorEnv`
declares, never an environment's internals. ``envs.multisearch_v0.vector_env`` is the native
implementation; any object with these attributes and methods works.

:func:`make_vector_env` detects what the factory is (it is never declared):

1. a **native vector-env factory**, ``factory(num_envs, autoreset=..., **env_kwargs)``: a
   callable with a ``num_envs`` parameter (or a required first positional one). The fast
   path, used as it is;
2. a factory (function or class) returning a **PettingZoo** ``ParallelEnv``;
3. a factory returning a **Gymnasium** ``Env``, including ``gymnasium:make`` with the env id
   as ``--env.id ID`` (any other ``--env.KEY`` goes to ``gymnasium.make`` too).

Cases 2 and 3 are called once without ``num_envs`` to see what they build (that env becomes
copy 0), then batched by :mod:`marl.adapters`: ``num_envs`` copies behind the same contract,
configured by the ``adapter_*`` env kwargs (:data:`marl.adapters.ADAPTER_OPTIONS`). An AEC
env, a Gymnasium vector env, or anything else is an error naming what was found and what is
accepted.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import gymnasium
import numpy as np
from pettingzoo.utils.env import AECEnv, ParallelEnv

from marl.adapters import (
    AdaptedVectorEnv,
    AdapterOptions,
    CopyBatch,
    CopyFactory,
    inspect_env,
    resolve_env_fn,
)
from marl.adapters.workers import WorkerBatch

__all__ = [
    "VectorEnv",
    "resolve_env_fn",
    "make_vector_env",
    "detect_env_factory",
    "agent_type",
    "ACCEPTED_FACTORIES",
]

#: what ``--env-fn`` accepts (for error messages)
ACCEPTED_FACTORIES = (
    "a native vector-env factory fn(num_envs, autoreset=..., **kw) (docs/CONTRACTS.md "
    "section 1), a factory (function or class) returning a pettingzoo ParallelEnv, or one "
    "returning a gymnasium Env (e.g. gymnasium:make with --env.id ID)"
)

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


def _native_by_signature(factory: Callable[..., Any]) -> bool | None:
    """True when the signature says native (a ``num_envs`` parameter, or a required first
    positional one), False when it says not, None when it cannot be read."""
    try:
        parameters = list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(p.name == "num_envs" for p in parameters):
        return True
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return bool(
        parameters
        and parameters[0].kind in positional
        and parameters[0].default is inspect.Parameter.empty
    )


def _kind_of_env(env: Any) -> str | None:
    """ "pettingzoo" | "gymnasium" for an env the adapter batches, else None."""
    if isinstance(env, (AECEnv, gymnasium.vector.VectorEnv)) or hasattr(env, "agent_selection"):
        return None
    if isinstance(env, ParallelEnv) or (
        hasattr(env, "possible_agents")
        and callable(getattr(env, "observation_space", None))
        and callable(getattr(env, "step", None))
    ):
        return "pettingzoo"
    if isinstance(env, gymnasium.Env) or (
        isinstance(getattr(env, "observation_space", None), gymnasium.spaces.Space)
        and isinstance(getattr(env, "action_space", None), gymnasium.spaces.Space)
        and callable(getattr(env, "step", None))
    ):
        return "gymnasium"
    return None


def _not_accepted(env_fn: str, found: type, why: str = "") -> ValueError:
    """The error for a factory building ``found`` (a class), naming what is accepted."""
    what = f"a {found.__module__}.{found.__qualname__}"
    hint = ""
    if issubclass(found, AECEnv) or hasattr(found, "agent_selection"):
        hint = (
            " (a PettingZoo AEC env: pass its parallel_env factory, or wrap it with "
            "pettingzoo.utils.conversions.aec_to_parallel)"
        )
    elif issubclass(found, gymnasium.vector.VectorEnv):
        hint = " (a Gymnasium vector env: pass the single-env factory; the adapter batches it)"
    return ValueError(f"env_fn {env_fn!r} built {what}{hint}{why}; accepted: {ACCEPTED_FACTORIES}")


def detect_env_factory(
    factory: Callable[..., Any], env_kwargs: Mapping[str, Any], env_fn: str = "env_fn"
) -> tuple[str, Any]:
    """(kind, first env): kind "native" (first env None: not built), "pettingzoo" or
    "gymnasium" (the env built from ``factory(**env_kwargs)``).

    Raises:
        ValueError: the factory builds nothing the adapter accepts (naming what it built), or
            ``gymnasium:make`` without an ``id``.
        TypeError: the factory rejects the keyword arguments (its own message, with env_fn).
    """
    if factory is gymnasium.make_vec:
        raise ValueError(
            f"env_fn {env_fn!r} builds a Gymnasium vector env: pass the single-env factory "
            "gymnasium:make (with --env.id ID); the adapter batches the copies itself"
        )
    if factory is gymnasium.make:
        if "id" not in env_kwargs:
            raise ValueError(
                f"env_fn {env_fn!r} needs the Gymnasium env id: pass --env.id ID "
                "(e.g. --env.id CartPole-v1; YAML env: {id: CartPole-v1})"
            )
    elif inspect.isclass(factory):
        if issubclass(factory, (AECEnv, gymnasium.vector.VectorEnv)):
            raise _not_accepted(env_fn, factory)
        if not issubclass(factory, (ParallelEnv, gymnasium.Env)) and _native_by_signature(factory):
            return "native", None
    elif _native_by_signature(factory):
        return "native", None
    try:
        env = factory(**env_kwargs)
    except TypeError as exc:
        raise TypeError(f"env_fn {env_fn!r} with env kwargs {dict(env_kwargs)}: {exc}") from exc
    kind = _kind_of_env(env)
    if kind is None:
        why = ""
        if hasattr(env, "num_envs"):
            why = (
                ", which looks like a vector env: a native factory must take num_envs as its "
                "first parameter"
            )
        raise _not_accepted(env_fn, type(env), why)
    return kind, env


def make_vector_env(
    env_fn: str | Callable[..., Any],
    num_envs: int,
    env_kwargs: Mapping[str, Any],
    *,
    autoreset: bool = True,
) -> VectorEnv:
    """A vector env of ``num_envs`` envs from ``env_fn`` (``'module:factory'`` or the factory).

    A native factory is called as ``env_fn(num_envs, autoreset=autoreset, **env_kwargs)``
    and checked against :class:`VectorEnv`; a PettingZoo / Gymnasium factory is batched by
    :class:`marl.adapters.AdaptedVectorEnv` (``adapter_*`` kwargs configure it; with
    ``adapter_workers`` >= 1 the copies step in worker processes).
    """
    name = env_fn if isinstance(env_fn, str) else getattr(env_fn, "__qualname__", repr(env_fn))
    factory = resolve_env_fn(env_fn) if isinstance(env_fn, str) else env_fn
    if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
        raise ValueError(f"num_envs must be an int >= 1, got {num_envs!r}")
    options, kwargs = AdapterOptions.split(env_kwargs)
    kind, first = detect_env_factory(factory, kwargs, name)
    if kind == "native":
        if options.explicit:
            given = ", ".join(sorted("adapter_" + k for k in options.explicit))
            raise ValueError(
                f"env_fn {name!r} is a native vector-env factory: the adapter options "
                f"({given}) apply only to PettingZoo / Gymnasium factories; remove them"
            )
        return _native(factory, name, num_envs, kwargs, autoreset)
    make_copy = CopyFactory(
        factory, kwargs, kind, env_fn=env_fn if isinstance(env_fn, str) else None
    )
    first = make_copy.wrap(first)
    try:
        spec = inspect_env(first, kind, options)
    except Exception:
        _close(first)
        raise
    if options.workers >= 1:
        _close(first)
        backend: Any = WorkerBatch(
            make_copy, spec, int(num_envs), options.workers, autoreset=autoreset
        )
    else:
        envs = [first] + [make_copy() for _ in range(int(num_envs) - 1)]
        backend = CopyBatch(envs, spec, autoreset=autoreset)
    return AdaptedVectorEnv(backend, spec, autoreset=autoreset)


def _close(env: Any) -> None:
    close = getattr(env, "close", None)
    if callable(close):
        close()


def _native(
    factory: Callable[..., Any],
    name: str,
    num_envs: int,
    kwargs: Mapping[str, Any],
    autoreset: bool,
) -> VectorEnv:
    try:
        vec = factory(num_envs, autoreset=autoreset, **kwargs)
    except TypeError as exc:
        raise TypeError(
            f"env_fn {name!r} (a native vector-env factory, called as fn(num_envs, "
            f"autoreset=..., **{dict(kwargs)})): {exc}"
        ) from exc
    missing = [
        attr
        for attr in ("num_envs", "possible_agents", "observation_space", "action_space")
        + ("state_space", "reset", "step", "state")
        if not hasattr(vec, attr)
    ]
    if missing:
        kind = _kind_of_env(vec)
        hint = (
            f" (it is a {kind} env: its factory must not take num_envs or a required "
            "positional argument, so that the adapter can batch it)"
            if kind
            else ""
        )
        raise ValueError(
            f"env_fn {name!r} returned a {type(vec).__name__}, which lacks {missing} of the "
            f"vector-env contract (docs/CONTRACTS.md section 1){hint}; accepted: "
            f"{ACCEPTED_FACTORIES}"
        )
    return vec
