"""The adapter's options (``adapter_*`` env keyword arguments) and its constants."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

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
