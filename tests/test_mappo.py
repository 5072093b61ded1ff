"""MAPPO pieces against independent references: windows, bootstrapping, GAE composition,
stored recurrent states."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_train_fakeenv import vector_env

from marl.algos.mappo import MAPPO, SeedMAPPO, window_plan
from marl.models.policies import AgentLayout, MultiAgentPolicy
from marl.rollout.collect import RolloutCollector
from marl.run.config import TrainConfig, validate_config

FAKE = "test_train_fakeenv:vector_env"


def _per_type(algo, final):
    """Final advantages ``[T, E, N]`` split per agent type ``[T, E, n_k]``."""
    return {t.name: final[:, :, list(t.agent_ids)] for t in algo.layout.types}


def _cfg(**kw):
    base = dict(
        env_fn=FAKE, num_envs=6, rollout_steps=12, env={"max_cycles": 5, "goal": 2}, progress=False
    )
    base.update(kw)
    cfg = TrainConfig(**base)
    validate_config(cfg)
    return cfg


def test_window_plan_hand_example():
    # T=8, L=4, burn-in 2: window 0 has no steps before it (its 2 prefix slots are padding,
    # step 0), window 1 burns in on steps 2, 3 from the state stored before step 2
    index, burn_in, starts = window_plan(8, 4, 2)
    assert starts == [0, 2]
    assert index.tolist() == [[0, 0, 0, 1, 2, 3], [2, 3, 4, 5, 6, 7]]
    assert burn_in.tolist() == [0, 2]
    # burn-in longer than the first windows' history: 0, 2 and 3 steps
    index, burn_in, starts = window_plan(6, 2, 3)
    assert burn_in.tolist() == [0, 2, 3] and starts == [0, 0, 1]
    assert index.tolist() == [[0, 0, 0, 0, 1], [0, 0, 1, 2, 3], [1, 2, 3, 4, 5]]
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
    b = algo.collector.collect(12, value_fn=algo.values)
    per_type = _per_type(algo, algo.advantages(b, 0.0).final)
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
    b = algo.collector.collect(12, value_fn=algo.values)
    per_type = _per_type(algo, algo.advantages(b, 0.0).final)
    for x in per_type.values():
        # alpha * whiten(team) + (1 - alpha) * whiten(ind), each zero-mean within the type
        assert abs(float(x.double().mean())) < 1e-5


def test_penalty_shaping_subtracts_beta_times_whitened_step_cost():
    """A' = A - beta * whiten_type(-reward_penalty_t): the step's own cost, whitened per
    agent type (numpy reference)."""
    torch.manual_seed(3)
    cfg0 = _cfg(penalty_channel="none")
    cfg1 = _cfg(penalty_channel="none", penalty_beta_schedule="constant", penalty_beta=0.3)
    a0, a1 = MAPPO(cfg0, None), MAPPO(cfg1, None)
    a1.critic.load_state_dict(a0.critic.state_dict())
    b = a0.collector.collect(12, value_fn=a0.values)
    p0 = _per_type(a0, a0.advantages(b, 0.0).final)
    adv1 = a1.advantages(b, 0.0)
    p1 = _per_type(a1, adv1.final)
    assert adv1.penalty_beta == 0.3
    cost = -b.reward_penalty.numpy().astype(np.float64)
    for t in a0.layout.types:
        sel = cost[:, :, list(t.agent_ids)]
        std = sel.std()
        ref = (sel - sel.mean()) / (std + 1e-8) if std > 0 else np.zeros_like(sel)
        np.testing.assert_allclose((p0[t.name] - p1[t.name]).numpy() / 0.3, ref, atol=1e-4)


def test_penalty_shaping_adds_no_ramp_across_the_rollout():
    """A constant penalty and no episode end carry no information about the actions: the
    shaping must leave the advantages unchanged (a cost-to-go summed only to the rollout's
    end would add a ramp of about -0.8 .. +0.9 across the rollout at beta 0.5)."""
    torch.manual_seed(3)
    env = {"max_cycles": 1000, "goal": 1000}
    cfg0 = _cfg(penalty_channel="none", env=env)
    cfg1 = _cfg(penalty_channel="none", env=env, penalty_beta_schedule="constant")
    a0, a1 = MAPPO(cfg0, None), MAPPO(cfg1, None)
    a1.critic.load_state_dict(a0.critic.state_dict())
    b = a0.collector.collect(32, value_fn=a0.values)
    assert not (b.terminated | b.truncated).any()
    b.reward_penalty.fill_(-0.1)  # a constant step cost
    torch.testing.assert_close(a1.advantages(b, 0.0).final, a0.advantages(b, 0.0).final)


@pytest.mark.parametrize(
    "backbone, burn_in",
    [("gru", 0), ("gru", 2), ("mamba", 2), ("gru", 4), ("mamba", 7)],
)
def test_recurrent_windows_reproduce_rollout_log_probs(backbone, burn_in):
    """Before any update the windowed recomputation equals the rollout's log-probs: stored
    initial states, resets at episode starts and burn-in are consistent. A burn-in as long as
    the window (4) or longer (7) makes several windows start their burn-in at step 0 (it once
    crashed the collector)."""
    torch.manual_seed(4)
    cfg = _cfg(backbone=backbone, hidden_dim=16, seq_len=4, burn_in=burn_in, rollout_steps=12)
    algo = MAPPO(cfg, None)
    algo.collector.collect(5, value_fn=algo.values)  # start mid-episode with non-zero state
    b = algo.collector.collect(12, value_fn=algo.values, window_state_steps=algo.window_starts)
    assert (b.episode_start[1:]).any()
    units = algo.policy_units(b, algo.advantages(b, 0.0).final)
    for t in algo.layout.types:
        mb = units[t.name]
        dist = algo.policy.actors[t.name].sequence(
            mb.obs, mb.action_mask, mb.state, mb.resets, burn_in=mb.burn_in
        )
        logp = dist.log_prob(mb.actions)
        lm = mb.loss_mask[..., None].expand_as(logp)
        torch.testing.assert_close(logp[lm], mb.old_logp[lm], atol=1e-5, rtol=1e-5)
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
    """The critic's epochs in a second thread (alongside the policy's) and, for recurrent
    actors, the agent types' actors side by side give bit-identical parameters and metrics to
    running them one after another (the threading changes speed only)."""
    results = []
    for parallel in (False, True):
        torch.manual_seed(0)
        algo = MAPPO(_cfg(backbone=backbone, seq_len=4, parallel_update=parallel, seed=1), None)
        metrics = [algo.iteration(0.0) for _ in range(3)]
        assert algo.parallel is parallel
        assert algo.policy_update.parallel is (parallel and backbone == "gru")
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


def test_types_side_by_side_with_the_offset_and_truncated_bptt():
    """The optimism offset is shared by the agent types but takes no gradient from their
    losses (b enters them detached; its own loss is backpropagated after both types), so the
    types run side by side with truncated BPTT too, bit for bit as in turn."""
    base = dict(backbone="gru", seq_len=4, optimism_offset=0.5, tbptt_chunk=2, seed=1)
    results = []
    for parallel in (False, True):
        torch.manual_seed(0)
        algo = MAPPO(_cfg(**base, parallel_update=parallel), None)
        assert algo.policy_update.parallel is parallel
        for _ in range(2):
            algo.iteration(0.0)
        results.append([p.detach().clone() for p in algo.policy_update.params])
    assert all(torch.equal(a, b) for a, b in zip(*results, strict=True))


def test_state_dict_resumes_exactly():
    """A state_dict taken between iterations resumes to the same parameters as the
    uninterrupted run (env state, recurrent state, optimisers, statistics)."""
    torch.manual_seed(0)
    ref = MAPPO(_cfg(seed=2), None)
    for _ in range(3):
        ref.iteration(0.0)
    torch.manual_seed(0)
    first = MAPPO(_cfg(seed=2), None)
    first.iteration(0.0)
    state = first.state_dict()
    rng = torch.get_rng_state()
    resumed = MAPPO(_cfg(seed=2), None)
    resumed.load_state_dict(state)
    torch.set_rng_state(rng)
    for _ in range(2):
        resumed.iteration(0.0)
    for a, b in zip(ref.policy.parameters(), resumed.policy.parameters(), strict=True):
        assert torch.equal(a, b)
    for a, b in zip(ref.critic.parameters(), resumed.critic.parameters(), strict=True):
        assert torch.equal(a, b)


def test_parallel_update_error_reaches_the_caller(monkeypatch):
    torch.manual_seed(0)
    algo = MAPPO(_cfg(parallel_update=True), None)
    monkeypatch.setattr(SeedMAPPO, "value_epochs_run", _critic_job_error)
    with pytest.raises(FloatingPointError, match="critic thread"):
        algo.iteration(0.0)


@pytest.mark.parametrize("backbone", ["mamba", "mamba2"])
def test_parallel_update_mamba_types_side_by_side_where_numba_allows(backbone, monkeypatch):
    """seqmodels' numba kernels may be entered from two threads at once only on a thread-safe
    numba layer (omp, tbb; workqueue aborts the process): there the agent types' actors run
    side by side, else one after another, the critic in its thread either way, and the
    results equal the sequential update's."""
    from seqmodels.kernels import numba_thread_safe

    safe = numba_thread_safe()
    results = []
    for parallel in (False, True):
        torch.manual_seed(0)
        algo = MAPPO(_cfg(backbone=backbone, seq_len=4, parallel_update=parallel), None)
        assert algo.parallel is parallel
        assert algo.policy_update.parallel is (parallel and safe)
        algo.iteration(0.0)
        results.append(algo)
    for a, b in zip(results[0].policy.parameters(), results[1].policy.parameters(), strict=True):
        assert torch.equal(a, b)
    # on a layer that is not thread-safe the types are updated in turn
    monkeypatch.setattr("seqmodels.backbones.numba_thread_safe", lambda: False)
    algo = MAPPO(_cfg(backbone=backbone, seq_len=4, parallel_update=True), None)
    assert algo.parallel is True and algo.policy_update.parallel is False


