"""marl.models.seed_policies: seed-stacked actors and critic against S single-seed modules.

References are the single-seed modules of marl.models.policies, each called on its own seed's
inputs. Two kinds of equality (one torch thread, the many-seeds setting):

- seed k in a stack of 5 and seed k in a stack of one: bit-equal (``torch.equal``), for
  outputs, new states, sampled actions and every gradient;
- seed k in the stack and seed k's single-seed module: to float32 rounding (``RTOL``,
  ``ATOL``; gradients ``GRAD_RTOL``), because the batched layers run ``baddbmm`` where the
  single-seed ones run ``addmm``. Where the stack calls the single-seed module itself (the
  unbatched path of mamba and mamba2), the backbone's outputs and states are bit-equal.
"""

from __future__ import annotations

import copy

import pytest
import torch
from test_train_fakeenv import vector_env

from marl.algos.grpo import GRPO
from marl.algos.mappo import MAPPO
from marl.models.policies import AgentLayout, CentralCritic, MultiAgentPolicy, TypeActor
from marl.models.seed_policies import (
    SeedCentralCritic,
    SeedGRUBackbone,
    SeedLoopBackbone,
    SeedMLPBackbone,
    SeedMultiAgentPolicy,
    SeedTypeActor,
    build_seed_policies,
    seed_neg_gumbel_noise,
    stack_critics,
    stack_policies,
)
from marl.run.config import TrainConfig, validate_config

RTOL, ATOL = 1e-5, 1e-6
GRAD_RTOL, GRAD_ATOL = 1e-4, 1e-6
KINDS = ["mlp", "gru", "mamba", "mamba2"]
RECURRENT = ["gru", "mamba", "mamba2"]
S, OBS, N_AGENTS, ACTIONS, HIDDEN = 5, 7, 3, 5, 32
SEEDS = [11, 12, 13, 14, 15]
K = 3  # the seed compared in a stack of one


def make_actors(kind: str, seeds=SEEDS, activation: str = "tanh") -> list[TypeActor]:
    actors = []
    for seed in seeds:
        torch.manual_seed(seed)
        actors.append(TypeActor(OBS, N_AGENTS, ACTIONS, kind, HIDDEN, activation))
    return actors


def close(actual: torch.Tensor, expected: torch.Tensor, rtol=RTOL, atol=ATOL) -> None:
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol)


def random_state(actor: SeedTypeActor | TypeActor, num_envs: int, gen: torch.Generator):
    """A non-zero recurrent state (mamba conv and SSM states, GRU h), same layout."""
    return tuple(torch.randn(s.shape, generator=gen) for s in actor.initial_state(num_envs))


def seed_slice(state, k: int):
    return tuple(s[k] for s in state)


# ------------------------------------------------------------------------------------------
# rollout step
# ------------------------------------------------------------------------------------------


def step_inputs(num_seeds: int, E: int, gen: torch.Generator):
    obs = torch.randn(num_seeds, E, N_AGENTS, OBS, generator=gen)
    mask = torch.rand(num_seeds, E, N_AGENTS, ACTIONS, generator=gen) < 0.7
    mask[..., 0] = True
    reset = torch.rand(num_seeds, E, generator=gen) < 0.3
    return obs, mask, reset


@pytest.mark.parametrize("kind", KINDS)
def test_act_matches_single_seed_actors(one_thread, kind: str) -> None:
    actors = make_actors(kind)
    stacked = stack_policies(actors)
    assert isinstance(stacked, SeedTypeActor) and stacked.num_seeds == S
    expected_backbone = {"mlp": SeedMLPBackbone, "gru": SeedGRUBackbone}.get(kind, SeedLoopBackbone)
    assert type(stacked.backbone) is expected_backbone
    gen = torch.Generator().manual_seed(0)
    E = 16
    obs, mask, reset = step_inputs(S, E, gen)
    state = random_state(stacked, E, gen)
    noise_gens = [torch.Generator().manual_seed(100 + k) for k in range(S)]
    actions, logp, new_state = stacked.act(obs, mask, state, reset, generators=noise_gens)
    dist, step_state = stacked.step(obs, mask, state, reset)
    assert actions.shape == logp.shape == (S, E, N_AGENTS)
    for k in range(S):
        single_gen = torch.Generator().manual_seed(100 + k)
        a_k, logp_k, state_k = actors[k].act(
            obs[k], mask[k], seed_slice(state, k), reset[k], generator=single_gen
        )
        dist_k, step_state_k = actors[k].step(obs[k], mask[k], seed_slice(state, k), reset[k])
        assert torch.equal(actions[k], a_k)  # the same noise, logits to rounding
        close(logp[k], logp_k)
        close(dist.logits[k], dist_k.logits)
        assert len(new_state) == len(state_k) == len(step_state)
        # (act runs without autograd: mamba2's fused step kernel; step its readable twin)
        for ours, theirs in ((new_state, state_k), (step_state, step_state_k)):
            for s, s_k in zip(ours, theirs, strict=True):
                if kind in ("mamba", "mamba2"):  # the single-seed backbone itself
                    assert torch.equal(s[k], s_k)
                close(s[k], s_k)


