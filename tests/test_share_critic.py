"""Issue 47, item 1: critic sharing (``--share-critic {all,type,none}``, MAPPO).

References: each agent's critic under each mode, by hand; a grouped critic's outputs equal
its critics' MLPs evaluated in numpy float64 from their weights, with each agent's individual
value from its own critic and no gradient across critics; the team advantage an agent
trains on equals a sequential numpy GAE over its own critic's team values; seed k of a
``--seeds`` batch equals seed k alone bit for bit; a checkpoint restores the critics; ``all``
builds and trains exactly as before (the one critic, drawn as before); options that do not
apply are refused.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from envs import multisearch_v0
from marl.algos.mappo import MAPPO, SeedMAPPO
from marl.models.policies import (
    AgentLayout,
    CentralCritic,
    GroupedCritic,
    critic_groups,
    make_critic,
)
from marl.run.config import ConfigError, TrainConfig, validate_config

ENV = {"grid_size": 8, "max_cycles": 20, "n_targets": 1}


def _layout() -> AgentLayout:
    return AgentLayout.from_env(multisearch_v0.vector_env(1, **ENV))


def _cfg(seed: int = 0, share_critic: str = "type", **extra) -> TrainConfig:
    extra = {"env": dict(ENV), **extra}
    cfg = TrainConfig(algo="mappo", num_envs=8, hidden_dim=16, epochs=2, num_minibatches=2,
                      rollout_steps=16, critic_hidden_dim=16, seed=seed,
                      share_critic=share_critic, parallel_update=False, progress=False,
                      **extra)  # fmt: skip
    validate_config(cfg)
    return cfg


def test_each_agents_critic_by_hand() -> None:
    layout = _layout()
    assert tuple(layout.agents) == ("scout_0", "scout_1", "rescuer_0", "rescuer_1")
    names = [t.name for t in layout.types]  # a type's index: its place in layout.types
    by_type = tuple(names.index(a.rsplit("_", 1)[0]) for a in layout.agents)
    assert sorted(set(by_type)) == [0, 1]
    assert critic_groups(layout, "all") == (0, 0, 0, 0)
    assert critic_groups(layout, "type") == by_type
    assert critic_groups(layout, "none") == (0, 1, 2, 3)
    with pytest.raises(ValueError, match="share_critic must be one of"):
        critic_groups(layout, "agents")


def _mlp_numpy(member: CentralCritic, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A CentralCritic's outputs from its weights in float64: trunk (relu), both heads."""
    w = {k: v.detach().double().numpy() for k, v in member.state_dict().items()}
    h = np.maximum(x @ w["trunk.0.weight"].T + w["trunk.0.bias"], 0.0)
    h = np.maximum(h @ w["trunk.2.weight"].T + w["trunk.2.bias"], 0.0)
    team = h @ w["team_head.weight"].T + w["team_head.bias"]
    ind = (h @ w["individual_head.weight"].T + w["individual_head.bias"]).reshape(
        *x.shape[:-1], member.n_agents, member.ensemble
    )
    return team, ind


@pytest.mark.parametrize("groups", [(0, 0, 1, 1), (1, 0, 1, 0), (0, 1, 2, 3)])
def test_a_grouped_critic_is_its_critics_side_by_side(groups) -> None:
    torch.manual_seed(0)
    critic = GroupedCritic(7, groups, hidden_dim=6, ensemble=2, activation="relu")
    assert critic.num_critics == max(groups) + 1
    x = torch.randn(5, 3, 7)
    team, ind = critic(x)
    G = critic.num_critics
    assert team.shape == (5, 3, G * 2) and ind.shape == (5, 3, 4, 2)
    xs = x.double().numpy()
    for g, member in enumerate(critic.members):
        ref_team, ref_ind = _mlp_numpy(member, xs)
        np.testing.assert_allclose(team[..., 2 * g : 2 * g + 2].detach().numpy(), ref_team,
                                   rtol=1e-5, atol=1e-6)  # fmt: skip
        agents = [i for i, gi in enumerate(groups) if gi == g]  # its heads in agent order
        for j, i in enumerate(agents):
            np.testing.assert_allclose(ind[..., i, :].detach().numpy(), ref_ind[..., j, :],
                                       rtol=1e-5, atol=1e-6)  # fmt: skip
    # an agent's value moves only its own critic's parameters
    ind[..., 0, :].sum().backward()
    for g, member in enumerate(critic.members):
        moved = any(p.grad is not None and p.grad.abs().sum() > 0 for p in member.parameters())
        assert moved == (g == groups[0])


def test_make_critic_builds_one_critic_where_every_agent_shares_it() -> None:
    layout = _layout()
    cfg = _cfg(share_critic="all")
    torch.manual_seed(4)
    ours = make_critic(layout, cfg)
    torch.manual_seed(4)
    before = CentralCritic(layout.state_dim, layout.n_agents, 16, 1, cfg.activation)
    assert type(ours) is CentralCritic
    for (n1, p1), (n2, p2) in zip(ours.state_dict().items(), before.state_dict().items(),
                                  strict=True):  # fmt: skip
        assert n1 == n2 and torch.equal(p1, p2)
    assert isinstance(make_critic(layout, _cfg(share_critic="type")), GroupedCritic)
    first = layout.types[0]
    one_type = AgentLayout(tuple(first.agents), (first,), layout.state_dim)
    assert type(make_critic(one_type, _cfg(share_critic="type"))) is CentralCritic


