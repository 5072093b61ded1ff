"""Running, resuming and collecting the runs of a ``python -m marl.compare`` study.

Every variant x seed is a ``python -m marl.train`` run in ``OUT/runs/<variant>/seed_<s>``:
:func:`run_state` says whether it is finished, resumable, partial or new; :func:`execute_runs`
trains the unfinished ones, up to ``spec.jobs`` at once, with a launcher of
:mod:`marl.experiments.launchers` (a process per run, or per ``--seeds-per-process`` batch:
:func:`process_groups`), recording each in ``OUT/status.json``; :func:`collect_runs` turns them
into the report's records. :func:`exclusive_lock` keeps two compares off one OUT. The CLI that
drives them is :mod:`marl.experiments.compare`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import sys
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from marl.experiments.launchers import (
    STOP_GRACE_S,
    LocalLauncher,
    RayLauncher,
    make_launcher,
    package_root,
)
from marl.experiments.spec import CompareError, CompareSpec, RunSpec, flag_name
from marl.run.rundir import FINISHED_MARKER, atomic_write_json, wait_for_run_dir

__all__ = [
    "LOG_TAIL_LINES",
    "run_finished",
    "run_state",
    "load_status",
    "process_groups",
    "batch_train_args",
    "execute_runs",
    "exclusive_lock",
    "collect_runs",
]

#: Lines of a failed run's log quoted in status.json and the report.
LOG_TAIL_LINES = 25


def run_finished(run_dir: str, recorded: dict[str, Any] | None = None) -> bool:
    """Whether the run in ``run_dir`` trained to its end: it holds ``finished.json``
    (:data:`marl.run.rundir.FINISHED_MARKER`, written last by marl.train). A run trained before
    the marker existed counts when it holds ``eval.json`` and ``recorded`` (its status.json
    entry) says a compare saw it finish. eval.json alone is not enough: ``python -m
    marl.evaluate --update-run`` writes it into interrupted runs too. A seed of a ``--seeds``
    batch that stopped on a non-finite value has a finished.json saying ``"stopped"``: not
    finished (a single-seed run that stops so writes none)."""
    marker = os.path.join(run_dir, FINISHED_MARKER)
    if os.path.isfile(marker):
        try:
            with open(marker) as fh:
                return "stopped" not in json.load(fh)
        except (OSError, ValueError):
            return True  # a damaged marker still marks a run that trained to its end
    legacy = (recorded or {}).get("state") == "finished"
    return legacy and os.path.isfile(os.path.join(run_dir, "eval.json"))


def run_state(run: RunSpec, status: dict[str, Any] | None = None) -> str:
    """``finished`` (:func:`run_finished`; ``status``: the status.json mapping), ``resumable``
    (a checkpoint), ``partial`` (a directory without checkpoint: restarted from scratch) or
    ``new``."""
    if run_finished(run.run_dir, (status or {}).get(run.key)):
        return "finished"
    if os.path.isfile(os.path.join(run.run_dir, "checkpoints", "latest.pt")):
        return "resumable"
    if os.path.isdir(run.run_dir):
        return "partial"
    return "new"


def _log_tail(path: str, lines: int = LOG_TAIL_LINES) -> str:
    if not os.path.isfile(path):
        return "(no log file)"
    with open(path, errors="replace") as fh:
        content = fh.read().splitlines()
    return "\n".join(content[-lines:])


def load_status(out: str) -> dict[str, Any]:
    """OUT/status.json: each run's state, attempts, exit code and error ({} before any run)."""
    path = os.path.join(out, "status.json")
    if os.path.isfile(path):
        with open(path) as fh:
            return json.load(fh)
    return {}


@dataclass
class _Active:
    runs: list[RunSpec]  # the runs one process trains (several: a --seeds batch)
    handle: Any  # the launcher's handle of the running train command
    started: float
    mode: str
    log_path: str


