"""Masked categorical, actors and critic of marl.models.policies."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_train_fakeenv import vector_env

from marl.models.policies import (
    AgentLayout,
    CentralCritic,
    MaskedCategorical,
    MultiAgentPolicy,
    neg_gumbel_noise,
)


def test_masked_categorical_matches_numpy_over_allowed_actions():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(6, 5))
    mask = rng.random((6, 5)) < 0.6
    mask[:, 0] = True
    d = MaskedCategorical(torch.tensor(logits, dtype=torch.float32), torch.tensor(mask))
    for i in range(6):
        z = np.where(mask[i], logits[i], -np.inf)
        p = np.exp(z - z.max())
        p /= p.sum()
        np.testing.assert_allclose(d.probs[i].numpy(), p, atol=1e-6)
        ent = -(p[mask[i]] * np.log(p[mask[i]])).sum()
        assert float(d.entropy()[i]) == pytest.approx(ent, abs=1e-5)
    assert torch.isfinite(d.log_probs).all()
    samples = torch.stack([d.sample() for _ in range(300)])
    assert torch.tensor(mask).gather(1, samples.T).all(), "a masked action was sampled"
    a = torch.tensor([0] * 6)
    np.testing.assert_allclose(d.log_prob(a).numpy(), np.log(d.probs[:, 0].numpy()), rtol=1e-5)


def test_masked_categorical_all_masked_row_is_finite_uniform():
    d = MaskedCategorical(
        torch.randn(2, 4), torch.tensor([[False] * 4, [True, False, True, False]])
    )
    np.testing.assert_allclose(d.probs[0].numpy(), np.full(4, 0.25), rtol=1e-6)
    np.testing.assert_allclose(d.entropy()[0].item(), np.log(4.0), rtol=1e-6)
    assert torch.isfinite(d.entropy()).all()
    with pytest.raises(ValueError, match="mask shape"):
        MaskedCategorical(torch.randn(2, 4), torch.ones(2, 3, dtype=torch.bool))


def test_layout_groups_agents_by_name_prefix():
    vec = vector_env(3, n_callers=2, n_pickers=3)
    layout = AgentLayout.from_env(vec)
    assert layout.type_names == ("caller", "picker")
    assert layout.types[0].agents == ("caller_0", "caller_1")
    assert layout.types[1].agent_ids == (2, 3, 4)
    assert (layout.types[0].n_actions, layout.types[1].n_actions) == (4, 3)


@pytest.mark.parametrize("backbone", ["mlp", "gru"])
def test_actor_sequence_equals_stepping_with_resets(backbone):
    torch.manual_seed(0)
    layout = AgentLayout.from_env(vector_env(2))
    policy = MultiAgentPolicy(layout, backbone, hidden_dim=16)
    actor = policy.actors["caller"]
    B, L, n = 3, 7, actor.n_agents
    obs = torch.randn(B, L, n, actor.obs_dim)
    mask = torch.ones(B, L, n, actor.n_actions, dtype=torch.bool)
    resets = torch.zeros(B, L, dtype=torch.bool)
    resets[0, 3] = resets[2, 0] = resets[1, 5] = True
    state0 = actor.initial_state(B)
    if backbone == "gru":
        state0 = tuple(torch.randn_like(s) for s in state0)
    seq = actor.sequence(obs, mask, state0, resets).log_probs
    state = state0
    for t in range(L):
        dist, state = actor.step(obs[:, t], mask[:, t], state, resets[:, t])
        torch.testing.assert_close(dist.log_probs, seq[:, t], atol=1e-5, rtol=1e-5)


def test_agent_index_changes_the_action_distribution():
    torch.manual_seed(0)
    layout = AgentLayout.from_env(vector_env(2))
    actor = MultiAgentPolicy(layout, "mlp", 16).actors["caller"]
    torch.nn.init.normal_(actor.head.weight)
    obs = torch.zeros(1, 2, actor.obs_dim)  # same observation for both callers
    dist, _ = actor.step(obs, torch.ones(1, 2, 4, dtype=torch.bool), (), None)
    assert not torch.allclose(dist.probs[0, 0], dist.probs[0, 1])


def test_critic_shapes():
    critic = CentralCritic(state_dim=10, n_agents=3, hidden_dim=8, ensemble=2)
    team, ind = critic(torch.randn(5, 4, 10))
    assert team.shape == (5, 4, 2) and ind.shape == (5, 4, 3, 2)


@pytest.mark.parametrize("backbone", ["mlp", "gru"])
def test_actor_act_equals_step_then_sample(backbone):
    # the rollout path (TypeActor.act, masking in place, no distribution object) draws the
    # same actions with the same generator and returns the same log-probs and state
    torch.manual_seed(1)
    layout = AgentLayout.from_env(vector_env(2))
    actor = MultiAgentPolicy(layout, backbone, hidden_dim=16).actors["picker"]
    E, n = 5, actor.n_agents
    obs = torch.randn(E, n, actor.obs_dim)
    mask = torch.rand(E, n, actor.n_actions) < 0.6
    mask[0, 0] = False  # an all-masked row: uniform
    state = tuple(torch.randn_like(s) for s in actor.initial_state(E))
    reset = torch.tensor([True, False, False, True, False])
    for deterministic in (False, True):
        g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
        a, logp, s = actor.act(obs, mask, state, reset, deterministic=deterministic, generator=g1)
        with torch.no_grad():
            dist, s_ref = actor.step(obs, mask, state, reset)
            a_ref = dist.mode() if deterministic else dist.sample(g2)
        assert torch.equal(a, a_ref)
        assert torch.equal(logp, dist.log_prob(a_ref))
        for x, y in zip(s, s_ref, strict=True):
            assert torch.equal(x, y)
        assert mask.gather(-1, a.unsqueeze(-1))[1:].all(), "a masked action was chosen"
        if not deterministic:  # the same noise drawn in advance (as rollouts do) -> same result
            noise = neg_gumbel_noise(tuple(mask.shape), torch.Generator().manual_seed(7))
            a2, logp2, _ = actor.act(obs, mask, state, reset, neg_gumbel=noise)
            assert torch.equal(a2, a) and torch.equal(logp2, logp)
    with pytest.raises(ValueError, match="mask shape"):
        actor.act(obs, mask[..., :-1], state, reset)


@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_activation_reaches_actor_backbones_and_critic(activation):
    layout = AgentLayout.from_env(vector_env(2))
    cls = torch.nn.Tanh if activation == "tanh" else torch.nn.ReLU
    for backbone in ("mlp", "gru"):
        policy = MultiAgentPolicy(layout, backbone, 16, activation)
        acts = [m for m in policy.modules() if isinstance(m, (torch.nn.Tanh, torch.nn.ReLU))]
        assert acts and all(isinstance(m, cls) for m in acts)
    critic = CentralCritic(10, 3, 8, activation=activation)
    assert sum(isinstance(m, cls) for m in critic.trunk) == 2
    with pytest.raises(ValueError, match="activation must be one of"):
        CentralCritic(10, 3, 8, activation="sigmoid")
