"""The vector env the trainers see: :class:`AdaptedVectorEnv`, over a :class:`CopyBatch` in
this process or a worker batch in other processes (:mod:`marl.adapters.workers`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from marl.adapters.batching import BatchStep
from marl.adapters.inspection import EnvSpec


class AdaptedVectorEnv:
    """``num_envs`` copies of a PettingZoo / Gymnasium env behind the trainers' contract.

    Built by :func:`marl.adapters.envapi.make_vector_env`; ``backend`` is a :class:`CopyBatch`
    (in this process) or a :class:`marl.adapters.workers.WorkerBatch` (worker processes). The faces
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