def test_sequence_whitening_key_never_spans_an_autoreset():
    """The sequence key is (window, episode, env, agent): an autoreset inside a window starts
    a new group (hand-worked: window 4, env 0 resets at step 2, env 1 never)."""
    from marl.algos.mappo import episode_segments

    start = torch.zeros(8, 2, dtype=torch.bool)
    start[2, 0] = True
    seg = episode_segments(start, 4)
    # env 0: steps 0-1 | 2-3 (reset) | 4-7 (window); env 1: steps 0-3 | 4-7
    groups0 = [seg[t, 0].item() for t in range(8)]
    groups1 = [seg[t, 1].item() for t in range(8)]
    assert groups0[0] == groups0[1] != groups0[2] == groups0[3] != groups0[4] == groups0[7]
    assert groups1[0] == groups1[3] != groups1[4] == groups1[7]
    assert not set(groups0) & set(groups1)  # envs never share a group
    # through MAPPO: a whitened 'sequence' scheme has zero mean inside every piece
    torch.manual_seed(0)
    algo = MAPPO(_cfg(whitening="sequence", seq_len=4, rollout_steps=12), None)
    batch = algo.collector.collect(12, value_fn=algo.values)
    assert (batch.episode_start[1:] & (torch.arange(1, 12) % 4 != 0)[:, None]).any()
    keys = algo.group_keys(batch)
    final = algo.advantages(batch, 0.0).final
    for g in torch.unique(keys.sequence_id):
        sel = keys.sequence_id.expand_as(final) == g
        if sel.sum() > 1:
            assert abs(float(final[sel].double().mean())) < 1e-4


