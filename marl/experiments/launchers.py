"""Where ``python -m marl.compare``'s runs train: child processes or Ray tasks.

Both launchers take a train command, an environment and a log path (:meth:`start`), report
the exit status (:meth:`poll`), and stop runs so that they checkpoint first (:meth:`stop`:
SIGTERM, then SIGKILL after a grace period). :func:`make_launcher` picks one from a
:class:`marl.experiments.spec.CompareSpec`.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from marl.experiments.spec import RAY_MISSING, CompareError, CompareSpec, cpu_count

__all__ = ["LocalLauncher", "RayLauncher", "make_launcher", "STOP_GRACE_S", "RAY_MISSING"]

#: Seconds a run gets to checkpoint and exit after compare is interrupted.
STOP_GRACE_S = 30.0


def _parent_death_signal_setter() -> Any:
    """A ``preexec_fn`` for Popen: on Linux the child gets SIGTERM when compare dies (even by
    SIGKILL), so that a train run stops at the end of its update with a checkpoint instead of
    running on unsupervised. SIGTERM, not SIGINT: marl.train stops at once on a second SIGINT
    (a user's double Ctrl-C) but never on repeated SIGTERMs, and the death signal can come
    more than once (again when a process the orphan was reparented to dies). A parent that
    died before the signal was set (between fork and prctl) is caught by comparing the parent
    pid. None elsewhere. libc is resolved here, in the parent, so that the child runs no import
    between fork and exec."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):  # pragma: no cover - unusual libc
        return None
    pr_set_pdeathsig, sigterm = 1, int(signal.SIGTERM)
    parent = os.getpid()

    def set_death_signal() -> None:  # pragma: no cover - runs in the child
        prctl(pr_set_pdeathsig, sigterm)
        if os.getppid() != parent:
            os.kill(os.getpid(), sigterm)

    return set_death_signal


def _stop_process(proc: subprocess.Popen, deadline: float) -> None:
    """Wait for a train process sent SIGTERM until ``deadline`` (monotonic), then SIGKILL its
    process group."""
    try:
        proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class LocalLauncher:
    """Runs each train command as a child process of compare (``--launcher local``)."""

    name = "local"

    def __init__(self) -> None:
        self._death_signal = _parent_death_signal_setter()
        self._logs: dict[int, Any] = {}

    def start(self, command: list[str], env: dict[str, str], log_path: str) -> subprocess.Popen:
        """Start ``command`` with ``env`` added to this process's environment, its output
        appended to ``log_path``."""
        log = open(log_path, "a")  # noqa: SIM115 - closed when the run ends
        proc = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **env},
            start_new_session=True,
            preexec_fn=self._death_signal,
        )
        self._logs[proc.pid] = log
        return proc

    def poll(self, proc: subprocess.Popen) -> int | None:
        """The exit status once the run has ended, else None."""
        rc = proc.poll()
        if rc is not None:
            self._logs.pop(proc.pid).close()
        return rc

    def stop(self, procs: list[subprocess.Popen], grace_s: float) -> list[int | None]:
        """SIGTERM first (once, to the train process only: its helper processes, e.g. env
        workers, must live until it has finished its update): marl.run.train writes a
        checkpoint, so the next compare resumes it; SIGKILL to the group after ``grace_s``."""
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in procs:
            _stop_process(proc, deadline)
            self._logs.pop(proc.pid).close()
        return [proc.returncode for proc in procs]

    def close(self) -> None:
        pass


