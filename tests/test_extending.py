"""The worked examples of docs/extending.md run, and do what they say (hand-worked values)."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest
import torch

from marl.algos import ALGORITHMS
from marl.algos.ppo import Minibatch
from marl.run.config import parse_cli
from marl.run.train import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAKE = ["--env-fn", "test_train_fakeenv:vector_env", "--env.max_cycles", "5"]
TINY = [*FAKE, "--num-envs", "4", "--rollout-steps", "8", "--progress", "false"]
TINY += ["--eval-episodes", "2", "--plots", "false", "--gif", "false", "--baselines", "false"]


def _load(name: str):
    path = os.path.join(ROOT, "docs", "examples", f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"example_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through it
    spec.loader.exec_module(module)
    return module


@pytest.fixture()
def registry():
    saved = dict(ALGORITHMS)
    yield
    ALGORITHMS.clear()
    ALGORITHMS.update(saved)


def test_centred_ranks_hand_worked(registry):
    rank = _load("rank_advantages")
    x = torch.tensor([3.0, -1.0, 10.0, 5.0, 0.5, 0.7])
    group = torch.tensor([0, 0, 0, 1, 1, 2])
    # group 0: ranks of (3, -1, 10) = (1, 0, 2) -> (0, -1, 1); group 1: (1, 0) -> (1, -1);
    # group 2 has one entry -> 0
    expected = torch.tensor([0.0, -1.0, 1.0, 1.0, -1.0, 0.0])
    torch.testing.assert_close(rank.centred_ranks(x, group), expected)


def test_rank_scheme_trains_and_its_option_is_a_flag(registry, tmp_path):
    rank = _load("rank_advantages")
    cfg = parse_cli(["--algo", "mappo_rank", "--rank-scale", "2.0", *TINY])
    assert isinstance(cfg, rank.RankMAPPOConfig) and cfg.rank_scale == 2.0
    torch.manual_seed(0)
    algo = rank.RankMAPPO(cfg, None)
    metrics = algo.iteration(0.0)
    assert metrics["adv/max_abs"] == pytest.approx(2.0)  # ranks scaled to [-2, 2]
    args = ["--algo", "mappo_rank", *TINY, "--total-steps", "64", "--run-dir", str(tmp_path)]
    assert main(args) == 0
    assert (tmp_path / "eval.json").exists()


def test_logit_penalty_hand_worked_and_in_the_metrics(registry):
    logit = _load("logit_penalty")
    logits = torch.tensor([[[[1.0, -2.0, 3.0]]]], requires_grad=True)  # [B=1, L=1, n=1, A=3]
    mask = torch.tensor([[[[True, True, False]]]])
    mb = Minibatch(
        obs=torch.zeros(1, 1, 1, 2),
        action_mask=mask,
        actions=torch.zeros(1, 1, 1, dtype=torch.long),
        old_logp=torch.zeros(1, 1, 1),
        advantages=torch.zeros(1, 1, 1),
        loss_mask=torch.ones(1, 1, dtype=torch.bool),
    )
    out = logit.logit_penalty(None, mb, {"logits": logits}, torch.tensor(2.0), coef=0.5)
    # allowed actions' mean square (1 + 4) / 2 = 2.5; times coef 0.5, divided by count 2
    assert float(out["loss/logit"].detach()) == pytest.approx(0.625)
    cfg = parse_cli(["--algo", "mappo_logit", "--logit-coef", "0.1", *TINY])
    torch.manual_seed(0)
    metrics = logit.LogitMAPPO(cfg, None).iteration(0.0)
    assert metrics["loss/logit"] > 0
    with pytest.raises(ValueError, match="logit-coef does not apply to --algo mappo"):
        parse_cli(["--logit-coef", "0.1", *TINY])
