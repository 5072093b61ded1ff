"""multisearch_v0: cooperative search and collect on a grid (PettingZoo Parallel + AEC + vector).

A team of **scouts** (wide view, fast explorers) and **rescuers** (narrow view, can collect)
searches a grid with obstacles for hidden targets. A target seen by anyone is *reported* on the
team map; a rescuer collects it with ``collect`` on its cell. The episode terminates when every
target is collected and is truncated after ``max_cycles`` steps.

=====================  ===================================================================
Import                 ``from envs import multisearch_v0``
Constructors           ``parallel_env(**kw)``, ``env(**kw)`` (AEC, ``parallel_to_aec``),
                       ``raw_env(**kw)`` (AEC without the order-enforcing wrapper),
                       ``vector_env(num_envs, autoreset=True, **kw)``
Agents                 ``scout_0..scout_{n_scouts-1}``, ``rescuer_0..rescuer_{n_rescuers-1}``
                       (scouts first; that order breaks ties, see below)
Agents count           ``n_scouts + n_rescuers`` (small preset: 4)
Action spaces          scouts ``Discrete(5)``, rescuers ``Discrete(6)``
Observation spaces     ``Dict(observation=Box(-1, 1, (obs_dim,), float32),
                       action_mask=Box(0, 1, (n_actions,), int8))``
State space            ``Box(0, 1, (4 * G * G + 2 * n_agents + 2,), float32)``
metadata               ``name="multisearch_v0"``, ``is_parallelizable=True``,
                       ``render_modes=["human", "rgb_array", "ansi"]``, ``render_fps=8``
=====================  ===================================================================

Actions
-------
``0`` stay, ``1`` up (row - 1), ``2`` down (row + 1), ``3`` left (col - 1), ``4`` right
(col + 1), ``5`` collect (rescuers only). A move into an obstacle or off the grid, and
``collect`` on a cell without an uncollected target, are *masked* (``action_mask`` 0). All
agents move simultaneously; agents may share a cell. Actions may be Python ints or NumPy
integers (np.int32, np.int64, 0-d integer arrays).

* An action outside the agent's action space (out of range, or not an integer: float, bool,
  str, ...), a missing or an unknown agent in the action dict: ``ValueError`` naming the agent,
  the action and what is allowed; nothing changes.
* A masked, in-range action: by default a no-op ("stay") that costs ``penalty_invalid`` and
  sets ``infos[agent]["invalid_action"] = 1.0`` (PettingZoo's own tests step with unmasked
  random actions). With ``strict_actions=True`` it raises ``ValueError``; nothing changes.

Observation (``observation``, float32, in [-1, 1]), for view radius ``v`` (window
``W = 2v + 1``), concatenated in this order:

========================  ======  ==========================================================
part                      size    meaning
========================  ======  ==========================================================
blocked window            W*W     1 obstacle or outside the grid (egocentric, row-major)
target window             W*W     1 uncollected target on the cell (in view = visible)
teammate window           W*W     1 another agent on the cell
visited window            W*W     1 cell stood on by the team (revisit signal)
own position              2       row / (G-1), col / (G-1)
time left                 1       max(max_cycles - t, 0) / max_cycles
targets left              1       fraction of targets not yet collected
minimap: reported         M*M     (``minimap=True`` only) 1 if the block holds a reported,
                                  uncollected target; blocks of ceil(G/M) cells per side
                                  (the last row/column of blocks may be smaller)
minimap: explored         M*M     (``minimap=True`` only) fraction of the block's cells
                                  (obstacles included) explored by the team
route to nearest target   3       (``minimap=True`` only) (d_row, d_col) in {-1, 0, 1} of
                                  the first move of a shortest route to the nearest reported
                                  target, and 1 if one is reachable; (0, 0, 1) on it; zeros
                                  if none. Routes plan on team knowledge: seen obstacles
                                  block, unseen cells count as free (ties: the lowest action).
                                  Zeros throughout with ``route_hint=False``
========================  ======  ==========================================================

``obs_dim = 4 W^2 + 4 (+ 2 M^2 + 3 with the minimap)``: it depends on the view radius and
``minimap_size`` only, not on the grid size or the number of agents/targets, so one policy
fits every grid of a family. Small preset: scouts 235, rescuers 75. The route is team
knowledge (the reported targets and the obstacles seen so far), what the heuristic baseline
plans on; it makes a reactive policy able to leave dead ends its narrow window cannot see
around. With ``minimap=False`` agents see only their window, so memory is needed.

State (``state()``, float32, in [0, 1]): the planes obstacle, uncollected target (all, hidden
or not: the critic is privileged), reported uncollected target, explored (each G*G,
row-major), then every agent's (row, col) / (G-1), time left, fraction collected.

Rewards
-------
Three channels every step for every agent; ``rewards[agent]`` is their sum and
``infos[agent]`` holds them under ``reward_team``, ``reward_individual``, ``reward_penalty``.

===========  ==========================================================  ==================
channel      term                                                        argument (default)
===========  ==========================================================  ==================
team         per target collected this step (every agent)                reward_target 1.0
team         when the last target is collected (every agent)             reward_complete 1.0
individual   first report of a target (first agent in order to see it)   reward_report 0.2
individual   collecting a target (first rescuer in order on the cell)    reward_collect 0.5
individual   per newly explored free cell (first agent in order)         reward_explore 0.01
penalty      every step                                                  -penalty_step 0.01
penalty      a move onto a cell the team had visited before this step    -penalty_revisit
                                                                         0.002
penalty      a masked action (replaced by stay)                          -penalty_invalid
                                                                         0.05
===========  ==========================================================  ==================

Step order: masked actions become stay -> simultaneous moves (revisits counted against the
visited map before the step) -> collection -> every agent explores its view window from its
new cell (marks cells explored, reports targets) -> team reward, t += 1, end check.

Infos (every agent, every step, from reset on; numbers only)
------------------------------------------------------------
``reward_team``, ``reward_individual``, ``reward_penalty``, ``invalid_action`` (1.0 when a
masked action was replaced by stay), and team episode metrics so far: ``success`` (fraction of
targets collected), ``solved`` (1.0 when all collected), ``coverage`` (fraction of free cells
explored), ``revisit_rate`` (fraction of moves onto already visited cells), ``episode_length``
(steps so far). "Explored" = inside some agent's view window at some step; "visited" = stood
on by some agent (every move lands on an explored cell, so revisits count visited ones).
parallel_env gives Python floats; vector_env float64 arrays ``[num_envs]``.

Starting state and episode end
------------------------------
Obstacles i.i.d. with ``obstacle_density``; free cells outside the largest connected free
region become obstacles (every free cell is reachable). Agents and targets on distinct random
free cells. Each agent's initial view is explored at reset (no reward). Terminated when all
targets are collected; truncated when ``t == max_cycles`` (``max_cycles`` is a writable
attribute, read at every step). All agents end together. ``reset(seed=s)`` makes episodes
reproducible; ``reset(seed=None)`` continues the env's random stream; ``options`` are ignored.
Before the first reset, ``state()`` and ``render()`` show an empty world.

Baselines: ``envs.baselines`` (scripted heuristic, random masked policy, ``evaluate_policy``);
``python -m envs.demo`` prints their table and writes an episode GIF.

Arguments
---------
``preset`` ("small" | "sparse" | "hard" | "memory" | "large"; explicit arguments override it),
``grid_size`` G,
``n_scouts``, ``n_rescuers`` (>= 1), ``n_targets`` (>= 1), ``obstacle_density`` ([0, 0.5]),
``max_cycles``, ``scout_view``, ``rescuer_view`` (view radius v), ``minimap`` (bool),
``minimap_size`` M, ``route_hint`` (bool, default True: the minimap's route part; False: zeros,
agents must find their way to reported targets themselves), the reward weights above
(penalties are magnitudes >= 0),
``strict_actions`` (bool), ``render_mode`` (None | "human" | "rgb_array" | "ansi").
Impossible values raise ``ValueError``; a wrong type or an unknown argument raises
``ArgumentTypeError``, which is both a ``TypeError`` and a ``ValueError``.

=======  ====  ===============  =======  ========  ==========  ====  ==========  =======
preset   G     scouts+rescuers  targets  obstacle  max_cycles  view  minimap     obs dim
=======  ====  ===============  =======  ========  ==========  ====  ==========  =======
small    16    2 + 2            3        0.1       200         3/1   4x4         235/75
sparse   28    2 + 2            7        0.2       250         3/1   7x7, no     301/141
                                                                     route
hard     28    3 + 3            9        0.2       150         3/1   7x7, no     301/141
                                                                     route
memory   24    2 + 2            6        0.1       2000        3/1   off         200/40
large    48    4 + 4            12       0.1       1000        3/1   8x8         331/171
=======  ====  ===============  =======  ========  ==========  ====  ==========  =======

The task ladder (presets with headroom for studies). ``sparse`` is the seeds' regime: reward
only for collecting targets and for finishing (team +1 per target and the completion bonus,
the collector's individual +0.5) and a 0.01 step cost; no report, exploration, revisit or
invalid-action terms, so most advantages are zero or negative early in training. ``hard`` is
larger and more crowded with the full shaping and tight time, where scouts and rescuers must
share the work. ``memory`` is the long-episode task (no minimap: memory is necessary).
``small`` stays the quick sanity task (default MAPPO solves it within seconds).

Calibration on validation seeds 10000..10031 (success rate; MAPPO: ``python -m marl.train
--env.preset P``, default settings, eval.json / metrics.jsonl ``eval/success_rate``, seeds 0, 1,
2). "4 minutes" and "10 minutes" are the env steps that default MAPPO takes in 240 / 600 s of
one idle core (process CPU time: sparse 10.7k, hard 8.7k env steps/s), because wall time
was contended when these runs shared the cores: sparse 2.56M / 6.39M, hard 2.08M / 5.21M.

=======  =======  =========  ===============================  ===============================
preset   random   heuristic  MAPPO at "4 min" (target: >=    MAPPO at "10 min" (target: 0.3
                             random + 0.1, < 0.9)             .. 0.85), eval.json
=======  =======  =========  ===============================  ===============================
sparse   0.080    1.000      0.647 / 0.696 / 0.589 (2.56M)    0.723 / 0.705 / 0.683 (6.39M)
hard     0.066    1.000      0.660 / 0.656 / 0.628 (2.05M)    0.646 / 0.649 / 0.681 (5.21M)
=======  =======  =========  ===============================  ===============================

Both presets are calibrated: every seed is inside both targets. Default MAPPO's validation
success rises steeply until about 1M env steps and then creeps (sparse about 0.65 -> 0.70, hard
flat near 0.65 over 1M..5M): the plateau is the room left for better methods
(``docs/results/ladder_calibration/``: curves and commands).

Rendering: ``rgb_array`` (uint8 [G*12, G*12, 3]), ``ansi`` (str), ``human`` (pygame window
when pygame is installed and a display exists, else the ansi frame printed; returns None).

vector_env
----------
``vector_env(num_envs, autoreset=True, **kw)`` steps ``num_envs`` worlds in one compiled loop
(the same core that ``parallel_env`` uses with one env). ``reset(seed=s)`` seeds env i with
``s + i`` (a sequence seeds each env; ``None`` continues each env's stream), so env i behaves
exactly like ``parallel_env(**kw)`` reset with seed ``s + i`` under the same actions until its
episode ends. ``step(actions)`` takes ``{agent: int array [N]}`` and returns dicts keyed by
agent: ``obs[a] = {"observation": float32 [N, obs_dim], "action_mask": int8 [N, n]}``,
``rewards[a]`` float32 [N], ``terminations[a]``/``truncations[a]`` bool [N], ``infos[a]`` dict
of float64 [N]. Arrays are fresh each step (safe to keep).

Autoreset timing (``autoreset=True``, "same step"): when env i's episode ends at a step, that
step's rewards, flags and infos (final metrics) belong to the ending transition, while the
returned observation and ``state()`` already belong to the next episode, reset from env i's own
random stream. The final observation / state are in ``vec.final_obs`` / ``vec.final_state``
(rows of envs that did not end hold the current ones). With ``autoreset=False`` an ended env is
frozen until ``reset()``: later steps leave it unchanged, give zero rewards and zero infos, and
keep its termination/truncation flags True.

Example
-------
>>> from envs import multisearch_v0
>>> env = multisearch_v0.parallel_env()
>>> obs, infos = env.reset(seed=0)
>>> sorted(obs)
['rescuer_0', 'rescuer_1', 'scout_0', 'scout_1']
>>> obs["scout_0"]["observation"].shape, obs["rescuer_0"]["action_mask"].dtype
((235,), dtype('int8'))
>>> actions = {a: 0 for a in env.agents}
>>> obs, rewards, terminations, truncations, infos = env.step(actions)
>>> round(rewards["scout_0"], 4) == round(sum(
...     infos["scout_0"][k] for k in ("reward_team", "reward_individual", "reward_penalty")), 4)
True

Version History
---------------
A change that alters observations, rewards or dynamics bumps the module version
(``multisearch_v0`` -> ``multisearch_v1``, ``metadata["name"]`` with it) and adds a line here.

* v0: Initial versions release (coopsearch 0.1.0). Includes the route observation: the
  "route to nearest target" part (3 values, with the minimap) is the first move of a shortest
  route to the nearest reported target, not the Manhattan offset to it (no release had the
  offset).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium
import numpy as np
from pettingzoo import ParallelEnv
from pettingzoo.utils.conversions import parallel_to_aec_wrapper
from pettingzoo.utils.wrappers import OrderEnforcingWrapper

from envs._core import (
    N_ACTIONS_RESCUER,
    N_ACTIONS_SCOUT,
    PRESETS,
    ArgumentTypeError,
    MultiSearchConfig,
    MultiSearchCore,
    make_config,
)
from envs.render import HumanRenderer, render_ansi, render_rgb

__all__ = [
    "PRESETS",
    "ArgumentTypeError",
    "MultiSearchConfig",
    "MultiSearchAECEnv",
    "MultiSearchParallelEnv",
    "MultiSearchVectorEnv",
    "env",
    "parallel_env",
    "raw_env",
    "vector_env",
]

METADATA: dict[str, Any] = {
    "name": "multisearch_v0",
    "render_modes": ["human", "rgb_array", "ansi"],
    "is_parallelizable": True,
    "render_fps": 8,
}
REWARD_KEYS = ("reward_team", "reward_individual", "reward_penalty")
METRIC_KEYS = ("success", "solved", "coverage", "revisit_rate", "episode_length")
INFO_KEYS = REWARD_KEYS + ("invalid_action",) + METRIC_KEYS


def _make_spaces(
    config: MultiSearchConfig,
) -> tuple[dict[str, gymnasium.spaces.Dict], dict[str, gymnasium.spaces.Discrete], Any]:
    observation_spaces: dict[str, gymnasium.spaces.Dict] = {}
    action_spaces: dict[str, gymnasium.spaces.Discrete] = {}
    for name in config.agent_names:
        scout = name.startswith("scout_")
        dim = config.obs_dim_scout if scout else config.obs_dim_rescuer
        n_actions = N_ACTIONS_SCOUT if scout else N_ACTIONS_RESCUER
        observation_spaces[name] = gymnasium.spaces.Dict(
            {
                "observation": gymnasium.spaces.Box(-1.0, 1.0, (dim,), np.float32),
                "action_mask": gymnasium.spaces.Box(0, 1, (n_actions,), np.int8),
            }
        )
        action_spaces[name] = gymnasium.spaces.Discrete(n_actions)
    state_space = gymnasium.spaces.Box(0.0, 1.0, (config.state_dim,), np.float32)
    return observation_spaces, action_spaces, state_space


def _check_render_mode(render_mode: str | None) -> None:
    if render_mode is not None and render_mode not in METADATA["render_modes"]:
        raise ValueError(
            f"unknown render_mode {render_mode!r}; allowed: None, {METADATA['render_modes']}"
        )


def _action_error(agent: str, action: Any, n_actions: int, detail: str = "") -> ValueError:
    return ValueError(
        f"invalid action {action!r} ({type(action).__name__}) for agent {agent!r}{detail}: "
        f"allowed are integers in [0, {n_actions - 1}] (Discrete({n_actions}))"
    )


def _check_seed(seed: Any) -> None:
    """``reset(seed=...)`` of the parallel env: None or an int >= 0 (a bool is not a seed)."""
    if seed is None:
        return
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"seed must be None or an int >= 0, got {seed!r} ({type(seed).__name__})")
    if seed < 0:
        raise ValueError(f"seed must be None or an int >= 0, got {seed}")


def _is_int_seed(seed: Any) -> bool:
    return isinstance(seed, (int, np.integer)) and not isinstance(seed, (bool, np.bool_))


def _check_action_keys(actions: Any, agents: Sequence[str]) -> None:
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


class _SpacesAndLimits:
    """Per-agent space lookups and the writable ``max_cycles``, shared by both faces."""

    observation_spaces: dict[str, gymnasium.spaces.Dict]
    action_spaces: dict[str, gymnasium.spaces.Discrete]
    config: Any

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


class MultiSearchParallelEnv(_SpacesAndLimits, ParallelEnv):
    """The PettingZoo Parallel env (one world of the vectorised core). See the module doc."""

    metadata = METADATA

    def __init__(self, preset: str = "small", render_mode: str | None = None, **kwargs: Any):
        self.config = make_config(preset, **kwargs)
        _check_render_mode(render_mode)
        self.render_mode = render_mode
        self._core = MultiSearchCore(self.config, 1)
        self.possible_agents = self.config.agent_names
        self.agents: list[str] = []
        self._n_actions = [N_ACTIONS_SCOUT] * self.config.n_scouts + [
            N_ACTIONS_RESCUER
        ] * self.config.n_rescuers
        self.observation_spaces, self.action_spaces, self.state_space = _make_spaces(self.config)
        self._rng = np.random.default_rng()
        self._buffers = self._core.new_obs_buffers()
        self._human: HumanRenderer | None = None
        self._started = False

    # ---- API -----------------------------------------------------------------------------
    def reset(
        self, seed: int | None = None, options: dict | None = None
    ) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, dict[str, float]]]:
        """Start an episode. ``options`` is accepted and ignored (no options are defined)."""
        _check_seed(seed)
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._core.reset_envs(np.zeros(1, dtype=np.int64), [self._rng])
        self.agents = list(self.possible_agents)
        self._started = True
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
        _check_action_keys(actions, self.agents)
        action_row = np.empty((1, len(self.possible_agents)), dtype=np.int64)
        for index, agent in enumerate(self.possible_agents):
            action_row[0, index] = self._to_int(agent, actions[agent], self._n_actions[index])
        if self.config.strict_actions:
            for index, agent in enumerate(self.possible_agents):
                act = int(action_row[0, index])
                if not self._core.legal_action(0, index, act):
                    legal = [
                        x
                        for x in range(self._n_actions[index])
                        if self._core.legal_action(0, index, x)
                    ]
                    raise ValueError(
                        f"action {act} for agent {agent!r} is masked (illegal here) and "
                        f"strict_actions=True: legal actions now are {legal}"
                    )
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
        if self.render_mode == "rgb_array":
            return render_rgb(self._core, 0)
        if self.render_mode == "ansi":
            return render_ansi(self._core, 0)
        if self._human is None:
            self._human = HumanRenderer(self.metadata["render_fps"])
        self._human.show(self._core, 0)
        return None

    def close(self) -> None:
        if self._human is not None:
            self._human.close()
            self._human = None

    # ---- helpers -------------------------------------------------------------------------
    @staticmethod
    def _to_int(agent: str, action: Any, n_actions: int) -> int:
        if isinstance(action, np.ndarray) and action.shape == ():
            action = action[()]
        if isinstance(action, (bool, np.bool_)) or not isinstance(action, (int, np.integer)):
            raise _action_error(agent, action, n_actions)
        if not 0 <= action < n_actions:
            raise _action_error(agent, action, n_actions)
        return int(action)

    def _observe(self) -> dict[str, dict[str, np.ndarray]]:
        buffers = self._core.new_obs_buffers()
        self._core.observe_into(np.zeros(1, dtype=np.int64), buffers)
        obs_scout, obs_rescuer, mask_scout, mask_rescuer = buffers
        s = self.config.n_scouts
        out = {}
        for i, agent in enumerate(self.possible_agents):
            if i < s:
                out[agent] = {"observation": obs_scout[i, 0], "action_mask": mask_scout[i, 0]}
            else:
                out[agent] = {
                    "observation": obs_rescuer[i - s, 0],
                    "action_mask": mask_rescuer[i - s, 0],
                }
        return out

    def _infos(self, rewards3: np.ndarray, invalid: np.ndarray) -> dict[str, dict[str, float]]:
        metrics = {k: float(v[0]) for k, v in self._core.metrics().items()}
        infos = {}
        for i, agent in enumerate(self.possible_agents):
            info = {
                "reward_team": float(rewards3[0, i, 0]),
                "reward_individual": float(rewards3[1, i, 0]),
                "reward_penalty": float(rewards3[2, i, 0]),
                "invalid_action": float(invalid[i, 0]),
            }
            info.update(metrics)
            infos[agent] = info
        return infos


class MultiSearchVectorEnv(_SpacesAndLimits):
    """``num_envs`` multisearch worlds stepped together (see the module doc, "vector_env").

    Spaces are the single-env spaces; arrays carry a leading ``num_envs`` axis.
    """

    metadata = METADATA

    def __init__(
        self,
        num_envs: int,
        autoreset: bool = True,
        preset: str = "small",
        render_mode: str | None = None,
        **kwargs: Any,
    ) -> None:
        self.config = make_config(preset, **kwargs)
        if not isinstance(autoreset, (bool, np.bool_)):
            raise ArgumentTypeError(f"autoreset must be a bool, got {type(autoreset).__name__}")
        _check_render_mode(render_mode)
        self.render_mode = render_mode
        self.autoreset = bool(autoreset)
        self._core = MultiSearchCore(self.config, num_envs)
        self.num_envs = self._core.num_envs
        self.possible_agents = self.config.agent_names
        self.agents = list(self.possible_agents)
        self._n_actions = np.array(
            [N_ACTIONS_SCOUT] * self.config.n_scouts + [N_ACTIONS_RESCUER] * self.config.n_rescuers
        )
        self.observation_spaces, self.action_spaces, self.state_space = _make_spaces(self.config)
        self._rngs: list[np.random.Generator] | None = None
        self._started = False
        n = self.num_envs
        self._all_active = np.ones(n, dtype=np.bool_)
        self._ended = np.zeros(n, dtype=np.bool_)  # autoreset=False: frozen envs
        self._terminated = np.zeros(n, dtype=np.bool_)
        self._truncated = np.zeros(n, dtype=np.bool_)
        self._obs: dict[str, dict[str, np.ndarray]] = {}
        self._final: tuple[np.ndarray, dict[str, dict[str, np.ndarray]], np.ndarray] | None = None
        self._final_obs_cache: dict[str, dict[str, np.ndarray]] | None = None
        self._human: HumanRenderer | None = None

    # ---- API -----------------------------------------------------------------------------
    def reset(
        self, seed: int | Sequence[int] | None = None, options: dict | None = None
    ) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, dict[str, np.ndarray]]]:
        """Reset every env. ``seed``: int s seeds env i with s + i; a sequence of num_envs
        ints seeds each env; None continues each env's stream (fresh entropy the first time).
        ``options`` is accepted and ignored."""
        n = self.num_envs
        allowed = f"seed must be None, an int >= 0 or a sequence of {n} ints >= 0"
        if seed is None:
            if self._rngs is None:
                self._rngs = [np.random.default_rng() for _ in range(n)]
        elif _is_int_seed(seed):
            if seed < 0:
                raise ValueError(f"{allowed}, got {seed}")
            self._rngs = [np.random.default_rng(int(seed) + i) for i in range(n)]
        else:
            if isinstance(seed, (str, bytes, Mapping)) or not isinstance(
                seed, (Sequence, np.ndarray)
            ):
                raise ValueError(f"{allowed}, got {seed!r} ({type(seed).__name__})")
            seeds = list(seed)
            bad = [s for s in seeds if not (_is_int_seed(s) and s >= 0)]
            if len(seeds) != n or bad:
                detail = f"{len(seeds)} entries" if len(seeds) != n else f"entries {bad[:3]!r}"
                raise ValueError(f"{allowed}, got {detail} in {type(seed).__name__} {seed!r}")
            self._rngs = [np.random.default_rng(int(s)) for s in seeds]
        self._core.reset_envs(self._core.all_envs, self._rngs)
        self._started = True
        self._ended[:] = False
        self._terminated[:] = False
        self._truncated[:] = False
        self._final = None
        self._final_obs_cache = None
        buffers = self._core.new_obs_buffers()
        self._core.observe_into(self._core.all_envs, buffers)
        self._obs = self._obs_dict(buffers)
        zeros3 = np.zeros((3, self.config.n_agents, n))
        infos = self._infos(zeros3, zeros3[0], self._core.metrics())
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
            self._final = (idx, self._obs_dict(final_rows), final_state)
        self._obs = self._obs_dict(buffers)
        total = rewards3.sum(axis=0).astype(np.float32)
        rewards = {a: total[i] for i, a in enumerate(self.possible_agents)}
        terminations = {a: terminated.copy() for a in self.possible_agents}
        truncations = {a: truncated.copy() for a in self.possible_agents}
        infos = self._infos(rewards3, invalid, metrics)
        return self._obs, rewards, terminations, truncations, infos

    def state(self) -> np.ndarray:
        """Global state float32 [num_envs, state_dim] of the current (possibly new) episodes."""
        return self._core.state()

    @property
    def final_obs(self) -> dict[str, dict[str, np.ndarray]]:
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

    def search_sets(self) -> list[frozenset[int]]:
        """Per env, the cells (flat index ``row * grid_size + col``) that any agent of the team
        stood on in the current episode (with ``autoreset=False``, the finished one): the sets
        whose mean pairwise Jaccard distance over episodes from the same reset seed is the
        search-diversity metric (:mod:`envs.diversity`)."""
        visited = self._core.visited.reshape(self.num_envs, -1)
        return [frozenset(np.flatnonzero(row).tolist()) for row in visited]

    def render(self, index: int = 0) -> np.ndarray | str | None:
        """Render env ``index`` in ``render_mode`` (rgb_array when render_mode is None)."""
        if not 0 <= index < self.num_envs:
            raise ValueError(f"index must be in [0, {self.num_envs - 1}], got {index}")
        if self.render_mode in (None, "rgb_array"):
            return render_rgb(self._core, index)
        if self.render_mode == "ansi":
            return render_ansi(self._core, index)
        if self._human is None:
            self._human = HumanRenderer(self.metadata["render_fps"])
        self._human.show(self._core, index)
        return None

    def close(self) -> None:
        if self._human is not None:
            self._human.close()
            self._human = None

    # ---- helpers -------------------------------------------------------------------------
    def _validate(self, actions: Mapping[str, Any]) -> np.ndarray:
        _check_action_keys(actions, self.possible_agents)
        n = self.num_envs
        try:
            # fast path: every agent's actions are integer arrays of shape (n,) in range (each
            # checked for an integer dtype: stacking would turn a bool array into integers)
            arrays = [np.asarray(actions[a]) for a in self.possible_agents]
            rows = np.stack(arrays, axis=1)
            if (
                rows.shape == (n, len(self.possible_agents))
                and all(array.dtype.kind in "iu" for array in arrays)
                and (rows >= 0).all()
                and (rows < self._n_actions).all()
            ):
                return rows.astype(np.int64, copy=False)
        except (ValueError, TypeError):
            pass  # ragged or non-numeric input: the per-agent checks below say what is wrong
        rows = np.empty((n, len(self.possible_agents)), dtype=np.int64)
        for index, agent in enumerate(self.possible_agents):
            n_actions = int(self._n_actions[index])
            value = actions[agent]
            array = np.asarray(value)
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
                raise _action_error(
                    agent, array[env_index].item(), n_actions, f" in env {env_index}"
                )
            rows[:, index] = array
        return rows

    def _check_strict(self, action_rows: np.ndarray, active: np.ndarray) -> None:
        legal = self._core.legal_actions(action_rows, active)
        if not legal.all():
            env_index, index = (int(x) for x in np.argwhere(~legal)[0])
            agent = self.possible_agents[index]
            raise ValueError(
                f"action {int(action_rows[env_index, index])} for agent {agent!r} in env "
                f"{env_index} is masked (illegal here) and strict_actions=True; see "
                f"obs[{agent!r}]['action_mask']"
            )

    def _obs_dict(self, buffers: tuple[np.ndarray, ...]) -> dict[str, dict[str, np.ndarray]]:
        obs_scout, obs_rescuer, mask_scout, mask_rescuer = buffers
        s = self.config.n_scouts
        out = {}
        for i, agent in enumerate(self.possible_agents):
            if i < s:
                out[agent] = {"observation": obs_scout[i], "action_mask": mask_scout[i]}
            else:
                out[agent] = {"observation": obs_rescuer[i - s], "action_mask": mask_rescuer[i - s]}
        return out

    def _infos(
        self, rewards3: np.ndarray, invalid: np.ndarray, metrics: dict[str, np.ndarray]
    ) -> dict[str, dict[str, np.ndarray]]:
        infos = {}
        for i, agent in enumerate(self.possible_agents):
            info = {
                "reward_team": rewards3[0, i],
                "reward_individual": rewards3[1, i],
                "reward_penalty": rewards3[2, i],
                "invalid_action": invalid[i],
            }
            info.update(metrics)
            infos[agent] = info
        return infos


# ---- PettingZoo-style constructors -------------------------------------------------------
def parallel_env(**kwargs: Any) -> MultiSearchParallelEnv:
    """The Parallel env (see the module doc for the arguments)."""
    return MultiSearchParallelEnv(**kwargs)


class MultiSearchAECEnv(parallel_to_aec_wrapper):
    """PettingZoo's ``parallel_to_aec_wrapper`` that checks each agent's action when it is
    passed: an action outside the agent's space (or a masked one with ``strict_actions``)
    raises ``ValueError`` at that ``step`` call and changes nothing, so the env keeps working
    (the wrapper alone stores it and fails only at the last agent's step, then on every step
    until ``reset``)."""

    def step(self, action: Any) -> None:
        agent = self.agent_selection
        if not (self.terminations[agent] or self.truncations[agent]):
            par = self.env
            index = par.possible_agents.index(agent)
            n_actions = int(par._n_actions[index])
            act = par._to_int(agent, action, n_actions)
            if par.config.strict_actions and not par._core.legal_action(0, index, act):
                legal = [x for x in range(n_actions) if par._core.legal_action(0, index, x)]
                raise ValueError(
                    f"action {act} for agent {agent!r} is masked (illegal here) and "
                    f"strict_actions=True: legal actions now are {legal}"
                )
        super().step(action)


def raw_env(**kwargs: Any) -> MultiSearchAECEnv:
    """The AEC env without PettingZoo's order-enforcing wrapper."""
    return MultiSearchAECEnv(MultiSearchParallelEnv(**kwargs))


def env(**kwargs: Any) -> Any:
    """The AEC env: PettingZoo's order-enforcing wrapper over :class:`MultiSearchAECEnv` (as
    ``parallel_to_aec`` of :func:`parallel_env` builds it), checking each action as passed."""
    return OrderEnforcingWrapper(raw_env(**kwargs))


def vector_env(num_envs: int, autoreset: bool = True, **kwargs: Any) -> MultiSearchVectorEnv:
    """``num_envs`` worlds stepped together (see the module doc, "vector_env")."""
    return MultiSearchVectorEnv(num_envs, autoreset=autoreset, **kwargs)
