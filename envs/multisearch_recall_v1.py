"""multisearch_recall_v1: recall over exactly H steps, one answer at step H
(PettingZoo Parallel + AEC + vector).

The world, agents, cue, frozen phase and ``reset`` options of :mod:`envs.multisearch_recall_v0`
(itself on :mod:`envs.multisearch_v0`'s core; both document what this page does not), with
the decision reduced to **one action at step H**: a cue names one of ``n_zones`` zones in the
first observation only; for ``memory_horizon`` steps only ``stay`` is allowed; at step H
``rescuer_0`` answers with one of ``n_zones`` answer actions, and the episode ends right
after. Success is naming the cued zone. Nothing observed after the first step depends on the
cue, so every policy that does not know it (any memoryless policy, and the uniform random
one) succeeds with probability at most ``1 / n_zones``, exactly that when it answers within
its mask (proof below), and a policy that remembers the cue for H steps always succeeds.
Unlike v0, no walk follows the decision: H is the whole span to remember, and random is at
chance (v0's random walk rarely collected).

=====================  ===================================================================
Import                 ``from envs import multisearch_recall_v1``
Constructors           ``parallel_env(**kw)``, ``env(**kw)`` (AEC, ``parallel_to_aec``),
                       ``raw_env(**kw)`` (AEC without the order-enforcing wrapper),
                       ``vector_env(num_envs, autoreset=True, **kw)``
Agents                 ``scout_0..``, ``rescuer_0..`` (as v0; default 2 + 2); ``rescuer_0``
                       answers, every other agent only ever stays
Action spaces          scouts ``Discrete(5)``, rescuers ``Discrete(6)`` (as v0)
Observation spaces     ``Dict(observation=Box(-1, 1, (obs_dim,), float32),
                       action_mask=Box(0, 1, (n_actions,), int8))``: multisearch_v0's
                       observation and ``n_zones + 1`` more values (below); default:
                       scouts 240, rescuers 80 (``n_zones=2``: 238, 78)
State space            multisearch_v0's, ``Box(0, 1, (4 * G * G + 2 * n_agents + 2,),
                       float32)`` (the cue is never in it); default 1034
metadata               ``name="multisearch_recall_v1"``, otherwise as v0
Baselines              in this module: :class:`RememberingPolicy` (also ``HeuristicPolicy``,
                       what ``marl.train`` prints), :class:`FixedZonePolicy`,
                       :class:`RandomPolicy`, :func:`evaluate_policy`
=====================  ===================================================================

Episode
-------
With ``H = memory_horizon``; ``t`` counts the steps taken; observation ``t`` is the one an
action at step ``t`` is chosen from.

=========  ===============  ==============================================================
phase      steps            what happens
=========  ===============  ==============================================================
cue        observation 0    the cue (one-hot of the cued zone) is in every agent's
                            observation; it is zeros in every later observation
frozen     actions at       only ``stay`` is unmasked for every agent
           t = 0 .. H-1
answer     action at t = H  ``rescuer_0``'s mask allows exactly the ``n_zones`` answer
                            actions (table below), every other agent's only ``stay``; the
                            episode *terminates* after this step (``max_cycles = H + 1``):
                            success iff ``rescuer_0`` named the cued zone
=========  ===============  ==============================================================

Nobody ever moves in v1: an answer action is read as an answer, not executed as a move (so
an obstacle next to ``rescuer_0`` cannot mask an answer), and every masked action is, as in
v0, a no-op with ``penalty_invalid``. The world (map, positions, views) is v0's frozen
world throughout. The memory horizon is exactly the distance between the cue (observation 0)
and the only observation at which an action can use it (observation H).

Answer actions (zone ``k`` <-> action ``1 + k``, the k-th move):

=======  ===============================  ===============  ==========================
action   name (v0's move, not executed)   zone, n_zones=4  zone, n_zones=2
=======  ===============================  ===============  ==========================
1        up                               0 (top-left)     0 (left half)
2        down                             1 (top-right)    1 (right half)
3        left                             2 (bottom-left)  masked
4        right                            3 (bottom-right) masked
=======  ===============================  ===============  ==========================

Zones (v0's): ``n_zones`` 4 are the grid's quadrants, 2 its left and right halves; zone
``k``'s target lies in zone ``k`` and is reported from the start (drawn as in v0, so seed
``s`` gives v0's layout and cue). The zones and targets only give the cue its meaning in the
world (the targets are in the windows, minimap and state); nothing is collected in v1.

Observation: multisearch_v0's parts (window channels, own position, time left with
``max_cycles = H + 1``, targets left (always 1.0), minimap with its route to the nearest
target; see multisearch_v0), then

=============  ==========  ================================================================
part           size        meaning
=============  ==========  ================================================================
cue            n_zones     one-hot of the cued zone at t = 0; zeros at every t >= 1
answer step    1           1.0 at t = H (the answer step), 0.0 otherwise (a function of t
                           only: it says when, never what)
=============  ==========  ================================================================

v0's zone-route part (``3 n_zones`` values: the first move towards each zone's target) is
dropped: nobody walks in v1, so routes carry nothing the task uses.

Action masks: at every observation only ``stay`` (action 0), except ``rescuer_0``'s at t = H:
exactly the answer actions ``1 .. n_zones`` (``stay`` masked). The final observation (t = H +
1, in ``vec.final_obs``) masks as the frozen phase.

Rewards: v0's three channels. **team** ``reward_target`` (default 1.0) to every agent at
step H iff ``rescuer_0``'s answer names the cued zone, 0 otherwise (a wrong answer costs
nothing). **penalty** ``penalty_invalid`` (default 0.05) per masked action (times
``rescuer_reward_scale`` for rescuers, as v0); ``rescuer_0``'s masked action at step H
(``stay``, ``collect`` or a masked move) is also a wrong answer; ``penalty_step`` (default
0) every step. **individual** is always 0: nothing is reported, collected or explored
because nobody moves.
``infos`` carry v0's keys; ``success`` and ``solved`` are both 1.0 after the answer step iff
the answer was right, 0.0 before it and otherwise; ``coverage`` (the start views' share),
``revisit_rate`` (0), ``episode_length`` as v0.

``reset(seed=None, options=None)``: as v0's; ``options={"cue": k}`` fixes the cue of this
reset (an int in ``[0, n_zones)``; for ``vector_env`` also a sequence of ``num_envs`` ints)
without changing anything else; other options are ignored.

Chance, and why memory is necessary
-----------------------------------
Claim: a policy that does not know the cue at step H succeeds with probability at most
``1 / n_zones`` (*chance*), exactly ``1 / n_zones`` when its answer is an allowed action;
this includes every memoryless policy (action at step t a function of observation t, the
state at t and randomness independent of the cue) and the uniform random policy over the
allowed actions.

Proof. Fix the layout (the seed). Every action is replaced by ``stay`` in the world (masked
actions are no-ops, the answer is not a move), so the world at every t is a function of the
layout alone, and observation t >= 1 and the state at every t are functions of the layout
and t: none depends on the cue (masks depend on t only). The cue is drawn uniformly from the
env's random stream after the layout, independently of it. A memoryless policy draws the
answer from observation H and the state at H, so given the layout its answer has a
distribution ``pi`` that is the same for every cue. Success is ``sum_k P(cue = k) pi(1 + k)
= (1 / n_zones) sum_k pi(1 + k) <= 1 / n_zones``, with equality iff the answer is allowed
(one of ``1 .. n_zones``) with probability 1; averaging over layouts keeps both. The random
policy answers uniformly over the ``n_zones`` answer actions: ``pi(1 + k) = 1 / n_zones``,
success exactly ``1 / n_zones``. :class:`FixedZonePolicy` succeeds iff the cue is its zone:
exactly ``1 / n_zones``. :class:`RememberingPolicy` keeps the cue from observation 0 and
answers it: success 1. (Measured rates fluctuate around these by the binomial standard
error, ``sqrt(p (1 - p) / episodes)``: 0.0135 at p = 0.25 and 1024 episodes.)

Measured (``python benchmarks/memory_task.py --env v1``, default arguments; success rate,
one episode per seed 0..1023 a cell; chance ``1 / n_zones`` = 0.25, binomial s.e. 0.014;
BENCHMARKS.md, "multisearch_recall_v1", has the trained policies, one seed each: an mlp
MAPPO at H = 64 stays at chance, 0.270 after 300k env steps; a gru with a window of 128
steps learned it at H = 16, 0.949 after 1M, not at H = 64, 0.238 after 1M):

=====  ===========  ==============  ======
H      remembering  memoryless      random
                    (fixed zone 0)
=====  ===========  ==============  ======
16     1.000        0.249           0.240
64     1.000        0.249           0.237
256    1.000        0.249           0.264
1024   1.000        0.249           0.266
4096   1.000        0.249           0.253
=====  ===========  ==============  ======

The fixed-zone figure is the fraction of seeds 0..1023 whose cue is zone 0 (255), the same
at every H because the cue is drawn after the layout.

Arguments
---------
``memory_horizon`` H (int >= 1, default 16), ``n_zones`` (2 or 4, default 4), and v0's
world arguments: ``grid_size`` (16), ``n_scouts`` (2), ``n_rescuers`` (2, >= 1),
``obstacle_density`` (0.1), ``scout_view`` (3), ``rescuer_view`` (1), ``minimap`` (True),
``minimap_size`` (4), ``route_hint`` (True), ``reward_target`` (1.0), ``penalty_invalid``
(0.05), ``penalty_step`` (0.0), ``rescuer_reward_scale`` (1.0), ``strict_actions`` (False:
a masked action is a penalised no-op; True: ``ValueError``), ``render_mode``. Not arguments
(``ArgumentTypeError``, naming why): ``preset``, ``n_targets`` (= ``n_zones``),
``max_cycles`` (= H + 1), ``decision_steps`` (1: the answer step), ``reward_complete``, and
the terms nobody can earn when nobody moves (``reward_collect``, ``reward_report``,
``reward_explore``, ``penalty_revisit``). Impossible values raise ``ValueError``; a wrong
type or an unknown argument raises ``ArgumentTypeError`` (a ``TypeError`` and a
``ValueError``).

Example
-------
>>> from envs import multisearch_recall_v1
>>> env = multisearch_recall_v1.parallel_env(memory_horizon=2)
>>> obs, infos = env.reset(seed=0, options={"cue": 2})
>>> obs["rescuer_0"]["observation"][-5:].tolist()  # cue (zone 2), answer-step flag
[0.0, 0.0, 1.0, 0.0, 0.0]
>>> obs, *_ = env.step({a: 0 for a in env.agents})  # t = 0: only stay is allowed
>>> obs["rescuer_0"]["observation"][-5:].tolist()  # the cue is gone
[0.0, 0.0, 0.0, 0.0, 0.0]
>>> obs, *_ = env.step({a: 0 for a in env.agents})  # t = 1
>>> obs["rescuer_0"]["observation"][-1], obs["rescuer_0"]["action_mask"].tolist()
(np.float32(1.0), [0, 1, 1, 1, 1, 0])
>>> answer = {a: 0 for a in env.agents} | {"rescuer_0": 1 + 2}  # t = H = 2: zone 2
>>> obs, rewards, terminations, truncations, infos = env.step(answer)
>>> rewards["scout_0"], terminations["scout_0"], infos["scout_0"]["success"], env.agents
(1.0, True, 1.0, [])

Version History
---------------
A change that alters observations, rewards or dynamics bumps the module version
(``multisearch_recall_v1`` -> ``multisearch_recall_v2``, ``metadata["name"]`` with it) and
adds a line here.

* v1: one answer action at step H (issue 48): ``rescuer_0`` names the cued zone with one of
  ``n_zones`` answer actions at t = H and the episode terminates at H + 1 (v0: a walk of up
  to ``decision_steps`` steps to the cued target); nobody moves; the zone-route part is
  dropped and an answer-step flag added; ``decision_steps`` and the collect, report,
  explore and revisit reward terms are no longer arguments. Every policy without the cue,
  random included, is at chance.
* v0: :mod:`envs.multisearch_recall_v0` (cue, frozen phase, decision walk to the cued
  zone's target).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from envs._baselines import Policy, RandomPolicy, run_episodes, to_env_format
from envs._multisearch_core import MultiSearchCore
from envs._pettingzoo import CheckedAECEnv, CoreParallelEnv, CoreVectorEnv, constructors
from envs.errors import ArgumentTypeError
from envs.multisearch_recall_v0 import DEFAULTS as V0_DEFAULTS
from envs.multisearch_recall_v0 import METADATA as V0_METADATA
from envs.multisearch_recall_v0 import (
    RecallConfig,
    RecallCore,
    _check_recall_fields,
    _RecallFace,
    zone_of,
)

__all__ = [
    "BASELINES",
    "ArgumentTypeError",
    "FixedZonePolicy",
    "HeuristicPolicy",
    "RandomPolicy",
    "RecallV1Config",
    "RecallV1Core",
    "RecallV1ParallelEnv",
    "RecallV1VectorEnv",
    "RememberingPolicy",
    "answer_action",
    "env",
    "evaluate_policy",
    "make_config",
    "parallel_env",
    "raw_env",
    "vector_env",
    "zone_of",
]

METADATA: dict[str, Any] = {**V0_METADATA, "name": "multisearch_recall_v1"}

#: the module with this env's baselines (``HeuristicPolicy``, ``RandomPolicy``): this one
BASELINES = __name__

#: arguments derived here (or meaningless in any recall task), so not accepted
_DERIVED = ("n_targets", "max_cycles", "reward_complete", "decision_steps")
#: v0 reward terms that nobody can earn when nobody moves, so not accepted
_NO_EFFECT = ("reward_collect", "reward_report", "reward_explore", "penalty_revisit")

#: v0's defaults (the terms above 0; ``penalty_invalid`` 0.05, ``penalty_step`` 0)
DEFAULTS: dict[str, Any] = dict(V0_DEFAULTS)


def answer_action(zone: Any) -> Any:
    """The answer action that names ``zone`` (int or int array): ``1 + zone``."""
    return 1 + zone


@dataclasses.dataclass
class RecallV1Config(RecallConfig):
    """v0's recall configuration with one answer step: ``decision_steps`` = 1 and
    ``max_cycles`` = ``memory_horizon + 1`` (set by :func:`make_config`). The observation is
    multisearch_v0's, then the cue (``n_zones``) and the answer-step flag (1)."""

    decision_steps: int = 1

    def obs_dim(self, view: int) -> int:
        return self.recall_offset(view) + self.n_zones + 1

    @property
    def answering_agent(self) -> int:
        """Index of ``rescuer_0``, the agent that answers (scouts come first)."""
        return self.n_scouts


