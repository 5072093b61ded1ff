"""marl.compare stops its runs on Ctrl-C even when a launcher swallows the KeyboardInterrupt
(Ray can, when the signal lands inside one of its calls), and gives up on a Ray stop that
never returns (ray.cancel can deadlock) by exiting with status 130 instead of hanging.

Seen in CI on a loaded machine: a Ctrl-C'd ``--launcher ray`` compare went on for 20 minutes,
its runs never told to stop and status.json still 'running'."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from marl.experiments import compare, launchers

REPO = Path(__file__).resolve().parents[1]


class SwallowingLauncher:
    """A launcher whose poll receives a Ctrl-C and swallows its KeyboardInterrupt (as a Ray
    call can); its runs end on their own after ``finish_after`` polls."""

    name = "fake"

    def __init__(self, finish_after: int = 50) -> None:
        self.polls = 0
        self.finish_after = finish_after
        self.stopped: list[str] | None = None

    def start(self, command: list[str], env: dict[str, str], log_path: str) -> str:
        return log_path

    def poll(self, handle: str) -> int | None:
        self.polls += 1
        if self.polls == 1:
            with contextlib.suppress(KeyboardInterrupt):  # swallowed, as inside Ray
                signal.raise_signal(signal.SIGINT)
        return 0 if self.polls >= self.finish_after else None

    def stop(self, handles: list[str], grace_s: float) -> list[int | None]:
        self.stopped = list(handles)
        return [None] * len(handles)

    def close(self) -> None:
        pass


def _spec_and_runs(tmp_path: Path) -> tuple[compare.CompareSpec, list[compare.RunSpec]]:
    out = tmp_path / "out"
    out.mkdir()
    spec = compare.CompareSpec(
        algo="mappo", config=None, variants=[], seeds=[0, 1], out=str(out), reference="a",
        jobs=2,
    )  # fmt: skip
    runs = [
        compare.RunSpec("a", s, str(out / "runs" / "a" / f"seed_{s}"),
                        str(out / "logs" / "a" / f"seed_{s}.log"), [f"--seed={s}"])
        for s in (0, 1)
    ]  # fmt: skip
    return spec, runs


def test_a_swallowed_ctrl_c_still_stops_the_runs(tmp_path: Path) -> None:
    spec, runs = _spec_and_runs(tmp_path)
    launcher = SwallowingLauncher()
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        compare.execute_runs(spec, runs, progress=False, poll_s=0.01, launcher=launcher)
    assert launcher.polls < launcher.finish_after  # stopped, not left to finish
    assert launcher.stopped == [r.log_path for r in runs]
    status = json.loads((Path(spec.out) / "status.json").read_text())
    assert [status[r.key]["state"] for r in runs] == ["interrupted", "interrupted"]
    assert signal.getsignal(signal.SIGINT) is before  # handlers restored


def _python(code: str, timeout: float = 60) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    res = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True,
        text=True, timeout=timeout,
    )  # fmt: skip
    return res, time.monotonic() - start


RAY_STUB = """
    import tempfile, threading, time
    from marl.experiments import launchers
    launchers.STOP_GRACE_S = 0.0
    launchers.RAY_STOP_MARGIN_S = 0.5

    class Ray:
        def __init__(self, stuck):
            self.stuck = stuck
        def cancel(self, ref, force=False):
            pass
        def wait(self, refs, num_returns=1, timeout=None):
            if self.stuck:
                threading.Event().wait()  # a Ray call that never returns
            return list(refs), []
        def get(self, ref):
            return 3

    launcher = launchers.RayLauncher.__new__(launchers.RayLauncher)
    launcher.ray = Ray(STUCK)
    launcher._owns_ray = False
    log = tempfile.mkdtemp() + "/run.log"
    print(launcher.stop([launchers._RayTask("ref", log)], 0.2), flush=True)
    time.sleep(1.5)  # past the watchdog's deadline
    print("alive", flush=True)
"""


def test_a_ray_stop_that_never_returns_exits_130() -> None:
    res, elapsed = _python(RAY_STUB.replace("STUCK", "True"))
    assert res.returncode == 130, res.stderr
    assert "Ray did not stop its tasks within 1 s" in res.stderr
    assert "Rerun the same command to resume" in res.stderr
    assert "alive" not in res.stdout
    assert elapsed < 30


def test_runs_are_recorded_interrupted_before_the_launcher_stops_them(tmp_path: Path) -> None:
    """A launcher that never returns from stop may end compare (the Ray watchdog): the status
    says 'interrupted' by then."""
    spec, runs = _spec_and_runs(tmp_path)
    seen: list[str] = []

    class Recording(SwallowingLauncher):
        def stop(self, handles: list[str], grace_s: float) -> list[int | None]:
            status = json.loads((Path(spec.out) / "status.json").read_text())
            seen.extend(status[r.key]["state"] for r in runs)
            return [3, None]

    with pytest.raises(KeyboardInterrupt):
        compare.execute_runs(spec, runs, progress=False, poll_s=0.01, launcher=Recording())
    assert seen == ["interrupted", "interrupted"]
    status = json.loads((Path(spec.out) / "status.json").read_text())
    assert [status[r.key]["returncode"] for r in runs] == [3, None]


def test_a_ray_stop_that_returns_keeps_the_process() -> None:
    res, _ = _python(RAY_STUB.replace("STUCK", "False"))
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["[3]", "alive"]


def test_a_ray_task_stops_its_run_when_its_stop_file_appears(tmp_path: Path) -> None:
    """The Ray task's own stop channel (Ray's cancel may never reach a busy worker): the train
    process gets SIGTERM, its grace to finish, and the task returns its exit status."""
    import threading

    child = textwrap.dedent("""
        import signal, sys, time
        def on_term(signum, frame):
            print("SIGTERM received: checkpoint", flush=True)
            sys.exit(3)
        signal.signal(signal.SIGTERM, on_term)
        print("training", flush=True)
        while True:
            time.sleep(0.05)
    """)
    log, stop = tmp_path / "run.log", tmp_path / "run.log.stop"
    result: list[int] = []
    worker = threading.Thread(
        target=lambda: result.append(launchers._train_in_worker(
            [sys.executable, "-c", child], str(tmp_path), str(log), {}, str(stop))),
        daemon=True,
    )  # fmt: skip
    worker.start()
    deadline = time.monotonic() + 30
    while "training" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, "the run never started"
        time.sleep(0.05)
    assert worker.is_alive()  # no stop file: the run goes on
    stop.write_text("stop")
    worker.join(timeout=30)
    assert result == [3]
    assert "SIGTERM received: checkpoint" in log.read_text()
