"""vector_env: equivalence with parallel_env (env i <-> seed s + i) across auto-resets,
final_obs/final_state, autoreset=False freezing, seeding, the trainer contract's shapes."""

from __future__ import annotations

import numpy as np
import pytest

from envs import multisearch_v0

KW_SMALL_EPISODES = dict(grid_size=10, n_scouts=1, n_rescuers=2, n_targets=3, max_cycles=25)


def _actions(rng, masks_by_agent):
    """Mostly-legal random actions [N] per agent from masks [N, n]; sometimes anything."""
    out = {}
    for agent, mask in masks_by_agent.items():
        n_envs, n_actions = mask.shape
        legal_pick = np.argmax((rng.random(mask.shape) + 1.0) * mask, axis=1)
        if n_actions == 6:
            legal_pick = np.where(mask[:, 5] == 1, 5, legal_pick)
        any_pick = rng.integers(0, n_actions, n_envs)
        out[agent] = np.where(rng.random(n_envs) < 0.85, legal_pick, any_pick).astype(np.int64)
    return out


@pytest.mark.parametrize("kwargs", [KW_SMALL_EPISODES, dict(max_cycles=40, minimap=False)])
def test_vector_equals_parallel_across_autoresets(kwargs):
    n_envs, seed, n_steps = 12, 1000, 70
    vec = multisearch_v0.vector_env(n_envs, **kwargs)
    pars = [multisearch_v0.parallel_env(**kwargs) for _ in range(n_envs)]
    v_obs, v_infos = vec.reset(seed=seed)
    p_obs = []
    for i, env in enumerate(pars):
        obs, infos = env.reset(seed=seed + i)
        p_obs.append(obs)
        for agent in vec.possible_agents:
            assert infos[agent] == {k: v[i] for k, v in v_infos[agent].items()}
    rng = np.random.default_rng(0)
    episodes_ended = 0
    for _ in range(n_steps):
        for i, env in enumerate(pars):
            np.testing.assert_array_equal(vec.state()[i], env.state())
            for agent in vec.possible_agents:
                for key in ("observation", "action_mask"):
                    np.testing.assert_array_equal(v_obs[agent][key][i], p_obs[i][agent][key])
        actions = _actions(rng, {a: v_obs[a]["action_mask"] for a in vec.possible_agents})
        v_obs, v_rew, v_term, v_trunc, v_infos = vec.step(actions)
        final_obs, final_state = vec.final_obs, vec.final_state
        for i, env in enumerate(pars):
            obs, rew, term, trunc, infos = env.step({a: actions[a][i] for a in env.agents})
            for agent in vec.possible_agents:
                assert v_rew[agent].dtype == np.float32
                assert v_rew[agent][i] == np.float32(rew[agent])
                assert v_term[agent][i] == term[agent] and v_trunc[agent][i] == trunc[agent]
                assert infos[agent] == {k: v[i] for k, v in v_infos[agent].items()}
                for key in ("observation", "action_mask"):
                    np.testing.assert_array_equal(final_obs[agent][key][i], obs[agent][key])
            np.testing.assert_array_equal(final_state[i], env.state())
            if not env.agents:  # episode ended: vector env i auto-reset from its stream
                episodes_ended += 1
                obs, _ = env.reset()
            p_obs[i] = obs
    assert episodes_ended >= n_envs  # every env crossed at least one auto-reset


def test_autoreset_false_freezes_finished_envs():
    vec = multisearch_v0.vector_env(3, autoreset=False, **KW_SMALL_EPISODES)
    obs, _ = vec.reset(seed=[5, 6, 7])
    stay = {a: np.zeros(3, dtype=np.int64) for a in vec.possible_agents}
    for _ in range(KW_SMALL_EPISODES["max_cycles"]):
        obs, rew, term, trunc, infos = vec.step(stay)
    assert trunc["scout_0"].all() and not term["scout_0"].any()
    frozen_state = vec.state().copy()
    frozen_obs = {a: obs[a]["observation"].copy() for a in vec.possible_agents}
    assert infos["scout_0"]["episode_length"].tolist() == [25.0] * 3
    for _ in range(3):
        obs, rew, term, trunc, infos = vec.step(
            _actions(
                np.random.default_rng(1), {a: obs[a]["action_mask"] for a in vec.possible_agents}
            )
        )
        for agent in vec.possible_agents:
            assert (rew[agent] == 0).all() and trunc[agent].all() and not term[agent].any()
            assert all((v == 0).all() for v in infos[agent].values())
            np.testing.assert_array_equal(obs[agent]["observation"], frozen_obs[agent])
        np.testing.assert_array_equal(vec.state(), frozen_state)
    vec.reset(seed=0)
    _, _, _, trunc, infos = vec.step(stay)
    assert not trunc["scout_0"].any() and (infos["scout_0"]["episode_length"] == 1).all()