def _batch_tensors(b):
    out = {"starts": b.episode_start, "state": b.state, "vt": b.values_team}
    for name in b.obs:
        out |= {f"obs/{name}": b.obs[name], f"mask/{name}": b.mask[name]}
        out |= {f"act/{name}": b.actions[name], f"logp/{name}": b.logp[name]}
    return out


def test_collector_reused_buffers_give_the_same_rollouts_and_spare_live_batches():
    """reuse_buffers: the same rollouts as fresh buffers (two collectors on one seed), the
    buffers of a dropped batch written again, a batch still held never overwritten."""
    runs = {}
    for reuse in (False, True):
        torch.manual_seed(0)
        algo = MAPPO(_cfg(backbone="gru", rollout_steps=8, seq_len=4), None)
        kept, ptrs = [], []
        for i in range(4):
            b = algo.collect(reuse_buffers=reuse)
            snap = {k: v.clone() for k, v in _batch_tensors(b).items()}
            ptrs.append(b.state.data_ptr())
            if i == 1:  # held across the next collects: must stay as it was
                kept.append((b, snap))
            runs.setdefault(reuse, []).append(snap)
            del b
        held, snap = kept.pop()
        for k, v in _batch_tensors(held).items():
            assert torch.equal(v, snap[k]), k
        if reuse:
            # rollout 1 reused rollout 0's buffers; rollouts 2 and 3 could not (1 is held)
            assert ptrs[1] == ptrs[0] and ptrs[1] not in ptrs[2:]
            del held
            assert algo.collect(reuse_buffers=True).state.data_ptr() == ptrs[1]
    for fresh, reused in zip(runs[False], runs[True], strict=True):
        for k in fresh:
            assert torch.equal(fresh[k], reused[k]), k