def process_groups(
    spec: CompareSpec, runs: list[RunSpec], states: list[str]
) -> list[list[RunSpec]]:
    """The pending ``runs`` (seed-major, with their ``states``) as the processes that train
    them: one run each, or with ``spec.seeds_per_process`` S > 1 the new (or partial) runs
    of a variant in batches of up to S consecutive seeds, batch c of every variant before
    batch c + 1 (interleaved as the runs are); a resumable run continues alone."""
    S = spec.seeds_per_process
    if S <= 1:
        return [[run] for run in runs]
    alone = [run for run, state in zip(runs, states, strict=True) if state == "resumable"]
    fresh: dict[str, list[RunSpec]] = {}
    for run, state in zip(runs, states, strict=True):
        if state != "resumable":
            fresh.setdefault(run.variant, []).append(run)
    batches: list[list[RunSpec]] = []
    for c in range(max((len(v) for v in fresh.values()), default=0)):
        for variant_runs in fresh.values():
            chunk = variant_runs[c * S : (c + 1) * S]
            if chunk:
                batches.append(chunk)
    return [[run] for run in alone] + batches


def batch_train_args(runs: list[RunSpec]) -> list[str]:
    """The train options of one process training ``runs`` (one variant) as a seed batch: the
    runs' options without ``--seed`` / ``--run-dir``, then ``--seeds`` and the variant's
    directory."""
    keep = [a for a in runs[0].train_args if flag_name(a) not in ("--seed", "--run-dir")]
    seeds = ",".join(str(run.seed) for run in runs)
    return keep + [f"--seeds={seeds}", f"--run-dir={os.path.dirname(runs[0].run_dir)}"]


def execute_runs(
    spec: CompareSpec,
    runs: list[RunSpec],
    *,
    progress: bool = True,
    poll_s: float = 0.2,
    launcher: LocalLauncher | RayLauncher | None = None,
) -> dict[str, Any]:
    """Run the unfinished runs, up to ``spec.jobs`` at once, with ``launcher`` (default
    :func:`make_launcher`, closed at the end); returns the status mapping.

    The status (OUT/status.json, rewritten after every change) maps ``variant/seed_S`` to
    ``{"state", "returncode", "wall_s", "attempts", "mode", "command", "error"}`` where state
    is ``finished`` or ``failed`` (a run that exited non-zero or without eval.json; ``error``
    holds the tail of its log). Ctrl-C / SIGTERM stops the running runs and re-raises
    KeyboardInterrupt.
    """
    status = load_status(spec.out)
    finished_before = 0
    pending_runs: list[RunSpec] = []
    for run in runs:
        if run_state(run, status) == "finished":
            finished_before += 1
            entry = status.setdefault(run.key, {})
            entry.update(state="finished", command=entry.get("command") or None)
        else:
            pending_runs.append(run)
    states = [run_state(run, status) for run in pending_runs]
    pending = deque(process_groups(spec, pending_runs, states))
    atomic_write_json(os.path.join(spec.out, "status.json"), status)
    if not pending:
        return status
    own_launcher = launcher is None
    launcher = make_launcher(spec) if launcher is None else launcher
    pool = _RunPool(spec, status, launcher, total=len(runs), done=finished_before,
                    progress=progress)  # fmt: skip
    try:
        pool.run(pending, poll_s)
    finally:
        if own_launcher:
            launcher.close()
    return status


