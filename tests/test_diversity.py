"""The search-diversity metric (envs.diversity) against hand-worked examples, the grid env's
visited-cell sets, and its place in evaluation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from envs import multisearch_v0
from envs.diversity import grouped_pairwise_jaccard, jaccard_distance, mean_pairwise_jaccard
from marl.models.policies import AgentLayout, MultiAgentPolicy
from marl.rollout.episodes import BaselineActor, evaluate_episodes
from marl.run.evaluate import evaluate_policy


def test_jaccard_hand_worked():
    assert jaccard_distance({1, 2, 3}, {2, 3, 4}) == pytest.approx(1 - 2 / 4)
    assert jaccard_distance(set(), set()) == 0.0
    assert jaccard_distance({1}, set()) == 1.0
    # pairs of {1,2}, {2,3}, {1,2}: distances 2/3, 0, 2/3 -> mean 4/9
    assert mean_pairwise_jaccard([{1, 2}, {2, 3}, {1, 2}]) == pytest.approx(4 / 9)
    assert mean_pairwise_jaccard([{1}]) == 0.0
    # seed 7: {1,2} vs {3}: 1.0; seed 8: {5} vs {5}: 0.0; seed 9 alone: not counted
    sets = [{1, 2}, {5}, {9}, {3}, {5}]
    keys = [7, 8, 9, 7, 8]
    assert grouped_pairwise_jaccard(sets, keys) == pytest.approx(0.5)
    assert grouped_pairwise_jaccard([{1}, {2}], [1, 2]) is None


def test_search_sets_are_the_cells_agents_stood_on():
    vec = multisearch_v0.vector_env(2, autoreset=False, preset="small")
    vec.reset(seed=[3, 3])
    g = 16  # the small preset's grid
    starts = vec.search_sets()
    assert starts[0] == starts[1]  # the same seed, the same start cells
    rng = np.random.default_rng(0)
    positions = [set(s) for s in starts]
    for _ in range(20):
        actions = {}
        for a in vec.possible_agents:
            mask = vec._obs[a]["action_mask"].astype(bool)
            actions[a] = np.array([rng.choice(np.flatnonzero(m)) for m in mask])
        vec.step(actions)
        for i in range(2):
            for a in range(len(vec.possible_agents)):
                r, c = vec._core.agent_pos[i, a]
                positions[i].add(int(r) * g + int(c))
    assert vec.search_sets() == [frozenset(p) for p in positions]


def test_identical_policies_give_zero_diversity_and_random_more():
    seeds = [10, 11]

    # a deterministic policy (always "stay" where allowed) repeats itself exactly
    def stay(obs, vec):
        return {a: np.zeros(vec.num_envs, dtype=np.int64) for a in vec.possible_agents}

    vec = multisearch_v0.vector_env(4, autoreset=False, preset="small", max_cycles=20)
    res = evaluate_episodes(BaselineActor(stay), vec, seeds, repeats=2)
    assert res["search_diversity"] == 0.0 and res["n_episodes"] == 2
    torch.manual_seed(0)
    layout = AgentLayout.from_env(vec)
    policy = MultiAgentPolicy(layout, "mlp", 16)
    res = evaluate_policy(
        policy, "envs.multisearch_v0:vector_env", {"max_cycles": 20}, seeds, repeats=2
    )
    assert 0.0 < res["search_diversity"] <= 1.0
    # a uniform-ish initial policy has entropy close to log(number of actions)
    assert 1.0 < res["entropy"] <= np.log(6) + 1e-6
    single = evaluate_policy(policy, "envs.multisearch_v0:vector_env", {"max_cycles": 20}, seeds)
    assert single["search_diversity"] is None
