"""Outside environments behind the trainers' vector-env contract (docs/CONTRACTS.md section 1).

:mod:`~marl.adapters.envapi` holds that contract (the typed Protocol ``VectorEnv``) and
:func:`~marl.adapters.envapi.make_vector_env`, which detects what ``--env-fn module:factory``
builds and, for a PettingZoo ``ParallelEnv`` or a Gymnasium ``Env``, batches ``num_envs``
copies with the pieces here. A native vector-env factory (``envs.multisearch_v0:vector_env``)
needs none of them.

The package, in the order a reader follows an env through it: :mod:`~marl.adapters.options`
(the ``adapter_*`` options), :mod:`~marl.adapters.encoders` (spaces to vectors),
:mod:`~marl.adapters.inspection` (agents, types, spaces, state, copies),
:mod:`~marl.adapters.batching` (stepping the copies in this process),
:mod:`~marl.adapters.workers` (or in worker processes), :mod:`~marl.adapters.vector_env` (the
vector env the trainers see).

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

from marl.adapters.batching import BatchStep, CopyBatch
from marl.adapters.encoders import SpaceEncoder, make_encoder
from marl.adapters.inspection import (
    AgentSpec,
    CopyFactory,
    EnvSpec,
    SingleAgentParallel,
    inspect_env,
    resolve_env_fn,
)
from marl.adapters.options import (
    ADAPTER_OPTIONS,
    ADAPTER_PREFIX,
    AdapterOptions,
    UnsupportedSpaceError,
)
from marl.adapters.vector_env import AdaptedVectorEnv

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
