"""Run-directory safety (issue 19, items 1 and 4): an existing run is never destroyed by a
mistake, a failed resume leaves the directory byte-for-byte as it was, only the budget /
cadences / outputs / device may change on resume, and TensorBoard holds each update once after
a resume (as metrics.jsonl does)."""

from __future__ import annotations

import collections
import hashlib
import json
import os
import shutil

import pytest
import yaml

from marl.run.config import ConfigError, parse_cli, parse_train_args
from marl.run.runlog import TIMING_KEYS, read_metrics, read_tensorboard_events
from marl.run.train import main as train_main

TINY = [
    "--env-fn", "test_train_fakeenv:vector_env", "--num-envs", "8", "--rollout-steps", "16",
    "--hidden-dim", "16", "--critic-hidden-dim", "16", "--eval-episodes", "2",
    "--eval-repeats", "1", "--eval-every", "0", "--progress", "false", "--baselines", "false",
    "--plots", "false", "--gif", "false", "--env.max_cycles", "6", "--env.goal", "2",
    "--checkpoint-every", "1",
]  # fmt: skip
STEPS = 128  # env steps per update (8 envs x 16 steps)
VOLATILE = TIMING_KEYS


def snapshot(root) -> dict[str, str]:
    """Relative path -> sha256 of every file under ``root`` (directories as 'dir')."""
    out = {}
    for folder, dirs, files in os.walk(root):
        for d in dirs:
            out[os.path.relpath(os.path.join(folder, d), root)] = "dir"
        for f in files:
            path = os.path.join(folder, f)
            with open(path, "rb") as fh:
                out[os.path.relpath(path, root)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def rows(run) -> list[dict]:
    return [
        {k: v for k, v in r.items() if k not in VOLATILE}
        for r in read_metrics(str(run / "metrics.jsonl"))
    ]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished 3-update run (eval.json present), copied by each test that changes it."""
    run = tmp_path_factory.mktemp("runs") / "done"
    assert train_main([*TINY, "--total-steps", str(3 * STEPS), "--run-dir", str(run)]) == 0
    assert (run / "eval.json").is_file()
    return run


@pytest.fixture
def run(finished_run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(finished_run, copy)
    return copy


# ---------------------------------------------------------------- a new run on an existing one


def test_existing_run_without_resume_is_refused_and_untouched(run, capsys):
    before = snapshot(run)
    assert train_main([*TINY, "--total-steps", str(STEPS), "--run-dir", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "Traceback" not in err
    assert "--resume" in err and "--overwrite" in err
    assert snapshot(run) == before


def test_overwrite_starts_the_run_again(run):
    (run / "notes.txt").write_text("mine")  # not a run file: kept
    assert (
        train_main([*TINY, "--total-steps", str(STEPS), "--run-dir", str(run), "--overwrite"]) == 0
    )
    assert [r["update"] for r in rows(run)] == [1]
    assert (run / "notes.txt").read_text() == "mine"
    assert (run / "eval.json").is_file()


def test_empty_directory_is_not_a_run(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert train_main([*TINY, "--total-steps", str(STEPS), "--run-dir", str(empty)]) == 0
    assert [r["update"] for r in rows(empty)] == [1]


def test_resume_and_overwrite_exclude_each_other(run):
    with pytest.raises(ConfigError, match="--overwrite"):
        parse_cli(["--resume", str(run), "--overwrite"])


# ---------------------------------------------------------------- resume validates first


@pytest.mark.parametrize(
    "extra,names",
    [
        (["--hidden-dim", "128"], ["--hidden-dim 16 -> 128"]),
        (["--algo", "grpo"], ["--algo 'mappo' -> 'grpo'"]),
        (["--lr", "1e6"], ["--lr 0.001 -> 1000000.0"]),
        (["--env.goal", "3", "--seed", "5"], ["--env.goal 2 -> 3", "--seed 0 -> 5"]),
        (["--run-dir", "elsewhere"], ["--run-dir"]),
    ],
)
def test_incompatible_resume_is_refused_naming_fields_and_changes_nothing(
    run, capsys, extra, names
):
    before = snapshot(run)
    assert train_main(["--resume", str(run), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "Traceback" not in err, err
    for name in names:
        assert name in err, (name, err)
    assert snapshot(run) == before
    # the run still resumes and evaluates as before
    from marl.run.evaluate import main as eval_main

    assert eval_main([str(run), "--episodes", "1"]) == 0


def test_config_file_differing_from_the_run_is_refused(run, tmp_path, capsys):
    before = snapshot(run)
    cfg = tmp_path / "other.yaml"
    cfg.write_text(yaml.safe_dump({"ent_coef": 0.5, "env": {"goal": 2}}))
    assert train_main(["--resume", str(run), "--config", str(cfg)]) == 2
    assert "--ent-coef 0.01 -> 0.5" in capsys.readouterr().err
    assert snapshot(run) == before


def test_config_file_equal_to_the_run_is_accepted(run, tmp_path):
    own = yaml.safe_load((run / "config.yaml").read_text())
    cfg = tmp_path / "same.yaml"
    # a subset of the run's settings (env kwargs too), plus a changed budget and cadence
    cfg.write_text(
        yaml.safe_dump(
            {"hidden_dim": own["hidden_dim"], "env": {"goal": 2}, "total_steps": 4 * STEPS}
        )
    )
    parsed = parse_cli(["--resume", str(run), "--config", str(cfg), "--eval-every", "2"])
    assert parsed.env == own["env"]  # merged, not replaced by the file's env
    assert parsed.total_steps == 4 * STEPS and parsed.eval_every == 2


def test_execution_settings_may_change_on_resume(run):
    parsed, options = parse_train_args(
        ["--resume", str(run), "--torch-threads", "2", "--parallel-update", "false"]
        + ["--env.adapter_workers", "2", "--keep-checkpoints", "5"]
    )
    assert parsed.torch_threads == 2 and parsed.parallel_update is False
    assert parsed.env == {"max_cycles": 6, "goal": 2, "adapter_workers": 2}
    assert options.keep_checkpoints == 5


def test_budget_cadence_outputs_and_device_may_change_on_resume(run):
    argv = ["--resume", str(run), "--total-steps", str(5 * STEPS), "--checkpoint-every", "2"]
    argv += ["--eval-every", "4", "--plots", "true", "--gif", "false", "--baselines", "false"]
    argv += ["--progress", "false", "--device", "cpu", "--max-time", "none"]
    assert train_main(argv) == 0
    assert [r["update"] for r in rows(run)] == [1, 2, 3, 4, 5]
    assert "eval/success" in rows(run)[3]
    assert (run / "plots" / "learning_curves.png").is_file()
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["total_steps"] == 5 * STEPS and saved["checkpoint_every"] == 2
    assert saved["hidden_dim"] == 16  # everything else is the run's own


def test_resume_with_only_corrupt_checkpoints_changes_nothing(run, capsys):
    for path in (run / "checkpoints").iterdir():
        path.write_bytes(b"garbage")
    before = snapshot(run)
    assert train_main(["--resume", str(run), "--total-steps", str(5 * STEPS)]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "ckpt_3.pt" in err and "Traceback" not in err
    assert snapshot(run) == before


def test_resume_of_a_directory_that_is_not_a_run(tmp_path, capsys):
    assert train_main(["--resume", str(tmp_path)]) == 2
    assert "not a run directory" in capsys.readouterr().err


# ---------------------------------------------------------------- TensorBoard after a resume


def test_tensorboard_holds_each_update_once_after_a_resume(tmp_path):
    """A run killed after update 6 whose last checkpoint is update 3 (its TensorBoard events
    of updates 4-6 on disk) resumes from 3: the events of 4-6 are replaced, not doubled."""
    run = tmp_path / "run"
    assert train_main([*TINY, "--total-steps", str(3 * STEPS), "--run-dir", str(run)]) == 0
    saved = tmp_path / "checkpoints_at_3"
    shutil.copytree(run / "checkpoints", saved)
    assert train_main(["--resume", str(run), "--total-steps", str(6 * STEPS)]) == 0
    # the state of a run SIGKILLed after update 6 whose newest checkpoint is update 3
    shutil.rmtree(run / "checkpoints")
    shutil.copytree(saved, run / "checkpoints")
    (run / "eval.json").unlink()
    assert train_main(["--resume", str(run), "--total-steps", str(6 * STEPS)]) == 0
    metric_steps = [r["env_steps"] for r in rows(run)]
    assert metric_steps == [STEPS * u for u in range(1, 7)]
    events = read_tensorboard_events(str(run / "tb"))
    per_tag = collections.defaultdict(list)
    for step, tag, _ in events:
        per_tag[tag].append(step)
    for tag in ("env_steps", "loss/policy", "entropy"):
        assert sorted(per_tag[tag]) == metric_steps, tag
    # and the values are those of metrics.jsonl, update by update
    by_step = {r["env_steps"]: r for r in rows(run)}
    for step, tag, value in events:
        if tag == "loss/policy":
            assert value == pytest.approx(by_step[step]["loss/policy"], rel=1e-6)


def test_tensorboard_trim_drops_a_truncated_record(tmp_path):
    from marl.run.runlog import trim_tensorboard

    run = tmp_path / "run"
    assert train_main([*TINY, "--total-steps", str(2 * STEPS), "--run-dir", str(run)]) == 0
    (events_file,) = (run / "tb").iterdir()
    data = events_file.read_bytes()
    events_file.write_bytes(data[:-7])  # killed mid-write
    trim_tensorboard(str(run / "tb"), STEPS)
    steps = {s for s, tag, _ in read_tensorboard_events(str(run / "tb")) if tag == "env_steps"}
    assert steps == {STEPS}
    assert json.loads((run / "eval.json").read_text())["n_episodes"] == 2


def test_training_logs_without_tensorboard_installed(tmp_path, monkeypatch, capsys):
    """TensorBoard is an optional extra: without it a run still writes metrics.jsonl."""
    import sys

    from marl.run.runlog import RunLogger

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard.writer", None)  # import fails
    logger = RunLogger(str(tmp_path), enabled=True)
    logger.log({"update": 1, "env_steps": 10, "loss/policy": 0.5})
    logger.close()
    assert (tmp_path / "metrics.jsonl").read_text().count("loss/policy") == 1
    assert not (tmp_path / "tb").exists()
    assert "coopsearch[tensorboard]" in capsys.readouterr().err