def make_config(**kwargs: Any) -> RecallV1Config:
    """:data:`DEFAULTS` over v0's ``small`` preset, overridden by ``kwargs``, validated.

    ``ArgumentTypeError`` (a ``TypeError`` and a ``ValueError``) for an unknown argument, one
    that is derived here or one that has no effect in v1 (module doc, "Arguments")."""
    excluded = set(_DERIVED) | set(_NO_EFFECT)
    allowed = {f.name for f in dataclasses.fields(RecallV1Config)} - excluded
    unknown = sorted(set(kwargs) - allowed)
    if unknown:
        derived = [k for k in unknown if k in _DERIVED or k == "preset"]
        no_effect = [k for k in unknown if k in _NO_EFFECT]
        why = f"; {derived}: derived from n_zones / memory_horizon" if derived else ""
        why += f"; {no_effect}: nobody moves or collects in v1" if no_effect else ""
        raise ArgumentTypeError(
            f"unknown argument(s) {unknown} for multisearch_recall_v1{why}; "
            f"allowed: {sorted(allowed)}"
        )
    config = RecallV1Config(**{**DEFAULTS, **kwargs})
    _check_recall_fields(config)
    config.n_targets = config.n_zones
    config.decision_steps = 1
    config.max_cycles = config.memory_horizon + 1
    config.validate()
    return config


