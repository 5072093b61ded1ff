"""benchmarks/popgym_table.py and benchmarks/peer_mappo.py without training: argument
handling, which command a run directory's state leads to, and the tables' formatting."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


popgym_table = _load("popgym_table")
peer_mappo = _load("peer_mappo")


@pytest.mark.parametrize("script", ["popgym_table.py", "peer_mappo.py"])
def test_help_runs(script: str) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "--total-steps" in out and "--table-only" in out


def test_popgym_args_defaults_and_errors() -> None:
    args = popgym_table.parse_args([])
    assert args.tasks == list(popgym_table.TASKS) and len(args.tasks) == 4
    assert args.backbones == ["mlp", "gru", "mamba", "mamba2"] and args.seeds == [0, 1, 2]
    with pytest.raises(SystemExit):
        popgym_table.parse_args(["--total-steps", "0"])
    with pytest.raises(SystemExit):
        popgym_table.parse_args(["--backbones", "lstm"])
    with pytest.raises(ValueError, match="unknown task"):
        popgym_table.train_command("py", "Nope", "gru", 0, 10, "d", 1, 0)


def test_popgym_plan_command_follows_the_run_dir(tmp_path: Path) -> None:
    d = tmp_path / "run"
    fresh = popgym_table.train_command("py", "RepeatPreviousEasy", "gru", 1, 1000, str(d), 1, 10)
    assert fresh[:3] == ["nice", "-n", "10"]
    assert fresh[fresh.index("--env-fn") + 1] == "popgym.envs.repeat_previous:RepeatPreviousEasy"
    assert popgym_table.plan_command(str(d), fresh) == fresh  # nothing there yet
    d.mkdir()
    assert popgym_table.plan_command(str(d), fresh) == fresh + ["--overwrite"]
    (d / "checkpoints").mkdir()
    (d / "checkpoints" / "ckpt_3.pt").write_bytes(b"")
    assert popgym_table.plan_command(str(d), fresh) == [
        "nice", "-n", "10", "py", "-m", "marl.train", "--resume", str(d),
    ]  # fmt: skip
    (d / "eval.json").write_text("{}")
    assert popgym_table.plan_command(str(d), fresh) is None


def test_popgym_cells_and_table() -> None:
    assert popgym_table.fmt_cell({}) == "-"
    assert popgym_table.fmt_cell({"n": 1, "mean": 0.5, "mean_ci": None}) == "0.50 (n=1)"
    cell = popgym_table.fmt_cell({"n": 3, "mean": -0.123, "mean_ci": [-0.5, 0.25]})
    assert cell == "-0.12 [-0.50, 0.25] (n=3)"
    table = {"A": {"mlp": {"n": 3, "mean": 1.0, "mean_ci": [0.5, 1.5]}}}
    md = popgym_table.markdown_table(table, ["A", "B"], ["mlp", "gru"], {"A": (0.9, "src")})
    lines = md.strip().splitlines()
    assert lines[0] == "| task | mlp | gru | paper GRU (MMER) |"
    assert lines[2] == "| A | 1.00 [0.50, 1.50] (n=3) | - | 0.90 |"
    assert lines[3] == "| B | - | - | n/a |"
    md = popgym_table.markdown_table(table, ["A"], ["mlp"], {}, random={"A": -0.5})
    assert md.splitlines()[0] == "| task | mlp | random | paper GRU (MMER) |"
    assert md.splitlines()[2] == "| A | 1.00 [0.50, 1.50] (n=3) | -0.50 | n/a |"


def test_peer_args() -> None:
    args = peer_mappo.parse_args([])
    assert args.total_steps == 300_000 and args.seeds == [0, 1, 2]
    assert args.sides == ["ours", "peer"] and not args.peer_train
    with pytest.raises(SystemExit):
        peer_mappo.parse_args(["--peer-train"])  # needs --peer-out
    with pytest.raises(SystemExit):
        peer_mappo.parse_args(["--torch-threads", "0"])


def test_peer_commands() -> None:
    ours = peer_mappo.ours_command("py", 2, 5000, "runs/x", 1, 0)
    assert ours[:3] == ["py", "-m", "marl.train"]
    for flag, value in [
        ("--env-fn", "mpe2.simple_spread_v3:parallel_env"),
        ("--env.N", "3"),
        ("--env.max_cycles", "25"),
        ("--total-steps", "5000"),
        ("--seed", "2"),
        ("--torch-threads", "1"),
    ]:
        assert ours[ours.index(flag) + 1] == value
    peer = peer_mappo.peer_command("/v/bin/python", 1, 6000, "o.json", 1, 10)
    assert peer[:4] == ["nice", "-n", "10", "/v/bin/python"]
    assert "--peer-train" in peer and peer[peer.index("--peer-out") + 1] == "o.json"


def _record(side: str, seed: int, ret: float) -> dict:
    return {
        "side": side,
        "seed": seed,
        "mean_return": ret,
        "mean_return_deterministic": ret - 1,
        "env_steps": 6000,
        "train_s": 10.0,
        "env_steps_per_s": 600.0,
        "curve": [
            {"env_steps": 3000, "time_s": 5.0, "train_episode_return": ret - 2},
            {"env_steps": 6000, "time_s": 10.0, "train_episode_return": ret},
        ],
    }


def test_peer_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    # the bootstrap (rliable) is marl.experiments.stats' and tested there; a stub keeps this fast
    def summarise(values):
        return {"n": len(values), "mean": sum(values) / len(values), "mean_ci": [-1.0, 1.0]}

    monkeypatch.setattr(peer_mappo, "summarise", summarise)
    results = {"ours": [_record("ours", 1, -20.0), _record("ours", 0, -22.0)], "peer": []}
    md = peer_mappo.markdown_tables(results, -26.5)
    lines = md.strip().splitlines()
    assert lines[2].startswith("| ours | 0 | -22.00 | -23.00 | 6,000 | 10 | 600 |")
    assert lines[3].startswith("| ours | 1 | -20.00 |")
    assert lines[4] == (
        "| **ours** | mean [95% CI] | -21.00 [-1.00, 1.00] | -22.00 [-1.00, 1.00] | 6,000 "
        "| 10 [-1, 1] | 600 [-1, 1] |"
    )
    assert lines[-1] == "| random | - | -26.50 | - | - | - | - |"
    assert not any(line.startswith("| peer") for line in lines)
    curve = peer_mappo.curve_table(results, [3000, 6000]).strip().splitlines()
    assert curve[2] == "| 3,000 | -23.00 | 5 | - | - |"
    assert curve[3] == "| 6,000 | -21.00 | 10 | - | - |"


def test_shared_evaluator_matches_a_hand_loop() -> None:
    """evaluate_spread's figure: the episode sum of the mean over agents of the rewards."""
    import numpy as np

    seeds = [10000, 10001]
    got = peer_mappo.evaluate_spread(lambda obs: {a: 0 for a in obs}, lambda s: None, seeds)
    env = peer_mappo.make_spread_env()
    for seed, value in zip(seeds, got, strict=True):
        env.reset(seed=seed)
        total, steps = 0.0, 0
        while env.agents:
            _, rewards, _, _, _ = env.step({a: 0 for a in env.agents})
            total += sum(rewards.values()) / len(rewards)
            steps += 1
        assert steps == 25
        assert value == pytest.approx(total)
    assert np.isfinite(got).all()
