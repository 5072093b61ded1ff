"""Rough edges of ``python -m marl.train`` a new user hits (issue 39, item 4):

- config.yaml records the budget the run trained for, the demo's default included, and runs
  whose config.yaml holds the old nulls still resume as they did;
- ``--resume`` of a finished run without a larger budget says so in one line, exits 0 and
  leaves every file byte for byte as it was;
- the GIF of an env that draws with SDL (Gymnasium's CartPole, through pygame) is drawn
  without a display and without an ``error:`` line;
- numba's compilation of a kernel is announced once per kernel family and process, only when
  the kernel is compiled (not when numba loads it from its cache), and a time budget does not
  count it.

Expectations are worked by hand: a run of 3 updates of 4 envs x 16 steps has 64, 128, 192 env
steps; a compilation of 2.5 s inside an update is 2.5 s the budget does not count."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import types

import pytest
import yaml

import marl.run.train as train_module
from marl.algos.mappo import MAPPO
from marl.run.compile_clock import CompileClock, compile_clock
from marl.run.config import parse_cli
from marl.run.plots import headless_rendering
from marl.run.runlog import read_metrics
from marl.run.train import main as train_main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: a small multisearch (4 envs x 16 steps = 64 env steps per update); the budget is the test's
SMALL = [
    "--num-envs", "4", "--rollout-steps", "16", "--hidden-dim", "16",
    "--critic-hidden-dim", "16", "--epochs", "1", "--num-minibatches", "1",
    "--eval-episodes", "1", "--eval-every", "0", "--checkpoint-every", "1",
    "--baselines", "false", "--plots", "false", "--gif", "false", "--progress", "false",
    "--env.grid_size", "8", "--env.max_cycles", "20", "--env.n_targets", "1",
]  # fmt: skip


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


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A run finished at its budget of 192 env steps (3 updates)."""
    run = tmp_path_factory.mktemp("rough") / "run"
    assert train_main([*SMALL, "--total-steps", "192", "--run-dir", str(run)]) == 0
    return run


