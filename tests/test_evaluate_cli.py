"""python -m marl.evaluate RUN_DIR: --seeds / --episodes / --checkpoint / --gif / --device,
where the results go (a new eval_<checkpoint>_<time>.json, --out, --update-run; eval.json
untouched otherwise), the checkpoint fallback, and the finish marker that marl.compare reads
instead of eval.json.

One tiny multisearch run (3 updates of 4 envs x 16 steps = 64 env steps, a checkpoint after
each) is trained once; the references are that run's own eval.json (written by the trainer on
eval_seed..eval_seed+1 with its eval_repeats) and evaluations of a policy loaded with
marl.load_policy."""

from __future__ import annotations

import datetime
import json
import re
import shutil
from pathlib import Path

import imageio.v2 as imageio
import pytest
import torch

import marl
from marl.experiments import compare
from marl.run.evaluate import evaluate_policy, parse_seeds
from marl.run.evaluate import main as eval_main
from marl.run.train import FINISHED_MARKER
from marl.run.train import main as train_main

TINY = [
    "--num-envs", "4", "--rollout-steps", "16", "--hidden-dim", "16",
    "--critic-hidden-dim", "16", "--epochs", "1", "--num-minibatches", "1",
    "--eval-episodes", "2", "--eval-repeats", "2", "--eval-every", "0",
    "--checkpoint-every", "1", "--total-steps", "192", "--progress", "false",
    "--baselines", "false", "--plots", "false", "--gif", "false",
    "--env.grid_size", "8", "--env.max_cycles", "20", "--env.n_targets", "1",
]  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run = tmp_path_factory.mktemp("eval_cli") / "run"
    assert train_main([*TINY, "--run-dir", str(run)]) == 0
    return run


@pytest.fixture
def run(trained, tmp_path):
    """A copy of the trained run that a test may change."""
    copy = tmp_path / "run"
    shutil.copytree(trained, copy)
    return copy


def _eval_json(run) -> dict:
    return json.loads((run / "eval.json").read_text())


#: what marl.evaluate records beside the figures: the checkpoint evaluated and the repeats
RECORD_KEYS = ("checkpoint", "update", "env_steps", "repeats")


