"""The PettingZoo faces shared by the native envs: a Parallel env on one row of a vectorised
core, the vector env on all its rows, the action checks and the module constructors.

``envs.multisearch_v0`` and ``envs.websearch_v0`` (whose v1 and v2 subclass it) build their
env classes on these; each module keeps its config, spaces, rendering, messages and
documentation. The dynamics live in the cores (:class:`envs._multisearch_core.MultiSearchCore`,
:class:`envs.websearch.WebSearchCore`); the faces use only the operations of
:class:`Core`. Agents come in two types, the first type's agents first (agent type = the name
before the last ``_``); the observation buffers follow that split.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import gymnasium
import numpy as np
from pettingzoo import ParallelEnv
from pettingzoo.utils.conversions import parallel_to_aec_wrapper
from pettingzoo.utils.wrappers import OrderEnforcingWrapper

from envs.errors import ArgumentTypeError

Obs = dict[str, dict[str, np.ndarray]]


class Core(Protocol):
    """What a vectorised core offers the faces (``N`` envs, ``A`` agents)."""

    num_envs: int
    all_envs: np.ndarray  # int64 [N]: 0..N-1

    def reset_envs(self, envs: np.ndarray, rngs: Sequence[np.random.Generator]) -> None:
        """New episodes in rows ``envs``, one generator each."""

    def new_obs_buffers(self) -> tuple[np.ndarray, ...]:
        """``(obs_first [A1, N, D1], obs_second [A2, N, D2], mask_first [A1, N, n1],
        mask_second [A2, N, n2])``: the two agent types' observations and masks."""
        ...

    def observe_into(self, envs: np.ndarray, buffers: tuple[np.ndarray, ...]) -> None:
        """Write rows ``envs`` of ``buffers``."""

    def step(
        self, actions: np.ndarray, active: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``actions`` int64 [N, A] in range, ``active`` bool [N] -> ``rewards3`` [3, A, N]
        (team, individual, penalty), ``invalid`` [A, N], ``terminated``, ``truncated`` [N]."""
        ...

    def metrics(self) -> dict[str, np.ndarray]:
        """Episode metrics so far, float64 [N] each, fresh arrays."""
        ...

    def state(self, envs: np.ndarray | None = None) -> np.ndarray:
        """float32 [len(envs), state_dim] (default: all envs)."""
        ...

    def legal_action(self, env: int, agent: int, action: int) -> bool:
        """Whether the in-range ``action`` is unmasked for ``agent`` in env ``env``."""
        ...

    def legal_actions(self, actions: np.ndarray, active: np.ndarray) -> np.ndarray:
        """bool [N, A]: whether each action is unmasked (True where not ``active``)."""
        ...


class HumanRenderer(Protocol):
    def show(self, core: Any, env: int) -> None: ...

    def close(self) -> None: ...


# ---- checks ------------------------------------------------------------------------------
def check_render_mode(render_mode: str | None, metadata: Mapping[str, Any]) -> None:
    if render_mode is not None and render_mode not in metadata["render_modes"]:
        raise ValueError(
            f"unknown render_mode {render_mode!r}; allowed: None, {metadata['render_modes']}"
        )


def action_error(agent: str, action: Any, n_actions: int, detail: str = "") -> ValueError:
    return ValueError(
        f"invalid action {action!r} ({type(action).__name__}) for agent {agent!r}{detail}: "
        f"allowed are integers in [0, {n_actions - 1}] (Discrete({n_actions}))"
    )


def check_action_keys(actions: Any, agents: Sequence[str]) -> None:
    if not isinstance(actions, Mapping):
        raise ValueError(
            f"actions must be a dict mapping agent name -> action, got {type(actions).__name__}"
        )
    missing = [a for a in agents if a not in actions]
    unknown = [a for a in actions if a not in agents]
    if missing or unknown:
        raise ValueError(
            f"actions must have exactly one entry per live agent {list(agents)}; "
            f"missing: {missing}, unknown or not live: {unknown}"
        )


def to_int_action(agent: str, action: Any, n_actions: int) -> int:
    """One agent's action as an int in ``[0, n_actions)``: Python or NumPy integers, 0-d
    integer arrays; anything else (bool, float, str, ...) is a ValueError."""
    if isinstance(action, np.ndarray) and action.shape == ():
        action = action[()]
    if isinstance(action, (bool, np.bool_)) or not isinstance(action, (int, np.integer)):
        raise action_error(agent, action, n_actions)
    if not 0 <= action < n_actions:
        raise action_error(agent, action, n_actions)
    return int(action)


def is_int_seed(seed: Any) -> bool:
    return isinstance(seed, (int, np.integer)) and not isinstance(seed, (bool, np.bool_))


def check_seed(seed: Any) -> None:
    """``reset(seed=...)`` of the parallel env: None or an int >= 0 (a bool is not a seed)."""
    if seed is None:
        return
    if not is_int_seed(seed):
        raise ValueError(f"seed must be None or an int >= 0, got {seed!r} ({type(seed).__name__})")
    if seed < 0:
        raise ValueError(f"seed must be None or an int >= 0, got {seed}")


def obs_dict(agents: Sequence[str], buffers: tuple[np.ndarray, ...], row: int | None = None) -> Obs:
    """Per-agent views of a core's buffers (``row``: one env's row, else all rows)."""
    obs_first, obs_second, mask_first, mask_second = buffers
    n_first = obs_first.shape[0]
    out = {}
    for i, agent in enumerate(agents):
        if i < n_first:
            obs, mask = obs_first[i], mask_first[i]
        else:
            obs, mask = obs_second[i - n_first], mask_second[i - n_first]
        if row is not None:
            obs, mask = obs[row], mask[row]
        out[agent] = {"observation": obs, "action_mask": mask}
    return out


def reward_infos(
    agents: Sequence[str],
    rewards3: np.ndarray,
    invalid: np.ndarray,
    metrics: Mapping[str, Any],
    to_value: Callable[[Any], Any] = lambda x: x,
) -> dict[str, dict[str, Any]]:
    """``infos[agent]``: the three reward channels, ``invalid_action`` and the metrics.
    ``rewards3`` [3, A, ...], ``invalid`` [A, ...]; ``to_value`` converts each entry."""
    infos = {}
    for i, agent in enumerate(agents):
        info = {
            "reward_team": to_value(rewards3[0, i]),
            "reward_individual": to_value(rewards3[1, i]),
            "reward_penalty": to_value(rewards3[2, i]),
            "invalid_action": to_value(invalid[i]),
        }
        info.update(metrics)
        infos[agent] = info
    return infos


def two_type_spaces(
    agents: Sequence[str],
    first_prefix: str,
    obs_low: float,
    obs_dims: tuple[int, int],
    n_actions: tuple[int, int],
    state_dim: int,
) -> tuple[dict[str, gymnasium.spaces.Dict], dict[str, gymnasium.spaces.Discrete], Any]:
    """Per agent ``Dict(observation=Box(obs_low, 1, (dim,), float32), action_mask=Box(0, 1,
    (n,), int8))`` and ``Discrete(n)``, ``(dim, n)`` by type (names starting with
    ``first_prefix``: the first), and the state space ``Box(0, 1, (state_dim,), float32)``."""
    observation_spaces: dict[str, gymnasium.spaces.Dict] = {}
    action_spaces: dict[str, gymnasium.spaces.Discrete] = {}
    for name in agents:
        first = name.startswith(first_prefix)
        dim, n = (obs_dims[0], n_actions[0]) if first else (obs_dims[1], n_actions[1])
        observation_spaces[name] = gymnasium.spaces.Dict(
            {
                "observation": gymnasium.spaces.Box(obs_low, 1.0, (dim,), np.float32),
                "action_mask": gymnasium.spaces.Box(0, 1, (n,), np.int8),
            }
        )
        action_spaces[name] = gymnasium.spaces.Discrete(n)
    state_space = gymnasium.spaces.Box(0.0, 1.0, (state_dim,), np.float32)
    return observation_spaces, action_spaces, state_space


def _first_float(row: np.ndarray) -> float:
    return float(row[0])


# ---- what both faces share -----------------------------------------------------------------
class CoreFace:
    """Spaces, the writable ``max_cycles`` and rendering over a core, for both faces.

    An env class sets ``metadata``, ``_core_class`` (``_core_class(config, num_envs)``),
    ``_make_spaces`` (``config -> (observation_spaces, action_spaces, state_space)``),
    ``_render_rgb`` / ``_render_ansi`` (``(core, env) -> frame``) and ``_human_renderer``.
    """

    metadata: dict[str, Any]
    _core_class: Callable[[Any, int], Core]
    _make_spaces: Callable[[Any], tuple[dict, dict, gymnasium.spaces.Box]]
    _render_rgb: Callable[[Any, int], np.ndarray]
    _render_ansi: Callable[[Any, int], str]

    def _init_face(self, config: Any, num_envs: int, render_mode: str | None) -> None:
        self.config = config
        check_render_mode(render_mode, self.metadata)
        self.render_mode = render_mode
        self._core = self._core_class(config, num_envs)
        self.possible_agents = config.agent_names
        self.observation_spaces, self.action_spaces, self.state_space = self._make_spaces(config)
        self._n_actions = [int(self.action_spaces[a].n) for a in self.possible_agents]
        self._human: HumanRenderer | None = None

    # ---- spaces and episode limit ------------------------------------------------------
    def observation_space(self, agent: str) -> gymnasium.spaces.Dict:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> gymnasium.spaces.Discrete:
        return self.action_spaces[agent]

    @property
    def max_cycles(self) -> int:
        return self.config.max_cycles

    @max_cycles.setter
    def max_cycles(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"max_cycles must be an int >= 1, got {value!r}")
        self.config.max_cycles = int(value)

    # ---- rendering and messages ----------------------------------------------------------
    def _human_renderer(self) -> HumanRenderer:
        raise NotImplementedError

    def _render_env(self, index: int, mode: str) -> np.ndarray | str | None:
        if mode == "rgb_array":
            return self._render_rgb(self._core, index)
        if mode == "ansi":
            return self._render_ansi(self._core, index)
        if self._human is None:
            self._human = self._human_renderer()
        self._human.show(self._core, index)
        return None

    def close(self) -> None:
        if self._human is not None:
            self._human.close()
            self._human = None

    def _action_label(self, index: int, action: int) -> int | str:
        """How error messages name ``action`` of agent ``index`` (the env may add a name)."""
        return action


class CoreParallelEnv(CoreFace, ParallelEnv):
    """The PettingZoo Parallel env: env 0 of a one-env core (see each env's module doc).

    A subclass's ``__init__`` builds the config from its arguments and calls
    ``super().__init__(config, render_mode)``.
    """

    def __init__(self, config: Any, render_mode: str | None = None) -> None:
        self._init_face(config, 1, render_mode)
        self.agents: list[str] = []
        self._rng = np.random.default_rng()

    # ---- API -----------------------------------------------------------------------------
    def reset(
        self, seed: int | None = None, options: dict | None = None
    ) -> tuple[Obs, dict[str, dict[str, float]]]:
        """Start an episode. ``options`` is accepted and ignored (no options are defined)."""
        self._check_seed(seed)
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._core.reset_envs(np.zeros(1, dtype=np.int64), [self._rng])
        self.agents = list(self.possible_agents)
        zeros = np.zeros((len(self.possible_agents), 1))
        infos = self._infos(np.zeros((3,) + zeros.shape), zeros)
        obs = self._observe()
        if self.render_mode == "human":
            self.render()
        return obs, infos

    def step(self, actions: Mapping[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        """Step every live agent; ``actions`` maps each live agent to an integer action."""
        if not self.agents:
            raise ValueError(
                "step() called without live agents: call reset() first (the episode has "
                "ended or was never started)"
            )
        check_action_keys(actions, self.agents)
        action_row = np.empty((1, len(self.possible_agents)), dtype=np.int64)
        for index, agent in enumerate(self.possible_agents):
            action_row[0, index] = to_int_action(agent, actions[agent], self._n_actions[index])
        if self.config.strict_actions:
            for index in range(len(self.possible_agents)):
                self._check_legal(index, int(action_row[0, index]))
        rewards3, invalid, terminated, truncated = self._core.step(
            action_row, np.ones(1, dtype=np.bool_)
        )
        term, trunc = bool(terminated[0]), bool(truncated[0])
        obs = self._observe()
        infos = self._infos(rewards3, invalid)
        rewards = {
            a: float(rewards3[0, i, 0] + rewards3[1, i, 0] + rewards3[2, i, 0])
            for i, a in enumerate(self.possible_agents)
        }
        terminations = dict.fromkeys(self.possible_agents, term)
        truncations = dict.fromkeys(self.possible_agents, trunc)
        if term or trunc:
            self.agents = []
        if self.render_mode == "human":
            self.render()
        return obs, rewards, terminations, truncations, infos

    def state(self) -> np.ndarray:
        """Global state float32 [state_dim] (see the module doc)."""
        return self._core.state()[0]

    def render(self) -> np.ndarray | str | None:
        if self.render_mode is None:
            gymnasium.logger.warn("render() called without a render_mode; returning None")
            return None
        return self._render_env(0, self.render_mode)

    # ---- helpers -------------------------------------------------------------------------
    @staticmethod
    def _check_seed(seed: Any) -> None:
        check_seed(seed)

    def _check_legal(self, index: int, action: int) -> None:
        """``strict_actions``: a masked (in-range) ``action`` of agent ``index`` is an error."""
        if self._core.legal_action(0, index, action):
            return
        label = self._action_label
        legal = [
            label(index, x)
            for x in range(self._n_actions[index])
            if self._core.legal_action(0, index, x)
        ]
        raise ValueError(
            f"action {label(index, action)} for agent {self.possible_agents[index]!r} is masked "
            f"(illegal here) and strict_actions=True: legal actions now are {legal}"
        )

    def _observe(self) -> Obs:
        buffers = self._core.new_obs_buffers()
        self._core.observe_into(np.zeros(1, dtype=np.int64), buffers)
        return obs_dict(self.possible_agents, buffers, row=0)

    def _infos(self, rewards3: np.ndarray, invalid: np.ndarray) -> dict[str, dict[str, float]]:
        metrics = {k: float(v[0]) for k, v in self._core.metrics().items()}
        return reward_infos(self.possible_agents, rewards3, invalid, metrics, _first_float)


class CheckedAECEnv(parallel_to_aec_wrapper):
    """PettingZoo's ``parallel_to_aec_wrapper`` that checks each agent's action when it is
    passed: an action outside the agent's space (or a masked one with ``strict_actions``)
    raises ``ValueError`` at that ``step`` call and changes nothing, so the env keeps working
    (the wrapper alone stores it and fails only at the last agent's step, then on every step
    until ``reset``)."""

    env: CoreParallelEnv

    def step(self, action: Any) -> None:
        agent = self.agent_selection
        if not (self.terminations[agent] or self.truncations[agent]):
            par = self.env
            index = par.possible_agents.index(agent)
            act = to_int_action(agent, action, par._n_actions[index])
            if par.config.strict_actions:
                par._check_legal(index, act)
        super().step(action)


class CoreVectorEnv(CoreFace):
    """``num_envs`` envs of one core stepped together, behind the trainers' vector-env
    contract (docs/CONTRACTS.md section 1; each env's module doc, "vector_env").

    Spaces are the single-env spaces; arrays carry a leading ``num_envs`` axis. A subclass's
    ``__init__`` builds the config and calls ``super().__init__(num_envs, autoreset, config,
    render_mode)``.
    """

    #: the fast path of the action check looks at each agent's array's dtype (False: only at
    #: the stacked array's, so a bool array stacked with integer ones passes as integers)
    _check_each_action_dtype = True

    def __init__(
        self, num_envs: int, autoreset: bool, config: Any, render_mode: str | None = None
    ) -> None:
        if not isinstance(autoreset, (bool, np.bool_)):
            raise ArgumentTypeError(f"autoreset must be a bool, got {type(autoreset).__name__}")
        self.autoreset = bool(autoreset)
        self._init_face(config, num_envs, render_mode)
        self.num_envs = self._core.num_envs
        self.agents = list(self.possible_agents)
        self._n_actions = np.array(self._n_actions)
        self._rngs: list[np.random.Generator] | None = None
        self._started = False
        n = self.num_envs
        self._all_active = np.ones(n, dtype=np.bool_)
        self._ended = np.zeros(n, dtype=np.bool_)  # autoreset=False: frozen envs
        self._terminated = np.zeros(n, dtype=np.bool_)
        self._truncated = np.zeros(n, dtype=np.bool_)
        self._obs: Obs = {}
        self._final: tuple[np.ndarray, Obs, np.ndarray] | None = None
        self._final_obs_cache: Obs | None = None

    # ---- API -----------------------------------------------------------------------------
    def reset(
        self, seed: int | Sequence[int] | None = None, options: dict | None = None
    ) -> tuple[Obs, dict[str, dict[str, np.ndarray]]]:
        """Reset every env. ``seed``: int s seeds env i with s + i; a sequence of num_envs
        ints seeds each env; None continues each env's stream (fresh entropy the first time).
        ``options`` is accepted and ignored."""
        n = self.num_envs
        if seed is None:
            if self._rngs is None:
                self._rngs = [np.random.default_rng() for _ in range(n)]
        else:
            self._rngs = [np.random.default_rng(s) for s in self._env_seeds(seed)]
        self._core.reset_envs(self._core.all_envs, self._rngs)
        self._started = True
        self._ended[:] = False
        self._terminated[:] = False
        self._truncated[:] = False
        self._final = None
        self._final_obs_cache = None
        buffers = self._core.new_obs_buffers()
        self._core.observe_into(self._core.all_envs, buffers)
        self._obs = obs_dict(self.possible_agents, buffers)
        zeros3 = np.zeros((3, len(self.possible_agents), n))
        infos = reward_infos(self.possible_agents, zeros3, zeros3[0], self._core.metrics())
        return self._obs, infos

    def step(self, actions: Mapping[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        """Step all envs with ``actions``: ``{agent: int array [num_envs]}``."""
        if not self._started:
            raise ValueError("step() called before reset(): call reset() first")
        core = self._core
        action_rows = self._validate(actions)
        active = self._all_active if self.autoreset else ~self._ended
        if self.config.strict_actions:
            self._check_strict(action_rows, active)
        rewards3, invalid, terminated, truncated = core.step(action_rows, active)
        metrics = core.metrics()
        ended = terminated | truncated
        if not self.autoreset:
            frozen = ~active
            terminated |= frozen & self._terminated
            truncated |= frozen & self._truncated
            self._terminated, self._truncated = terminated, truncated
            self._ended |= ended
            if frozen.any():
                for value in metrics.values():
                    value[frozen] = 0.0
        buffers = core.new_obs_buffers()
        core.observe_into(core.all_envs, buffers)
        self._final = None
        self._final_obs_cache = None
        if self.autoreset and ended.any():
            idx = np.flatnonzero(ended)
            final_rows = tuple(b[:, idx].copy() for b in buffers)
            final_state = core.state(idx)
            assert self._rngs is not None
            core.reset_envs(idx, [self._rngs[i] for i in idx])
            core.observe_into(idx, buffers)
            self._final = (idx, obs_dict(self.possible_agents, final_rows), final_state)
        self._obs = obs_dict(self.possible_agents, buffers)
        total = rewards3.sum(axis=0).astype(np.float32)
        rewards = {a: total[i] for i, a in enumerate(self.possible_agents)}
        terminations = {a: terminated.copy() for a in self.possible_agents}
        truncations = {a: truncated.copy() for a in self.possible_agents}
        infos = reward_infos(self.possible_agents, rewards3, invalid, metrics)
        return self._obs, rewards, terminations, truncations, infos

    def state(self) -> np.ndarray:
        """Global state float32 [num_envs, state_dim] of the current (possibly new) episodes."""
        return self._core.state()

    @property
    def final_obs(self) -> Obs:
        """Observations like ``obs``; rows of envs whose episode ended at the last step hold
        that episode's final observation."""
        if self._final is None:
            return self._obs
        if self._final_obs_cache is None:
            idx, final_rows, _ = self._final
            merged = {}
            for agent, parts in self._obs.items():
                merged[agent] = {}
                for key, array in parts.items():
                    array = array.copy()
                    array[idx] = final_rows[agent][key]
                    merged[agent][key] = array
            self._final_obs_cache = merged
        return self._final_obs_cache

    @property
    def final_state(self) -> np.ndarray:
        """``state()``, with rows of envs whose episode ended at the last step replaced by
        that episode's final state. float32 [num_envs, state_dim]."""
        state = self._core.state()
        if self._final is not None:
            idx, _, final_state = self._final
            state[idx] = final_state
        return state

    def render(self, index: int = 0) -> np.ndarray | str | None:
        """Render env ``index`` in ``render_mode`` (rgb_array when render_mode is None)."""
        self._check_index(index)
        return self._render_env(index, self.render_mode or "rgb_array")

    # ---- helpers -------------------------------------------------------------------------
    def _check_index(self, index: int) -> None:
        if not 0 <= index < self.num_envs:
            raise ValueError(f"index must be in [0, {self.num_envs - 1}], got {index}")

    def _env_seeds(self, seed: int | Sequence[int]) -> list[int]:
        """Each env's seed from ``reset(seed=...)`` (not None): int s -> s + i; a sequence of
        num_envs ints >= 0 -> itself."""
        n = self.num_envs
        allowed = f"seed must be None, an int >= 0 or a sequence of {n} ints >= 0"
        if is_int_seed(seed):
            if seed < 0:
                raise ValueError(f"{allowed}, got {seed}")
            return [int(seed) + i for i in range(n)]
        if isinstance(seed, (str, bytes, Mapping)) or not isinstance(seed, (Sequence, np.ndarray)):
            raise ValueError(f"{allowed}, got {seed!r} ({type(seed).__name__})")
        seeds = list(seed)
        bad = [s for s in seeds if not (is_int_seed(s) and s >= 0)]
        if len(seeds) != n or bad:
            detail = f"{len(seeds)} entries" if len(seeds) != n else f"entries {bad[:3]!r}"
            raise ValueError(f"{allowed}, got {detail} in {type(seed).__name__} {seed!r}")
        return [int(s) for s in seeds]

    def _validate(self, actions: Mapping[str, Any]) -> np.ndarray:
        """``{agent: int array [N]}`` -> int64 [N, A], or a ValueError that names the agent."""
        check_action_keys(actions, self.possible_agents)
        n = self.num_envs
        try:
            # fast path: every agent's actions are integer arrays of shape (n,) in range (each
            # checked for an integer dtype: stacking would turn a bool array into integers)
            arrays = [np.asarray(actions[a]) for a in self.possible_agents]
            rows = np.stack(arrays, axis=1)
            if self._check_each_action_dtype:
                integers = all(array.dtype.kind in "iu" for array in arrays)
            else:
                integers = rows.dtype.kind in "iu"
            if (
                rows.shape == (n, len(self.possible_agents))
                and integers
                and (rows >= 0).all()
                and (rows < self._n_actions).all()
            ):
                return rows.astype(np.int64, copy=False)
        except (ValueError, TypeError):
            pass  # ragged or non-numeric input: the per-agent checks below say what is wrong
        rows = np.empty((n, len(self.possible_agents)), dtype=np.int64)
        for index, agent in enumerate(self.possible_agents):
            n_actions = int(self._n_actions[index])
            array = np.asarray(actions[agent])
            if array.shape != (n,):
                raise ValueError(
                    f"actions[{agent!r}] must be an integer array of shape ({n},), got shape "
                    f"{array.shape}; allowed values are in [0, {n_actions - 1}]"
                )
            if array.dtype.kind not in "iu":
                raise ValueError(
                    f"actions[{agent!r}] must hold integers in [0, {n_actions - 1}] "
                    f"(Discrete({n_actions})), got dtype {array.dtype}"
                )
            bad = (array < 0) | (array >= n_actions)
            if bad.any():
                env_index = int(np.flatnonzero(bad)[0])
                raise action_error(
                    agent, array[env_index].item(), n_actions, f" in env {env_index}"
                )
            rows[:, index] = array
        return rows

    def _check_strict(self, action_rows: np.ndarray, active: np.ndarray) -> None:
        legal = self._core.legal_actions(action_rows, active)
        if not legal.all():
            env_index, index = (int(x) for x in np.argwhere(~legal)[0])
            agent = self.possible_agents[index]
            label = self._action_label(index, int(action_rows[env_index, index]))
            raise ValueError(
                f"action {label} for agent {agent!r} in env {env_index} is masked (illegal "
                f"here) and strict_actions=True; see obs[{agent!r}]['action_mask']"
            )


# ---- module constructors -------------------------------------------------------------------
class Constructors(NamedTuple):
    """A PettingZoo module's ``parallel_env``, ``env``, ``raw_env`` and ``vector_env``."""

    parallel_env: Callable[..., CoreParallelEnv]
    env: Callable[..., Any]
    raw_env: Callable[..., parallel_to_aec_wrapper]
    vector_env: Callable[..., CoreVectorEnv]


def constructors(
    parallel_class: type[CoreParallelEnv],
    vector_class: type[CoreVectorEnv],
    aec_class: type[parallel_to_aec_wrapper] = parallel_to_aec_wrapper,
) -> Constructors:
    """The constructors of an env module (as PettingZoo's ``parallel_wrapper_fn`` builds
    one from another), named as the module's own functions."""

    def parallel_env(**kwargs: Any) -> CoreParallelEnv:
        """The Parallel env (see the module doc for the arguments)."""
        return parallel_class(**kwargs)

    def raw_env(**kwargs: Any) -> parallel_to_aec_wrapper:
        """The AEC env without PettingZoo's order-enforcing wrapper."""
        return aec_class(parallel_class(**kwargs))

    def env(**kwargs: Any) -> Any:
        """The AEC env: PettingZoo's order-enforcing wrapper over :func:`raw_env` (as
        ``parallel_to_aec`` of :func:`parallel_env` builds it)."""
        return OrderEnforcingWrapper(raw_env(**kwargs))

    def vector_env(num_envs: int, autoreset: bool = True, **kwargs: Any) -> CoreVectorEnv:
        """``num_envs`` envs stepped together (see the module doc, "vector_env")."""
        return vector_class(num_envs, autoreset=autoreset, **kwargs)

    functions = Constructors(parallel_env, env, raw_env, vector_env)
    returns = (parallel_class, Any, aec_class, vector_class)
    for function, returned in zip(functions, returns, strict=True):
        function.__module__ = parallel_class.__module__
        function.__qualname__ = function.__name__
        function.__annotations__ = {**function.__annotations__, "return": returned}
    return functions