def _train_in_worker(
    command: list[str], cwd: str, log_path: str, env: dict[str, str], stop_path: str
) -> int:
    """A Ray task: run ``command`` in ``cwd`` as a subprocess of the worker, its output appended
    to ``log_path``; returns its exit status. Asked to stop (compare writes ``stop_path``, on
    the file system OUT shares with the workers; or ``ray.cancel``: KeyboardInterrupt), it
    sends the train process SIGTERM (it finishes its update and writes a checkpoint), waits
    :data:`STOP_GRACE_S` for it and returns its exit status; the train process also gets
    SIGTERM when the worker dies. (The stop file because Ray's own cancel may never reach a
    busy worker: seen under load.)"""
    with open(log_path, "a") as log:
        proc = subprocess.Popen(
            command,
            cwd=cwd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **env},
            start_new_session=True,
            preexec_fn=_parent_death_signal_setter(),
        )
        try:
            while True:  # short waits: a stop request is seen between two of them
                with contextlib.suppress(subprocess.TimeoutExpired):
                    return proc.wait(timeout=0.5)
                if os.path.exists(stop_path):
                    _terminate(proc)
                    return proc.returncode
        except BaseException:
            _terminate(proc)
            raise


def _terminate(proc: subprocess.Popen) -> None:
    """SIGTERM the train process (it finishes its update and checkpoints) and wait for it up
    to :data:`STOP_GRACE_S`, then SIGKILL its group."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGTERM)
    _stop_process(proc, time.monotonic() + STOP_GRACE_S)


@dataclass
class _RayTask:
    ref: Any  # ray.ObjectRef of _train_in_worker's exit status
    log_path: str

    @property
    def stop_path(self) -> str:
        """Written by :meth:`RayLauncher.stop`: the task then stops its run."""
        return self.log_path + ".stop"


#: Object store of a local Ray cluster started by compare (its tasks pass only exit codes).
LOCAL_OBJECT_STORE_BYTES = 256 * 1024**2


class RayLauncher:
    """Runs each train command as a Ray task (``--launcher ray``) requesting ``cpus_per_run``
    CPUs, on the cluster at ``address`` (``ray.init``'s address), else ``RAY_ADDRESS``, else a
    local cluster of this machine's cores that :meth:`close` shuts down. Paths are absolute
    (the worker's working directory is Ray's): OUT must be visible at the same path on every
    node."""

    name = "ray"

    def __init__(self, address: str | None = None, cpus_per_run: float = 1.0) -> None:
        try:
            import ray
        except ImportError:
            raise CompareError(RAY_MISSING) from None
        self.ray = ray
        address = address or os.environ.get("RAY_ADDRESS") or None
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
        if address is None:  # a local cluster for this compare; its workers import this
            # module from where this process does (a checkout need not be installed)
            pythonpath = os.pathsep.join(
                p for p in (package_root(), os.environ.get("PYTHONPATH")) if p
            )
            kwargs.update(
                address="local",
                num_cpus=cpu_count(),
                object_store_memory=LOCAL_OBJECT_STORE_BYTES,
                runtime_env={"env_vars": {"PYTHONPATH": pythonpath}},
            )
        else:
            kwargs["address"] = address
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            try:
                ray.init(**kwargs)
            except Exception as exc:  # noqa: BLE001 - Ray's own errors (address, start-up)
                where = f"the cluster at {address!r}" if address else "a local Ray cluster"
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                raise CompareError(
                    f"--launcher ray: cannot connect to {where} ({type(exc).__name__}: {first})"
                ) from None
        self.cpus_per_run = float(cpus_per_run)
        self._task = ray.remote(num_cpus=self.cpus_per_run, max_retries=0)(_train_in_worker)

    def cluster_jobs(self) -> int:
        """Runs the cluster can hold at once: its CPUs // cpus_per_run (at least 1)."""
        cpus = float(self.ray.cluster_resources().get("CPU", 1.0))
        return max(1, int(cpus // self.cpus_per_run))

    def start(self, command: list[str], env: dict[str, str], log_path: str) -> _RayTask:
        log_path = os.path.abspath(log_path)
        task = _RayTask(None, log_path)
        with contextlib.suppress(FileNotFoundError):
            os.remove(task.stop_path)  # a stale request from an interrupted compare
        task.ref = self._task.remote(
            list(command), os.getcwd(), log_path, dict(env), task.stop_path
        )
        return task

    def poll(self, task: _RayTask) -> int | None:
        """The run's exit status once its task has ended, else None; a task that failed in
        Ray (a worker or node lost) is -1, the cause appended to the run's log."""
        ready, _ = self.ray.wait([task.ref], timeout=0)
        return self._result(task) if ready else None

    def _result(self, task: _RayTask, *, cancelled: bool = False) -> int | None:
        """The task's exit status; -1 for a task that failed in Ray (the cause appended to
        the run's log); None for one that ``cancelled`` stopped."""
        try:
            return int(self.ray.get(task.ref))
        except Exception as exc:  # noqa: BLE001 - RayTaskError, WorkerCrashedError, ...
            text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip()  # no terminal colours
            first = text.splitlines()[0] if text else ""
            note = (
                "stopped (compare was interrupted)"
                if cancelled
                else f"the Ray task failed: {type(exc).__name__}: {first}"
            )
            with contextlib.suppress(OSError), open(task.log_path, "a") as log:
                log.write(f"=== marl.compare: {note}\n")
            return None if cancelled else -1

    def stop(self, tasks: list[_RayTask], grace_s: float) -> list[int | None]:
        """Ask the tasks to stop (their stop files: each sends its train process SIGTERM, and
        a checkpoint is written), wait up to ``grace_s`` (plus the tasks' own grace), then
        force-cancel the rest. Should Ray itself hang (its cancel can deadlock), compare exits
        after :data:`RAY_STOP_MARGIN_S` more seconds (:func:`_exit_if_stuck`)."""
        with _exit_if_stuck(grace_s + STOP_GRACE_S + RAY_STOP_MARGIN_S, "stop its tasks"):
            for task in tasks:
                with open(task.stop_path, "w") as fh:
                    fh.write("stop requested by marl.compare\n")
            refs = [task.ref for task in tasks]
            self.ray.wait(refs, num_returns=len(refs), timeout=grace_s + STOP_GRACE_S)
            out: list[int | None] = []
            for task in tasks:
                if self.ray.wait([task.ref], timeout=0)[0]:
                    out.append(self._result(task, cancelled=True))
                else:
                    self.ray.cancel(task.ref, force=True)
                    out.append(None)
        for task in tasks:
            with contextlib.suppress(FileNotFoundError):
                os.remove(task.stop_path)
        return out

    def close(self) -> None:
        if self._owns_ray:
            with _exit_if_stuck(RAY_STOP_MARGIN_S, "shut down"):
                self.ray.shutdown()


#: Seconds past a Ray stop's own deadline (or for ``ray.shutdown``) after which compare stops
#: waiting for Ray and exits (ray.cancel can deadlock: ray-project/ray#47649).
RAY_STOP_MARGIN_S = 30.0


@contextlib.contextmanager
def _exit_if_stuck(seconds: float, what: str) -> Iterator[None]:
    """Exit the process with status 130 if the body has not finished after ``seconds``: the
    last resort when a Ray call never returns after Ctrl-C. Nothing is lost: a local
    cluster's processes die with compare (Ray's fate sharing), their workers' runs then get
    SIGTERM (the parent-death signal) and checkpoint, and the next compare resumes them."""

    def give_up() -> None:
        print(
            f"marl.compare: Ray did not {what} within {seconds:.0f} s; exiting without it. "
            "Runs on a local cluster get SIGTERM as its processes end, and checkpoint; runs on "
            "a remote cluster may go on there (stop them with Ray). Rerun the same command to "
            "resume.",
            file=sys.stderr,
            flush=True,
        )
        os._exit(130)

    timer = threading.Timer(seconds, give_up)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def make_launcher(spec: CompareSpec) -> LocalLauncher | RayLauncher:
    """The launcher ``spec.launcher`` names (a Ray one connects, and sets ``spec.jobs`` from
    the cluster when ``--jobs`` was not given)."""
    if spec.launcher == "ray":
        launcher = RayLauncher(spec.address, spec.cpus_per_run)
        if spec.jobs_from_cluster:
            spec.jobs = launcher.cluster_jobs()
        return launcher
    return LocalLauncher()


def package_root() -> str:
    """The folder holding the ``marl`` package (the checkout's root, or site-packages)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
