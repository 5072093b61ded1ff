"""Bad input: clear errors, and nothing changes (issue 2 item 7)."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from envs import multisearch_v0

try:
    import _env_checks as checks
except ImportError:  # pytest --import-mode=importlib does not put tests/ on sys.path
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import _env_checks as checks


def _snapshot(env):
    core = env._core
    return [a.copy() for a in vars(core).values() if isinstance(a, np.ndarray)] + [list(env.agents)]


BAD_ACTIONS = [
    (5, "scout_0"),  # out of range for a scout (Discrete(5))
    (6, "rescuer_0"),
    (-1, "rescuer_1"),
    (1.0, "scout_0"),  # wrong types
    (np.float32(2), "scout_1"),
    (True, "scout_0"),
    ("1", "rescuer_0"),
    (None, "scout_0"),
    (np.array([1, 2]), "scout_0"),
]


@pytest.mark.parametrize("action,agent", BAD_ACTIONS)
def test_parallel_bad_action_raises_and_changes_nothing(action, agent):
    good = {a: 1 for a in multisearch_v0.parallel_env().possible_agents}
    checks.check_bad_action_changes_nothing(
        multisearch_v0.parallel_env, _snapshot, agent, action, good, watched="scout_0"
    )


@pytest.mark.parametrize(
    "mutate,needle",
    [
        (lambda acts: acts.pop("rescuer_1"), "missing: ['rescuer_1']"),
        (lambda acts: acts.update(scout_9=0), "scout_9"),
        (lambda acts: acts.update(rescuer=0), "rescuer"),
    ],
)
def test_parallel_missing_or_unknown_agent(mutate, needle):
    checks.check_missing_or_unknown_agent(multisearch_v0.parallel_env(), _snapshot, mutate, needle)


def test_step_without_reset_or_after_end():
    env = multisearch_v0.parallel_env(max_cycles=1)
    with pytest.raises(ValueError, match="reset"):
        env.step({})
    env.reset(seed=0)
    env.step({a: 0 for a in env.agents})
    with pytest.raises(ValueError, match="reset"):
        env.step({a: 0 for a in env.possible_agents})


def _masked_action(env, obs):
    for agent in env.agents:
        masked = np.flatnonzero(obs[agent]["action_mask"] == 0)
        if masked.size:
            return agent, int(masked[0])
    raise AssertionError("no masked action available")


def test_masked_action_default_is_penalised_noop():
    env = multisearch_v0.parallel_env()
    obs, _ = env.reset(seed=0)
    agent, act = _masked_action(env, obs)  # rescuers cannot collect on an empty cell
    index = env.possible_agents.index(agent)
    pos = env._core.agent_pos[0, index].copy()
    _, rew, _, _, infos = env.step({**{a: 0 for a in env.agents}, agent: act})
    assert infos[agent]["invalid_action"] == 1.0
    np.testing.assert_array_equal(env._core.agent_pos[0, index], pos)
    cfg = env.config
    assert infos[agent]["reward_penalty"] == pytest.approx(-cfg.penalty_step - cfg.penalty_invalid)
    others = [a for a in env.possible_agents if a != agent]
    assert all(infos[a]["invalid_action"] == 0.0 for a in others)


def test_strict_actions_raises_and_changes_nothing():
    env = multisearch_v0.parallel_env(strict_actions=True)
    obs, _ = env.reset(seed=0)
    agent, act = _masked_action(env, obs)
    before = _snapshot(env)
    with pytest.raises(ValueError, match="strict_actions") as err:
        env.step({**{a: 0 for a in env.agents}, agent: act})
    assert agent in str(err.value) and "legal actions" in str(err.value)
    checks.assert_same(before, _snapshot(env))


def test_vector_bad_actions():
    checks.check_vector_bad_actions(
        multisearch_v0.vector_env(3),
        _snapshot,
        out_of_range=("scout_0", 5),
        negative="rescuer_0",
        malformed="scout_1",
        missing="rescuer_1",
    )


def test_vector_strict_actions():
    vec = multisearch_v0.vector_env(4, strict_actions=True)
    obs, _ = vec.reset(seed=0)
    before = _snapshot(vec)
    actions = {a: np.zeros(4, dtype=np.int64) for a in vec.possible_agents}
    actions["rescuer_0"] = np.where(obs["rescuer_0"]["action_mask"][:, 5] == 1, 0, 5)
    with pytest.raises(ValueError, match="strict_actions"):
        vec.step(actions)
    checks.assert_same(before, _snapshot(vec))
    vec.step({a: np.zeros(4, dtype=np.int64) for a in vec.possible_agents})  # legal: fine


@pytest.mark.parametrize(
    "kwargs,error,needle",
    [
        (dict(grid_size=4, n_targets=8), ValueError, "too small"),
        (dict(grid_size=3, n_scouts=3, n_rescuers=3), ValueError, "too small"),
        (dict(n_scouts=-1), ValueError, "n_scouts"),
        (dict(n_rescuers=0), ValueError, "n_rescuers"),
        (dict(n_targets=0), ValueError, "n_targets"),
        (dict(grid_size=2), ValueError, "grid_size"),
        (dict(obstacle_density=0.9), ValueError, "obstacle_density"),
        (dict(obstacle_density=float("nan")), ValueError, "obstacle_density"),
        (dict(max_cycles=0), ValueError, "max_cycles"),
        (dict(scout_view=-1), ValueError, "scout_view"),
        (dict(minimap_size=0), ValueError, "minimap_size"),
        (dict(penalty_step=-0.1), ValueError, "penalty_step"),
        (dict(reward_target=float("inf")), ValueError, "reward_target"),
        (dict(render_mode="rgb"), ValueError, "render_mode"),
        (dict(preset="huge"), ValueError, "preset"),
        (dict(grid_size=16.0), TypeError, "grid_size"),
        (dict(minimap="yes"), TypeError, "minimap"),
        (dict(n_agents=4), TypeError, "n_agents"),
    ],
)
def test_impossible_constructor_arguments(kwargs, error, needle):
    for make in (multisearch_v0.parallel_env, lambda **kw: multisearch_v0.vector_env(2, **kw)):
        with pytest.raises(error, match=needle):
            make(**kwargs)


def test_vector_env_count_and_autoreset_type():
    with pytest.raises(ValueError, match="num_envs"):
        multisearch_v0.vector_env(0)
    with pytest.raises(TypeError, match="autoreset"):
        multisearch_v0.vector_env(2, autoreset="no")
    with pytest.raises(ValueError, match="reset"):
        multisearch_v0.vector_env(2).step({})


@pytest.mark.parametrize("kwargs", [dict(grid_size="16"), dict(n_agents=4), dict(minimap=1)])
def test_wrong_type_is_both_type_and_value_error(kwargs):
    with pytest.raises(ValueError):
        multisearch_v0.parallel_env(**kwargs)
    with pytest.raises(TypeError):
        multisearch_v0.parallel_env(**kwargs)