# ------------------------------------------------------------------------------------------
# training windows: logits, gradients, burn-in, truncated BPTT
# ------------------------------------------------------------------------------------------


def window_inputs(kind: str, num_seeds: int, gen: torch.Generator):
    B, L = 4, 6
    P = 0 if kind == "mlp" else 3
    obs = torch.randn(num_seeds, B, P + L, N_AGENTS, OBS, generator=gen)
    mask = torch.rand(num_seeds, B, L, N_AGENTS, ACTIONS, generator=gen) < 0.7
    mask[..., 0] = True
    resets = torch.rand(num_seeds, B, P + L, generator=gen) < 0.2
    resets[:, 0, P + 2] = True  # an episode starts inside every seed's loss window
    resets[:, 1, 1] = True  # ... and inside a burn-in prefix
    burn_in = torch.randint(0, P + 1, (num_seeds, B), generator=gen)
    burn_in[:, 0] = P
    burn_in[0, :] = torch.arange(B) % (P + 1)  # seed 0 uses every length
    actions = torch.randint(0, ACTIONS, (num_seeds, B, L, N_AGENTS), generator=gen)
    weights = torch.randn(num_seeds, B, L, N_AGENTS, generator=gen)
    return obs, mask, resets, burn_in, actions, weights


def window_loss(dist, actions, weights) -> torch.Tensor:
    """A PPO-like loss of one seed's windows: weighted log-probs plus entropy."""
    return (dist.log_prob(actions) * weights).sum() + 0.1 * dist.entropy().sum()


def seed_grads(module, k: int) -> dict[str, torch.Tensor]:
    """Seed k's gradients under the single-seed parameter names."""
    params = dict(module.named_parameters())
    return {single: params[name].grad[k] for name, single in module.single_seed_names().items()}


@pytest.mark.parametrize("kind", KINDS)
def test_windows_and_gradients_match_single_seed_actors(one_thread, kind: str) -> None:
    actors = make_actors(kind)
    stacked = stack_policies(actors)
    gen = torch.Generator().manual_seed(1)
    obs, mask, resets, burn_in, actions, weights = window_inputs(kind, S, gen)
    B = obs.shape[1]
    state = random_state(stacked, B, gen) if stacked.is_recurrent else None
    dist = stacked.sequence(obs, mask, state, resets, burn_in=burn_in, tbptt_chunk=4)
    assert dist.logits.shape == (S, B, mask.shape[2], N_AGENTS, ACTIONS)
    sum(window_loss(dist_k, actions[k], weights[k]) for k, dist_k in enumerate(
        [type(dist)(dist.logits[k], mask[k]) for k in range(S)]
    )).backward()  # fmt: skip
    for k in range(S):
        dist_k = actors[k].sequence(
            obs[k],
            mask[k],
            None if state is None else seed_slice(state, k),
            resets[k],
            burn_in=burn_in[k],
            tbptt_chunk=4,
        )
        window_loss(dist_k, actions[k], weights[k]).backward()
        close(dist.logits[k], dist_k.logits)
        grads = seed_grads(stacked, k)
        singles = dict(actors[k].named_parameters())
        assert set(grads) == set(singles)
        for name, grad in grads.items():
            close(grad, singles[name].grad, rtol=GRAD_RTOL, atol=GRAD_ATOL)


