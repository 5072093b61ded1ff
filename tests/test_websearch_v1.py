"""websearch_v1: PettingZoo's own test suite, what changed from v0 (spaces, the reading and
answer rewards, the skipped step costs of a failed episode, the browsers' description match,
worked by hand here; the full-episode reference in test_websearch_reference.py covers them
too), that v0 is unchanged beside it, and the baselines on v1."""

from __future__ import annotations

import doctest
import importlib

import numpy as np
import pytest

from envs import websearch_v0, websearch_v1
from envs.errors import ArgumentTypeError
from envs.websearch import B_MARK, B_OPEN0, Q_ISSUE, Q_TOGGLE0
from envs.websearch_baselines import OraclePolicy, evaluate_websearch_baseline

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # PettingZoo's style hints


def test_module_doc_example_runs():
    failures, tests = doctest.testmod(websearch_v1, verbose=False)
    assert tests > 0 and failures == 0


def test_metadata_spaces_and_v0_unchanged_beside_it():
    v1, v0 = websearch_v1.parallel_env(), websearch_v0.parallel_env()
    assert v1.metadata["name"] == "websearch_v1" and v0.metadata["name"] == "websearch_v0"
    assert v1.observation_space("browser_0")["observation"].shape == (63,)
    assert v0.observation_space("browser_0")["observation"].shape == (56,)
    assert v1.observation_space("querier_0") == v0.observation_space("querier_0")
    assert v1.state_space == v0.state_space
    assert websearch_v1.BASELINES == "envs.websearch_baselines"
    assert importlib.import_module(websearch_v1.BASELINES).HeuristicPolicy
    assert v1.config.reward_read == 0.0 and websearch_v1.parallel_env(reward_read=0.3)
    assert v1.config.reward_answer == 0.5
    for name in ("reward_read", "reward_answer"):
        with pytest.raises(ArgumentTypeError, match=name):
            websearch_v0.parallel_env(**{name: 0.3})  # a v1 argument is unknown to v0
    for module in (websearch_v0, websearch_v1):
        with pytest.raises(ArgumentTypeError, match="version"):
            module.parallel_env(version=1)  # not a user argument


def test_same_tasks_and_querier_observations_as_v0():
    v0, v1 = websearch_v0.vector_env(32), websearch_v1.vector_env(32)
    o0, _ = v0.reset(seed=5)
    o1, _ = v1.reset(seed=5)
    np.testing.assert_array_equal(v0.state(), v1.state())
    np.testing.assert_array_equal(o0["querier_0"]["observation"], o1["querier_0"]["observation"])
    # the browsers' v0 features are v1's without the three description-match ones
    keep = [i for i in range(63) if i not in (16, 17) and not (i >= 18 and (i - 18) % 9 == 8)]
    np.testing.assert_array_equal(
        o0["browser_0"]["observation"], o1["browser_0"]["observation"][:, keep]
    )


def _desc_match(core, d: int) -> float:
    c = core.corpus
    bag = set(c.doc_terms[c.doc_ptr[d] : c.doc_ptr[d + 1]].tolist())
    desc = core.desc_terms[0, : core.desc_len[0]].tolist()
    return sum(t in bag for t in desc) / len(desc)


def test_reading_reward_and_description_match_by_hand():
    env = websearch_v1.parallel_env(preset="default", max_answers=2, reward_read=0.3)
    cfg = env.config
    env.reset(seed=3)
    core = env._core
    stay = {"querier_0": 0, "browser_0": 0, "browser_1": 0}
    env.step({**stay, "querier_0": Q_TOGGLE0})  # draft the first description word
    obs, *_ = env.step({**stay, "querier_0": Q_ISSUE})
    nr = int(core.n_results[0])
    assert nr >= 2
    # per result k of the page: feature 8 of 9 after 18 globals
    for k in range(min(nr, 5)):
        d = int(core.results[0, k])
        got = obs["browser_0"]["observation"][18 + 9 * k + 8]
        assert got == pytest.approx(_desc_match(core, d), abs=1e-6)
    later = [_desc_match(core, int(core.results[0, r])) for r in range(5, nr)]
    assert obs["browser_0"]["observation"][17] == pytest.approx(max(later, default=0.0), abs=1e-6)
    assert obs["browser_0"]["observation"][16] == 0.0  # no earlier page
    # open result 0: the reading reward is reward_read x its coverage (nothing opened before)
    _, _, _, _, infos = env.step({**stay, "browser_0": B_OPEN0})
    c, d = core.corpus, int(core.open_doc[0, 0])
    named = set(core.desc_cons[0, : core.desc_ncons[0]].tolist())
    cover = len(named & set(c.dcon[c.dcon_ptr[d] : c.dcon_ptr[d + 1]].tolist())) / len(named)
    assert cover > 0
    assert infos["browser_0"]["reward_individual"] == pytest.approx(
        cfg.reward_read * cover, abs=1e-12
    )
    assert infos["browser_1"]["reward_individual"] == 0.0
    # opening it again (the second browser): a reopening, no reading reward
    _, _, _, _, infos = env.step({**stay, "browser_1": B_OPEN0})
    assert infos["browser_1"]["reward_individual"] == 0.0
    assert infos["browser_1"]["reward_penalty"] == pytest.approx(
        -cfg.penalty_step - cfg.penalty_reopen
    )