@pytest.fixture
def run(finished_run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(finished_run, copy)
    return copy


def config_yaml(run) -> dict:
    return yaml.safe_load((run / "config.yaml").read_text())


# ------------------------------------------------------------------------------------------
# A. config.yaml records the budget the run used
# ------------------------------------------------------------------------------------------
def test_config_yaml_records_the_demo_budget_a_run_without_one_trains_for(tmp_path, monkeypatch):
    monkeypatch.setattr(train_module, "DEMO_MAX_TIME", 1.0)  # the demo's 180 s, shortened
    run = tmp_path / "run"
    assert train_main([*SMALL, "--run-dir", str(run)]) == 0
    saved = config_yaml(run)
    assert (saved["total_steps"], saved["max_time"], saved["max_cpu_time"]) == (None, 1.0, None)
    marker = json.loads((run / "finished.json").read_text())
    assert marker["budget"] == {"total_steps": None, "max_time": 1.0, "max_cpu_time": None}
    # what the run did is unchanged: it trained for 1.0 s (no update began past it)
    times = [r["time_s"] for r in read_metrics(str(run / "metrics.jsonl"))]
    assert len(times) >= 2 and all(t < 1.0 for t in times[:-1]), times
    assert marker["time_s"] >= 1.0


def test_config_yaml_records_the_budget_given(run):
    saved = config_yaml(run)
    assert (saved["total_steps"], saved["max_time"], saved["max_cpu_time"]) == (192, None, None)


def test_a_run_whose_config_yaml_has_the_old_nulls_resumes_as_before(run, monkeypatch, capsys):
    saved = config_yaml(run)
    saved.update(total_steps=None, max_time=None, max_cpu_time=None)  # as older runs wrote it
    (run / "config.yaml").write_text(yaml.safe_dump(saved, sort_keys=False))
    # a budget given on resume is the whole budget (no demo time limit added to it)
    cfg = parse_cli(["--resume", str(run), "--total-steps", "320"])
    assert (cfg.total_steps, cfg.max_time, cfg.max_cpu_time) == (320, None, None)
    # none given: the demo budget, which the finished run has spent (0.01 s here)
    monkeypatch.setattr(train_module, "DEMO_MAX_TIME", 0.01)
    before = snapshot(run)
    assert train_main(["--resume", str(run)]) == 0
    assert "spends its budget --max-time 0.01" in capsys.readouterr().err
    assert snapshot(run) == before
    assert train_main(["--resume", str(run), "--total-steps", "320"]) == 0
    assert [r["env_steps"] for r in read_metrics(str(run / "metrics.jsonl"))] == [
        64,
        128,
        192,
        256,
        320,
    ]
    assert config_yaml(run)["total_steps"] == 320 and config_yaml(run)["max_time"] is None


# ------------------------------------------------------------------------------------------
# B. resuming a finished run without a larger budget changes nothing
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("budget", [[], ["--total-steps", "192"], ["--total-steps", "100"]])
def test_resume_of_a_finished_run_without_a_larger_budget_says_so_and_writes_nothing(
    run, capsys, budget
):
    before = snapshot(run)
    os.utime(run / "eval.json", (1, 1))  # a rewrite would show in the mtime too
    assert train_main(["--resume", str(run), *budget]) == 0
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and out == "", (out, err)
    steps = budget[1] if budget else "192"
    assert lines[0].startswith(f"[marl.train] {run} finished at 192 env steps ("), lines
    assert f"spends its budget --total-steps {steps}: nothing to do, nothing written" in lines[0]
    assert "--total-steps, --max-time or --max-cpu-time" in lines[0]
    assert snapshot(run) == before
    assert os.stat(run / "eval.json").st_mtime == 1


def test_resume_of_a_finished_run_from_the_command_line(run):
    before = snapshot(run)
    res = subprocess.run(
        [sys.executable, "-m", "marl.train", "--resume", str(run)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    assert res.stderr.count("\n") == 1 and "finished at 192 env steps" in res.stderr
    assert snapshot(run) == before


def test_resume_of_a_finished_run_with_a_larger_budget_trains_on(run):
    assert train_main(["--resume", str(run), "--total-steps", "256"]) == 0
    marker = json.loads((run / "finished.json").read_text())
    assert marker["env_steps"] == 256 and marker["budget"]["total_steps"] == 256


# ------------------------------------------------------------------------------------------
# C. the GIF of an env that draws with SDL, without a display
# ------------------------------------------------------------------------------------------
def test_headless_rendering_sets_sdl_drivers_only_for_the_block(monkeypatch):
    monkeypatch.delenv("SDL_VIDEODRIVER", raising=False)
    monkeypatch.setenv("SDL_AUDIODRIVER", "alsa")  # the caller's choice is kept
    with headless_rendering():
        assert os.environ["SDL_VIDEODRIVER"] == "dummy"
        assert os.environ["SDL_AUDIODRIVER"] == "alsa"
    assert "SDL_VIDEODRIVER" not in os.environ and os.environ["SDL_AUDIODRIVER"] == "alsa"


def test_cartpole_gif_is_drawn_without_a_display_and_without_an_error_line(tmp_path):
    pytest.importorskip("pygame", reason="Gymnasium's CartPole draws with pygame")
    imageio = pytest.importorskip("imageio.v2")
    run = tmp_path / "run"
    argv = ["--env-fn", "gymnasium:make", "--env.id", "CartPole-v1", "--total-steps", "64"]
    argv += ["--num-envs", "4", "--rollout-steps", "16", "--eval-episodes", "1"]
    argv += ["--baselines", "false", "--plots", "false", "--progress", "false"]
    headless = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DISPLAY", "WAYLAND_DISPLAY", "XDG_RUNTIME_DIR") and not k.startswith("SDL_")
    }
    res = subprocess.run(
        [sys.executable, "-m", "marl.train", *argv, "--run-dir", str(run)],
        cwd=ROOT,
        env=headless,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr
    assert "error:" not in res.stderr and "not written" not in res.stderr, res.stderr
    frames = imageio.mimread(str(run / "episode.gif"))
    assert len(frames) > 1 and frames[0].shape[:2] == (400, 600)


# ------------------------------------------------------------------------------------------
# D. numba's compilation: announced once per family, not counted against the budget
# ------------------------------------------------------------------------------------------
def test_compile_clock_counts_nested_compilations_once_and_names_each_family_once():
    said: list[str] = []
    clock = CompileClock(announce=said.append)
    clock.start("envs.websearch.kernels")
    clock.start("envs.websearch.corpus")  # a callee compiled inside its caller's compilation
    time.sleep(0.2)
    clock.end()
    clock.end()
    clock.start("marl.core.kernels.whitening_numba")
    clock.end()
    clock.start("seqmodels.kernels.numba_jit")
    clock.end()
    clock.start("envs.websearch.kernels")  # the family was announced already
    clock.end()
    clock.start("my_env.dynamics")  # an outside module: named by its package
    clock.end()
    clock.start("numba.np.arraymath")  # numba's own functions: part of a kernel's compilation
    clock.end()
    assert said == ["websearch env", "whitening", "Mamba / Mamba2", "my_env"]
    assert 0.2 <= clock.wall_s < 0.4  # the nested 0.2 s counted once
    assert clock.cpu_s < 0.1  # sleeping is no CPU time


KERNEL_MODULE = """
import numba


@numba.njit(cache=True)
def double(x):
    return 2 * x


@numba.njit(cache=True)
def double_plus_one(x):
    return double(x) + 1
"""

CALL_KERNEL = """
import sys
from marl.run.compile_clock import compile_clock

clock = compile_clock()
import cached_kernel

assert cached_kernel.double_plus_one(3) == 7
print(clock.wall_s > 0, sorted(clock.families))
"""


def test_a_compiled_kernel_is_announced_and_a_cached_one_is_not(tmp_path):
    (tmp_path / "cached_kernel.py").write_text(textwrap.dedent(KERNEL_MODULE))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), ROOT])}
    env.pop("NUMBA_CACHE_DIR", None)  # numba's cache beside the module, in tmp_path

    def call() -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", CALL_KERNEL],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    first = call()
    assert first.returncode == 0, first.stderr
    assert first.stdout.split() == ["True", "['cached_kernel']"]
    lines = [line for line in first.stderr.splitlines() if "compiling" in line]
    assert lines == [
        "[marl] compiling the cached_kernel kernels (numba): once, later runs load them from "
        "numba's cache; a training budget does not count this time"
    ]
    second = call()  # a new process: numba loads both kernels from its cache
    assert second.returncode == 0, second.stderr
    assert second.stdout.split() == ["False", "[]"]
    assert "compiling" not in second.stderr


