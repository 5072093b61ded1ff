"""What an outside env looks like to the trainers: its agents and types, spaces, state and
episode limit (:func:`inspect_env`), and how copies of it are made (:class:`CopyFactory`)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium
import numpy as np
from pettingzoo.utils.env import ParallelEnv

from marl.adapters.encoders import (
    SpaceEncoder,
    action_size,
    make_encoder,
    observation_encoder,
)
from marl.adapters.options import GYM_AGENT, AdapterOptions


@dataclass(frozen=True)
class AgentSpec:
    """One agent as the trainer sees it."""

    name: str  #: the trainer's name, ``<type>_<index>``
    env_name: Any  #: the env's name
    type_name: str
    obs_encoder: SpaceEncoder
    mask_in_obs: bool  #: the observation is a Dict carrying ``action_mask``
    n_actions: int
    action_start: int


@dataclass(frozen=True)
class EnvSpec:
    """What the adapter learnt from the first copy (shared by every copy and worker)."""

    kind: str  #: "pettingzoo" | "gymnasium"
    agents: tuple[AgentSpec, ...]
    #: "obs" (concatenated observations) or the env method giving the state
    state_method: str
    state_encoder: SpaceEncoder | None
    state_dim: int
    max_cycles: int
    team_reward: str
    reward_channels: str
    team_reward_explicit: bool
    index: dict[Any, int] = field(default_factory=dict)  #: env name -> agent index

    @property
    def obs_dims(self) -> tuple[int, ...]:
        return tuple(a.obs_encoder.dim for a in self.agents)


def _trainer_names(env_names: Sequence[Any], types: Mapping[str, str] | None) -> list[tuple]:
    """[(trainer name, type)] for the env's agents, in order (see the module doc)."""
    if types:
        unknown = sorted(set(types) - {str(n) for n in env_names})
        if unknown:
            raise ValueError(
                f"adapter_types names agents the env does not have: {unknown}; its agents: "
                f"{[str(n) for n in env_names]}"
            )
    typed: list[tuple[str, int | None]] = []
    for name in env_names:
        text = str(name)
        if types and text in types:
            typed.append((types[text], None))
            continue
        prefix, _, suffix = text.rpartition("_")
        if prefix and suffix.isdigit():
            typed.append((prefix, int(suffix)))
        else:
            typed.append((text if text.isidentifier() else "agent", None))
    out: list[tuple[str, str]] = [("", "")] * len(typed)
    for typ in dict.fromkeys(t for t, _ in typed):
        members = [i for i, (t, _) in enumerate(typed) if t == typ]
        suffixes = [typed[i][1] for i in members]
        keep = all(s is not None for s in suffixes) and len(set(suffixes)) == len(suffixes)
        for k, i in enumerate(members):
            out[i] = (f"{typ}_{suffixes[k] if keep else k}", typ)
    return out


def _declared_max_cycles(env: Any) -> int | None:
    for obj in (env, getattr(env, "unwrapped", None)):
        if obj is None:
            continue
        for attr in ("max_cycles", "max_episode_steps", "_max_episode_steps", "max_episode_length"):
            value = getattr(obj, attr, None)
            if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value > 0:
                return int(value)
        spec = getattr(obj, "spec", None)
        steps = getattr(spec, "max_episode_steps", None)
        if isinstance(steps, int) and steps > 0:
            return steps
    return None


def _has_own_state(env: Any) -> bool:
    """Whether the env defines ``state()`` (not PettingZoo's NotImplementedError stub) and a
    ``state_space`` (PettingZoo's wrappers copy it only from an env that has one)."""
    method = getattr(type(env), "state", None)
    return method is not None and method is not ParallelEnv.state and hasattr(env, "state_space")