def _gae_numpy(r, v, nv, term, trunc, gamma, lam) -> np.ndarray:
    """Sequential GAE over [T, E] in float64."""
    T = r.shape[0]
    adv, nxt = np.zeros_like(v), np.zeros_like(v[0])
    for t in reversed(range(T)):
        delta = r[t] + gamma * (1.0 - term[t]) * nv[t] - v[t]
        done = np.maximum(term[t], trunc[t])
        nxt = delta + gamma * lam * (1.0 - done) * nxt
        adv[t] = nxt
    return adv


@pytest.mark.parametrize("share", ["type", "none"])
def test_each_agent_trains_on_its_own_critics_team_advantage(share) -> None:
    torch.manual_seed(1)
    algo = MAPPO(_cfg(1, share, value_ensemble=2, env={**ENV, "max_cycles": 6}), None)
    seen = {}
    original = algo.mix_and_whiten

    def spy(team, individual, keys, mask=None):
        seen["team"] = team.clone()
        return original(team, individual, keys, mask)

    algo.mix_and_whiten = spy
    batch = algo.collect()
    algo.advantages(batch, 0.0)
    G, K = algo.critic.num_critics, 2
    assert (2 if share == "type" else 4) == G
    assert batch.values_team.shape[-1] == G * K
    assert batch.truncated.any() and not batch.truncated.all()  # bootstraps, cut recursions
    v = algo._denormalize(batch.values_team, batch.values_individual)[0]
    nv = algo._denormalize(batch.next_values_team, batch.next_values_individual)[0]
    r = batch.reward_team.double().numpy()
    term = batch.terminated.double().numpy()
    trunc = batch.truncated.double().numpy()
    cfg = algo.cfg
    for i, g in enumerate(algo.critic.groups):
        heads = [
            _gae_numpy(r, v[..., g * K + k].double().numpy(), nv[..., g * K + k].double().numpy(),
                       term, trunc, cfg.gamma, cfg.gae_lambda)
            for k in range(K)
        ]  # fmt: skip
        np.testing.assert_allclose(seen["team"][..., i].numpy(), np.mean(heads, axis=0),
                                   rtol=1e-4, atol=1e-5)  # fmt: skip
    # the critics differ, so agents of different critics get different team advantages
    assert not torch.equal(seen["team"][..., 0], seen["team"][..., -1])


def test_seed_in_a_batch_equals_the_seed_alone_with_critics_per_type(one_thread) -> None:
    big = SeedMAPPO([_cfg(s) for s in (0, 1)])
    alone = SeedMAPPO([_cfg(1)])
    before = [p[1].clone() for p in big.critic.parameters()]
    for i in range(2):
        big.iteration([i / 2] * 2)
        alone.iteration([i / 2])
    names = [n for n, _ in big.critic.named_parameters()]
    assert names and all(n.startswith("members.") for n in names)
    for a, b in zip(big.critic.parameters(), alone.critic.parameters(), strict=True):
        assert torch.equal(a[1], b[0])
    for a, b in zip(big.policy.parameters(), alone.policy.parameters(), strict=True):
        assert torch.equal(a[1], b[0])
    trained = zip(big.critic.parameters(), before, strict=True)
    assert any(not torch.equal(a[1], p0) for a, p0 in trained)
    # a seed unstacked is a plain run's critic
    critic = big.critic.unstack()[1]
    assert isinstance(critic, GroupedCritic)
    state = torch.randn(3, critic.members[0].trunk[0].in_features)
    with torch.no_grad():
        ours, theirs = critic(state), big.critic(state[None].expand(2, 3, -1))
    torch.testing.assert_close(ours, (theirs[0][1], theirs[1][1]))  # bmm vs linear: rounding


def test_a_checkpoint_restores_the_critics() -> None:
    torch.manual_seed(2)
    algo = MAPPO(_cfg(2, "none"), None)
    algo.iteration(0.0)
    state = algo.state_dict()
    torch.manual_seed(5)
    other = MAPPO(_cfg(2, "none"), None)
    other.load_state_dict(state)
    for (n1, p1), (n2, p2) in zip(algo.critic.state_dict().items(),
                                  other.critic.state_dict().items(), strict=True):  # fmt: skip
        assert n1 == n2 and torch.equal(p1, p2)
    x = torch.randn(4, algo.layout.state_dim)
    with torch.no_grad():
        assert all(torch.equal(a, b) for a, b in zip(algo.critic(x), other.critic(x), strict=True))


def test_options_that_do_not_apply_are_refused() -> None:
    with pytest.raises(ConfigError, match="--share-critic.*allowed: all, type, none"):
        validate_config(TrainConfig(share_critic="agents"))
    with pytest.raises(ConfigError, match="--share-critic does not apply to --algo grpo"):
        validate_config(TrainConfig(algo="grpo", share_critic="type"))
