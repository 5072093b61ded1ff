"""The adapter for outside envs (marl.adapters via marl.adapters.envapi.make_vector_env).

References are independent of the adapter: the native multisearch vector env, and single
Gymnasium / PettingZoo envs stepped by hand in a plain loop.
"""

from __future__ import annotations

import functools
import importlib
import pickle

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces
from pettingzoo import ParallelEnv

from envs import multisearch_v0
from marl.adapters import AdaptedVectorEnv, UnsupportedSpaceError, make_encoder
from marl.adapters.envapi import make_vector_env
from marl.models.policies import AgentLayout

MS = "envs.multisearch_v0:"
#: small worlds where random rescuers sometimes collect everything (terminations) and the
#: time limit ends the rest (truncations)
MS_KW = {"grid_size": 6, "n_targets": 1, "max_cycles": 12, "obstacle_density": 0.0}
CHANNELS = ("reward_team", "reward_individual", "reward_penalty")


def random_actions(vec, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {a: rng.integers(0, vec.action_space(a).n, vec.num_envs) for a in vec.possible_agents}


def assert_obs_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for agent in a:
        np.testing.assert_array_equal(a[agent]["observation"], b[agent]["observation"])
        np.testing.assert_array_equal(a[agent]["action_mask"], b[agent]["action_mask"])


# ------------------------------------------------------------------ equality with the native


@pytest.mark.parametrize("autoreset", [True, False])
def test_adapter_over_parallel_env_equals_native_vector_env(autoreset):
    n = 5
    native = make_vector_env(MS + "vector_env", n, MS_KW, autoreset=autoreset)
    adapted = make_vector_env(MS + "parallel_env", n, MS_KW, autoreset=autoreset)
    assert isinstance(adapted, AdaptedVectorEnv) and not isinstance(native, AdaptedVectorEnv)
    assert adapted.possible_agents == native.possible_agents
    assert adapted.max_cycles == native.max_cycles and adapted.autoreset == autoreset
    assert adapted.state_space.shape == native.state_space.shape
    for a in native.possible_agents:
        assert adapted.action_space(a).n == native.action_space(a).n
        assert (
            adapted.observation_space(a)["observation"].shape
            == native.observation_space(a)["observation"].shape
        )
    rng = np.random.default_rng(1)
    ends = {"terminated": 0, "truncated": 0}
    for seed in (3, [11, 12, 13, 14, 99]):  # reset with an int, then with a list
        obs_n, info_n = native.reset(seed=seed)
        obs_a, info_a = adapted.reset(seed=seed)
        assert_obs_equal(obs_a, obs_n)
        np.testing.assert_array_equal(adapted.state(), native.state())
        for _ in range(40):  # > 3 episodes of max_cycles 12: several resets per env
            actions = random_actions(native, rng)
            out_n = native.step(actions)
            out_a = adapted.step(actions)
            assert_obs_equal(out_a[0], out_n[0])
            for k in (1, 2, 3):  # rewards, terminations, truncations
                for a in native.possible_agents:
                    np.testing.assert_allclose(out_a[k][a], out_n[k][a], rtol=0, atol=1e-6)
            for a in native.possible_agents:
                for key, value in out_n[4][a].items():  # every native info key, channels too
                    np.testing.assert_allclose(out_a[4][a][key], value, atol=1e-12, err_msg=key)
                assert set(np.unique(out_a[4][a]["active"])) <= {0.0, 1.0}
            np.testing.assert_array_equal(adapted.state(), native.state())
            assert_obs_equal(adapted.final_obs, native.final_obs)
            np.testing.assert_array_equal(adapted.final_state, native.final_state)
            a0 = native.possible_agents[0]
            ends["terminated"] += int(out_n[2][a0].sum())
            ends["truncated"] += int(out_n[3][a0].sum())
    assert ends["truncated"] > 0 and (ends["terminated"] > 0 or not autoreset), ends


def test_adapter_reset_seeds_copy_i_with_s_plus_i():
    vec = make_vector_env(MS + "parallel_env", 3, MS_KW)
    obs, _ = vec.reset(seed=7)
    for i in range(3):
        single = multisearch_v0.parallel_env(**MS_KW)
        ref, _ = single.reset(seed=7 + i)
        for a in vec.possible_agents:
            np.testing.assert_array_equal(obs[a]["observation"][i], ref[a]["observation"])
    with pytest.raises(ValueError, match="sequence of 3 ints"):
        vec.reset(seed=[1, 2])
    with pytest.raises(ValueError, match="seed must be >= 0"):
        vec.reset(seed=-1)


def test_native_factory_is_passed_through_untouched():
    vec = make_vector_env(MS + "vector_env", 2, {"preset": "small"})
    assert isinstance(vec, multisearch_v0.MultiSearchVectorEnv)
    with pytest.raises(ValueError, match="native vector-env factory.*adapter_team_reward"):
        make_vector_env(MS + "vector_env", 2, {"adapter_team_reward": "sum"})


# ------------------------------------------------------------------ Gymnasium: a team of one


def test_gymnasium_make_cartpole_matches_single_envs_with_both_endings():
    n = 4
    kw = {"id": "CartPole-v1", "max_episode_steps": 15}
    vec = make_vector_env("gymnasium:make", n, kw)
    assert vec.possible_agents == ["agent_0"] and vec.max_cycles == 15
    layout = AgentLayout.from_env(vec)
    assert layout.type_names == ("agent",) and layout.state_dim == 4
    refs = [gymnasium.make("CartPole-v1", max_episode_steps=15) for _ in range(n)]
    obs, _ = vec.reset(seed=20)
    ref_obs = [env.reset(seed=20 + i)[0] for i, env in enumerate(refs)]
    np.testing.assert_array_equal(obs["agent_0"]["observation"], np.stack(ref_obs))
    rng = np.random.default_rng(0)
    seen = {"terminated": 0, "truncated": 0}
    for _ in range(60):
        actions = rng.integers(0, 2, n)
        obs, rewards, terms, truncs, infos = vec.step({"agent_0": actions})
        for i, env in enumerate(refs):
            o, r, te, tr, _ = env.step(int(actions[i]))
            assert terms["agent_0"][i] == te and truncs["agent_0"][i] == (tr and not te)
            assert rewards["agent_0"][i] == r
            assert infos["agent_0"]["reward_individual"][i] == r  # own reward
            assert infos["agent_0"]["reward_team"][i] == r  # mean over a team of one
            assert infos["agent_0"]["reward_penalty"][i] == 0.0
            np.testing.assert_array_equal(vec.final_obs["agent_0"]["observation"][i], o)
            np.testing.assert_array_equal(vec.final_state[i], o)
            if te or tr:
                seen["terminated" if te else "truncated"] += 1
                o, _ = env.reset()  # autoreset continues the copy's own stream
            np.testing.assert_array_equal(obs["agent_0"]["observation"][i], o)
            np.testing.assert_array_equal(vec.state()[i], o)
            assert (obs["agent_0"]["action_mask"][i] == 1).all()
    assert seen["terminated"] > 0 and seen["truncated"] > 0, seen


def test_gymnasium_class_factory_and_autoreset_false_freezes():
    vec = make_vector_env(
        "gymnasium.envs.classic_control.cartpole:CartPoleEnv",
        3,
        {"adapter_max_cycles": 4},
        autoreset=False,
    )
    obs0, _ = vec.reset(seed=0)
    for _ in range(4):
        obs, rewards, terms, truncs, infos = vec.step({"agent_0": np.zeros(3, np.int64)})
    assert truncs["agent_0"].all() or terms["agent_0"].all()
    frozen = obs["agent_0"]["observation"].copy()
    flags = (terms["agent_0"].copy(), truncs["agent_0"].copy())
    for _ in range(3):
        obs, rewards, terms, truncs, infos = vec.step({"agent_0": np.ones(3, np.int64)})
        np.testing.assert_array_equal(obs["agent_0"]["observation"], frozen)
        assert (rewards["agent_0"] == 0).all()
        np.testing.assert_array_equal(terms["agent_0"], flags[0])
        np.testing.assert_array_equal(truncs["agent_0"], flags[1])
        for key in (*CHANNELS, "active"):
            assert (infos["agent_0"][key] == 0).all()
    obs, _ = vec.reset(seed=0)
    np.testing.assert_array_equal(obs["agent_0"]["observation"], obs0["agent_0"]["observation"])


# ------------------------------------------------------------------ a PettingZoo env of our own


class RelayEnv(ParallelEnv):
    """Three agents: ``runner_0`` and ``runner_1`` (Discrete(3) obs: the step count mod 3),
    and ``judge`` (Tuple(MultiDiscrete([2, 3]), Box(2,)) obs, a Dict with an action_mask).
    ``runner_0`` terminates after ``leave_at`` steps; the others run to ``horizon`` and are
    truncated. Rewards: runner i gets i + 1 per step, judge 10 * its action. Infos: a numeric
    ``score`` and, for runner_1, an ``action_mask`` allowing only action 1."""

    metadata = {"name": "relay_v0"}

    def __init__(self, leave_at: int = 2, horizon: int = 5, max_cycles: int | None = 5):
        self.possible_agents = ["runner_0", "runner_1", "judge"]
        self.leave_at, self.horizon = leave_at, horizon
        if max_cycles is not None:
            self.max_cycles = max_cycles
        self._judge = spaces.Dict(
            {
                "observation": spaces.Tuple(
                    (spaces.MultiDiscrete([2, 3]), spaces.Box(-1, 1, (2,), np.float32))
                ),
                "action_mask": spaces.Box(0, 1, (2,), np.int8),
            }
        )
        self.t = 0
        self.agents: list[str] = []

    def observation_space(self, agent):
        return self._judge if agent == "judge" else spaces.Discrete(3)

    def action_space(self, agent):
        return spaces.Discrete(2) if agent == "judge" else spaces.Discrete(3)

    def _obs(self):
        judge = {
            "observation": (np.array([self.t % 2, self.t % 3]), np.array([0.5, -0.5], np.float32)),
            "action_mask": np.array([1, int(self.t % 2 == 0)], np.int8),
        }
        out = {a: self.t % 3 for a in self.agents if a != "judge"}
        if "judge" in self.agents:
            out["judge"] = judge
        return out

    def _infos(self):
        infos = {a: {"score": float(self.t), "label": "text is skipped"} for a in self.agents}
        if "runner_1" in infos:
            infos["runner_1"]["action_mask"] = np.array([0, 1, 0], np.int8)
        return infos

    def reset(self, seed=None, options=None):
        self.t = 0
        self.agents = list(self.possible_agents)
        return self._obs(), self._infos()

    def step(self, actions):
        assert set(actions) == set(self.agents), (actions, self.agents)
        self.t += 1
        rewards = {a: (10.0 * actions[a] if a == "judge" else 1.0 + int(a[-1])) for a in actions}
        terms = {a: a == "runner_0" and self.t >= self.leave_at for a in actions}
        truncs = {a: self.t >= self.horizon for a in actions}
        obs = {a: (self.t % 3 if a != "judge" else self._obs()["judge"]) for a in actions}
        infos = {a: self._infos().get(a, {}) for a in actions}
        self.agents = [a for a in self.agents if not (terms[a] or truncs[a])]
        return obs, rewards, terms, truncs, infos


def relay_env(**kw) -> RelayEnv:
    return RelayEnv(**kw)


def test_names_types_and_encodings_of_a_pettingzoo_env():
    vec = make_vector_env(relay_env, 2, {})
    assert vec.possible_agents == ["runner_0", "runner_1", "judge_0"]
    assert vec.env_agent_names["judge_0"] == "judge"
    layout = AgentLayout.from_env(vec)
    assert layout.type_names == ("runner", "judge")
    assert vec.observation_space("judge_0")["observation"].shape == (2 + 3 + 2,)
    assert vec.state_space.shape == (3 + 3 + 7,)  # no state(): the concatenated observations
    obs, infos = vec.reset(seed=0)
    np.testing.assert_array_equal(obs["runner_0"]["observation"], [[1, 0, 0]] * 2)
    np.testing.assert_array_equal(obs["judge_0"]["observation"][0], [1, 0, 1, 0, 0, 0.5, -0.5])
    np.testing.assert_array_equal(obs["judge_0"]["action_mask"][0], [1, 1])  # from the obs dict
    np.testing.assert_array_equal(obs["runner_1"]["action_mask"][0], [0, 1, 0])  # from infos
    np.testing.assert_array_equal(obs["runner_0"]["action_mask"][0], [1, 1, 1])  # none: all
    assert "score" in infos["runner_0"] and "label" not in infos["runner_0"]
    obs, *_ = vec.step({a: np.ones(2, np.int64) for a in vec.possible_agents})
    np.testing.assert_array_equal(obs["judge_0"]["observation"][1], [0, 1, 0, 1, 0, 0.5, -0.5])
    np.testing.assert_array_equal(obs["judge_0"]["action_mask"][1], [1, 0])
    np.testing.assert_array_equal(
        vec.state()[0], np.concatenate([obs[a]["observation"][0] for a in vec.possible_agents])
    )
    mapped = make_vector_env(
        relay_env, 1, {"adapter_types": {"runner_0": "fast", "runner_1": "slow"}}
    )
    assert mapped.possible_agents == ["fast_0", "slow_0", "judge_0"]
    assert make_vector_env(relay_env, 1, {"adapter_types": "judge:boss"}).possible_agents == [
        "runner_0",
        "runner_1",
        "boss_0",
    ]


def test_agents_leaving_early_are_masked_and_back_at_reset():
    vec = make_vector_env(relay_env, 2, {"leave_at": 2, "horizon": 5})
    obs, infos = vec.reset(seed=0)
    assert all((infos[a]["active"] == 1).all() for a in vec.possible_agents)
    zero = {a: np.zeros(2, np.int64) for a in vec.possible_agents}
    judge_action = {**zero, "judge_0": np.array([1, 0])}
    for t in range(1, 6):
        obs, rewards, terms, truncs, infos = vec.step(judge_action)
        runner_acted = t <= 2  # runner_0 acts at steps 1, 2 (terminates at 2), then has left
        assert (infos["runner_0"]["active"] == float(runner_acted)).all()
        assert (infos["runner_1"]["active"] == 1).all() and (infos["judge_0"]["active"] == 1).all()
        own = {"runner_0": 1.0 if runner_acted else 0.0, "runner_1": 2.0}
        for a, value in own.items():
            assert (rewards[a] == value).all() and (infos[a]["reward_individual"] == value).all()
        np.testing.assert_array_equal(rewards["judge_0"], [10.0, 0.0])
        live_rewards = [[1.0, 2.0, 10.0], [1.0, 2.0, 0.0]] if runner_acted else [[2, 10], [2, 0]]
        team = [np.mean(r) for r in live_rewards]
        for a in vec.possible_agents:  # the team channel is the team's, left agents included
            np.testing.assert_allclose(infos[a]["reward_team"], team)
            assert (infos[a]["reward_penalty"] == 0).all()
        if 2 <= t < 5:  # runner_0 has left: zero observation, every action allowed
            assert (obs["runner_0"]["observation"] == 0).all()
            assert (obs["runner_0"]["action_mask"] == 1).all()
        # the team's episode goes on until the last agent is done (truncated at 5)
        assert (terms["runner_0"] == False).all()  # noqa: E712
        assert (truncs["judge_0"] == (t == 5)).all() and (truncs["runner_0"] == (t == 5)).all()
    # same-step autoreset: everyone is back; the final observation is kept
    assert (infos["runner_0"]["active"] == 0).all()
    np.testing.assert_array_equal(obs["runner_0"]["observation"], [[1, 0, 0]] * 2)
    np.testing.assert_array_equal(vec.final_obs["runner_1"]["observation"], [[0, 0, 1]] * 2)
    assert (vec.final_obs["runner_0"]["observation"] == 0).all()
    obs, _, _, _, infos = vec.step(zero)
    assert all((infos[a]["active"] == 1).all() for a in vec.possible_agents)


def test_episode_is_terminated_when_the_last_agents_terminate():
    vec = make_vector_env(relay_env, 1, {"leave_at": 1, "horizon": 1})
    vec.reset(seed=0)
    _, _, terms, truncs, _ = vec.step({a: np.zeros(1, np.int64) for a in vec.possible_agents})
    # runner_0 terminated and the others were truncated at the same step: truncated
    assert truncs["judge_0"].all() and not terms["judge_0"].any()
    vec = make_vector_env(relay_env, 1, {"leave_at": 1, "horizon": 99, "max_cycles": 3})
    vec.reset(seed=0)
    for _ in range(3):  # the adapter's time limit ends the episode at max_cycles
        _, _, terms, truncs, _ = vec.step({a: np.zeros(1, np.int64) for a in vec.possible_agents})
    assert truncs["runner_1"].all() and not terms["runner_1"].any()


@pytest.mark.parametrize("mode, team", [("sum", [13.0, 3.0]), ("none", [0.0, 0.0])])
def test_team_reward_option(mode, team):
    vec = make_vector_env(relay_env, 2, {"adapter_team_reward": mode})
    vec.reset(seed=0)
    _, _, _, _, infos = vec.step(
        {"runner_0": np.zeros(2, np.int64), "runner_1": np.zeros(2, np.int64),
         "judge_0": np.array([1, 0])}
    )  # fmt: skip
    np.testing.assert_allclose(infos["runner_1"]["reward_team"], team)
    np.testing.assert_allclose(infos["runner_1"]["reward_individual"], [2.0, 2.0])


def test_env_reward_channels_are_kept_and_options_that_contradict_them_fail():
    vec = make_vector_env(MS + "parallel_env", 2, MS_KW)
    vec.reset(seed=0)
    _, rewards, _, _, infos = vec.step(random_actions(vec, np.random.default_rng(0)))
    a = vec.possible_agents[0]
    total = sum(infos[a][k] for k in CHANNELS)
    np.testing.assert_allclose(rewards[a], total, atol=1e-6)
    vec = make_vector_env(MS + "parallel_env", 2, {**MS_KW, "adapter_team_reward": "sum"})
    vec.reset(seed=0)
    with pytest.raises(ValueError, match="reports its own reward channels"):
        vec.step(random_actions(vec, np.random.default_rng(0)))
    vec = make_vector_env(MS + "parallel_env", 2, {**MS_KW, "adapter_reward_channels": "reward"})
    vec.reset(seed=0)
    _, rewards, _, _, infos = vec.step(random_actions(vec, np.random.default_rng(0)))
    np.testing.assert_allclose(infos[a]["reward_individual"], rewards[a])
    vec = make_vector_env(relay_env, 1, {"adapter_reward_channels": "infos"})
    vec.reset(seed=0)
    with pytest.raises(ValueError, match="lack reward_team"):
        vec.step({a: np.zeros(1, np.int64) for a in vec.possible_agents})


# ------------------------------------------------------------------ errors


class ImageEnv(gymnasium.Env):
    observation_space = spaces.Box(0, 255, (8, 8, 3), np.uint8)
    action_space = spaces.Discrete(2)


class TextEnv(gymnasium.Env):
    observation_space = spaces.Text(5)
    action_space = spaces.Discrete(2)


class MultiActionEnv(gymnasium.Env):
    observation_space = spaces.Discrete(2)
    action_space = spaces.MultiDiscrete([2, 2])


class NoLimitEnv(gymnasium.Env):
    observation_space = spaces.Discrete(2)
    action_space = spaces.Discrete(2)


def not_an_env(**kw):
    return {"hello": 1}


class MixedTypesEnv(RelayEnv):
    def __init__(self):
        super().__init__()
        self.possible_agents = ["runner_0", "runner_1"]

    def observation_space(self, agent):
        return spaces.Discrete(3 if agent == "runner_0" else 4)


@pytest.mark.parametrize(
    "env_fn, kwargs, error, match",
    [
        ("gymnasium:make", {"id": "Pendulum-v1"}, UnsupportedSpaceError, "continuous actions.*Box"),
        (f"{__name__}:MultiActionEnv", {"adapter_max_cycles": 5}, ValueError, "MultiDiscrete"),
        (f"{__name__}:ImageEnv", {"adapter_max_cycles": 5}, UnsupportedSpaceError, "image"),
        (f"{__name__}:TextEnv", {"adapter_max_cycles": 5}, UnsupportedSpaceError, "Text"),
        (f"{__name__}:NoLimitEnv", {}, ValueError, "declares no episode limit.*adapter_max_cycles"),
        (MS + "env", {}, ValueError, "AEC env: pass its parallel_env"),
        (f"{__name__}:not_an_env", {}, ValueError, "built a builtins.dict.*accepted: a native"),
        ("gymnasium:make", {}, ValueError, "--env.id ID"),
        ("gymnasium:make_vec", {"id": "CartPole-v1"}, ValueError, "vector env"),
        (f"{__name__}:MixedTypesEnv", {}, ValueError, "different spaces.*adapter_types"),
        (f"{__name__}:relay_env", {"adapter_nope": 1}, ValueError, "unknown adapter option"),
        (f"{__name__}:relay_env", {"adapter_team_reward": "max"}, ValueError, "mean, sum, none"),
        (f"{__name__}:relay_env", {"adapter_types": {"ghost": "x"}}, ValueError, "does not have"),
        (f"{__name__}:relay_env", {"adapter_workers": -1}, ValueError, "adapter_workers"),
        (f"{__name__}:relay_env", {"adapter_state": "state"}, ValueError, "no state_space"),
        (f"{__name__}:relay_env", {"bogus": 1}, TypeError, "relay_env.*bogus"),
        ("mpe2.simple_spread_v3:parallel_env", {"N": "x"}, TypeError, "simple_spread_v3"),
    ],
)
def test_unsupported_cases_raise_clear_errors(env_fn, kwargs, error, match):
    with pytest.raises(error, match=match):
        make_vector_env(env_fn, 2, kwargs)


@pytest.mark.parametrize(
    "space, value, expected",
    [
        (spaces.Discrete(3, start=1), 2, [0, 1, 0]),
        (spaces.MultiDiscrete([2, 3]), [1, 2], [0, 1, 0, 0, 1]),
        (spaces.MultiBinary(3), [1, 0, 1], [1, 0, 1]),
        (spaces.Box(-1, 1, (2, 2)), [[1, 2], [3, 4]], [1, 2, 3, 4]),
        (
            spaces.Tuple((spaces.Discrete(2), spaces.Dict({"b": spaces.Discrete(2)}))),
            (1, {"b": 0}),
            [0, 1, 1, 0],
        ),
    ],
)
def test_encoders_hand_worked(space, value, expected):
    encoder = make_encoder(space, what="x")
    out = np.full(encoder.dim, 7.0, np.float32)
    encoder.encode_into(value, out)
    np.testing.assert_array_equal(out, expected)


# ------------------------------------------------------------------ workers, POPGym


def test_worker_processes_give_the_same_steps():
    kw = dict(MS_KW)
    inproc = make_vector_env(MS + "parallel_env", 5, kw)
    workers = make_vector_env(MS + "parallel_env", 5, {**kw, "adapter_workers": 2})
    try:
        assert_obs_equal(workers.reset(seed=4)[0], inproc.reset(seed=4)[0])
        rng = np.random.default_rng(0)
        for _ in range(30):
            actions = random_actions(inproc, rng)
            out_w, out_i = workers.step(actions), inproc.step(actions)
            assert_obs_equal(out_w[0], out_i[0])
            for k in (1, 2, 3):
                for a in inproc.possible_agents:
                    np.testing.assert_array_equal(out_w[k][a], out_i[k][a])
            for key in out_i[4]["rescuer_0"]:
                np.testing.assert_array_equal(
                    out_w[4]["rescuer_0"][key], out_i[4]["rescuer_0"][key]
                )
            np.testing.assert_array_equal(workers.state(), inproc.state())
            np.testing.assert_array_equal(workers.final_state, inproc.final_state)
        with pytest.raises(TypeError, match="cannot be pickled"):
            pickle.dumps(workers)
    finally:
        workers.close()


def test_popgym_discrete_observations_are_one_hot():
    popgym = pytest.importorskip("popgym", reason="install popgym (pip install popgym)")
    del popgym
    env_fn = "popgym.envs.repeat_previous:RepeatPreviousEasy"
    vec = make_vector_env(env_fn, 3, {})
    assert vec.observation_space("agent_0")["observation"].shape == (4,)
    assert vec.max_cycles == 51
    obs, _ = vec.reset(seed=5)
    refs = [make_ref(env_fn) for _ in range(3)]
    cards = [env.reset(seed=5 + i)[0] for i, env in enumerate(refs)]
    np.testing.assert_array_equal(obs["agent_0"]["observation"], np.eye(4)[cards])
    total = np.zeros(3)
    for t in range(51):
        actions = np.array([t % 4] * 3)
        obs, rewards, terms, truncs, _ = vec.step({"agent_0": actions})
        total += rewards["agent_0"]
        for i, env in enumerate(refs):
            card, r, te, tr, _ = env.step(int(actions[i]))
            assert rewards["agent_0"][i] == pytest.approx(r) and terms["agent_0"][i] == te
            np.testing.assert_array_equal(
                vec.final_obs["agent_0"]["observation"][i], np.eye(4)[card]
            )
    assert terms["agent_0"].all()  # a deck is dealt in exactly max_cycles steps
    state_vec = make_vector_env(env_fn, 2, {"adapter_state": "get_state"})
    assert state_vec.state_space.shape == (4 * 4 + 4,)  # last k=4 suits one-hot, dealt counts
    state_vec.reset(seed=0)
    assert state_vec.state().shape == (2, 20)


def make_ref(env_fn: str):
    module, name = env_fn.split(":")
    return getattr(importlib.import_module(module), name)()


def test_partial_and_class_factories_are_detected():
    vec = make_vector_env(functools.partial(RelayEnv, horizon=3), 2, {})
    assert vec.kind == "pettingzoo" and vec.max_cycles == 5
    vec = make_vector_env(f"{__name__}:RelayEnv", 2, {"max_cycles": None, "adapter_max_cycles": 7})
    assert vec.max_cycles == 7


def test_pickled_adapter_continues_identically_or_refuses():
    vec = make_vector_env("gymnasium:make", 2, {"id": "CartPole-v1"})
    vec.reset(seed=3)
    vec.step({"agent_0": np.zeros(2, np.int64)})
    copy = pickle.loads(pickle.dumps(vec))
    for _ in range(5):
        actions = {"agent_0": np.ones(2, np.int64)}
        np.testing.assert_array_equal(
            copy.step(actions)[0]["agent_0"]["observation"],
            vec.step(actions)[0]["agent_0"]["observation"],
        )
    pytest.importorskip("mpe2", reason="install mpe2 (pip install mpe2)")
    spread = make_vector_env("mpe2.simple_spread_v3:parallel_env", 1, {"max_cycles": 5})
    spread.reset(seed=0)
    with pytest.raises(TypeError, match="cannot be pickled and restored"):
        pickle.dumps(spread)  # mpe2's wrappers do not unpickle: the collector resets instead


def test_workers_carry_factories_that_pickle_cannot():
    pytest.importorskip("mpe2", reason="install mpe2 (pip install mpe2)")
    fn, kw = "mpe2.simple_spread_v3:parallel_env", {"N": 3, "max_cycles": 6}
    inproc = make_vector_env(fn, 3, kw)
    workers = make_vector_env(fn, 3, {**kw, "adapter_workers": 2})
    try:
        assert_obs_equal(workers.reset(seed=1)[0], inproc.reset(seed=1)[0])
        rng = np.random.default_rng(0)
        for _ in range(8):  # past an autoreset
            actions = random_actions(inproc, rng)
            out_w, out_i = workers.step(actions), inproc.step(actions)
            assert_obs_equal(out_w[0], out_i[0])
            np.testing.assert_array_equal(out_w[1]["agent_0"], out_i[1]["agent_0"])
            np.testing.assert_array_equal(workers.final_state, inproc.final_state)
    finally:
        workers.close()