@pytest.mark.parametrize("kind", RECURRENT)
def test_step_path_equals_window_path(one_thread, kind: str) -> None:
    """Stepping the stack through a window with resets gives the window's logits, to the
    tolerance the single-seed actors meet (tests/test_policies.py)."""
    stacked = stack_policies(make_actors(kind))
    gen = torch.Generator().manual_seed(2)
    obs, mask, resets, _, _, _ = window_inputs(kind, S, gen)
    obs, resets = obs[:, :, 3:], resets[:, :, 3:]  # no prefix
    B, L = obs.shape[1], obs.shape[2]
    state0 = random_state(stacked, B, gen)
    with torch.no_grad():
        window = stacked.sequence(obs, mask, state0, resets).log_probs
        state = state0
        for t in range(L):
            dist, state = stacked.step(obs[:, :, t], mask[:, :, t], state, resets[:, :, t])
            close(dist.log_probs, window[:, :, t], rtol=1e-5, atol=1e-5)


def test_feed_forward_inputs_path(one_thread) -> None:
    """``sequence_from_inputs`` (the mlp update's flattened rows) per seed."""
    actors = make_actors("mlp")
    stacked = stack_policies(actors)
    gen = torch.Generator().manual_seed(9)
    obs = torch.randn(S, 10, N_AGENTS, OBS, generator=gen)
    mask = torch.rand(S, 10, N_AGENTS, ACTIONS, generator=gen) < 0.7
    dist = stacked.sequence_from_inputs(stacked.inputs(obs), mask)
    for k in range(S):
        dist_k = actors[k].sequence_from_inputs(actors[k].inputs(obs[k]), mask[k])
        close(dist.log_probs[k], dist_k.log_probs)
    with pytest.raises(ValueError, match="feed-forward"):
        stack_policies(make_actors("gru", [0])).sequence_from_inputs(obs[:1], mask[:1])


# ------------------------------------------------------------------------------------------
# seed k does not depend on the other seeds
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_stack_of_one_is_bit_equal(one_thread, kind: str) -> None:
    actors = make_actors(kind)
    five, one = stack_policies(actors), stack_policies([actors[K]])
    gen = torch.Generator().manual_seed(3)
    # rollout step
    obs, mask, reset = step_inputs(S, 16, gen)
    state = random_state(five, 16, gen)
    gens_five = [torch.Generator().manual_seed(200 + k) for k in range(S)]
    gens_one = [torch.Generator().manual_seed(200 + K)]
    a5, lp5, st5 = five.act(obs, mask, state, reset, generators=gens_five)
    a1, lp1, st1 = one.act(
        obs[K : K + 1], mask[K : K + 1], tuple(s[K : K + 1] for s in state), reset[K : K + 1],
        generators=gens_one,
    )  # fmt: skip
    assert torch.equal(a5[K], a1[0]) and torch.equal(lp5[K], lp1[0])
    for s5, s1 in zip(st5, st1, strict=True):
        assert torch.equal(s5[K], s1[0])
    # windows and gradients
    obs, mask, resets, burn_in, actions, weights = window_inputs(kind, S, gen)
    B = obs.shape[1]
    state = random_state(five, B, gen) if five.is_recurrent else None
    sub = slice(K, K + 1)
    d5 = five.sequence(obs, mask, state, resets, burn_in=burn_in, tbptt_chunk=4)
    d1 = one.sequence(
        obs[sub], mask[sub], None if state is None else tuple(s[sub] for s in state),
        resets[sub], burn_in=burn_in[sub], tbptt_chunk=4,
    )  # fmt: skip
    assert torch.equal(d5.logits[K], d1.logits[0])
    lp5 = (d5.log_prob(actions) * weights).sum(dim=(1, 2, 3))  # [S]
    lp1 = (d1.log_prob(actions[sub]) * weights[sub]).sum(dim=(1, 2, 3))
    lp5.sum().backward()
    lp1.sum().backward()
    g5, g1 = seed_grads(five, K), seed_grads(one, 0)
    for name in g5:
        assert torch.equal(g5[name], g1[name]), name


