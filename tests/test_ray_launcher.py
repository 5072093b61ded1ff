"""``marl.compare --launcher ray``: a 2 variants x 2 seeds study of the real trainer on a local
Ray cluster gives the same results as the local pool (eval.json, metrics.jsonl, summary.json),
with the same bookkeeping (status.json, the finish marker) and resumption; an interrupted Ray
compare has each run write a checkpoint; the install hint when ray is missing; the Ray options
refused with the local pool.

The Ray study is skipped (saying why) where ray is not installed or cannot start a local
cluster."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from marl.experiments import compare
from marl.run.runlog import TIMING_KEYS, read_metrics
from marl.run.train import FINISHED_MARKER

TESTS = Path(__file__).resolve().parent
CONFIG = {
    "env_fn": "test_train_fakeenv:vector_env",
    "env": {"max_cycles": 6, "goal": 2},
    "num_envs": 8,
    "rollout_steps": 16,
    "hidden_dim": 16,
    "critic_hidden_dim": 16,
    "eval_episodes": 2,
    "eval_repeats": 1,
    "eval_every": 0,
    "checkpoint_every": 1,
    "plots": False,
}
RUNS = [(v, s) for v in ("batch", "ti") for s in (0, 1)]


def _argv(cfg: Path, out: Path, *extra: str) -> list[str]:
    argv = ["--algo", "mappo", "--config", str(cfg), "--variant", "batch:--whitening=batch"]
    argv += ["--variant", "ti:--whitening=team_individual", "--seeds", "2", "--pilot"]
    argv += ["--total-steps", "256", "--torch-threads", "1", "--out", str(out)]
    return [*argv, "--bootstrap-reps", "50", "--no-progress", "--no-plots", *extra]


def _run(out: Path, variant: str, seed: int) -> Path:
    return out / "runs" / variant / f"seed_{seed}"


def _metrics(run: Path) -> list[dict]:
    """metrics.jsonl without the timing figures (wall, CPU, rates)."""
    rows = read_metrics(str(run / "metrics.jsonl"))
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in rows]


def _ray_compare(argv: list[str], capsys) -> int:
    """compare.main with --launcher ray; skips the test when no local Ray cluster starts."""
    try:
        return compare.main(argv)
    except SystemExit as exc:
        err = capsys.readouterr().err
        if "--launcher ray: cannot connect" in err:
            pytest.skip(f"Ray cannot start a local cluster here: {err.strip()}")
        raise AssertionError(err) from exc


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ray_study_matches_the_local_pool(tmp_path, monkeypatch, capsys) -> None:
    pytest.importorskip("ray", reason="ray is not installed (pip install 'coopsearch[ray]')")
    path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p)
    monkeypatch.setenv("PYTHONPATH", path)  # the runs import the fake env from tests/
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump(CONFIG))
    local, ray_out = tmp_path / "local", tmp_path / "ray"
    assert compare.main(_argv(cfg, local, "--jobs", "2")) == 0
    assert _ray_compare(_argv(cfg, ray_out, "--launcher", "ray"), capsys) == 0

    status = json.loads((ray_out / "status.json").read_text())
    for variant, seed in RUNS:
        a, b = _run(local, variant, seed), _run(ray_out, variant, seed)
        assert (b / FINISHED_MARKER).is_file()
        assert json.loads((b / "eval.json").read_text()) == json.loads(
            (a / "eval.json").read_text()
        )
        assert _metrics(b) == _metrics(a) and len(_metrics(a)) == 2
        entry = status[f"{variant}/seed_{seed}"]
        assert (entry["state"], entry["launcher"], entry["attempts"]) == ("finished", "ray", 1)
    sa, sb = (json.loads((o / "summary.json").read_text()) for o in (local, ray_out))
    for variant in ("batch", "ti"):
        va, vb = sa["variants"][variant], sb["variants"][variant]
        assert vb["n_finished"] == 2
        assert vb["metrics"]["success_rate"]["values"] == va["metrics"]["success_rate"]["values"]
    assert sb["jobs"] == min(2, compare.cpu_count())  # the local cluster's CPUs // 1
    assert (ray_out / "report.md").is_file()

    # an interrupted run (checkpoints, no marker; eval.json as marl.evaluate leaves it) is
    # resumed through Ray; the finished ones are not rerun
    interrupted = _run(ray_out, "ti", 1)
    (interrupted / FINISHED_MARKER).unlink()
    status["ti/seed_1"]["state"] = "interrupted"
    (ray_out / "status.json").write_text(json.dumps(status))
    assert _ray_compare(_argv(cfg, ray_out, "--launcher", "ray"), capsys) == 0
    status = json.loads((ray_out / "status.json").read_text())
    assert status["ti/seed_1"]["mode"] == "resume" and status["ti/seed_1"]["attempts"] == 2
    assert [status[f"{v}/seed_{s}"]["attempts"] for v, s in RUNS] == [1, 1, 1, 2]
    assert (interrupted / FINISHED_MARKER).is_file()
    assert json.loads((interrupted / "eval.json").read_text()) == json.loads(
        (_run(local, "ti", 1) / "eval.json").read_text()
    )


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_interrupted_ray_compare_checkpoints_its_runs(tmp_path) -> None:
    pytest.importorskip("ray", reason="ray is not installed (pip install 'coopsearch[ray]')")
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump({**CONFIG, "checkpoint_every": 5}))
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "marl.compare", "--config", str(cfg), "--variant", "a:"]
    argv += ["--seeds", "2", "--pilot", "--total-steps", "100000000", "--out", str(out)]
    argv += ["--launcher", "ray", "--no-progress", "--no-plots"]
    path = os.pathsep.join(
        p for p in (str(TESTS), str(TESTS.parent), os.environ.get("PYTHONPATH")) if p
    )
    env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1")
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    ckpts = [_run(out, "a", s) / "checkpoints" / "latest.pt" for s in (0, 1)]
    deadline = time.monotonic() + 300
    while not all(c.exists() for c in ckpts):
        if proc.poll() is not None:
            err = proc.stderr.read()
            if "--launcher ray: cannot connect" in err:
                pytest.skip(f"Ray cannot start a local cluster here: {err.strip()}")
            raise AssertionError(err)
        assert time.monotonic() < deadline, "the runs never wrote a checkpoint"
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)  # Ctrl-C: each task SIGTERMs its run, which checkpoints
    assert proc.wait(timeout=120) == 130, proc.stderr.read()
    status = json.loads((out / "status.json").read_text())
    for seed in (0, 1):
        assert status[f"a/seed_{seed}"]["state"] == "interrupted"
        log = (out / "logs" / "a" / f"seed_{seed}.log").read_text()
        assert "SIGTERM received" in log and "checkpoint" in log.split("SIGTERM received")[1]
        spec = compare.RunSpec("a", seed, str(_run(out, "a", seed)), "", [])
        assert compare.run_state(spec, status) == "resumable"


def test_missing_ray_is_an_install_hint(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails
    out = tmp_path / "out"
    argv = ["--variant", "a:", "--seeds", "1", "--pilot", "--total-steps", "64", "--out", str(out)]
    with pytest.raises(SystemExit) as exc:
        compare.main([*argv, "--launcher", "ray"])
    assert exc.value.code == 2
    assert "pip install 'coopsearch[ray]'" in capsys.readouterr().err
    assert not out.exists()  # refused before anything was written


@pytest.mark.parametrize("option", [["--address", "auto"], ["--cpus-per-run", "2"]])
def test_ray_options_need_the_ray_launcher(tmp_path, capsys, option) -> None:
    argv = ["--variant", "a:", "--seeds", "1", "--pilot", "--total-steps", "64"]
    with pytest.raises(SystemExit) as exc:
        compare.main([*argv, "--out", str(tmp_path / "o"), *option])
    assert exc.value.code == 2
    assert "apply to --launcher ray only" in capsys.readouterr().err
