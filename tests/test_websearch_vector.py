"""websearch_v0 vector_env: equivalence with parallel_env (env i <-> seed s + i) across
auto-resets over many seeds (websearch_v1 too), final_obs/final_state, autoreset=False
freezing, seeding, full-episode determinism, the trainer contract's shapes."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from envs import websearch_v0, websearch_v1, websearch_v2

try:
    import _env_checks as checks
except ImportError:  # pytest --import-mode=importlib does not put tests/ on sys.path
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import _env_checks as checks

KW_SHORT = dict(preset="easy", max_cycles=12, max_answers=2)


def _actions(rng, masks_by_agent):
    """Mostly-legal random actions [N] per agent (issuing and marking often); sometimes
    anything in range."""
    out = {}
    for agent, mask in masks_by_agent.items():
        n_envs, n_actions = mask.shape
        pick = np.argmax((rng.random(mask.shape) + 1.0) * mask, axis=1)
        if agent.startswith("querier"):
            pick = np.where((mask[:, 1] == 1) & (rng.random(n_envs) < 0.3), 1, pick)
        else:
            pick = np.where((mask[:, 8] == 1) & (rng.random(n_envs) < 0.15), 8, pick)
        anything = rng.integers(0, n_actions, n_envs)
        out[agent] = np.where(rng.random(n_envs) < 0.9, pick, anything).astype(np.int64)
    return out


@pytest.mark.parametrize(
    "module", [websearch_v0, websearch_v1, websearch_v2], ids=["v0", "v1", "v2"]
)
@pytest.mark.parametrize(
    "kwargs,n_envs,n_steps",
    [
        (KW_SHORT, 64, 40),
        (dict(preset="default", max_cycles=15), 48, 50),
        (dict(preset="hard", max_cycles=10, max_answers=3), 24, 30),
    ],
)
def test_vector_equals_parallel_across_autoresets(module, kwargs, n_envs, n_steps):
    vec = module.vector_env(n_envs, **kwargs)
    pars = [module.parallel_env(**kwargs) for _ in range(n_envs)]
    rng = np.random.default_rng(0)
    ended = checks.check_vector_equals_parallel(
        vec, pars, 1000, n_steps, lambda masks: _actions(rng, masks)
    )
    if kwargs is KW_SHORT:
        assert sum(info["success"] == 1.0 for info in ended) > 0


def test_full_episode_determinism():
    def run(seed):
        vec = websearch_v0.vector_env(6, preset="default", max_cycles=25)
        obs, _ = vec.reset(seed=seed)
        rng = np.random.default_rng(5)
        trace = []
        for _ in range(60):
            actions = _actions(rng, {a: obs[a]["action_mask"] for a in vec.possible_agents})
            obs, rew, term, trunc, infos = vec.step(actions)
            trace.append(
                (
                    {a: obs[a]["observation"].copy() for a in obs},
                    {a: rew[a].copy() for a in rew},
                    term["querier_0"].copy(),
                    {k: v.copy() for k, v in infos["browser_0"].items()},
                    vec.state().copy(),
                )
            )
        return trace

    a, b = run(3), run(3)
    for x, y in zip(a, b, strict=True):
        for part_x, part_y in zip(x, y, strict=True):
            if isinstance(part_x, dict):
                for key in part_x:
                    np.testing.assert_array_equal(part_x[key], part_y[key])
            else:
                np.testing.assert_array_equal(part_x, part_y)
    c = run(4)
    assert not np.array_equal(a[0][4], c[0][4])


def test_autoreset_false_freezes_finished_envs():
    rng = np.random.default_rng(1)
    checks.check_autoreset_false_freezes(
        websearch_v0.vector_env(3, autoreset=False, **KW_SHORT),
        lambda masks: _actions(rng, masks),
        final_infos={"episode_length": 12.0, "steps_to_success": 12.0},
    )


def test_seeding_forms():
    checks.check_seeding_forms(websearch_v0.vector_env(3))


def test_parallel_reset_none_continues_the_stream_like_the_vector_env():
    env = websearch_v0.parallel_env(preset="easy")
    vec = websearch_v0.vector_env(1, preset="easy", max_cycles=1)
    env.reset(seed=9)
    vec.reset(seed=9)
    for _ in range(20):  # 20 tasks in a row: across the uniform blocks drawn ahead
        np.testing.assert_array_equal(env.state(), vec.state()[0])
        env.reset()
        vec.step({a: np.zeros(1, dtype=np.int64) for a in vec.possible_agents})


def test_contract_shapes_and_dtypes():
    n = 4
    vec = websearch_v0.vector_env(n)
    assert vec.num_envs == n and vec.max_cycles == 40
    assert vec.possible_agents == ["querier_0", "browser_0", "browser_1"]
    actions = {a: np.zeros(n, dtype=np.int32) for a in vec.possible_agents}
    actions["querier_0"] = np.full(n, 3, dtype=np.int32)
    checks.check_contract_shapes(vec, actions)
    assert vec.state_space.contains(vec.state()[0])


def test_vector_arrays_are_fresh_each_step():
    vec = websearch_v0.vector_env(2)
    obs0, infos0 = vec.reset(seed=0)
    kept = obs0["querier_0"]["observation"].copy()
    kept_info = infos0["querier_0"]["episode_length"].copy()
    vec.step(
        {"querier_0": np.full(2, 3), "browser_0": np.zeros(2, int), "browser_1": np.zeros(2, int)}
    )
    np.testing.assert_array_equal(obs0["querier_0"]["observation"], kept)
    np.testing.assert_array_equal(infos0["querier_0"]["episode_length"], kept_info)


def test_query_log_grows_past_its_initial_capacity():
    vec = websearch_v0.vector_env(2, preset="easy", max_cycles=3)
    vec.reset(seed=0)
    vec.max_cycles = 200  # a writable attribute, read at every step
    toggle = {"querier_0": np.full(2, 3), "browser_0": np.zeros(2, int)}
    issue = {"querier_0": np.full(2, 1), "browser_0": np.zeros(2, int)}
    vec.step(toggle)
    for _ in range(30):
        _, _, _, trunc, infos = vec.step(issue)
    assert not trunc["querier_0"].any()
    assert infos["querier_0"]["queries_issued"].tolist() == [30.0, 30.0]
    assert infos["querier_0"]["query_diversity"].tolist() == [1 / 30, 1 / 30]
    assert len(vec.queries(0)) == 30


def test_memory_per_env_is_small():
    vec = websearch_v0.vector_env(16, preset="hard")
    obs, _ = vec.reset(seed=0)
    per_env = vec._core.nbytes() / 16
    obs_bytes = sum(x.nbytes for parts in obs.values() for x in parts.values()) / 16
    assert (per_env + 2 * obs_bytes) * 4096 < 0.5 * 2**30