def test_seeding_forms():
    vec = multisearch_v0.vector_env(3)
    vec.reset(seed=10)
    by_int = vec.state().copy()
    vec.reset(seed=[10, 11, 12])
    np.testing.assert_array_equal(vec.state(), by_int)
    vec.reset(seed=[12, 11, 10])
    np.testing.assert_array_equal(vec.state(), by_int[::-1])
    vec.reset()  # continues each env's stream: new worlds
    assert not np.array_equal(vec.state(), by_int[::-1])
    with pytest.raises(ValueError, match="sequence of 3"):
        vec.reset(seed=[1, 2])
    with pytest.raises(ValueError, match="seed"):
        vec.reset(seed=-1)


def test_contract_shapes_and_dtypes():
    n = 4
    vec = multisearch_v0.vector_env(n)
    assert vec.num_envs == n and vec.max_cycles == 200
    assert vec.possible_agents == ["scout_0", "scout_1", "rescuer_0", "rescuer_1"]
    obs, infos = vec.reset(seed=0)
    keys = set(infos["scout_0"])
    actions = {a: np.zeros(n, dtype=np.int32) for a in vec.possible_agents}
    obs, rew, term, trunc, infos = vec.step(actions)
    for agent in vec.possible_agents:
        space = vec.observation_space(agent)
        n_actions = vec.action_space(agent).n
        assert obs[agent]["observation"].shape == (n,) + space["observation"].shape
        assert obs[agent]["observation"].dtype == np.float32
        assert obs[agent]["action_mask"].shape == (n, n_actions)
        assert obs[agent]["action_mask"].dtype == np.int8
        for i in range(n):
            assert space.contains(
                {
                    "observation": obs[agent]["observation"][i],
                    "action_mask": obs[agent]["action_mask"][i],
                }
            )
        assert rew[agent].shape == (n,) and term[agent].dtype == np.bool_
        assert set(infos[agent]) == keys
        assert all(v.shape == (n,) and v.dtype.kind == "f" for v in infos[agent].values())
        parts = sum(infos[agent][k] for k in ("reward_team", "reward_individual", "reward_penalty"))
        np.testing.assert_allclose(rew[agent], parts, rtol=1e-6)
    state = vec.state()
    assert state.shape == (n,) + vec.state_space.shape and state.dtype == np.float32
    assert vec.final_obs is obs  # no episode ended: the current observation


def test_vector_arrays_are_fresh_each_step():
    vec = multisearch_v0.vector_env(2)
    obs0, _ = vec.reset(seed=0)
    kept = obs0["scout_0"]["observation"].copy()
    moves = {a: np.full(2, 4 if a.startswith("scout") else 0) for a in vec.possible_agents}
    vec.step(moves)
    np.testing.assert_array_equal(obs0["scout_0"]["observation"], kept)


def test_large_preset_memory_scales_within_budget():
    """Bytes per env of the large preset (world arrays, obs + final obs, state + final state)
    extrapolated to 4096 envs stay far below 2 GB (the benchmark measures the real peak)."""
    n = 16
    vec = multisearch_v0.vector_env(n, preset="large")
    obs, _ = vec.reset(seed=0)
    world = vec._core.nbytes() / n
    obs_bytes = sum(x.nbytes for parts in obs.values() for x in parts.values()) / n
    state_bytes = vec.state().nbytes / n
    per_env = world + 2 * obs_bytes + 2 * state_bytes
    assert per_env * 4096 < 0.5 * 2**30
