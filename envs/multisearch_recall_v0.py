"""multisearch_recall_v0: multisearch where success requires memory over a horizon H
(PettingZoo Parallel + AEC + vector).

The world, agents, actions, moves, collection, observations, state, reward channels, infos
and ``vector_env`` of :mod:`envs.multisearch_v0` (which documents everything this page does
not), on the same core, with a recall task on top: a **cue** names one of ``n_zones`` zones of
the grid in the first observation only; for the next ``memory_horizon`` steps nobody can move;
then, in a decision phase of ``decision_steps`` steps, the team succeeds by collecting the
target of the cued zone. A target of another zone ends the episode as a failure. Nothing
observed after the first step depends on the cue, so a policy without memory is at chance,
``1 / n_zones``, at every horizon (proof below), and a policy that remembers the cue for H
steps solves it (its route is in the observation).

**Newer version:** :mod:`envs.multisearch_recall_v1` replaces the decision walk by one answer
action at step H, so that H is the whole span to remember and the random policy is at chance
too (here it is below chance: it rarely collects). This module stays as it is; the results
below cite it.

=====================  ===================================================================
Import                 ``from envs import multisearch_recall_v0``
Constructors           ``parallel_env(**kw)``, ``env(**kw)`` (AEC, ``parallel_to_aec``),
                       ``raw_env(**kw)`` (AEC without the order-enforcing wrapper),
                       ``vector_env(num_envs, autoreset=True, **kw)``
Agents                 ``scout_0..``, ``rescuer_0..`` (as v0; default 2 + 2)
Action spaces          scouts ``Discrete(5)``, rescuers ``Discrete(6)`` (as v0)
Observation spaces     ``Dict(observation=Box(-1, 1, (obs_dim,), float32),
                       action_mask=Box(0, 1, (n_actions,), int8))``: v0's observation and
                       ``4 * n_zones`` more values (below); default: scouts 251, rescuers 91
State space            v0's, ``Box(0, 1, (4 * G * G + 2 * n_agents + 2,), float32)``
                       (the cue is never in it)
metadata               ``name="multisearch_recall_v0"``, otherwise as v0
Baselines              in this module: :class:`RememberingPolicy` (also ``HeuristicPolicy``,
                       what ``marl.train`` prints), :class:`FixedZonePolicy`,
                       :class:`RandomPolicy`, :func:`evaluate_policy`
=====================  ===================================================================

Episode
-------
With ``H = memory_horizon`` and ``D = decision_steps``; ``t`` counts the steps taken.

=============  ===============  ==========================================================
phase          steps            what happens
=============  ===============  ==========================================================
cue            observation t=0  the cue (one-hot of the cued zone) is in every agent's
                                observation; it is zeros in every later observation
frozen         actions at       only ``stay`` is unmasked (a masked action is a no-op with
               t = 0 .. H-1     ``penalty_invalid``, as in v0): nobody moves, nothing is
                                explored, so no position, map or window can hold the cue
decision       actions at       v0's dynamics; the episode *terminates* at the first step
               t = H .. H+D-1   that collects any target: success when it collects exactly
                                the cued zone's target, failure otherwise
end            t = H + D        truncated (``max_cycles = H + D``): failure
=============  ===============  ==========================================================

The memory horizon is the distance between the cue (observation 0) and the first
observation at which an action can use it (observation H); the cue is needed until the target
is collected, up to H + D - 1 steps later.

Zones and targets: ``n_zones`` 4 are the grid's quadrants (zone 0 top-left, 1 top-right, 2
bottom-left, 3 bottom-right: ``zone = 2 * (2 row // G) + (2 col // G)``), 2 its left and
right halves (``2 col // G``). Target ``k`` lies in zone ``k`` (one per zone, uniform on the
zone's free cells not holding an agent); obstacles and agents are drawn as in v0, the cue
uniformly from the env's random stream after the layout, independently of it. Every target
is *reported* from the start (the team knows where they are; the task is which one).

Observation: v0's parts (window channels, own position, time left, targets left, minimap;
see v0), then

=================  ==========  =============================================================
part               size        meaning
=================  ==========  =============================================================
cue                n_zones     one-hot of the cued zone at t = 0; zeros at every t >= 1
zone routes        3 n_zones   per zone k, as v0's route part: (d_row, d_col) in {-1, 0, 1}
                               of the first move of a shortest route (on the true map) to
                               zone k's target, and 1 if it is uncollected; (0, 0, 1) on it;
                               zeros once collected
=================  ==========  =============================================================

Action masks: v0's, and only ``stay`` while ``t < H``.

Rewards: v0's three channels and terms, except that collecting pays only for the cued
target: **team** ``reward_target`` (default 1.0) to every agent at the step that collects
exactly the cued zone's target, nothing for another target. The other v0 terms keep their
meaning (their defaults here: ``reward_collect``, ``reward_report``, ``reward_explore``,
``penalty_step``, ``penalty_revisit`` 0; ``penalty_invalid`` 0.05).
``infos`` carry v0's keys, with ``success`` and ``solved`` both 1.0 once the cued target was
collected (and only it) and 0.0 otherwise; ``coverage``, ``revisit_rate``,
``episode_length`` as v0.

``reset(seed=None, options=None)``: ``options={"cue": k}`` fixes the cue of this reset (an int
in ``[0, n_zones)``; for ``vector_env`` also a sequence of ``num_envs`` ints) without changing
anything else (the cue is drawn and then replaced, so the random stream is the same); other
options are ignored.

Chance, and why memory is necessary
-----------------------------------
Claim: a policy whose action at step t depends only on the current observation and state
(any memoryless policy, also one that reads ``state()``) succeeds with probability at most
``1 / n_zones``.

Proof. Fix the layout (the seed). Actions at t < H are replaced by ``stay``, so observations
and states at t = 1..H are functions of the layout and t alone. From t = H on, by induction,
the observation and state at t are functions of the layout and the actions at H..t-1, which
a memoryless policy draws from the observations and states at H..t-1: the distribution of the
whole trajectory from t = 1 on (and of which targets end it) is the same for every cue. Let
``p_k`` be the probability that the episode ends by collecting exactly zone k's target; these
events are disjoint, so ``sum_k p_k <= 1``. The cue is uniform and independent of the layout,
so success = ``sum_k P(cue = k) p_k = (1 / n_zones) sum_k p_k <= 1 / n_zones``. Equality holds
for :class:`FixedZonePolicy` when it always reaches its target in time, which makes
``1 / n_zones`` the best memoryless success, the *chance* level. The uniform random policy
collects some target with probability ``q < 1`` and then the cued one with probability
``1 / n_zones``: success ``q / n_zones``. A policy that remembers the cue follows that zone's
route: :class:`RememberingPolicy` succeeds whenever the route is shorter than ``D``.

Measured (``python benchmarks/memory_task.py --train``, default arguments, one episode per
seed 0..1023 a cell; success rate; chance ``1 / n_zones`` = 0.25; "| collect": random's
success among its episodes that collect a target; MAPPO: ``python -m marl.train --env-fn
envs.multisearch_recall_v0:vector_env --env.memory_horizon H --total-steps 500000 --seed 0
--final-eval-episodes 1024``, default mlp, eval.json on seeds 10000..11023):

=====  ===========  ==============  ======  ==========  ==================
H      remembering  memoryless      random  random |    mlp MAPPO 500k
                    (fixed zone 0)          collect     steps, seed 0
=====  ===========  ==============  ======  ==========  ==================
16     1.000        0.249           0.055   0.205       0.222
64     1.000        0.249           0.058   0.219       0.099
256    1.000        0.249           0.060   0.233       not run
1024   1.000        0.249           0.062   0.237       not run
4096   1.000        0.249           0.058   0.210       not run
=====  ===========  ==============  ======  ==========  ==================

The fixed-zone figure is the same at every H because it is exact given the seeds: it always
collects zone 0's target, so it succeeds on the 255 of 1,024 seeds whose cue is zone 0 (the
cue is drawn after the layout, the same at every H). Random collects a target in about a
quarter of the episodes (64 steps of a random walk) and the cued one in about a quarter of
those. The mlp learned at H = 16 to walk to one target (0.22); at H = 64 it had not yet
learned to collect reliably in 500k steps (0.10). Recurrent MAPPO with a window that holds
the cue and the decision (``--num-envs 16 --rollout-steps 128 --seq-len 128``), one seed a
cell, 256 validation episodes: gru at H = 1 learned it (0.988 after 4M env steps, seed 1; at
chance until about 1.3M, so 1.2M-step runs at H = 1 and 4 read 0.23 and 0.16); at H = 16 gru
stayed at chance (0.219 after 4M, seed 1; 0.199 after 2M, seed 0), and so did mamba (0.121
after 2M). A possible reason, not tested: the cue is needed on every step of the walk to the
cued target, so the span a policy must remember is H plus that walk (tens of steps).

Arguments
---------
``memory_horizon`` H (int >= 1, default 16), ``decision_steps`` D (int >= 1, default 64;
long enough for a shortest route across the default grid), ``n_zones`` (2 or 4, default 4),
and v0's arguments except ``preset``, ``n_targets`` (= ``n_zones``), ``max_cycles`` (= H + D)
and ``reward_complete`` (no meaning here): ``grid_size`` (16), ``n_scouts`` (2),
``n_rescuers`` (2), ``obstacle_density`` (0.1), ``scout_view`` (3), ``rescuer_view`` (1),
``minimap`` (True), ``minimap_size`` (4), ``route_hint`` (True: v0's route to the *nearest*
target), the reward weights (defaults above), ``rescuer_reward_scale`` (1.0),
``strict_actions`` (False), ``render_mode``. Impossible values raise ``ValueError``; a wrong
type or an unknown argument raises ``ArgumentTypeError``. Every zone must keep a free cell
that no agent starts on (else ``ValueError`` at reset).

Example
-------
>>> from envs import multisearch_recall_v0
>>> env = multisearch_recall_v0.parallel_env(memory_horizon=4)
>>> obs, infos = env.reset(seed=0, options={"cue": 2})
>>> obs["rescuer_0"]["observation"][-16:-12].tolist()  # the cue, at t = 0 only
[0.0, 0.0, 1.0, 0.0]
>>> obs["rescuer_0"]["action_mask"].tolist()  # frozen: stay only
[1, 0, 0, 0, 0, 0]
>>> obs, *_ = env.step({a: 0 for a in env.agents})
>>> obs["rescuer_0"]["observation"][-16:-12].tolist()
[0.0, 0.0, 0.0, 0.0]

Version History
---------------
A change that alters observations, rewards or dynamics bumps the module version
(``multisearch_recall_v0`` -> ``multisearch_recall_v1``, ``metadata["name"]`` with it) and
adds a line here.

* v0: Initial release (issue 48): cue, frozen phase of ``memory_horizon`` steps, decision
  phase, one target per zone, zone routes; v0's world and dynamics (``multisearch_v0``
  unchanged).
* v1: see :mod:`envs.multisearch_recall_v1` (one answer action at step H).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numba import njit

from envs._baselines import Policy, RandomPolicy, run_episodes, to_env_format
from envs._multisearch_core import (
    N_ACTIONS_RESCUER,
    MultiSearchConfig,
    MultiSearchCore,
    generate_layout,
)
from envs._multisearch_kernels import STEP_DC, STEP_DR, _route_action, _route_field
from envs._pettingzoo import CheckedAECEnv, CoreParallelEnv, CoreVectorEnv, constructors
from envs.errors import ArgumentTypeError, check_int_field
from envs.multisearch_v0 import METADATA as V0_METADATA
from envs.multisearch_v0 import _MultiSearchFace

__all__ = [
    "BASELINES",
    "ArgumentTypeError",
    "FixedZonePolicy",
    "HeuristicPolicy",
    "RandomPolicy",
    "RecallConfig",
    "RecallCore",
    "RecallParallelEnv",
    "RecallVectorEnv",
    "RememberingPolicy",
    "env",
    "evaluate_policy",
    "make_config",
    "parallel_env",
    "raw_env",
    "vector_env",
    "zone_of",
]

METADATA: dict[str, Any] = {**V0_METADATA, "name": "multisearch_recall_v0"}

#: the module with this env's baselines (``HeuristicPolicy``, ``RandomPolicy``): this one
BASELINES = __name__

#: v0 arguments that are derived here (or meaningless), so not accepted
_DERIVED = ("n_targets", "max_cycles", "reward_complete")

#: defaults that differ from v0's ``small`` preset: only the recall task is rewarded
DEFAULTS: dict[str, Any] = dict(
    reward_collect=0.0,
    reward_report=0.0,
    reward_explore=0.0,
    penalty_step=0.0,
    penalty_revisit=0.0,
)


def zone_of(row: Any, col: Any, grid_size: int, n_zones: int) -> Any:
    """The zone of cell(s) ``(row, col)``: quadrants 0 1 / 2 3 (``n_zones=4``) or halves 0 | 1
    (``n_zones=2``). Works on ints and integer arrays."""
    column_half = (2 * col) // grid_size
    if n_zones == 2:
        return column_half
    return 2 * ((2 * row) // grid_size) + column_half


@dataclasses.dataclass
class RecallConfig(MultiSearchConfig):
    """v0's configuration (the core reads it) and the recall task's arguments.

    ``n_targets`` = ``n_zones`` and ``max_cycles`` = ``memory_horizon + decision_steps``
    (set by :func:`make_config`); ``reward_target`` is paid by the recall layer, only for the
    cued target (:meth:`weights` hands the core zero for it).
    """

    memory_horizon: int = 16
    decision_steps: int = 64
    n_zones: int = 4

    @property
    def chance(self) -> float:
        """The best success of a memoryless policy, ``1 / n_zones`` (module doc)."""
        return 1.0 / self.n_zones

    def recall_offset(self, view: int) -> int:
        """Index of the cue within an observation of an agent with view radius ``view``."""
        return MultiSearchConfig.obs_dim(self, view)

    def obs_dim(self, view: int) -> int:
        return self.recall_offset(view) + 4 * self.n_zones

    def weights(self) -> np.ndarray:
        """The core's reward weights: v0's, without the per-target and completion rewards."""
        weights = super().weights()
        weights[0] = 0.0  # reward_target: the recall layer pays it for the cued target only
        weights[1] = 0.0  # reward_complete: not used
        return weights

    def validate(self) -> RecallConfig:
        _check_recall_fields(self)
        super().validate()
        if self.grid_size < 4:
            raise ValueError(f"grid_size must be >= 4 for zones, got {self.grid_size}")
        if self.n_targets != self.n_zones:
            raise ValueError(f"n_targets must equal n_zones, got {self.n_targets}")
        return self


def _check_recall_fields(config: RecallConfig) -> None:
    check_int_field(config, "memory_horizon", 1, 1 << 24)
    check_int_field(config, "decision_steps", 1, 1 << 24)
    check_int_field(config, "n_zones", 2, 4)
    if config.n_zones not in (2, 4):
        raise ValueError(f"n_zones must be 2 (halves) or 4 (quadrants), got {config.n_zones}")


def make_config(**kwargs: Any) -> RecallConfig:
    """:data:`DEFAULTS` over v0's ``small`` preset, overridden by ``kwargs``, validated.

    ``ArgumentTypeError`` (a ``TypeError`` and a ``ValueError``) for an unknown argument or one
    that is derived here (``n_targets``, ``max_cycles``, ``reward_complete``, ``preset``)."""
    allowed = {f.name for f in dataclasses.fields(RecallConfig)} - set(_DERIVED)
    unknown = sorted(set(kwargs) - allowed)
    if unknown:
        derived = [k for k in unknown if k in _DERIVED or k == "preset"]
        why = f" ({derived}: derived from n_zones / the phases, not arguments)" if derived else ""
        raise ArgumentTypeError(
            f"unknown argument(s) {unknown} for multisearch_recall_v0{why}; "
            f"allowed: {sorted(allowed)}"
        )
    config = RecallConfig(**{**DEFAULTS, **kwargs})
    _check_recall_fields(config)
    config.n_targets = config.n_zones
    config.max_cycles = config.memory_horizon + config.decision_steps
    return config.validate()


def draw_layout(
    rng: np.random.Generator, config: RecallConfig
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One episode's world: obstacles and agents as v0's :func:`generate_layout`, then target
    ``k`` uniform on zone ``k``'s free cells that hold no agent. Redrawn (up to 100 times)
    while a zone has no such cell. Returns ``obstacle`` bool [G, G], ``agent_cells`` int64
    [A, 2], ``target_cells`` int64 [n_zones, 2]."""
    g = config.grid_size
    rows, cols = np.divmod(np.arange(g * g), g)
    zones = zone_of(rows, cols, g, config.n_zones)
    for _attempt in range(100):
        obstacle, agent_cells, _ = generate_layout(rng, config)
        free = ~obstacle.ravel()
        free[agent_cells[:, 0] * g + agent_cells[:, 1]] = False
        target_cells = np.empty((config.n_zones, 2), dtype=np.int64)
        for zone in range(config.n_zones):
            cells = np.flatnonzero(free & (zones == zone))
            if cells.size == 0:
                break
            target_cells[zone] = divmod(int(cells[rng.integers(cells.size)]), g)
        else:
            return obstacle, agent_cells, target_cells
    raise ValueError(
        f"no layout with a free cell in every zone after 100 draws (grid_size={g}, "
        f"obstacle_density={config.obstacle_density}): use fewer obstacles or a larger grid"
    )


