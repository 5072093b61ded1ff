"""Issue 37: S seeds of MAPPO in one process (marl.algos.mappo.SeedMAPPO, marl.run.train_seeds).

References, one torch thread:

- the same seed trained in a batch of one (``--seeds k``): bit for bit, parameters, optimiser
  state and every logged metric, for mlp, gru and mamba;
- a plain single-seed ``MAPPO`` run with ``--seed k`` (its own code, one seed): to float32
  rounding over the first updates (the batched layers are other GEMM calls);
- a stopped seed (non-finite advantages injected) leaves the others exactly as they are in a
  batch without it, and keeps its own parameters from before the failing update;
- the CLI's run directories: one complete single-run directory per seed (load_policy reads
  it), ``--resume`` of an interrupted batch equals the uninterrupted batch.
"""

from __future__ import annotations

import copy
import json
import os

import pytest
import torch

from marl.algos import mappo as mappo_module
from marl.algos.mappo import MAPPO, SeedMAPPO
from marl.algos.seeds import seeded_build
from marl.core.losses import NonFiniteError
from marl.run.config import ConfigError, TrainConfig, validate_config
from marl.run.train_seeds import batch_seeds, parse_seeds, seeds_invocation
from marl.train import main as train_main

FAKE = "test_train_fakeenv:vector_env"


def make_cfg(backbone: str, seed: int = 0, **overrides) -> TrainConfig:
    cfg = TrainConfig(env_fn=FAKE, num_envs=4, rollout_steps=8, seq_len=4, burn_in=2,
                      env={"max_cycles": 5, "goal": 2, "n_pickers": 2}, progress=False,
                      hidden_dim=16, critic_hidden_dim=16, backbone=backbone, seed=seed,
                      num_minibatches=2, epochs=2, parallel_update=False,
                      **overrides)  # fmt: skip
    if backbone == "mlp":
        cfg.burn_in = 0
    validate_config(cfg)
    return cfg


def train(
    backbone: str, seeds: list[int], iterations: int = 3, **overrides
) -> tuple[SeedMAPPO, list]:
    batch = SeedMAPPO([make_cfg(backbone, s, **overrides) for s in seeds])
    rows = [batch.iteration([i / iterations] * len(seeds)) for i in range(iterations)]
    return batch, rows


def without_time(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith("time/")}


@pytest.mark.parametrize("backbone", ["mlp", "gru", "mamba"])
def test_seed_in_a_batch_equals_the_seed_alone_bit_for_bit(one_thread, backbone) -> None:
    big, big_rows = train(backbone, [0, 1, 2])
    alone, alone_rows = train(backbone, [1])
    for a, b in zip(big.policy.parameters(), alone.policy.parameters(), strict=True):
        assert torch.equal(a[1], b[0])
    for a, b in zip(big.critic.parameters(), alone.critic.parameters(), strict=True):
        assert torch.equal(a[1], b[0])
    for rows_big, rows_alone in zip(big_rows, alone_rows, strict=True):
        assert without_time(rows_big[1]) == without_time(rows_alone[0])
    one, two = big.sync(1).policy_update.optimizer, alone.sync(0).policy_update.optimizer
    for p, q in zip(one.param_groups[0]["params"], two.param_groups[0]["params"], strict=True):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(one.state[p][key], two.state[q][key])


@pytest.mark.parametrize(
    ("backbone", "overrides"),
    [("mlp", {}), ("gru", {}), ("gru", {"tbptt_chunk": 2}), ("mlp", {"optimism_offset": 0.5})],
)
def test_seed_in_a_batch_agrees_with_a_plain_single_seed_run(
    one_thread, backbone, overrides
) -> None:
    """A plain run is a batch of one of its own (its minibatch orders from the global
    generator, its policy its slice of its own stack); seed 1 of a batch of three agrees with
    it to float32 rounding over 3 updates (the stack's batched GEMMs see three seeds), also
    with truncated BPTT and with the optimism offset (each seed's own b)."""
    big, big_rows = train(backbone, [0, 1, 2], **overrides)
    plain, generator = seeded_build(MAPPO, make_cfg(backbone, 1, **overrides), torch.device("cpu"))
    torch.set_rng_state(generator.get_state())  # a plain run draws from the global generator
    plain_rows = [plain.iteration(i / 3) for i in range(3)]
    run = big.sync(1)
    for p, q in zip(run.policy.parameters(), plain.policy.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6)
    for p, q in zip(run.critic.parameters(), plain.critic.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6)
    keys = ["loss/policy", "loss/value", "grad_norm", "entropy", "adv/mean"]
    if "optimism_offset" in overrides:
        keys.append("optimism_offset")
        assert float(run.offset.b) != 0.5  # it moved from its initial value
        torch.testing.assert_close(run.offset.b, plain.offset.b, rtol=1e-4, atol=1e-6)
    for ours, ref in zip(big_rows, plain_rows, strict=True):
        for key in keys:
            assert ours[1][key] == pytest.approx(ref[key], rel=1e-4, abs=1e-6), key


