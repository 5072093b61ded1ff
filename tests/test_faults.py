"""Nothing lost on faults (issue 19, items 2, 3, 5 and 8): SIGTERM behaves like Ctrl-C and an
interrupted run exits with its own code, the last K checkpoints are kept and a corrupt one is
skipped (resume and marl.evaluate), a full disk or a read-only directory gives an ``error:``
line with the previous checkpoint intact, CLI mistakes give ``error:`` lines with rc 2, the
NaN guard says what it kept, marl.compare's children survive their parent's death, and a run
killed (SIGKILL and SIGTERM) at random points resumes to exactly the uninterrupted metrics."""

from __future__ import annotations

import builtins
import errno
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import yaml

from marl.run.checkpoint import (
    checkpoint_path,
    latest_path,
    list_checkpoints,
    load_checkpoint,
    lock_run_dir,
    wait_for_run_dir,
)
from marl.run.config import EXIT_INTERRUPTED
from marl.run.evaluate import main as eval_main
from marl.run.runlog import TIMING_KEYS, read_metrics, read_tensorboard_events
from marl.run.train import main as train_main

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
FAKE_ENV = "test_train_fakeenv:vector_env"
TINY = [
    "--env-fn", FAKE_ENV, "--num-envs", "8", "--rollout-steps", "16", "--hidden-dim", "16",
    "--critic-hidden-dim", "16", "--eval-episodes", "2", "--eval-repeats", "1",
    "--eval-every", "0", "--progress", "false", "--baselines", "false", "--plots", "false",
    "--gif", "false", "--env.max_cycles", "6", "--env.goal", "2",
]  # fmt: skip
STEPS = 128  # env steps per update
VOLATILE = TIMING_KEYS


def rows(run) -> list[dict]:
    return [
        {k: v for k, v in r.items() if k not in VOLATILE}
        for r in read_metrics(str(Path(run) / "metrics.jsonl"))
    ]


def assert_rows_equal(a: list[dict], b: list[dict]) -> None:
    assert [r["update"] for r in a] == [r["update"] for r in b]
    for ra, rb in zip(a, b, strict=True):
        assert set(ra) == set(rb), ra["update"]
        for key in ra:
            assert ra[key] == pytest.approx(rb[key], rel=1e-6, abs=1e-9), (ra["update"], key)


