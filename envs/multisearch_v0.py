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
around. With ``minimap=False`` agents see only their window; the route still points the way,
so a memoryless policy does well there too (see the ``memory`` preset below).

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

Baselines: ``envs.baselines`` (scripted heuristic, random masked policy,
``evaluate_baseline``); ``python -m envs.demo`` prints their table and writes an episode GIF.

Arguments
---------
``preset`` ("small" | "sparse" | "hard" | "memory" | "large"; explicit arguments override it;
``memory``, long episodes of 2,000 steps on a 24x24 grid, does **not** need memory: a
memoryless policy solves it, a trained mlp as well as a gru (0.896 vs 0.878 success,
``docs/results/memory_factorial/``); the task that needs memory, with a horizon H, is
``envs.multisearch_recall_v1``),
``grid_size`` G,
``n_scouts``, ``n_rescuers`` (>= 1), ``n_targets`` (>= 1), ``obstacle_density`` ([0, 0.5]),
``max_cycles``, ``scout_view``, ``rescuer_view`` (view radius v), ``minimap`` (bool),
``minimap_size`` M, ``route_hint`` (bool, default True: the minimap's route part; False: zeros,
agents must find their way to reported targets themselves), the reward weights above
(penalties are magnitudes >= 0),
``rescuer_reward_scale`` (> 0, default 1.0: off) multiplies the rescuers' individual and
penalty rewards (not the shared team reward), so that one agent type's rewards are 10x or
100x the other's: the task of the ``whitening_scales`` study, where statistics per agent type
should matter. Not a preset value.
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
share the work. ``memory`` is the long-episode task without a minimap. **A memoryless
policy solves it** as well as a recurrent one: at equal settings the mlp's final success is
0.896, gru's 0.878 (gru - mlp -0.018 [-0.080, +0.044], nothing shown;
docs/results/memory_factorial/), so the earlier "memory is necessary" is retracted. For a task
that needs memory use ``envs.multisearch_recall_v0`` (a memoryless policy is at chance there,
proved in its docstring).
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

from typing import Any

import gymnasium
import numpy as np

from envs._multisearch_core import (
    N_ACTIONS_RESCUER,
    N_ACTIONS_SCOUT,
    PRESETS,
    MultiSearchConfig,
    MultiSearchCore,
    make_config,
)
from envs._pettingzoo import (
    CheckedAECEnv,
    CoreParallelEnv,
    CoreVectorEnv,
    constructors,
    two_type_spaces,
)
from envs.errors import ArgumentTypeError
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
    return two_type_spaces(
        config.agent_names,
        "scout_",
        -1.0,
        (config.obs_dim_scout, config.obs_dim_rescuer),
        (N_ACTIONS_SCOUT, N_ACTIONS_RESCUER),
        config.state_dim,
    )


class _MultiSearchFace:
    """What both faces of multisearch put into the shared ones (:mod:`envs._pettingzoo`)."""

    metadata = METADATA
    _core_class = MultiSearchCore
    _make_spaces = staticmethod(_make_spaces)
    _render_rgb = staticmethod(render_rgb)
    _render_ansi = staticmethod(render_ansi)

    def _human_renderer(self) -> HumanRenderer:
        return HumanRenderer(self.metadata["render_fps"])


class MultiSearchParallelEnv(_MultiSearchFace, CoreParallelEnv):
    """The PettingZoo Parallel env (one world of the vectorised core). See the module doc."""

    def __init__(self, preset: str = "small", render_mode: str | None = None, **kwargs: Any):
        super().__init__(make_config(preset, **kwargs), render_mode)


class MultiSearchVectorEnv(_MultiSearchFace, CoreVectorEnv):
    """``num_envs`` multisearch worlds stepped together (see the module doc, "vector_env").

    Spaces are the single-env spaces; arrays carry a leading ``num_envs`` axis.
    """

    def __init__(
        self,
        num_envs: int,
        autoreset: bool = True,
        preset: str = "small",
        render_mode: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(num_envs, autoreset, make_config(preset, **kwargs), render_mode)

    def search_sets(self) -> list[frozenset[int]]:
        """Per env, the cells (flat index ``row * grid_size + col``) that any agent of the team
        stood on in the current episode (with ``autoreset=False``, the finished one): the sets
        whose mean pairwise Jaccard distance over episodes from the same reset seed is the
        search-diversity metric (:mod:`envs.diversity`)."""
        visited = self._core.visited.reshape(self.num_envs, -1)
        return [frozenset(np.flatnonzero(row).tolist()) for row in visited]


class MultiSearchAECEnv(CheckedAECEnv):
    """PettingZoo's ``parallel_to_aec_wrapper`` that checks each agent's action when it is
    passed: an action outside the agent's space (or a masked one with ``strict_actions``)
    raises ``ValueError`` at that ``step`` call and changes nothing, so the env keeps working
    (the wrapper alone stores it and fails only at the last agent's step, then on every step
    until ``reset``)."""


# ---- PettingZoo-style constructors: parallel_env(**kw), env(**kw) (the order-enforcing
# wrapper over raw_env, as parallel_to_aec builds it), raw_env(**kw) (MultiSearchAECEnv),
# vector_env(num_envs, autoreset=True, **kw)
parallel_env, env, raw_env, vector_env = constructors(
    MultiSearchParallelEnv, MultiSearchVectorEnv, MultiSearchAECEnv
)
