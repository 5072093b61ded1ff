"""PettingZoo's own test suite on multisearch_v0, plus the API details it relies on."""

from __future__ import annotations

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

from envs import multisearch_v0

try:
    import _env_checks as checks
except ImportError:  # pytest --import-mode=importlib does not put tests/ on sys.path
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import _env_checks as checks

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # PettingZoo's style hints


@pytest.mark.parametrize("make", [multisearch_v0.env, multisearch_v0.raw_env])
def test_api_test_aec(make):
    api_test(make(), num_cycles=250)


def test_api_test_family_config():
    api_test(multisearch_v0.env(grid_size=8, n_scouts=1, n_rescuers=3, n_targets=1), 100)


def test_parallel_api_test():
    parallel_api_test(multisearch_v0.parallel_env(), num_cycles=250)


def test_parallel_api_test_memory_preset_short():
    parallel_api_test(multisearch_v0.parallel_env(preset="memory"), num_cycles=50)


def test_seed_tests():
    seed_test(multisearch_v0.env, num_cycles=100)
    parallel_seed_test(multisearch_v0.parallel_env, num_cycles=100)


def test_max_cycles_test():
    max_cycles_test(multisearch_v0)


def test_render_test(monkeypatch):
    for var in ("DISPLAY", "WAYLAND_DISPLAY", "SDL_VIDEODRIVER"):
        monkeypatch.delenv(var, raising=False)  # human mode must fall back to printing
    render_test(multisearch_v0.env)


def test_state_test():
    state_test(multisearch_v0.env(), multisearch_v0.parallel_env())


def test_metadata_and_spaces():
    env = multisearch_v0.parallel_env()
    checks.check_metadata(env, "multisearch_v0")
    assert env.state_space.dtype == np.float32  # before the first reset
    for agent in env.possible_agents:
        n = 5 if agent.startswith("scout_") else 6
        assert env.action_space(agent).n == n
        assert env.observation_space(agent)["action_mask"].dtype == np.int8
        assert env.observation_space(agent)["observation"].dtype == np.float32
        assert env.observation_space(agent) is env.observation_space(agent)


@pytest.mark.parametrize("cast", [int, np.int32, np.int64, np.int8, np.uint8, np.array])
def test_integer_action_types(cast):
    checks.check_integer_action_types(multisearch_v0.parallel_env(), cast)


def test_reset_ignores_unknown_options():
    checks.check_reset_ignores_options(
        multisearch_v0.parallel_env(), options={"unknown": 1, "options": 2}
    )


def test_infos_same_keys_from_reset_and_only_three_reward_keys():
    checks.check_info_keys(multisearch_v0.parallel_env())


def test_render_modes_outputs(capsys, monkeypatch):
    env = multisearch_v0.parallel_env(render_mode="rgb_array")
    env.reset(seed=0)
    frame = env.render()
    g = env.config.grid_size
    assert frame.dtype == np.uint8 and frame.shape[2] == 3 and frame.shape[0] == frame.shape[1]
    assert frame.shape[0] % g == 0
    env = multisearch_v0.parallel_env(render_mode="ansi")
    env.reset(seed=0)
    text = env.render()
    rows = text.splitlines()
    assert len(rows) == g + 3 and all(len(r) == g + 2 for r in rows[: g + 2])
    assert text.count("S") + text.count("R") + text.count("*") >= 1
    for var in ("DISPLAY", "WAYLAND_DISPLAY", "SDL_VIDEODRIVER"):
        monkeypatch.delenv(var, raising=False)
    env = multisearch_v0.parallel_env(render_mode="human")
    env.reset(seed=0)
    capsys.readouterr()
    assert env.render() is None
    assert "collected=" in capsys.readouterr().out
    env.close()
