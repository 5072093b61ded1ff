"""Reference policies for ``multisearch_v0`` and their evaluation on fixed seeds.

* :class:`HeuristicPolicy` -- scripted team play, vectorised (one compiled loop over envs):
  scouts walk (BFS) to the nearest unexplored cell not already claimed by a teammate;
  rescuers collect when standing on a target, else walk to the nearest reported target not
  claimed by an earlier rescuer, else explore like scouts. It plans on the *team's knowledge*:
  explored cells, obstacles seen, reported targets (unexplored cells are assumed free and
  obstacles next to an agent are sensed); it never reads hidden targets.
* :class:`RandomPolicy` -- uniform over each agent's legal (unmasked) actions.
* :func:`evaluate_baseline` -- one episode per seed in a ``vector_env`` (``autoreset=False``),
  reading the metrics the env reports in ``infos`` at each episode's end.

Both policies work with ``vector_env`` (arrays ``[num_envs]``) and ``parallel_env`` (ints);
call them as ``actions = policy(obs, env)``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numba import njit

from envs._baselines import Policy, RandomPolicy, run_episodes, to_env_format
from envs._multisearch_core import MultiSearchCore
from envs.multisearch_v0 import MultiSearchParallelEnv, MultiSearchVectorEnv, vector_env

__all__ = ["HeuristicPolicy", "RandomPolicy", "evaluate_baseline"]


def _core_of(env: Any) -> MultiSearchCore:
    inner = getattr(env, "unwrapped", env)
    if isinstance(inner, (MultiSearchParallelEnv, MultiSearchVectorEnv)):
        return inner._core
    raise TypeError(
        "expected a multisearch_v0 parallel_env or vector_env, got " + type(env).__name__
    )


@njit(cache=True)
def _bfs(n, start_r, start_c, obstacle, seen, g, dist, parent, queue):
    """BFS over cells not known to be blocked (seen obstacles; obstacles next to the start
    are sensed). Fills dist (-1 unreachable) and parent (flat index)."""
    dist[:, :] = -1
    dist[start_r, start_c] = 0
    parent[start_r, start_c] = -1
    queue[0] = start_r * g + start_c
    head, tail = 0, 1
    while head < tail:
        cell = queue[head]
        head += 1
        r, c = cell // g, cell % g
        for k in range(4):
            nr = r + (-1 if k == 0 else (1 if k == 1 else 0))
            nc = c + (-1 if k == 2 else (1 if k == 3 else 0))
            if nr < 0 or nr >= g or nc < 0 or nc >= g or dist[nr, nc] >= 0:
                continue
            near = abs(nr - start_r) + abs(nc - start_c) <= 1
            if obstacle[n, nr, nc] and (seen[n, nr, nc] or near):
                continue
            dist[nr, nc] = dist[r, c] + 1
            parent[nr, nc] = cell
            queue[tail] = nr * g + nc
            tail += 1


@njit(cache=True)
def _first_move(start_r, start_c, goal_r, goal_c, parent, g):
    """Action (1 up, 2 down, 3 left, 4 right) of the first step towards the goal."""
    cell = goal_r * g + goal_c
    start = start_r * g + start_c
    while parent[cell // g, cell % g] != start:
        cell = parent[cell // g, cell % g]
    r, c = cell // g, cell % g
    if r < start_r:
        return 1
    if r > start_r:
        return 2
    if c < start_c:
        return 3
    return 4


@njit(cache=True)
def _heuristic_kernel(
    obstacle, seen, target_grid, target_pos, target_state, agent_pos, n_scouts, views, out
):
    n_envs, n_agents = out.shape
    g = obstacle.shape[1]
    n_targets = target_pos.shape[1]
    dist = np.empty((g, g), dtype=np.int64)
    parent = np.empty((g, g), dtype=np.int64)
    queue = np.empty(g * g, dtype=np.int64)
    claimed_target = np.zeros(n_targets, dtype=np.bool_)
    claim_r = np.empty(n_agents, dtype=np.int64)
    claim_c = np.empty(n_agents, dtype=np.int64)
    for n in range(n_envs):
        claimed_target[:] = False
        n_claims = 0
        # rescuers first: they claim targets; then everyone else explores
        for rank in range(n_agents):
            a = n_scouts + rank if rank < n_agents - n_scouts else rank - (n_agents - n_scouts)
            pr = agent_pos[n, a, 0]
            pc = agent_pos[n, a, 1]
            out[n, a] = 0
            rescuer = a >= n_scouts
            if rescuer and target_grid[n, pr, pc] > 0:
                out[n, a] = 5
                claimed_target[target_grid[n, pr, pc] - 1] = True
                continue
            _bfs(n, pr, pc, obstacle, seen, g, dist, parent, queue)
            if rescuer:
                best = -1
                best_d = 1 << 30
                for pass_ in range(2):  # unclaimed targets first, then any
                    for k in range(n_targets):
                        if target_state[n, k] != 1 or (pass_ == 0 and claimed_target[k]):
                            continue
                        d = dist[target_pos[n, k, 0], target_pos[n, k, 1]]
                        if 0 <= d < best_d:
                            best_d = d
                            best = k
                    if best >= 0:
                        break
                if best >= 0:
                    claimed_target[best] = True
                    out[n, a] = _first_move(
                        pr, pc, target_pos[n, best, 0], target_pos[n, best, 1], parent, g
                    )
                    continue
            # explore: nearest unexplored reachable cell away from teammates' goals
            spread = 2 * views[a] + 1
            best_r, best_c, best_d = -1, -1, 1 << 30
            fallback_r, fallback_c, fallback_d = -1, -1, 1 << 30
            for r in range(g):
                for c in range(g):
                    d = dist[r, c]
                    if d <= 0 or seen[n, r, c]:
                        continue
                    if d < fallback_d:
                        fallback_r, fallback_c, fallback_d = r, c, d
                    if d >= best_d:
                        continue
                    free = True
                    for q in range(n_claims):
                        if abs(claim_r[q] - r) + abs(claim_c[q] - c) < spread:
                            free = False
                            break
                    if free:
                        best_r, best_c, best_d = r, c, d
            if best_r < 0:
                best_r, best_c = fallback_r, fallback_c
            if best_r >= 0:
                claim_r[n_claims] = best_r
                claim_c[n_claims] = best_c
                n_claims += 1
                out[n, a] = _first_move(pr, pc, best_r, best_c, parent, g)


class HeuristicPolicy:
    """Scripted team policy (see the module doc). ``policy(obs, env) -> actions``."""

    def __call__(self, obs: Mapping[str, Any], env: Any) -> dict[str, Any]:
        core = _core_of(env)
        cfg = core.config
        actions = np.zeros((core.num_envs, cfg.n_agents), dtype=np.int64)
        _heuristic_kernel(
            core.obstacle,
            core.seen,
            core.target_grid,
            core.target_pos,
            core.target_state,
            core.agent_pos,
            cfg.n_scouts,
            core.views,
            actions,
        )
        return to_env_format(env, actions)


def evaluate_baseline(
    policy: str | Policy,
    seeds: Sequence[int] = tuple(range(64)),
    *,
    policy_seed: int = 0,
    **env_kwargs: Any,
) -> dict[str, float]:
    """Run one episode per seed (env i reset with ``seeds[i]``) and average the metrics the
    env reports at each episode's end.

    ``policy``: "heuristic", "random" or a callable ``policy(obs, vec_env) -> actions``.
    Returns ``success_rate`` (mean fraction collected), ``solved_rate``, ``coverage``,
    ``revisit_rate``, ``steps`` (mean episode length), ``return`` (mean per-agent return),
    ``n_episodes``.
    """
    if isinstance(policy, str):
        if policy == "heuristic":
            policy = HeuristicPolicy()
        elif policy == "random":
            policy = RandomPolicy(policy_seed)
        else:
            raise ValueError(f"unknown policy {policy!r}; allowed: 'heuristic', 'random', callable")
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise ValueError("seeds must not be empty")
    vec = vector_env(len(seeds), autoreset=False, **env_kwargs)
    keys = ("success", "solved", "coverage", "revisit_rate", "episode_length")
    final, returns = run_episodes(vec, policy, seeds, keys)
    return {
        "success_rate": float(final["success"].mean()),
        "solved_rate": float(final["solved"].mean()),
        "coverage": float(final["coverage"].mean()),
        "revisit_rate": float(final["revisit_rate"].mean()),
        "steps": float(final["episode_length"].mean()),
        "return": float(returns.mean()),
        "n_episodes": float(len(seeds)),
    }
