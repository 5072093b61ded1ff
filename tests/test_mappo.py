"""MAPPO pieces against independent references: windows, bootstrapping, GAE composition,
stored recurrent states."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_train_fakeenv import vector_env

from marl.algos.mappo import MAPPO, window_plan
from marl.collect import RolloutCollector
from marl.policies import AgentLayout, MultiAgentPolicy
from marl.run.config import TrainConfig, validate_config

FAKE = "test_train_fakeenv:vector_env"


def _cfg(**kw) -> TrainConfig:
    base = dict(
        env_fn=FAKE, num_envs=6, rollout_steps=12, env={"max_cycles": 5, "goal": 2}, progress=False
    )
    base.update(kw)
    cfg = TrainConfig(**base)
    validate_config(cfg)
    return cfg


def test_window_plan_hand_example():
    index, loss_mask, starts = window_plan(8, 4, 2)
    assert starts == [0, 2]
    assert index.tolist() == [[0, 1, 2, 3, 4, 5], [2, 3, 4, 5, 6, 7]]
    assert loss_mask.tolist() == [[1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1]]
    with pytest.raises(ValueError, match="divide"):
        window_plan(10, 4, 0)


class _Recorder:
    """Wraps a vector env and records state()/final_state after every step."""

    def __init__(self, vec):
        self.vec = vec
        self.final_states, self.states = [], []

    def __getattr__(self, name):
        return getattr(self.vec, name)

    def step(self, actions):
        out = self.vec.step(actions)
        self.final_states.append(np.array(self.vec.final_state))
        self.states.append(np.array(self.vec.state()))
        return out


def test_collector_bootstraps_truncation_only():
    torch.manual_seed(0)
    vec = _Recorder(vector_env(5, max_cycles=4, goal=1, n_callers=1, n_pickers=1))
    layout = AgentLayout.from_env(vec)
    policy = MultiAgentPolicy(layout, "mlp", 8)
    col = RolloutCollector(vec, layout, policy, seed=3)

    def value_fn(s):  # team: sum of the state; individual: agent j -> s[..., j]
        return s.sum(-1, keepdim=True), s[..., : layout.n_agents].unsqueeze(-1)

    b = col.collect(20, value_fn=value_fn)
    assert b.terminated.any() and b.truncated.any()
    T = b.num_steps
    for t in range(T):
        for e in range(5):
            if b.terminated[t, e]:
                expected = 0.0
            elif b.truncated[t, e]:
                expected = vec.final_states[t][e].sum()
            else:
                expected = vec.states[t][e].sum()
                if t + 1 < T:
                    assert b.values_team[t + 1, e, 0] == pytest.approx(expected, rel=1e-6)
            assert float(b.next_values_team[t, e, 0]) == pytest.approx(expected, rel=1e-5)
            if b.truncated[t, e]:
                np.testing.assert_allclose(
                    b.next_values_individual[t, e, :, 0].numpy(),
                    vec.final_states[t][e][: layout.n_agents],
                    rtol=1e-6,
                )
    # episode starts follow the ends
    assert b.episode_start[0].all()
    done = b.terminated | b.truncated
    assert torch.equal(b.episode_start[1:], done[:-1])


def _np_gae(r, v, nv, term, trunc, gamma, lam):
    T = len(r)
    adv = np.zeros(T)
    last = 0.0
    for t in reversed(range(T)):
        delta = r[t] + gamma * (0.0 if term[t] else nv[t]) - v[t]
        last = delta + gamma * lam * (0.0 if (term[t] or trunc[t]) else 1.0) * last
        adv[t] = last
    return adv


@pytest.mark.parametrize("penalty_channel", ["individual", "none"])
def test_advantages_are_team_plus_individual_gae(penalty_channel):
    torch.manual_seed(1)
    cfg = _cfg(
        whitening="none",
        value_ensemble=2,
        value_norm=False,
        penalty_channel=penalty_channel,
        gamma=0.9,
        gae_lambda=0.8,
    )
    algo = MAPPO(cfg, None)
    b = algo.collector.collect(12, value_fn=algo._values)
    per_type, _ = algo.advantages(b, 0.0)
    N = algo.layout.n_agents
    term, trunc = b.terminated.numpy(), b.truncated.numpy()
    for e in range(cfg.num_envs):
        team = np.mean(
            [
                _np_gae(
                    b.reward_team[:, e].numpy(),
                    b.values_team[:, e, k].numpy(),
                    b.next_values_team[:, e, k].numpy(),
                    term[:, e],
                    trunc[:, e],
                    0.9,
                    0.8,
                )
                for k in range(2)
            ],
            axis=0,
        )
        for j in range(N):
            r = b.reward_individual[:, e, j].numpy().astype(np.float64)
            if penalty_channel == "individual":
                r = r + b.reward_penalty[:, e, j].numpy()
            ind = np.mean(
                [
                    _np_gae(
                        r,
                        b.values_individual[:, e, j, k].numpy(),
                        b.next_values_individual[:, e, j, k].numpy(),
                        term[:, e],
                        trunc[:, e],
                        0.9,
                        0.8,
                    )
                    for k in range(2)
                ],
                axis=0,
            )
            tname = algo.layout.agents[j].rsplit("_", 1)[0]
            col = algo.layout.types[algo.layout.type_names.index(tname)].agents.index(
                algo.layout.agents[j]
            )
            np.testing.assert_allclose(
                per_type[tname][:, e, col].numpy(), team + ind, rtol=1e-4, atol=1e-5
            )


def test_default_whitening_is_team_individual_per_type():
    torch.manual_seed(2)
    algo = MAPPO(_cfg(), None)
    b = algo.collector.collect(12, value_fn=algo._values)
    per_type, info = algo.advantages(b, 0.0)
    for x in per_type.values():
        # alpha * whiten(team) + (1 - alpha) * whiten(ind), each zero-mean within the type
        assert abs(float(x.double().mean())) < 1e-5


def test_penalty_shaping_subtracts_beta_times_normalised_cost():
    torch.manual_seed(3)
    cfg0 = _cfg(penalty_channel="none")
    cfg1 = _cfg(penalty_channel="none", penalty_beta_schedule="constant", penalty_beta=0.3)
    a0, a1 = MAPPO(cfg0, None), MAPPO(cfg1, None)
    a1.critic.load_state_dict(a0.critic.state_dict())
    b = a0.collector.collect(12, value_fn=a0._values)
    p0, _ = a0.advantages(b, 0.0)
    p1, info = a1.advantages(b, 0.0)
    assert info["penalty_beta"] == 0.3
    # independent reference for the rescaled cost-to-go of one agent
    T = b.num_steps
    cost = -b.reward_penalty.numpy().astype(np.float64)
    done = (b.terminated | b.truncated).numpy()
    ctg = np.zeros_like(cost)
    last = np.zeros(cost.shape[1:])
    for t in reversed(range(T)):
        last = cost[t] + cfg1.gamma * (~done[t])[:, None] * last
        ctg[t] = last
    t0 = a0.layout.types[0]
    sel = ctg[:, :, list(t0.agent_ids)]
    ref = (sel - sel.mean()) / (sel.std() + 1e-8)
    np.testing.assert_allclose((p0[t0.name] - p1[t0.name]).numpy() / 0.3, ref, atol=1e-4)


@pytest.mark.parametrize(
    "backbone, burn_in",
    [("gru", 0), ("gru", 2), pytest.param("mamba", 2, marks=pytest.mark.slow)],
)
def test_recurrent_windows_reproduce_rollout_log_probs(backbone, burn_in):
    """Before any update the windowed recomputation equals the rollout's log-probs: stored
    initial states, resets at episode starts and burn-in are consistent."""
    torch.manual_seed(4)
    cfg = _cfg(backbone=backbone, hidden_dim=16, seq_len=4, burn_in=burn_in, rollout_steps=12)
    algo = MAPPO(cfg, None)
    algo.collector.collect(5, value_fn=algo._values)  # start mid-episode with non-zero state
    b = algo.collector.collect(
        12, value_fn=algo._values, window_state_steps=algo.actor.window_state_steps(12)
    )
    assert (b.episode_start[1:]).any()
    per_type, _ = algo.advantages(b, 0.0)
    units = algo.actor._units(b, per_type)
    for t in algo.layout.types:
        d = units["types"][t.name]
        dist = algo.policy.actors[t.name].sequence(d["obs"], d["mask"], d["state"], units["resets"])
        logp = dist.log_prob(d["actions"])
        lm = units["loss_mask"][..., None].expand_as(logp)
        torch.testing.assert_close(logp[lm], d["logp"][lm], atol=1e-5, rtol=1e-5)
        # every rollout step is covered exactly once by the loss masks
        assert int(lm.sum()) == b.num_steps * b.num_envs * t.n_agents


@pytest.mark.parametrize(
    "scheme",
    [
        "none",
        "batch",
        "type",
        "position",
        "chunk",
        "sequence",
        "type_position",
        "running",
        "running_ema",
        "team_individual",
        "center",
    ],
)
def test_every_whitening_scheme_runs_an_update(scheme):
    torch.manual_seed(5)
    chunk = {"chunk_size": 4} if scheme == "chunk" else {}  # rejected where it has no effect
    algo = MAPPO(_cfg(whitening=scheme, seq_len=4, adv_clip=3.0, **chunk), None)
    m = algo.iteration(0.0)
    assert np.isfinite(m["loss/policy"]) and np.isfinite(m["adv/std"])
    assert m["adv/max_abs"] <= 3.0 + 1e-6
    if scheme not in ("none", "center"):
        assert abs(m["adv/mean"]) < 1.0


def test_calibration_switches_run_together():
    torch.manual_seed(6)
    cfg = _cfg(
        dual_clip=3.0,
        value_clip=0.1,
        value_epochs=3,
        value_ensemble=3,
        optimism_offset=0.5,
        clip_low=0.1,
        clip_high=0.3,
        ent_coef_final=0.0,
        lr_schedule="linear",
        penalty_beta_schedule="linear",
        max_grad_norm=0.5,
    )
    algo = MAPPO(cfg, None)
    m1 = algo.iteration(0.0)
    m2 = algo.iteration(0.5)
    assert m2["lr"] == pytest.approx(cfg.lr * 0.5)
    assert m2["ent_coef"] == pytest.approx(0.005)
    assert m2["penalty_beta"] == pytest.approx(max(0.1, 0.5 * 0.5))
    assert m1["optimism_offset"] != 0.5  # b is trained
    assert algo.critic.team_head.out_features == 3


def _critic_job_error(self, *args):
    raise FloatingPointError("boom in the critic thread")


@pytest.mark.parametrize("backbone", ["mlp", "gru"])
def test_parallel_update_matches_sequential_update(backbone):
    """The critic's epochs in a second thread (alongside the next rollout's env steps, which
    is collected ahead and kept for the next iteration) give bit-identical parameters and
    metrics to running them after the policy's (the threading changes speed only)."""
    results = []
    for parallel in (False, True):
        torch.manual_seed(0)
        algo = MAPPO(_cfg(backbone=backbone, seq_len=4, parallel_update=parallel, seed=1), None)
        metrics = [algo.iteration(0.0) for _ in range(3)]
        assert (algo._ahead is not None) is parallel  # collected ahead only when parallel
        results.append((algo, metrics))
    (seq, m_seq), (par, m_par) = results
    for a, b in zip(
        seq.policy.state_dict().values(), par.policy.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b)
    for a, b in zip(
        seq.critic.state_dict().values(), par.critic.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b)
    for key in ("loss/value", "loss/policy", "explained_variance", "value_grad_norm"):
        assert [m[key] for m in m_seq] == [m[key] for m in m_par]


