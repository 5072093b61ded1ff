"""The trainer's small parts (issue 38, item 3): RunOptions beside the config, RunDir (layout,
refuse / overwrite / resume rules), the one atomic write, the stop-signal handler, the budget
and the evaluation cadence, each against hand-worked expectations."""

from __future__ import annotations

import errno
import os
import signal

import pytest

from marl.run.checkpointing import Cadence
from marl.run.config import parse_cli, parse_train_args
from marl.run.options import RunOptions
from marl.run.progress import Budget
from marl.run.rundir import (
    RunDir,
    RunDirBusyError,
    RunDirError,
    atomic_write,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
)
from marl.run.signals import StopSignals
from marl.run.train import run_dir_contents


# ---------------------------------------------------------------- atomic_write
def test_atomic_write_keeps_the_old_file_when_the_writer_fails(tmp_path):
    path = tmp_path / "eval.json"
    path.write_text("old")

    def half_then_fail(tmp: str) -> None:
        with open(tmp, "w") as fh:
            fh.write("half of the new")
        raise ValueError("writer failed")

    with pytest.raises(ValueError, match="writer failed"):
        atomic_write(str(path), half_then_fail)
    assert path.read_text() == "old"
    assert os.listdir(tmp_path) == ["eval.json"]  # no temporary file left


