"""websearch_v0, bad input: clear errors, and nothing changes."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from envs import websearch_v0
from envs.websearch.kernels import STANDALONE_FIELDS

try:
    import _env_checks as checks
except ImportError:  # pytest --import-mode=importlib does not put tests/ on sys.path
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import _env_checks as checks


def _snapshot(env):
    """Every episode array of the core (the bundles and the rest), and the live agents."""
    core = env._core
    arrays = [a.copy() for a in core._bundles.values()]
    arrays += [getattr(core, f).copy() for f in STANDALONE_FIELDS]
    return arrays + [list(env.agents)]


BAD_ACTIONS = [
    (19, "querier_0"),  # out of range for a querier (Discrete(19))
    (9, "browser_0"),
    (-1, "browser_1"),
    (1.0, "querier_0"),  # wrong types
    (np.float32(2), "browser_1"),
    (True, "querier_0"),
    ("1", "browser_0"),
    (None, "querier_0"),
    (np.array([1, 2]), "querier_0"),
]


@pytest.mark.parametrize("action,agent", BAD_ACTIONS)
def test_parallel_bad_action_raises_and_changes_nothing(action, agent):
    checks.check_bad_action_changes_nothing(
        websearch_v0.parallel_env,
        _snapshot,
        agent,
        action,
        good={"querier_0": 1, "browser_0": 0, "browser_1": 0},
        watched="browser_0",
        before_steps=({"querier_0": 3, "browser_0": 0, "browser_1": 0},),
    )


@pytest.mark.parametrize(
    "mutate,needle",
    [
        (lambda acts: acts.pop("browser_1"), "missing: ['browser_1']"),
        (lambda acts: acts.update(querier_9=0), "querier_9"),
        (lambda acts: acts.update(browser=0), "browser"),
    ],
)
def test_parallel_missing_or_unknown_agent(mutate, needle):
    checks.check_missing_or_unknown_agent(websearch_v0.parallel_env(), _snapshot, mutate, needle)


def test_step_without_reset_or_after_end():
    env = websearch_v0.parallel_env(max_cycles=1)
    with pytest.raises(ValueError, match="reset"):
        env.step({})
    env.reset(seed=0)
    env.step({a: 0 for a in env.agents})
    with pytest.raises(ValueError, match="reset"):
        env.step({a: 0 for a in env.possible_agents})
    with pytest.raises(ValueError, match="actions must be a dict"):
        env.reset(seed=0)
        env.step([0, 0, 0])


def test_masked_action_default_is_penalised_noop():
    env = websearch_v0.parallel_env()
    obs, _ = env.reset(seed=0)
    assert obs["querier_0"]["action_mask"][1] == 0  # nothing to issue yet
    assert obs["browser_0"]["action_mask"][1] == 0  # nothing to open
    before = _snapshot(env)
    _, rew, _, _, infos = env.step({"querier_0": 1, "browser_0": 8, "browser_1": 0})
    cfg = env.config
    for agent in ("querier_0", "browser_0"):
        assert infos[agent]["invalid_action"] == 1.0
        assert infos[agent]["reward_penalty"] == pytest.approx(
            -cfg.penalty_step - cfg.penalty_invalid
        )
    assert infos["browser_1"]["invalid_action"] == 0.0
    assert infos["querier_0"]["queries_issued"] == 0.0
    assert int(env._core.t[0]) == 1  # only time moved
    env._core.t[0] = 0
    checks.assert_same(before, _snapshot(env))


def test_strict_actions_raises_and_changes_nothing():
    env = websearch_v0.parallel_env(strict_actions=True)
    env.reset(seed=0)
    before = _snapshot(env)
    with pytest.raises(ValueError, match="strict_actions") as err:
        env.step({"querier_0": 0, "browser_0": 6, "browser_1": 0})
    assert "browser_0" in str(err.value) and "legal actions" in str(err.value)
    assert "next" in str(err.value)
    checks.assert_same(before, _snapshot(env))
    env.step({"querier_0": 3, "browser_0": 0, "browser_1": 0})  # legal: fine


def test_vector_bad_actions():
    checks.check_vector_bad_actions(
        websearch_v0.vector_env(3),
        _snapshot,
        out_of_range=("querier_0", 19),
        negative="browser_0",
        malformed="browser_1",
        missing="browser_1",
    )


def test_vector_strict_actions():
    vec = websearch_v0.vector_env(4, strict_actions=True)
    vec.reset(seed=0)
    before = _snapshot(vec)
    actions = {a: np.zeros(4, dtype=np.int64) for a in vec.possible_agents}
    actions["browser_1"] = np.array([0, 0, 7, 0])  # previous page on the first page
    with pytest.raises(ValueError, match="strict_actions") as err:
        vec.step(actions)
    assert "env 2" in str(err.value) and "prev" in str(err.value)
    checks.assert_same(before, _snapshot(vec))
    vec.step({a: np.zeros(4, dtype=np.int64) for a in vec.possible_agents})  # legal: fine


@pytest.mark.parametrize(
    "kwargs,error,needle",
    [
        (dict(n_queriers=0), ValueError, "n_queriers"),
        (dict(n_browsers=0), ValueError, "n_browsers"),
        (dict(n_entities=1), ValueError, "n_entities"),
        (dict(top_k=10), ValueError, "top_k"),
        (dict(n_variants=3, n_details=2), ValueError, "n_variants"),
        (dict(attributes_per_entity=4), ValueError, "attributes_per_entity"),
        (dict(n_attributes=2), ValueError, "attributes_per_entity"),
        (dict(p_synonym=1.5), ValueError, "p_synonym"),
        (dict(p_canonical=float("nan")), ValueError, "p_canonical"),
        (dict(max_cycles=0), ValueError, "max_cycles"),
        (dict(max_query_terms=0), ValueError, "max_query_terms"),
        (dict(max_answers=0), ValueError, "max_answers"),
        (dict(penalty_step=-0.1), ValueError, "penalty_step"),
        (dict(reward_found=float("inf")), ValueError, "reward_found"),
        (dict(render_mode="rgb"), ValueError, "render_mode"),
        (dict(preset="huge"), ValueError, "preset"),
        (dict(top_k=20.0), TypeError, "top_k"),
        (dict(strict_actions="yes"), TypeError, "strict_actions"),
        (dict(n_agents=4), TypeError, "n_agents"),
    ],
)
def test_impossible_constructor_arguments(kwargs, error, needle):
    for make in (websearch_v0.parallel_env, lambda **kw: websearch_v0.vector_env(2, **kw)):
        with pytest.raises(error, match=needle):
            make(**kwargs)


def test_vector_env_count_and_autoreset_type():
    with pytest.raises(ValueError, match="num_envs"):
        websearch_v0.vector_env(0)
    with pytest.raises(TypeError, match="autoreset"):
        websearch_v0.vector_env(2, autoreset="no")
    with pytest.raises(ValueError, match="reset"):
        websearch_v0.vector_env(2).step({})
    with pytest.raises(ValueError, match="max_cycles"):
        websearch_v0.parallel_env().max_cycles = 0


@pytest.mark.parametrize("kwargs", [dict(top_k="20"), dict(n_agents=4), dict(strict_actions=1)])
def test_wrong_type_is_both_type_and_value_error(kwargs):
    with pytest.raises(ValueError):
        websearch_v0.parallel_env(**kwargs)
    with pytest.raises(TypeError):
        websearch_v0.parallel_env(**kwargs)
