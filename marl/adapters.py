"""Outside environments behind the trainers' vector-env contract (docs/CONTRACTS.md section 1).

:func:`marl.envapi.make_vector_env` detects what ``--env-fn module:factory`` builds and, for a
PettingZoo ``ParallelEnv`` or a Gymnasium ``Env``, batches ``num_envs`` copies with the pieces
here. A native vector-env factory (``envs.multisearch_v0:vector_env``) needs none of this.

What maps how
-------------
================  ==========================================================================
part              mapping
================  ==========================================================================
agents            PettingZoo ``possible_agents``; a Gymnasium env is a team of one,
                  ``agent_0``. The trainers need ``<type>_<index>`` names: a name of that form
                  keeps its name and its prefix is its type (``speaker_0`` -> ``speaker``);
                  any other name becomes ``<name>_0`` (a type of its own);
                  ``adapter_types`` maps env names to types explicitly (then the agents of a
                  type are renamed ``<type>_0, <type>_1, ...`` in ``possible_agents`` order).
                  ``vec.env_agent_names`` maps the trainer's names back to the env's.
observations      Box flattened to float32 (1-D and 2-D; more dimensions, or a uint8 Box of 2+
                  dimensions, is an image: error); Discrete one-hot; MultiDiscrete one-hot per
                  entry, concatenated; MultiBinary as 0/1; Tuple and Dict concatenated
                  (recursively, Dict in key order). A Dict with an ``action_mask`` key
                  (PettingZoo's masking convention) gives the mask, the other keys
                  (``observation`` first) the observation.
actions           Discrete(n, start) only (the trainer's action ``k`` is sent as
                  ``start + k``); Box (continuous), MultiDiscrete, MultiBinary, Tuple, ...:
                  error naming the space.
action mask       the observation dict's ``action_mask``, else ``infos[agent]["action_mask"]``
                  of that step (or of the reset), else all actions allowed.
rewards           an env whose infos carry ``reward_team``, ``reward_individual`` and
                  ``reward_penalty`` keeps its channels; otherwise individual = the agent's own
                  reward, team = mean of the live agents' rewards (``adapter_team_reward``:
                  ``mean`` | ``sum`` | ``none``), penalty = 0. ``rewards[agent]`` is always the
                  env's own reward (0 once the agent has left).
dones             per env: the episode ends when no agent is left (or at ``max_cycles``). It
                  is *truncated* when one of the agents ending at that step was truncated and
                  not terminated, else *terminated*; every agent carries the env's flags.
agents leaving    an agent that is done before the others (PettingZoo allows it) gets a zero
early             observation, an all-allowed mask, zero rewards in every channel (the team
                  channel stays the team's) and ``infos[agent]["active"] = 0.0`` from the
                  next step on; ``active`` is 1.0 on every step where the agent acted (its
                  last one included): a loss mask for the trainer. Every agent is back at reset.
state             ``env.state()`` (encoded with ``env.state_space``) when the env has one, else
                  the concatenated encoded observations of all agents (``adapter_state``).
infos             every numeric (int, float, bool) info key of the env, per agent, float64
                  ``[N]`` (0 where a copy did not report it at that step), plus the channels
                  and ``active``.
max_cycles        ``adapter_max_cycles``, else what the env declares (``max_cycles``,
                  ``spec.max_episode_steps``, ``max_episode_length``); the adapter truncates an
                  episode that reaches it (a time limit). An env that declares none needs the
                  option.
================  ==========================================================================

How the whitening schemes behave on an env without reward channels (team = mean of the live
agents' rewards, individual = own reward): ``team_individual`` (the default) mixes the whitened
advantage of the team's mean reward (team value head) with the whitened advantage of the
agent's own reward (individual value head) by ``alpha``; for a single agent, or agents that
share one reward, both are estimates of the same advantage. Every other scheme whitens the sum
``team + individual`` of the two advantages within its groups (type, position, chunk, ...), a
scale the whitening removes. ``adapter_team_reward none`` makes the team channel zero (its
whitened advantage is 0: ``team_individual`` then uses the individual advantage weighted by
``1 - alpha``, the other schemes independent learners); ``sum`` uses the team's summed reward.

Options
-------
Environment keyword arguments that start with ``adapter_`` (``--env.adapter_team_reward sum``,
YAML ``env: {adapter_team_reward: sum}``) configure the adapter and are not passed to the
factory; an unknown ``adapter_*`` key, an invalid value, or an adapter option given to a native
vector-env factory is an error (:data:`ADAPTER_OPTIONS` lists them).
"""

from __future__ import annotations

import importlib
import pickle
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces
from pettingzoo.utils.env import ParallelEnv

__all__ = [
    "ADAPTER_PREFIX",
    "ADAPTER_OPTIONS",
    "AdapterOptions",
    "UnsupportedSpaceError",
    "SpaceEncoder",
    "make_encoder",
    "AgentSpec",
    "EnvSpec",
    "SingleAgentParallel",
    "CopyFactory",
    "resolve_env_fn",
    "inspect_env",
    "BatchStep",
    "CopyBatch",
    "AdaptedVectorEnv",
]