def test_sampling_depends_on_the_own_generator_only(one_thread) -> None:
    actors = make_actors("gru")
    gen = torch.Generator().manual_seed(4)
    obs, mask, reset = step_inputs(S, 8, gen)
    state = random_state(actors[0], 8, gen)
    state = tuple(s.expand(S, *s.shape).contiguous() for s in state)

    def sample(seeds: list[int], noise_seeds: list[int]) -> torch.Tensor:
        stacked = stack_policies([actors[k] for k in seeds])
        gens = [torch.Generator().manual_seed(s) for s in noise_seeds]
        a, _, _ = stacked.act(
            obs[seeds], mask[seeds], tuple(s[seeds] for s in state), reset[seeds],
            generators=gens,
        )  # fmt: skip
        return a

    five = sample(list(range(S)), [300, 301, 302, 303, 304])
    two = sample([K, 0], [303, 999])
    alone = sample([K], [303])
    assert torch.equal(five[K], two[0]) and torch.equal(five[K], alone[0])
    assert not torch.equal(five[0], two[1])  # seed 0's own generator changed: its actions do
    # noise drawn in advance for a whole rollout: entry k is seed k's generator's draw
    noise = seed_neg_gumbel_noise((4, 8, N_AGENTS, ACTIONS), [torch.Generator().manual_seed(7)] * 1)
    assert noise.shape == (1, 4, 8, N_AGENTS, ACTIONS)
    stacked = stack_policies(actors)
    with pytest.raises(ValueError, match="generators"):
        stacked.act(obs, mask, state, reset)
    with pytest.raises(ValueError, match="one generator per seed"):
        stacked.act(obs, mask, state, reset, generators=[torch.Generator()])
    det, _, _ = stacked.act(obs, mask, state, reset, deterministic=True)
    for k in range(S):
        d_k, _, _ = actors[k].act(obs[k], mask[k], seed_slice(state, k), reset[k],
                                  deterministic=True)  # fmt: skip
        assert torch.equal(det[k], d_k)


# ------------------------------------------------------------------------------------------
# stacking: round trip, policies, critic, deep copies, in-place updates
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_stack_unstack_round_trip(kind: str) -> None:
    actors = make_actors(kind)
    originals = [copy.deepcopy(a.state_dict()) for a in actors]
    stacked = stack_policies(actors)
    back = stacked.unstack()
    assert len(back) == S
    for k in range(S):
        assert type(back[k]) is TypeActor and back[k] is not actors[k]
        got = back[k].state_dict()
        assert list(got) == list(originals[k])
        for name, value in originals[k].items():
            assert torch.equal(got[name], value), name
            assert torch.equal(actors[k].state_dict()[name], value)  # inputs untouched
    again = stack_policies(back)
    for (n1, p1), (n2, p2) in zip(
        stacked.named_parameters(), again.named_parameters(), strict=True
    ):
        assert n1 == n2 and torch.equal(p1, p2)


def layout():
    return AgentLayout.from_env(vector_env(2, n_callers=2, n_pickers=3))


