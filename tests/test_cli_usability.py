"""Rough edges of the command-line tools (issue 39): flags spelled in full with a "did you
mean" for a misspelt one (marl.train, marl.evaluate, marl.export), marl.export's file names and
its missing-extra error, and the training progress off a terminal (plain lines, no carriage
returns).

The expectations are worked by hand: the files a given --out names, the flag a misspelling is
closest to, and the progress of a run of 3 updates of 4 envs x 16 steps (64, 128, 192 env
steps: 33.3%, 66.7%, 100% of a 192-step budget)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import warnings

import pytest

import marl.run.train as train_module
from marl.export import export_paths
from marl.export import main as export_main
from marl.run.cli import closest_flag
from marl.run.config import parse_cli
from marl.run.evaluate import main as eval_main
from marl.run.train import main as train_main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: 3 updates of 4 envs x 16 steps on a small multisearch; the progress setting is the test's
TINY = [
    "--num-envs", "4", "--rollout-steps", "16", "--hidden-dim", "16",
    "--critic-hidden-dim", "16", "--epochs", "1", "--num-minibatches", "1",
    "--eval-episodes", "1", "--eval-every", "2", "--total-steps", "192",
    "--baselines", "false", "--plots", "false", "--gif", "false",
    "--env.grid_size", "8", "--env.max_cycles", "20", "--env.n_targets", "1",
]  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished tiny mlp run (multisearch: agent types scout and rescuer)."""
    run = tmp_path_factory.mktemp("cli") / "run"
    assert train_main([*TINY, "--progress", "false", "--run-dir", str(run)]) == 0
    return run


# ------------------------------------------------------------------------------------------
# flags spelled in full; "did you mean"
# ------------------------------------------------------------------------------------------
def test_closest_flag() -> None:
    flags = ["--total-steps", "--total_steps", "--seed", "--eval-seed", "--max-time"]
    assert closest_flag("--total-step", flags) == "--total-steps"
    assert closest_flag("--total_step=5", flags) == "--total-steps"  # the dashed spelling
    assert closest_flag("--max-tme", flags) == "--max-time"
    assert closest_flag("--frobnicate", flags) is None
    assert closest_flag("5", flags) is None  # a value, not a flag


