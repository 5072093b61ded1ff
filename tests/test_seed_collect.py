"""marl.rollout.collect: S seeds' rollouts in one collector against single-seed references.

References, one torch thread:

- MAPPO's own single-seed collector: ``MAPPO(cfg with seed k)`` built after seeding as
  ``marl.run.train`` seeds a run, two consecutive ``collect()`` calls. Seed k's slice of the
  seed collector's rollouts must equal them bit for bit (observations, masks, actions,
  log-probs, values, next values, rewards, flags, episode starts, states, window states,
  episode records).
- the same seed collected in a stack of one: bit for bit as well.
"""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest
import torch

from marl.adapters.envapi import make_vector_env
from marl.algos.mappo import MAPPO
from marl.algos.ppo import window_plan
from marl.models.policies import AgentLayout
from marl.models.seed_policies import SeedCentralCritic, build_seed_policies
from marl.rollout.collect import RolloutBatch, RolloutCollector, SeedRolloutBatch
from marl.run.config import TrainConfig, validate_config

FAKE = "test_train_fakeenv:vector_env"
SEEDS = [0, 1, 2]
ROLLOUTS = 2


def make_cfg(
    backbone: str, seed: int = 0, value_ensemble: int = 1, num_envs: int = 4
) -> TrainConfig:
    # max_cycles 5 with goal 2: episodes end by termination and by truncation at different
    # steps per seed, so the seeds hold different numbers of truncated final states
    cfg = TrainConfig(env_fn=FAKE, num_envs=num_envs, rollout_steps=8, seq_len=4, burn_in=2,
                      env={"max_cycles": 5, "goal": 2, "n_pickers": 2}, progress=False,
                      hidden_dim=16, critic_hidden_dim=16, backbone=backbone,
                      seed=seed, value_ensemble=value_ensemble)  # fmt: skip
    if backbone == "mlp":
        cfg.burn_in = 0
    validate_config(cfg)
    return cfg


def single_seed_rollouts(cfg: TrainConfig) -> list[RolloutBatch]:
    """``ROLLOUTS`` consecutive rollouts of MAPPO's own collector for ``cfg.seed``."""
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)  # as marl.run.train.train seeds a single-seed run
    algo = MAPPO(copy.deepcopy(cfg), None)
    return [algo.collect() for _ in range(ROLLOUTS)]


def per_seed_values(critic: SeedCentralCritic):
    """A :data:`SeedValueFn` calling each seed's single-seed ``CentralCritic`` (copies of the
    stack's parameters) on that seed's rows: the stacked critic's reference."""
    critics = critic.unstack()

    def value_fn(state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        outputs = [c(x.clone()) for c, x in zip(critics, state, strict=True)]
        return torch.stack([t for t, _ in outputs]), torch.stack([i for _, i in outputs])

    return value_fn


def seed_rollouts(
    cfg: TrainConfig, seeds: list[int], *, stacked_critic: bool = True
) -> list[SeedRolloutBatch]:
    """``ROLLOUTS`` consecutive rollouts of the seed collector for ``seeds``, the values from
    the stacked critic or (``stacked_critic=False``) from each seed's own critic."""
    vecs = [make_vector_env(cfg.env_fn, cfg.num_envs, cfg.env) for _ in seeds]
    layout = AgentLayout.from_env(vecs[0])
    policy, critic, generators = build_seed_policies(cfg, seeds, layout, critic=True)
    value_fn = critic if stacked_critic else per_seed_values(critic)
    collector = RolloutCollector(vecs, layout, policy, seeds=seeds, generators=generators)
    windows = window_plan(cfg.rollout_steps, cfg.seq_len, cfg.burn_in)[2]
    steps = windows if policy.is_recurrent else []
    with torch.no_grad():
        return [
            collector.collect(cfg.rollout_steps, value_fn=value_fn, window_state_steps=steps)
            for _ in range(ROLLOUTS)
        ]


VALUE_KEYS = ("values_team", "values_individual", "next_values_team", "next_values_individual")


def assert_same_rollout(
    ours: RolloutBatch, ref: RolloutBatch, *, exact_values: bool = True, exact_policy: bool = True
) -> None:
    """Bit-equal rollouts; ``exact_values`` / ``exact_policy`` False: the values / the
    log-probs and actor states to float32 rounding (the actions still bit-equal)."""

    def same(a: torch.Tensor, b: torch.Tensor, exact: bool, what: str) -> None:
        if exact:
            assert torch.equal(a, b), what
        else:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=what)

    for key in ("obs", "mask", "actions", "logp"):
        for name, expected in getattr(ref, key).items():
            same(getattr(ours, key)[name], expected, key != "logp" or exact_policy, key)
    for key in (
        "reward_team",
        "reward_individual",
        "reward_penalty",
        "terminated",
        "truncated",
        "episode_start",
        "state",
    ):
        assert torch.equal(getattr(ours, key), getattr(ref, key)), key
    for key in VALUE_KEYS:
        same(getattr(ours, key), getattr(ref, key), exact_values, key)
    assert ours.active is None and ref.active is None
    assert ours.window_state_steps == ref.window_state_steps
    for name, states in ref.window_states.items():
        for mine, theirs in zip(ours.window_states[name], states, strict=True):
            for a, b in zip(mine, theirs, strict=True):
                same(a, b, exact_policy, f"window state {name}")
    assert ours.episodes == ref.episodes


