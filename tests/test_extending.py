"""The worked examples of docs/extending.md run, and do what they say (hand-worked values)."""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import replace

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
    terms = {"logits": logits, "count": torch.tensor(2.0)}
    out = logit.logit_penalty(None, mb, terms, mb.sample_mask(), coef=0.5)
    # allowed actions' mean square (1 + 4) / 2 = 2.5; times coef 0.5, divided by count 2
    assert float(out["loss/logit"].detach()) == pytest.approx(0.625)
    # an agent that has left its episode is outside the sample mask: no penalty
    left = replace(mb, agent_mask=torch.zeros(1, 1, 1, dtype=torch.bool))
    out = logit.logit_penalty(None, left, terms, left.sample_mask(), coef=0.5)
    assert float(out["loss/logit"].detach()) == 0.0
    cfg = parse_cli(["--algo", "mappo_logit", "--logit-coef", "0.1", *TINY])
    torch.manual_seed(0)
    metrics = logit.LogitMAPPO(cfg, None).iteration(0.0)
    assert metrics["loss/logit"] > 0
    with pytest.raises(ValueError, match="logit-coef does not apply to --algo mappo"):
        parse_cli(["--logit-coef", "0.1", *TINY])


def test_logit_penalty_trains_batched_over_seeds(registry):
    """docs/extending.md's examples run batched (``--seeds``): the hook's term per seed, and
    seed k in a batch equals the seed alone bit for bit."""
    from marl.algos.mappo import SeedMAPPO

    logit = _load("logit_penalty")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfgs = [parse_cli(["--algo", "mappo_logit", "--logit-coef", "0.1", "--seed", str(k),
                           *TINY]) for k in (0, 1)]  # fmt: skip
        big = SeedMAPPO(cfgs, algorithm=logit.LogitMAPPO)
        alone = SeedMAPPO(cfgs[1:], algorithm=logit.LogitMAPPO)
        rows_big, rows_alone = big.iteration(0.0), alone.iteration(0.0)
    finally:
        torch.set_num_threads(before)
    assert rows_big[0]["loss/logit"] > 0 and rows_big[1]["loss/logit"] > 0
    assert rows_big[0]["loss/logit"] != rows_big[1]["loss/logit"]
    assert rows_big[1]["loss/logit"] == rows_alone[0]["loss/logit"]
    for a, b in zip(big.policy.parameters(), alone.policy.parameters(), strict=True):
        assert torch.equal(a[1], b[0])


MY_ALGO = """
from dataclasses import dataclass
from typing import ClassVar

from marl.algos.base import config_field
from marl.algos.mappo import MAPPO, MAPPOConfig


@dataclass
class HalfConfig(MAPPOConfig):
    algo_name: ClassVar[str] = "mappo_half"
    algo: str = config_field("mappo_half", "Algorithm.")
    half_scale: float = config_field(0.5, "Scale of the mixed advantages.")


class HalfMAPPO(MAPPO):
    name: ClassVar[str] = "mappo_half"
    config_class: ClassVar[type] = HalfConfig

    def mix_and_whiten(self, team, individual, keys, mask=None):
        raw, final = super().mix_and_whiten(team, individual, keys, mask)
        return raw, self.cfg.half_scale * final
"""


def test_an_algorithm_in_its_own_file_is_reachable_by_module_path(tmp_path) -> None:
    """``--algo my_half:HalfMAPPO`` (a file nobody imported) trains, and a fresh process's
    load_policy and marl.evaluate find the algorithm again from config.yaml."""
    import subprocess

    import yaml

    (tmp_path / "my_half.py").write_text(MY_ALGO)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), ROOT, f"{ROOT}/tests"])}
    run = tmp_path / "run"
    train = [sys.executable, "-m", "marl.train", "--algo", "my_half:HalfMAPPO"]
    train += ["--half-scale", "0.25", *TINY, "--total-steps", "64", "--run-dir", str(run)]
    done = subprocess.run(train, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["algo"] == "my_half:HalfMAPPO" and cfg["half_scale"] == 0.25
    code = (
        "import marl, sys; p = marl.load_policy(sys.argv[1]); "
        "print(type(p.config).__name__, p.config.half_scale)"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code, str(run)], cwd=tmp_path, env=env, capture_output=True,
        text=True,
    )  # fmt: skip
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert loaded.stdout.split() == ["HalfConfig", "0.25"]
    evaluate = [sys.executable, "-m", "marl.evaluate", str(run), "--episodes", "2"]
    done = subprocess.run(evaluate, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    bad = subprocess.run(
        [sys.executable, "-m", "marl.train", "--algo", "my_half:Nope", *TINY],
        cwd=tmp_path, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert bad.returncode == 2 and "no Algorithm subclass named 'Nope'" in bad.stderr


MY_BACKBONE = '''
from seqmodels.backbones import GRUBackbone
from seqmodels.backbones import BackboneSpec


class WideGRU(GRUBackbone):
    """A GRU backbone with two layers: a stand-in for your own recurrent core."""

    def __init__(self, input_dim, hidden_dim, activation="tanh"):
        super().__init__(input_dim, hidden_dim, num_layers=2, activation=activation)


WIDE_GRU = BackboneSpec(
    "wide_gru",
    build=lambda input_dim, hidden_dim, **kw: WideGRU(input_dim, hidden_dim, **kw),
    recurrent=True,
    defaults={"rollout_steps": 16, "seq_len": 4},
)
'''


def test_a_backbone_in_its_own_file_is_reachable_by_module_path(tmp_path) -> None:
    """``--backbone my_bb:WIDE_GRU`` trains with the backbone's own defaults, and a fresh
    process's load_policy finds it again from config.yaml; export says it cannot."""
    import subprocess

    import yaml

    (tmp_path / "my_bb.py").write_text(MY_BACKBONE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), ROOT, f"{ROOT}/tests"])}
    run = tmp_path / "run"
    fake = [a for a in TINY if a not in ("--rollout-steps", "8")]
    train = [sys.executable, "-m", "marl.train", "--backbone", "my_bb:WIDE_GRU", *fake]
    train += ["--total-steps", "128", "--run-dir", str(run)]
    done = subprocess.run(train, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["backbone"] == "my_bb:WIDE_GRU"
    assert (cfg["rollout_steps"], cfg["seq_len"]) == (16, 4)  # the backbone's own defaults
    code = (
        "import marl, sys; p = marl.load_policy(sys.argv[1]); "
        "a = next(iter(p.policy.actors.values())); "
        "print(type(a.backbone).__name__, a.backbone.is_recurrent)"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code, str(run)], cwd=tmp_path, env=env, capture_output=True,
        text=True,
    )  # fmt: skip
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert loaded.stdout.split() == ["WideGRU", "True"]
    bad = subprocess.run(
        [sys.executable, "-m", "marl.train", "--backbone", "lstm", *TINY],
        cwd=tmp_path, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert bad.returncode == 2 and "unknown backbone 'lstm'" in bad.stderr