def inspect_env(env: Any, kind: str, options: AdapterOptions) -> EnvSpec:
    """Read agents, spaces, state and episode limit from one copy (a parallel-env face).

    Raises:
        UnsupportedSpaceError: a space the adapter cannot map.
        ValueError: agents of one type with different spaces, a missing episode limit, or a
            state option the env cannot honour.
    """
    env_names = list(env.possible_agents)
    if not env_names:
        raise ValueError("the env has no agents (possible_agents is empty)")
    names = _trainer_names(env_names, options.types)
    agents = []
    for env_name, (name, typ) in zip(env_names, names, strict=True):
        what = f"agent {env_name!r}"
        encoder, mask_in_obs = observation_encoder(
            env.observation_space(env_name), f"observation of {what}"
        )
        n, start = action_size(env.action_space(env_name), f"action space of {what}")
        agents.append(AgentSpec(name, env_name, typ, encoder, mask_in_obs, n, start))
    for typ in dict.fromkeys(a.type_name for a in agents):
        members = [a for a in agents if a.type_name == typ]
        shapes = {(a.obs_encoder.dim, a.n_actions, a.action_start) for a in members}
        if len(shapes) > 1:
            detail = ", ".join(
                f"{a.env_name}: obs {a.obs_encoder.dim}, actions {a.n_actions}" for a in members
            )
            raise ValueError(
                f"agents of type {typ!r} have different spaces ({detail}); one actor serves a "
                "type: give them types of their own with --env.adapter_types "
                "'{name: type, ...}'"
            )
    state_method, state_encoder = "obs", None
    if options.state == "auto":
        if kind == "pettingzoo" and _has_own_state(env):
            state_method = "state"
    elif options.state != "obs":
        target = env if hasattr(env, options.state) else getattr(env, "unwrapped", env)
        if not callable(getattr(target, options.state, None)):
            raise ValueError(f"adapter_state {options.state!r}: the env has no such method")
        state_method = options.state
    if state_method != "obs":
        space = getattr(env, "state_space", None)
        if space is None:
            space = getattr(getattr(env, "unwrapped", None), "state_space", None)
        if space is None:
            raise ValueError(
                f"adapter_state {state_method!r}: the env has no state_space to encode its "
                "state with; use adapter_state obs"
            )
        state_encoder = make_encoder(space, what="state_space")
        state_dim = state_encoder.dim
    else:
        state_dim = sum(a.obs_encoder.dim for a in agents)
    max_cycles = options.max_cycles or _declared_max_cycles(env)
    if max_cycles is None:
        raise ValueError(
            "the env declares no episode limit (max_cycles, spec.max_episode_steps, "
            "max_episode_length): pass --env.adapter_max_cycles N (the adapter then truncates "
            "episodes at N steps)"
        )
    return EnvSpec(
        kind=kind,
        agents=tuple(agents),
        state_method=state_method,
        state_encoder=state_encoder,
        state_dim=int(state_dim),
        max_cycles=int(max_cycles),
        team_reward=options.team_reward,
        reward_channels=options.reward_channels,
        team_reward_explicit="team_reward" in options.explicit,
        index={a.env_name: i for i, a in enumerate(agents)},
    )


class SingleAgentParallel:
    """A Gymnasium ``Env`` seen as a parallel env with the one agent ``agent_0``."""

    def __init__(self, env: gymnasium.Env, name: str = GYM_AGENT) -> None:
        self.env = env
        self.name = name
        self.possible_agents = [name]
        self.agents: list[str] = []

    @property
    def unwrapped(self) -> Any:
        return self.env.unwrapped

    @property
    def spec(self) -> Any:
        return getattr(self.env, "spec", None)

    def __getattr__(self, attr: str) -> Any:  # state_space, get_state, max_episode_length ...
        if attr == "env":
            raise AttributeError(attr)
        return getattr(self.env, attr)

    def observation_space(self, agent: str) -> Any:
        return self.env.observation_space

    def action_space(self, agent: str) -> Any:
        return self.env.action_space

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        obs, info = self.env.reset(seed=seed, options=options)
        self.agents = [self.name]
        return {self.name: obs}, {self.name: info}

    def step(self, actions: Mapping[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        obs, reward, terminated, truncated, info = self.env.step(actions[self.name])
        if terminated or truncated:
            self.agents = []
        n = self.name
        return {n: obs}, {n: reward}, {n: terminated}, {n: truncated}, {n: info}

    def render(self) -> Any:
        return self.env.render()

    def close(self) -> None:
        self.env.close()


class CopyFactory:
    """Builds one copy (a parallel-env face) from the user's factory.

    Picklable for worker processes: it travels as ``env_fn`` (``'module:factory'``, resolved
    again in the worker; mpe2's factories are closures that pickle cannot carry) when given,
    else as the factory object itself.
    """

    def __init__(
        self,
        factory: Callable[..., Any],
        kwargs: Mapping[str, Any],
        kind: str,
        env_fn: str | None = None,
    ) -> None:
        self.factory = factory
        self.kwargs = dict(kwargs)
        self.kind = kind  #: "pettingzoo" | "gymnasium"
        self.env_fn = env_fn

    def __call__(self) -> Any:
        if self.factory is None:
            self.factory = resolve_env_fn(self.env_fn)  # type: ignore[arg-type]
        return self.wrap(self.factory(**self.kwargs))

    def wrap(self, env: Any) -> Any:
        return SingleAgentParallel(env) if self.kind == "gymnasium" else env

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        if self.env_fn is not None:
            state["factory"] = None
        return state


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