def _evaluate(run, tmp_path, *args) -> dict:
    """marl.evaluate RUN ARGS --out FILE: (the figures, the record of what was evaluated)."""
    out = tmp_path / "evaluation.json"
    assert eval_main([str(run), *args, "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    figures = {k: v for k, v in written.items() if k not in RECORD_KEYS}
    return figures, {k: written[k] for k in RECORD_KEYS}


def _reference(run, seeds, checkpoint=None) -> dict:
    """The evaluation of a checkpoint, with the policy loaded through marl.load_policy."""
    trained = marl.load_policy(str(run), checkpoint=checkpoint)
    cfg = trained.config
    return evaluate_policy(trained.policy, cfg.env_fn, cfg.env, seeds, repeats=cfg.eval_repeats)


def test_parse_seeds() -> None:
    assert parse_seeds("100,101") == [100, 101]
    assert parse_seeds("100-103") == [100, 101, 102, 103]
    assert parse_seeds("0-2, 7") == [0, 1, 2, 7]
    for bad, message in (
        ("5-3", "empty range"),
        ("a", "invalid item"),
        ("1,,2", "invalid item"),
        ("1,1", "given twice"),
        ("4294967296", "larger than"),
    ):
        with pytest.raises(ValueError, match=message):
            parse_seeds(bad)


def test_seed_range_reproduces_the_trainers_evaluation(run, tmp_path, capsys) -> None:
    finished = _eval_json(run)  # the trainer's: seeds 10000, 10001, eval_repeats 2
    assert finished["n_episodes"] == 2 and finished["seeds"] == [10000, 10001]
    figures, record = _evaluate(run, tmp_path, "--seeds", "10000-10001")
    assert figures == finished
    # the newest checkpoint: 3 updates of 64 env steps; 2 episodes per seed
    assert record == {
        "checkpoint": "checkpoints/ckpt_3.pt",
        "update": 3,
        "env_steps": 192,
        "repeats": 2,
    }
    figures, _ = _evaluate(run, tmp_path, "--episodes", "1")
    assert figures["seeds"] == [10000] and figures["n_episodes"] == 1
    figures, _ = _evaluate(run, tmp_path, "--seeds", "3,5")
    assert figures == _reference(run, [3, 5])
    assert _eval_json(run) == finished  # never touched without --update-run
    err = capsys.readouterr().err
    assert "checkpoints/ckpt_3.pt" in err and "x 2 episodes" in err


def test_results_go_to_a_new_file_and_eval_json_is_left_alone(run, capsys) -> None:
    before = (run / "eval.json").read_bytes()
    capsys.readouterr()
    start = datetime.datetime.now().replace(microsecond=0)
    assert eval_main([str(run), "--seeds", "3"]) == 0
    assert eval_main([str(run), "--seeds", "4"]) == 0
    end = datetime.datetime.now()
    assert (run / "eval.json").read_bytes() == before
    out = capsys.readouterr().out
    written = re.findall(r"\[marl\.evaluate\] wrote (\S+)", out)
    assert len(written) == 2 and written[0] != written[1]  # two evaluations, two files
    for path, seed in zip(written, (3, 4), strict=True):
        # RUN/eval_<checkpoint stem>_<YYYYmmdd-HHMMSS>[_k].json, the time of the evaluation
        m = re.fullmatch(re.escape(str(run)) + r"/eval_ckpt_3_(\d{8}-\d{6})(_2)?\.json", path)
        assert m is not None, path
        when = datetime.datetime.strptime(m.group(1), "%Y%m%d-%H%M%S")
        assert start <= when <= end
        result = json.loads(Path(path).read_text())
        assert result["seeds"] == [seed] and result["checkpoint"] == "checkpoints/ckpt_3.pt"


def test_update_run_replaces_eval_json_with_the_same_record(run, tmp_path, capsys) -> None:
    out = tmp_path / "sub" / "e.json"  # --out makes the folder
    capsys.readouterr()
    assert eval_main([str(run), "--seeds", "3,5", "--out", str(out), "--update-run"]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out}" in printed and f"wrote {run / 'eval.json'}" in printed
    updated = _eval_json(run)
    assert updated == json.loads(out.read_text())
    assert updated["seeds"] == [3, 5] and updated["checkpoint"] == "checkpoints/ckpt_3.pt"
    assert {k: v for k, v in updated.items() if k not in RECORD_KEYS} == _reference(run, [3, 5])


def test_checkpoint_option_and_fallback(run, tmp_path, capsys) -> None:
    older = run / "checkpoints" / "ckpt_2.pt"
    figures, record = _evaluate(run, tmp_path, "--checkpoint", "ckpt_2.pt", "--seeds", "7")
    assert figures == _reference(run, [7], checkpoint=str(older))
    assert (record["checkpoint"], record["update"], record["env_steps"]) == (
        "checkpoints/ckpt_2.pt",
        2,
        128,
    )
    err = capsys.readouterr().err
    assert "checkpoints/ckpt_2.pt (update 2" in err and "weights policy/weights_2.pt" in err
    # the pickled resume checkpoints are not what is read: a truncated one changes nothing
    newest = run / "checkpoints" / "ckpt_3.pt"
    newest.write_bytes(newest.read_bytes()[:100])
    figures, record = _evaluate(run, tmp_path, "--seeds", "7")
    assert record["checkpoint"] == "checkpoints/ckpt_3.pt" and figures == _reference(run, [7])
    # truncated newest policy weights: reported, and the next older ones are evaluated
    for name in ("weights.pt", "weights_3.pt"):
        path = run / "policy" / name
        path.write_bytes(path.read_bytes()[:100])
    figures, record = _evaluate(run, tmp_path, "--seeds", "7")
    err = capsys.readouterr().err
    assert "policy/weights.pt" in err and "policy/weights_3.pt" in err
    assert "could not be loaded" in err
    assert figures == _reference(run, [7], checkpoint=str(older))
    assert record["checkpoint"] == "checkpoints/ckpt_2.pt"
    # the checkpoint asked for is not replaced by another one
    assert eval_main([str(run), "--checkpoint", str(newest)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --checkpoint") and "weights_3.pt" in err


def test_gif_and_device(run, tmp_path) -> None:
    gif = tmp_path / "out" / "episode.gif"
    assert eval_main([str(run), "--seeds", "11", "--gif", str(gif), "--device", "auto"]) == 0
    frames = imageio.mimread(gif)
    assert len(frames) >= 2 and frames[0].ndim == 3
    assert len(frames) <= 21  # max_cycles 20: the first frame and one per step at most


@pytest.mark.parametrize(
    "args, message",
    [
        (["--seeds", "9-8"], "empty range"),
        (["--episodes", "0"], "--episodes must be >= 1"),
        (["--checkpoint", "nope.pt"], "no such file"),
    ],
)
def test_bad_input_is_an_error_line(trained, capsys, args, message) -> None:
    assert eval_main([str(trained), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and message in err


def test_cuda_refused_without_cuda(trained, capsys) -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    assert eval_main([str(trained), "--device", "cuda"]) == 2
    assert "CUDA is not available" in capsys.readouterr().err


def test_episodes_and_seeds_exclude_each_other(trained) -> None:
    with pytest.raises(SystemExit) as exc:
        eval_main([str(trained), "--episodes", "2", "--seeds", "1,2"])
    assert exc.value.code == 2


# ------------------------------------------------------------------------------------------
# the finish marker
# ------------------------------------------------------------------------------------------
def test_finish_marker_not_eval_json_marks_a_finished_run(trained, run) -> None:
    marker = json.loads((trained / FINISHED_MARKER).read_text())
    assert marker["update"] == 3 and marker["env_steps"] == 192
    assert marker["checkpoint"] == "checkpoints/ckpt_3.pt"
    spec = compare.RunSpec("v", 0, str(run), str(run / "log"), [])
    assert compare.run_state(spec) == "finished"
    # an interrupted run (checkpoints, no marker, no eval.json) that marl.evaluate evaluated:
    # by default it writes no eval.json; with --update-run it does, and no marker either way
    (run / FINISHED_MARKER).unlink()
    (run / "eval.json").unlink()
    assert eval_main([str(run), "--episodes", "1"]) == 0
    assert not (run / "eval.json").exists() and not (run / FINISHED_MARKER).exists()
    assert compare.run_state(spec) == "resumable"
    assert eval_main([str(run), "--episodes", "1", "--update-run"]) == 0
    assert (run / "eval.json").is_file() and not (run / FINISHED_MARKER).exists()
    assert compare.run_state(spec) == "resumable"
    assert compare.run_state(spec, {"v/seed_0": {"state": "interrupted"}}) == "resumable"
    # a run finished before the marker existed: eval.json, and a compare saw it finish
    assert compare.run_state(spec, {"v/seed_0": {"state": "finished"}}) == "finished"


def test_resume_rewrites_the_marker(run) -> None:
    assert train_main(["--resume", str(run), "--total-steps", "256", "--progress", "false"]) == 0
    marker = json.loads((run / FINISHED_MARKER).read_text())
    assert (marker["update"], marker["env_steps"]) == (4, 256)