@pytest.mark.parametrize("backbone", ["mlp", "gru"])
@pytest.mark.parametrize("num_envs", [4, 3])
def test_each_seed_equals_mappo_single_seed_collector(
    one_thread, backbone: str, num_envs: int
) -> None:
    """Seed k of S = 3 against ``MAPPO(--seed k).collect()``, two consecutive rollouts.

    With 4 envs: bit for bit with each seed's own critic as the value function; with the
    stacked critic the values agree to float32 rounding (``SeedCentralCritic`` runs
    ``baddbmm`` where ``CentralCritic`` runs ``addmm``) and everything else stays bit-equal.
    With 3 envs the stacked actor's logits differ from the single-seed actor's in the last
    bit (the batched GEMM again, :mod:`marl.models.seed_policies`): log-probs and actor states to
    rounding, the actions (same noise) and the env data still bit-equal."""
    exact_policy = num_envs == 4
    cfg = make_cfg(backbone, num_envs=num_envs)
    exact = seed_rollouts(cfg, SEEDS, stacked_critic=False)
    stacked = seed_rollouts(cfg, SEEDS)
    batch = exact[0]
    S, T, E = len(SEEDS), cfg.rollout_steps, cfg.num_envs
    assert (batch.num_seeds, batch.num_steps, batch.num_envs) == (S, T, E)
    assert batch.obs["caller"].shape == (S, T, E, 2, 4)
    assert batch.values_individual.shape == (S, T, E, 4, 1)
    # the test exercises truncations, and seeds with different numbers of final states
    truncations = [int(b.truncated[k].sum()) for b in exact for k in range(S)]
    assert max(truncations) > 0 and len(set(truncations)) > 1
    for k, seed in enumerate(SEEDS):
        refs = single_seed_rollouts(make_cfg(backbone, seed, num_envs=num_envs))
        for i, ref in enumerate(refs):
            try:
                assert_same_rollout(exact[i].seed(k), ref, exact_policy=exact_policy)
                assert_same_rollout(
                    stacked[i].seed(k), ref, exact_values=False, exact_policy=exact_policy
                )
            except AssertionError as exc:
                raise AssertionError(f"seed {seed}, rollout {i}: {exc}") from None


@pytest.mark.parametrize("backbone", ["mlp", "gru"])
@pytest.mark.parametrize("num_envs", [4, 3])
def test_seed_in_a_stack_equals_seed_alone(one_thread, backbone: str, num_envs: int) -> None:
    """``--seeds 0-2`` vs ``--seeds k``: seed k's rollouts bit-equal, values of the stacked
    critic included (two value heads: see the next test for one). With 3 envs a seed's
    states are not a multiple of 16 bytes: the collector's aligned seed blocks keep the
    critic's bits independent of the seed's place in the stack."""
    cfg = make_cfg(backbone, value_ensemble=2, num_envs=num_envs)
    stacked = seed_rollouts(cfg, SEEDS)
    for k in (0, 2):
        alone = seed_rollouts(cfg, [SEEDS[k]])
        for ours, ref in zip(stacked, alone, strict=True):
            assert_same_rollout(ours.seed(k), ref.seed(0))


def test_seed_in_a_stack_equals_seed_alone_one_value_head(one_thread) -> None:
    cfg = make_cfg("mlp")
    stacked, alone = seed_rollouts(cfg, SEEDS), seed_rollouts(cfg, [SEEDS[2]])
    assert torch.equal(stacked[0].seed(2).values_team, alone[0].seed(0).values_team)


def test_critic_inputs_start_each_seed_on_a_64_byte_boundary(one_thread) -> None:
    cfg = make_cfg("mlp", num_envs=3)  # a seed's (T + 1) * E * D_s floats: 378, not aligned
    batch = seed_rollouts(cfg, SEEDS)[0]
    assert all(batch.state[k].data_ptr() % 64 == 0 for k in range(len(SEEDS)))
    assert batch.state.shape == (len(SEEDS), cfg.rollout_steps, 3, 14)


def test_state_dict_resumes_exactly(one_thread) -> None:
    cfg = make_cfg("gru")
    vecs = [make_vector_env(cfg.env_fn, cfg.num_envs, cfg.env) for _ in SEEDS]
    layout = AgentLayout.from_env(vecs[0])
    policy, critic, generators = build_seed_policies(cfg, SEEDS, layout, critic=True)
    collector = RolloutCollector(vecs, layout, policy, seeds=SEEDS, generators=generators)
    collector.collect(cfg.rollout_steps)
    saved = copy.deepcopy(collector.state_dict())
    expected = collector.collect(cfg.rollout_steps, value_fn=critic)
    fresh_gens = [torch.Generator() for _ in SEEDS]
    vecs = [make_vector_env(cfg.env_fn, cfg.num_envs, cfg.env) for _ in SEEDS]
    resumed = RolloutCollector(vecs, layout, policy, seeds=SEEDS, generators=fresh_gens)
    assert resumed.load_state_dict(saved)
    got = resumed.collect(cfg.rollout_steps, value_fn=critic)
    for k in range(len(SEEDS)):
        assert_same_rollout(got.seed(k), expected.seed(k))


def test_errors_say_what_to_do() -> None:
    cfg = make_cfg("mlp")
    vecs = [make_vector_env(cfg.env_fn, cfg.num_envs, cfg.env) for _ in range(2)]
    layout = AgentLayout.from_env(vecs[0])
    policy, _, generators = build_seed_policies(cfg, [0, 1], layout, critic=False)
    with pytest.raises(ValueError, match="one env, one reset seed and one generator"):
        RolloutCollector(vecs[:1], layout, policy, seeds=[0], generators=generators[:1])