def test_a_seed_that_turns_non_finite_stops_and_the_others_go_on(one_thread, monkeypatch):
    real = MAPPO.advantages
    calls = {"n": 0}

    def advantages(self, batch, progress):
        if self.cfg.seed == 1:
            calls["n"] += 1
            if calls["n"] == 2:
                raise NonFiniteError("advantages (after whitening)")
        return real(self, batch, progress)

    clean, _ = train("gru", [0, 2])
    monkeypatch.setattr(mappo_module.MAPPO, "advantages", advantages)
    batch = SeedMAPPO([make_cfg("gru", s) for s in [0, 1, 2]])
    rows = [batch.iteration([0.0] * 3)]
    before = [p[1].clone() for p in batch.policy.parameters()]
    rows += [batch.iteration([1 / 3] * 3), batch.iteration([2 / 3] * 3)]
    assert batch.stopped == [None, "advantages (after whitening)", None]
    assert rows[1][1] == {} and rows[2][1] == {}
    for p, b in zip(batch.policy.parameters(), before, strict=True):
        assert torch.equal(p[1], b)  # unchanged since its last good update
    for a, b in zip(batch.policy.parameters(), clean.policy.parameters(), strict=True):
        assert torch.equal(a[0], b[0]) and torch.equal(a[2], b[1])


def test_parse_seeds_forms_and_errors() -> None:
    assert parse_seeds("0-3") == [0, 1, 2, 3]
    assert parse_seeds("0,3,7") == [0, 3, 7]
    assert parse_seeds("0-2,8") == [0, 1, 2, 8]
    for bad, match in (("3-1", "cannot read"), ("a", "cannot read"), ("1,1", "appear twice"),
                       ("-1", "must be >= 0")):  # fmt: skip
        with pytest.raises(ConfigError, match=match):
            parse_seeds(bad)
    with pytest.raises(ConfigError, match="exclude each other"):
        seeds_invocation(["--seeds", "0-3", "--seed", "2"])
    assert seeds_invocation(["--seed", "2"]) is None


def cli(run_dir: str, *extra: str) -> list[str]:
    return ["--env-fn", FAKE, "--env.max_cycles", "5", "--env.goal", "2", "--env.n_pickers", "2",
            "--num-envs", "4", "--rollout-steps", "8",
            "--hidden-dim", "16", "--critic-hidden-dim", "16", "--backbone", "gru",
            "--seq-len", "4", "--burn-in", "2", "--run-dir", run_dir, "--progress", "false",
            "--gif", "false", "--plots", "false", "--baselines", "false", "--eval-episodes", "2",
            "--eval-every", "2", "--checkpoint-every", "2", "--torch-threads", "1",
            *extra]  # fmt: skip


def metrics(run_dir: str) -> list[dict]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as fh:
        rows = [json.loads(line) for line in fh]
    drop = ("time", "cpu_s", "sps", "agent_sps")
    return [{k: v for k, v in r.items() if not k.startswith(drop)} for r in rows]


