"""Full short ``python -m marl.train`` runs on outside envs through the adapter: mpe2
simple_spread (MAPPO and GRPO), Gymnasium CartPole, POPGym with a recurrent backbone."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from marl.run.train import main as train_main

TINY = [
    "--total-steps",
    "1024",
    "--num-envs",
    "8",
    "--hidden-dim",
    "16",
    "--eval-episodes",
    "2",
    "--eval-every",
    "2",
    "--progress",
    "false",
    "--baselines",
    "false",
    "--plots",
    "false",
    "--gif",
    "false",
]
MAPPO_TINY = [*TINY, "--rollout-steps", "16", "--critic-hidden-dim", "16"]


def finished_run(run_dir) -> dict:
    with open(run_dir / "eval.json") as fh:
        result = json.load(fh)
    assert math.isfinite(result["mean_return"])
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows and rows[-1]["env_steps"] >= 1024
    assert any("episode/return" in r for r in rows)
    assert any("eval/mean_return" in r for r in rows)
    return result


def test_mappo_on_mpe2_simple_spread(tmp_path):
    pytest.importorskip("mpe2", reason="install mpe2 (pip install mpe2)")
    run = tmp_path / "spread"
    argv = ["--env-fn", "mpe2.simple_spread_v3:parallel_env", "--env.N", "3"]
    argv += ["--env.max_cycles", "25", "--run-dir", str(run)]
    assert train_main([*MAPPO_TINY, *argv]) == 0
    result = finished_run(run)
    assert result["mean_return"] < 0  # distances to landmarks: negative rewards
    with open(run / "config.yaml") as fh:
        config = yaml.safe_load(fh)
    assert config["env"] == {"N": 3, "max_cycles": 25}


def test_grpo_on_mpe2_simple_spread(tmp_path):
    pytest.importorskip("mpe2", reason="install mpe2 (pip install mpe2)")
    run = tmp_path / "grpo"
    argv = ["--algo", "grpo", "--env-fn", "mpe2.simple_spread_v3:parallel_env"]
    argv += ["--env.max_cycles", "10", "--group-size", "4", "--run-dir", str(run)]
    assert train_main([*TINY, *argv]) == 0
    finished_run(run)


def test_mappo_on_gymnasium_cartpole_with_an_adapter_option(tmp_path):
    run = tmp_path / "cartpole"
    argv = ["--env-fn", "gymnasium:make", "--env.id", "CartPole-v1"]
    argv += ["--env.adapter_team_reward", "none", "--run-dir", str(run)]
    assert train_main([*MAPPO_TINY, *argv]) == 0
    assert finished_run(run)["mean_return"] > 0


def test_mappo_gru_on_popgym(tmp_path):
    pytest.importorskip("popgym", reason="install popgym (pip install popgym)")
    run = tmp_path / "popgym"
    argv = ["--env-fn", "popgym.envs.repeat_previous:RepeatPreviousEasy", "--backbone", "gru"]
    argv += ["--seq-len", "8", "--run-dir", str(run)]
    assert train_main([*MAPPO_TINY, *argv]) == 0
    finished_run(run)


def test_bad_adapter_option_fails_before_any_work(tmp_path, capsys):
    run = tmp_path / "bad"
    argv = ["--env-fn", "gymnasium:make", "--env.id", "CartPole-v1"]
    argv += ["--env.adapter_team_rewards", "sum", "--run-dir", str(run)]
    assert train_main([*MAPPO_TINY, *argv]) == 2
    assert "unknown adapter option 'adapter_team_rewards'" in capsys.readouterr().err
    assert not (run / "metrics.jsonl").exists()


def test_resume_through_the_adapter(tmp_path):
    pytest.importorskip("mpe2", reason="install mpe2 (pip install mpe2)")
    run = tmp_path / "resume"
    argv = ["--env-fn", "mpe2.simple_spread_v3:parallel_env", "--env.max_cycles", "10"]
    assert train_main([*MAPPO_TINY, *argv, "--checkpoint-every", "2", "--run-dir", str(run)]) == 0
    # mpe2's envs do not survive pickling: the resumed run resets them and goes on
    assert train_main(["--resume", str(run), "--total-steps", "2048"]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["env_steps"] >= 2048