# ---- the core: v0's world and cue, one answer at step H ------------------------------------
class RecallV1Core(RecallCore):
    """v0's recall core (layout, cue, forced cue, the frozen world) with the answer step.

    Every action reaches the world as ``stay``; the answering agent's action at t = H is
    read as the answer. Extra array: ``answer`` int64 [N], the zone answered in the current
    episode (-1 before the answer step, and for a masked answer).
    """

    config: RecallV1Config

    def __init__(self, config: RecallV1Config, num_envs: int) -> None:
        super().__init__(config, num_envs)
        self.answer = np.full(self.num_envs, -1, dtype=np.int64)

    def reset_envs(self, envs: np.ndarray, rngs: Sequence[np.random.Generator]) -> None:
        super().reset_envs(envs, rngs)
        self.answer[np.asarray(envs, dtype=np.int64)] = -1

    def legal_action(self, env: int, agent: int, action: int) -> bool:
        if agent == self.config.answering_agent and self.t[env] == self.config.memory_horizon:
            return 1 <= action <= self.config.n_zones
        return action == 0

    def legal_actions(self, actions: np.ndarray, active: np.ndarray) -> np.ndarray:
        """bool [N, A]: stay only, except the answer actions for the answering agent at
        t = H (True where not ``active``)."""
        cfg = self.config
        n_agents = actions.shape[1]
        answering = (self.t == cfg.memory_horizon)[:, None] & (
            np.arange(n_agents) == cfg.answering_agent
        )
        is_answer = (actions >= 1) & (actions <= cfg.n_zones)
        legal = np.where(answering, is_answer, actions == 0)
        return legal | ~active[:, None]

    def step(
        self, actions: np.ndarray, active: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``actions`` int64 [N, A] -> ``rewards`` [3, A, N], ``invalid`` [A, N],
        ``terminated``, ``truncated`` bool [N] (the core's contract)."""
        cfg = self.config
        index = cfg.answering_agent
        illegal = ~self.legal_actions(actions, active)  # [N, A]
        answering = active & (self.t == cfg.memory_horizon)  # [N]
        answered = answering & ~illegal[:, index]
        # the world steps with stay for everyone: a masked action is a no-op, an answer no move
        rewards, invalid, _, truncated = super().step(np.zeros_like(actions), active)
        invalid[illegal.T] = 1.0
        rewards[2] -= illegal.T * (cfg.penalty_invalid * self.channel_scale[:, None])
        self.answer[answered] = actions[answered, index] - 1
        won = answered & (self.answer == self.cue)
        rewards[0] += cfg.reward_target * won
        return rewards, invalid, answering, truncated & ~answering

    def _won(self) -> np.ndarray:
        """bool [N]: the episode's answer named the cued zone."""
        return self.answer == self.cue

    def observe_into(self, envs: np.ndarray, buffers: tuple[np.ndarray, ...]) -> None:
        """multisearch_v0's observation and masks (written by :class:`MultiSearchCore`; v0
        recall's zone routes are skipped), then the cue, the answer-step flag and the masks.
        ``buffers``: ``(obs_scout [S, N, Ds], obs_rescuer [R, N, Dr], mask_scout [S, N, 5],
        mask_rescuer [R, N, 6])``; rows ``envs`` are written."""
        envs = np.asarray(envs, dtype=np.int64)
        MultiSearchCore.observe_into(self, envs, buffers)
        cfg = self.config
        zones, t = cfg.n_zones, self.t[envs]
        cue = np.zeros((envs.shape[0], zones), dtype=np.float32)
        first = np.flatnonzero(t == 0)
        cue[first, self.cue[envs[first]]] = 1.0
        answer_step = (t == cfg.memory_horizon).astype(np.float32)
        for observations, offset in zip(buffers[:2], self.offsets, strict=True):
            observations[:, envs, offset : offset + zones] = cue
            observations[:, envs, offset + zones] = answer_step
        for mask in buffers[2:]:
            mask[:, envs, 0] = 1
            mask[:, envs, 1:] = 0
        answering = envs[answer_step > 0]
        answer_mask = buffers[3][0]  # rescuer_0's masks [N, 6] (the first rescuer)
        answer_mask[answering, 0] = 0
        answer_mask[answering, 1 : 1 + zones] = 1


# ---- the PettingZoo faces ------------------------------------------------------------------
class _RecallV1Face(_RecallFace):
    """v0's recall face (the ``cue`` reset option) with this version's metadata and core."""

    metadata = METADATA
    _core_class = RecallV1Core
    _core: RecallV1Core


class RecallV1ParallelEnv(_RecallV1Face, CoreParallelEnv):
    """The PettingZoo Parallel env (one world of the vectorised core). See the module doc."""

    def __init__(self, render_mode: str | None = None, **kwargs: Any) -> None:
        super().__init__(make_config(**kwargs), render_mode)


class RecallV1VectorEnv(_RecallV1Face, CoreVectorEnv):
    """``num_envs`` recall worlds stepped together (multisearch_v0's "vector_env" contract).

    Every episode lasts H + 1 steps, so with ``autoreset=True`` all envs reset together."""

    def __init__(
        self,
        num_envs: int,
        autoreset: bool = True,
        render_mode: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(num_envs, autoreset, make_config(**kwargs), render_mode)


class RecallV1AECEnv(CheckedAECEnv):
    """PettingZoo's ``parallel_to_aec_wrapper`` with v0's action checks at each ``step``."""


parallel_env, env, raw_env, vector_env = constructors(
    RecallV1ParallelEnv, RecallV1VectorEnv, RecallV1AECEnv
)


# ---- scripted policies ---------------------------------------------------------------------
class _AnswerPolicy:
    """Every agent stays; at the answer step (the observation's flag) ``rescuer_0`` answers
    one zone per env. ``policy(obs, env) -> actions`` for ``vector_env`` (arrays [N, ...])
    and ``parallel_env``. Subclasses choose the zones (:meth:`zones`, int64 [N])."""

    def zones(self, observation: np.ndarray, n_zones: int) -> np.ndarray:
        """Zones to answer, int64 [N], from ``rescuer_0``'s observations float32 [N, D]
        (called at every step, so a subclass may also read them)."""
        raise NotImplementedError

    def __call__(self, obs: Mapping[str, Any], env: Any) -> dict[str, Any]:
        inner = getattr(env, "unwrapped", env)
        cfg: RecallV1Config = inner.config
        names = inner.possible_agents
        if not obs:  # a parallel env whose episode has ended
            return {}
        index = cfg.answering_agent
        observation = np.atleast_2d(obs[names[index]]["observation"])  # [N, D]
        zones = self.zones(observation, cfg.n_zones)
        actions = np.zeros((observation.shape[0], len(names)), dtype=np.int64)
        actions[:, index] = np.where(observation[:, -1] > 0, answer_action(zones), 0)
        return to_env_format(env, actions)


class RememberingPolicy(_AnswerPolicy):
    """The policy with memory: it reads the cue in each episode's first observation (per env:
    wherever the cue part is non-zero, so autoresets and episodes that start at different
    steps are handled), keeps it (its memory: one int per env) and answers it at t = H.
    Success 1."""

    def __init__(self) -> None:
        self.memory = np.zeros(0, dtype=np.int64)

    def zones(self, observation: np.ndarray, n_zones: int) -> np.ndarray:
        num_envs = observation.shape[0]
        if self.memory.shape != (num_envs,):
            self.memory = np.zeros(num_envs, dtype=np.int64)
        cue_part = observation[:, -(n_zones + 1) : -1]
        shown = cue_part.max(axis=1) > 0  # a first observation: remember its cue
        self.memory[shown] = cue_part[shown].argmax(axis=1)
        return self.memory


#: what ``marl.train`` prints as the "heuristic" baseline next to a trained policy
HeuristicPolicy = RememberingPolicy


class FixedZonePolicy(_AnswerPolicy):
    """A memoryless policy: always answers zone ``zone``. Success exactly ``1 / n_zones``
    (chance, the best any memoryless policy can do; module doc)."""

    def __init__(self, zone: int = 0) -> None:
        self.zone = int(zone)

    def zones(self, observation: np.ndarray, n_zones: int) -> np.ndarray:
        if not 0 <= self.zone < n_zones:
            raise ValueError(f"zone must be in [0, {n_zones - 1}], got {self.zone}")
        return np.full(observation.shape[0], self.zone, dtype=np.int64)


def evaluate_policy(
    policy: Policy, seeds: Sequence[int] = tuple(range(1024)), **env_kwargs: Any
) -> dict[str, float]:
    """One episode per seed (env i reset with ``seeds[i]``) in a ``vector_env`` with
    ``autoreset=False``: ``success_rate`` (the cued zone named), ``answer_rate`` (an allowed
    answer given), ``steps`` (mean episode length), ``n_episodes``."""
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise ValueError("seeds must not be empty")
    vec = vector_env(len(seeds), autoreset=False, **env_kwargs)
    final, _ = run_episodes(vec, policy, seeds, ("success", "episode_length"))
    return {
        "success_rate": float(final["success"].mean()),
        "answer_rate": float((vec._core.answer >= 0).mean()),
        "steps": float(final["episode_length"].mean()),
        "n_episodes": float(len(seeds)),
    }