# ---- kernels -------------------------------------------------------------------------------
@njit(cache=True)
def _zone_routes_kernel(envs, obstacle, target_pos, zone_dist):
    """``zone_dist[n, k]`` [G, G]: route lengths to zone k's target on the true map, by the
    core's route search (:func:`_route_field` with every obstacle known: ``seen = obstacle``)
    from that one target."""
    g = obstacle.shape[1]
    n_zones = target_pos.shape[1]
    queue = np.empty(g * g, dtype=np.int64)
    only = np.zeros(target_pos.shape[:2], dtype=np.int8)  # target states: only k "reported"
    for j in range(envs.shape[0]):
        n = envs[j]
        for k in range(n_zones):
            only[n, :] = 0
            only[n, k] = 1
            _route_field(n, g, obstacle, obstacle, target_pos, only, zone_dist[:, k], queue)
        only[n, :] = 0


@njit(cache=True)
def _recall_observe_kernel(
    envs, n_scouts, horizon, offset_scout, offset_rescuer, t, cue, zone_dist, target_state,
    agent_pos, obs_scout, obs_rescuer, mask_scout, mask_rescuer,
):  # fmt: skip
    """After the core's observation of envs ``envs``: write each agent's cue and zone routes
    from ``offset_*`` on, and mask every action but stay while ``t < horizon``."""
    n_agents = agent_pos.shape[1]
    n_zones = zone_dist.shape[1]
    for j in range(envs.shape[0]):
        n = envs[j]
        for a in range(n_agents):
            if a < n_scouts:
                out, mask, base = obs_scout[a, n], mask_scout[a, n], offset_scout
            else:
                out, mask = obs_rescuer[a - n_scouts, n], mask_rescuer[a - n_scouts, n]
                base = offset_rescuer
            pr = agent_pos[n, a, 0]
            pc = agent_pos[n, a, 1]
            for k in range(n_zones):
                out[base + k] = 1.0 if t[n] == 0 and cue[n] == k else 0.0
                part = base + n_zones + 3 * k
                out[part] = 0.0
                out[part + 1] = 0.0
                out[part + 2] = 0.0
                if target_state[n, k] != 2 and zone_dist[n, k, pr, pc] >= 0:
                    act = _route_action(zone_dist[n, k], pr, pc)
                    out[part] = STEP_DR[act]
                    out[part + 1] = STEP_DC[act]
                    out[part + 2] = 1.0
            if t[n] < horizon:
                mask[1:] = 0