class _RunPool:
    """The train processes of one :func:`execute_runs`: :meth:`start` one (a run, or a batch of
    seeds), :meth:`finish` it when its process exits, :meth:`stop_all` on Ctrl-C / SIGTERM;
    every change is written to OUT/status.json at once."""

    def __init__(
        self,
        spec: CompareSpec,
        status: dict[str, Any],
        launcher: LocalLauncher | RayLauncher,
        *,
        total: int,
        done: int,
        progress: bool,
    ) -> None:
        from tqdm import tqdm

        self.spec, self.status, self.launcher, self.progress = spec, status, launcher, progress
        self.status_path = os.path.join(spec.out, "status.json")
        pythonpath = os.environ.get("PYTHONPATH", "")
        self.env = {"PYTHONPATH": package_root() + (os.pathsep + pythonpath if pythonpath else "")}
        self.active: list[_Active] = []
        self.pending: deque[list[RunSpec]] = deque()
        self.failed = 0
        self.bar = tqdm(total=total, initial=done, desc="runs", unit="run",
                        disable=not progress, dynamic_ncols=True)  # fmt: skip

    def run(self, pending: deque[list[RunSpec]], poll_s: float) -> None:
        """Keep ``spec.jobs`` processes busy until ``pending`` is empty and every process has
        exited. Ctrl-C and SIGTERM raise KeyboardInterrupt, and are remembered: Ray may
        swallow the exception when the signal lands inside one of its calls, and the loop
        checks the flag."""
        self.pending = pending
        stop_signals: list[int] = []

        def on_signal(signum: int, frame: Any) -> None:
            stop_signals.append(signum)
            raise KeyboardInterrupt(f"signal {signum}")

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            self._postfix()
            while self.pending or self.active:
                if stop_signals:
                    raise KeyboardInterrupt(f"signal {stop_signals[0]}")
                while self.pending and len(self.active) < self.spec.jobs:
                    self.active.append(self.start(self.pending.popleft()))
                    self._postfix()
                time.sleep(poll_s)
                for item in list(self.active):
                    rc = self.launcher.poll(item.handle)
                    if rc is not None:
                        self.active.remove(item)
                        self.finish(item, rc)
                        self._postfix()
        except KeyboardInterrupt:
            self.stop_all()
            self.bar.close()
            raise
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        self.bar.close()

    def start(self, group: list[RunSpec]) -> _Active:
        """Start the process that trains ``group`` (resuming, restarting or starting it)."""
        for run in group:
            # a run orphaned by a killed compare may still be finishing its update and
            # writing its checkpoint (it holds RUN_DIR/.lock): wait for it, then resume
            wait_for_run_dir(
                run.run_dir,
                on_wait=lambda run=run: print(
                    f"waiting for {run.key}: a previous process still writes {run.run_dir}",
                    file=sys.stderr,
                    flush=True,
                ),
            )
        argv, mode, log_path = self._command_line(group)
        run = group[0]
        os.makedirs(os.path.dirname(log_path), exist_ok=True)
        os.makedirs(os.path.dirname(run.run_dir), exist_ok=True)
        command = self.spec.train_command + argv
        with open(log_path, "a") as log:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            log.write(f"=== marl.compare {mode} {stamp}: {shlex.join(command)}\n")
        handle = self.launcher.start(command, self._child_env(argv), log_path)
        for member in group:
            entry = self.status.setdefault(member.key, {})
            entry.update(
                state="running",
                mode=mode,
                command=shlex.join(command),
                attempts=int(entry.get("attempts", 0)) + 1,
                log=os.path.relpath(log_path, self.spec.out),
                launcher=self.launcher.name,
            )
        atomic_write_json(self.status_path, self.status)
        return _Active(group, handle, time.monotonic(), mode, log_path)

    def _command_line(self, group: list[RunSpec]) -> tuple[list[str], str, str]:
        """The train arguments, the mode (start / restart / resume) and the log of ``group``;
        a partial run's directory is removed before it restarts."""
        run = group[0]
        state = run_state(run, self.status)
        argv, log_path = list(run.train_args), run.log_path
        if state == "resumable":
            return [*argv, f"--resume={run.run_dir}"], "resume", log_path
        mode = "restart" if state == "partial" else "start"
        for member in group:
            if run_state(member, self.status) == "partial":
                shutil.rmtree(member.run_dir)
        if len(group) > 1:
            mode = f"{mode} (seeds {','.join(str(r.seed) for r in group)} in one process)"
            argv = batch_train_args(group)
            log_path = os.path.join(
                os.path.dirname(run.log_path), f"seeds_{group[0].seed}-{group[-1].seed}.log"
            )
        return argv, mode, log_path

    def _child_env(self, argv: list[str]) -> dict[str, str]:
        """The child's extra environment: PYTHONPATH, and with ``--torch-threads=N`` the
        OpenMP / MKL thread counts."""
        m = [a for a in argv if flag_name(a) == "--torch-threads"]
        if m and "=" in m[-1]:
            n = m[-1].split("=", 1)[1]
            if n.isdigit() and int(n) > 0:
                return {**self.env, "OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n}
        return self.env

    def finish(self, item: _Active, returncode: int) -> None:
        """Record the exit of ``item``'s process: each of its runs finished or failed."""
        wall = time.monotonic() - item.started
        for run in item.runs:
            entry = self.status[run.key]
            entry.update(returncode=returncode, wall_s=round(wall, 3))
            # exit 0 is a finished run (marl.train's contract); the marker or eval.json shows
            # it trained here (a --train-command may not write the marker; a seed of a batch
            # that stopped on a non-finite value has a marker saying so: not finished)
            done = run_finished(run.run_dir, {"state": "finished"})
            if returncode == 0 and done:
                entry.update(state="finished", error=None)
                msg = f"done   {run.key} ({item.mode}) in {wall:.1f}s"
            else:
                self.failed += 1
                reason = (
                    f"exit code {returncode}"
                    if returncode != 0
                    else "exit code 0 but not finished (no eval.json, or stopped)"
                )
                entry.update(state="failed", error=f"{reason}\n{_log_tail(item.log_path)}")
                msg = f"FAILED {run.key} ({reason}); log: {item.log_path}"
            self.bar.update(1)
            if self.progress:
                self.bar.write(msg)
            else:
                print(msg, file=sys.stderr, flush=True)
        atomic_write_json(self.status_path, self.status)

    def stop_all(self) -> None:
        """Stop every running process (recorded as interrupted first: a launcher that never
        returns may end compare), then record their exit codes."""
        for item in self.active:
            for run in item.runs:
                self.status[run.key].update(state="interrupted", returncode=None)
        atomic_write_json(self.status_path, self.status)
        codes = self.launcher.stop([item.handle for item in self.active], STOP_GRACE_S)
        for item, code in zip(self.active, codes, strict=True):
            for run in item.runs:
                self.status[run.key].update(returncode=code)
        atomic_write_json(self.status_path, self.status)

    def _postfix(self) -> None:
        self.bar.set_postfix(
            running=len(self.active), left=len(self.pending), failed=self.failed, refresh=True
        )


@contextlib.contextmanager
def exclusive_lock(out: str) -> Iterator[None]:
    """Hold an exclusive lock on OUT/compare.lock (released even if compare is killed), so
    that two compares never run the same runs at once."""
    path = os.path.join(out, "compare.lock")
    with open(path, "w") as fh:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX: no locking
            yield
            return
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise CompareError(
                f"another marl.compare is running on {out} (lock {path} is held); wait for it "
                "or use a different --out"
            ) from None
        fh.write(f"{os.getpid()}\n")
        fh.flush()
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _run_commits(run_dir: str) -> list[str]:
    """The git commits a finished run trained under (its finished.json; several when it
    resumed under another), [] when it records none."""
    try:
        with open(os.path.join(run_dir, FINISHED_MARKER)) as fh:
            marker = json.load(fh)
    except (OSError, ValueError):
        return []
    if not isinstance(marker, dict):
        return []
    commits = marker.get("commits") or ([marker["commit"]] if marker.get("commit") else [])
    return [str(commit) for commit in commits]


def collect_runs(spec: CompareSpec, runs: list[RunSpec]) -> list[dict[str, Any]]:
    """One record per run for the report: state, error (log tail), command, timing, and a
    finished run's commits."""
    status = load_status(spec.out)
    records = []
    for run in runs:
        entry = status.get(run.key, {})
        state = run_state(run, status)
        if state == "finished":
            final = "finished"
        elif entry.get("state") == "failed":
            final = "failed"
        else:
            final = "missing"  # never run, or interrupted
        records.append(
            {
                "variant": run.variant,
                "seed": run.seed,
                "run_dir": run.run_dir,
                "log": os.path.relpath(run.log_path, spec.out),
                "status": final,
                "error": entry.get("error") if final == "failed" else None,
                "command": entry.get("command") or shlex.join(spec.train_command + run.train_args),
                "returncode": entry.get("returncode"),
                "wall_s": entry.get("wall_s"),
                "attempts": entry.get("attempts", 0),
                "commits": _run_commits(run.run_dir) if final == "finished" else [],
            }
        )
    return records