ADAPTER_PREFIX = "adapter_"
TEAM_REWARD_MODES = ("mean", "sum", "none")
REWARD_CHANNEL_MODES = ("auto", "infos", "reward")
CHANNEL_KEYS = ("reward_team", "reward_individual", "reward_penalty")
#: info keys the adapter writes itself (an env's own values under these names are replaced)
RESERVED_INFO_KEYS = (*CHANNEL_KEYS, "active")

#: option (without the prefix) -> what it does; also the help text of the error messages
ADAPTER_OPTIONS: dict[str, str] = {
    "team_reward": "team channel of an env without reward-channel infos: mean (default) | "
    "sum | none of the live agents' rewards",
    "reward_channels": "auto (default: the env's reward_team/reward_individual/reward_penalty "
    "infos when every live agent reports all three, else from the rewards) | infos (require "
    "them) | reward (ignore them)",
    "types": "explicit agent types: a mapping env agent name -> type name (YAML "
    "'{a: t, b: t}'), or 'a:t,b:t'; names left out follow the <type>_<index> rule",
    "state": "auto (default: env.state() when the env has a state_space, else the "
    "concatenated observations) | obs | the name of an env method returning a value of "
    "env.state_space (e.g. get_state)",
    "max_cycles": "episode limit in steps (default: the env's own; required when it declares "
    "none); the adapter truncates at it",
    "workers": "worker processes stepping the copies (0, the default: in this process)",
}

#: the names a Gymnasium env's single agent gets
GYM_AGENT = "agent_0"


class UnsupportedSpaceError(ValueError):
    """A space the adapter cannot encode (the message names it and what is supported)."""


# ------------------------------------------------------------------------------------ options


def _parse_types(value: Any) -> dict[str, str]:
    if isinstance(value, str):
        pairs = {}
        for item in filter(None, (p.strip() for p in value.split(","))):
            if ":" not in item:
                raise ValueError(
                    f"adapter_types: expected 'name:type,name:type', got item {item!r}"
                )
            name, typ = (s.strip() for s in item.rsplit(":", 1))
            pairs[name] = typ
        value = pairs
    if not isinstance(value, Mapping) or not value:
        raise ValueError(
            f"adapter_types must be a non-empty mapping env agent name -> type, got {value!r}"
        )
    out = {}
    for name, typ in value.items():
        if not isinstance(typ, str) or not typ.isidentifier():
            raise ValueError(
                f"adapter_types[{name!r}] must be a type name (an identifier), got {typ!r}"
            )
        out[str(name)] = typ
    return out


@dataclass(frozen=True)
class AdapterOptions:
    """The ``adapter_*`` environment keyword arguments (see :data:`ADAPTER_OPTIONS`)."""

    team_reward: str = "mean"
    reward_channels: str = "auto"
    types: Mapping[str, str] | None = None
    state: str = "auto"
    max_cycles: int | None = None
    workers: int = 0
    #: the options given explicitly (without the prefix)
    explicit: frozenset[str] = frozenset()

    @classmethod
    def split(cls, env_kwargs: Mapping[str, Any]) -> tuple[AdapterOptions, dict[str, Any]]:
        """(validated adapter options, the remaining keyword arguments for the factory)."""
        given: dict[str, Any] = {}
        rest: dict[str, Any] = {}
        for key, value in env_kwargs.items():
            if isinstance(key, str) and key.startswith(ADAPTER_PREFIX):
                name = key[len(ADAPTER_PREFIX) :]
                if name not in ADAPTER_OPTIONS:
                    known = ", ".join(ADAPTER_PREFIX + k for k in ADAPTER_OPTIONS)
                    raise ValueError(f"unknown adapter option {key!r}; known: {known}")
                given[name] = value
            else:
                rest[key] = value
        values: dict[str, Any] = {}
        if "team_reward" in given:
            v = given["team_reward"]
            v = "none" if v is None else v  # YAML reads 'none' as None
            if v not in TEAM_REWARD_MODES:
                raise ValueError(
                    f"adapter_team_reward must be one of {', '.join(TEAM_REWARD_MODES)}, "
                    f"got {given['team_reward']!r}"
                )
            values["team_reward"] = v
        if "reward_channels" in given:
            v = given["reward_channels"]
            if v not in REWARD_CHANNEL_MODES:
                raise ValueError(
                    f"adapter_reward_channels must be one of {', '.join(REWARD_CHANNEL_MODES)}, "
                    f"got {v!r}"
                )
            if v == "infos" and "team_reward" in given:
                raise ValueError(
                    "adapter_team_reward has no effect with adapter_reward_channels infos (the "
                    "env's own channels are used): remove one of them"
                )
            values["reward_channels"] = v
        if "types" in given:
            values["types"] = _parse_types(given["types"])
        if "state" in given:
            v = given["state"]
            if not isinstance(v, str) or not v.isidentifier():
                raise ValueError(
                    f"adapter_state must be auto, obs or an env method name, got {v!r}"
                )
            values["state"] = v
        if "max_cycles" in given:
            v = given["max_cycles"]
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"adapter_max_cycles must be an int >= 1, got {v!r}")
            values["max_cycles"] = int(v)
        if "workers" in given:
            v = given["workers"]
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise ValueError(f"adapter_workers must be an int >= 0, got {v!r}")
            values["workers"] = int(v)
        return cls(**values, explicit=frozenset(given)), rest


# ----------------------------------------------------------------------------------- encoders