@pytest.mark.parametrize(
    "argv, suggestion",
    [
        (["--total-step", "5"], "did you mean --total-steps?"),
        (["--total-step=5"], "did you mean --total-steps?"),
        (["--total", "5"], "did you mean --total-steps?"),  # an abbreviation is no flag
        (["--lr-schedul", "linear"], "did you mean --lr-schedule?"),
        (["--wandb", "--wandb-projet", "p"], "did you mean --wandb-project?"),
    ],
)
def test_train_refuses_misspelt_flags_naming_the_closest(tmp_path, capsys, argv, suggestion):
    assert train_main([*argv, "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unrecognized option") and suggestion in err, err
    assert not (tmp_path / "run").exists()


def test_train_misspelt_flag_from_the_command_line(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "marl.train", "--total-step", "5"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": ROOT},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 2, res.stderr
    assert "did you mean --total-steps?" in res.stderr and "Traceback" not in res.stderr
    assert os.listdir(tmp_path) == []  # no run directory started


def test_env_overrides_and_wandb_flags_still_parse(tmp_path, capsys) -> None:
    cfg = parse_cli(["--env.grid_size=8", "--env.n_targets", "2", "--total-steps", "64"])
    assert cfg.env == {"grid_size": 8, "n_targets": 2} and cfg.total_steps == 64
    # --wandb-project is taken (as a W&B flag: without --wandb it is this error, not unknown)
    assert train_main(["--wandb-project", "p", "--run-dir", str(tmp_path / "run")]) == 2
    assert "--wandb-project without --wandb" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, suggestion",
    [
        (["--episode", "1"], "did you mean --episodes?"),
        (["--seed", "3"], "did you mean --seeds?"),  # argparse took it as --seeds before
        (["--update", "--episodes", "1"], "did you mean --update-run?"),
    ],
)
def test_evaluate_refuses_misspelt_flags(tmp_path, capsys, argv, suggestion) -> None:
    with pytest.raises(SystemExit) as exc:
        eval_main([str(tmp_path), *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments:" in err and suggestion in err, err


@pytest.mark.parametrize(
    "argv, suggestion",
    [
        (["--ou", "x"], "did you mean --out?"),
        (["--out", "x", "--form", "onnx"], "did you mean --format?"),
    ],
)
def test_export_refuses_misspelt_flags(tmp_path, capsys, argv, suggestion) -> None:
    with pytest.raises(SystemExit) as exc:
        export_main([str(tmp_path), *argv])
    assert exc.value.code == 2
    assert suggestion in capsys.readouterr().err


# ------------------------------------------------------------------------------------------
# marl.export: file names, printed paths, the export extra
# ------------------------------------------------------------------------------------------
TYPES = ["scout", "rescuer"]


def test_export_paths(tmp_path) -> None:
    both = {"scout": "p.scout.onnx", "rescuer": "p.rescuer.onnx"}
    assert export_paths("p.onnx", TYPES, "onnx") == both
    assert export_paths("p", TYPES, "onnx") == both
    assert export_paths("p", TYPES, "torchscript") == {
        "scout": "p.scout.pt",
        "rescuer": "p.rescuer.pt",
    }
    assert export_paths("p.pt", ["agent"], "torchscript") == {"agent": "p.agent.pt"}
    assert export_paths("p.v2", ["agent"], "onnx") == {"agent": "p.v2.agent.onnx"}
    assert export_paths("out/", TYPES, "onnx") == {
        "scout": "out/scout.onnx",
        "rescuer": "out/rescuer.onnx",
    }
    existing = str(tmp_path)  # a directory, no trailing slash
    assert export_paths(existing, ["agent"], "torchscript") == {"agent": f"{existing}/agent.pt"}
    with pytest.raises(ValueError, match="extension of the other format"):
        export_paths("p.pt", TYPES, "onnx")


@pytest.mark.parametrize(
    "fmt, out, expected",
    [
        ("onnx", "pol.onnx", ["pol.scout.onnx", "pol.rescuer.onnx"]),
        ("onnx", "dir/", ["dir/scout.onnx", "dir/rescuer.onnx"]),
        ("torchscript", "pol", ["pol.scout.pt", "pol.rescuer.pt"]),
    ],
)
def test_export_writes_and_prints_every_file_quietly(
    trained, tmp_path, capsys, monkeypatch, fmt, out, expected
) -> None:
    if fmt == "onnx":
        pytest.importorskip("onnxruntime")
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert export_main([str(trained), "--format", fmt, "--out", out]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines() == [f"{t}: {p}" for t, p in zip(TYPES, expected, strict=True)]
    assert captured.err == ""
    assert not [w for w in caught if issubclass(w.category, (DeprecationWarning, FutureWarning))]
    for path in expected:
        assert (tmp_path / path).stat().st_size > 0
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.*")) == sorted(expected)


def test_export_without_the_extra_is_one_error_line(trained, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # importing it now fails
    out = tmp_path / "pol.onnx"
    assert export_main([str(trained), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err
    assert "onnxscript" in err and "pip install 'coopsearch[export]'" in err
    assert list(tmp_path.iterdir()) == []
    # TorchScript needs none of it
    assert export_main([str(trained), "--format", "torchscript", "--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rescuer.pt", "scout.pt"]


# ------------------------------------------------------------------------------------------
# training progress off a terminal
# ------------------------------------------------------------------------------------------
class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_off_a_terminal_is_plain_lines(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(train_module._ProgressLines, "interval", 0.0)  # a line per update
    log = tmp_path / "stderr.log"
    with open(log, "w") as fh:
        monkeypatch.setattr(sys, "stderr", fh)
        assert train_main([*TINY, "--run-dir", str(tmp_path / "run")]) == 0
    text = log.read_text()
    assert "\r" not in text
    lines = [line for line in text.splitlines() if line.startswith("[marl.train] mappo ")]
    expected = [("33.3%", 1, 64), ("66.7%", 2, 128), ("100.0%", 3, 192)]
    assert len(lines) == len(expected), text
    for line, (pct, update, steps) in zip(lines, expected, strict=True):
        assert line.startswith(f"[marl.train] mappo {pct} of budget ({steps}/192 step, ")
        assert f"update={update} env_steps={steps} agent_sps=" in line
        # eval every 2 updates: its success shown from update 2 on
        assert ("eval_success=" in line) == (update >= 2)


def test_progress_on_a_terminal_stays_a_tqdm_bar(tmp_path, monkeypatch) -> None:
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert train_main([*TINY, "--run-dir", str(tmp_path / "run")]) == 0
    assert "\r" in terminal.getvalue() and "[marl.train] mappo" not in terminal.getvalue()


def test_progress_of_a_redirected_run_has_no_carriage_returns(tmp_path) -> None:
    log = tmp_path / "stderr.log"
    with open(log, "w") as fh:
        res = subprocess.run(
            [sys.executable, "-m", "marl.train", *TINY, "--run-dir", str(tmp_path / "run")],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=fh,
            timeout=600,
        )
    assert res.returncode == 0, log.read_text()
    assert "\r" not in log.read_text()
    assert (tmp_path / "run" / "finished.json").is_file()
