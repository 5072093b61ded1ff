"""Checks every native env must pass (multisearch_v0, websearch_v0/v1/v2), called by each env's
test files with that env's factories, agents and actions."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pytest

REWARD_KEYS = ("reward_team", "reward_individual", "reward_penalty")

Snapshot = Callable[[Any], list]


def assert_same(a: list, b: list) -> None:
    """Two snapshots (lists of arrays and plain values) are equal."""
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        if isinstance(x, np.ndarray):
            np.testing.assert_array_equal(x, y)
        else:
            assert x == y


# ---- parallel env ------------------------------------------------------------------------
def check_bad_action_changes_nothing(
    make: Callable[[], Any],
    snapshot: Snapshot,
    agent: str,
    action: Any,
    good: Mapping[str, int],
    watched: str,
    before_steps: tuple[Mapping[str, int], ...] = (),
) -> None:
    """After ``reset(seed=0)`` and ``before_steps``, ``action`` for ``agent`` is a ValueError
    naming the agent and what is allowed; nothing changes, and the env then steps (``good``)
    exactly like an untouched twin (``watched``'s observation)."""
    env, twin = make(), make()
    for e in (env, twin):
        e.reset(seed=0)
        for actions in before_steps:
            e.step(actions)
    before = snapshot(env)
    actions = {a: 0 for a in env.agents}
    actions[agent] = action
    with pytest.raises(ValueError) as err:
        env.step(actions)
    message = str(err.value)
    assert agent in message and "allowed" in message
    assert_same(before, snapshot(env))
    np.testing.assert_array_equal(
        env.step(good)[0][watched]["observation"], twin.step(good)[0][watched]["observation"]
    )


def check_missing_or_unknown_agent(
    env: Any, snapshot: Snapshot, mutate: Callable[[dict], Any], needle: str
) -> None:
    env.reset(seed=1)
    before = snapshot(env)
    actions = {a: 0 for a in env.agents}
    mutate(actions)
    with pytest.raises(ValueError, match="one entry per live agent") as err:
        env.step(actions)
    assert needle in str(err.value)
    assert_same(before, snapshot(env))


def check_integer_action_types(env: Any, cast: Callable[[int], Any]) -> None:
    """Integer actions of any kind give Python bools and floats back."""
    env.reset(seed=0)
    _, rew, term, trunc, infos = env.step({a: cast(0) for a in env.agents})
    assert all(type(v) is bool for v in [*term.values(), *trunc.values()])
    assert all(type(v) is float for v in rew.values())
    assert all(type(v) is float for info in infos.values() for v in info.values())


def check_reset_ignores_options(env: Any, options: dict) -> None:
    a, _ = env.reset(seed=3, options=options)
    b, _ = env.reset(seed=3)
    for agent in a:
        np.testing.assert_array_equal(a[agent]["observation"], b[agent]["observation"])


def check_info_keys(env: Any) -> set[str]:
    """The same info keys from reset on, exactly three of them reward channels; returns them."""
    _, infos = env.reset(seed=0)
    keys = set(infos[env.possible_agents[0]])
    assert {k for k in keys if k.startswith("reward_")} == set(REWARD_KEYS)
    _, _, _, _, infos = env.step({a: 0 for a in env.agents})
    assert all(set(info) == keys for info in infos.values())
    return keys


def check_metadata(env: Any, name: str) -> None:
    assert env.metadata["name"] == name
    assert env.metadata["is_parallelizable"] is True
    assert env.metadata["render_fps"] > 0
    assert set(env.metadata["render_modes"]) == {"human", "rgb_array", "ansi"}


# ---- vector env --------------------------------------------------------------------------
def check_vector_bad_actions(
    vec: Any,
    snapshot: Snapshot,
    out_of_range: tuple[str, int],
    negative: str,
    malformed: str,
    missing: str,
) -> None:
    """A value out of range (``out_of_range``: agent, value; it names env 1) or negative, a
    float array, a wrong shape and a scalar (``malformed``), a missing and an unknown agent:
    each a ValueError naming the agent; nothing changes. ``vec`` has 3 envs."""
    vec.reset(seed=0)
    before = snapshot(vec)
    good = {a: np.zeros(3, dtype=np.int64) for a in vec.possible_agents}
    agent, value = out_of_range
    cases = [
        ({**good, agent: np.array([0, value, 0])}, agent),
        ({**good, negative: np.array([0, 0, -2])}, negative),
        ({**good, malformed: np.zeros(3, dtype=np.float32)}, malformed),
        ({**good, malformed: np.zeros(2, dtype=np.int64)}, malformed),
        ({**good, malformed: 0}, malformed),
        ({k: v for k, v in good.items() if k != missing}, missing),
        ({**good, "medic_0": np.zeros(3, dtype=np.int64)}, "medic_0"),
    ]
    for actions, needle in cases:
        with pytest.raises(ValueError) as err:
            vec.step(actions)
        assert needle in str(err.value)
        assert_same(before, snapshot(vec))
    with pytest.raises(ValueError) as err:
        vec.step({**good, agent: np.array([0, value, 0])})
    assert "in env 1" in str(err.value)


def check_seeding_forms(vec: Any) -> None:
    """int s = (s, s + 1, ...); a sequence seeds each env; None continues each stream; bad
    seeds are ValueErrors."""
    assert vec.num_envs == 3
    vec.reset(seed=10)
    by_int = vec.state().copy()
    vec.reset(seed=[10, 11, 12])
    np.testing.assert_array_equal(vec.state(), by_int)
    vec.reset(seed=[12, 11, 10])
    np.testing.assert_array_equal(vec.state(), by_int[::-1])
    vec.reset()  # continues each env's stream: new episodes
    assert not np.array_equal(vec.state(), by_int[::-1])
    with pytest.raises(ValueError, match="sequence of 3"):
        vec.reset(seed=[1, 2])
    with pytest.raises(ValueError, match="seed"):
        vec.reset(seed=-1)


def check_contract_shapes(vec: Any, actions: Mapping[str, np.ndarray]) -> dict:
    """The trainers' contract (docs/CONTRACTS.md section 1): shapes and dtypes of a step's
    outputs, rewards = the sum of the channels, the same info keys as at reset; returns obs."""
    n = vec.num_envs
    obs, infos = vec.reset(seed=0)
    keys = set(infos[vec.possible_agents[0]])
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
        parts = sum(infos[agent][k] for k in REWARD_KEYS)
        np.testing.assert_allclose(rew[agent], parts, rtol=1e-6)
    state = vec.state()
    assert state.shape == (n,) + vec.state_space.shape and state.dtype == np.float32
    assert vec.final_obs is obs  # no episode ended: the current observation
    return obs


def check_autoreset_false_freezes(
    vec: Any,
    random_actions: Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]],
    final_infos: Mapping[str, float],
) -> None:
    """With ``autoreset=False`` envs truncated after ``max_cycles`` stay frozen (zero rewards
    and infos, flags kept, obs and state unchanged) until ``reset``. ``final_infos``: info
    values every env has at truncation; ``random_actions(masks)``: actions for the frozen
    steps."""
    n = vec.num_envs
    first = vec.possible_agents[0]
    obs, _ = vec.reset(seed=[5 + i for i in range(n)])
    stay = {a: np.zeros(n, dtype=np.int64) for a in vec.possible_agents}
    for _ in range(vec.max_cycles):
        obs, rew, term, trunc, infos = vec.step(stay)
    assert trunc[first].all() and not term[first].any()
    frozen_state = vec.state().copy()
    frozen_obs = {a: obs[a]["observation"].copy() for a in vec.possible_agents}
    for key, value in final_infos.items():
        assert infos[first][key].tolist() == [value] * n
    for _ in range(3):
        obs, rew, term, trunc, infos = vec.step(
            random_actions({a: obs[a]["action_mask"] for a in vec.possible_agents})
        )
        for agent in vec.possible_agents:
            assert (rew[agent] == 0).all() and trunc[agent].all() and not term[agent].any()
            assert all((v == 0).all() for v in infos[agent].values())
            np.testing.assert_array_equal(obs[agent]["observation"], frozen_obs[agent])
        np.testing.assert_array_equal(vec.state(), frozen_state)
    vec.reset(seed=0)
    _, _, _, trunc, infos = vec.step(stay)
    assert not trunc[first].any() and (infos[first]["episode_length"] == 1).all()