_SUPPORTED_OBS = (
    "Box (1-D or 2-D, flattened), Discrete (one-hot), MultiDiscrete (one-hot per entry), "
    "MultiBinary, and Tuple / Dict of these (a Dict may carry an 'action_mask')"
)


class SpaceEncoder:
    """Writes one value of a gymnasium space into a flat float32 row ``out[dim]``."""

    dim: int

    def encode_into(self, value: Any, out: np.ndarray) -> None:
        raise NotImplementedError


class BoxEncoder(SpaceEncoder):
    """Box: the values flattened (row-major) as float32."""

    def __init__(self, space: spaces.Box) -> None:
        self.dim = int(np.prod(space.shape)) if space.shape else 1
        self.flat = len(space.shape) <= 1

    def encode_into(self, value: Any, out: np.ndarray) -> None:
        if self.flat:
            out[:] = value  # a 1-D value casts in place
        else:
            out[:] = np.asarray(value, dtype=np.float32).reshape(-1)


class DiscreteEncoder(SpaceEncoder):
    """Discrete(n, start): one-hot of ``value - start``, ``[n]``."""

    def __init__(self, space: spaces.Discrete) -> None:
        self.dim = int(space.n)
        self.start = int(space.start)

    def encode_into(self, value: Any, out: np.ndarray) -> None:
        index = int(value) - self.start
        if not 0 <= index < self.dim:
            raise ValueError(
                f"observation {value!r} outside Discrete({self.dim}, start={self.start})"
            )
        out[:] = 0.0
        out[index] = 1.0


class MultiDiscreteEncoder(SpaceEncoder):
    """MultiDiscrete(nvec, start): one one-hot per entry (row-major), concatenated."""

    def __init__(self, space: spaces.MultiDiscrete) -> None:
        nvec = np.asarray(space.nvec, dtype=np.int64).reshape(-1)
        self.dim = int(nvec.sum())
        self.offsets = np.concatenate([[0], np.cumsum(nvec)[:-1]]).astype(np.int64)
        self.start = np.asarray(space.start, dtype=np.int64).reshape(-1)
        self.nvec = nvec

    def encode_into(self, value: Any, out: np.ndarray) -> None:
        index = np.asarray(value, dtype=np.int64).reshape(-1) - self.start
        if index.shape != self.nvec.shape or (index < 0).any() or (index >= self.nvec).any():
            raise ValueError(f"observation {value!r} outside MultiDiscrete({self.nvec.tolist()})")
        out[:] = 0.0
        out[self.offsets + index] = 1.0


class MultiBinaryEncoder(SpaceEncoder):
    """MultiBinary: the 0/1 entries flattened."""

    def __init__(self, space: spaces.MultiBinary) -> None:
        self.dim = int(np.prod(space.shape))

    def encode_into(self, value: Any, out: np.ndarray) -> None:
        out[:] = np.asarray(value, dtype=np.float32).reshape(-1)


class ConcatEncoder(SpaceEncoder):
    """Tuple / Dict: the parts' encodings concatenated (``keys``: Dict keys or Tuple indices)."""

    def __init__(self, keys: Sequence[Any], parts: Sequence[SpaceEncoder]) -> None:
        self.keys = tuple(keys)
        self.parts = tuple(parts)
        bounds = np.concatenate([[0], np.cumsum([p.dim for p in parts])]).astype(int)
        self.slices = tuple(
            slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)
        )
        self.dim = int(bounds[-1])

    def encode_into(self, value: Any, out: np.ndarray) -> None:
        for key, part, sl in zip(self.keys, self.parts, self.slices, strict=True):
            part.encode_into(value[key], out[sl])


def make_encoder(space: Any, *, what: str) -> SpaceEncoder:
    """The encoder of ``space`` (``what`` names it in errors, e.g. "observation of agent_0").

    Raises:
        UnsupportedSpaceError: images, Text, Graph, Sequence and other spaces, naming the
            space and what is supported.
    """
    if isinstance(space, spaces.Box):
        shape = tuple(space.shape)
        if len(shape) >= 3 or (len(shape) >= 2 and space.dtype == np.uint8):
            raise UnsupportedSpaceError(
                f"{what}: image observations are not supported ({space}); supported: "
                f"{_SUPPORTED_OBS}. Flatten or encode the image in a wrapper first"
            )
        return BoxEncoder(space)
    if isinstance(space, spaces.Discrete):
        return DiscreteEncoder(space)
    if isinstance(space, spaces.MultiDiscrete):
        return MultiDiscreteEncoder(space)
    if isinstance(space, spaces.MultiBinary):
        return MultiBinaryEncoder(space)
    if isinstance(space, spaces.Tuple):
        parts = [make_encoder(s, what=f"{what}[{i}]") for i, s in enumerate(space.spaces)]
        return ConcatEncoder(range(len(parts)), parts)
    if isinstance(space, spaces.Dict):
        keys = list(space.spaces)
        parts = [make_encoder(space.spaces[k], what=f"{what}[{k!r}]") for k in keys]
        return ConcatEncoder(keys, parts)
    raise UnsupportedSpaceError(
        f"{what}: unsupported space {space!r} ({type(space).__name__}); supported: {_SUPPORTED_OBS}"
    )


