"""multisearch_v0 dynamics against the independent reference (tests/_multisearch_reference.py),
layout guarantees, exact action masks, reward channels, determinism."""

from __future__ import annotations

import copy
import os
import sys
from collections import deque

import numpy as np
import pytest

from envs import multisearch_v0
from envs._multisearch_core import MultiSearchCore, generate_layout, make_config

try:
    from _multisearch_reference import MOVES, ReferenceWorld
except ImportError:  # pytest --import-mode=importlib does not put tests/ on sys.path
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _multisearch_reference import MOVES, ReferenceWorld

INFO_KEYS = {
    "reward_team",
    "reward_individual",
    "reward_penalty",
    "invalid_action",
    "success",
    "solved",
    "coverage",
    "revisit_rate",
    "episode_length",
}

# small worlds dense in targets so that random play collects, reports and revisits a lot
CONFIGS = [
    dict(grid_size=8, n_scouts=1, n_rescuers=2, n_targets=4, max_cycles=60, obstacle_density=0.2),
    dict(grid_size=10, n_scouts=2, n_rescuers=1, n_targets=3, max_cycles=50, minimap_size=3),
    dict(
        grid_size=9,
        n_scouts=0,
        n_rescuers=3,
        n_targets=4,
        max_cycles=40,
        scout_view=1,
        rescuer_view=2,
        minimap=False,
    ),
    dict(max_cycles=80),  # small preset
    dict(
        grid_size=7,
        n_scouts=1,
        n_rescuers=1,
        n_targets=2,
        max_cycles=50,
        scout_view=0,
        rescuer_view=0,
        minimap_size=2,
    ),
]


def _mixed_actions(rng, env, obs, p_legal=0.8):
    """Mostly legal actions (to make progress), sometimes any in-range action (invalid)."""
    actions = {}
    for agent in env.agents:
        mask = obs[agent]["action_mask"]
        if mask.shape[0] == 6 and mask[5] and rng.random() < 0.7:
            actions[agent] = 5  # collect usually, so that episodes also terminate
        elif rng.random() < p_legal:
            actions[agent] = int(rng.choice(np.flatnonzero(mask)))
        else:
            actions[agent] = int(rng.integers(env.action_space(agent).n))
    return actions


def _check_against_reference(env, ref, obs, infos, rewards=None):
    for a, agent in enumerate(env.possible_agents):
        np.testing.assert_allclose(obs[agent]["observation"], ref.observation(a), atol=1e-6)
        np.testing.assert_array_equal(obs[agent]["action_mask"], ref.mask(a))
        assert set(infos[agent]) == INFO_KEYS
        for key, value in ref.metrics().items():
            assert infos[agent][key] == pytest.approx(value, abs=1e-12), key
        if rewards is not None:
            parts = sum(
                infos[agent][k] for k in ("reward_team", "reward_individual", "reward_penalty")
            )
            assert rewards[agent] == parts


@pytest.mark.parametrize("config", CONFIGS)
def test_core_matches_reference_full_episodes(config):
    rng = np.random.default_rng(123)
    env = multisearch_v0.parallel_env(**config)
    saw_collect = saw_invalid = 0
    for seed in range(4):
        obs, infos = env.reset(seed=seed)
        ref = ReferenceWorld(env)
        _check_against_reference(env, ref, obs, infos)
        while env.agents:
            actions = _mixed_actions(rng, env, obs)
            obs, rewards, terms, truncs, infos = env.step(actions)
            team, individual, penalty, invalid, term, trunc = ref.step(
                [actions[a] for a in env.possible_agents]
            )
            for a, agent in enumerate(env.possible_agents):
                info = infos[agent]
                assert info["reward_team"] == pytest.approx(team, abs=1e-9)
                assert info["reward_individual"] == pytest.approx(individual[a], abs=1e-9)
                assert info["reward_penalty"] == pytest.approx(penalty[a], abs=1e-9)
                assert info["invalid_action"] == invalid[a]
                assert terms[agent] is term and truncs[agent] is trunc
            saw_collect += team > 0
            saw_invalid += sum(invalid) > 0
            _check_against_reference(env, ref, obs, infos, rewards)
    assert saw_collect > 0 and saw_invalid > 0  # the episodes exercised both rules


def _route(core, seen_wall: bool, agent=(2, 0), state=1) -> tuple[float, float, float]:
    """The rescuer's route vector in a hand-made 5x5 world: a wall on column 2, rows 0-3
    (seen or not); target 0 at (2, 4) in ``state``."""
    core.obstacle[0] = 0
    core.obstacle[0, 0:4, 2] = 1
    core.seen[0] = int(seen_wall)
    core.target_grid[0] = 0
    core.target_grid[0, 2, 4] = 1
    core.target_pos[0, 0] = (2, 4)
    core.target_state[0, 0] = state
    core.agent_pos[0, 0] = agent
    core.route_key[0] = -1  # hand-edited world: drop the cached routes, as a reset does
    buffers = core.new_obs_buffers()
    core.observe_into(core.all_envs, buffers)
    return tuple(float(x) for x in buffers[1][0, 0, -3:])


