"""Issue 37: S seeds of GRPO in one process (marl.algos.grpo.SeedGRPO).

References, one torch thread: seed k in a batch equals the seed alone (``--seeds k``) bit for
bit (parameters, reference policy, every metric), with the KL term and its reference refresh
on; a plain single-seed ``GRPO`` run agrees to float32 rounding; the group collector steps
each seed exactly as the single-seed collector; the CLI trains a GRPO batch.
"""

from __future__ import annotations

import os

import pytest
import torch

from marl.algos.grpo import GRPO, SeedGRPO, collect_group_episodes, group_seeds, pad_episodes
from marl.algos.ppo import Minibatch
from marl.algos.seeds import seeded_build
from marl.rollout.episodes import GroupBatch, collect_seed_group_episodes
from marl.run.config import TrainConfig, validate_config
from marl.train import main as train_main

TINY_ENV = {"grid_size": 8, "max_cycles": 30, "n_targets": 2, "n_scouts": 1, "n_rescuers": 2}


def make_cfg(backbone: str, seed: int) -> TrainConfig:
    cfg = TrainConfig(algo="grpo", num_envs=8, group_size=4, hidden_dim=16, epochs=2,
                      num_minibatches=2, env=dict(TINY_ENV), seed=seed, backbone=backbone,
                      kl_beta=0.1, ref_refresh=2, progress=False)  # fmt: skip
    validate_config(cfg)
    return cfg


def train(backbone: str, seeds: list[int], iterations: int = 3):
    batch = SeedGRPO([make_cfg(backbone, s) for s in seeds])
    rows = [batch.iteration([i / iterations] * len(seeds)) for i in range(iterations)]
    return batch, rows


def without_time(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith("time/")}


def test_group_collector_steps_each_seed_as_the_single_seed_collector(one_thread) -> None:
    cfgs = [make_cfg("gru", s) for s in (0, 1)]
    batch = SeedGRPO(cfgs)
    plain, generator = seeded_build(GRPO, cfgs[1], torch.device("cpu"))
    seeds = [group_seeds(c.seed, 0, batch.runs[0].num_groups) for c in cfgs]
    ours = collect_seed_group_episodes([r.vec for r in batch.runs], batch.layout, batch.policy,
                                       seeds, 4, batch.generators)  # fmt: skip
    ref: GroupBatch = collect_group_episodes(plain.vec, plain.layout, plain.policy, seeds[1], 4,
                                             generator=generator)  # fmt: skip
    assert torch.equal(ours[1].valid, ref.valid) and ours[1].episodes == ref.episodes
    for name in ref.actions:
        assert torch.equal(ours[1].actions[name], ref.actions[name])
        torch.testing.assert_close(ours[1].logp[name], ref.logp[name], rtol=1e-5, atol=1e-6)
    assert torch.equal(batch.generators[1].get_state(), generator.get_state())


@pytest.mark.parametrize("backbone", ["mlp", "gru"])
def test_seed_in_a_batch_equals_the_seed_alone_bit_for_bit(one_thread, backbone) -> None:
    big, big_rows = train(backbone, [0, 1, 2])
    alone, alone_rows = train(backbone, [1])
    for a, b in zip(big.policy.parameters(), alone.policy.parameters(), strict=True):
        assert torch.equal(a[1], b[0])
    for a, b in zip(big.sync(1).reference.parameters(), alone.sync(0).reference.parameters(),
                    strict=True):  # fmt: skip
        assert torch.equal(a, b)
    for rows_big, rows_alone in zip(big_rows, alone_rows, strict=True):
        assert without_time(rows_big[1]) == without_time(rows_alone[0])
    assert big.runs[1].updates == 3