def _observation_encoder(space: Any, what: str) -> tuple[SpaceEncoder, bool]:
    """(encoder of the observation part, whether the observation carries an action_mask)."""
    if isinstance(space, spaces.Dict) and "action_mask" in space.spaces:
        keys = [k for k in space.spaces if k != "action_mask"]
        keys.sort(key=lambda k: k != "observation")  # 'observation' first, then the others
        if not keys:
            raise UnsupportedSpaceError(f"{what}: a Dict with only an 'action_mask' ({space})")
        parts = [make_encoder(space.spaces[k], what=f"{what}[{k!r}]") for k in keys]
        return ConcatEncoder(keys, parts), True
    return make_encoder(space, what=what), False


def _action_size(space: Any, what: str) -> tuple[int, int]:
    """(n, start) of a Discrete action space; UnsupportedSpaceError for anything else."""
    if isinstance(space, spaces.Discrete):
        return int(space.n), int(space.start)
    kind = "continuous actions" if isinstance(space, spaces.Box) else "this action space"
    raise UnsupportedSpaceError(
        f"{what}: {kind} not supported ({space!r}); supported: Discrete(n) actions only "
        "(wrap MultiDiscrete as one Discrete of the product, discretise a Box)"
    )


# ------------------------------------------------------------------------------ env layouts


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
        encoder, mask_in_obs = _observation_encoder(
            env.observation_space(env_name), f"observation of {what}"
        )
        n, start = _action_size(env.action_space(env_name), f"action space of {what}")
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


# ------------------------------------------------------------------------ batched stepping


@dataclass
class BatchStep:
    """One reset or step of ``n`` copies (A agents in ``EnvSpec.agents`` order).

    ``obs[j]: float32 [n, D_j]``, ``mask[j]: int8 [n, K_j]``, ``rewards: float32 [n, A]``,
    ``team``, ``individual``, ``penalty``, ``active: float64 [n, A]``, ``terminated``,
    ``truncated: bool [n]``, ``infos: {key: float64 [n, A]}`` (the env's numeric keys);
    ``final_index: int64 [m]`` (copies whose episode ended and were reset at this step) with
    their final ``final_obs[j] [m, D_j]``, ``final_mask[j]``, ``final_state [m, S]``;
    ``state [n, S]`` when computed eagerly (workers), else None.
    """

    obs: list[np.ndarray]
    mask: list[np.ndarray]
    rewards: np.ndarray
    team: np.ndarray
    individual: np.ndarray
    penalty: np.ndarray
    active: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    infos: dict[str, np.ndarray]
    final_index: np.ndarray
    final_obs: list[np.ndarray]
    final_mask: list[np.ndarray]
    final_state: np.ndarray | None
    state: np.ndarray | None = None

    @staticmethod
    def concat(parts: Sequence[BatchStep]) -> BatchStep:
        """The copies of several batches, in order (the workers' slices)."""
        if len(parts) == 1:
            return parts[0]
        sizes = [len(p.terminated) for p in parts]
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        n_agents = parts[0].rewards.shape[1]
        keys = list(dict.fromkeys(k for p in parts for k in p.infos))
        infos = {
            k: np.concatenate(
                [p.infos.get(k, np.zeros((s, n_agents))) for p, s in zip(parts, sizes, strict=True)]
            )
            for k in keys
        }

        def cat(name: str) -> Any:
            return np.concatenate([getattr(p, name) for p in parts])

        def cat_lists(name: str) -> list[np.ndarray]:
            return [
                np.concatenate(rows)
                for rows in zip(*(getattr(p, name) for p in parts), strict=True)
            ]

        finals = [p.final_state for p in parts]
        return BatchStep(
            obs=cat_lists("obs"),
            mask=cat_lists("mask"),
            rewards=cat("rewards"),
            team=cat("team"),
            individual=cat("individual"),
            penalty=cat("penalty"),
            active=cat("active"),
            terminated=cat("terminated"),
            truncated=cat("truncated"),
            infos=infos,
            final_index=np.concatenate(
                [p.final_index + o for p, o in zip(parts, offsets, strict=True)]
            ).astype(np.int64),
            final_obs=cat_lists("final_obs"),
            final_mask=cat_lists("final_mask"),
            final_state=None if finals[0] is None else np.concatenate(finals),
            state=None if parts[0].state is None else cat("state"),
        )


def _is_number(value: Any) -> bool:
    if isinstance(value, (bool, int, float, np.number, np.bool_)):
        return True
    return isinstance(value, np.ndarray) and value.shape == () and value.dtype.kind in "biuf"


