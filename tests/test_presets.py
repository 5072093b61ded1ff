"""The task-ladder presets and the route_hint option (envs.multisearch_v0)."""

from __future__ import annotations

import numpy as np

from envs import multisearch_v0
from envs._multisearch_core import make_config


def test_sparse_preset_rewards_only_collecting_and_finishing():
    cfg = make_config("sparse")
    assert cfg.reward_report == cfg.reward_explore == 0.0
    assert cfg.penalty_revisit == cfg.penalty_invalid == 0.0
    assert cfg.penalty_step == 0.01 and cfg.reward_target > 0 and cfg.reward_complete > 0
    assert cfg.route_hint is False and make_config("hard").route_hint is False
    vec = multisearch_v0.vector_env(8, preset="sparse")
    vec.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(60):
        actions = {
            a: np.array([rng.choice(np.flatnonzero(m)) for m in vec._obs[a]["action_mask"]])
            for a in vec.possible_agents
        }
        _, rewards, _, _, infos = vec.step(actions)
        for a in vec.possible_agents:
            # nothing but the step cost unless a target was collected
            ind, pen = infos[a]["reward_individual"], infos[a]["reward_penalty"]
            np.testing.assert_allclose(pen, -0.01 * (infos[a]["episode_length"] > 0))
            assert set(np.round(ind, 6)) <= {0.0, 0.5}


def test_route_hint_false_zeros_only_the_route_part():
    on = multisearch_v0.vector_env(4, preset="small")
    off = multisearch_v0.vector_env(4, preset="small", route_hint=False)
    obs_on, _ = on.reset(seed=3)
    obs_off, _ = off.reset(seed=3)
    rng = np.random.default_rng(1)
    seen_route = False
    for _ in range(40):
        for a in on.possible_agents:
            x, y = obs_on[a]["observation"], obs_off[a]["observation"]
            np.testing.assert_array_equal(x[:, :-3], y[:, :-3])  # everything else equal
            assert not y[:, -3:].any()
            seen_route |= bool(x[:, -1].any())
        actions = {
            a: np.array([rng.choice(np.flatnonzero(m)) for m in obs_on[a]["action_mask"]])
            for a in on.possible_agents
        }
        obs_on, *_ = on.step(actions)
        obs_off, *_ = off.step(actions)
    assert seen_route  # the default does give routes, so the comparison above is not empty
