"""The one vectorised core of ``multisearch_v0``: configuration, presets, layouts and the world.

Everything that decides what happens in the world lives in one place, split in two modules:
this one holds the configuration, presets, layout generation and the class of the worlds, and
:mod:`envs._multisearch_kernels` the numba kernels that reset, step and observe them (no other
module re-implements either).

* :class:`MultiSearchConfig` -- validated arguments, presets and derived sizes;
* :func:`generate_layout` -- a new episode's map from an ``np.random.Generator``;
* :class:`MultiSearchCore` -- ``num_envs`` worlds held as ``[num_envs, ...]`` arrays, stepped by
  the numba kernels of :mod:`envs._multisearch_kernels` (a loop over envs and the few agents of
  each env, compiled once, cached).

``parallel_env`` is the ``num_envs=1`` view of this core and ``vector_env`` the batched view, so
the two cannot drift apart. See ``envs/multisearch_v0.py`` for the user documentation.
``envs/multisearch_recall_v0.py`` steps the same world through a subclass that adds its recall
task (layout, cue, frozen phase, end, reward) on top of these dynamics.

Conventions: positions are ``(row, col)``; actions are ``0 stay, 1 up (row-1), 2 down (row+1),
3 left (col-1), 4 right (col+1), 5 collect`` (rescuers only). Agents are ordered scouts first,
then rescuers; everything "first come first served" (who reports a target, who collects it,
who gets the exploration credit for a cell) is resolved in that order.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from numba import njit

from envs._multisearch_kernels import (
    CODE_BLOCKED,
    _legal,
    _legal_matrix,
    _observe_kernel,
    _reset_kernel,
    _state_kernel,
    _step_kernel,
)
from envs.errors import ArgumentTypeError, check_float_field, check_int_field

__all__ = [
    "ACTION_NAMES",
    "N_ACTIONS_RESCUER",
    "N_ACTIONS_SCOUT",
    "PRESETS",
    "MultiSearchConfig",
    "MultiSearchCore",
    "generate_layout",
    "make_config",
]


N_ACTIONS_SCOUT = 5
N_ACTIONS_RESCUER = 6
ACTION_NAMES = ("stay", "up", "down", "left", "right", "collect")
WINDOW_CHANNELS = 4  # blocked, target, teammate, visited-by-team
STATE_CHANNELS = 4  # obstacle, target (true, uncollected), reported target, explored

# reward weights, in the order of the ``weights`` vector passed to the kernels
REWARD_WEIGHT_NAMES = (
    "reward_target",
    "reward_complete",
    "reward_report",
    "reward_collect",
    "reward_explore",
    "penalty_step",
    "penalty_revisit",
    "penalty_invalid",
)

PRESETS: dict[str, dict[str, Any]] = {
    "small": dict(
        grid_size=16,
        n_scouts=2,
        n_rescuers=2,
        n_targets=3,
        obstacle_density=0.1,
        max_cycles=200,
        scout_view=3,
        rescuer_view=1,
        minimap=True,
        minimap_size=4,
    ),
    "large": dict(
        grid_size=48,
        n_scouts=4,
        n_rescuers=4,
        n_targets=12,
        obstacle_density=0.1,
        max_cycles=1000,
        scout_view=3,
        rescuer_view=1,
        minimap=True,
        minimap_size=8,
    ),
    # the seeds' regime: reward only for collecting targets and for finishing (team +1 per
    # target and the completion bonus, the collector's individual +0.5), a small step cost;
    # no report, exploration, revisit or invalid-action shaping in any channel
    "sparse": dict(
        grid_size=28,
        n_scouts=2,
        n_rescuers=2,
        n_targets=7,
        obstacle_density=0.2,
        max_cycles=250,
        scout_view=3,
        rescuer_view=1,
        minimap=True,
        minimap_size=7,
        route_hint=False,
        reward_report=0.0,
        reward_explore=0.0,
        penalty_revisit=0.0,
        penalty_invalid=0.0,
        penalty_step=0.01,
    ),
    # larger, denser, more agents and targets, tight time: coordination pays
    "hard": dict(
        grid_size=28,
        n_scouts=3,
        n_rescuers=3,
        n_targets=9,
        obstacle_density=0.2,
        max_cycles=150,
        scout_view=3,
        rescuer_view=1,
        minimap=True,
        minimap_size=7,
        route_hint=False,
    ),
    # long episodes; despite the name a memoryless policy solves it (an mlp trains as well
    # as a gru: docs/results/memory_factorial/): multisearch_recall_v1 is the memory task
    "memory": dict(
        grid_size=24,
        n_scouts=2,
        n_rescuers=2,
        n_targets=6,
        obstacle_density=0.1,
        max_cycles=2000,
        scout_view=3,
        rescuer_view=1,
        minimap=False,
        minimap_size=4,
    ),
}


@dataclasses.dataclass
class MultiSearchConfig:
    """All arguments of ``multisearch_v0`` (defaults: the ``small`` preset).

    Derived sizes (``n_agents``, ``obs_dim_scout``, ``obs_dim_rescuer``, ``state_dim``) are
    properties. ``validate()`` raises ``ValueError`` (``ArgumentTypeError``, also a ``TypeError``,
    for a wrong type) naming the bad argument.
    """

    grid_size: int = 16
    n_scouts: int = 2
    n_rescuers: int = 2
    n_targets: int = 3
    obstacle_density: float = 0.1
    max_cycles: int = 200
    scout_view: int = 3
    rescuer_view: int = 1
    minimap: bool = True
    minimap_size: int = 4
    route_hint: bool = True
    reward_target: float = 1.0
    reward_complete: float = 1.0
    reward_report: float = 0.2
    reward_collect: float = 0.5
    reward_explore: float = 0.01
    penalty_step: float = 0.01
    penalty_revisit: float = 0.002
    penalty_invalid: float = 0.05
    rescuer_reward_scale: float = 1.0
    strict_actions: bool = False

    # ---- derived -------------------------------------------------------------------------
    @property
    def n_agents(self) -> int:
        return self.n_scouts + self.n_rescuers

    @property
    def agent_names(self) -> list[str]:
        return [f"scout_{i}" for i in range(self.n_scouts)] + [
            f"rescuer_{i}" for i in range(self.n_rescuers)
        ]

    def views(self) -> np.ndarray:
        """View radius per agent, ``[n_agents]`` int64."""
        return np.array(
            [self.scout_view] * self.n_scouts + [self.rescuer_view] * self.n_rescuers,
            dtype=np.int64,
        )

    def obs_dim(self, view: int) -> int:
        width = 2 * view + 1
        dim = WINDOW_CHANNELS * width * width + 4  # window, row, col, time left, targets left
        if self.minimap:
            dim += 2 * self.minimap_size**2 + 3  # reported/explored minimap, nearest target
        return dim

    @property
    def obs_dim_scout(self) -> int:
        return self.obs_dim(self.scout_view)

    @property
    def obs_dim_rescuer(self) -> int:
        return self.obs_dim(self.rescuer_view)

    @property
    def state_dim(self) -> int:
        return STATE_CHANNELS * self.grid_size**2 + 2 * self.n_agents + 2

    def weights(self) -> np.ndarray:
        return np.array([getattr(self, k) for k in REWARD_WEIGHT_NAMES], dtype=np.float64)

    # ---- validation ----------------------------------------------------------------------
    def validate(self) -> MultiSearchConfig:
        def _int(name: str, lo: int, hi: int | None = None) -> None:
            check_int_field(self, name, lo, hi)

        def _float(name: str, lo: float, hi: float | None = None) -> None:
            check_float_field(self, name, lo, hi)

        _int("grid_size", 3, 256)
        _int("n_scouts", 0, 64)
        _int("n_rescuers", 1, 64)
        _int("n_targets", 1, 4096)
        _int("max_cycles", 1)
        _int("scout_view", 0, 16)
        _int("rescuer_view", 0, 16)
        _int("minimap_size", 1, self.grid_size)
        _float("obstacle_density", 0.0, 0.5)
        for name in REWARD_WEIGHT_NAMES:
            _float(name, 0.0 if name.startswith("penalty_") else -math.inf)
        _float("rescuer_reward_scale", 0.0)
        if not self.rescuer_reward_scale > 0:
            raise ValueError(
                f"rescuer_reward_scale must be > 0 (1.0: off), got {self.rescuer_reward_scale}"
            )
        for name in ("minimap", "route_hint", "strict_actions"):
            value = getattr(self, name)
            if not isinstance(value, (bool, np.bool_)):
                raise ArgumentTypeError(
                    f"{name} must be a bool, got {type(value).__name__} {value!r}"
                )
            setattr(self, name, bool(value))
        cells = self.grid_size**2
        # connectivity repair can only lose free cells; keep at least half of the expected
        # free cells available for the agents and targets that must be placed on distinct cells
        capacity = int(cells * (1.0 - self.obstacle_density) * 0.5)
        needed = self.n_agents + self.n_targets
        if needed > capacity:
            raise ValueError(
                f"grid_size={self.grid_size} with obstacle_density={self.obstacle_density} is "
                f"too small for {self.n_agents} agents + {self.n_targets} targets (they need "
                f"distinct free cells; at most {capacity} are allowed here): use a larger grid, "
                "fewer agents/targets or fewer obstacles"
            )
        return self


def make_config(preset: str = "small", **kwargs: Any) -> MultiSearchConfig:
    """Preset values overridden by explicit keyword arguments, validated.

    The preset's ``minimap_size`` shrinks to ``grid_size`` on grids smaller than it (only
    when ``minimap_size`` is not given explicitly).

    Raises ``ValueError`` for an unknown preset and ``ArgumentTypeError`` (a ``TypeError`` and
    a ``ValueError``) for an unknown argument.
    """
    if not isinstance(preset, str) or preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; allowed: {sorted(PRESETS)}")
    fields = {f.name for f in dataclasses.fields(MultiSearchConfig)}
    unknown = sorted(set(kwargs) - fields)
    if unknown:
        raise ArgumentTypeError(
            f"unknown argument(s) {unknown} for multisearch_v0; allowed: {sorted(fields)}"
        )
    values = dict(PRESETS[preset])
    values.update(kwargs)
    grid = values["grid_size"]
    if (
        "minimap_size" not in kwargs
        and isinstance(grid, int)
        and 1 <= grid < values["minimap_size"]
    ):
        values["minimap_size"] = grid  # the preset's minimap cannot be finer than the grid
    return MultiSearchConfig(**values).validate()


# ============================================================================================
# Layout generation
# ============================================================================================


@njit(cache=True)
def _largest_free_component(obstacle: np.ndarray) -> np.ndarray:
    """Boolean mask [G, G] of the largest 4-connected component of free cells."""
    g = obstacle.shape[0]
    label = np.zeros((g, g), dtype=np.int32)
    queue = np.empty(g * g, dtype=np.int64)
    best_label = 0
    best_size = 0
    current = 0
    for start in range(g * g):
        sr, sc = start // g, start % g
        if obstacle[sr, sc] or label[sr, sc] != 0:
            continue
        current += 1
        label[sr, sc] = current
        head, tail = 0, 1
        queue[0] = start
        while head < tail:
            cell = queue[head]
            head += 1
            r, c = cell // g, cell % g
            for k in range(1, 5):
                nr = r + (-1 if k == 1 else (1 if k == 2 else 0))
                nc = c + (-1 if k == 3 else (1 if k == 4 else 0))
                if 0 <= nr < g and 0 <= nc < g and not obstacle[nr, nc] and label[nr, nc] == 0:
                    label[nr, nc] = current
                    queue[tail] = nr * g + nc
                    tail += 1
        if tail > best_size:
            best_size = tail
            best_label = current
    return label == best_label


@njit(cache=True)
def _layout_kernel(uniform, priority, density, needed, obstacle_out, cells_out):
    """One layout from pre-drawn uniforms: obstacles where ``uniform < density``, free cells
    outside the largest component filled, then the ``needed`` free cells of smallest
    ``priority`` (a uniformly random ordered subset). Returns False (outputs undefined) when
    fewer than ``needed`` free cells remain."""
    g = uniform.shape[0]
    draw = uniform < density
    free = _largest_free_component(draw)
    n_free = 0
    for r in range(g):
        for c in range(g):
            obstacle_out[r, c] = not free[r, c]
            n_free += free[r, c]
    if n_free < needed:
        return False
    # selection of the smallest priorities (ties: lowest index); cheaper to compile than a sort
    available = free.ravel().copy()
    for i in range(needed):
        best = -1
        best_priority = 2.0
        for cell in range(g * g):
            if available[cell] and priority[cell] < best_priority:
                best = cell
                best_priority = priority[cell]
        available[best] = False
        cells_out[i, 0] = best // g
        cells_out[i, 1] = best % g
    return True


def generate_layout(
    rng: np.random.Generator, config: MultiSearchConfig
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Draw one episode's world from ``rng``.

    Obstacles are i.i.d. with probability ``obstacle_density``; free cells outside the largest
    4-connected free component are turned into obstacles, so every free cell is reachable from
    every other. Agents and targets are placed on distinct free cells, uniformly at random.
    If the draw leaves too few free cells it is redrawn (after 100 failures: no obstacles).
    Each attempt consumes ``rng.random((G, G))`` then ``rng.random(G * G)``.

    Returns ``obstacle`` bool [G, G], ``agent_cells`` int64 [n_agents, 2],
    ``target_cells`` int64 [n_targets, 2].
    """
    g = config.grid_size
    needed = config.n_agents + config.n_targets
    obstacle = np.empty((g, g), dtype=np.bool_)
    cells = np.empty((needed, 2), dtype=np.int64)
    for _attempt in range(100):
        uniform = rng.random((g, g))
        priority = rng.random(g * g)
        if _layout_kernel(uniform, priority, config.obstacle_density, needed, obstacle, cells):
            break
    else:
        _layout_kernel(uniform, priority, -1.0, needed, obstacle, cells)
    return obstacle, cells[: config.n_agents], cells[config.n_agents :]