def test_cli_writes_a_complete_run_directory_per_seed_and_resumes_exactly(tmp_path) -> None:
    from marl.run.policy_api import load_policy

    whole, part = str(tmp_path / "whole"), str(tmp_path / "part")
    assert train_main(cli(whole, "--seeds", "3,5", "--total-steps", "128")) == 0
    assert batch_seeds(whole) == [3, 5]
    for seed in (3, 5):
        run = os.path.join(whole, f"seed_{seed}")
        for name in ("config.yaml", "metrics.jsonl", "eval.json", "finished.json", "policy"):
            assert os.path.exists(os.path.join(run, name)), name
        with open(os.path.join(run, "config.yaml")) as fh:
            assert f"seed: {seed}\n" in fh.read()
        assert load_policy(run) is not None
    # interrupted at 64 env steps x 4 envs... then resumed to the same budget
    assert train_main(cli(part, "--seeds", "3,5", "--total-steps", "64")) == 0
    assert train_main(["--resume", part, "--total-steps", "128"]) == 0
    for seed in (3, 5):
        assert metrics(os.path.join(part, f"seed_{seed}")) == metrics(
            os.path.join(whole, f"seed_{seed}")
        )
    # one seed of the batch resumed alone, as a single-seed run: float32 rounding apart, the
    # same updates (its checkpoint holds a single-seed run's state)
    assert train_main(["--resume", os.path.join(part, "seed_5"), "--total-steps", "192"]) == 0
    alone, batched = metrics(os.path.join(part, "seed_5")), metrics(os.path.join(whole, "seed_5"))
    assert [r["update"] for r in alone] == [1, 2, 3, 4, 5, 6]
    for ours, ref in zip(alone[2:4], batched[2:4], strict=True):
        assert ours["loss/policy"] == pytest.approx(ref["loss/policy"], rel=1e-3, abs=1e-6)
    # a new batch over an existing one is refused, nothing touched
    before = sorted(os.listdir(os.path.join(whole, "seed_3")))
    assert train_main(cli(whole, "--seeds", "3,5", "--total-steps", "128")) == 2
    assert sorted(os.listdir(os.path.join(whole, "seed_3"))) == before


def test_seeds_refuse_what_they_cannot_batch() -> None:
    from marl.algos.seeds import unsupported_with_seeds

    cfg = make_cfg("gru", optimism_offset=0.5, tbptt_chunk=2)
    assert unsupported_with_seeds(cfg) == []  # both batch over seeds
    problems = unsupported_with_seeds(cfg, distributed=True)
    assert len(problems) == 1 and "torchrun" in problems[0]
    bad = copy.copy(cfg)
    bad.algo = "no_such_algorithm"
    assert unsupported_with_seeds(bad)


def test_a_stopped_seed_records_why_in_finished_json_and_compare_skips_it(
    tmp_path, monkeypatch
) -> None:
    from marl.experiments.compare import run_finished

    real = MAPPO.advantages

    def advantages(self, batch, progress):
        if self.cfg.seed == 5 and progress > 0:
            raise NonFiniteError("advantages (after whitening)")
        return real(self, batch, progress)

    monkeypatch.setattr(mappo_module.MAPPO, "advantages", advantages)
    root = str(tmp_path / "b")
    assert train_main(cli(root, "--seeds", "3,5", "--total-steps", "128")) == 0
    with open(os.path.join(root, "seed_5", "finished.json")) as fh:
        record = json.load(fh)
    assert "advantages (after whitening)" in record["stopped"]
    assert record["update"] == 2  # the update that failed
    assert not os.path.exists(os.path.join(root, "seed_5", "eval.json"))
    assert [r["update"] for r in metrics(os.path.join(root, "seed_3"))] == [1, 2, 3, 4]
    assert run_finished(os.path.join(root, "seed_3"))
    assert not run_finished(os.path.join(root, "seed_5"))


def test_a_pettingzoo_env_through_the_adapter_with_leaving_agents(one_thread) -> None:
    """An env through marl.adapters (PettingZoo, agents that leave early): seed k in a batch
    equals the seed alone, and the agents that left are masked as in a single-seed run."""
    env = {"leave_at": 2, "horizon": 5}

    def cfg(seed: int) -> TrainConfig:
        c = TrainConfig(env_fn="test_adapters:relay_env", env=dict(env), num_envs=2,
                        rollout_steps=10, progress=False, seed=seed,
                        parallel_update=False)  # fmt: skip
        validate_config(c)
        return c

    big = SeedMAPPO([cfg(0), cfg(1)])
    alone = SeedMAPPO([cfg(1)])
    rows_big = [big.iteration(p) for p in (0.0, 0.5)]
    rows_alone = [alone.iteration(p) for p in (0.0, 0.5)]
    for a, b in zip(rows_big, rows_alone, strict=True):
        assert without_time(a[1]) == without_time(b[0])
        assert torch.isfinite(torch.tensor(a[1]["loss/policy"]))
    for a, b in zip(big.policy.parameters(), alone.policy.parameters(), strict=True):
        assert torch.equal(a[1], b[0])
