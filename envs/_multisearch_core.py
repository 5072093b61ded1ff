"""The one vectorised core of ``multisearch_v0``: configuration, presets and the dynamics.

Everything that decides what happens in the world lives here, once:

* :class:`MultiSearchConfig` -- validated arguments, presets and derived sizes;
* :func:`generate_layout` -- a new episode's map from an ``np.random.Generator``;
* :class:`MultiSearchCore` -- ``num_envs`` worlds held as ``[num_envs, ...]`` arrays, stepped by
  numba kernels (a loop over envs and the few agents of each env, compiled once, cached).

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
# bits of the padded per-cell code grid the observation kernel reads (outside = blocked)
CODE_BLOCKED = 1
CODE_TARGET = 2
CODE_VISITED = 4
# row/col offsets of actions 0..4
_DR = np.array([0, -1, 1, 0, 0], dtype=np.int64)
_DC = np.array([0, 0, 0, -1, 1], dtype=np.int64)

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
# Kernels (numba). Shapes: N envs, A agents, T targets, G grid, M minimap blocks per side.
# ============================================================================================


@njit(cache=True)
def _reveal(
    n, a, obstacle, target_grid, target_state, seen, block_seen, n_seen_free, agent_pos,
    views, block_of, g, individual, w_report, w_explore, action,
):  # fmt: skip
    """Mark agent a's view window as explored and report targets in it (first come first
    served), crediting ``individual[a]``. ``action`` -1: the whole window (episode start);
    1-4: only the window's leading edge after that move (the rest of the window was revealed
    from the previous cell, so nothing in it can be new); anything else: nothing."""
    v = views[a]
    pr = agent_pos[n, a, 0]
    pc = agent_pos[n, a, 1]
    r0, r1, c0, c1 = pr - v, pr + v, pc - v, pc + v
    if action == 1:
        r1 = r0
    elif action == 2:
        r0 = r1
    elif action == 3:
        c1 = c0
    elif action == 4:
        c0 = c1
    elif action != -1:
        return
    for r in range(max(r0, 0), min(r1 + 1, g)):
        for c in range(max(c0, 0), min(c1 + 1, g)):
            if not seen[n, r, c]:
                seen[n, r, c] = 1
                block_seen[n, block_of[r], block_of[c]] += 1
                if not obstacle[n, r, c]:
                    n_seen_free[n] += 1
                    individual[a] += w_explore
            k = target_grid[n, r, c] - 1
            if k >= 0 and target_state[n, k] == 0:
                target_state[n, k] = 1
                individual[a] += w_report


@njit(cache=True)
def _reset_kernel(
    envs, layout_obstacle, layout_agents, layout_targets,
    obstacle, target_grid, target_pos, target_state, seen, visited, block_seen, agent_pos,
    t, n_collected, n_free, n_seen_free, n_moves, n_revisits, views, block_of, code,
):  # fmt: skip
    """Install new layouts (``layout_*[j]``) into envs ``envs[j]`` and reveal initial views."""
    g = obstacle.shape[1]
    pad = (code.shape[1] - g) // 2
    n_agents = agent_pos.shape[1]
    scratch = np.zeros(n_agents, dtype=np.float64)
    for j in range(envs.shape[0]):
        n = envs[j]
        free = 0
        for r in range(g):
            for c in range(g):
                obstacle[n, r, c] = layout_obstacle[j, r, c]
                target_grid[n, r, c] = 0
                seen[n, r, c] = 0
                visited[n, r, c] = 0
                if not layout_obstacle[j, r, c]:
                    free += 1
        block_seen[n, :, :] = 0
        code[n, :, :] = CODE_BLOCKED
        for r in range(g):
            for c in range(g):
                code[n, pad + r, pad + c] = CODE_BLOCKED if layout_obstacle[j, r, c] else 0
        n_free[n] = free
        n_seen_free[n] = 0
        t[n] = 0
        n_collected[n] = 0
        n_moves[n] = 0
        n_revisits[n] = 0
        for k in range(target_pos.shape[1]):
            target_pos[n, k, 0] = layout_targets[j, k, 0]
            target_pos[n, k, 1] = layout_targets[j, k, 1]
            target_state[n, k] = 0
            target_grid[n, layout_targets[j, k, 0], layout_targets[j, k, 1]] = k + 1
            code[n, pad + layout_targets[j, k, 0], pad + layout_targets[j, k, 1]] |= CODE_TARGET
        for a in range(n_agents):
            agent_pos[n, a, 0] = layout_agents[j, a, 0]
            agent_pos[n, a, 1] = layout_agents[j, a, 1]
            visited[n, layout_agents[j, a, 0], layout_agents[j, a, 1]] = 1
            code[n, pad + layout_agents[j, a, 0], pad + layout_agents[j, a, 1]] |= CODE_VISITED
        for a in range(n_agents):
            _reveal(
                n,
                a,
                obstacle,
                target_grid,
                target_state,
                seen,
                block_seen,
                n_seen_free,
                agent_pos,
                views,
                block_of,
                g,
                scratch,
                0.0,
                0.0,
                -1,
            )


@njit(cache=True)
def _legal(n, a, action, obstacle, target_grid, agent_pos, n_scouts, g):
    """Whether ``action`` is legal for agent a of env n in the current state."""
    if action == 0:
        return True
    if action <= 4:
        r = agent_pos[n, a, 0] + (-1 if action == 1 else (1 if action == 2 else 0))
        c = agent_pos[n, a, 1] + (-1 if action == 3 else (1 if action == 4 else 0))
        return 0 <= r < g and 0 <= c < g and not obstacle[n, r, c]
    if action == 5 and a >= n_scouts:
        return target_grid[n, agent_pos[n, a, 0], agent_pos[n, a, 1]] > 0
    return False


@njit(cache=True)
def _legal_matrix(actions, active, obstacle, target_grid, agent_pos, n_scouts, out):
    """``out[n, a]`` = whether ``actions[n, a]`` is legal (True where env n is not active)."""
    g = obstacle.shape[1]
    for n in range(actions.shape[0]):
        for a in range(actions.shape[1]):
            out[n, a] = (not active[n]) or _legal(
                n, a, actions[n, a], obstacle, target_grid, agent_pos, n_scouts, g
            )


@njit(cache=True)
def _step_kernel(
    actions, active, weights, n_scouts, max_cycles,
    obstacle, target_grid, target_pos, target_state, seen, visited, block_seen, agent_pos,
    t, n_collected, n_seen_free, n_moves, n_revisits, views, block_of, code,
    reward_out, invalid_out, terminated_out, truncated_out,
):  # fmt: skip
    """One step of every active env. ``actions`` [N, A] int64 (already range-checked).

    Writes ``reward_out`` [3, A, N] (team, individual, penalty), ``invalid_out`` [A, N]
    (1.0 where a masked action became "stay"), ``terminated_out``/``truncated_out`` [N].
    """
    n_envs, n_agents = actions.shape
    g = obstacle.shape[1]
    pad = (code.shape[1] - g) // 2
    n_targets = target_pos.shape[1]
    w_target, w_complete, w_report, w_collect, w_explore = (
        weights[0],
        weights[1],
        weights[2],
        weights[3],
        weights[4],
    )
    p_step, p_revisit, p_invalid = weights[5], weights[6], weights[7]
    effective = np.zeros(n_agents, dtype=np.int64)
    new_r = np.zeros(n_agents, dtype=np.int64)
    new_c = np.zeros(n_agents, dtype=np.int64)
    individual = np.zeros(n_agents, dtype=np.float64)
    penalty = np.zeros(n_agents, dtype=np.float64)
    for n in range(n_envs):
        if not active[n]:
            for a in range(n_agents):
                reward_out[0, a, n] = 0.0
                reward_out[1, a, n] = 0.0
                reward_out[2, a, n] = 0.0
                invalid_out[a, n] = 0.0
            continue
        # 1. masked actions become "stay" with a penalty
        for a in range(n_agents):
            individual[a] = 0.0
            penalty[a] = -p_step
            act = actions[n, a]
            if _legal(n, a, act, obstacle, target_grid, agent_pos, n_scouts, g):
                effective[a] = act
                invalid_out[a, n] = 0.0
            else:
                effective[a] = 0
                invalid_out[a, n] = 1.0
                penalty[a] -= p_invalid
        # 2. simultaneous moves (agents may share cells); revisit = move onto a cell the team
        #    had visited before this step
        for a in range(n_agents):
            act = effective[a]
            r = agent_pos[n, a, 0]
            c = agent_pos[n, a, 1]
            if 1 <= act <= 4:
                r += -1 if act == 1 else (1 if act == 2 else 0)
                c += -1 if act == 3 else (1 if act == 4 else 0)
                n_moves[n] += 1
                if visited[n, r, c]:
                    n_revisits[n] += 1
                    penalty[a] -= p_revisit
            new_r[a] = r
            new_c[a] = c
        for a in range(n_agents):
            agent_pos[n, a, 0] = new_r[a]
            agent_pos[n, a, 1] = new_c[a]
            visited[n, new_r[a], new_c[a]] = 1
            code[n, pad + new_r[a], pad + new_c[a]] |= CODE_VISITED
        # 3. collection (first rescuer in order wins a contested target)
        collected_now = 0
        for a in range(n_scouts, n_agents):
            if effective[a] == 5:
                k = target_grid[n, new_r[a], new_c[a]] - 1
                if k >= 0:
                    target_grid[n, new_r[a], new_c[a]] = 0
                    code[n, pad + new_r[a], pad + new_c[a]] &= ~CODE_TARGET
                    target_state[n, k] = 2
                    collected_now += 1
                    individual[a] += w_collect
        n_collected[n] += collected_now
        # 4. exploration and reports from the new positions (only movers can see new cells)
        for a in range(n_agents):
            _reveal(
                n,
                a,
                obstacle,
                target_grid,
                target_state,
                seen,
                block_seen,
                n_seen_free,
                agent_pos,
                views,
                block_of,
                g,
                individual,
                w_report,
                w_explore,
                effective[a],
            )
        # 5. team reward, time, episode end
        team = w_target * collected_now
        done = n_collected[n] == n_targets
        if done and collected_now > 0:
            team += w_complete
        t[n] += 1
        terminated_out[n] = done
        truncated_out[n] = (not done) and t[n] >= max_cycles
        for a in range(n_agents):
            reward_out[0, a, n] = team
            reward_out[1, a, n] = individual[a]
            reward_out[2, a, n] = penalty[a]


#: row / column change of actions 0 (stay) and 1-4 (up, down, left, right)
STEP_DR = np.array([0, -1, 1, 0, 0], dtype=np.int64)
STEP_DC = np.array([0, 0, 0, -1, 1], dtype=np.int64)


@njit(cache=True)
def _route_action(dist, r, c):
    """The action (1-4) of the first move one step closer along the route field ``dist``
    [G, G] (route lengths, -1: no route) from cell (r, c) (ties: the lowest action); 0 (stay)
    on a route's end or without a route."""
    here = dist[r, c]
    if here > 0:
        g = dist.shape[0]
        for act in range(1, 5):
            nr = r + STEP_DR[act]
            nc = c + STEP_DC[act]
            if 0 <= nr < g and 0 <= nc < g and dist[nr, nc] == here - 1:
                return act
    return 0


