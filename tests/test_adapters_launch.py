"""Outside envs through the adapter under the launchers: ``torchrun -m marl.train`` (two gloo
ranks, each with its own env seeds), ``python -m marl.compare`` (variants x seeds), and
signals: a trainer stopped by SIGTERM to its whole process group (as torchrun, a scheduler or
``kill -TERM -PGID`` send it) still checkpoints, and no adapter worker outlives its trainer.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from marl.run.config import EXIT_INTERRUPTED
from marl.run.distributed import RANK_SEED_STRIDE

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
QUIET = ["--progress=false", "--baselines=false", "--plots=false", "--gif=false"]
TINY_MAPPO = ["--hidden-dim=16", "--critic-hidden-dim=16", "--rollout-steps=16", *QUIET]


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH")]))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return env


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _spawned_children(pid: int) -> list[int]:
    """Live multiprocessing-spawned children of ``pid`` (the adapter's workers), from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # state, ppid, ...
        if int(fields[1]) == pid and fields[0] != "Z" and b"spawn_main" in cmdline:
            found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


# ------------------------------------------------------------------ torchrun


@pytest.mark.slow  # a launcher end to end: slow tier
@pytest.mark.timeout(120)
def test_torchrun_on_pettingzoo_env_gives_each_rank_its_own_env_seeds(tmp_path):
    pytest.importorskip("mpe2", reason="install mpe2 (pip install mpe2)")
    run, seed_log = tmp_path / "run", tmp_path / "seeds"
    seed_log.mkdir()
    seed, num_envs, eval_seed = 3, 4, 10_000
    argv = ["--env-fn=_launch_envs:seed_logged_spread", "--env.max_cycles=10"]
    argv += [f"--seed={seed}", f"--num-envs={num_envs}", "--total-steps=512"]
    argv += ["--eval-every=0", "--eval-episodes=2", f"--eval-seed={eval_seed}"]
    argv += [*TINY_MAPPO, f"--run-dir={run}"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    proc = subprocess.run(
        [*cmd, "-m", "marl.train", *argv],
        env=_env(SEED_LOG_DIR=str(seed_log)),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]

    eval_seeds = {eval_seed, eval_seed + 1}
    for rank in (0, 1):
        lines = (seed_log / f"rank{rank}.jsonl").read_text().splitlines()
        logged = [json.loads(line) for line in lines]
        train_seeds = {r["seed"] for r in logged if r["seed"] is not None} - eval_seeds
        # the collector resets the E copies with seed + rank * stride + i (marl.adapters)
        first = seed + rank * RANK_SEED_STRIDE
        assert train_seeds == set(range(first, first + num_envs)), (rank, sorted(train_seeds))
        # later episodes continue each copy's stream (autoreset with seed None)
        assert any(r["seed"] is None for r in logged)

    # the run: global env steps (both ranks counted), finite returns, the env spec recorded
    rows = _rows(run)
    assert [r["env_steps"] for r in rows] == [128, 256, 384, 512]  # 2 ranks x 4 envs x 16 steps
    assert all(math.isfinite(r["episode/return"]) for r in rows if "episode/return" in r)
    result = json.loads((run / "eval.json").read_text())
    assert result["seeds"] == sorted(eval_seeds) and result["mean_return"] < 0
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["env_fn"] == "_launch_envs:seed_logged_spread"
    assert config["env"] == {"max_cycles": 10} and config["seed"] == seed
    assert (run / "finished.json").exists()


# ------------------------------------------------------------------ marl.compare


@pytest.mark.slow  # a launcher end to end: slow tier
@pytest.mark.timeout(150)
def test_compare_on_gymnasium_env_runs_every_seed_through_the_adapter(tmp_path):
    out = tmp_path / "cmp"
    common = ["--env-fn=gymnasium:make", "--env.id=CartPole-v1", "--num-envs=4"]
    common += ["--eval-episodes=2", "--eval-every=0", *TINY_MAPPO]
    argv = [sys.executable, "-m", "marl.compare", "--common=" + ",".join(common)]
    argv += ["--variant", "batch:--whitening=batch", "--variant", "none:--whitening=none"]
    argv += ["--seeds", "2", "--pilot", "--total-steps", "128"]
    argv += ["--jobs", "2", "--out", str(out), "--no-progress", "--no-plots"]
    argv += ["--bootstrap-reps", "50"]
    proc = subprocess.run(argv, env=_env(), cwd=ROOT, capture_output=True, text=True, timeout=140)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]

    summary = json.loads((out / "summary.json").read_text())
    assert summary["seeds"] == [0, 1]
    runs = {(r["variant"], r["seed"]): r for r in summary["runs"]}
    assert set(runs) == {(v, s) for v in ("batch", "none") for s in (0, 1)}
    # CartPole reports no success/solved rates: one note, those metrics left out, no verdicts
    assert "success_rate" not in summary["metrics"] and "mean_return" in summary["metrics"]
    assert [w for w in summary["warnings"] if "lack" in w] == []
    assert any("no run reports" in w and "success_rate" in w for w in summary["warnings"])
    assert summary["verdicts"] and not any("no finished runs" in v for v in summary["verdicts"])
    assert all("success" not in v for v in summary["verdicts"])
    for (_, seed), record in runs.items():
        assert record["status"] == "finished", record
        assert record["eval"]["mean_return"] > 0  # CartPole: +1 a step
        config = yaml.safe_load((out / record["run_dir"] / "config.yaml").read_text())
        assert config["env_fn"] == "gymnasium:make" and config["env"] == {"id": "CartPole-v1"}
        assert config["seed"] == seed
    assert "--env-fn=gymnasium:make" in summary["common"]


# ------------------------------------------------------------------ signals and workers


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.timeout(90)
def test_group_sigterm_checkpoints_and_leaves_no_adapter_workers(tmp_path):
    run = tmp_path / "run"
    argv = [sys.executable, "-m", "marl.train", "--env-fn=gymnasium:make"]
    argv += ["--env.id=CartPole-v1", "--env.adapter_workers=2", "--num-envs=4"]
    argv += ["--total-steps=100000000", "--eval-every=0", "--eval-episodes=1", *TINY_MAPPO]
    argv += ["--rollout-steps=64", f"--run-dir={run}"]
    proc = subprocess.Popen(
        argv,
        env=_env(),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            metrics = run / "metrics.jsonl"
            if metrics.exists() and metrics.read_text().count("\n") >= 1:
                break
            time.sleep(0.1)
        workers = _spawned_children(proc.pid)
        assert proc.poll() is None and len(workers) == 2, proc.poll()
        os.killpg(proc.pid, signal.SIGTERM)  # the trainer and its workers, mid-rollout
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == EXIT_INTERRUPTED, output[-3000:]
    assert "interrupted: checkpoint" in output
    assert list((run / "checkpoints").glob("ckpt_*.pt"))
    assert _wait_gone(workers, 5.0) == []


BUSY_WORKERS = """
from marl.adapters.envapi import make_vector_env

if __name__ == "__main__":  # spawn re-imports the main module in the workers
    kwargs = {"step_s": 60.0, "adapter_workers": 2, "adapter_max_cycles": 5}
    vec = make_vector_env("_launch_envs:slow_step_env", 2, kwargs, autoreset=True)
    print(" ".join(str(p.pid) for p in vec.backend._processes), flush=True)
    vec.reset(seed=0)
    vec.step({a: [0, 0] for a in vec.possible_agents})  # blocks: the workers sleep 60 s
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.timeout(60)
def test_workers_busy_in_a_step_exit_when_their_trainer_is_killed(tmp_path):
    script = tmp_path / "busy.py"
    script.write_text(BUSY_WORKERS)
    proc = subprocess.Popen(
        [sys.executable, str(script)], env=_env(), cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        workers = [int(p) for p in proc.stdout.readline().split()]
        assert len(workers) == 2, workers
        time.sleep(1.0)  # inside vec.step: each worker sleeps in its env's step
        for pid in workers:  # SIGTERM does not stop a worker: its trainer decides
            os.kill(pid, signal.SIGTERM)
        time.sleep(0.3)
        assert all(_alive(p) for p in workers)
        proc.kill()  # SIGKILL: no close(), no atexit
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert _wait_gone(workers, 5.0) == []
