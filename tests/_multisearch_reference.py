"""A slow, obviously-correct reference of the multisearch_v0 rules, written from the module
documentation (plain Python sets, lists and loops; float64). Tests compare the numba core to
it step by step. It takes the initial layout (obstacles, targets, agents) from an env after
``reset``; layout generation is tested separately."""

from __future__ import annotations

import numpy as np

MOVES = {1: (-1, 0), 2: (1, 0), 3: (0, -1), 4: (0, 1)}


class ReferenceWorld:
    def __init__(self, env) -> None:
        core = env.unwrapped._core
        cfg = core.config
        self.cfg = cfg
        self.g = cfg.grid_size
        self.obstacle = {
            (r, c) for r in range(self.g) for c in range(self.g) if core.obstacle[0, r, c]
        }
        self.targets = {k: (int(r), int(c)) for k, (r, c) in enumerate(core.target_pos[0])}
        self.target_state = dict.fromkeys(self.targets, 0)
        self.pos = [(int(r), int(c)) for r, c in core.agent_pos[0]]
        self.names = list(cfg.agent_names)
        self.views = [cfg.scout_view] * cfg.n_scouts + [cfg.rescuer_view] * cfg.n_rescuers
        self.n_free = self.g * self.g - len(self.obstacle)
        self.seen: set[tuple[int, int]] = set()
        self.visited = set(self.pos)
        self.t = 0
        self.moves = 0
        self.revisits = 0
        for a in range(len(self.pos)):
            self._reveal(a)

    # ---- rules ---------------------------------------------------------------------------
    def inside(self, r: int, c: int) -> bool:
        return 0 <= r < self.g and 0 <= c < self.g

    def target_at(self, cell: tuple[int, int]) -> int | None:
        for k, p in self.targets.items():
            if p == cell and self.target_state[k] != 2:
                return k
        return None

    def is_scout(self, a: int) -> bool:
        return a < self.cfg.n_scouts

    def legal(self, a: int, act: int) -> bool:
        if act == 0:
            return True
        if act in MOVES:
            r, c = self.pos[a][0] + MOVES[act][0], self.pos[a][1] + MOVES[act][1]
            return self.inside(r, c) and (r, c) not in self.obstacle
        if act == 5 and not self.is_scout(a):
            return self.target_at(self.pos[a]) is not None
        return False

    def _reveal(self, a: int) -> tuple[int, int]:
        """Returns (newly explored free cells, newly reported targets) credited to agent a."""
        v = self.views[a]
        r0, c0 = self.pos[a]
        explored = reported = 0
        for r in range(r0 - v, r0 + v + 1):
            for c in range(c0 - v, c0 + v + 1):
                if not self.inside(r, c):
                    continue
                if (r, c) not in self.seen:
                    self.seen.add((r, c))
                    if (r, c) not in self.obstacle:
                        explored += 1
                k = self.target_at((r, c))
                if k is not None and self.target_state[k] == 0:
                    self.target_state[k] = 1
                    reported += 1
        return explored, reported

    def step(self, actions: list[int]):
        cfg = self.cfg
        n = len(self.pos)
        team = 0.0
        individual = [0.0] * n
        penalty = [-cfg.penalty_step] * n
        invalid = [0.0] * n
        effective = []
        for a, act in enumerate(actions):
            if self.legal(a, act):
                effective.append(act)
            else:
                effective.append(0)
                invalid[a] = 1.0
                penalty[a] -= cfg.penalty_invalid
        visited_before = set(self.visited)
        new_pos = []
        for a, act in enumerate(effective):
            r, c = self.pos[a]
            if act in MOVES:
                r, c = r + MOVES[act][0], c + MOVES[act][1]
                self.moves += 1
                if (r, c) in visited_before:
                    self.revisits += 1
                    penalty[a] -= cfg.penalty_revisit
            new_pos.append((r, c))
        self.pos = new_pos
        self.visited |= set(new_pos)
        collected = 0
        for a, act in enumerate(effective):
            if act == 5:
                k = self.target_at(self.pos[a])
                if k is not None:
                    self.target_state[k] = 2
                    collected += 1
                    individual[a] += cfg.reward_collect
        for a in range(n):
            explored, reported = self._reveal(a)
            individual[a] += cfg.reward_explore * explored + cfg.reward_report * reported
        n_collected = sum(s == 2 for s in self.target_state.values())
        team = cfg.reward_target * collected
        terminated = n_collected == len(self.targets)
        if terminated and collected:
            team += cfg.reward_complete
        self.t += 1
        truncated = (not terminated) and self.t >= cfg.max_cycles
        return team, individual, penalty, invalid, terminated, truncated

    # ---- views ---------------------------------------------------------------------------
    def metrics(self) -> dict[str, float]:
        n_collected = sum(s == 2 for s in self.target_state.values())
        seen_free = sum(1 for cell in self.seen if cell not in self.obstacle)
        return {
            "success": n_collected / len(self.targets),
            "solved": float(n_collected == len(self.targets)),
            "coverage": seen_free / self.n_free,
            "revisit_rate": self.revisits / max(self.moves, 1),
            "episode_length": float(self.t),
        }

    def mask(self, a: int) -> np.ndarray:
        n_actions = 5 if self.is_scout(a) else 6
        return np.array([self.legal(a, x) for x in range(n_actions)], dtype=np.int8)

    def observation(self, a: int) -> np.ndarray:
        cfg = self.cfg
        g = self.g
        v = self.views[a]
        r0, c0 = self.pos[a]
        planes = np.zeros((4, 2 * v + 1, 2 * v + 1))
        for i, r in enumerate(range(r0 - v, r0 + v + 1)):
            for j, c in enumerate(range(c0 - v, c0 + v + 1)):
                if not self.inside(r, c) or (r, c) in self.obstacle:
                    planes[0, i, j] = 1
                if self.target_at((r, c)) is not None:
                    planes[1, i, j] = 1
                if any(self.pos[b] == (r, c) for b in range(len(self.pos)) if b != a):
                    planes[2, i, j] = 1
                if (r, c) in self.visited:
                    planes[3, i, j] = 1
        parts = [planes.ravel()]
        n_collected = sum(s == 2 for s in self.target_state.values())
        parts.append(
            [
                r0 / (g - 1),
                c0 / (g - 1),
                (cfg.max_cycles - self.t) / cfg.max_cycles,
                (len(self.targets) - n_collected) / len(self.targets),
            ]
        )
        if cfg.minimap:
            m = cfg.minimap_size
            block = -(-g // m)  # ceil
            reported = np.zeros((m, m))
            explored = np.zeros((m, m))
            cells = np.zeros((m, m))
            for r in range(g):
                for c in range(g):
                    br, bc = min(r // block, m - 1), min(c // block, m - 1)
                    cells[br, bc] += 1
                    explored[br, bc] += (r, c) in self.seen
            for k, (r, c) in self.targets.items():
                if self.target_state[k] == 1:
                    reported[min(r // block, m - 1), min(c // block, m - 1)] = 1
            parts.append(reported.ravel())
            parts.append((explored / np.maximum(cells, 1)).ravel())
            parts.append(self.route_step(a) if cfg.route_hint else [0.0, 0.0, 0.0])
        return np.concatenate([np.asarray(p, dtype=np.float64) for p in parts])

    def route_step(self, a: int) -> list[float]:
        """(d_row, d_col, 1) of the first move of a shortest route to the nearest reported
        target, planned on team knowledge (seen obstacles block, unseen cells are free); moves
        tie-break in action order; (0, 0, 1) on the target, zeros if none is reachable.

        Written differently from the core (which measures every cell's distance from the
        reported targets): one search outwards from the agent per first move, in action
        order; the first move whose search reaches a target soonest wins."""
        here = self.pos[a]
        reported = {p for k, p in self.targets.items() if self.target_state[k] == 1}
        if here in reported:
            return [0.0, 0.0, 1.0]
        best = None
        for dr, dc in MOVES.values():  # action order 1-4
            first = (here[0] + dr, here[1] + dc)
            if not self.inside(*first) or (first in self.seen and first in self.obstacle):
                continue
            dist = self._search(first, reported, blocked=here)
            if dist is not None and (best is None or dist < best[0]):
                best = (dist, dr, dc)
        return [0.0, 0.0, 0.0] if best is None else [float(best[1]), float(best[2]), 1.0]

    def _search(self, start, goals, blocked) -> int | None:
        """Moves from ``start`` to the nearest cell of ``goals`` (None: unreachable), not
        passing through ``blocked`` (a shortest route never revisits its first cell)."""
        frontier, dist, seen_here = [start], 0, {start, blocked}
        while frontier:
            if any(cell in goals for cell in frontier):
                return dist
            nxt = []
            for r, c in frontier:
                for dr, dc in MOVES.values():
                    cell = (r + dr, c + dc)
                    if not self.inside(*cell) or cell in seen_here:
                        continue
                    if cell in self.seen and cell in self.obstacle:
                        continue
                    seen_here.add(cell)
                    nxt.append(cell)
            frontier, dist = nxt, dist + 1
        return None