def test_a_time_budget_does_not_count_compilation(tmp_path, monkeypatch, capsys):
    """A compilation of 2.5 s in the first update, against --max-time 2: the update's time_s
    leaves it out, so the run trains on instead of stopping after that update."""
    from numba.core import event

    compile_s = 2.5
    kernel = types.SimpleNamespace(py_func=types.SimpleNamespace(__module__="slow_kernels"))
    iteration = MAPPO.iteration
    walls: list[float] = []

    def iteration_compiling_first(self, progress):
        t0 = time.perf_counter()
        if not walls:
            with event.trigger_event("numba:compile", data={"dispatcher": kernel}):
                time.sleep(compile_s)
        out = iteration(self, progress)
        walls.append(time.perf_counter() - t0)
        return out

    monkeypatch.setattr(MAPPO, "iteration", iteration_compiling_first)
    compiled_before = compile_clock().wall_s
    run = tmp_path / "run"
    assert train_main([*SMALL, "--max-time", "2", "--run-dir", str(run)]) == 0
    rows = read_metrics(str(run / "metrics.jsonl"))
    assert compile_clock().wall_s - compiled_before >= compile_s
    assert rows[0]["time_s"] <= walls[0] - compile_s + 0.5  # the update, without compiling
    assert rows[0]["time_s"] < 2.0 and len(rows) >= 2, rows  # the budget was not spent on it
    assert all(r["time_s"] < 2.0 for r in rows[:-1])
    err = capsys.readouterr().err
    assert err.count("compiling the slow_kernels kernels (numba)") == 1, err