def test_rollout_collected_ahead_is_checkpointed_and_resumed_exactly():
    """A state_dict taken while a rollout is held (collected ahead) resumes to the same
    parameters as the uninterrupted run; without the held rollout in it, the env state
    would be one rollout ahead of the data."""
    torch.manual_seed(0)
    ref = MAPPO(_cfg(parallel_update=True, seed=2), None)
    for _ in range(3):
        ref.iteration(0.0)
    torch.manual_seed(0)
    first = MAPPO(_cfg(parallel_update=True, seed=2), None)
    first.iteration(0.0)
    state = first.state_dict()
    assert "ahead" in state
    rng = torch.get_rng_state()
    resumed = MAPPO(_cfg(parallel_update=True, seed=2), None)
    resumed.load_state_dict(state)
    torch.set_rng_state(rng)
    for _ in range(2):
        resumed.iteration(0.0)
    for a, b in zip(ref.policy.parameters(), resumed.policy.parameters(), strict=True):
        assert torch.equal(a, b)
    for a, b in zip(ref.critic.parameters(), resumed.critic.parameters(), strict=True):
        assert torch.equal(a, b)
    # with collect_ahead off (the training loop's setting before a checkpoint) none is held
    first.collect_ahead = False
    first.iteration(0.0)
    assert first._ahead is None and "ahead" not in first.state_dict()


