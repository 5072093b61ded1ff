"""multisearch's dynamics: the numba kernels that reset, step, observe and describe ``num_envs``
worlds held as ``[num_envs, ...]`` arrays (a loop over envs and the few agents of each env,
compiled once, cached), and the legality of actions. N envs, A agents (S scouts first, then R
rescuers), T targets, G grid, M minimap blocks per side, Ds / Dr the scouts' / rescuers'
observation sizes.

Hot path (every env step): :func:`_step_kernel` (masked actions to "stay", simultaneous moves,
collection, then :func:`_reveal` for exploration and reports; writes the rewards
``[3, A, N]``, the invalid flags ``[A, N]`` and the episode ends ``[N]``) and
:func:`_observe_kernel` (each agent's observation and action mask, written into rows of
``obs_scout`` [S, N, Ds], ``obs_rescuer`` [R, N, Dr], ``mask_scout`` [S, N, 5] and
``mask_rescuer`` [R, N, 6]; with the minimap, the route to the nearest reported target, by
:func:`_route_field` and :func:`_route_action`, cached per env); per episode start:
:func:`_reset_kernel` (installs the layouts :func:`envs._multisearch_core.generate_layout`
draws); on request: :func:`_state_kernel` (global state ``[J, state_dim]``), :func:`_legal`
and :func:`_legal_matrix` (``strict_actions``).

Callers: :class:`envs._multisearch_core.MultiSearchCore`, which owns the world arrays
(``obstacle``, ``target_grid``, ``agent_pos``, ...; shapes in its docstring) and the
configuration, and calls :func:`_reset_kernel` from ``install_layouts``, :func:`_step_kernel`
from ``step`` (``weights`` in the order of ``REWARD_WEIGHT_NAMES``), :func:`_observe_kernel`
from ``observe_into``, :func:`_state_kernel` from ``state``, :func:`_legal` from
``legal_action`` and :func:`_legal_matrix` from ``legal_actions``; and
:mod:`envs.multisearch_recall_v0`, whose kernels reuse :func:`_route_field`,
:func:`_route_action` and :data:`STEP_DR` / :data:`STEP_DC` for its zone routes.

Besides the world arrays, reset and step keep ``code`` uint8 [N, G + 2p, G + 2p] up to date: the
grid padded by ``p`` blocked cells (``p`` >= every view radius and >= 1) with one bit per fact
(:data:`CODE_BLOCKED`, :data:`CODE_TARGET`, :data:`CODE_VISITED`), so the observation reads a
view window or an action mask without bounds checks.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# bits of the padded per-cell code grid the observation kernel reads (outside = blocked)
CODE_BLOCKED = 1
CODE_TARGET = 2
CODE_VISITED = 4

#: row / column change of actions 0 (stay) and 1-4 (up, down, left, right)
STEP_DR = np.array([0, -1, 1, 0, 0], dtype=np.int64)
STEP_DC = np.array([0, 0, 0, -1, 1], dtype=np.int64)


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