def test_failure_costs_the_skipped_steps_success_does_not():
    env = websearch_v1.parallel_env(preset="default")
    cfg = env.config
    for seed in range(20):  # find a task whose first result is not the target
        env.reset(seed=seed)
        core = env._core
        stay = {"querier_0": 0, "browser_0": 0, "browser_1": 0}
        env.step({**stay, "querier_0": Q_TOGGLE0})
        env.step({**stay, "querier_0": Q_ISSUE})
        env.step({**stay, "browser_0": B_OPEN0})
        if core.open_doc[0, 0] != core.target[0]:
            break
    _, _, terms, _, infos = env.step({**stay, "browser_0": B_MARK})  # t = 4: wrong, ends
    assert all(terms.values()) and infos["browser_0"]["success"] == 0.0
    skipped = cfg.penalty_step * (cfg.max_cycles - 4)
    assert infos["browser_0"]["reward_penalty"] == pytest.approx(
        -cfg.penalty_step - cfg.penalty_wrong - skipped
    )
    for agent in ("querier_0", "browser_1"):
        assert infos[agent]["reward_penalty"] == pytest.approx(-cfg.penalty_step - skipped)
    # the same step in v0: no skipped steps
    env0 = websearch_v0.parallel_env(preset="default")
    env0.reset(seed=seed)
    for action in (Q_TOGGLE0, Q_ISSUE):
        env0.step({**stay, "querier_0": action})
    env0.step({**stay, "browser_0": B_OPEN0})
    _, _, _, _, infos0 = env0.step({**stay, "browser_0": B_MARK})
    assert infos0["querier_0"]["reward_penalty"] == pytest.approx(-cfg.penalty_step)
    # success ends early without that cost
    env.reset(seed=12)
    policy = OraclePolicy()
    obs = env._observe()
    while env.agents:
        obs, _, _, _, infos = env.step(policy(obs, env))
    assert infos["querier_0"]["success"] == 1.0
    assert infos["querier_0"]["reward_penalty"] == pytest.approx(-cfg.penalty_step)
    # the browser that marks the target gets the answer reward, the others nothing individual
    assert infos["browser_0"]["reward_individual"] == pytest.approx(cfg.reward_answer)
    assert infos["browser_1"]["reward_individual"] == 0.0
    assert infos["querier_0"]["reward_individual"] == 0.0


def test_baselines_headroom_on_v1():
    seeds = range(500, 564)
    random = evaluate_websearch_baseline("random", seeds, version=1)
    heuristic = evaluate_websearch_baseline("heuristic", seeds, version=1)
    oracle = evaluate_websearch_baseline("oracle", seeds, version=1)
    assert random["success_rate"] <= 0.2
    assert heuristic["success_rate"] >= random["success_rate"] + 0.3
    assert oracle["success_rate"] == 1.0
    # the same play as on v0 (tasks and dynamics unchanged), other returns
    heuristic0 = evaluate_websearch_baseline("heuristic", seeds, version=0)
    assert heuristic["success_rate"] == heuristic0["success_rate"]
    assert heuristic["return"] > heuristic0["return"]  # the reading reward
    with pytest.raises(ValueError, match="version"):
        evaluate_websearch_baseline("random", seeds, version=3)