def assert_error_line(err: str, *needles: str) -> str:
    """``err`` has one ``error:`` line (after any warnings), holding every needle, and no
    traceback; returns that line."""
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def sub_env() -> dict[str, str]:
    path = os.pathsep.join([str(TESTS), str(ROOT), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}


def spawn_train(*argv: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "marl.train", *argv],
        cwd=ROOT,
        env=sub_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_rows(run: Path, n: int, proc: subprocess.Popen, timeout: float = 120.0) -> bool:
    """Wait until metrics.jsonl has >= n rows; False if the process ended first."""
    t0 = time.monotonic()
    path = run / "metrics.jsonl"
    while True:
        if path.exists() and len(read_metrics(str(path))) >= n:
            return True
        if proc.poll() is not None:
            return False
        assert time.monotonic() - t0 < timeout, "timed out waiting for metrics"
        time.sleep(0.02)


# ---------------------------------------------------------------- signals (item 2)


@pytest.mark.slow
def test_sigterm_checkpoints_says_so_and_exits_with_the_interrupted_code(tmp_path):
    run = tmp_path / "run"
    proc = spawn_train(
        *TINY, "--run-dir", str(run), "--max-time", "600", "--checkpoint-every", "50"
    )
    assert wait_rows(run, 3, proc)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.send_signal(signal.SIGTERM)  # a second SIGTERM (a dying parent, a scheduler) too
    _, err = proc.communicate(timeout=60)
    took = time.monotonic() - t0
    assert proc.returncode == EXIT_INTERRUPTED == 3, err
    assert "SIGTERM" in err and "interrupted" in err and "--resume" in err
    assert "Traceback" not in err
    ckpt = load_checkpoint(latest_path(str(run)))
    assert ckpt["update"] == rows(run)[-1]["update"]  # nothing done is lost
    assert not (run / "eval.json").exists()
    print(f"SIGTERM to exit with checkpoint: {took:.2f}s")
    total = ckpt["env_steps"] + 2 * STEPS
    assert (
        train_main(["--resume", str(run), "--total-steps", str(total), "--max-time", "none"]) == 0
    )
    assert [r["update"] for r in rows(run)] == list(range(1, ckpt["update"] + 3))


# ---------------------------------------------------------------- checkpoints (item 3)


def test_last_k_checkpoints_are_kept_and_latest_is_the_newest(tmp_path):
    run = tmp_path / "run"
    argv = [*TINY, "--run-dir", str(run), "--checkpoint-every", "1"]
    assert train_main([*argv, "--total-steps", str(5 * STEPS), "--keep-checkpoints", "2"]) == 0
    names = sorted(os.listdir(run / "checkpoints"))
    assert names == ["ckpt_4.pt", "ckpt_5.pt", "latest.pt"]
    assert load_checkpoint(latest_path(str(run)))["update"] == 5
    assert load_checkpoint(checkpoint_path(str(run), 4))["update"] == 4
    # the resumed run keeps its K unless told otherwise; the default is 3
    assert train_main(["--resume", str(run), "--total-steps", str(7 * STEPS)]) == 0
    assert sorted(os.listdir(run / "checkpoints")) == ["ckpt_6.pt", "ckpt_7.pt", "latest.pt"]
    other = tmp_path / "default"
    assert train_main([*TINY, "--run-dir", str(other), "--checkpoint-every", "1",
                       "--total-steps", str(5 * STEPS)]) == 0  # fmt: skip
    assert [os.path.basename(p) for p in list_checkpoints(str(other))] == [
        "ckpt_5.pt",
        "ckpt_4.pt",
        "ckpt_3.pt",
    ]


def test_truncated_latest_checkpoint_falls_back_and_matches_the_uninterrupted_run(tmp_path, capsys):
    full, part = tmp_path / "full", tmp_path / "part"
    common = [*TINY, "--checkpoint-every", "1", "--eval-every", "2", "--seed", "4"]
    assert train_main([*common, "--run-dir", str(full), "--total-steps", str(6 * STEPS)]) == 0
    assert train_main([*common, "--run-dir", str(part), "--total-steps", str(4 * STEPS)]) == 0
    with open(latest_path(str(part)), "r+b") as fh:  # the "truncate it"
        fh.truncate(100)
    capsys.readouterr()
    assert train_main(["--resume", str(part), "--total-steps", str(6 * STEPS)]) == 0
    err = capsys.readouterr().err
    assert "ckpt_4.pt" in err and "could not be loaded" in err and "Traceback" not in err
    assert "ckpt_3.pt" in err  # resumed from the next older one
    assert_rows_equal(rows(part), rows(full))
    a = load_checkpoint(latest_path(str(full)))["algo"]["policy"]
    b = load_checkpoint(latest_path(str(part)))["algo"]["policy"]
    for key in a:
        torch.testing.assert_close(a[key], b[key])


def test_evaluate_skips_corrupt_policy_weights(tmp_path, capsys):
    """marl.evaluate reads the policy artifact (RUN/policy/), never the pickled checkpoints:
    corrupt weights files are reported and the next older ones used."""
    run = tmp_path / "run"
    argv = [*TINY, "--run-dir", str(run), "--checkpoint-every", "1"]
    assert train_main([*argv, "--total-steps", str(3 * STEPS)]) == 0
    for path in list_checkpoints(str(run)):
        Path(path).write_bytes(b"junk")  # not read
    (run / "policy" / "weights.pt").write_bytes(b"")  # truncated to nothing
    (run / "policy" / "weights_3.pt").write_bytes(b"")
    capsys.readouterr()
    assert eval_main([str(run), "--episodes", "1"]) == 0
    captured = capsys.readouterr()
    assert "weights_3.pt" in captured.err and "could not be loaded" in captured.err
    assert "checkpoints/ckpt_2.pt (update 2" in captured.err
    assert "success_rate" in captured.out
    for path in (run / "policy").glob("weights*.pt"):
        path.write_bytes(b"junk")
    assert eval_main([str(run)]) == 2
    err = capsys.readouterr().err
    assert_error_line(err, "weights_2.pt", "weights_1.pt")


def test_a_run_with_only_latest_pt_still_resumes(tmp_path):
    """Runs written before numbered checkpoints hold checkpoints/latest.pt only."""
    run = tmp_path / "run"
    argv = [*TINY, "--run-dir", str(run), "--checkpoint-every", "1"]
    assert train_main([*argv, "--total-steps", str(2 * STEPS), "--keep-checkpoints", "1"]) == 0
    os.remove(checkpoint_path(str(run), 2))  # latest.pt (its hard link) stays
    assert train_main(["--resume", str(run), "--total-steps", str(3 * STEPS)]) == 0
    assert [r["update"] for r in rows(run)] == [1, 2, 3]


@pytest.fixture
def no_space_on_checkpoint(monkeypatch):
    """os.write fails with ENOSPC for checkpoint files from the n-th checkpoint write on."""
    real_write = os.write
    state = {"from": 3, "count": 0}

    def write(fd, data):
        target = os.readlink(f"/proc/self/fd/{fd}") if os.path.isdir("/proc/self/fd") else ""
        if ".ckpt_" in target and ".tmp" in target:
            state["count"] += 1
            if state["count"] >= state["from"]:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    return state


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_full_disk_gives_an_error_line_and_keeps_the_previous_checkpoint(
    tmp_path, capsys, no_space_on_checkpoint
):
    run = tmp_path / "run"
    argv = [*TINY, "--run-dir", str(run), "--checkpoint-every", "1"]
    assert train_main([*argv, "--total-steps", str(6 * STEPS)]) == 2
    line = assert_error_line(capsys.readouterr().err, "No space left on device", "ENOSPC")
    assert str(checkpoint_path(str(run), 3)) in line  # the path it could not write
    assert "ckpt_2.pt" in line  # ... and what was kept
    assert sorted(os.listdir(run / "checkpoints")) == ["ckpt_1.pt", "ckpt_2.pt", "latest.pt"]
    assert load_checkpoint(latest_path(str(run)))["update"] == 2
    no_space_on_checkpoint["from"] = 10**9  # space again: the run resumes from update 2
    assert train_main(["--resume", str(run)]) == 0
    assert [r["update"] for r in rows(run)] == list(range(1, 7))


@pytest.fixture
def read_only(monkeypatch):
    """``read_only(path)``: make writes under ``path`` fail with EACCES (chmod when not root;
    root ignores permissions, so then the write calls are refused the same way)."""
    protected: list[str] = []

    def under(p) -> bool:
        try:
            p = os.path.abspath(os.fsdecode(p))
        except TypeError:
            return False
        return any(p == d or p.startswith(d + os.sep) for d in protected)

    def deny(p):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fsdecode(p))

    if os.geteuid() != 0:

        def make(path):
            protected.append(os.path.abspath(path))
            for folder, _, files in os.walk(path):
                os.chmod(folder, 0o555)
                for f in files:
                    os.chmod(os.path.join(folder, f), 0o444)

        yield make
        for d in protected:
            for folder, _, _ in os.walk(d):
                os.chmod(folder, 0o755)
        return
    real_open, real_os_open = builtins.open, os.open
    for name in ("makedirs", "mkdir", "remove", "unlink", "rmdir"):
        real = getattr(os, name)

        def one(p, *a, _real=real, _name=name, **k):
            if _name == "makedirs" and k.get("exist_ok") and os.path.isdir(p):
                return None  # as on a read-only directory: nothing to create
            return deny(p) if under(p) else _real(p, *a, **k)

        monkeypatch.setattr(os, name, one)
    for name in ("replace", "rename", "link"):
        real = getattr(os, name)

        def two(src, dst, *a, _real=real, **k):
            return deny(dst) if under(dst) or under(src) else _real(src, dst, *a, **k)

        monkeypatch.setattr(os, name, two)

    def fake_open(file, mode="r", *a, **k):
        if isinstance(file, (str, bytes, os.PathLike)) and under(file) and set(mode) & set("wax+"):
            deny(file)
        return real_open(file, mode, *a, **k)

    def fake_os_open(path, flags, *a, **k):
        writing = flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        if under(path) and writing:
            deny(path)
        return real_os_open(path, flags, *a, **k)

    real_rmtree = shutil.rmtree

    def fake_rmtree(path, *a, **k):
        if under(path):
            if k.get("ignore_errors"):
                return None
            deny(path)
        return real_rmtree(path, *a, **k)

    monkeypatch.setattr(builtins, "open", fake_open)
    monkeypatch.setattr(os, "open", fake_os_open)
    monkeypatch.setattr(shutil, "rmtree", fake_rmtree)
    yield lambda path: protected.append(os.path.abspath(path))


