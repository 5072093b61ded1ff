"""Declared no-ops (``BaseConfig.no_ops``, ``result_free``): each trains bit for bit as the
setting it is declared equal to, and :func:`marl.run.config.effective_config` maps both forms
to one configuration.

Every entry of every algorithm's ``no_ops`` table has a case here (checked by
``test_every_declared_no_op_has_a_case``): both forms are trained for two updates from the
same seed with tiny budgets, and their parameters (and metrics, timings aside) must be
identical. Controls show that the tests can see a difference: the same option outside the
rule's conditions changes the training.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from marl.algos import GRPO, MAPPO, GRPOConfig, MAPPOConfig
from marl.run.config import (
    TrainConfig,
    effective_config,
    one_configuration,
    validate_config,
)
from marl.run.runlog import TIMING_KEYS
from marl.run.train import main

FAKE = "test_train_fakeenv:vector_env"  # tests/test_train_fakeenv.py: has a penalty channel
GRPO_ENV = {"grid_size": 8, "max_cycles": 30, "n_targets": 2, "n_scouts": 1, "n_rescuers": 2}


def _mappo(**kw) -> MAPPOConfig:
    base = dict(env_fn=FAKE, num_envs=6, rollout_steps=12, env={"max_cycles": 5, "goal": 2})
    cfg = TrainConfig(**{**base, "progress": False, "seed": 1, **kw})
    validate_config(cfg)
    return cfg


def _grpo(**kw) -> GRPOConfig:
    base = dict(algo="grpo", num_envs=8, group_size=4, hidden_dim=16, epochs=2)
    base.update(num_minibatches=2, env=dict(GRPO_ENV), seed=3, progress=False)
    cfg = TrainConfig(**{**base, **kw})
    validate_config(cfg)
    return cfg


def _train(cfg) -> tuple[list[torch.Tensor], list[dict[str, float]]]:
    """Two updates (at training progress 0 and 0.5) from torch seed 0: the parameters of every
    network and each update's metrics (timings left out)."""
    torch.manual_seed(0)
    np.random.seed(0)
    algo = (GRPO if cfg.algo == "grpo" else MAPPO)(cfg, None)
    metrics = [algo.iteration(progress) for progress in (0.0, 0.5)]
    params = [p.detach().clone() for p in algo.policy.state_dict().values()]
    if isinstance(algo, MAPPO):
        params += [p.detach().clone() for p in algo.critic.state_dict().values()]
    return params, [{k: v for k, v in m.items() if not k.startswith("time/")} for m in metrics]


def _same_training(a, b) -> bool:
    (params_a, metrics_a), (params_b, metrics_b) = _train(a), _train(b)
    same_params = all(torch.equal(x, y) for x, y in zip(params_a, params_b, strict=True))
    return same_params and metrics_a == metrics_b


#: (config class, index in its no_ops, the option, form A, form B): A and B differ in the
#: option only, and the rule maps A's value to B's
CASES = [
    (
        GRPOConfig, 0, "ent_coef_final",
        _grpo(ent_coef=0.02, ent_coef_final=0.02), _grpo(ent_coef=0.02),
    ),
    (
        GRPOConfig, 1, "penalty_channel",
        _grpo(penalty_beta_schedule="constant", penalty_channel="none"),
        _grpo(penalty_beta_schedule="constant", penalty_channel="individual"),
    ),
    (
        GRPOConfig, 2, "whiten_inner",
        _grpo(whitening="batch", whiten_inner="sequence"),
        _grpo(whitening="batch", whiten_inner="type"),
    ),
    (
        GRPOConfig, 3, "whitening",
        _grpo(whitening="none", alpha=0.25, adv_clip=1.0),
        _grpo(whitening="team_individual", alpha=0.25, adv_clip=1.0),
    ),
    (
        MAPPOConfig, 0, "ent_coef_final",
        _mappo(ent_coef=0.02, ent_coef_final=0.02), _mappo(ent_coef=0.02),
    ),
    (
        MAPPOConfig, 1, "penalty_channel",
        _mappo(penalty_beta_schedule="linear", penalty_channel="none"),
        _mappo(penalty_beta_schedule="linear", penalty_channel="individual"),
    ),
    (
        MAPPOConfig, 2, "value_epochs",
        _mappo(epochs=3, value_epochs=3), _mappo(epochs=3, value_epochs=None),
    ),
    (MAPPOConfig, 3, "critic_lr", _mappo(lr=3e-4, critic_lr=3e-4), _mappo(lr=3e-4)),
    (MAPPOConfig, 4, "seq_len", _mappo(whitening="batch", seq_len=3), _mappo(whitening="batch")),
    (
        MAPPOConfig, 5, "seq_len",
        _mappo(whitening="team_individual", whiten_inner="type", seq_len=4),
        _mappo(whitening="team_individual", whiten_inner="type", seq_len=6),
    ),
]  # fmt: skip


