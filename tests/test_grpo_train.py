"""``python -m marl.train --algo grpo``: run directory, option rejection, exact resume."""

from __future__ import annotations

import json

import pytest
import torch

from marl.run.config import ConfigError, parse_cli
from marl.run.runlog import TIMING_KEYS
from marl.run.train import main

TINY = [
    "--algo", "grpo", "--seed", "2", "--num-envs", "8", "--group-size", "4", "--hidden-dim",
    "16", "--epochs", "2", "--num-minibatches", "2", "--eval-every", "0", "--eval-episodes",
    "2", "--checkpoint-every", "1", "--plots", "false", "--gif", "false", "--baselines",
    "false", "--progress", "false", "--env.grid_size", "8", "--env.max_cycles", "20",
    "--env.n_targets", "2",
]  # fmt: skip
VOLATILE = TIMING_KEYS


def _rows(run_dir) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(x).items() if k not in VOLATILE} for x in lines]


@pytest.mark.parametrize(
    "flag,value",
    [("--value-epochs", "4"), ("--value-clip", "0.1"), ("--value-ensemble", "2"),
     ("--value-norm", "true"), ("--critic-lr", "0.001"), ("--rollout-steps", "32")],
)  # fmt: skip
def test_cli_rejects_value_head_options_for_grpo(flag, value):
    with pytest.raises(ConfigError, match=flag):
        parse_cli(["--algo", "grpo", flag, value])
    parse_cli(["--algo", "mappo", flag, value])  # fine for MAPPO


def test_cli_grpo_recipe_keeps_applicable_parts():
    cfg = parse_cli(["--algo", "grpo", "--recipe", "calibrated"])
    assert cfg.adv_clip == 5.0 and cfg.optimism_offset == 0.5 and cfg.whitening == "batch"
    # value-head parts not applied (the recipe's 4 value epochs, value clip 0.1)
    assert not hasattr(cfg, "value_clip") and not hasattr(cfg, "value_epochs")
    with pytest.raises(ConfigError, match="kl-beta"):
        parse_cli(["--algo", "mappo", "--kl-beta", "0.1"])


def test_main_reports_config_error_for_grpo(capsys):
    assert main(["--algo", "grpo", "--value-clip", "0.2"]) == 2
    assert "--value-clip does not apply to --algo grpo" in capsys.readouterr().err


def test_grpo_run_directory_and_exact_resume(tmp_path):
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert main([*TINY, "--total-steps", "300", "--run-dir", str(straight)]) == 0
    rows = _rows(straight)
    assert len(rows) >= 2
    for key in ("frac_zero_std", "adv/mean", "adv_raw/std", "loss/policy", "entropy",
                "episode/success", "env_steps"):  # fmt: skip
        assert key in rows[-1], key
    ev = json.loads((straight / "eval.json").read_text())
    assert ev["n_episodes"] == 2 and 0.0 <= ev["success_rate"] <= 1.0
    assert "algo: grpo" in (straight / "config.yaml").read_text()

    # stop after the first update, resume to the same budget: identical metrics and params
    assert main([*TINY, "--total-steps", "1", "--run-dir", str(split)]) == 0
    assert len(_rows(split)) == 1
    assert main(["--resume", str(split), "--total-steps", "300"]) == 0
    assert _rows(split) == rows
    a = torch.load(straight / "checkpoints" / "latest.pt", weights_only=False)["algo"]["policy"]
    b = torch.load(split / "checkpoints" / "latest.pt", weights_only=False)["algo"]["policy"]
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_grpo_whitening_none_and_team_individual_are_one_configuration(tmp_path):
    """GRPO's advantage is itself group-relative: 'none' and 'team_individual' both mean no
    second stage (the help says so), so the two train identically; 'batch' (a second stage)
    does not."""
    rows = {}
    for scheme in ("none", "team_individual", "batch"):
        run = tmp_path / scheme
        argv = [*TINY, "--total-steps", "200", "--whitening", scheme, "--run-dir", str(run)]
        assert main(argv) == 0
        rows[scheme] = _rows(run)
    assert len(rows["none"]) >= 2 and rows["none"] == rows["team_individual"]
    assert rows["batch"] != rows["none"]