@njit(cache=True)
def _route_field(n, g, obstacle, seen, target_pos, target_state, dist, queue):
    """Fill ``dist[n]`` [G, G] with each cell's route length to the nearest reported,
    uncollected target of env n (-1: no route), by one breadth-first search from all of them.

    Routes plan on the team's knowledge: a cell is passable unless it is outside the grid or a
    seen obstacle (unseen cells are assumed free). ``queue``: scratch of size G*G.
    """
    d = dist[n]
    d[:, :] = -1
    tail = 0
    for k in range(target_pos.shape[1]):
        if target_state[n, k] == 1:
            tr, tc = target_pos[n, k, 0], target_pos[n, k, 1]
            if d[tr, tc] < 0:
                d[tr, tc] = 0
                queue[tail] = tr * g + tc
                tail += 1
    head = 0
    while head < tail:
        cell = queue[head]
        head += 1
        r = cell // g
        c = cell - r * g
        nd = d[r, c] + 1
        for act in range(1, 5):
            nr = r + STEP_DR[act]
            nc = c + STEP_DC[act]
            if nr < 0 or nr >= g or nc < 0 or nc >= g or d[nr, nc] >= 0:
                continue
            if seen[n, nr, nc] and obstacle[n, nr, nc]:
                continue
            d[nr, nc] = nd
            queue[tail] = nr * g + nc
            tail += 1