def test_every_declared_no_op_has_a_case() -> None:
    declared = {(cls, i) for cls in (GRPOConfig, MAPPOConfig) for i in range(len(cls.no_ops))}
    assert {(cls, i) for cls, i, *_ in CASES} == declared
    for cls, i, option, a, b in CASES:
        rule = cls.no_ops[i]
        assert rule.option == option and rule.applies(a), (cls.__name__, i)
        diff = {k for k, v in a.__dict__.items() if b.__dict__[k] != v}
        assert diff == {option}, (cls.__name__, i, diff)


@pytest.mark.parametrize(
    "cls,index,option,a,b", CASES, ids=[f"{c.algo_name}-{o}-{i}" for c, i, o, *_ in CASES]
)
def test_no_op_trains_bit_for_bit_as_its_equal(one_thread, cls, index, option, a, b) -> None:
    assert effective_config(a) == effective_config(b)
    why = one_configuration(a, b)
    assert why is not None and f"--{option.replace('_', '-')}" in why
    assert _same_training(a, b)


@pytest.mark.parametrize(
    "a,b",
    [
        # GRPO: a second stage is not 'none'; the running schemes read the inner grouping
        (_grpo(whitening="none"), _grpo(whitening="batch")),
        (_grpo(whitening="none", alpha=0.25), _grpo(whitening="team_individual")),
        (
            _grpo(whitening="running", whiten_inner="batch"),
            _grpo(whitening="running", whiten_inner="type"),
        ),
        # without penalty shaping the channel matters; seq_len matters to position whitening
        (_grpo(penalty_channel="none"), _grpo(penalty_channel="individual")),
        (_mappo(penalty_channel="none"), _mappo(penalty_channel="individual")),
        (_mappo(whitening="position", seq_len=3), _mappo(whitening="position", seq_len=12)),
        (_mappo(ent_coef=0.02, ent_coef_final=0.0), _mappo(ent_coef=0.02)),
    ],
    ids=[
        "grpo-batch",
        "grpo-alpha",
        "grpo-running",
        "grpo-penalty",
        "mappo-penalty",
        "mappo-position",
        "mappo-anneal",
    ],  # fmt: skip
)
def test_outside_a_rule_the_option_changes_training(one_thread, a, b) -> None:
    assert effective_config(a) != effective_config(b)
    assert one_configuration(a, b) is None
    assert not _same_training(a, b)


def test_effective_config_leaves_out_result_free_fields_and_applies_option_rules() -> None:
    eff = effective_config(_mappo(progress=True, plots=False, checkpoint_every=3))
    assert not set(eff) & MAPPOConfig.result_free
    assert eff == effective_config(_mappo(gif=False, parallel_update=False, run_dir="x"))
    # an option that does not apply is at its default (option_rules): alpha without
    # team_individual, whatever value a config object carries
    cfg = _mappo(whitening="batch")
    cfg.alpha = 0.9
    assert effective_config(cfg)["alpha"] == MAPPOConfig.default_of("alpha")
    assert one_configuration(_mappo(), _mappo()) == "they set the same --algo mappo configuration"
    assert one_configuration(_mappo(), _mappo(plots=False)) == (
        "under --algo mappo, --plots changes no result"
    )


def test_one_configuration_names_the_rule() -> None:
    none = _grpo(whitening="none")
    ti = _grpo(whitening="team_individual", alpha=0.5, whiten_inner="type")
    why = one_configuration(none, ti)
    assert why.startswith("under --algo grpo, --whitening none trains as --whitening ")
    assert "team_individual" in why and "second stage" in why
    # two rules at once: both named
    why = one_configuration(_grpo(whitening="none", whiten_inner="position"), ti)
    assert "--whitening none" in why and "--whiten-inner position trains as" in why


def _run_rows(run_dir) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(x).items() if k not in TIMING_KEYS} for x in lines]


def test_result_free_fields_change_no_result(tmp_path) -> None:
    """Outputs (progress bar, plots, GIF, baselines, checkpoint cadence, run directory) and
    the threaded update: the same metrics.jsonl and eval.json, end to end."""
    tiny = ["--algo", "grpo", "--seed", "2", "--num-envs", "8", "--group-size", "4",
            "--hidden-dim", "16", "--epochs", "2", "--num-minibatches", "2", "--eval-every",
            "1", "--eval-episodes", "2", "--total-steps", "200", "--env.grid_size", "8",
            "--env.max_cycles", "20", "--env.n_targets", "2"]  # fmt: skip
    quiet = ["--progress", "false", "--plots", "false", "--gif", "false", "--baselines", "false"]
    loud = ["--progress", "true", "--plots", "true", "--gif", "true", "--baselines", "true"]
    forms = {
        "quiet": [*quiet, "--checkpoint-every", "1", "--parallel-update", "false"],
        "loud": [*loud, "--checkpoint-every", "7", "--parallel-update", "true"],
    }
    results = {}
    for name, options in forms.items():
        run = tmp_path / name
        assert main([*tiny, *options, "--run-dir", str(run)]) == 0
        evaluation = json.loads((run / "eval.json").read_text())
        results[name] = (_run_rows(run), evaluation)
    assert len(results["quiet"][0]) >= 2
    assert results["quiet"] == results["loud"]
    assert {"progress", "plots", "gif", "baselines", "checkpoint_every"} <= GRPOConfig.result_free
    assert {"run_dir", "parallel_update"} <= GRPOConfig.result_free