def test_atomic_write_names_the_path_in_an_os_error(tmp_path):
    path = tmp_path / "ckpt_3.pt"
    path.write_bytes(b"previous")

    def disk_full(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            fh.write(b"part")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(OSError) as info:
        atomic_write(str(path), disk_full)
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(path)
    assert path.read_bytes() == b"previous"
    assert os.listdir(tmp_path) == ["ckpt_3.pt"]


def test_atomic_write_writes_beside_the_target_with_its_suffix(tmp_path):
    seen = []

    def write(tmp: str) -> None:
        seen.append(tmp)
        with open(tmp, "w") as fh:
            fh.write("GIF89a")

    atomic_write(str(tmp_path / "episode.gif"), write, suffix=".gif")
    assert os.path.dirname(seen[0]) == str(tmp_path)
    assert os.path.basename(seen[0]) == f".episode.gif.tmp{os.getpid()}.gif"
    assert (tmp_path / "episode.gif").read_text() == "GIF89a"


def test_text_json_and_bytes_helpers(tmp_path):
    atomic_write_text(str(tmp_path / "a.txt"), "x\ny")
    assert (tmp_path / "a.txt").read_text() == "x\ny"
    atomic_write_json(str(tmp_path / "b.json"), {"a": 1})
    assert (tmp_path / "b.json").read_text() == '{\n  "a": 1\n}\n'
    atomic_write_json(str(tmp_path / "c.json"), {"a": [1, 2]}, final_newline=False)
    assert (tmp_path / "c.json").read_text() == '{\n  "a": [\n    1,\n    2\n  ]\n}'
    atomic_write_bytes(str(tmp_path / "new" / "dir" / "w.pt"), b"\x00\x01")  # folders made
    assert (tmp_path / "new" / "dir" / "w.pt").read_bytes() == b"\x00\x01"


# ---------------------------------------------------------------- RunDir
def test_run_dir_layout():
    run = RunDir("runs/x")
    assert run.config_yaml == os.path.join("runs/x", "config.yaml")
    assert run.metrics_jsonl == os.path.join("runs/x", "metrics.jsonl")
    assert run.eval_json == os.path.join("runs/x", "eval.json")
    assert run.finished_json == os.path.join("runs/x", "finished.json")
    assert run.checkpoints == os.path.join("runs/x", "checkpoints")
    assert run.policy == os.path.join("runs/x", "policy")
    assert run.plots == os.path.join("runs/x", "plots")
    assert run.episode_gif == os.path.join("runs/x", "episode.gif")
    assert run.lock_file == os.path.join("runs/x", ".lock")


def test_a_directory_is_a_run_when_it_holds_run_files(tmp_path):
    run = RunDir(str(tmp_path / "run"))
    assert run.contents() == []  # missing
    os.mkdir(run.path)
    (tmp_path / "run" / "notes.txt").write_text("mine")
    assert run.contents() == []  # other files are no run
    run.check_new(overwrite=False)
    os.mkdir(run.checkpoints)
    (tmp_path / "run" / "config.yaml").write_text("algo: mappo\n")
    assert run.contents() == ["config.yaml", "checkpoints"]
    assert run_dir_contents(run.path) == ["config.yaml", "checkpoints"]  # the older name


def test_a_new_run_is_refused_on_an_existing_one_with_the_same_message(tmp_path):
    path = str(tmp_path / "run")
    os.mkdir(path)
    (tmp_path / "run" / "metrics.jsonl").write_text("{}\n")
    os.mkdir(os.path.join(path, "tb"))
    expected = (
        f"--run-dir {path!r} already holds a run (metrics.jsonl, tb): continue it with "
        f"--resume {path}, or start it again with --overwrite (deletes those files), or "
        "choose another --run-dir"
    )
    with pytest.raises(RunDirError) as info:
        RunDir(path).check_new(overwrite=False)
    assert str(info.value) == expected
    RunDir(path).check_new(overwrite=True)
    (tmp_path / "file").write_text("")
    with pytest.raises(RunDirError, match="exists and is not a directory"):
        RunDir(str(tmp_path / "file")).check_new(overwrite=True)


def _make_finished_run(root) -> RunDir:
    run = RunDir(str(root))
    os.makedirs(run.checkpoints)
    os.makedirs(run.policy)
    for path in (run.config_yaml, run.metrics_jsonl, run.eval_json, run.finished_json):
        with open(path, "w") as fh:
            fh.write("{}")
    with open(os.path.join(run.checkpoints, "ckpt_1.pt"), "wb") as fh:
        fh.write(b"c")
    with open(run.episode_gif, "wb") as fh:
        fh.write(b"g")
    with open(run.file("notes.txt"), "w") as fh:
        fh.write("mine")
    return run


def test_claim_for_a_resume_keeps_the_run_and_drops_its_final_outputs(tmp_path):
    run = _make_finished_run(tmp_path / "run")
    with run.claim(resume=True, overwrite=False):
        left = sorted(os.listdir(run.path))
        # a second process (another open of the lock file) is refused while it is held
        busy = pytest.raises(RunDirBusyError, match="in use by another process")
        with busy, run.claim(resume=True, overwrite=False):
            pass
    kept = ["checkpoints", "config.yaml", "episode.gif", "metrics.jsonl", "notes.txt", "policy"]
    assert left == [".lock", *kept]
    assert os.listdir(run.checkpoints) == ["ckpt_1.pt"]


def test_claim_with_overwrite_deletes_the_run_files_only(tmp_path):
    run = _make_finished_run(tmp_path / "run")
    with run.claim(resume=False, overwrite=True):
        assert sorted(os.listdir(run.path)) == [".lock", "notes.txt"]


# ---------------------------------------------------------------- RunOptions
def test_parse_train_args_returns_the_options_beside_the_config(tmp_path):
    cfg, options = parse_train_args([])
    assert options == RunOptions()
    assert not options.resuming
    assert [name for name in vars(cfg) if name.startswith("_")] == []  # nothing stashed on it
    cfg, options = parse_train_args(
        ["--run-dir", str(tmp_path), "--overwrite", "--keep-checkpoints", "2", "--seed", "4"]
        + ["--env.grid_size", "8", "--wandb", "--wandb-project", "p"]
    )
    assert cfg.seed == 4 and cfg.run_dir == str(tmp_path)
    assert options.overwrite and options.keep_checkpoints == 2 and options.resume is None
    assert options.explicit == {"run_dir", "seed", "env"}
    assert options.wandb is not None and options.wandb.project == "p"


def test_parse_cli_leaves_no_private_attributes_on_the_config():
    cfg = parse_cli(["--overwrite", "--keep-checkpoints", "5", "--lr", "0.01"])
    assert cfg.lr == 0.01
    assert not [k for k in vars(cfg) if k.startswith("_")]


# ---------------------------------------------------------------- StopSignals
def test_stop_signals_ask_to_stop_and_restore_the_handlers(capsys):
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with StopSignals(announce=True) as stop:
        assert not stop.requested and stop.since() == ""
        signal.raise_signal(signal.SIGTERM)
        assert stop.requested and stop.signal == "SIGTERM"
        signal.raise_signal(signal.SIGTERM)  # repeated SIGTERMs do not stop at once
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)  # a second signal by Ctrl-C does
        assert stop.since().endswith("s after SIGTERM")
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    err = capsys.readouterr().err
    assert err.count("SIGTERM received: stopping after this update") == 1


def test_stop_signals_stop_at_once_when_finishing():
    with StopSignals(announce=False) as stop:
        stop.finishing = True
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGTERM)


# ---------------------------------------------------------------- budget and cadence
def test_budget_progress_is_the_largest_fraction():
    cfg, _ = parse_train_args(["--total-steps", "200", "--max-time", "10"])
    budget = Budget(cfg)
    assert budget.progress(50, 1.0, 0.0) == 0.25  # 50/200 > 1/10
    assert budget.progress(50, 8.0, 0.0) == 0.8  # 8/10 > 50/200
    assert budget.describe() == "--total-steps 200 --max-time 10"
    assert budget.bar_total() == (200, "step")


def test_cadence_evaluates_on_rank_0_every_eval_every_updates():
    cadence = Cadence(eval_every=2, checkpoint_every=3, evaluates=True)
    assert [u for u in range(1, 8) if cadence.evaluate_at(u)] == [2, 4, 6]
    assert [u for u in range(1, 8) if cadence.checkpoint_at(u)] == [3, 6]
    assert not Cadence(2, 3, evaluates=False).evaluate_at(2)  # other ranks
    assert not Cadence(0, 3, evaluates=True).evaluate_at(2)  # --eval-every 0: never