def check_vector_equals_parallel(
    vec: Any,
    pars: list,
    seed: int,
    n_steps: int,
    random_actions: Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]],
) -> list[dict[str, float]]:
    """Env i of ``vec`` reset with ``seed + i`` equals ``pars[i]`` reset likewise, step by step
    across auto-resets (a parallel env whose episode ended is reset from its own stream):
    observations, masks, state, rewards (float32), flags, infos, ``final_obs`` and
    ``final_state``. Every env crosses an auto-reset. Returns the first agent's infos at each
    episode's end."""
    first = vec.possible_agents[0]
    v_obs, v_infos = vec.reset(seed=seed)
    p_obs = []
    for i, env in enumerate(pars):
        obs, infos = env.reset(seed=seed + i)
        p_obs.append(obs)
        for agent in vec.possible_agents:
            assert infos[agent] == {k: v[i] for k, v in v_infos[agent].items()}
    ended_infos = []
    for _ in range(n_steps):
        state = vec.state()
        for i, env in enumerate(pars):
            np.testing.assert_array_equal(state[i], env.state())
            for agent in vec.possible_agents:
                for key in ("observation", "action_mask"):
                    np.testing.assert_array_equal(v_obs[agent][key][i], p_obs[i][agent][key])
        actions = random_actions({a: v_obs[a]["action_mask"] for a in vec.possible_agents})
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
                ended_infos.append(infos[first])
                obs, _ = env.reset()
            p_obs[i] = obs
    assert len(ended_infos) >= len(pars)  # every env crossed at least one auto-reset
    return ended_infos