@njit(cache=True)
def _observe_kernel(
    envs, n_scouts, max_cycles, minimap, minimap_size, route_hint,
    obstacle, target_grid, target_pos, target_state, seen, visited, block_seen, block_cells,
    agent_pos, t, n_collected, n_seen_free, views, block_of, code, route_dist, route_key,
    obs_scout, obs_rescuer, mask_scout, mask_rescuer,
):  # fmt: skip
    """Write observations and action masks of envs ``envs`` into rows ``envs`` of
    ``obs_scout`` [S, N, Ds], ``obs_rescuer`` [R, N, Dr], ``mask_scout`` [S, N, 5],
    ``mask_rescuer`` [R, N, 6].

    With the minimap, ``route_dist`` [N, G, G] caches :func:`_route_field` for the knowledge
    recorded in ``route_key`` [N, 2] (sum of target states, seen obstacles: both only grow
    within an episode; a reset sets the key to -1), so it is recomputed only when a report, a
    collection or a newly seen obstacle changed it."""
    g = obstacle.shape[1]
    queue = np.empty(g * g, dtype=np.int64)
    pad = (code.shape[1] - g) // 2
    n_agents = agent_pos.shape[1]
    n_targets = target_pos.shape[1]
    m = minimap_size
    mm = m * m
    scale = 1.0 / max(g - 1, 1)
    team_map = np.zeros(2 * mm, dtype=np.float32)
    for j in range(envs.shape[0]):
        n = envs[j]
        time_left = max(max_cycles - t[n], 0) / max_cycles
        targets_left = (n_targets - n_collected[n]) / n_targets
        any_reported = False
        if minimap:  # shared by the env's agents
            team_map[:mm] = 0.0
            state_sum = 0
            for k in range(n_targets):
                state_sum += target_state[n, k]
                if target_state[n, k] == 1:
                    any_reported = True
                    tr, tc = target_pos[n, k, 0], target_pos[n, k, 1]
                    team_map[block_of[tr] * m + block_of[tc]] = 1.0
            seen_obstacles = -n_seen_free[n]
            for br in range(m):
                for bc in range(m):
                    team_map[mm + br * m + bc] = block_seen[n, br, bc] / block_cells[br, bc]
                    seen_obstacles += block_seen[n, br, bc]
            stale = route_key[n, 0] != state_sum or route_key[n, 1] != seen_obstacles
            if route_hint and any_reported and stale:
                _route_field(n, g, obstacle, seen, target_pos, target_state, route_dist, queue)
                route_key[n, 0] = state_sum
                route_key[n, 1] = seen_obstacles
        for a in range(n_agents):
            if a < n_scouts:
                out = obs_scout[a, n]
                mask = mask_scout[a, n]
            else:
                out = obs_rescuer[a - n_scouts, n]
                mask = mask_rescuer[a - n_scouts, n]
            v = views[a]
            w = 2 * v + 1
            area = w * w
            pr = agent_pos[n, a, 0]
            pc = agent_pos[n, a, 1]
            # window channels: 0 blocked (obstacle or outside), 1 target, 2 teammate, 3 visited
            i = 0
            for r in range(pad + pr - v, pad + pr + v + 1):
                for c in range(pad + pc - v, pad + pc + v + 1):
                    cell = code[n, r, c]
                    out[i] = cell & CODE_BLOCKED
                    out[area + i] = (cell & CODE_TARGET) >> 1
                    out[2 * area + i] = 0.0
                    out[3 * area + i] = (cell & CODE_VISITED) >> 2
                    i += 1
            for b in range(n_agents):
                if b != a:
                    dr = agent_pos[n, b, 0] - pr
                    dc = agent_pos[n, b, 1] - pc
                    if -v <= dr <= v and -v <= dc <= v:
                        out[2 * area + (dr + v) * w + (dc + v)] = 1.0
            base = 4 * area
            out[base] = pr * scale
            out[base + 1] = pc * scale
            out[base + 2] = time_left
            out[base + 3] = targets_left
            base += 4
            if minimap:
                for i in range(2 * mm):
                    out[base + i] = team_map[i]
                base += 2 * mm
                out[base] = 0.0
                out[base + 1] = 0.0
                out[base + 2] = 0.0
                here = route_dist[n, pr, pc] if any_reported and route_hint else -1
                if here >= 0:
                    out[base + 2] = 1.0
                if here > 0:
                    act = _route_action(route_dist[n], pr, pc)
                    out[base] = STEP_DR[act]
                    out[base + 1] = STEP_DC[act]
            # action mask, from the padded codes (outside the grid is blocked)
            mask[0] = 1
            mask[1] = 0 if code[n, pad + pr - 1, pad + pc] & CODE_BLOCKED else 1
            mask[2] = 0 if code[n, pad + pr + 1, pad + pc] & CODE_BLOCKED else 1
            mask[3] = 0 if code[n, pad + pr, pad + pc - 1] & CODE_BLOCKED else 1
            mask[4] = 0 if code[n, pad + pr, pad + pc + 1] & CODE_BLOCKED else 1
            if mask.shape[0] > 5:
                mask[5] = 1 if target_grid[n, pr, pc] > 0 else 0