def test_read_only_directories_give_an_error_line(tmp_path, capsys, read_only):
    run = tmp_path / "run"
    argv = [*TINY, "--run-dir", str(run), "--checkpoint-every", "1"]
    assert train_main([*argv, "--total-steps", str(2 * STEPS)]) == 0
    parent = tmp_path / "locked"
    parent.mkdir()
    read_only(str(run))
    read_only(str(parent))
    capsys.readouterr()
    # resuming a read-only run
    assert train_main(["--resume", str(run), "--total-steps", str(3 * STEPS)]) == 2
    assert_error_line(capsys.readouterr().err, "Permission denied", str(run))
    # a new run inside a read-only directory
    assert train_main([*TINY, "--run-dir", str(parent / "new"), "--total-steps", "128"]) == 2
    assert_error_line(capsys.readouterr().err, "Permission denied", str(parent / "new"))
    assert load_checkpoint(latest_path(str(run)))["update"] == 2


# ---------------------------------------------------------------- CLI errors (item 5)


def _bad_yaml(tmp_path) -> str:
    path = tmp_path / "bad.yaml"
    path.write_text("lr: [0.1\nepochs: 2\n")
    return str(path)


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--device", "gpu"], "--device"),
        (["--seed", "99999999999999999999"], "--seed"),
        (["--eval-seed", "-1"], "--eval-seed"),
        (["--config", "BAD_YAML"], "YAML syntax error at line"),
        (["--resume", "NO_SUCH_DIR"], "no such directory"),
        (["--keep-checkpoints", "0"], "--keep-checkpoints"),
    ],
)
def test_cli_mistakes_are_error_lines(tmp_path, capsys, argv, needle):
    argv = [
        _bad_yaml(tmp_path) if a == "BAD_YAML" else str(tmp_path / "x") if a == "NO_SUCH_DIR" else a
        for a in argv
    ]
    assert train_main([*argv, "--run-dir", str(tmp_path / "run")]) == 2
    assert_error_line(capsys.readouterr().err, needle)
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_device_cuda_without_cuda_is_an_error_line(tmp_path, capsys):
    assert train_main([*TINY, "--device", "cuda", "--run-dir", str(tmp_path / "run")]) == 2
    assert_error_line(capsys.readouterr().err, "CUDA is not available")
    assert not (tmp_path / "run").exists()