# ============================================================================================
# The batched world
# ============================================================================================


class MultiSearchCore:
    """``num_envs`` multisearch worlds as arrays with a leading env axis.

    Arrays (N envs, A agents, T targets, G grid, M minimap blocks per side):
    ``obstacle`` uint8 [N, G, G]; ``target_grid`` int16 [N, G, G] (target index + 1 of an
    uncollected target, else 0); ``target_pos`` int64 [N, T, 2]; ``target_state`` int8 [N, T]
    (0 hidden, 1 reported, 2 collected); ``seen`` uint8 [N, G, G] (explored by the team);
    ``visited`` uint8 [N, G, G] (stood on by an agent); ``block_seen`` int32 [N, M, M];
    ``agent_pos`` int64 [N, A, 2]; counters ``t``, ``n_collected``, ``n_free``,
    ``n_seen_free``, ``n_moves``, ``n_revisits`` int64 [N]; with the minimap, the route cache
    ``route_dist`` int32 [N, G, G] and its key ``route_key`` int64 [N, 2] (see
    :func:`envs._multisearch_kernels._observe_kernel`). The methods call the numba kernels of
    :mod:`envs._multisearch_kernels`.
    """

    def __init__(self, config: MultiSearchConfig, num_envs: int) -> None:
        if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)):
            raise ArgumentTypeError(f"num_envs must be an int, got {type(num_envs).__name__}")
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.config = config
        self.num_envs = n = int(num_envs)
        g, a, k, m = config.grid_size, config.n_agents, config.n_targets, config.minimap_size
        self.obstacle = np.zeros((n, g, g), dtype=np.uint8)
        self.target_grid = np.zeros((n, g, g), dtype=np.int16)
        self.target_pos = np.zeros((n, k, 2), dtype=np.int64)
        self.target_state = np.zeros((n, k), dtype=np.int8)
        self.seen = np.zeros((n, g, g), dtype=np.uint8)
        self.visited = np.zeros((n, g, g), dtype=np.uint8)
        self.block_seen = np.zeros((n, m, m), dtype=np.int32)
        self.agent_pos = np.zeros((n, a, 2), dtype=np.int64)
        self.t = np.zeros(n, dtype=np.int64)
        self.n_collected = np.zeros(n, dtype=np.int64)
        self.n_free = np.ones(n, dtype=np.int64)
        self.n_seen_free = np.zeros(n, dtype=np.int64)
        self.n_moves = np.zeros(n, dtype=np.int64)
        self.n_revisits = np.zeros(n, dtype=np.int64)
        self.views = config.views()
        # padded cell codes: pad >= every view radius and >= 1 (the mask looks one cell out)
        self.pad = pad = max(int(self.views.max(initial=0)), 1)
        self.code = np.full((n, g + 2 * pad, g + 2 * pad), CODE_BLOCKED, dtype=np.uint8)
        # minimap block of each row/col index, and number of cells per block
        block = math.ceil(g / m)
        self.block_of = np.minimum(np.arange(g) // block, m - 1).astype(np.int64)
        per_axis = np.bincount(self.block_of, minlength=m).astype(np.float64)
        self.block_cells = np.maximum(np.outer(per_axis, per_axis), 1.0)
        self._weights = config.weights()
        self.all_envs = np.arange(n, dtype=np.int64)
        # route lengths to the nearest reported target (minimap only), cached per env
        rg = g if config.minimap and config.route_hint else 1
        self.route_dist = np.full((n, rg, rg), -1, dtype=np.int32)
        self.route_key = np.full((n, 2), -1, dtype=np.int64)

    # ---- episode start -------------------------------------------------------------------
    def reset_envs(self, envs: np.ndarray, rngs: Sequence[np.random.Generator]) -> None:
        """Start a new episode in each env ``envs[j]`` with a layout drawn from ``rngs[j]``."""
        cfg = self.config
        envs = np.asarray(envs, dtype=np.int64)
        g = cfg.grid_size
        count = envs.shape[0]
        obst = np.empty((count, g, g), dtype=np.uint8)
        agents = np.empty((count, cfg.n_agents, 2), dtype=np.int64)
        targets = np.empty((count, cfg.n_targets, 2), dtype=np.int64)
        for j in range(count):
            obstacle, agents[j], targets[j] = generate_layout(rngs[j], cfg)
            obst[j] = obstacle
        self.install_layouts(envs, obst, agents, targets)

    def install_layouts(
        self, envs: np.ndarray, obstacle: np.ndarray, agents: np.ndarray, targets: np.ndarray
    ) -> None:
        """Start a new episode in each env ``envs[j]`` on the given layout: ``obstacle``
        [J, G, G] (every free cell reachable), ``agents`` int64 [J, A, 2] and ``targets`` int64
        [J, T, 2] on distinct free cells (what :func:`generate_layout` draws)."""
        envs = np.asarray(envs, dtype=np.int64)
        _reset_kernel(
            envs,
            np.asarray(obstacle, dtype=np.uint8),
            np.asarray(agents, dtype=np.int64),
            np.asarray(targets, dtype=np.int64),
            self.obstacle,
            self.target_grid,
            self.target_pos,
            self.target_state,
            self.seen,
            self.visited,
            self.block_seen,
            self.agent_pos,
            self.t,
            self.n_collected,
            self.n_free,
            self.n_seen_free,
            self.n_moves,
            self.n_revisits,
            self.views,
            self.block_of,
            self.code,
        )
        self.route_key[envs] = -1  # a new layout: the cached routes are stale

    # ---- dynamics ------------------------------------------------------------------------
    def step(
        self, actions: np.ndarray, active: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Advance the envs where ``active`` [N] is true by ``actions`` [N, A] (int64, in
        range for each agent's action space).

        Returns ``rewards`` float64 [3, A, N] (team, individual, penalty; zero where not
        active), ``invalid`` float64 [A, N], ``terminated`` bool [N], ``truncated`` bool [N]
        (False where not active).
        """
        n, a = self.num_envs, self.config.n_agents
        rewards = np.empty((3, a, n), dtype=np.float64)
        invalid = np.empty((a, n), dtype=np.float64)
        terminated = np.zeros(n, dtype=np.bool_)
        truncated = np.zeros(n, dtype=np.bool_)
        _step_kernel(
            actions,
            active,
            self._weights,
            self.config.n_scouts,
            self.config.max_cycles,
            self.obstacle,
            self.target_grid,
            self.target_pos,
            self.target_state,
            self.seen,
            self.visited,
            self.block_seen,
            self.agent_pos,
            self.t,
            self.n_collected,
            self.n_seen_free,
            self.n_moves,
            self.n_revisits,
            self.views,
            self.block_of,
            self.code,
            rewards,
            invalid,
            terminated,
            truncated,
        )
        if self.config.rescuer_reward_scale != 1.0:  # the rescuers' own channels only
            rewards[1:, self.config.n_scouts :, :] *= self.config.rescuer_reward_scale
        return rewards, invalid, terminated, truncated

    def legal_action(self, env: int, agent: int, action: int) -> bool:
        """Whether ``action`` is legal (unmasked) for ``agent`` in env ``env`` now."""
        return bool(
            _legal(
                env,
                agent,
                action,
                self.obstacle,
                self.target_grid,
                self.agent_pos,
                self.config.n_scouts,
                self.config.grid_size,
            )
        )

    def legal_actions(self, actions: np.ndarray, active: np.ndarray) -> np.ndarray:
        """bool [N, A]: whether each of ``actions`` [N, A] is legal now (True where not
        ``active``)."""
        out = np.empty(actions.shape, dtype=np.bool_)
        _legal_matrix(
            actions,
            active,
            self.obstacle,
            self.target_grid,
            self.agent_pos,
            self.config.n_scouts,
            out,
        )
        return out

    # ---- views ---------------------------------------------------------------------------
    def new_obs_buffers(self, rows: int | None = None) -> tuple[np.ndarray, ...]:
        """Empty ``(obs_scout [S, R, Ds], obs_rescuer [R', R, Dr], mask_scout [S, R, 5],
        mask_rescuer [R', R, 6])`` for ``rows`` envs (default: all)."""
        cfg = self.config
        rows = self.num_envs if rows is None else rows
        return (
            np.empty((cfg.n_scouts, rows, cfg.obs_dim_scout), dtype=np.float32),
            np.empty((cfg.n_rescuers, rows, cfg.obs_dim_rescuer), dtype=np.float32),
            np.empty((cfg.n_scouts, rows, N_ACTIONS_SCOUT), dtype=np.int8),
            np.empty((cfg.n_rescuers, rows, N_ACTIONS_RESCUER), dtype=np.int8),
        )

    def observe_into(self, envs: np.ndarray, buffers: tuple[np.ndarray, ...]) -> None:
        """Write observations/masks of ``envs`` into rows ``envs`` of ``buffers``."""
        cfg = self.config
        _observe_kernel(
            np.asarray(envs, dtype=np.int64),
            cfg.n_scouts,
            cfg.max_cycles,
            cfg.minimap,
            cfg.minimap_size,
            cfg.route_hint,
            self.obstacle,
            self.target_grid,
            self.target_pos,
            self.target_state,
            self.seen,
            self.visited,
            self.block_seen,
            self.block_cells,
            self.agent_pos,
            self.t,
            self.n_collected,
            self.n_seen_free,
            self.views,
            self.block_of,
            self.code,
            self.route_dist,
            self.route_key,
            *buffers,
        )

    def state(self, envs: np.ndarray | None = None) -> np.ndarray:
        """Global state float32 [len(envs), state_dim] (default: all envs)."""
        envs = self.all_envs if envs is None else np.asarray(envs, dtype=np.int64)
        out = np.empty((envs.shape[0], self.config.state_dim), dtype=np.float32)
        _state_kernel(
            envs,
            self.config.max_cycles,
            self.obstacle,
            self.target_grid,
            self.target_pos,
            self.target_state,
            self.seen,
            self.agent_pos,
            self.t,
            self.n_collected,
            out,
        )
        return out

    def metrics(self) -> dict[str, np.ndarray]:
        """Episode metrics so far, float64 [N] each (the one place they are computed)."""
        n_targets = self.config.n_targets
        return {
            "success": self.n_collected / n_targets,
            "solved": (self.n_collected == n_targets).astype(np.float64),
            "coverage": self.n_seen_free / self.n_free,
            "revisit_rate": self.n_revisits / np.maximum(self.n_moves, 1),
            "episode_length": self.t.astype(np.float64),
        }

    def nbytes(self) -> int:
        """Bytes held by the world arrays."""
        return sum(v.nbytes for v in vars(self).values() if isinstance(v, np.ndarray))