class CopyBatch:
    """``n`` copies of one env stepped in this process (the adapter's engine).

    Keeps each copy's live agents, step count and (``autoreset=False``) frozen state; does the
    same-step autoreset itself, so that worker processes (:mod:`marl.adapters_workers`) run
    exactly this code on their slice of the copies. The per-copy loop works on Python lists
    (one NumPy conversion per step), since the envs' own steps are Python too.
    """

    def __init__(
        self, envs: Sequence[Any], spec: EnvSpec, *, autoreset: bool, eager_state: bool = False
    ) -> None:
        self.envs = list(envs)
        self.spec = spec
        self.autoreset = bool(autoreset)
        self.eager_state = bool(eager_state)
        n = len(self.envs)
        self.n = n
        #: per copy, the indices of the agents acting at the next step (sorted)
        self.live: list[list[int]] = [[] for _ in range(n)]
        self.steps = [0] * n
        self.ended = [False] * n  # autoreset=False: frozen copies
        self.flags = [(False, False)] * n  # frozen copies' (terminated, truncated)
        self.started = False
        self._obs: list[np.ndarray] = [
            np.zeros((n, a.obs_encoder.dim), np.float32) for a in spec.agents
        ]
        self._mask: list[np.ndarray] = [np.ones((n, a.n_actions), np.int8) for a in spec.agents]

    # -- encoding ------------------------------------------------------------------------------
    def _write_obs(
        self,
        i: int,
        obs: Mapping[Any, Any],
        infos: Mapping[Any, Any],
        present: Sequence[int],
        obs_out: list[np.ndarray],
        mask_out: list[np.ndarray],
    ) -> None:
        """Row i of ``obs_out`` / ``mask_out`` from the env's dicts for the agents in
        ``present`` (zeros / all allowed for the others and where the env gave none)."""
        for j, agent in enumerate(self.spec.agents):
            value = obs.get(agent.env_name) if j in present else None
            if value is None:
                obs_out[j][i] = 0.0
                mask_out[j][i] = 1
                continue
            mask = None
            if agent.mask_in_obs:
                mask = value["action_mask"]
            else:
                info = infos.get(agent.env_name)
                if isinstance(info, Mapping):
                    mask = info.get("action_mask")
            agent.obs_encoder.encode_into(value, obs_out[j][i])
            if mask is None:
                mask_out[j][i] = 1
            else:
                mask = np.asarray(mask).reshape(-1)
                if mask.shape[0] != agent.n_actions:
                    raise ValueError(
                        f"action_mask of agent {agent.env_name!r} has {mask.shape[0]} entries, "
                        f"its action space {agent.n_actions}"
                    )
                mask_out[j][i] = mask != 0

    def _env_state(self, i: int) -> np.ndarray:
        env = self.envs[i]
        method = getattr(env, self.spec.state_method, None)
        if method is None:
            method = getattr(env.unwrapped, self.spec.state_method)
        out = np.empty(self.spec.state_dim, np.float32)
        self.spec.state_encoder.encode_into(method(), out)  # type: ignore[union-attr]
        return out

    def state(self) -> np.ndarray:
        """float32 ``[n, S]`` of the copies' current episodes."""
        if self.spec.state_method == "obs":
            return np.concatenate(self._obs, axis=1)
        return np.stack([self._env_state(i) for i in range(self.n)])

    def _live_from_env(self, i: int) -> list[int]:
        index = self.spec.index
        live = []
        for name in getattr(self.envs[i], "agents", ()):
            j = index.get(name)
            if j is None:
                raise ValueError(f"the env has an agent {name!r} not in its possible_agents")
            live.append(j)
        live.sort()
        return live

    def _collect_infos(
        self, i: int, env_infos: Mapping[Any, Any], infos: dict[str, np.ndarray]
    ) -> None:
        for name, info in env_infos.items():
            j = self.spec.index.get(name)
            if j is None or not isinstance(info, Mapping):
                continue
            for key, value in info.items():
                if key in RESERVED_INFO_KEYS or key == "action_mask" or not _is_number(value):
                    continue
                array = infos.get(key)
                if array is None:
                    array = infos[key] = np.zeros((self.n, len(self.spec.agents)))
                array[i, j] = float(value)

    # -- reset / step ----------------------------------------------------------------------
    def _buffers(self, n: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Fresh observation and mask arrays ``[n, D_j]``, ``[n, K_j]`` per agent."""
        agents = self.spec.agents
        return (
            [np.empty((n, a.obs_encoder.dim), np.float32) for a in agents],
            [np.empty((n, a.n_actions), np.int8) for a in agents],
        )

    def _new_step(
        self, rows: dict[str, list], obs: list[np.ndarray], mask: list[np.ndarray]
    ) -> BatchStep:
        """A BatchStep around this step's per-copy Python rows and observation arrays."""
        agents = self.spec.agents
        return BatchStep(
            obs=obs,
            mask=mask,
            rewards=np.array(rows["rewards"], np.float32).reshape(self.n, len(agents)),
            team=np.array(rows["team"], np.float64).reshape(self.n, len(agents)),
            individual=np.array(rows["individual"], np.float64).reshape(self.n, len(agents)),
            penalty=np.array(rows["penalty"], np.float64).reshape(self.n, len(agents)),
            active=np.array(rows["active"], np.float64).reshape(self.n, len(agents)),
            terminated=np.array(rows["terminated"], bool).reshape(self.n),
            truncated=np.array(rows["truncated"], bool).reshape(self.n),
            infos={},
            final_index=np.zeros(0, np.int64),
            final_obs=[],
            final_mask=[],
            final_state=None,
        )

    def _zero_rows(self) -> dict[str, list]:
        A = len(self.spec.agents)
        rows: dict[str, list] = {
            k: [[0.0] * A for _ in range(self.n)]
            for k in ("rewards", "team", "individual", "penalty", "active")
        }
        rows["terminated"] = [False] * self.n
        rows["truncated"] = [False] * self.n
        return rows

    def reset(self, seeds: Sequence[int | None], options: dict | None = None) -> BatchStep:
        """Reset copy i with ``seeds[i]`` (None: continue its stream)."""
        if len(seeds) != self.n:
            raise ValueError(f"{len(seeds)} seeds for {self.n} copies")
        rows = self._zero_rows()
        obs_out, mask_out = self._buffers(self.n)
        step_infos: dict[str, np.ndarray] = {}
        for i, env in enumerate(self.envs):
            obs, infos = env.reset(seed=seeds[i], options=options)
            infos = infos or {}
            self.live[i] = self._live_from_env(i)
            for j in self.live[i]:
                rows["active"][i][j] = 1.0
            self._write_obs(i, obs, infos, self.live[i], obs_out, mask_out)
            self._collect_infos(i, infos, step_infos)
        out = self._new_step(rows, obs_out, mask_out)
        out.infos = step_infos
        self.steps = [0] * self.n
        self.ended = [False] * self.n
        self.flags = [(False, False)] * self.n
        self.started = True
        self._finish(out, [], *self._buffers(0), [])
        return out

    def step(self, actions: np.ndarray) -> BatchStep:
        """Step every copy: ``actions[i, j]`` is the trainer's action of agent j in copy i."""
        if not self.started:
            raise ValueError("step() called before reset(): call reset() first")
        spec = self.spec
        agents = spec.agents
        names = [a.env_name for a in agents]
        starts = [a.action_start for a in agents]
        action_rows = np.asarray(actions).tolist()
        from_rewards = spec.reward_channels == "reward"
        team_mode = spec.team_reward
        rows = self._zero_rows()
        rewards_rows, active_rows = rows["rewards"], rows["active"]
        team_rows, ind_rows, pen_rows = rows["team"], rows["individual"], rows["penalty"]
        obs_out, mask_out = self._buffers(self.n)
        final_obs, final_mask = self._buffers(self.n)  # rows of the copies reset at this step
        finals: list[int] = []
        final_states: list[np.ndarray] = []
        step_infos: dict[str, np.ndarray] = {}
        for i, env in enumerate(self.envs):
            if self.ended[i]:  # autoreset=False: frozen until reset()
                rows["terminated"][i], rows["truncated"][i] = self.flags[i]
                for j in range(len(agents)):
                    obs_out[j][i] = self._obs[j][i]
                    mask_out[j][i] = self._mask[j][i]
                continue
            acting = self.live[i]
            row = action_rows[i]
            obs, rewards, terms, truncs, infos = env.step(
                {names[j]: row[j] + starts[j] for j in acting}
            )
            infos = infos or {}
            self.steps[i] += 1
            # rewards by channel
            own = [float(rewards.get(names[j], 0.0)) for j in acting]
            reward_row, active_row = rewards_rows[i], active_rows[i]
            for j, r in zip(acting, own, strict=True):
                reward_row[j] = r
                active_row[j] = 1.0
            channel_infos = [infos.get(names[j]) for j in acting]
            has_channels = not from_rewards and all(
                isinstance(info, Mapping)
                and "reward_team" in info
                and "reward_individual" in info
                and "reward_penalty" in info
                for info in channel_infos
            )
            if has_channels and acting:
                if spec.team_reward_explicit and spec.reward_channels == "auto":
                    raise ValueError(
                        "adapter_team_reward was given, but the env reports its own reward "
                        "channels (reward_team / reward_individual / reward_penalty infos), "
                        "which the adapter keeps: remove adapter_team_reward, or pass "
                        "adapter_reward_channels reward to use the rewards instead"
                    )
                team = [float(info["reward_team"]) for info in channel_infos]
                team_row = team_rows[i]
                team_row[:] = [sum(team) / len(team)] * len(agents)  # left agents: the team's
                for k, j in enumerate(acting):
                    team_row[j] = team[k]
                    ind_rows[i][j] = float(channel_infos[k]["reward_individual"])
                    pen_rows[i][j] = float(channel_infos[k]["reward_penalty"])
            elif spec.reward_channels == "infos":
                raise ValueError(
                    "adapter_reward_channels infos: the env's infos lack reward_team / "
                    "reward_individual / reward_penalty for some live agent"
                )
            else:
                if team_mode == "none" or not own:
                    team_value = 0.0
                else:
                    team_value = sum(own) / len(own) if team_mode == "mean" else sum(own)
                team_rows[i][:] = [team_value] * len(agents)
                for j, r in zip(acting, own, strict=True):
                    ind_rows[i][j] = r
            if infos:
                self._collect_infos(i, infos, step_infos)
            # who is left, and whether the episode ended
            truncated_now = False
            done_now = set()
            for j in acting:
                term = bool(terms.get(names[j], False))
                trunc = bool(truncs.get(names[j], False))
                if term or trunc:
                    done_now.add(j)
                    truncated_now |= trunc and not term
            still = [j for j in self._live_from_env(i) if j not in done_now]
            ended = not still
            terminated = ended and not truncated_now
            if not ended and self.steps[i] >= spec.max_cycles:
                ended, terminated = True, False
            if not ended:  # agents that left: zero observation, every action allowed
                self._write_obs(i, obs, infos, still, obs_out, mask_out)
                self.live[i] = still
                continue
            rows["terminated"][i], rows["truncated"][i] = terminated, not terminated
            if not self.autoreset:  # the final observation stays until reset()
                self._write_obs(i, obs, infos, acting, obs_out, mask_out)
                self.ended[i] = True
                self.flags[i] = (terminated, not terminated)
                self.live[i] = []
                continue
            # same-step autoreset: keep the final observation / state, then reset the copy
            self._write_obs(i, obs, infos, acting, final_obs, final_mask)
            finals.append(i)
            if spec.state_method != "obs":
                final_states.append(self._env_state(i))
            reset_obs, reset_infos = env.reset(seed=None)
            self.live[i] = self._live_from_env(i)
            self.steps[i] = 0
            self._write_obs(i, reset_obs, reset_infos or {}, self.live[i], obs_out, mask_out)
        out = self._new_step(rows, obs_out, mask_out)
        out.infos = step_infos
        self._finish(
            out,
            finals,
            [f[finals] for f in final_obs],
            [f[finals] for f in final_mask],
            final_states,
        )
        return out

    def _finish(
        self,
        out: BatchStep,
        finals: list[int],
        final_obs: list[np.ndarray],
        final_mask: list[np.ndarray],
        final_states: list[np.ndarray],
    ) -> None:
        """Attach the final observations / states of the copies reset at this step."""
        out.final_index = np.asarray(finals, np.int64)
        out.final_obs, out.final_mask = final_obs, final_mask
        if self.spec.state_method == "obs":
            out.final_state = np.concatenate(final_obs, axis=1)
        elif final_states:
            out.final_state = np.stack(final_states)
        else:
            out.final_state = np.zeros((0, self.spec.state_dim), np.float32)
        self._obs, self._mask = out.obs, out.mask
        if self.eager_state:
            out.state = self.state()

    def render(self, index: int) -> Any:
        return self.envs[index].render()

    def __getstate__(self) -> dict:
        """Pickled with the copies only when they also restore (checkpoints keep the envs):
        the restored copies must unpickle and take a step; otherwise a TypeError (a resumed
        run then resets its envs)."""
        try:
            restored = pickle.loads(pickle.dumps(self.envs))
            for i, env in enumerate(restored):
                acting = self.live[i]
                if self.started and not self.ended[i] and len(acting):
                    agents = [self.spec.agents[j] for j in acting]
                    env.step({a.env_name: a.action_start for a in agents})
        except Exception as exc:  # noqa: BLE001 - any failure means: cannot be restored
            raise TypeError(
                f"the env copies cannot be pickled and restored ({type(exc).__name__}: {exc})"
            ) from exc
        return self.__dict__.copy()

    def close(self) -> None:
        for env in self.envs:
            close = getattr(env, "close", None)
            if callable(close):
                close()


# ------------------------------------------------------------------------- the vector env


class AdaptedVectorEnv:
    """``num_envs`` copies of a PettingZoo / Gymnasium env behind the trainers' contract.

    Built by :func:`marl.envapi.make_vector_env`; ``backend`` is a :class:`CopyBatch` (in this
    process) or a :class:`marl.adapters_workers.WorkerBatch` (worker processes). The faces
    follow docs/CONTRACTS.md section 1; see the module doc for what maps how.
    """

    def __init__(self, backend: Any, spec: EnvSpec, *, autoreset: bool) -> None:
        self.backend = backend
        self.spec = spec
        self.autoreset = bool(autoreset)
        self.num_envs = int(backend.n)
        self.possible_agents = [a.name for a in spec.agents]
        self.agents = list(self.possible_agents)
        #: trainer name -> the env's agent name
        self.env_agent_names = {a.name: a.env_name for a in spec.agents}
        #: trainer name -> agent type
        self.agent_types = {a.name: a.type_name for a in spec.agents}
        self.kind = spec.kind
        self._observation_spaces = {
            a.name: spaces.Dict(
                {
                    "observation": spaces.Box(-np.inf, np.inf, (a.obs_encoder.dim,), np.float32),
                    "action_mask": spaces.Box(0, 1, (a.n_actions,), np.int8),
                }
            )
            for a in spec.agents
        }
        self._action_spaces = {a.name: spaces.Discrete(a.n_actions) for a in spec.agents}
        self.state_space = spaces.Box(-np.inf, np.inf, (spec.state_dim,), np.float32)
        self._n_actions = np.array([a.n_actions for a in spec.agents])
        self._info_keys: list[str] = []
        self._last: BatchStep | None = None
        self._obs: dict[str, dict[str, np.ndarray]] = {}
        self._final_obs: dict[str, dict[str, np.ndarray]] | None = None

    # -- contract ------------------------------------------------------------------------------
    @property
    def max_cycles(self) -> int:
        return self.spec.max_cycles

    def observation_space(self, agent: str) -> spaces.Dict:
        return self._observation_spaces[agent]

    def action_space(self, agent: str) -> spaces.Discrete:
        return self._action_spaces[agent]

    def reset(
        self, seed: int | Sequence[int] | None = None, options: dict | None = None
    ) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, dict[str, np.ndarray]]]:
        """``seed=s`` seeds copy i with ``s + i``; a sequence seeds each copy; None: each
        copy's own stream. ``options`` go to every copy's ``reset``."""
        result = self.backend.reset(self._seeds(seed), options)
        return self._publish(result)[0], self._infos(result)

    def step(
        self, actions: Mapping[str, Any]
    ) -> tuple[dict, dict, dict, dict, dict[str, dict[str, np.ndarray]]]:
        """``actions[agent]``: int array ``[N]`` for every agent (ignored for agents that have
        left) -> (obs, rewards, terminations, truncations, infos), dicts keyed by agent."""
        result = self.backend.step(self._validate(actions))
        obs, rewards = self._publish(result)
        terminations = {a: result.terminated.copy() for a in self.possible_agents}
        truncations = {a: result.truncated.copy() for a in self.possible_agents}
        return obs, rewards, terminations, truncations, self._infos(result)

    def state(self) -> np.ndarray:
        """float32 ``[N, state_dim]`` of the current (possibly new) episodes."""
        last = self._last
        if self.spec.state_method == "obs" and last is not None:
            return np.concatenate(last.obs, axis=1)
        if last is not None and last.state is not None:
            return last.state.copy()
        return self.backend.state()

    @property
    def final_obs(self) -> dict[str, dict[str, np.ndarray]]:
        """Like ``obs``; rows of copies whose episode ended at the last step hold its final
        observation."""
        last = self._last
        if last is None or len(last.final_index) == 0:
            return self._obs
        if self._final_obs is None:
            index = last.final_index
            merged = {}
            for j, agent in enumerate(self.possible_agents):
                observation = last.obs[j].copy()
                mask = last.mask[j].copy()
                observation[index] = last.final_obs[j]
                mask[index] = last.final_mask[j]
                merged[agent] = {"observation": observation, "action_mask": mask}
            self._final_obs = merged
        return self._final_obs

    @property
    def final_state(self) -> np.ndarray:
        """``state()`` with the rows of copies whose episode ended at the last step replaced
        by that episode's final state. float32 ``[N, state_dim]``."""
        state = self.state()
        last = self._last
        if last is not None and len(last.final_index) and last.final_state is not None:
            state[last.final_index] = last.final_state
        return state

    def render(self, index: int = 0) -> Any:
        """Copy ``index``'s ``render()`` (pass ``render_mode`` to the factory)."""
        if not 0 <= index < self.num_envs:
            raise ValueError(f"index must be in [0, {self.num_envs - 1}], got {index}")
        return self.backend.render(index)

    def close(self) -> None:
        self.backend.close()

    # -- helpers -------------------------------------------------------------------------------
    def _seeds(self, seed: int | Sequence[int] | None) -> list[int | None]:
        n = self.num_envs
        if seed is None:
            return [None] * n
        if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
            if seed < 0:
                raise ValueError(f"seed must be >= 0, got {seed}")
            return [int(seed) + i for i in range(n)]
        seeds = list(seed)
        if len(seeds) != n or not all(
            isinstance(s, (int, np.integer)) and not isinstance(s, bool) and s >= 0 for s in seeds
        ):
            raise ValueError(
                f"seed must be None, an int >= 0 or a sequence of {n} ints >= 0, got {seed!r}"
            )
        return [int(s) for s in seeds]

    def _validate(self, actions: Mapping[str, Any]) -> np.ndarray:
        if not isinstance(actions, Mapping):
            raise ValueError(
                f"actions must be a dict agent -> int array [{self.num_envs}], got "
                f"{type(actions).__name__}"
            )
        missing = [a for a in self.possible_agents if a not in actions]
        unknown = [a for a in actions if a not in self._action_spaces]
        if missing or unknown:
            raise ValueError(
                f"actions must have one entry per agent {self.possible_agents}; missing: "
                f"{missing}, unknown: {unknown}"
            )
        n = self.num_envs
        rows = np.empty((n, len(self.possible_agents)), np.int64)
        for j, agent in enumerate(self.possible_agents):
            array = np.asarray(actions[agent])
            k = int(self._n_actions[j])
            if array.shape != (n,) or array.dtype.kind not in "iu":
                raise ValueError(
                    f"actions[{agent!r}] must be an integer array of shape ({n},) with values "
                    f"in [0, {k - 1}], got shape {array.shape} dtype {array.dtype}"
                )
            if ((array < 0) | (array >= k)).any():
                bad = int(np.flatnonzero((array < 0) | (array >= k))[0])
                raise ValueError(
                    f"invalid action {array[bad].item()} for agent {agent!r} in env {bad}: "
                    f"allowed are integers in [0, {k - 1}] (Discrete({k}))"
                )
            rows[:, j] = array
        return rows

    def _publish(self, result: BatchStep) -> tuple[dict, dict]:
        self._last = result
        self._final_obs = None
        self._obs = {
            agent: {"observation": result.obs[j], "action_mask": result.mask[j]}
            for j, agent in enumerate(self.possible_agents)
        }
        rewards = {agent: result.rewards[:, j] for j, agent in enumerate(self.possible_agents)}
        return self._obs, rewards

    def _infos(self, result: BatchStep) -> dict[str, dict[str, np.ndarray]]:
        for key in result.infos:
            if key not in self._info_keys:
                self._info_keys.append(key)
        zeros = np.zeros(self.num_envs)
        infos = {}
        for j, agent in enumerate(self.possible_agents):
            info = {
                "reward_team": result.team[:, j],
                "reward_individual": result.individual[:, j],
                "reward_penalty": result.penalty[:, j],
                "active": result.active[:, j],
            }
            for key in self._info_keys:
                array = result.infos.get(key)
                info[key] = zeros if array is None else array[:, j]
            infos[agent] = info
        return infos