def test_route_vector_hand_worked():
    cfg = make_config(
        grid_size=5, n_scouts=0, n_rescuers=1, n_targets=1, obstacle_density=0.0, minimap_size=2
    )
    core = MultiSearchCore(cfg, 1)
    core.reset_envs(core.all_envs, [np.random.default_rng(0)])
    # seen wall: "down" and "right" both start an 8-move route around the wall's open end
    # (4, 2); the lowest action (down) wins. Manhattan would point right, into the wall.
    assert _route(core, seen_wall=True) == (1.0, 0.0, 1.0)
    # the wall not seen yet: unseen cells count as free, so straight right
    assert _route(core, seen_wall=False) == (0.0, 1.0, 1.0)
    assert _route(core, seen_wall=True, agent=(2, 4)) == (0.0, 0.0, 1.0)  # standing on it
    assert _route(core, seen_wall=True, agent=(0, 3)) == (1.0, 0.0, 1.0)  # down first
    assert _route(core, seen_wall=True, agent=(4, 4)) == (-1.0, 0.0, 1.0)  # up
    assert _route(core, seen_wall=True, agent=(2, 3)) == (0.0, 1.0, 1.0)  # right
    assert _route(core, seen_wall=True, state=0) == (0.0, 0.0, 0.0)  # hidden: no route
    assert _route(core, seen_wall=True, state=2) == (0.0, 0.0, 0.0)  # collected


@pytest.mark.parametrize(
    "config",
    [
        dict(grid_size=8, n_scouts=3, n_rescuers=3, n_targets=4, obstacle_density=0.2),
        dict(grid_size=16, obstacle_density=0.2),
        dict(grid_size=12, obstacle_density=0.5, n_targets=2, n_scouts=1, n_rescuers=1),
    ],
)
def test_layout_connected_and_distinct(config):
    cfg = make_config(**config)
    for seed in range(40):
        obstacle, agents, targets = generate_layout(np.random.default_rng(seed), cfg)
        cells = [tuple(p) for p in np.concatenate([agents, targets])]
        assert len(set(cells)) == len(cells)
        assert not any(obstacle[r, c] for r, c in cells)
        # independent BFS: every free cell reachable from the first agent
        free = {
            (r, c) for r in range(cfg.grid_size) for c in range(cfg.grid_size) if not obstacle[r, c]
        }
        reached = {cells[0]}
        queue = deque([cells[0]])
        while queue:
            r, c = queue.popleft()
            for dr, dc in MOVES.values():
                nxt = (r + dr, c + dc)
                if nxt in free and nxt not in reached:
                    reached.add(nxt)
                    queue.append(nxt)
        assert reached == free


def test_obstacle_density_roughly_respected():
    cfg = make_config(grid_size=16, obstacle_density=0.1)
    fractions = [generate_layout(np.random.default_rng(s), cfg)[0].mean() for s in range(50)]
    assert 0.08 < np.mean(fractions) < 0.14  # i.i.d. 0.1 plus a few filled pockets


@pytest.mark.parametrize("config", CONFIGS[:2])
def test_action_masks_exact(config):
    """Every unmasked action does what it says; every masked one is a penalised no-op."""
    rng = np.random.default_rng(7)
    env = multisearch_v0.parallel_env(**config)
    for seed in range(3):
        obs, _ = env.reset(seed=seed)
        for _ in range(12):
            if not env.agents:
                break
            base = {a: 0 for a in env.agents}
            for a_index, agent in enumerate(env.possible_agents):
                mask = obs[agent]["action_mask"]
                for act in range(env.action_space(agent).n):
                    trial = copy.deepcopy(env)
                    core = trial._core
                    before_pos = tuple(core.agent_pos[0, a_index])
                    before_collected = int(core.n_collected[0])
                    _, _, _, _, infos = trial.step({**base, agent: act})
                    after_pos = tuple(core.agent_pos[0, a_index])
                    info = infos[agent]
                    if mask[act]:
                        assert info["invalid_action"] == 0.0
                        if act in MOVES:
                            dr, dc = MOVES[act]
                            assert after_pos == (before_pos[0] + dr, before_pos[1] + dc)
                        elif act == 5:
                            assert core.n_collected[0] == before_collected + 1
                        else:
                            assert after_pos == before_pos
                    else:
                        assert info["invalid_action"] == 1.0
                        assert after_pos == before_pos
                        assert core.n_collected[0] == before_collected
                        assert (
                            info["reward_penalty"]
                            <= -(env.config.penalty_step + env.config.penalty_invalid) + 1e-12
                        )
            obs, *_ = env.step(_mixed_actions(rng, env, obs, p_legal=1.0))


