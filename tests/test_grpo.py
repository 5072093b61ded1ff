"""GRPO building blocks (marl.algos.grpo) against hand-worked examples and numpy loop references."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from marl.algos import grpo
from marl.core.advantages import kl_k3
from marl.run.config import ConfigError, TrainConfig, _coerce, parse_cli

TINY_ENV = {"grid_size": 8, "max_cycles": 30, "n_targets": 2, "n_scouts": 1, "n_rescuers": 2}


# ---------------------------------------------------------------- numpy references


def ref_group_norm(values, keys, *, scale=True, loo=False, eps=1e-8):
    """Per-key (x - mean) / (std + eps) with loops, float64; 0 for one-entry/zero-var keys."""
    values, keys = np.asarray(values, np.float64), np.asarray(keys)
    out = np.zeros_like(values)
    for k in np.unique(keys):
        sel = keys == k
        x = values[sel]
        n, mean, std = x.size, x.mean(), x.std()
        if n <= 1 or std == 0:
            continue
        centred = x - mean
        if loo:  # baseline = mean of the other entries
            centred = np.array([x[i] - np.delete(x, i).mean() for i in range(n)])
        out[sel] = centred / (std + eps) if scale else centred
    return out


def ref_outcome(team, ind, groups, types, alpha, **kw):
    E, N = ind.shape
    a_team = ref_group_norm(team, groups, **kw)
    keys = np.array([[groups[e] * 100 + types[i] for i in range(N)] for e in range(E)])
    a_ind = ref_group_norm(ind.ravel(), keys.ravel(), **kw).reshape(E, N)
    return alpha * a_team[:, None] + (1 - alpha) * a_ind


def ref_process(rewards, valid, keys, *, scale=True, eps=1e-8):
    """rewards [T, M], valid [T, M], keys [M]: group-normalised step rewards summed from t."""
    T, M = rewards.shape
    norm = np.zeros((T, M))
    for k in np.unique(keys):
        cols = keys == k
        x = rewards[:, cols][valid[:, cols]]
        mean, std = x.mean(), x.std()
        if x.size <= 1 or std == 0:
            continue
        z = (rewards[:, cols] - mean) / (std + eps) if scale else rewards[:, cols] - mean
        norm[:, cols] = np.where(valid[:, cols], z, 0.0)
    out = np.zeros((T, M))
    for m in range(M):
        for t in range(T):
            if valid[t, m]:
                out[t, m] = norm[t:, m][valid[t:, m]].sum()
    return out


# ---------------------------------------------------------------- seeds and groups


def test_group_seeds_distinct_across_updates_and_ranks():
    seen = set()
    for update in range(5):
        for rank in range(3):
            s = grpo.group_seeds(7, update, 4, rank=rank, world_size=3)
            assert len(s) == 4
            assert not seen & set(s)
            seen |= set(s)
    assert min(seen) >= grpo.GRPO_SEED_BASE  # far from validation seeds
    assert grpo.group_seeds(7, 2, 4) == grpo.group_seeds(7, 2, 4)  # deterministic (resume)
    assert grpo.group_seeds(7, 0, 4) != grpo.group_seeds(8, 0, 4)
    assert grpo.group_reset_seeds([10, 20], 3) == [10, 10, 10, 20, 20, 20]
    assert grpo.group_ids_for(2, 3).tolist() == [0, 0, 0, 1, 1, 1]
    with pytest.raises(ValueError, match="distinct"):
        grpo.group_reset_seeds([1, 1], 2)
    with pytest.raises(ValueError, match="rank"):
        grpo.group_seeds(0, 0, 4, rank=2, world_size=2)


@pytest.fixture(scope="module")
def tiny_batch():
    from envs.multisearch_v0 import vector_env
    from marl.models.policies import AgentLayout, MultiAgentPolicy

    P, G = 3, 4
    vec = vector_env(P * G, autoreset=False, **TINY_ENV)
    layout = AgentLayout.from_env(vec)
    torch.manual_seed(0)
    policy = MultiAgentPolicy(layout, "mlp", 16)
    seeds = grpo.group_seeds(0, 0, P)
    batch = grpo.collect_group_episodes(
        vec, layout, policy, seeds, G, generator=torch.Generator().manual_seed(1)
    )
    return vec, layout, policy, batch, P, G


def test_group_construction_same_seed_same_initial_state(tiny_batch):
    vec, layout, _, batch, P, G = tiny_batch
    E = P * G
    assert batch.num_envs == E and batch.group_ids.tolist() == sum([[p] * G for p in range(P)], [])
    init = batch.initial_state.view(P, G, -1)
    for p in range(P):
        for g in range(1, G):
            assert torch.equal(init[p, g], init[p, 0])  # same seed: identical initial state
        for q in range(p + 1, P):
            assert not torch.equal(init[p, 0], init[q, 0])  # groups differ
    # a fresh reset of env 0 with that seed gives the same state (the seed defines the group)
    from envs.multisearch_v0 import vector_env

    solo = vector_env(1, autoreset=False, **TINY_ENV)
    solo.reset(seed=[batch.seeds[G]])
    assert np.array_equal(solo.state()[0], batch.initial_state[G].numpy())
    # the G episodes of a group diverge (sampled actions), so they are not copies
    first_actions = batch.actions[layout.types[0].name][:, :G]
    assert not all(torch.equal(first_actions[:, 0], first_actions[:, g]) for g in range(1, G))


def test_collection_masks_steps_after_each_episode_end(tiny_batch):
    _, layout, _, batch, P, G = tiny_batch
    T, E = batch.num_steps, batch.num_envs
    assert int(batch.lengths.max()) == T
    assert TINY_ENV["max_cycles"] >= T
    t = torch.arange(T)[:, None]
    assert torch.equal(batch.valid, t < batch.lengths[None, :])
    assert torch.all(batch.terminated ^ batch.truncated)  # each episode ended exactly one way
    assert torch.all(batch.lengths[batch.truncated] == TINY_ENV["max_cycles"])
    assert torch.all(batch.reward_team[~batch.valid] == 0)
    assert torch.all(batch.reward_individual[~batch.valid] == 0)
    assert len(batch.episodes) == E
    team, ind, pen = grpo.episode_returns(batch)
    # returns agree with the env's own episode bookkeeping (EpisodeTracker, same sums)
    assert np.allclose(sorted(team.tolist()), sorted(e["return_team"] for e in batch.episodes))
    assert batch.env_steps == int(batch.lengths.sum())


def test_collection_rejects_autoreset_env_and_wrong_size(tiny_batch):
    from envs.multisearch_v0 import vector_env

    _, layout, policy, _, _, _ = tiny_batch
    with pytest.raises(ValueError, match="autoreset=False"):
        grpo.collect_group_episodes(vector_env(4, **TINY_ENV), layout, policy, [1, 2], 2)
    with pytest.raises(ValueError, match="num_envs"):
        vec = vector_env(6, autoreset=False, **TINY_ENV)
        grpo.collect_group_episodes(vec, layout, policy, [1, 2], 2)


# ---------------------------------------------------------------- outcome advantages


def test_outcome_hand_worked_example():
    # 2 groups of 2 episodes, agents: two of type 0, one of type 1
    team = torch.tensor([1.0, 5.0, 2.0, 2.0])
    ind = torch.tensor(
        [[0.0, 2.0, 1.0], [4.0, 2.0, 1.0], [3.0, 3.0, 0.0], [3.0, 3.0, 4.0]], dtype=torch.float64
    )
    groups = torch.tensor([0, 0, 1, 1])
    types = torch.tensor([0, 0, 1])
    adv, info = grpo.outcome_advantages(team.double(), ind, groups, types, alpha=0.25)
    # team: group 0 mean 3 std 2 -> [-1, 1]; group 1 constant -> 0
    assert info["team"].tolist() == pytest.approx([-1, 1, 0, 0])
    # individual, group 0 type 0: {0, 2, 4, 2} mean 2 std sqrt(2); type 1: {1, 1} -> 0
    # group 1 type 0: {3, 3, 3, 3} -> 0; type 1: {0, 4} -> [-1, 1]
    r2 = math.sqrt(2)
    expected_ind = [[-r2, 0, 0], [r2, 0, 0], [0, 0, -1], [0, 0, 1]]
    assert info["individual"].numpy() == pytest.approx(np.array(expected_ind), abs=1e-6)
    expected = 0.25 * np.array([-1, 1, 0, 0])[:, None] + 0.75 * np.array(expected_ind)
    assert adv.numpy() == pytest.approx(expected, abs=1e-6)
    assert info["zero_groups"].tolist() == [False, False]  # group 1 has individual signal
    assert info["frac_zero_std"] == 0.0
    assert info["frac_zero_std_team"] == 0.5  # one of two groups has a constant team return


def test_outcome_no_std_and_rloo_hand_worked():
    team = torch.tensor([1.0, 5.0, 3.0], dtype=torch.float64)
    ind = torch.zeros(3, 1, dtype=torch.float64)
    groups, types = torch.tensor([0, 0, 0]), torch.tensor([0])
    # group mean 3, population std sqrt(8/3)
    adv, _ = grpo.outcome_advantages(team, ind, groups, types, alpha=1.0, scale_std=False)
    assert adv[:, 0].tolist() == pytest.approx([-2.0, 2.0, 0.0])  # Dr. GRPO: centre only
    adv, _ = grpo.outcome_advantages(
        team, ind, groups, types, alpha=1.0, scale_std=False, leave_one_out=True
    )
    # RLOO: R_i - mean of the others: 1 - 4, 5 - 2, 3 - 3
    assert adv[:, 0].tolist() == pytest.approx([-3.0, 3.0, 0.0])
    adv, _ = grpo.outcome_advantages(team, ind, groups, types, alpha=1.0, leave_one_out=True)
    assert adv[:, 0].numpy() == pytest.approx(np.array([-3.0, 3.0, 0.0]) / math.sqrt(8 / 3))


@pytest.mark.parametrize("scale", [True, False])
@pytest.mark.parametrize("loo", [False, True])
@pytest.mark.parametrize("alpha", [0.0, 0.3, 1.0])
def test_outcome_matches_loop_reference(scale, loo, alpha):
    rng = np.random.default_rng(3)
    P, G, N = 5, 4, 4
    types = np.array([0, 0, 1, 1])
    team = rng.integers(0, 3, P * G).astype(np.float64)  # ties -> some zero-variance groups
    team[:G] = 1.0
    ind = rng.normal(size=(P * G, N))
    ind[G : 2 * G] = 0.5  # a group with constant individual returns
    groups = np.repeat(np.arange(P), G)
    adv, info = grpo.outcome_advantages(
        torch.from_numpy(team),
        torch.from_numpy(ind),
        torch.from_numpy(groups),
        torch.from_numpy(types),
        alpha=alpha,
        scale_std=scale,
        leave_one_out=loo,
    )
    want = ref_outcome(team, ind, groups, types, alpha, scale=scale, loo=loo)
    np.testing.assert_allclose(adv.numpy(), want, rtol=1e-9, atol=1e-9)
    zero_team = [np.ptp(team[groups == p]) == 0 for p in range(P)]
    zero_ind = [np.ptp(ind[groups == p]) == 0 for p in range(P)]
    expect_zero = [
        (alpha == 0 or zt) and (alpha == 1 or zi)
        for zt, zi in zip(zero_team, zero_ind, strict=True)
    ]
    assert info["zero_groups"].tolist() == expect_zero
    assert info["frac_zero_std"] == pytest.approx(np.mean(expect_zero))


def test_zero_variance_groups_give_zero_and_are_counted():
    team = torch.tensor([2.0, 2.0, 2.0, 0.0, 1.0, 2.0], dtype=torch.float64)
    ind = torch.ones(6, 2, dtype=torch.float64)
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    adv, info = grpo.outcome_advantages(team, ind, groups, torch.tensor([0, 1]), alpha=0.5)
    assert torch.all(adv[:3] == 0) and torch.all(torch.isfinite(adv))
    assert info["zero_groups"].tolist() == [True, False]
    assert info["frac_zero_std"] == 0.5


def test_inner_batch_groups_individual_returns_over_all_agents():
    ind = torch.tensor([[0.0, 4.0], [2.0, 2.0]], dtype=torch.float64)
    team = torch.zeros(2, dtype=torch.float64)
    args = (team, ind, torch.tensor([0, 0]), torch.tensor([0, 1]))
    adv, _ = grpo.outcome_advantages(*args, alpha=0.0, inner="batch")
    assert adv.numpy() == pytest.approx(
        np.array([[-1.0, 1.0], [0.0, 0.0]]) / 1.0 * 2 / math.sqrt(2)
    )
    adv_type, _ = grpo.outcome_advantages(*args, alpha=0.0, inner="type")
    assert adv_type.numpy() == pytest.approx(np.array([[-1.0, 1.0], [1.0, -1.0]]))


# ---------------------------------------------------------------- process advantages


def test_process_hand_worked_example():
    # one group of two episodes, one agent; episode 1 ends after 2 steps
    team = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 9.0]], dtype=torch.float64)
    valid = torch.tensor([[True, True], [True, True], [True, False]])
    ind = torch.zeros(3, 2, 1, dtype=torch.float64)
    adv, info = grpo.process_step_advantages(
        team, ind, valid, torch.tensor([0, 0]), torch.tensor([0]), alpha=1.0
    )
    # valid rewards 1, 0, 1 | 0, 2: mean 0.8, std sqrt(0.56)
    s = math.sqrt(0.56)
    z = lambda r: (r - 0.8) / s  # noqa: E731
    expected = [[z(1) + z(0) + z(1), z(0) + z(2)], [z(0) + z(1), z(2)], [z(1), 0.0]]
    assert adv[..., 0].numpy() == pytest.approx(np.array(expected), abs=1e-6)
    assert info["frac_zero_std"] == 0.0


@pytest.mark.parametrize("scale", [True, False])
def test_process_matches_loop_reference(scale):
    rng = np.random.default_rng(5)
    T, P, G, N = 6, 3, 3, 3
    E = P * G
    types = np.array([0, 1, 1])
    lengths = rng.integers(2, T + 1, E)
    valid = np.arange(T)[:, None] < lengths[None, :]
    team = rng.normal(size=(T, E)) * valid
    ind = rng.normal(size=(T, E, N)) * valid[..., None]
    ind[:, :G] = 0.0  # group 0: no individual signal
    groups = np.repeat(np.arange(P), G)
    adv, info = grpo.process_step_advantages(
        torch.from_numpy(team),
        torch.from_numpy(ind),
        torch.from_numpy(valid),
        torch.from_numpy(groups),
        torch.from_numpy(types),
        alpha=0.4,
        scale_std=scale,
    )
    want_team = ref_process(team, valid, groups, scale=scale)
    keys = np.array([groups[e] * 10 + types[i] for e in range(E) for i in range(N)])
    want_ind = ref_process(
        ind.reshape(T, E * N), np.repeat(valid, N, axis=1), keys, scale=scale
    ).reshape(T, E, N)
    want = 0.4 * want_team[..., None] + 0.6 * want_ind
    np.testing.assert_allclose(adv.numpy(), want * valid[..., None], rtol=1e-8, atol=1e-8)


# ---------------------------------------------------------------- batch-level pipeline


def test_grpo_advantages_penalty_channel_and_shaping(tiny_batch):
    _, layout, _, batch, P, G = tiny_batch
    type_ids = torch.tensor([0 if a.startswith("scout") else 1 for a in layout.agents])
    team, ind, pen = grpo.episode_returns(batch)
    groups = batch.group_ids.numpy()
    types = type_ids.numpy()
    T, E, N = batch.num_steps, batch.num_envs, len(layout.agents)
    valid = batch.valid.numpy()[..., None]
    for channel, ind_ret in (("individual", ind + pen), ("none", ind)):
        adv, info = grpo.grpo_advantages(batch, type_ids, alpha=0.5, penalty_channel=channel)
        want = ref_outcome(team.numpy(), ind_ret.numpy(), groups, types, 0.5)
        np.testing.assert_allclose(adv.numpy(), want[None] * valid, rtol=1e-5, atol=1e-5)
    adv, info = grpo.grpo_advantages(batch, type_ids, alpha=0.5, penalty_shaping=True)
    want = ref_outcome(team.numpy(), ind.numpy(), groups, types, 0.5)  # penalty kept apart
    np.testing.assert_allclose(adv.numpy(), want[None] * valid, rtol=1e-5, atol=1e-5)
    keys = groups[:, None] * 100 + types[None, :]
    cost = ref_group_norm(-pen.numpy().ravel(), keys.ravel()).reshape(E, N)
    np.testing.assert_allclose(info["penalty"].numpy(), cost[None] * valid, rtol=1e-5, atol=1e-5)
    assert info["raw"].shape == (T, E, N)


def test_kl_k3_values():
    logp = torch.log(torch.tensor([0.5, 0.25, 0.8]))
    ref = torch.log(torch.tensor([0.25, 0.25, 0.4]))
    # k3 = r - log r - 1 with r = pi_ref / pi
    expected = [0.5 - math.log(0.5) - 1, 0.0, 0.5 - math.log(0.5) - 1]
    assert kl_k3(logp, ref).tolist() == pytest.approx(expected, abs=1e-6)
    # unbiased: the mean over samples of pi approaches KL(pi || pi_ref)
    p = torch.tensor([0.6, 0.3, 0.1], dtype=torch.float64)
    q = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
    exact = float((p * (p / q).log()).sum())
    estimate = float((p * kl_k3(p.log(), q.log())).sum())  # expectation over the 3 actions
    assert estimate == pytest.approx(exact, rel=1e-12)


# ---------------------------------------------------------------- configuration


def _cfg(**kw) -> TrainConfig:
    return TrainConfig(**{"algo": "grpo", **kw})


@pytest.mark.parametrize(
    "field,value",
    [
        ("value_epochs", "4"),
        ("value_clip", "0.1"),
        ("value_ensemble", "3"),
        ("critic_lr", "1e-3"),
        ("value_norm_beta", "0.9"),
        ("value_norm", "true"),
        ("gae_lambda", "0.9"),
        ("rollout_steps", "128"),
    ],
)
def test_value_head_options_rejected_for_grpo(field, value):
    flag = "--" + field.replace("_", "-")
    with pytest.raises(ConfigError, match=f"{flag} does not apply to --algo grpo.*mappo only"):
        parse_cli(["--algo", "grpo", flag, value])
    with pytest.raises(ConfigError, match=f"{flag} does not apply to --algo grpo"):
        TrainConfig(algo="grpo", **{field: _coerce(field, value)})


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"num_envs": 10, "group_size": 4}, "multiple of --group-size"),
        ({"grpo_advantage": "process", "grpo_leave_one_out": True}, "outcome only"),
        ({"ref_refresh": 5}, "kl-beta"),
        ({"whiten_inner": "position"}, "whiten-inner"),
        ({"group_size": 1, "num_envs": 4}, "group-size"),
    ],
)
def test_inapplicable_grpo_combinations_rejected(kw, match):
    with pytest.raises(ConfigError, match=match):
        _cfg(**kw).validate()


def test_grpo_only_options_rejected_for_mappo():
    with pytest.raises(ConfigError, match="kl-beta does not apply to --algo mappo.*grpo only"):
        TrainConfig(algo="mappo", kl_beta=0.1)
    with pytest.raises(ConfigError, match="group-size"):
        parse_cli(["--group-size", "8"])
    parse_cli(["--algo", "grpo", "--group-size", "8"])


# ---------------------------------------------------------------- the algorithm object


def _tiny_cfg(**kw) -> TrainConfig:
    base = dict(
        algo="grpo",
        num_envs=8,
        group_size=4,
        hidden_dim=16,
        epochs=2,
        num_minibatches=2,
        env=dict(TINY_ENV),
        seed=3,
    )
    base.update(kw)
    return TrainConfig(**base)


def test_grpo_iteration_updates_policy_and_reports_metrics():
    torch.manual_seed(0)
    algo = grpo.GRPO(_tiny_cfg(kl_beta=0.1, ref_refresh=2), None)
    before = [p.detach().clone() for p in algo.policy.parameters()]
    m = algo.iteration(0.0)
    for key in (
        "frac_zero_std",
        "adv/mean",
        "adv_raw/std",
        "loss/policy",
        "entropy",
        "approx_kl",
        "clip_frac_low",
        "grad_norm",
        "episode/success",
        "kl_ref",
    ):
        assert key in m, key
    assert 0.0 <= m["frac_zero_std"] <= 1.0
    assert m["kl_ref"] == pytest.approx(0.0, abs=1e-6)  # reference = initial policy
    assert m["env_steps_delta"] > 0 and m["groups"] == 2
    assert any(not torch.equal(a, b) for a, b in zip(before, algo.policy.parameters(), strict=True))
    m2 = algo.iteration(0.5)
    assert m2["kl_ref"] > 0  # the policy moved away from the reference
    m3 = algo.iteration(0.6)  # update index 2: the reference is refreshed first
    assert m3["kl_ref"] == pytest.approx(0.0, abs=1e-6)
    state = algo.state_dict()
    assert state["updates"] == 3 and "reference" in state


def test_filter_zero_std_drops_groups_from_the_loss(monkeypatch):
    torch.manual_seed(0)
    algo = grpo.GRPO(_tiny_cfg(grpo_filter_zero_std=True, alpha=1.0), None)
    seen = {}
    orig = algo.advantages

    def spy(batch, progress):
        adv, info = orig(batch, progress)
        seen["zero"], seen["mask"], seen["batch"] = info["zero_groups"], batch.loss_mask, batch
        return adv, info

    monkeypatch.setattr(algo, "advantages", spy)
    algo.iteration(0.0)
    batch, zero = seen["batch"], seen["zero"]
    keep_env = ~zero[batch.group_ids]
    assert torch.equal(seen["mask"], batch.valid & keep_env[None, :])


@pytest.mark.parametrize("backbone", ["mlp", "gru"])
def test_episode_units_reproduce_rollout_log_probs(backbone):
    """The update recomputes log-probs over whole episodes ([E, T], reset at t=0): at valid
    steps they equal the log-probs sampled step by step during collection (ratio 1)."""
    from envs.multisearch_v0 import vector_env
    from marl.models.policies import AgentLayout, MultiAgentPolicy

    vec = vector_env(6, autoreset=False, **TINY_ENV)
    layout = AgentLayout.from_env(vec)
    torch.manual_seed(4)
    policy = MultiAgentPolicy(layout, backbone, 16)
    batch = grpo.collect_group_episodes(vec, layout, policy, [11, 12, 13], 2)
    E, T = batch.num_envs, batch.num_steps
    resets = torch.zeros(E, T, dtype=torch.bool)
    resets[:, 0] = True
    valid = batch.valid.transpose(0, 1)
    for tp in layout.types:
        actor = policy.actors[tp.name]
        with torch.no_grad():
            dist = actor.sequence(
                batch.obs[tp.name].transpose(0, 1),
                batch.mask[tp.name].transpose(0, 1),
                actor.initial_state(E),
                resets,
            )
        logp = dist.log_prob(batch.actions[tp.name].transpose(0, 1))
        old = batch.logp[tp.name].transpose(0, 1)
        torch.testing.assert_close(logp[valid], old[valid], rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_grpo_iteration_on_cuda():
    torch.manual_seed(0)
    algo = grpo.GRPO(_tiny_cfg(kl_beta=0.1), None, device="cuda")
    m = algo.iteration(0.0)
    assert all(p.is_cuda for p in algo.policy.parameters())
    assert math.isfinite(m["loss/policy"]) and m["kl_ref"] == pytest.approx(0.0, abs=1e-5)


def test_grpo_parallel_types_match_sequential_update():
    """Each agent type's actor forward/backward in its own thread gives bit-identical
    parameters and metrics to running the types one after another (KL term and offset on)."""
    runs = []
    for parallel in (False, True):
        torch.manual_seed(0)
        algo = grpo.GRPO(
            _tiny_cfg(kl_beta=0.1, optimism_offset=0.5, parallel_update=parallel), None
        )
        metrics = [algo.iteration(0.0) for _ in range(2)]
        runs.append((algo, metrics))
    (seq, m_seq), (par, m_par) = runs
    for a, b in zip(seq.policy.parameters(), par.policy.parameters(), strict=True):
        assert torch.equal(a, b)
    for key in ("loss/policy", "entropy", "grad_norm", "approx_kl", "optimism_offset"):
        assert [m[key] for m in m_seq] == [m[key] for m in m_par]
