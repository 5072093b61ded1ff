"""PettingZoo's own test suite on websearch_v0, v1 and v2, plus the API details it relies on."""

from __future__ import annotations

import importlib
import os
import sys

import numpy as np
import pytest
from pettingzoo.test import (
    api_test,
    max_cycles_test,
    parallel_api_test,
    parallel_seed_test,
    render_test,
    seed_test,
    state_test,
)

from envs import websearch_v0, websearch_v1, websearch_v2

try:
    import _env_checks as checks
except ImportError:  # pytest --import-mode=importlib does not put tests/ on sys.path
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import _env_checks as checks

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # PettingZoo's style hints


#: every version runs PettingZoo's own test suite (one list: v1 and v2 share v0's classes)
VERSIONS = pytest.mark.parametrize(
    "module", [websearch_v0, websearch_v1, websearch_v2], ids=["v0", "v1", "v2"]
)


@VERSIONS
@pytest.mark.parametrize("factory", ["env", "raw_env"])
def test_api_test_aec(module, factory):
    api_test(getattr(module, factory)(), num_cycles=200)


@VERSIONS
@pytest.mark.parametrize("preset", ["easy", "hard"])
def test_api_test_presets(module, preset):
    api_test(module.env(preset=preset), num_cycles=100)


@VERSIONS
def test_parallel_api_test(module):
    parallel_api_test(module.parallel_env(), num_cycles=300)
    parallel_api_test(module.parallel_env(preset="hard", max_answers=3), num_cycles=100)


@VERSIONS
def test_seed_tests(module):
    seed_test(module.env, num_cycles=100)
    parallel_seed_test(module.parallel_env, num_cycles=100)


@VERSIONS
def test_max_cycles_test(module):
    max_cycles_test(module)


@VERSIONS
def test_render_test(module, monkeypatch):
    for var in ("DISPLAY", "WAYLAND_DISPLAY", "SDL_VIDEODRIVER"):
        monkeypatch.delenv(var, raising=False)
    render_test(module.env)


@VERSIONS
def test_state_test(module):
    state_test(module.env(), module.parallel_env())


def test_metadata_spaces_and_agent_types():
    env = websearch_v0.parallel_env()
    checks.check_metadata(env, "websearch_v0")
    assert env.possible_agents == ["querier_0", "browser_0", "browser_1"]
    assert {a.rsplit("_", 1)[0] for a in env.possible_agents} == {"querier", "browser"}
    assert env.state_space.dtype == np.float32 and env.state_space.shape == (240,)
    for agent in env.possible_agents:
        querier = agent.startswith("querier_")
        assert env.action_space(agent).n == (19 if querier else 9)
        space = env.observation_space(agent)
        assert space["observation"].shape == ((192,) if querier else (56,))
        assert space["action_mask"].dtype == np.int8
        assert space["observation"].dtype == np.float32
        assert env.observation_space(agent) is space
    hard = websearch_v0.parallel_env(preset="hard")
    assert hard.possible_agents == ["querier_0", "querier_1", "browser_0", "browser_1"]
    assert hard.state_space.shape == (43 + 6 * 30 + 5 * 2 + 67 * 2,)


def test_baselines_module_is_named_and_importable():
    assert websearch_v0.BASELINES == "envs.websearch_baselines"
    module = importlib.import_module(websearch_v0.BASELINES)
    for name in ("HeuristicPolicy", "RandomPolicy", "OraclePolicy", "evaluate_websearch_baseline"):
        assert hasattr(module, name)


@pytest.mark.parametrize("cast", [int, np.int32, np.int64, np.int8, np.uint8, np.array])
def test_integer_action_types(cast):
    checks.check_integer_action_types(websearch_v0.parallel_env(), cast)


def test_reset_ignores_unknown_options():
    checks.check_reset_ignores_options(websearch_v0.parallel_env(), options={"unknown": 1})


def test_infos_same_keys_from_reset_and_only_three_reward_keys():
    keys = checks.check_info_keys(websearch_v0.parallel_env())
    assert keys == set(websearch_v0.INFO_KEYS)
    assert {
        "success",
        "steps_to_success",
        "queries_issued",
        "query_diversity",
        "query_jaccard_diversity",
        "pages_opened",
    } <= keys


def test_render_modes_outputs(capsys):
    env = websearch_v0.parallel_env(render_mode="rgb_array")
    env.reset(seed=0)
    env.step({"querier_0": 3, "browser_0": 0, "browser_1": 0})
    env.step({"querier_0": 1, "browser_0": 0, "browser_1": 0})
    frame = env.render()
    top_k = env.config.top_k
    assert frame.dtype == np.uint8 and frame.shape == ((top_k + 2) * 10, 200, 3)
    env = websearch_v0.parallel_env(render_mode="ansi")
    env.reset(seed=0)
    env.step({"querier_0": 3, "browser_0": 0, "browser_1": 0})
    env.step({"querier_0": 1, "browser_0": 0, "browser_1": 0})
    text = env.render()
    assert "description:" in text and "querier_0 draft" in text and "browser_1" in text
    env = websearch_v0.parallel_env(render_mode="human")
    env.reset(seed=0)
    capsys.readouterr()
    assert env.render() is None
    assert "description:" in capsys.readouterr().out
    env.close()


def test_module_doc_example_runs():
    import doctest

    failures, tests = doctest.testmod(websearch_v0, verbose=False)
    assert tests > 0 and failures == 0
