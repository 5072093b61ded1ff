"""Compare training variants over seeds in one command, with honest statistics.

::

    python -m marl.compare --algo mappo --config cfg.yaml \\
        --variant baseline:--recipe=baseline --variant calibrated:--recipe=calibrated \\
        --seeds 8 --total-steps 200000 --jobs 2 --out runs/cmp

    python -m marl.compare --study calibration_ladder --seeds 16 --total-steps 1000000 ...
    python -m marl.compare --study whitening --common=--backbone=gru --seeds 16 ...

The parts: :mod:`marl.experiments.spec` (what a study is, checked before anything runs),
:mod:`marl.experiments.launchers` (child processes or Ray tasks), this module (running,
resuming and collecting the runs; the CLI), :mod:`marl.experiments.report` (the summary, its
statistics and decisions from :mod:`marl.experiments.stats` and
:mod:`marl.experiments.significance`, report.md, runs.csv and plots),
:mod:`marl.experiments.marl_eval` (``--export-marl-eval FILE``: the study in marl-eval's JSON
layout).

Every variant x seed is a normal ``python -m marl.train`` run (a subprocess) with
``--run-dir OUT/runs/<variant>/seed_<s>``: the same run-directory format as any training run
(docs/CONTRACTS.md section 4), its output in ``OUT/logs/<variant>/seed_<s>.log``. Up to
``--jobs`` runs at once. Rerunning the same command skips finished runs, resumes interrupted
ones from ``checkpoints/latest.pt`` (``--resume``) and restarts the others (a crashed run is
retried). Then it aggregates (``marl.experiments.stats``: IQM and mean with stratified-bootstrap
CIs, probability of improvement over the reference variant, stability figures) and writes
``summary.json``, ``report.md`` and ``plots/*.png`` (``marl.experiments.report``).

A run is finished when its directory holds ``finished.json``, which marl.train writes last at
the normal end of a run (after eval.json) and removes when a run starts or resumes. eval.json
alone does not count (``python -m marl.evaluate --update-run`` writes it into interrupted runs
too), except for runs trained before the marker existed: those count when they hold eval.json and
OUT/status.json records them as finished (:func:`run_finished`). A train command that exits 0
and leaves eval.json (or the marker) finished.

Launchers: ``--launcher local`` (the default) runs the train commands as child processes of
compare. ``--launcher ray`` runs each as a Ray task (``--cpus-per-run`` CPUs, default 1) on the
cluster at ``--address`` (else ``RAY_ADDRESS``, else a local Ray cluster started for the
compare), with the same bookkeeping, lock, resumption and report: a task runs the same
command, so the results are the same for the same seeds. Up to ``--jobs`` tasks at once
(default: the cluster's CPUs // --cpus-per-run when compare connects); each run gets
``--torch-threads=--cpus-per-run`` (unless the options set it). On a cluster, OUT (and the
working directory) must be on a file system that every node mounts at the same path, with
the same Python environment on every node (or a ``--train-command`` that works there).

Variant options: ``NAME:ARGS`` with ARGS train options separated by commas
(``ti:--whitening=team_individual,--alpha=0.5``), or a YAML file (``--variants FILE``) mapping
name -> list (or comma-separated string) of options. Options given with ``--common`` apply to
every variant (a variant's own options win). Each variant's full option list is validated with
``marl.run.config.parse_cli`` before any run starts; the options compare sets itself (seed, run
directory, budget, algorithm, config file) are refused in variants.

Each run also gets ``--torch-threads=max(1, cores // jobs)`` (unless the options set it) and
``--progress=false --gif=false --baselines=false`` (no progress bar in the logs, no GIF, no
end-of-run baseline episodes; none of them changes a result; ``--verbose-runs`` keeps them).
OUT also holds ``compare.json`` (the setup and how it is reported: a rerun that would mix a
different setup into OUT is refused; ``--report-only --out OUT`` alone regenerates the report
from it), ``runs.csv`` (one row per run: variant, seed, status, commit, env steps, every
endpoint metric), ``status.json`` (state, attempts, exit code, error of every run) and
``compare.lock`` (one compare at a time per OUT). Exit status: 0 when every run finished, 1
when some failed or are missing (they are listed in the report), 2 for bad input, 130 when
interrupted (rerun to resume).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import sys
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from marl.experiments import marl_eval, report
from marl.experiments.launchers import (
    STOP_GRACE_S,
    LocalLauncher,
    RayLauncher,
    make_launcher,
    package_root,
)
from marl.experiments.spec import (
    FINAL_EVAL_EPISODES,
    MANAGED_OPTIONS,
    QUIET_RUN_OPTIONS,
    CompareError,
    CompareSpec,
    RunSpec,
    Variant,
    build_spec,
    check_code,
    check_design,
    cpu_count,
    finished_commits,
    flag_name,
    load_variants_file,
    parse_variant,
    plan_runs,
    split_options,
    validate_spec,
)
from marl.experiments.studies import STUDIES
from marl.run.rundir import FINISHED_MARKER, atomic_write_json, wait_for_run_dir

__all__ = [
    "Variant",
    "CompareSpec",
    "CompareError",
    "RunSpec",
    "MANAGED_OPTIONS",
    "QUIET_RUN_OPTIONS",
    "FINAL_EVAL_EPISODES",
    "parse_variant",
    "load_variants_file",
    "build_spec",
    "validate_spec",
    "check_design",
    "check_code",
    "finished_commits",
    "plan_runs",
    "cpu_count",
    "run_finished",
    "run_state",
    "at_env_steps_dir",
    "LocalLauncher",
    "RayLauncher",
    "STOP_GRACE_S",
    "execute_runs",
    "collect_runs",
    "ReportSettings",
    "explicit_options",
    "recorded_options",
    "report_only_spec",
    "main",
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


def _file_sha256(path: str | None) -> str | None:
    if path is None:
        return None
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        h.update(fh.read())
    return h.hexdigest()


@dataclass
class ReportSettings:
    """How compare reports a study (the options of the same names), recorded in
    OUT/compare.json (``"report"``) so that ``--report-only --out OUT`` regenerates the same
    report without these options."""

    bootstrap_reps: int
    bootstrap_seed: int
    confidence: float
    entropy_threshold: float
    title: str | None
    at_env_steps: list[int]
    """The ``--at-env-steps`` reports to write; compare.json records every one written into
    OUT so far."""
    allow_mixed_code: bool

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ReportSettings:
        return cls(
            bootstrap_reps=args.bootstrap_reps,
            bootstrap_seed=args.bootstrap_seed,
            confidence=args.confidence,
            entropy_threshold=args.entropy_threshold,
            title=args.title,
            at_env_steps=list(args.at_env_steps or []),
            allow_mixed_code=args.allow_mixed_code,
        )


def _spec_record(spec: CompareSpec, report: ReportSettings | None = None) -> dict[str, Any]:
    config_found = spec.config is None or os.path.isfile(spec.config)
    record = {
        "algo": spec.algo,
        "config": spec.config,
        "config_sha256": _file_sha256(spec.config) if config_found else None,
        "total_steps": spec.total_steps,
        "max_time": spec.max_time,
        "max_cpu_time": spec.max_cpu_time,
        "common": spec.common,
        "variants": {v.name: v.args for v in spec.variants},
        "seeds": spec.seeds,
        "reference": spec.reference,
        "study": spec.study,
        "train_command": spec.train_command,
        "final_eval_episodes": spec.final_eval_episodes,
        "primary_metric": spec.primary_metric,
        "comparisons": [list(pair) for pair in spec.comparisons],
        "jobs": spec.jobs,
    }
    if report is not None:
        record["report"] = asdict(report)
    return record


def check_and_store_spec(
    spec: CompareSpec, *, report_only: bool = False, report: ReportSettings | None = None
) -> None:
    """Write OUT/compare.json (the study, and with ``report`` how it is reported); refuse to mix
    results of a different setup into OUT.

    A rerun may add variants or seeds and change the reference, but a variant name whose options
    changed, or a changed algorithm, config file (content), budget or common options, would mix
    incomparable runs: that raises CompareError. The recorded ``--at-env-steps`` reports
    accumulate: OUT keeps every one written.
    """
    os.makedirs(spec.out, exist_ok=True)
    path = os.path.join(spec.out, "compare.json")
    record = _spec_record(spec, report)
    old: dict[str, Any] = {}
    if os.path.isfile(path):
        with open(path) as fh:
            old = json.load(fh)
        keys = ["algo", "config_sha256", "total_steps", "max_time", "max_cpu_time", "common"]
        if report_only:  # nothing runs: keep the setting the runs were trained with
            record["final_eval_episodes"] = old.get("final_eval_episodes")
            if spec.config is not None and record["config_sha256"] is None:
                record["config_sha256"] = old.get("config_sha256")  # the file is gone
        else:
            keys.append("final_eval_episodes")
        for key in keys:
            if old.get(key) != record[key]:
                raise CompareError(
                    f"{path}: this output directory holds runs with {key}={old.get(key)!r}, "
                    f"now {record[key]!r}; use a new --out (or delete the old runs)"
                )
        for name, args in record["variants"].items():
            if name in old.get("variants", {}) and old["variants"][name] != args:
                raise CompareError(
                    f"{path}: variant {name!r} was run with {old['variants'][name]} and is now "
                    f"{args}; rename the variant or use a new --out"
                )
        merged_variants = dict(old.get("variants", {}))
        merged_variants.update(record["variants"])
        record["all_variants_run"] = merged_variants
    if report is not None:
        written = (old.get("report") or {}).get("at_env_steps") or []
        record["report"]["at_env_steps"] = sorted({*written, *report.at_env_steps})
    atomic_write_json(path, record)


def _log_tail(path: str, lines: int = LOG_TAIL_LINES) -> str:
    if not os.path.isfile(path):
        return "(no log file)"
    with open(path, errors="replace") as fh:
        content = fh.read().splitlines()
    return "\n".join(content[-lines:])


def _load_status(out: str) -> dict[str, Any]:
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
    status = _load_status(spec.out)
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
def _exclusive(out: str) -> Iterator[None]:
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
    status = _load_status(spec.out)
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


# ------------------------------------------------------------------------------------------
# --report-only: the study OUT records
# ------------------------------------------------------------------------------------------
#: Options that pick the variants: given with --report-only, they replace the recorded
#: variants, and the reference and comparisons come from them (and the study) as in a run.
_VARIANT_OPTIONS = {"study", "variant", "variants"}
_BUDGET_OPTIONS = {"total_steps", "max_time", "max_cpu_time"}


class _Unset(list):
    """An option's value before parsing (:func:`explicit_options`). A list: an ``append``
    option copies its current value and appends to the copy, so a given option never keeps
    this object."""


def explicit_options(parser: argparse.ArgumentParser, argv: Sequence[str]) -> set[str]:
    """The options (argparse dests) that ``argv`` gives, whatever their values: argparse fills
    in a default only where the namespace it is given lacks the attribute."""
    unset = _Unset()
    dests = vars(parser.parse_args(argv))
    given = parser.parse_args(argv, argparse.Namespace(**dict.fromkeys(dests, unset)))
    return {dest for dest, value in vars(given).items() if value is not unset}


def recorded_options(out: str) -> tuple[dict[str, Any], list[Variant]] | None:
    """The study OUT/compare.json records, as compare's options (argparse dests with the
    values of a CompareSpec / ReportSettings field: seeds and common options as lists,
    comparisons as pairs) and its variants; None when OUT holds no compare.json.

    A compare.json written before compare recorded the report (no ``"report"``) leaves the
    report's settings, reference, seeds and variants to OUT/summary.json, the report it made
    (:func:`_published_options`)."""
    path = os.path.join(out, "compare.json")
    if not os.path.isfile(path):
        return None
    with open(path) as fh:
        record = json.load(fh)
    setup = ("algo", "config", "total_steps", "max_time", "max_cpu_time", "common", "study")
    design = ("seeds", "reference", "primary_metric", "final_eval_episodes", "train_command")
    options: dict[str, Any] = {key: record.get(key) for key in (*setup, *design, "jobs")}
    options["first_seed"] = min(record["seeds"], default=0)
    options["comparison"] = [tuple(pair) for pair in record.get("comparisons") or []]
    variants = [Variant(name, list(args)) for name, args in record["variants"].items()]
    if "report" in record:
        options.update(record["report"])
    else:
        published = _published_options(out, record.get("study"), "comparisons" in record)
        variants = published.pop("variants", variants)
        options.update(published)
    return options, variants


def _published_options(out: str, study: str | None, has_comparisons: bool) -> dict[str, Any]:
    """What OUT/summary.json says its report was made with (for a compare.json that predates
    the recorded report): reference, seeds, variants, jobs, bootstrap, entropy threshold, title
    (None when it is the default one), ``--allow-mixed-code``, the pre-registered comparisons
    (unless compare.json has them) and the ``--at-env-steps`` reports (those its command asked
    for, and the ``at_<N>_env_steps`` directories OUT holds). Empty without a summary.json."""
    path = os.path.join(out, "summary.json")
    if not os.path.isfile(path):
        return {}
    with open(path) as fh:
        s = json.load(fh)
    default_title = f"Study '{study}'" if study else "Comparison of variants"
    options = {
        "reference": s["reference"],
        "seeds": list(s["seeds"]),
        "first_seed": min(s["seeds"], default=0),
        "jobs": s.get("jobs"),
        "variants": [Variant(name, list(v.get("args") or [])) for name, v in s["variants"].items()],
        "title": None if s.get("title") in (None, default_title) else s["title"],
        "allow_mixed_code": any(
            w.startswith("mixed code (--allow-mixed-code)") for w in s.get("warnings") or []
        ),
        "at_env_steps": _published_at_env_steps(out, (s.get("commands") or {}).get("compare")),
    }
    bootstrap = s.get("bootstrap") or {}
    for dest, key in (("bootstrap_reps", "reps"), ("bootstrap_seed", "seed")):
        if key in bootstrap:
            options[dest] = bootstrap[key]
    if "confidence" in bootstrap:
        options["confidence"] = bootstrap["confidence"]
    if "entropy_threshold" in s:
        options["entropy_threshold"] = s["entropy_threshold"]
    if not has_comparisons:
        options["comparison"] = [
            (e["variant"], e["baseline"])
            for e in s.get("comparisons") or []
            if e["baseline"] != s["reference"]
        ]
    return options


def _published_at_env_steps(out: str, command: str | None) -> list[int]:
    """The ``--at-env-steps`` values of a recorded compare ``command`` and of the
    ``at_<N>_env_steps`` directories in OUT, sorted."""
    found: set[int] = set()
    try:
        tokens = shlex.split(command or "")
    except ValueError:
        tokens = []
    for i, token in enumerate(tokens):
        value = token.partition("=")[2] if token.startswith("--at-env-steps=") else None
        if token == "--at-env-steps" and i + 1 < len(tokens):
            value = tokens[i + 1]
        if value is not None and value.isdigit():
            found.add(int(value))
    for name in os.listdir(out):
        match = re.fullmatch(r"at_(\d+)_env_steps", name)
        if match and os.path.isdir(os.path.join(out, name)):
            found.add(int(match.group(1)))
    return sorted(found)


def report_only_spec(
    parser: argparse.ArgumentParser, args: argparse.Namespace, raw_argv: Sequence[str]
) -> tuple[CompareSpec, ReportSettings, bool]:
    """``--report-only``: the study OUT/compare.json records (:func:`recorded_options`), each
    option the command line gives (:func:`explicit_options`) in place of its recorded value;
    returns the spec, the report settings and whether the variants are the recorded ones.

    Given variant options (--study, --variant, --variants) replace the recorded variants, with
    the reference and comparisons they imply. Options that say how the runs trained (algorithm,
    config, budget, common options, final evaluation episodes) must agree with the record
    (CompareError here or in :func:`check_and_store_spec`). Without compare.json: the command
    line alone, as before compare recorded studies."""
    recorded = recorded_options(args.out)
    if recorded is None:
        return build_spec(args), ReportSettings.from_args(args), False
    options, variants = recorded
    given = explicit_options(parser, raw_argv)
    own_variants = not given & _VARIANT_OPTIONS
    recorded_episodes = options.get("final_eval_episodes")
    if "final_eval_episodes" in given and (args.final_eval_episodes or None) != recorded_episodes:
        raise CompareError(
            f"--final-eval-episodes {args.final_eval_episodes}: the runs in {args.out} were "
            f"evaluated with final_eval_episodes={recorded_episodes!r} (compare.json); drop "
            "the option or use a new --out"
        )
    skip = set(given) | {"study", "variant", "variants"}
    if given & _BUDGET_OPTIONS:
        skip |= _BUDGET_OPTIONS
    if not own_variants:
        skip |= {"reference", "comparison"}
    filled = argparse.Namespace(**vars(args))
    for dest, value in options.items():
        if dest not in skip:
            setattr(filled, dest, _as_argument(dest, value))
    if own_variants:  # names only: build_spec checks them; the options are set below
        filled.variant, filled.variants, filled.study = [f"{v.name}:" for v in variants], None, None
    spec = build_spec(filled)
    if own_variants:
        spec.variants, spec.study = variants, options.get("study")
    if "common" not in given:
        spec.common = list(options.get("common") or [])
    if "config" not in given:
        spec.config = options.get("config")
    if not given & {"seeds", "first_seed"} and options.get("seeds"):
        spec.seeds = list(options["seeds"])
    return spec, ReportSettings.from_args(filled), own_variants


def _as_argument(dest: str, value: Any) -> Any:
    """A recorded value as :func:`build_spec` takes it from the command line (seeds: their
    count; common options joined with commas and the config file only where build_spec reads
    them, for a --study's backbone; report_only_spec sets the recorded lists after)."""
    if dest == "seeds":
        return len(value)
    if dest == "common":
        return ",".join(value or [])
    if dest == "config":
        return value if value is not None and os.path.isfile(value) else None
    if dest == "comparison":
        return [f"{a}:{b}" for a, b in value]
    if dest == "train_command":
        return shlex.join(value) if value else None
    if dest == "final_eval_episodes":
        return value or 0
    return value


# ------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    """The ``python -m marl.compare`` argument parser."""
    p = argparse.ArgumentParser(
        prog="python -m marl.compare",
        description="Run variants x seeds as normal training runs, then aggregate with "
        "bootstrap CIs (IQM, mean, probability of improvement) into summary.json, report.md "
        "and plots.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Example: python -m marl.compare --study calibration --seeds 5 "
        "--total-steps 200000 --jobs 2 --out runs/calibration\n"
        "Values that start with '--' need '=': --common=--backbone=gru",
    )
    p.add_argument(
        "--algo",
        default="mappo",
        help="Algorithm: mappo (default), grpo, a registered name or package.module:Class.",
    )
    p.add_argument("--config", default=None, help="YAML train config shared by every run.")
    p.add_argument(
        "--variant",
        action="append",
        metavar="NAME:ARGS",
        help="A variant: NAME, a colon, train options separated by commas "
        "(ti:--whitening=team_individual,--alpha=0.5). Repeatable.",
    )
    p.add_argument(
        "--variants", metavar="FILE", help="YAML file: variant name -> list of train options."
    )
    p.add_argument(
        "--study",
        choices=tuple(STUDIES),
        help="A built-in set of variants (marl.experiments.studies); --variant adds to it.",
    )
    p.add_argument(
        "--common",
        metavar="ARGS",
        help="Train options for every variant, comma-separated (--common=--backbone=gru).",
    )
    p.add_argument(
        "--tasks",
        metavar="P1,P2,...",
        help="Run the comparison once per env preset (small,sparse,hard,memory, ...) in "
        "OUT/<preset>/ (each run gets --env.preset=<preset>), then write a benchmark table "
        "across tasks: OUT/tasks.md (success / solved IQM with 95%% CIs per task, next to the "
        "heuristic and random policies) and OUT/plots/performance_profile.png.",
    )
    p.add_argument("--seeds", type=int, default=5, help="Seeds per variant (default 5).")
    p.add_argument("--first-seed", type=int, default=0, help="Seeds are FIRST..FIRST+K-1.")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--total-steps", type=int, help="Env steps per run.")
    budget.add_argument("--max-time", type=float, help="Wall-clock seconds per run.")
    budget.add_argument(
        "--max-cpu-time",
        type=float,
        help="CPU seconds per run (marl.train --max-cpu-time: the run's own user + system "
        "time). The fair equal-time budget when runs share the cores: with --jobs above the "
        "free cores, --max-time gives each run less work; this does not.",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="Runs at once (default: number of CPU cores; with --launcher ray: the cluster's "
        "CPUs // --cpus-per-run).",
    )
    p.add_argument(
        "--launcher",
        choices=("local", "ray"),
        default="local",
        help="Where the runs train: 'local' child processes (default) or 'ray' tasks on a Ray "
        "cluster (pip install 'coopsearch[ray]'). Same bookkeeping, resumption and results.",
    )
    p.add_argument(
        "--address",
        default=None,
        metavar="ADDR",
        help="--launcher ray: the cluster to use (ray.init's address: 'auto', 'HOST:6379', "
        "'ray://HOST:10001'); default: RAY_ADDRESS, else a local Ray cluster on this machine.",
    )
    p.add_argument(
        "--cpus-per-run",
        type=float,
        default=1.0,
        metavar="N",
        help="--launcher ray: CPUs each run's task requests (default 1); the run's torch "
        "threads follow it unless --torch-threads or the options set them.",
    )
    p.add_argument("--out", required=True, help="Output directory.")
    p.add_argument(
        "--reference", help="Variant the others are compared with (default: study's or first)."
    )
    p.add_argument(
        "--bootstrap-reps", type=int, default=2000, help="Bootstrap resamples (default 2000)."
    )
    p.add_argument("--bootstrap-seed", type=int, default=0, help="Seed of the bootstrap.")
    p.add_argument("--confidence", type=float, default=0.95, help="CI level (default 0.95).")
    p.add_argument(
        "--entropy-threshold",
        type=float,
        default=0.1,
        help="Entropy collapse: first update with policy entropy below this (nats; default 0.1).",
    )
    p.add_argument(
        "--torch-threads",
        type=int,
        default=None,
        help="torch threads per run (default: cores // jobs, at least 1).",
    )
    p.add_argument("--title", help="Report title (default from the study / variants).")
    p.add_argument(
        "--report-only",
        action="store_true",
        help="Start no run: report what OUT holds (unfinished runs listed as missing). "
        "'--report-only --out OUT' alone regenerates OUT's report: the study (algorithm, "
        "variants, seeds, budget, reference, comparisons, primary metric) and its report "
        "settings (bootstrap, confidence, entropy threshold, title, --at-env-steps reports) "
        "come from OUT/compare.json; options given replace them (those saying how the runs "
        "trained must agree with it).",
    )
    p.add_argument(
        "--at-env-steps",
        type=int,
        action="append",
        metavar="N",
        help="Also score the runs at N env steps (repeatable): each run's validation "
        "evaluation logged last at or before N (runs evaluate every --eval-every updates) "
        "instead of its final eval.json, curves up to N; runs that stopped earlier are left "
        "out. Written to OUT/at_<N>_env_steps/ (OUT's own report is unchanged). Compares "
        "time-budgeted runs at equal samples when nothing is scheduled over the budget "
        "(constant learning rate and entropy coefficient, the defaults).",
    )
    protocol = p.add_argument_group(
        "study protocol",
        "Every comparison of a variant with the reference on the primary metric, plus the "
        "--comparison pairs, is a primary comparison: it gets a permutation-test p-value "
        "(paired by seed), Holm-adjusted over all of them (p_holm), and is 'shown' only when "
        "p_holm < 0.05 and the bootstrap CI of P(improvement) agrees. Other metrics are "
        "exploratory.",
    )
    protocol.add_argument(
        "--primary-metric",
        default=None,
        help="The metric of the primary comparisons: success_rate (the final evaluation, the "
        "default when runs report it), success_rate_last5 (mean of the last 5 periodic "
        "evaluations), solved_rate, solved_rate_last5, mean_return (the default otherwise), "
        "auc_success.",
    )
    protocol.add_argument(
        "--comparison",
        action="append",
        metavar="A:B",
        help="A pre-registered primary comparison beyond each variant vs the reference: does "
        "variant A beat variant B? Repeatable.",
    )
    protocol.add_argument(
        "--final-eval-episodes",
        type=int,
        default=FINAL_EVAL_EPISODES,
        metavar="N",
        help=f"Validation episodes of every run's final evaluation, the primary endpoint "
        f"(default {FINAL_EVAL_EPISODES}; 0: the runs' own --eval-episodes).",
    )
    p.add_argument(
        "--seeds-per-process",
        type=int,
        default=1,
        metavar="S",
        help="Train up to S seeds of a variant in one process (marl.train --seeds: one "
        "batched rollout and update; seed k's results equal a batch of one bit for bit). "
        "Needs --total-steps (mappo or grpo). A resumed run continues alone. Default 1: a process "
        "per run: on two cores batching gained too little and too unevenly across backbones to "
        "change it (BENCHMARKS.md, 'Many seeds at once').",
    )
    protocol.add_argument(
        "--pilot",
        action="store_true",
        help="Run a design that cannot show anything (too few seeds for its number of "
        "comparisons): compare refuses it otherwise, saying how many seeds it needs.",
    )
    protocol.add_argument(
        "--allow-mixed-code",
        action="store_true",
        help="Aggregate (and add to) runs trained at different git commits; the report says "
        "so. Without it compare refuses.",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="Validate and print the run commands; run nothing."
    )
    p.add_argument("--no-progress", action="store_true", help="No tqdm progress bar.")
    p.add_argument("--no-plots", action="store_true", help="Skip the PNG plots.")
    p.add_argument(
        "--export-marl-eval",
        metavar="FILE",
        help="Also write the study to FILE in marl-eval's JSON layout (environment / task / "
        "algorithm = variant / run_<seed> / step_<k> = the k-th periodic validation "
        "evaluation, absolute_metrics = the final one), for marl_eval's data_process_pipeline "
        "and create_matrices_for_rliable. The runs record each evaluation's mean, not its "
        "episodes: every metric's list holds that one mean. Works with --report-only.",
    )
    p.add_argument(
        "--verbose-runs",
        action="store_true",
        help=f"Do not add {' '.join(QUIET_RUN_OPTIONS)} to the runs.",
    )
    p.add_argument(
        "--train-command",
        help="Command that trains one run, instead of 'python -m marl.train' (e.g. "
        "'torchrun --nproc-per-node 2 -m marl.train'); it receives the train options.",
    )
    p.add_argument(
        "--no-validate",
        action="store_true",
        help="Skip marl.run.config.parse_cli validation (only for a --train-command that does "
        "not take marl.run.train's options).",
    )
    return p


def at_env_steps_dir(out: str, env_steps: int) -> str:
    """Where ``--at-env-steps N`` writes its report: ``OUT/at_<N>_env_steps``."""
    return os.path.join(out, f"at_{env_steps}_env_steps")


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit code (0: all runs finished, 1: some failed/missing)."""
    raw_argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(raw_argv)
    if args.tasks is not None:
        return _main_tasks(parser, args, raw_argv)
    try:
        spec, settings, design_problem = _checked_setup(parser, args, raw_argv)
        runs = plan_runs(spec)
        if args.dry_run:
            status = _load_status(spec.out)
            for run in runs:
                command = shlex.join(spec.train_command + run.train_args)
                print(f"{run.key} [{run_state(run, status)}]: {command}")
            return 0
        check_and_store_spec(spec, report_only=args.report_only, report=settings)
        if not args.report_only:
            check_code(spec)
    except CompareError as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    if design_problem is not None:
        print(f"warning: pilot: {design_problem}", file=sys.stderr)
    if spec.total_steps is None:
        print(
            "warning: the budget is not in env steps: arms get different amounts of work "
            "(use --total-steps for a study; env steps per arm are in the report)",
            file=sys.stderr,
        )
    if len(spec.seeds) < 2:
        print(
            f"warning: --seeds {len(spec.seeds)}: fewer than 2 seeds give point estimates "
            "without confidence intervals",
            file=sys.stderr,
        )
    t0 = time.time()
    if not args.report_only:
        try:
            with _exclusive(spec.out):
                execute_runs(spec, runs, progress=not args.no_progress)
        except KeyboardInterrupt:
            print(
                "interrupted: running runs stopped; rerun the same command to resume",
                file=sys.stderr,
            )
            return 130
        except CompareError as exc:
            parser.exit(2, f"{parser.prog}: error: {exc}\n")
    records = collect_runs(spec, runs)
    for at_env_steps in [None, *settings.at_env_steps]:
        _write_report(parser, args, raw_argv, spec, settings, records, design_problem,
                      at_env_steps=at_env_steps, wall_s=time.time() - t0)  # fmt: skip
    n_bad = sum(r["status"] != "finished" for r in records)
    return 1 if n_bad else 0


def _checked_setup(
    parser: argparse.ArgumentParser, args: argparse.Namespace, raw_argv: list[str]
) -> tuple[CompareSpec, ReportSettings, str | None]:
    """The study, how to report it (with ``--report-only``: what OUT records, under the
    options given; :func:`report_only_spec`), and why its design cannot show anything (None
    when it can). Raises CompareError for bad input or a design that cannot show anything
    (unless ``--pilot``, ``--report-only`` or ``--dry-run``)."""
    recorded_variants = False
    if args.report_only:
        spec, settings, recorded_variants = report_only_spec(parser, args, raw_argv)
    else:
        spec, settings = build_spec(args), ReportSettings.from_args(args)
    if args.no_validate and not args.train_command:
        raise CompareError("--no-validate is only allowed with --train-command")
    if not (args.no_validate or recorded_variants):  # recorded: validated when they trained
        validate_spec(spec, allow_one_configuration=args.report_only)
    if settings.bootstrap_reps < 1:
        raise CompareError(f"--bootstrap-reps must be >= 1, got {settings.bootstrap_reps}")
    if not 0.0 < settings.confidence < 1.0:
        raise CompareError(f"--confidence must be in (0, 1), got {settings.confidence}")
    for n in settings.at_env_steps:
        if n < 1:
            raise CompareError(f"--at-env-steps must be a positive number of env steps, got {n}")
    if spec.primary_metric is not None and spec.primary_metric not in report.METRICS:
        raise CompareError(
            f"--primary-metric {spec.primary_metric!r}: allowed: " + ", ".join(report.METRICS)
        )
    missing = report.stats.check_dependencies()
    if missing is not None and not args.dry_run:
        raise CompareError(missing)
    design_problem = check_design(spec)
    if design_problem is not None and not (args.pilot or args.report_only or args.dry_run):
        raise CompareError(design_problem)
    return spec, settings, design_problem


def _write_report(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    raw_argv: list[str],
    spec: CompareSpec,
    settings: ReportSettings,
    records: list[dict[str, Any]],
    design_problem: str | None,
    *,
    at_env_steps: int | None,
    wall_s: float,
) -> None:
    """Write the report (summary.json, report.md, runs.csv, plots) into OUT, or scored at
    ``at_env_steps`` into :func:`at_env_steps_dir`; with ``--export-marl-eval FILE`` OUT's own
    report also goes to FILE in marl-eval's layout. Exits 2 when the runs cannot be reported
    (mixed code, a primary metric they do not report, an export marl-eval cannot take)."""
    try:
        summary = report.build_summary(
            spec,
            records,
            reps=settings.bootstrap_reps,
            seed=settings.bootstrap_seed,
            confidence=settings.confidence,
            entropy_threshold=settings.entropy_threshold,
            command=shlex.join(["python", "-m", "marl.compare", *raw_argv]),
            wall_s=wall_s,
            title=settings.title,
            at_env_steps=at_env_steps,
        )
    except ValueError as exc:  # mixed code, a primary metric the runs do not report
        parser.exit(2, f"{parser.prog}: error: {exc} (the runs in {spec.out} are kept)\n")
    if design_problem is not None:
        summary["warnings"].insert(0, f"pilot: {design_problem}")
        summary["pilot"] = True
    if spec.total_steps is None:
        summary["warnings"].append(
            "the budget is in seconds, not env steps: the arms did different amounts of "
            "work (env steps and throughput per variant are in the report)"
        )
    out = spec.out if at_env_steps is None else at_env_steps_dir(spec.out, at_env_steps)
    report.write_all(summary, out, plots=not args.no_plots)
    for warning in summary["warnings"]:
        print(f"warning: {warning}", file=sys.stderr)
    print(f"report: {os.path.join(out, 'report.md')}")
    print(f"summary: {os.path.join(out, 'summary.json')}")
    if args.export_marl_eval and at_env_steps is None:
        try:
            notes = marl_eval.write_export(args.export_marl_eval, summary, spec.out)
        except ValueError as exc:
            parser.exit(2, f"{parser.prog}: error: --export-marl-eval: {exc}\n")
        for note in notes:
            print(f"note: marl-eval export: {note}", file=sys.stderr)
        print(f"marl-eval: {args.export_marl_eval}")


def _main_tasks(
    parser: argparse.ArgumentParser, args: argparse.Namespace, raw_argv: list[str]
) -> int:
    """``--tasks``: one comparison per preset in OUT/<preset>/, then the table across tasks."""
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if not tasks or len(set(tasks)) != len(tasks):
        parser.exit(
            2, f"{parser.prog}: error: --tasks needs distinct preset names, got {args.tasks!r}\n"
        )
    common = split_options(args.common or "", "--common")
    if any(flag_name(a) == "--env.preset" for a in common):
        parser.exit(
            2, f"{parser.prog}: error: --tasks sets --env.preset; remove it from --common\n"
        )
    rest = _strip_option(raw_argv, "--tasks")
    rest = _strip_option(_strip_option(rest, "--out"), "--common")
    worst = 0
    for task in tasks:
        task_common = ",".join([*common, f"--env.preset={task}"])
        argv = [*rest, f"--out={os.path.join(args.out, task)}", f"--common={task_common}"]
        print(f"== task {task}: python -m marl.compare {shlex.join(argv)}", flush=True)
        worst = max(worst, main(argv))
        if worst == 2:  # a usage error: the other tasks would fail the same way
            return worst
    if args.dry_run:
        return 0
    from marl.experiments.tasks import write_task_table  # matplotlib and the task baselines

    write_task_table(args.out, tasks, plots=not args.no_plots)
    return worst


def _strip_option(argv: list[str], flag: str) -> list[str]:
    """``argv`` without ``flag`` (as ``flag=V`` or ``flag V``)."""
    out, skip = [], False
    for i, token in enumerate(argv):
        if skip:
            skip = False
            continue
        if token == flag:
            skip = i + 1 < len(argv)
            continue
        if token.startswith(flag + "="):
            continue
        out.append(token)
    return out


if __name__ == "__main__":
    sys.exit(main())