def test_seed_in_a_batch_agrees_with_a_plain_single_seed_run(one_thread) -> None:
    big, big_rows = train("gru", [0, 1])
    plain, generator = seeded_build(GRPO, make_cfg("gru", 1), torch.device("cpu"))
    torch.set_rng_state(generator.get_state())
    plain_rows = [plain.iteration(i / 3) for i in range(3)]
    for p, q in zip(big.sync(1).policy.parameters(), plain.policy.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
    for ours, ref in zip(big_rows, plain_rows, strict=True):
        assert ours[1]["env_steps_delta"] == ref["env_steps_delta"]
        for key in ("loss/policy", "loss/kl", "grad_norm", "adv/mean"):
            assert ours[1][key] == pytest.approx(ref[key], rel=1e-3, abs=1e-5), key


def test_pad_episodes_keeps_padding_out_of_the_loss() -> None:
    E, T, n, D, A = 2, 3, 2, 4, 5
    resets = torch.zeros(E, T, dtype=torch.bool)
    resets[:, 0] = True
    mb = Minibatch(obs=torch.randn(E, T, n, D), action_mask=torch.rand(E, T, n, A) > 0.5,
                   actions=torch.ones(E, T, n, dtype=torch.long), old_logp=torch.randn(E, T, n),
                   advantages=torch.randn(E, T, n), loss_mask=torch.ones(E, T, dtype=torch.bool),
                   resets=resets, state=(torch.randn(E * n, 8),))  # fmt: skip
    padded = pad_episodes(mb, 7)
    assert padded.obs.shape == (E, 7, n, D) and torch.equal(padded.obs[:, :T], mb.obs)
    assert not padded.loss_mask[:, T:].any() and padded.loss_mask[:, :T].all()
    assert padded.action_mask[:, T:].all() and not padded.resets[:, T:].any()
    assert padded.state is mb.state
    with pytest.raises(ValueError, match="exceed the padding length"):
        pad_episodes(mb, 2)


def test_cli_trains_a_grpo_batch(tmp_path) -> None:
    root = str(tmp_path / "g")
    argv = ["--algo", "grpo", "--seeds", "0,1", "--num-envs", "8", "--group-size", "4",
            "--hidden-dim", "16", "--env.grid_size", "8", "--env.max_cycles", "30",
            "--env.n_targets", "2", "--total-steps", "400", "--run-dir", root, "--progress",
            "false", "--gif", "false", "--plots", "false", "--baselines", "false",
            "--eval-episodes", "2", "--torch-threads", "1"]  # fmt: skip
    assert train_main(argv) == 0
    for seed in (0, 1):
        assert os.path.isfile(os.path.join(root, f"seed_{seed}", "finished.json"))
        assert os.path.isfile(os.path.join(root, f"seed_{seed}", "eval.json"))


def test_grpo_batch_on_a_pettingzoo_env_with_leaving_agents(one_thread) -> None:
    """An env through marl.adapters without ``max_cycles``: the episodes pad to the longest
    of the batch, so seed k agrees with the seed alone to float32 rounding (not bits)."""
    env = {"leave_at": 2, "horizon": 5}

    def cfg(seed: int) -> TrainConfig:
        c = TrainConfig(algo="grpo", env_fn="test_adapters:relay_env", env=dict(env),
                        num_envs=4, group_size=2, progress=False, seed=seed)  # fmt: skip
        validate_config(c)
        return c

    big, alone = SeedGRPO([cfg(0), cfg(1)]), SeedGRPO([cfg(1)])
    ours, ref = big.iteration(0.0), alone.iteration(0.0)
    assert ours[1]["env_steps_delta"] == ref[0]["env_steps_delta"]
    assert ours[1]["loss/policy"] == pytest.approx(ref[0]["loss/policy"], rel=1e-4, abs=1e-6)
    for a, b in zip(big.policy.parameters(), alone.policy.parameters(), strict=True):
        torch.testing.assert_close(a[1], b[0], rtol=1e-4, atol=1e-6)


def test_each_seed_follows_its_own_progress_schedule(one_thread) -> None:
    """GRPO seeds spend their budgets at their own pace: seed k's learning rate (and entropy
    coefficient) follow its own progress, through its own Adam param group, and the seed
    equals the seed alone at that progress bit for bit."""

    def cfg(seed: int) -> TrainConfig:
        c = make_cfg("mlp", seed)
        c.lr_schedule, c.ent_coef_final = "linear", 0.0
        validate_config(c)
        return c

    big, alone = SeedGRPO([cfg(0), cfg(1)]), SeedGRPO([cfg(1)])
    rows = big.iteration([0.0, 0.5])
    ref = alone.iteration([0.5])
    assert rows[0]["lr"] == pytest.approx(cfg(0).lr) and rows[1]["lr"] == pytest.approx(
        0.5 * cfg(1).lr
    )
    assert rows[1]["ent_coef"] == pytest.approx(0.5 * cfg(1).ent_coef)
    assert without_time(rows[1]) == without_time(ref[0])
    for a, b in zip(big.policy.parameters(), alone.policy.parameters(), strict=True):
        assert torch.equal(a[1], b[0])