def test_cli_errors_from_the_command_line_have_no_traceback(tmp_path):
    bad = _bad_yaml(tmp_path)
    for module, argv in (
        ("marl.train", ["--config", bad]),
        ("marl.train", ["--seed", "99999999999999999999"]),
        ("marl.evaluate", [str(tmp_path)]),
    ):
        res = subprocess.run(
            [sys.executable, "-m", module, *argv],
            cwd=ROOT,
            env=sub_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert res.returncode == 2, (module, argv, res.stderr)
        assert_error_line(res.stderr)


def test_evaluate_on_a_directory_that_is_not_a_run(tmp_path, capsys):
    assert eval_main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "not a run directory" in err and "--config" not in err


def test_nan_guard_says_nothing_was_kept_or_names_the_checkpoint(tmp_path, capsys):
    run = tmp_path / "run"
    # 16 env steps per rollout: the NaN arrives in update 3 (step call 40)
    argv = [*TINY, "--run-dir", str(run), "--total-steps", "2000", "--env.nan_at_call", "40"]
    assert train_main([*argv, "--checkpoint-every", "10"]) == 1
    err = capsys.readouterr().err
    assert "non-finite" in err and "No checkpoint was kept" in err and "is kept" not in err
    assert not os.path.exists(latest_path(str(run)))
    assert train_main([*argv, "--checkpoint-every", "1", "--overwrite"]) == 1
    err = capsys.readouterr().err
    assert "ckpt_2.pt" in err and "(update 2)" in err


def test_a_run_directory_in_use_is_refused_and_waited_for(tmp_path, capsys):
    run = tmp_path / "run"
    argv = [*TINY, "--run-dir", str(run), "--checkpoint-every", "1"]
    assert train_main([*argv, "--total-steps", str(STEPS)]) == 0
    with lock_run_dir(str(run)):  # as a trainer still running there holds it
        assert train_main(["--resume", str(run), "--total-steps", str(2 * STEPS)]) == 2
        assert "in use by another process" in capsys.readouterr().err
    held = threading.Event()

    def hold():
        with lock_run_dir(str(run)):
            held.set()
            time.sleep(0.6)

    thread = threading.Thread(target=hold)
    thread.start()
    held.wait()
    t0 = time.monotonic()
    wait_for_run_dir(str(run))  # what marl.compare does before it resumes a run
    assert time.monotonic() - t0 > 0.3
    thread.join()
    assert train_main(["--resume", str(run), "--total-steps", str(2 * STEPS)]) == 0


# ---------------------------------------------------------------- marl.compare's children


HARNESS = r"""
# a parent that adopts orphans (PR_SET_CHILD_SUBREAPER), as job runners and init systems do:
# an orphan gets its parent-death signal once when compare dies and again when this dies
import ctypes, subprocess, sys, time
ctypes.CDLL("libc.so.6", use_errno=True).prctl(36, 1, 0, 0, 0)
proc = subprocess.Popen(sys.argv[1:])
print(proc.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal: Linux")
def test_compare_child_survives_its_parents_death_and_the_rerun_resumes(tmp_path):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "env_fn": FAKE_ENV,
                "num_envs": 8,
                "rollout_steps": 16,
                "hidden_dim": 16,
                "critic_hidden_dim": 16,
                "eval_every": 0,
                "eval_episodes": 2,
                "checkpoint_every": 1000,  # no checkpoint but the one the interrupt writes
                "plots": False,
                "env": {"max_cycles": 6, "goal": 2},
            }
        )
    )
    harness = tmp_path / "harness.py"
    harness.write_text(HARNESS)
    out = tmp_path / "out"
    n_updates = 60
    argv = [sys.executable, "-m", "marl.compare", "--algo", "mappo", "--config", str(cfg)]
    argv += [
        "--variant",
        "a:--alpha=0.5",
        "--seeds",
        "1",
        "--pilot",
        "--total-steps",
        str(n_updates * STEPS),
    ]
    argv += ["--jobs", "1", "--out", str(out), "--bootstrap-reps", "20", "--no-progress"]
    argv += ["--no-plots"]
    env = sub_env()
    parent = subprocess.Popen(
        [sys.executable, str(harness), *argv], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
    )
    compare_pid = int(parent.stdout.readline())
    run = out / "runs" / "a" / "seed_0"
    t0 = time.monotonic()
    while not ((run / "metrics.jsonl").exists() and len(rows(run)) >= 3):
        assert time.monotonic() - t0 < 120 and parent.poll() is None, "the run never started"
        time.sleep(0.05)
    os.kill(compare_pid, signal.SIGKILL)  # compare dies: the child gets its death signal ...
    time.sleep(0.05)
    parent.kill()  # ... and again when the process that adopted it dies
    parent.wait()
    rerun = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=200)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    status = json.loads((out / "status.json").read_text())["a/seed_0"]
    assert status["mode"] == "resume" and status["state"] == "finished", status
    log = (out / "logs" / "a" / "seed_0.log").read_text()
    assert "interrupted: checkpoint" in log and "Traceback" not in log, log[-3000:]
    assert [r["update"] for r in rows(run)] == list(range(1, n_updates + 1))


# ---------------------------------------------------------------- fault injection (item 8)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_killed_at_random_points_resume_gives_the_uninterrupted_metrics(tmp_path):
    """SIGKILL and SIGTERM at random points (during start-up, updates, evaluations and
    checkpoint writes), each followed by a resume (or a restart with --overwrite when no
    checkpoint was written yet): the final metrics, TensorBoard events and parameters are those
    of the uninterrupted run."""
    n_updates = 40
    common = [*TINY, "--checkpoint-every", "3", "--eval-every", "4", "--seed", "7"]
    common += ["--total-steps", str(n_updates * STEPS)]
    full, run = tmp_path / "full", tmp_path / "run"
    assert train_main([*common, "--run-dir", str(full)]) == 0
    reference = rows(full)

    rng = random.Random(19)
    kills = [signal.SIGKILL, signal.SIGTERM, signal.SIGKILL, signal.SIGTERM, signal.SIGKILL]
    log = []
    for i, sig in enumerate(kills):
        if list_checkpoints(str(run)):
            proc = spawn_train("--resume", str(run))
        else:  # killed before its first checkpoint: start again
            proc = spawn_train(*common, "--run-dir", str(run), "--overwrite")
        if i == 0:
            time.sleep(rng.uniform(0.5, 3.0))  # anywhere in start-up or the first updates
            alive = proc.poll() is None
        else:
            done = len(rows(run)) if (run / "metrics.jsonl").exists() else 0
            alive = wait_rows(run, done + rng.randint(1, 5), proc)
            time.sleep(rng.uniform(0.0, 0.15))
        if alive and proc.poll() is None:
            proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
        assert "Traceback" not in err, err
        if proc.returncode == 0 or (run / "eval.json").exists():
            break  # finished before the signal (or it came during interpreter shutdown)
        expected = -signal.SIGKILL if sig == signal.SIGKILL else EXIT_INTERRUPTED
        assert proc.returncode == expected, (sig, proc.returncode, err)
        log.append((sig.name, len(rows(run)) if (run / "metrics.jsonl").exists() else 0))
    if not (run / "eval.json").exists():
        proc = spawn_train("--resume", str(run)) if list_checkpoints(str(run)) else None
        if proc is None:
            proc = spawn_train(*common, "--run-dir", str(run), "--overwrite")
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    print("kills (signal, metrics rows at exit):", log)
    assert_rows_equal(rows(run), reference)
    events = read_tensorboard_events(str(run / "tb"))
    steps = sorted(step for step, tag, _ in events if tag == "env_steps")
    assert steps == [r["env_steps"] for r in reference]  # each update once
    assert len([p for p in list_checkpoints(str(run))]) <= 3
    a = load_checkpoint(latest_path(str(full)))["algo"]["policy"]
    b = load_checkpoint(latest_path(str(run)))["algo"]["policy"]
    for key in a:
        torch.testing.assert_close(a[key], b[key])
    assert json.loads((run / "eval.json").read_text()) == json.loads(
        (full / "eval.json").read_text()
    )