def test_full_episode_determinism():
    """Same seed + same actions -> identical episodes (obs, rewards, flags, infos, state)."""
    runs = []
    for _ in range(2):
        env = multisearch_v0.parallel_env(max_cycles=120)
        rng = np.random.default_rng(5)
        obs, _ = env.reset(seed=99)
        trace = [env.state().copy()]
        while env.agents:
            obs, rew, term, trunc, info = env.step(_mixed_actions(rng, env, obs))
            trace.append(
                (
                    {a: (o["observation"].copy(), o["action_mask"].copy()) for a, o in obs.items()},
                    rew,
                    term,
                    trunc,
                    info,
                    env.state().copy(),
                )
            )
        runs.append(trace)
    assert len(runs[0]) == len(runs[1]) > 1
    np.testing.assert_array_equal(runs[0][0], runs[1][0])
    for step_a, step_b in zip(runs[0][1:], runs[1][1:], strict=True):
        for agent in step_a[0]:
            np.testing.assert_array_equal(step_a[0][agent][0], step_b[0][agent][0])
            np.testing.assert_array_equal(step_a[0][agent][1], step_b[0][agent][1])
        assert step_a[1:5] == step_b[1:5]
        np.testing.assert_array_equal(step_a[5], step_b[5])
    # a different seed gives a different world
    env = multisearch_v0.parallel_env()
    env.reset(seed=99)
    s99 = env.state().copy()
    env.reset(seed=100)
    assert not np.array_equal(s99, env.state())


def test_state_layout_and_space():
    env = multisearch_v0.parallel_env(grid_size=8, n_scouts=1, n_rescuers=1, n_targets=2)
    assert env.state_space.shape == (4 * 64 + 2 * 2 + 2,)  # exists before reset
    env.reset(seed=3)
    state = env.state()
    assert state.dtype == env.state_space.dtype == np.float32
    assert env.state_space.contains(state)
    core = env._core
    planes = state[: 4 * 64].reshape(4, 8, 8)
    np.testing.assert_array_equal(planes[0], core.obstacle[0])
    np.testing.assert_array_equal(planes[1], core.target_grid[0] > 0)
    np.testing.assert_array_equal(planes[3], core.seen[0])
    reported = np.zeros((8, 8))
    for k in range(2):
        if core.target_state[0, k] == 1:
            reported[tuple(core.target_pos[0, k])] = 1
    np.testing.assert_array_equal(planes[2], reported)
    np.testing.assert_allclose(state[256:260], core.agent_pos[0].ravel() / 7)
    assert state[260] == 1.0 and state[261] == 0.0  # time left, fraction collected


def test_max_cycles_writable_and_exact():
    env = multisearch_v0.parallel_env(max_cycles=50)
    env.max_cycles = 4
    env.reset(seed=0)
    for step in range(1, 5):
        _, _, term, trunc, _ = env.step({a: 0 for a in env.agents})
        assert all(trunc.values()) == (step == 4) and not any(term.values())
    assert env.agents == []


def test_termination_and_completion_bonus():
    """Drive a lone rescuer with an oracle path to every target: terminated, bonus paid."""
    env = multisearch_v0.parallel_env(
        grid_size=8,
        n_scouts=0,
        n_rescuers=1,
        n_targets=2,
        obstacle_density=0.0,
        rescuer_view=7,
        max_cycles=100,
    )
    env.reset(seed=1)
    core = env._core
    team_total = 0.0
    for k in range(2):
        goal = tuple(core.target_pos[0, k])
        while tuple(core.agent_pos[0, 0]) != goal:
            r, c = core.agent_pos[0, 0]
            act = 1 if goal[0] < r else 2 if goal[0] > r else 3 if goal[1] < c else 4
            _, rew, term, _, info = env.step({"rescuer_0": act})
            team_total += info["rescuer_0"]["reward_team"]
        _, rew, term, trunc, info = env.step({"rescuer_0": 5})
        team_total += info["rescuer_0"]["reward_team"]
    assert term["rescuer_0"] is True and trunc["rescuer_0"] is False
    assert info["rescuer_0"]["solved"] == 1.0 and info["rescuer_0"]["success"] == 1.0
    assert team_total == pytest.approx(2 * 1.0 + 1.0)  # two targets + completion bonus
    assert env.agents == []
