"""multisearch_v0's ``rescuer_reward_scale``: the rescuers' individual and penalty rewards
scaled, nothing else changed (the whitening_scales study's task)."""

from __future__ import annotations

import numpy as np
import pytest

from envs import multisearch_v0


@pytest.mark.parametrize("scale", [10.0, 100.0])
def test_rescuer_channels_scaled_everything_else_equal(scale: float) -> None:
    plain = multisearch_v0.parallel_env(preset="small")
    scaled = multisearch_v0.parallel_env(preset="small", rescuer_reward_scale=scale)
    obs_p, _ = plain.reset(seed=3)
    obs_s, _ = scaled.reset(seed=3)
    rng = np.random.default_rng(0)
    saw_individual = False
    for _ in range(60):
        actions = {
            a: int(rng.choice(np.flatnonzero(obs_p[a]["action_mask"]))) for a in plain.agents
        }
        obs_p, rew_p, term_p, trunc_p, info_p = plain.step(actions)
        obs_s, rew_s, term_s, trunc_s, info_s = scaled.step(actions)
        assert term_p == term_s and trunc_p == trunc_s
        for a in plain.agents:
            np.testing.assert_array_equal(obs_p[a]["observation"], obs_s[a]["observation"])
            factor = scale if a.startswith("rescuer") else 1.0
            assert info_s[a]["reward_team"] == info_p[a]["reward_team"]
            for key in ("reward_individual", "reward_penalty"):
                assert info_s[a][key] == pytest.approx(factor * info_p[a][key], rel=1e-12)
            expected = info_p[a]["reward_team"] + factor * (
                info_p[a]["reward_individual"] + info_p[a]["reward_penalty"]
            )
            assert rew_s[a] == pytest.approx(expected, rel=1e-12, abs=1e-12)
            saw_individual |= a.startswith("rescuer") and info_p[a]["reward_individual"] != 0
        if not plain.agents:
            break
    assert saw_individual  # the check covered a non-zero individual reward of a rescuer


def test_vector_env_scales_the_same_way() -> None:
    plain = multisearch_v0.vector_env(4, preset="small")
    scaled = multisearch_v0.vector_env(4, preset="small", rescuer_reward_scale=10.0)
    plain.reset(seed=1)
    scaled.reset(seed=1)
    actions = {a: np.zeros(4, dtype=np.int64) for a in plain.agents}
    _, rew_p, _, _, info_p = plain.step(actions)
    _, rew_s, _, _, info_s = scaled.step(actions)
    for a in plain.agents:
        factor = 10.0 if a.startswith("rescuer") else 1.0
        np.testing.assert_allclose(
            info_s[a]["reward_penalty"], factor * info_p[a]["reward_penalty"]
        )
        np.testing.assert_allclose(info_s[a]["reward_team"], info_p[a]["reward_team"])


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan")])
def test_bad_scale_is_a_clear_error(bad: float) -> None:
    with pytest.raises(ValueError, match="rescuer_reward_scale"):
        multisearch_v0.parallel_env(rescuer_reward_scale=bad)