def test_parallel_update_error_reaches_the_caller(monkeypatch):
    torch.manual_seed(0)
    algo = MAPPO(_cfg(parallel_update=True), None)
    monkeypatch.setattr(MAPPO, "update_critic", _critic_job_error)
    with pytest.raises(FloatingPointError, match="critic thread"):
        algo.iteration(0.0)


@pytest.mark.parametrize("backbone", ["mamba", "mamba2"])
def test_parallel_update_runs_mamba_types_one_after_another(backbone):
    """seqmodels' numba kernels must not be entered from two threads at once (numba's
    workqueue layer aborts the process): with mamba backbones the agent types are updated in
    turn, the critic still in its thread, and the results equal the sequential update's."""
    results = []
    for parallel in (False, True):
        torch.manual_seed(0)
        algo = MAPPO(_cfg(backbone=backbone, seq_len=4, parallel_update=parallel), None)
        assert algo.actor.parallel is False
        assert algo.parallel is parallel
        algo.iteration(0.0)
        results.append(algo)
    for a, b in zip(results[0].policy.parameters(), results[1].policy.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("max_norm", [0.5, 100.0, None])
def test_clip_grad_norm_matches_torch(max_norm):
    from marl.algos.mappo import clip_grad_norm

    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s)) for s in [(5, 3), (3,), (7, 2, 2)]]
    for p in params:
        p.grad = torch.randn_like(p)
    ref = [p.grad.clone() for p in params]
    ref_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for p, g in zip(ref_params, ref, strict=True):
        p.grad = g
    want = torch.nn.utils.clip_grad_norm_(
        ref_params, float("inf") if max_norm is None else max_norm
    )
    got = clip_grad_norm([p.grad for p in params], max_norm)
    assert torch.equal(got, want)
    for p, q in zip(params, ref_params, strict=True):
        assert torch.equal(p.grad, q.grad)
    # mixed dtypes go through torch's grouping: same norm, gradients clipped in place
    mixed = [torch.randn(4, dtype=torch.float64), torch.randn(3)]
    ref_mixed = [torch.nn.Parameter(g.clone()) for g in mixed]
    for p, g in zip(ref_mixed, mixed, strict=True):
        p.grad = g.clone()
    want = torch.nn.utils.clip_grad_norm_(ref_mixed, 1.0)
    got = clip_grad_norm(mixed, 1.0)
    assert torch.equal(got, want)
    for g, p in zip(mixed, ref_mixed, strict=True):
        assert torch.equal(g, p.grad)


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_adam_step_matches_optimizer_step(weight_decay):
    """The lean fused-Adam step gives bit-identical parameters and state to Adam.step()."""
    from marl.algos.mappo import adam_step

    torch.manual_seed(0)
    shapes = [(16, 9), (16,), (3, 16), (3,)]
    a = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    opt_a = torch.optim.Adam(a, lr=3e-3, eps=1e-5, weight_decay=weight_decay, fused=True)
    opt_b = torch.optim.Adam(b, lr=3e-3, eps=1e-5, weight_decay=weight_decay, fused=True)
    for k in range(6):
        for p, q in zip(a, b, strict=True):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
        if k == 3:  # a learning-rate schedule changes the group's lr between steps
            for opt in (opt_a, opt_b):
                opt.param_groups[0]["lr"] = 1e-3
        opt_a.step()
        adam_step(opt_b)  # the first call goes through opt_b.step() (creates the state)
    for p, q in zip(a, b, strict=True):
        assert torch.equal(p, q)
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(opt_a.state[p][key], opt_b.state[q][key])


