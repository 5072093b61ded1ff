"""websearch_v2: PettingZoo's own test suite, what changed from v1 (one browser feature, "my
open document covers the description", checked against a plain-Python reference: the open
document's concepts contain every concept the description names, which only the target
does), that everything else is v1's under the same actions (observations with the feature
left out, masks, state, rewards, flags, infos), that v0 and v1 are unchanged beside it, and
the baselines on v2."""

from __future__ import annotations

import doctest
import importlib

import numpy as np
import pytest

from envs import websearch_v0, websearch_v1, websearch_v2
from envs.errors import ArgumentTypeError
from envs.websearch import B_MARK, B_OPEN0, Q_ISSUE, Q_TOGGLE0
from envs.websearch_baselines import HeuristicPolicy, OraclePolicy, RandomPolicy

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # PettingZoo's style hints

COVERS = 18  # the v2 browser feature: my open document covers the description
PRESET_KW = [
    dict(preset="easy", max_cycles=12, max_answers=2),
    dict(preset="default", max_cycles=15),
    dict(preset="hard", max_cycles=10, max_answers=3),
]


def test_module_doc_example_runs():
    failures, tests = doctest.testmod(websearch_v2, verbose=False)
    assert tests > 0 and failures == 0


def test_metadata_spaces_arguments_and_earlier_versions_unchanged():
    v2, v1, v0 = (m.parallel_env() for m in (websearch_v2, websearch_v1, websearch_v0))
    assert [e.metadata["name"] for e in (v0, v1, v2)] == [
        "websearch_v0",
        "websearch_v1",
        "websearch_v2",
    ]
    assert [e.observation_space("browser_0")["observation"].shape for e in (v0, v1, v2)] == [
        (56,),
        (63,),
        (64,),
    ]
    assert v2.observation_space("querier_0") == v1.observation_space("querier_0")
    assert v2.action_space("browser_0") == v1.action_space("browser_0")
    assert v2.state_space == v1.state_space
    assert websearch_v2.BASELINES == "envs.websearch_baselines"
    assert importlib.import_module(websearch_v2.BASELINES).HeuristicPolicy
    # v1's arguments with v1's defaults; v0 still rejects them; version is not an argument
    assert v2.config.reward_read == 0.0 and v2.config.reward_answer == 0.5
    assert websearch_v2.parallel_env(reward_read=0.3).config.reward_read == 0.3
    assert v1.config.reward_answer == 0.5 and v0.config.reward_answer == 0.0
    with pytest.raises(ArgumentTypeError, match="reward_answer"):
        websearch_v0.parallel_env(reward_answer=0.3)
    for module in (websearch_v0, websearch_v1, websearch_v2):
        with pytest.raises(ArgumentTypeError, match="version"):
            module.parallel_env(version=2)
    for preset in ("easy", "default", "hard"):
        e = websearch_v2.parallel_env(preset=preset)
        assert e.observation_space("browser_0")["observation"].shape == (64,)


def _covers_reference(core, n: int, d: int) -> bool:
    """Plain Python: document ``d`` contains every concept the description of env ``n``
    names (its coverage is 1)."""
    c = core.corpus
    named = set(core.desc_cons[n, : core.desc_ncons[n]].tolist())
    return named <= set(c.dcon[c.dcon_ptr[d] : c.dcon_ptr[d + 1]].tolist())


def _random_actions(rng, obs):
    """Legal random actions [N] per agent, issuing and marking often."""
    out = {}
    for agent, o in obs.items():
        mask = o["action_mask"]
        pick = np.argmax((rng.random(mask.shape) + 1.0) * mask, axis=1)
        if agent.startswith("querier"):
            pick = np.where((mask[:, Q_ISSUE] == 1) & (rng.random(len(pick)) < 0.3), 1, pick)
        else:
            pick = np.where((mask[:, B_MARK] == 1) & (rng.random(len(pick)) < 0.1), 8, pick)
        out[agent] = pick.astype(np.int64)
    return out


def _drop_covers(x: np.ndarray) -> np.ndarray:
    return np.delete(x, COVERS, axis=-1)