# ---- the core: v0's dynamics with the recall layer -------------------------------------------
class RecallCore(MultiSearchCore):
    """v0's core (:class:`MultiSearchCore`, which steps the world) with the recall task: the
    layout and cue at reset, the frozen phase, the end at the first collection, the cued
    target's reward and the cue/route observation.

    Extra arrays (N envs, Z zones): ``cue`` int64 [N]; ``zone_dist`` int32 [N, Z, G, G]
    (route lengths to each zone's target, fixed per episode); ``forced_cue``: None, or int64
    [N] cues that the next :meth:`reset_envs` uses (``reset(options={"cue": ...})``).
    """

    config: RecallConfig

    def __init__(self, config: RecallConfig, num_envs: int) -> None:
        super().__init__(config, num_envs)
        n, g, z = self.num_envs, config.grid_size, config.n_zones
        self.cue = np.zeros(n, dtype=np.int64)
        self.zone_dist = np.full((n, z, g, g), -1, dtype=np.int32)
        self.forced_cue: np.ndarray | None = None
        self.offsets = (config.recall_offset(config.scout_view),) + (
            config.recall_offset(config.rescuer_view),
        )
        # the factor the core applies to each agent's individual and penalty channels
        self.channel_scale = np.where(
            np.arange(config.n_agents) < config.n_scouts, 1.0, config.rescuer_reward_scale
        )

    def reset_envs(self, envs: np.ndarray, rngs: Sequence[np.random.Generator]) -> None:
        cfg = self.config
        envs = np.asarray(envs, dtype=np.int64)
        count, g = envs.shape[0], cfg.grid_size
        obstacle = np.empty((count, g, g), dtype=np.uint8)
        agents = np.empty((count, cfg.n_agents, 2), dtype=np.int64)
        targets = np.empty((count, cfg.n_zones, 2), dtype=np.int64)
        for j in range(count):
            obstacle[j], agents[j], targets[j] = draw_layout(rngs[j], cfg)
            self.cue[envs[j]] = rngs[j].integers(cfg.n_zones)  # after the layout: independent
        if self.forced_cue is not None:
            self.cue[envs] = self.forced_cue[envs]
        self.install_layouts(envs, obstacle, agents, targets)
        self.target_state[envs] = 1  # every target is reported from the start
        _zone_routes_kernel(envs, self.obstacle, self.target_pos, self.zone_dist)

    def step(
        self, actions: np.ndarray, active: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        cfg = self.config
        frozen = active & (self.t < cfg.memory_horizon)
        masked = frozen[:, None] & (actions != 0)  # [N, A]: moves (or collects) while frozen
        if masked.any():
            actions = np.where(masked, 0, actions)
        rewards, invalid, terminated, truncated = super().step(actions, active)
        if masked.any():  # as the core treats a masked action: stay, flag and penalty
            invalid[masked.T] = 1.0
            rewards[2] -= masked.T * (cfg.penalty_invalid * self.channel_scale[:, None])
        collected = active & (self.n_collected > 0)  # the episode ends at the first one
        rewards[0] += cfg.reward_target * (collected & self._won())
        terminated = collected
        truncated = truncated & ~collected
        return rewards, invalid, terminated, truncated

    def _won(self) -> np.ndarray:
        """bool [N]: exactly one target collected, the cued one."""
        return (self.n_collected == 1) & (self.target_state[self.all_envs, self.cue] == 2)

    def metrics(self) -> dict[str, np.ndarray]:
        metrics = super().metrics()
        metrics["success"] = self._won().astype(np.float64)
        metrics["solved"] = metrics["success"].copy()
        return metrics

    def observe_into(self, envs: np.ndarray, buffers: tuple[np.ndarray, ...]) -> None:
        """v0's observation (the core writes each row's first ``recall_offset`` values and the
        masks), then the cue, the zone routes and the frozen phase's masks."""
        envs = np.asarray(envs, dtype=np.int64)
        super().observe_into(envs, buffers)
        _recall_observe_kernel(
            envs,
            self.config.n_scouts,
            self.config.memory_horizon,
            self.offsets[0],
            self.offsets[1],
            self.t,
            self.cue,
            self.zone_dist,
            self.target_state,
            self.agent_pos,
            *buffers,
        )

    def legal_action(self, env: int, agent: int, action: int) -> bool:
        if self.t[env] < self.config.memory_horizon:
            return action == 0
        return super().legal_action(env, agent, action)

    def legal_actions(self, actions: np.ndarray, active: np.ndarray) -> np.ndarray:
        legal = super().legal_actions(actions, active)
        frozen = active & (self.t < self.config.memory_horizon)
        return legal & (~frozen[:, None] | (actions == 0))


# ---- the PettingZoo faces ------------------------------------------------------------------
def _cue_option(options: Mapping[str, Any] | None, n_zones: int, num_envs: int) -> Any:
    """``options["cue"]`` as int64 [num_envs], or None without one."""
    if not options or options.get("cue") is None:
        return None
    raw = options["cue"]
    cues = np.asarray(raw)
    if cues.ndim == 0:
        cues = np.full(num_envs, cues)
    allowed = f"an int in [0, {n_zones - 1}] or a sequence of {num_envs} such ints"
    if cues.shape != (num_envs,) or cues.dtype.kind not in "iu":
        raise ValueError(f"options['cue'] must be {allowed}, got {raw!r}")
    if ((cues < 0) | (cues >= n_zones)).any():
        raise ValueError(f"options['cue'] must be {allowed}, got {raw!r}")
    return cues.astype(np.int64)


class _RecallFace(_MultiSearchFace):
    """What both faces add to v0's: the metadata, the core and the ``cue`` reset option."""

    metadata = METADATA
    _core_class = RecallCore
    _core: RecallCore

    def reset(self, seed: Any = None, options: dict | None = None) -> Any:
        """Start episodes (v0's reset). ``options={"cue": k}`` fixes the cue (module doc)."""
        core = self._core
        core.forced_cue = _cue_option(options, core.config.n_zones, core.num_envs)
        try:
            return super().reset(seed=seed, options=options)  # type: ignore[misc]
        finally:
            core.forced_cue = None


class RecallParallelEnv(_RecallFace, CoreParallelEnv):
    """The PettingZoo Parallel env (one world of the vectorised core). See the module doc."""

    def __init__(self, render_mode: str | None = None, **kwargs: Any) -> None:
        super().__init__(make_config(**kwargs), render_mode)


class RecallVectorEnv(_RecallFace, CoreVectorEnv):
    """``num_envs`` recall worlds stepped together (v0's "vector_env" contract)."""

    def __init__(
        self,
        num_envs: int,
        autoreset: bool = True,
        render_mode: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(num_envs, autoreset, make_config(**kwargs), render_mode)


class RecallAECEnv(CheckedAECEnv):
    """PettingZoo's ``parallel_to_aec_wrapper`` with v0's action checks at each ``step``."""


parallel_env, env, raw_env, vector_env = constructors(
    RecallParallelEnv, RecallVectorEnv, RecallAECEnv
)


# ---- scripted policies ---------------------------------------------------------------------
class _ZoneRoutePolicy:
    """Rescuers follow one zone's route (the observation's zone-route part) and collect on the
    target; scouts stay. ``policy(obs, env) -> actions``, for ``vector_env`` and
    ``parallel_env``. Subclasses choose the zone per env (:meth:`zones`)."""

    def zones(self, obs: Mapping[str, Any], n_zones: int, num_envs: int) -> np.ndarray:
        raise NotImplementedError

    def __call__(self, obs: Mapping[str, Any], env: Any) -> dict[str, Any]:
        inner = getattr(env, "unwrapped", env)
        cfg: RecallConfig = inner.config
        names = inner.possible_agents
        if not obs:  # a parallel env whose episode has ended
            return {}
        first = np.asarray(obs[names[0]]["observation"])
        num_envs = 1 if first.ndim == 1 else first.shape[0]
        zones = self.zones(obs, cfg.n_zones, num_envs)
        z = cfg.n_zones
        actions = np.zeros((num_envs, len(names)), dtype=np.int64)
        for index in range(cfg.n_scouts, len(names)):
            parts = obs[names[index]]
            observation = np.atleast_2d(parts["observation"])
            mask = np.atleast_2d(parts["action_mask"])
            routes = observation[:, -3 * z :].reshape(num_envs, z, 3)[np.arange(num_envs), zones]
            d_row, d_col, reachable = routes[:, 0], routes[:, 1], routes[:, 2] > 0
            move = np.select([d_row < 0, d_row > 0, d_col < 0, d_col > 0], [1, 2, 3, 4], default=0)
            collect = reachable & (move == 0) & (mask[:, N_ACTIONS_RESCUER - 1] > 0)
            act = np.where(collect, N_ACTIONS_RESCUER - 1, move)
            actions[:, index] = np.where(mask[np.arange(num_envs), act] > 0, act, 0)
        return to_env_format(env, actions)


class RememberingPolicy(_ZoneRoutePolicy):
    """The policy with memory: it reads the cue in an episode's first observation, keeps it
    (its memory: one int per env) and, once moves are allowed, walks a rescuer team along the
    cued zone's route and collects. Solves every episode whose route is shorter than D."""

    def __init__(self) -> None:
        self.memory = np.zeros(0, dtype=np.int64)

    def zones(self, obs: Mapping[str, Any], n_zones: int, num_envs: int) -> np.ndarray:
        if self.memory.shape != (num_envs,):
            self.memory = np.zeros(num_envs, dtype=np.int64)
        observation = np.atleast_2d(next(iter(obs.values()))["observation"])
        cue_part = observation[:, -4 * n_zones : -3 * n_zones]
        shown = cue_part.max(axis=1) > 0  # a first observation: remember its cue
        self.memory[shown] = cue_part[shown].argmax(axis=1)
        return self.memory


#: what ``marl.train`` prints as the "heuristic" baseline next to a trained policy
HeuristicPolicy = RememberingPolicy


class FixedZonePolicy(_ZoneRoutePolicy):
    """A memoryless policy: always zone ``zone``'s target. Success ``1 / n_zones`` (chance,
    the best any memoryless policy can do; module doc)."""

    def __init__(self, zone: int = 0) -> None:
        self.zone = int(zone)

    def zones(self, obs: Mapping[str, Any], n_zones: int, num_envs: int) -> np.ndarray:
        if not 0 <= self.zone < n_zones:
            raise ValueError(f"zone must be in [0, {n_zones - 1}], got {self.zone}")
        return np.full(num_envs, self.zone, dtype=np.int64)


def evaluate_policy(
    policy: Policy, seeds: Sequence[int] = tuple(range(1024)), **env_kwargs: Any
) -> dict[str, float]:
    """One episode per seed (env i reset with ``seeds[i]``) in a ``vector_env`` with
    ``autoreset=False``: ``success_rate`` (cued target collected), ``collect_rate`` (any
    target collected), ``steps`` (mean episode length), ``n_episodes``."""
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise ValueError("seeds must not be empty")
    vec = vector_env(len(seeds), autoreset=False, **env_kwargs)
    final, _ = run_episodes(vec, policy, seeds, ("success", "episode_length"))
    return {
        "success_rate": float(final["success"].mean()),
        "collect_rate": float((vec._core.n_collected > 0).mean()),
        "steps": float(final["episode_length"].mean()),
        "n_episodes": float(len(seeds)),
    }