@pytest.mark.parametrize("kind", ["gru", "mamba2"])
def test_multi_agent_policy_act_matches_per_seed_policies(one_thread, kind: str) -> None:
    lay = layout()
    policies = []
    for seed in SEEDS[:3]:
        torch.manual_seed(seed)
        policies.append(MultiAgentPolicy(lay, kind, hidden_dim=16))
    stacked = stack_policies(policies)
    assert isinstance(stacked, SeedMultiAgentPolicy) and stacked.is_recurrent
    gen = torch.Generator().manual_seed(5)
    E, s = 6, len(policies)
    obs = {t.name: torch.randn(s, E, t.n_agents, t.obs_dim, generator=gen) for t in lay.types}
    mask = {t.name: torch.ones(s, E, t.n_agents, t.n_actions, dtype=torch.bool)
            for t in lay.types}  # fmt: skip
    state = stacked.initial_state(E)
    reset = torch.zeros(s, E, dtype=torch.bool)
    reset[1, 2] = True
    actions, logps, new_state = stacked.act(
        obs,
        mask,
        state,
        reset,
        generators=[torch.Generator().manual_seed(50 + k) for k in range(s)],
    )
    for k, policy in enumerate(policies):
        a_k, lp_k, st_k = policy.act(
            {n: o[k] for n, o in obs.items()}, {n: m[k] for n, m in mask.items()},
            {n: seed_slice(st, k) for n, st in state.items()}, reset[k],
            generator=torch.Generator().manual_seed(50 + k),
        )  # fmt: skip
        for name in a_k:
            assert torch.equal(actions[name][k], a_k[name])
            close(logps[name][k], lp_k[name])
            for x, y in zip(new_state[name], st_k[name], strict=True):
                close(x[k], y)
    # noise drawn in advance for a rollout (as RolloutCollector draws it), per seed
    gens = [torch.Generator().manual_seed(70 + k) for k in range(s)]
    noise = {t.name: seed_neg_gumbel_noise((E, t.n_agents, t.n_actions), gens)
             for t in lay.types}  # fmt: skip
    drawn, _, _ = stacked.act(obs, mask, state, reset, neg_gumbel=noise)
    for k, policy in enumerate(policies):
        a_k, _, _ = policy.act(
            {n: o[k] for n, o in obs.items()}, {n: m[k] for n, m in mask.items()},
            {n: seed_slice(st, k) for n, st in state.items()}, reset[k],
            neg_gumbel={n: z[k] for n, z in noise.items()},
        )  # fmt: skip
        for name in a_k:
            assert torch.equal(drawn[name][k], a_k[name])
    for k, back in enumerate(stacked.unstack()):
        assert type(back) is MultiAgentPolicy
        for (n1, p1), (n2, p2) in zip(
            back.state_dict().items(), policies[k].state_dict().items(), strict=True
        ):
            assert n1 == n2 and torch.equal(p1, p2)


@pytest.mark.parametrize("activation", ["tanh", "silu"])
def test_critic_matches_single_seed_critics(one_thread, activation: str) -> None:
    critics = []
    for seed in SEEDS:
        torch.manual_seed(seed)
        critics.append(CentralCritic(9, 4, hidden_dim=32, ensemble=2, activation=activation))
    stacked = stack_critics(critics)
    assert isinstance(stacked, SeedCentralCritic)
    gen = torch.Generator().manual_seed(6)
    state = torch.randn(S, 12, 5, 9, generator=gen)  # [S, T, E, state_dim]
    team, individual = stacked(state)
    assert team.shape == (S, 12, 5, 2) and individual.shape == (S, 12, 5, 4, 2)
    (team.square().sum() + individual.sin().sum()).backward()
    one = stack_critics([critics[K]])
    team1, ind1 = one(state[K : K + 1])
    (team1.square().sum() + ind1.sin().sum()).backward()
    assert torch.equal(team[K], team1[0]) and torch.equal(individual[K], ind1[0])
    for (name, p5), p1 in zip(stacked.named_parameters(), one.parameters(), strict=True):
        assert torch.equal(p5.grad[K], p1.grad[0]), name
    for k in range(S):
        team_k, ind_k = critics[k](state[k])
        (team_k.square().sum() + ind_k.sin().sum()).backward()
        close(team[k], team_k)
        close(individual[k], ind_k)
        grads = seed_grads(stacked, k)
        for name, p in critics[k].named_parameters():
            close(grads[name], p.grad, rtol=GRAD_RTOL, atol=GRAD_ATOL)
    for k, back in enumerate(stacked.unstack()):
        for name, value in critics[k].state_dict().items():
            assert torch.equal(back.state_dict()[name], value)


@pytest.mark.parametrize("kind", ["mamba", "mamba2"])
def test_loop_backbone_follows_in_place_updates_and_copies(one_thread, kind: str) -> None:
    """The unbatched path's per-seed modules read the stack: an optimizer's in-place step is
    seen by the next rollout step, and a deep copy (GRPO's reference policy) is independent."""
    actors = make_actors(kind, SEEDS[:2])
    stacked = stack_policies(actors)
    gen = torch.Generator().manual_seed(8)
    obs, mask, reset = step_inputs(2, 4, gen)
    state = stacked.initial_state(4)
    before, _, _ = stacked.act(obs, mask, state, reset, deterministic=True)
    reference = copy.deepcopy(stacked)
    with torch.no_grad():
        for p in stacked.parameters():
            p.mul_(1.5).add_(0.01)
    _, lp_after, st_after = stacked.act(obs, mask, state, reset, deterministic=True)
    _, lp_ref, _ = reference.act(obs, mask, state, reset, deterministic=True)
    updated = stacked.unstack()
    for k in range(2):
        _, lp_k, st_k = updated[k].act(obs[k], mask[k], seed_slice(state, k), reset[k],
                                       deterministic=True)  # fmt: skip
        close(lp_after[k], lp_k)
        for s, s_k in zip(st_after, st_k, strict=True):
            assert torch.equal(s[k], s_k)
        _, lp_orig, _ = actors[k].act(obs[k], mask[k], seed_slice(state, k), reset[k],
                                      deterministic=True)  # fmt: skip
        close(lp_ref[k], lp_orig)


