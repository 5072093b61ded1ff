"""Train CLI, config parsing, run artifacts and reliability (resume, SIGINT, SIGKILL, NaN)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml

from marl.run.checkpoint import latest_path, load_checkpoint
from marl.run.config import ConfigError, TrainConfig, parse_cli
from marl.run.runlog import TIMING_KEYS, read_metrics
from marl.run.train import main as train_main

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
FAKE = "test_train_fakeenv:vector_env"
TINY = [
    "--env-fn",
    FAKE,
    "--num-envs",
    "8",
    "--rollout-steps",
    "16",
    "--hidden-dim",
    "16",
    "--critic-hidden-dim",
    "16",
    "--eval-episodes",
    "4",
    "--progress",
    "false",
    "--baselines",
    "false",
    "--env.max_cycles",
    "6",
    "--env.goal",
    "2",
]
TIME_KEYS = TIMING_KEYS


# ---------------------------------------------------------------- config / CLI


def test_parse_cli_defaults_and_overrides(tmp_path):
    cfg = parse_cli([])
    assert isinstance(cfg, TrainConfig)
    assert cfg.algo == "mappo" and cfg.whitening == "team_individual" and cfg.value_norm
    cfg = parse_cli(
        [
            "--lr",
            "1e-3",
            "--num_envs",
            "8",
            "--value-clip",
            "none",
            "--dual-clip",
            "3",
            "--env.grid_size",
            "8",
            "--env.minimap=false",
        ]
    )
    assert cfg.lr == 1e-3 and cfg.num_envs == 8 and cfg.value_clip is None
    assert cfg.dual_clip == 3.0 and cfg.env == {"grid_size": 8, "minimap": False}


def test_yaml_config_sets_fields_and_env(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"seed": 7, "whitening": "type", "env": {"grid_size": 10}}))
    cfg = parse_cli(["--config", str(path), "--env.n_targets", "2"])
    assert cfg.seed == 7 and cfg.whitening == "type"
    assert cfg.env == {"grid_size": 10, "n_targets": 2}
    path.write_text("bogus_key: 1\n")
    with pytest.raises(ConfigError, match="bogus_key"):
        parse_cli(["--config", str(path)])


def test_recipes_and_explicit_flags_win():
    cal = parse_cli(["--recipe", "calibrated"])
    assert (
        cal.value_clip,
        cal.resolved_value_epochs,
        cal.whitening,
        cal.adv_clip,
        cal.ent_coef,
        cal.optimism_offset,
    ) == (0.1, 4, "batch", 5.0, 0.01, 0.5)
    base = parse_cli(["--recipe", "baseline"])
    assert base.whitening == "batch" and base.adv_clip is None and not base.value_norm
    assert base.optimism_offset is None and base.value_clip is None
    mixed = parse_cli(["--recipe", "calibrated", "--value-clip", "0.3", "--whitening", "type"])
    assert mixed.value_clip == 0.3 and mixed.whitening == "type" and mixed.adv_clip == 5.0


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--whitening", "bogus"], r"--whitening.*allowed: none, batch"),
        (["--backbone", "lstm"], r"--backbone.*mlp, gru, mamba, mamba2"),
        (["--clip-low", "1.5"], r"--clip-low.*\(0, 1\)"),
        (["--num-envs", "0"], r"--num-envs.*>= 1"),
        (["--num-envs", "abc"], r"--num-envs.*expected int"),
        (["--no-such-flag", "1"], r"--no-such-flag"),
        (["--alpha", "2"], r"--alpha.*\[0, 1\]"),
        (["--backbone", "gru", "--seq-len", "7"], r"--seq-len.*divisor"),
        (["--value-norm", "maybe"], r"--value-norm.*true/false"),
        (["--algo", "dqn"], r"--algo.*mappo, grpo"),
        (["--max-cpu-time", "0"], r"--max-cpu-time.*> 0"),
        (["--max-time", "nan"], r"--max-time.*> 0"),
    ],
)
def test_invalid_options_raise_config_error(argv, match):
    with pytest.raises(ConfigError, match=match):
        parse_cli(argv)


@pytest.mark.parametrize(
    "argv, option",
    [
        (["--whitening", "batch", "--alpha", "0.25"], "--alpha"),
        (["--recipe", "calibrated", "--alpha", "0.5"], "--alpha"),
        (["--whitening", "type", "--whiten-inner", "position"], "--whiten-inner"),
        (["--whitening", "batch", "--chunk-size", "16"], "--chunk-size"),
        (["--whitening", "team_individual", "--chunk-size", "16"], "--chunk-size"),
        (["--whitening", "running", "--running-momentum", "0.9"], "--running-momentum"),
        (["--penalty-beta", "0.3"], "--penalty-beta"),
        (["--penalty-beta-schedule=constant", "--penalty-beta-floor=0.2"], "--penalty-beta-floor"),
        (["--recipe", "baseline", "--value-norm-beta", "0.999"], "--value-norm-beta"),
    ],
)
def test_inapplicable_option_raises_config_error(argv, option):
    """No option is silently ignored: the error names the option and when it applies."""
    with pytest.raises(ConfigError, match=rf"^{option}: has no effect with .*applies only with"):
        parse_cli(argv)


def test_inapplicable_option_from_yaml_raises(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"whitening": "batch", "running_momentum": 0.9}))
    with pytest.raises(ConfigError, match="--running-momentum"):
        parse_cli(["--config", str(path)])
    # a resolved config.yaml lists every field at its value: defaults are not "set"
    path.write_text(yaml.safe_dump({"whitening": "batch", "alpha": 0.5, "chunk_size": 64}))
    assert parse_cli(["--config", str(path)]).whitening == "batch"


@pytest.mark.parametrize(
    "argv",
    [
        ["--recipe", "calibrated"],
        ["--recipe", "baseline"],
        ["--recipe", "calibrated", "--whitening", "team_individual", "--alpha", "0.25"],
        ["--recipe", "baseline", "--whitening", "team_individual", "--alpha", "0.25"],
        [
            "--whitening",
            "team_individual",
            "--alpha",
            "0.25",
            "--whiten-inner",
            "chunk",
            "--chunk-size",
            "16",
        ],
        ["--whitening", "running_ema", "--running-momentum", "0.9", "--whiten-inner", "type"],
        ["--whitening", "chunk", "--chunk-size", "16"],
        ["--algo", "grpo", "--whitening", "batch", "--alpha", "0.25", "--whiten-inner", "batch"],
        ["--penalty-beta-schedule", "linear", "--penalty-beta", "0.3", "--penalty-beta-floor", "0"],
    ],
)
def test_applicable_options_and_recipes_parse(argv):
    parse_cli(argv)


def test_help_lists_every_field(capsys):
    with pytest.raises(SystemExit):
        parse_cli(["--help"])
    out = capsys.readouterr().out
    for name in (
        "--total-steps",
        "--whitening",
        "--value-ensemble",
        "--group-size",
        "--penalty-beta-schedule",
        "--kl-beta",
        "--optimism-offset",
        "--burn-in",
    ):
        assert name in out


def test_invalid_config_fails_before_any_work(tmp_path, capsys):
    run = tmp_path / "run"
    assert train_main(["--whitening", "nope", "--run-dir", str(run)]) == 2
    assert "--whitening" in capsys.readouterr().err
    assert not run.exists()


def test_malloc_tuning_is_applied_by_the_process_settings_unless_turned_off(monkeypatch):
    import marl.run.train as run_train

    calls = []
    monkeypatch.setattr(run_train, "set_malloc_thresholds", lambda: calls.append(1) or True)
    monkeypatch.setattr(run_train, "_set_threading_layer", lambda name: None)
    run_train.configure_process(parse_cli([]))
    assert calls == [1] and parse_cli([]).malloc_tuning is True
    run_train.configure_process(parse_cli(["--malloc-tuning", "false"]))
    assert calls == [1]


def test_auto_threading_layer_is_the_default_and_keeps_a_running_layer(monkeypatch, capsys):
    import marl.run.train as run_train

    chosen = []
    monkeypatch.setattr(run_train, "set_numba_threading_layer", chosen.append)
    monkeypatch.setattr(run_train, "auto_threading_layer", lambda: "omp")
    monkeypatch.setattr(run_train, "numba_available", lambda: True)
    no_malloc = ["--malloc-tuning", "false"]
    assert parse_cli([]).numba_threading_layer == "auto"
    monkeypatch.setattr(run_train, "numba_threading_layer", lambda: None)  # pool not started
    run_train.configure_process(parse_cli(no_malloc))
    assert chosen == ["omp"]
    run_train.configure_process(parse_cli([*no_malloc, "--numba-threading-layer", "workqueue"]))
    assert chosen == ["omp", "workqueue"]
    # a layer already running (a second run in one process): 'auto' keeps it, silently
    monkeypatch.setattr(run_train, "numba_threading_layer", lambda: "workqueue")
    run_train.configure_process(parse_cli(no_malloc))
    assert chosen == ["omp", "workqueue"] and "warning" not in capsys.readouterr().err
    with pytest.raises(ConfigError, match="allowed: auto, workqueue, omp, tbb, default"):
        parse_cli(["--numba-threading-layer", "openmp"])


# ---------------------------------------------------------------- end to end


def _run(run_dir, *extra):
    return train_main([*TINY, "--run-dir", str(run_dir), *extra])


@pytest.mark.slow
def test_end_to_end_artifacts_on_a_second_env(tmp_path):
    run = tmp_path / "run"
    assert _run(run, "--total-steps", "640", "--eval-every", "2", "--checkpoint-every", "2") == 0
    for name in (
        "config.yaml",
        "metrics.jsonl",
        "eval.json",
        "episode.gif",
        "checkpoints/latest.pt",
        "plots/learning_curves.png",
        "plots/advantages.png",
    ):
        assert (run / name).exists(), name
    assert any(f.startswith("events") for f in os.listdir(run / "tb"))
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["env"] == {"max_cycles": 6, "goal": 2} and cfg["num_envs"] == 8
    rows = read_metrics(str(run / "metrics.jsonl"))
    assert [r["update"] for r in rows] == [1, 2, 3, 4, 5]
    assert rows[-1]["env_steps"] == 640
    # TensorBoard holds the same scalars, one point per update at its env-step count
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tb"))
    acc.Reload()
    points = acc.Scalars("loss/value")
    assert [p.step for p in points] == [r["env_steps"] for r in rows]
    assert [p.value for p in points] == pytest.approx([r["loss/value"] for r in rows], rel=1e-6)
    need = {
        "update",
        "env_steps",
        "time_s",
        "sps",
        "agent_sps",
        "episode/return",
        "episode/return_team",
        "episode/return_individual",
        "episode/return_penalty",
        "episode/success",
        "episode/solved",
        "episode/episode_length",
        "adv_raw/mean",
        "adv/std",
        "adv/pos_frac",
        "adv/neg_mean",
        "adv_raw/caller/mean",
        "adv/picker/std",
        "adv_clip_frac",
        "loss/policy",
        "loss/value",
        "loss/entropy",
        "entropy",
        "explained_variance",
        "clip_frac_low",
        "clip_frac_high",
        "approx_kl",
        "grad_norm",
        "lr",
    }
    assert need <= set(rows[-1]), need - set(rows[-1])
    assert "eval/success_rate" in rows[1] and "eval/success_rate" not in rows[0]
    assert rows[1]["eval/success"] == rows[1]["eval/success_rate"]
    ev = json.loads((run / "eval.json").read_text())
    for k in (
        "success_rate",
        "solved_rate",
        "mean_return",
        "coverage",
        "episode_length",
        "n_episodes",
        "seeds",
    ):
        assert k in ev
    assert ev["n_episodes"] == 4 and ev["seeds"] == [10000, 10001, 10002, 10003]
    assert ev["coverage"] is None  # the signal game reports no coverage


def test_evaluate_cli_reproduces_eval_json_in_its_own_file(tmp_path, capsys):
    from marl.run.evaluate import main as eval_main

    run = tmp_path / "run"
    assert _run(run, "--total-steps", "128", "--plots", "false", "--gif", "false") == 0
    before = (run / "eval.json").read_bytes()
    sys.path.insert(0, TESTS)
    out = tmp_path / "again.json"
    assert eval_main([str(run), "--out", str(out)]) == 0
    assert (run / "eval.json").read_bytes() == before  # the run's own file is left alone
    again = json.loads(out.read_text())
    # 128 env steps of 8 envs x 16 steps: one update, its checkpoint evaluated with the
    # default eval_repeats (2 episodes per seed)
    assert again.pop("checkpoint") == "checkpoints/ckpt_1.pt"
    assert (again.pop("update"), again.pop("env_steps"), again.pop("repeats")) == (1, 128, 2)
    assert again == json.loads(before)
    assert "success_rate" in capsys.readouterr().out


def test_cpu_time_budget_counts_the_process_cpu_seconds_across_a_resume(tmp_path):
    """--max-cpu-time stops at the first update boundary past the budget; the count is the
    process's CPU time (bounded by time.process_time around the call) and carries over a
    resume."""
    run = tmp_path / "run"
    flags = ["--gif", "false", "--plots", "false", "--eval-every", "0"]
    t0 = time.process_time()
    assert _run(run, "--max-cpu-time", "1.0", *flags) == 0
    used = time.process_time() - t0
    first = json.loads((run / "finished.json").read_text())
    rows = read_metrics(str(run / "metrics.jsonl"))
    assert len(rows) >= 2
    cpu = [r["cpu_s"] for r in rows]
    assert cpu == sorted(cpu) and all(c < 1.0 for c in cpu[:-1])  # no update began past it
    assert 1.0 <= first["cpu_s"] <= used
    assert train_main(["--resume", str(run), "--max-cpu-time", "2.0"]) == 0
    rows2 = read_metrics(str(run / "metrics.jsonl"))
    new = [r["cpu_s"] for r in rows2[len(rows) :]]
    assert new and new[0] > first["cpu_s"]  # counted on from the first invocation's seconds
    assert all(c < 2.0 for c in new[:-1])
    assert json.loads((run / "finished.json").read_text())["cpu_s"] >= 2.0


@pytest.mark.parametrize("share", ["none", "all"])
def test_resumed_run_equals_uninterrupted_run(tmp_path, share):
    common = [
        "--share-actor",
        share,
        "--checkpoint-every",
        "1",
        "--plots",
        "false",
        "--gif",
        "false",
        "--seed",
        "3",
        "--eval-every",
        "2",
    ]
    full, part = tmp_path / "full", tmp_path / "part"
    assert _run(full, "--total-steps", "768", *common) == 0
    assert _run(part, "--total-steps", "384", *common) == 0
    assert train_main(["--resume", str(part), "--total-steps", "768"]) == 0
    a = read_metrics(str(full / "metrics.jsonl"))
    b = read_metrics(str(part / "metrics.jsonl"))
    assert [r["update"] for r in b] == list(range(1, 7))
    for ra, rb in zip(a, b, strict=True):
        for key in set(ra) - TIME_KEYS:
            assert ra[key] == pytest.approx(rb[key], rel=1e-6, abs=1e-9), key
    pa = load_checkpoint(latest_path(str(full)))["algo"]["policy"]
    pb = load_checkpoint(latest_path(str(part)))["algo"]["policy"]
    for k in pa:
        torch.testing.assert_close(pa[k], pb[k])


def test_nan_stops_with_named_quantity_and_keeps_checkpoint(tmp_path, capsys):
    run = tmp_path / "run"
    # 16 env-steps per rollout -> the NaN arrives in update 3 (call 40)
    code = _run(run, "--total-steps", "2000", "--checkpoint-every", "1", "--env.nan_at_call", "40")
    assert code == 1
    err = capsys.readouterr().err
    assert "non-finite" in err and "rewards" in err
    ckpt = load_checkpoint(latest_path(str(run)))
    assert ckpt["update"] == 2
    assert not (run / "eval.json").exists()


def _spawn(run_dir, *extra):
    env = {**os.environ, "PYTHONPATH": TESTS + os.pathsep + ROOT, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "marl.train",
            *TINY,
            "--run-dir",
            str(run_dir),
            "--checkpoint-every",
            "1",
            "--plots",
            "false",
            "--gif",
            "false",
            *extra,
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(path, proc, timeout=120.0):
    t0 = time.time()
    while not os.path.exists(path):
        if proc.poll() is not None:
            raise AssertionError(f"process ended early: {proc.communicate()}")
        if time.time() - t0 > timeout:
            proc.kill()
            raise AssertionError("timed out waiting for a checkpoint")
        time.sleep(0.2)


@pytest.mark.slow
def test_sigint_checkpoints_and_exits_cleanly_then_resume(tmp_path):
    run = tmp_path / "run"
    proc = _spawn(run, "--max-time", "600")
    _wait_for(latest_path(str(run)), proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err  # EXIT_INTERRUPTED: checkpoint written, resumable
    assert "interrupted" in err and "Traceback" not in err
    assert not (run / "eval.json").exists()
    ckpt = load_checkpoint(latest_path(str(run)))
    rows = read_metrics(str(run / "metrics.jsonl"))
    assert rows[-1]["update"] == ckpt["update"]
    total = ckpt["env_steps"] + 256
    assert (
        train_main(["--resume", str(run), "--total-steps", str(total), "--max-time", "none"]) == 0
    )
    assert (run / "eval.json").exists()


@pytest.mark.slow
def test_sigkill_resumes_from_last_checkpoint(tmp_path):
    run = tmp_path / "run"
    proc = _spawn(run, "--total-steps", "100000")
    _wait_for(latest_path(str(run)), proc)
    time.sleep(1.0)
    proc.kill()
    proc.wait(timeout=30)
    ckpt = load_checkpoint(latest_path(str(run)))
    done = ckpt["update"]
    assert train_main(["--resume", str(run), "--total-steps", str(ckpt["env_steps"] + 256)]) == 0
    rows = read_metrics(str(run / "metrics.jsonl"))
    assert [r["update"] for r in rows] == list(range(1, done + 3))
    assert (run / "eval.json").exists()


# ---------------------------------------------------------------- learning (CI)

TINY_SEARCH = [
    "--env.grid_size",
    "8",
    "--env.n_scouts",
    "1",
    "--env.n_rescuers",
    "1",
    "--env.n_targets",
    "2",
    "--env.max_cycles",
    "60",
]


@pytest.mark.slow
def test_mappo_learns_tiny_search_where_random_fails(tmp_path):
    """Default MAPPO on an 8x8 multisearch with 2 targets and 60 steps: the random policy
    collects ~10% of the targets and solves no episode; ~45k env steps of training (about a
    minute on a shared 2-core CPU) must collect >= 80%."""
    from envs.baselines import evaluate_baseline

    run = tmp_path / "run"
    code = train_main(
        [
            "--total-steps",
            "45056",
            "--seed",
            "0",
            "--run-dir",
            str(run),
            "--eval-every",
            "0",
            "--progress",
            "false",
            "--plots",
            "false",
            "--gif",
            "false",
            "--baselines",
            "false",
            *TINY_SEARCH,
        ]
    )
    assert code == 0
    ev = json.loads((run / "eval.json").read_text())
    env_kw = {"grid_size": 8, "n_scouts": 1, "n_rescuers": 1, "n_targets": 2, "max_cycles": 60}
    rand = evaluate_baseline("random", seeds=ev["seeds"], **env_kw)
    assert rand["success_rate"] < 0.2 and rand["solved_rate"] < 0.1
    assert ev["success_rate"] >= 0.8, ev
    assert ev["solved_rate"] >= 0.6, ev


def test_bad_env_kwargs_fail_before_any_work(tmp_path, capsys):
    run = tmp_path / "run"
    assert train_main(["--env.grid_size", "-3", "--run-dir", str(run)]) == 2
    err = capsys.readouterr().err
    assert "--env" in err and "grid_size" in err
    assert not run.exists()


def test_algorithm_defaults_and_runs_written_before_the_activation_field(tmp_path):
    from marl.run.config import config_to_dict, load_run_config

    mappo, grpo = parse_cli([]), parse_cli(["--algo", "grpo"])
    assert (mappo.num_envs, mappo.activation) == (64, "relu")
    assert (grpo.num_envs, grpo.activation) == (32, "tanh")
    assert parse_cli(["--num-envs", "16", "--activation", "tanh"]).activation == "tanh"
    assert TrainConfig().num_envs == 64 and TrainConfig(algo="grpo").num_envs == 32
    # a run directory whose config.yaml predates the field was trained with tanh: resuming or
    # re-evaluating it must rebuild tanh networks, not today's default
    old = config_to_dict(parse_cli(["--num-envs", "8"]))
    del old["activation"]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(old))
    assert load_run_config(str(tmp_path))["activation"] == "tanh"
    assert parse_cli(["--resume", str(tmp_path)]).activation == "tanh"
    # the networks' activation cannot change on resume (issue 19): refused, naming the field
    with pytest.raises(ConfigError, match=r"--activation 'tanh' -> 'relu'"):
        parse_cli(["--resume", str(tmp_path), "--activation", "relu"])
