"""Evaluation with a sampling temperature (``marl.evaluate --temperature``): actions from
softmax(logits / T), the entropy reported is that of the distribution sampled from. Used to
match a policy's entropy to another's before comparing search diversity (issue 36 item 5d)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from envs import multisearch_v0
from marl.models.policies import AgentLayout, MaskedCategorical, MultiAgentPolicy
from marl.run.evaluate import evaluate_policy

ENV = "envs.multisearch_v0:vector_env"
KW = {"preset": "small", "max_cycles": 30}
SEEDS = [3, 4, 5, 6]


@pytest.fixture(scope="module")
def policy() -> MultiAgentPolicy:
    torch.manual_seed(0)
    layout = AgentLayout.from_env(multisearch_v0.vector_env(1, **KW))
    policy = MultiAgentPolicy(layout, "mlp", 32, "tanh")
    with torch.no_grad():  # a decided policy (PPO's head init is near uniform)
        for actor in policy.actors.values():
            actor.head.weight.normal_(0.0, 2.0)
    return policy


def figures(res: dict) -> dict:
    return {k: v for k, v in res.items() if k not in ("entropy", "temperature", "deterministic")}


def test_tempered_entropy_matches_numpy() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(5, 3, 6)) * 3
    mask = rng.random((5, 3, 6)) < 0.7
    mask[..., 0] = True
    for t in (0.5, 1.0, 4.0):
        dist = MaskedCategorical(torch.tensor(logits / t), torch.tensor(mask))
        z = np.where(mask, logits / t, -np.inf)
        p = np.exp(z - z.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        expected = -np.sum(np.where(mask, p * np.log(np.where(mask, p, 1.0)), 0.0), axis=-1)
        np.testing.assert_allclose(dist.entropy().numpy(), expected, rtol=1e-6, atol=1e-9)


def test_temperature_moves_entropy_and_its_limits(policy) -> None:
    run = {
        t: evaluate_policy(policy, ENV, KW, SEEDS, temperature=t, repeats=2)
        for t in (1e-4, 0.5, 1.0, 3.0)
    }
    entropy = [run[t]["entropy"] for t in (1e-4, 0.5, 1.0, 3.0)]
    # the states visited differ with the actions, but a factor of 2 to 3 in T dominates
    assert entropy == sorted(entropy) and entropy[0] < 1e-3 < entropy[1]
    assert all(run[t]["temperature"] == t for t in run if t != 1.0)
    assert "temperature" not in run[1.0]  # the policy's own distribution: as before
    greedy = evaluate_policy(policy, ENV, KW, SEEDS, deterministic=True, repeats=2)
    assert figures(run[1e-4]) == figures(greedy)  # a tiny temperature is greedy
    plain = evaluate_policy(policy, ENV, KW, SEEDS, repeats=2)
    assert plain == run[1.0]  # temperature 1 is the policy's own distribution


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf")])
def test_bad_temperatures_are_refused(policy, bad) -> None:
    with pytest.raises(ValueError, match="temperature"):
        evaluate_policy(policy, ENV, KW, SEEDS, temperature=bad)
    with pytest.raises(ValueError, match="greedy"):
        evaluate_policy(policy, ENV, KW, SEEDS, temperature=2.0, deterministic=True)


def test_cli_refuses_bad_temperatures_before_loading(tmp_path, capsys) -> None:
    from marl.run.evaluate import main

    assert main([str(tmp_path), "--temperature", "0"]) == 2
    assert "--temperature must be a finite number > 0" in capsys.readouterr().err
    assert main([str(tmp_path), "--temperature", "2", "--deterministic"]) == 2
    assert "not with --deterministic" in capsys.readouterr().err