def test_errors_say_what_to_do() -> None:
    with pytest.raises(ValueError, match="at least one"):
        stack_policies([])
    with pytest.raises(TypeError, match="one type"):
        stack_policies([make_actors("mlp", [0])[0], make_actors("gru", [0])[0]])
    stacked = stack_policies(make_actors("gru", [0, 1]))
    with pytest.raises(ValueError, match=r"obs must have shape \[2, \*, 3, 7\]"):
        stacked.act(torch.zeros(3, 4, 3, 7), torch.ones(3, 4, 3, 5, dtype=torch.bool), (), None)
    obs = torch.zeros(2, 1, 4, 3, 7)
    with pytest.raises(ValueError, match="burn_in"):
        stacked.sequence(obs, torch.ones(2, 1, 2, 3, 5, dtype=torch.bool), None, None,
                         burn_in=torch.full((2, 1), 5))  # fmt: skip


# ------------------------------------------------------------------------------------------
# initialisation as the trainer does it
# ------------------------------------------------------------------------------------------

FAKE = "test_train_fakeenv:vector_env"


def _cfg(**kw):
    base = dict(env_fn=FAKE, num_envs=4, rollout_steps=12, env={"max_cycles": 5, "goal": 2},
                progress=False, hidden_dim=16, critic_hidden_dim=16)  # fmt: skip
    base.update(kw)
    cfg = TrainConfig(**base)
    validate_config(cfg)
    return cfg


@pytest.mark.parametrize("kind", ["mlp", "mamba2"])
def test_build_seed_policies_mirrors_the_trainer(kind: str) -> None:
    seeds = [4, 9]
    cfg = _cfg(backbone=kind, seq_len=4)
    rng_before = torch.get_rng_state()
    lay = AgentLayout.from_env(vector_env(2))
    policy, critic, generators = build_seed_policies(cfg, seeds, lay, critic=True)
    assert torch.equal(torch.get_rng_state(), rng_before)  # the global generator untouched
    assert isinstance(policy, SeedMultiAgentPolicy) and isinstance(critic, SeedCentralCritic)
    for k, seed in enumerate(seeds):
        torch.manual_seed(seed)  # as marl.run.train.train seeds a single-seed run
        algo = MAPPO(copy.deepcopy(cfg), None)
        for name, value in algo.policy.state_dict().items():
            assert torch.equal(policy.seed_state_dict(k)[name], value), name
        for name, value in algo.critic.state_dict().items():
            assert torch.equal(critic.seed_state_dict(k)[name], value), name
        # seed k's generator is where the run's global generator stands after construction
        assert torch.equal(generators[k].get_state(), torch.get_rng_state())
    grpo_cfg = TrainConfig(algo="grpo", env_fn=FAKE, num_envs=4, group_size=2, hidden_dim=16,
                           backbone=kind, env={"max_cycles": 5, "goal": 2})  # fmt: skip
    grpo_policy, none, grpo_generators = build_seed_policies(grpo_cfg, seeds, lay, critic=False)
    assert none is None
    for k, seed in enumerate(seeds):
        torch.manual_seed(seed)
        algo = GRPO(copy.deepcopy(grpo_cfg), None)
        for name, value in algo.policy.state_dict().items():
            assert torch.equal(grpo_policy.seed_state_dict(k)[name], value), name
        assert torch.equal(grpo_generators[k].get_state(), torch.get_rng_state())
    with pytest.raises(ValueError, match="distinct"):
        build_seed_policies(cfg, [1, 1], lay, critic=False)