@pytest.mark.parametrize("kwargs", PRESET_KW, ids=["easy", "default", "hard"])
def test_v2_is_v1_plus_the_covers_feature_under_the_same_actions(kwargs):
    n_envs = 48
    v1, v2 = websearch_v1.vector_env(n_envs, **kwargs), websearch_v2.vector_env(n_envs, **kwargs)
    o1, i1 = v1.reset(seed=300)
    o2, i2 = v2.reset(seed=300)
    rng = np.random.default_rng(0)
    browsers = [a for a in v2.possible_agents if a.startswith("browser")]
    flags_on = ends = 0
    for _ in range(60):
        for agent in v2.possible_agents:
            np.testing.assert_array_equal(o1[agent]["action_mask"], o2[agent]["action_mask"])
            if agent.startswith("browser"):
                np.testing.assert_array_equal(
                    o1[agent]["observation"], _drop_covers(o2[agent]["observation"])
                )
            else:
                np.testing.assert_array_equal(o1[agent]["observation"], o2[agent]["observation"])
        np.testing.assert_array_equal(v1.state(), v2.state())
        core = v2._core
        for b, agent in enumerate(browsers):
            feature = o2[agent]["observation"][:, COVERS]
            for n in range(n_envs):
                d = int(core.open_doc[n, b])
                expect = d >= 0 and _covers_reference(core, n, d)
                assert feature[n] == (1.0 if expect else 0.0)
                assert expect == (d == int(core.target[n]))  # only the target covers it
                flags_on += int(expect)
        actions = _random_actions(rng, o2)
        o1, r1, t1, u1, i1 = v1.step(actions)
        o2, r2, t2, u2, i2 = v2.step(actions)
        for agent in v2.possible_agents:
            np.testing.assert_array_equal(r1[agent], r2[agent])
            np.testing.assert_array_equal(t1[agent], t2[agent])
            np.testing.assert_array_equal(u1[agent], u2[agent])
            assert i1[agent].keys() == i2[agent].keys()
            for key in i1[agent]:
                np.testing.assert_array_equal(i1[agent][key], i2[agent][key])
        ends += int((t2[browsers[0]] | u2[browsers[0]]).sum())
    assert flags_on > 0 and ends > 0  # the feature was on and episodes ended and reset


def test_covers_feature_by_hand():
    env = websearch_v2.parallel_env(preset="default", max_answers=2)
    stay = {"querier_0": 0, "browser_0": 0, "browser_1": 0}
    for seed in range(40):  # a task whose first description word's top result is not the target
        obs, _ = env.reset(seed=seed)
        core = env._core
        assert obs["browser_0"]["observation"][COVERS] == 0.0  # nothing open
        env.step({**stay, "querier_0": Q_TOGGLE0})
        obs, *_ = env.step({**stay, "querier_0": Q_ISSUE})
        if int(core.n_results[0]) > 0 and core.results[0, 0] != core.target[0]:
            break
    obs, *_ = env.step({**stay, "browser_0": B_OPEN0})
    d = int(core.open_doc[0, 0])
    assert d != core.target[0]
    assert obs["browser_0"]["observation"][8] == 1.0  # a document is open ...
    assert obs["browser_0"]["observation"][9] < 1.0  # ... covering part of the description
    assert obs["browser_0"]["observation"][COVERS] == 0.0
    assert obs["browser_1"]["observation"][COVERS] == 0.0  # browser_1 has nothing open
    # the oracle opens the target: the feature turns on for the browser that holds it
    env.reset(seed=12)
    policy = OraclePolicy()
    obs = env._observe()
    seen = False
    while env.agents:
        for b, agent in enumerate(("browser_0", "browser_1")):
            holds_target = int(env._core.open_doc[0, b]) == int(env._core.target[0])
            assert obs[agent]["observation"][COVERS] == (1.0 if holds_target else 0.0)
            seen |= holds_target
        obs, _, _, _, infos = env.step(policy(obs, env))
    assert seen and infos["browser_0"]["success"] == 1.0


def _play(module, policy, seeds, **kwargs):
    """One episode per seed (as envs.websearch_baselines.evaluate_websearch_baseline): final
    success, steps to success and mean per-agent return per episode."""
    vec = module.vector_env(len(seeds), autoreset=False, **kwargs)
    obs, _ = vec.reset(seed=list(seeds))
    first = vec.possible_agents[0]
    success, steps, returns = (np.zeros(len(seeds)) for _ in range(3))
    done = np.zeros(len(seeds), dtype=bool)
    while not done.all():
        obs, rewards, terms, truncs, infos = vec.step(policy(obs, vec))
        returns += np.mean([rewards[a] for a in vec.possible_agents], axis=0) * ~done
        now = (terms[first] | truncs[first]) & ~done
        success[now] = infos[first]["success"][now]
        steps[now] = infos[first]["steps_to_success"][now]
        done |= now
    return success, steps, returns


@pytest.mark.parametrize("preset", ["easy", "default", "hard"])
def test_baselines_on_v2_play_as_on_v1(preset):
    seeds = range(700, 764)
    for make in (HeuristicPolicy, lambda: RandomPolicy(0), OraclePolicy):
        got = _play(websearch_v2, make(), seeds, preset=preset)
        want = _play(websearch_v1, make(), seeds, preset=preset)
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b)
    random_success = _play(websearch_v2, RandomPolicy(0), seeds, preset=preset)[0].mean()
    heuristic_success = _play(websearch_v2, HeuristicPolicy(), seeds, preset=preset)[0].mean()
    assert random_success <= 0.2 and heuristic_success >= random_success + 0.3
    assert _play(websearch_v2, OraclePolicy(), seeds, preset=preset)[0].mean() == 1.0