@pytest.mark.parametrize("with_mask", [False, True])
def test_ppo_stats_of_stacked_minibatches_equal_the_per_minibatch_mean(with_mask):
    """The policy update's ratio statistics, computed after the epochs from a stack of the
    minibatches, equal the mean of per-minibatch ppo_stats calls (and the unequal-size
    fallback takes that loop)."""
    from marl.algos.mappo import _ppo_stats_mean
    from marl.core.losses import ppo_stats

    g = torch.Generator().manual_seed(3)
    records = []
    for _ in range(5):
        old = -torch.rand(64, generator=g) * 2
        logp = old + 0.4 * torch.randn(64, generator=g)
        dual = torch.rand(64, generator=g) < 0.1
        mask = (torch.rand(64, generator=g) < 0.7) if with_mask else None
        records.append((logp, old, dual, mask))
    loop = {}
    for logp, old, dual, mask in records:
        for k, v in ppo_stats(logp, old, dual, clip_low=0.1, clip_high=0.3, mask=mask).items():
            loop[k] = loop.get(k, 0.0) + float(v) / len(records)
    stacked = _ppo_stats_mean(records, 0.1, 0.3)
    assert stacked.keys() == loop.keys()
    for k in loop:
        assert stacked[k] == pytest.approx(loop[k], abs=1e-6)
    assert 0.0 < loop["clip_frac_high"] < 1.0 and loop["approx_kl"] > 0.0
    uneven = [*records[:4], tuple(None if x is None else x[:40] for x in records[4])]
    want = {}
    for logp, old, dual, mask in uneven:
        for k, v in ppo_stats(logp, old, dual, clip_low=0.1, clip_high=0.3, mask=mask).items():
            want[k] = want.get(k, 0.0) + float(v) / len(uneven)
    got = _ppo_stats_mean(uneven, 0.1, 0.3)
    for k in want:
        assert got[k] == pytest.approx(want[k], abs=1e-6)