@njit(cache=True)
def _state_kernel(
    envs, max_cycles, obstacle, target_grid, target_pos, target_state, seen, agent_pos,
    t, n_collected, out,
):  # fmt: skip
    """Global state rows ``out[j]`` [state_dim] for envs ``envs[j]``: channel planes
    (obstacle, uncollected target, reported uncollected target, explored), then agent
    positions (row, col) / (G-1), time left, fraction of targets collected."""
    g = obstacle.shape[1]
    gg = g * g
    n_agents = agent_pos.shape[1]
    n_targets = target_pos.shape[1]
    scale = 1.0 / max(g - 1, 1)
    for j in range(envs.shape[0]):
        n = envs[j]
        row = out[j]
        for r in range(g):
            for c in range(g):
                i = r * g + c
                row[i] = 1.0 if obstacle[n, r, c] else 0.0
                row[gg + i] = 1.0 if target_grid[n, r, c] > 0 else 0.0
                row[2 * gg + i] = 0.0
                row[3 * gg + i] = 1.0 if seen[n, r, c] else 0.0
        for k in range(n_targets):
            if target_state[n, k] == 1:
                row[2 * gg + target_pos[n, k, 0] * g + target_pos[n, k, 1]] = 1.0
        base = 4 * gg
        for a in range(n_agents):
            row[base + 2 * a] = agent_pos[n, a, 0] * scale
            row[base + 2 * a + 1] = agent_pos[n, a, 1] * scale
        base += 2 * n_agents
        row[base] = max(max_cycles - t[n], 0) / max_cycles
        row[base + 1] = n_collected[n] / n_targets


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
    :func:`_observe_kernel`).
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
