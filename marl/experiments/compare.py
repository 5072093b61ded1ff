"""Compare training variants over seeds in one command, with honest statistics.

::

    python -m marl.compare --algo mappo --config cfg.yaml \\
        --variant baseline:--recipe=baseline --variant calibrated:--recipe=calibrated \\
        --seeds 5 --total-steps 200000 --jobs 2 --out runs/cmp

    python -m marl.compare --study calibration --seeds 5 --max-time 600 --out runs/calib
    python -m marl.compare --study whitening --common=--backbone=gru --seeds 5 ...

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
alone does not count (``python -m marl.evaluate`` writes it into interrupted runs too), except
for runs trained before the marker existed: those count when they hold eval.json and
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
OUT also holds ``compare.json`` (the setup: a rerun that would mix a different setup into OUT
is refused), ``status.json`` (state, attempts, exit code, error of every run) and
``compare.lock`` (one compare at a time per OUT). Exit status: 0 when every run finished, 1
when some failed or are missing (they are listed in the report), 2 for bad input, 130 when
interrupted (rerun to resume).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from marl.experiments.studies import STUDIES
from marl.run.checkpoint import wait_for_run_dir
from marl.run.train import FINISHED_MARKER

__all__ = [
    "Variant",
    "CompareSpec",
    "RunSpec",
    "parse_variant",
    "load_variants_file",
    "build_spec",
    "validate_spec",
    "check_design",
    "check_code",
    "plan_runs",
    "run_finished",
    "run_state",
    "at_env_steps_dir",
    "LocalLauncher",
    "RayLauncher",
    "execute_runs",
    "collect_runs",
    "main",
]

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")

#: Train options that compare sets for every run; a variant may not set them.
MANAGED_OPTIONS = {
    "--seed": "set by --seeds / --first-seed",
    "--run-dir": "set by compare (OUT/runs/NAME/seed_S)",
    "--resume": "set by compare when resuming an interrupted run",
    "--total-steps": "the budget is the same for every run: use compare's --total-steps",
    "--max-time": "the budget is the same for every run: use compare's --max-time",
    "--max-cpu-time": "the budget is the same for every run: use compare's --max-cpu-time",
    "--algo": "set by compare's --algo",
    "--config": "set by compare's --config",
    "--overwrite": "compare resumes interrupted runs; it never overwrites one (use a new --out)",
    "--final-eval-episodes": "the endpoint is the same for every run: use compare's "
    "--final-eval-episodes",
}

#: Validation episodes of each run's final evaluation (eval.json): the primary endpoint.
FINAL_EVAL_EPISODES = 128

#: Options added to every run that change no result, only what a run prints and writes
#: (no progress bar in the log files, no GIF, no end-of-run baseline episodes).
QUIET_RUN_OPTIONS = ["--progress=false", "--gif=false", "--baselines=false"]

LOG_TAIL_LINES = 25
#: Seconds a run gets to checkpoint and exit after compare is interrupted.
STOP_GRACE_S = 30.0
#: The error of --launcher ray without the ray package.
RAY_MISSING = (
    "--launcher ray needs the ray package, which is not installed: pip install "
    "'coopsearch[ray]' (or pip install 'ray>=2.9')"
)


class CompareError(ValueError):
    """Invalid compare input (variants, options, budget, output directory)."""


@dataclass
class Variant:
    """A named list of train options, e.g. ``Variant("ti", ["--alpha=0.5"])``."""

    name: str
    args: list[str]


@dataclass
class CompareSpec:
    """Everything that defines a comparison (stored as OUT/compare.json)."""

    algo: str
    config: str | None
    variants: list[Variant]
    seeds: list[int]
    out: str
    reference: str
    total_steps: int | None = None
    max_time: float | None = None
    max_cpu_time: float | None = None
    common: list[str] = field(default_factory=list)
    jobs: int = 1
    train_command: list[str] = field(default_factory=lambda: [sys.executable, "-m", "marl.train"])
    quiet_runs: bool = True
    torch_threads: int | None = None
    study: str | None = None
    launcher: str = "local"
    """``local`` (child processes) or ``ray`` (Ray tasks)."""
    address: str | None = None
    """Ray cluster address (``--address``); None: ``RAY_ADDRESS``, else a local cluster."""
    cpus_per_run: float = 1.0
    """CPUs each Ray task requests."""
    jobs_from_cluster: bool = False
    """``jobs`` is provisional: set from the Ray cluster's CPUs when compare connects."""
    final_eval_episodes: int | None = FINAL_EVAL_EPISODES
    """Validation episodes of each run's final evaluation (None: the runs' own setting)."""
    primary_metric: str | None = None
    """The metric of the primary comparisons (None: success_rate, else mean_return)."""
    comparisons: list[tuple[str, str]] = field(default_factory=list)
    """Pre-registered primary comparisons beyond each variant vs the reference: (A, B) asks
    whether A beats B."""
    allow_mixed_code: bool = False
    """Aggregate runs of different git commits (the report says so)."""
    pilot: bool = False
    """Run a design that cannot show anything (too few seeds for its comparisons)."""

    def primary_comparisons(self) -> list[tuple[str, str]]:
        """Every variant vs the reference, then the extra pre-registered pairs (deduplicated)."""
        pairs = [(v.name, self.reference) for v in self.variants if v.name != self.reference]
        for pair in self.comparisons:
            if tuple(pair) not in pairs:
                pairs.append((pair[0], pair[1]))
        return pairs

    def budget_args(self) -> list[str]:
        """The per-run budget as train options."""
        args = []
        if self.total_steps is not None:
            args.append(f"--total-steps={self.total_steps}")
        if self.max_time is not None:
            args.append(f"--max-time={self.max_time:g}")
        if self.max_cpu_time is not None:
            args.append(f"--max-cpu-time={self.max_cpu_time:g}")
        return args

    def base_args(self) -> list[str]:
        """Options shared by every run, before the variant's own."""
        args = [f"--algo={self.algo}"]
        if self.config is not None:
            args.append(f"--config={self.config}")
        if self.final_eval_episodes is not None:
            args.append(f"--final-eval-episodes={self.final_eval_episodes}")
        return args + self.budget_args() + list(self.common)

    def variant(self, name: str) -> Variant:
        for v in self.variants:
            if v.name == name:
                return v
        raise KeyError(name)


@dataclass
class RunSpec:
    """One variant x seed run."""

    variant: str
    seed: int
    run_dir: str
    log_path: str
    train_args: list[str]  # train options without --resume

    @property
    def key(self) -> str:
        return f"{self.variant}/seed_{self.seed}"


# ------------------------------------------------------------------------------------------
# variant parsing and validation
# ------------------------------------------------------------------------------------------
def _split_options(text: str, where: str) -> list[str]:
    """Comma-separated options; each item may itself hold a flag and its value."""
    args: list[str] = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        try:
            args.extend(shlex.split(item))
        except ValueError as exc:
            raise CompareError(f"{where}: cannot parse {item!r} ({exc})") from None
    return args


def _cpu_count() -> int:
    """CPU cores this process may use (affinity-aware where the OS tells)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _check_name(name: str, where: str) -> None:
    if not _NAME_RE.match(name):
        raise CompareError(
            f"{where}: invalid variant name {name!r}; allowed: letters, digits and _ . + - "
            "(not starting with a punctuation character); it names a directory"
        )


def parse_variant(text: str) -> Variant:
    """``NAME:ARGS`` -> Variant (ARGS: train options separated by commas; may be empty)."""
    if not isinstance(text, str) or ":" not in text:
        raise CompareError(
            f"--variant {text!r}: expected NAME:ARGS, e.g. "
            "ti:--whitening=team_individual,--alpha=0.5 (ARGS may be empty: 'default:')"
        )
    name, _, rest = text.partition(":")
    name = name.strip()
    _check_name(name, f"--variant {text!r}")
    return Variant(name, _split_options(rest, f"--variant {name}"))


def load_variants_file(path: str) -> list[Variant]:
    """Variants from YAML: a mapping name -> list of options or a comma-separated string."""
    import yaml

    if not os.path.isfile(path):
        raise CompareError(f"--variants: file not found: {path!r}")
    with open(path) as fh:
        data = yaml.safe_load(fh)
    if not isinstance(data, dict) or not data:
        raise CompareError(
            f"--variants {path!r}: expected a non-empty mapping of variant name -> options "
            "(a list like ['--alpha=0.5'] or a string like '--alpha=0.5,--whitening=type')"
        )
    variants = []
    for name, options in data.items():
        name = str(name)
        _check_name(name, f"--variants {path!r}")
        if options is None:
            args: list[str] = []
        elif isinstance(options, str):
            args = _split_options(options, f"--variants {path!r}: {name}")
        elif isinstance(options, list) and all(isinstance(o, str | int | float) for o in options):
            args = [str(o) for o in options]
        else:
            raise CompareError(
                f"--variants {path!r}: variant {name!r} has {options!r}; expected a list of "
                "option strings or one comma-separated string"
            )
        variants.append(Variant(name, args))
    return variants


def _flag_name(token: str) -> str:
    return token.split("=", 1)[0].replace("_", "-")


def _check_options(args: Sequence[str], where: str) -> None:
    for token in args:
        if token.startswith("--") and _flag_name(token) in MANAGED_OPTIONS:
            flag = _flag_name(token)
            raise CompareError(f"{where}: option {flag} is not allowed: {MANAGED_OPTIONS[flag]}")
    if args and not args[0].startswith("--"):
        raise CompareError(f"{where}: options must start with '--', got {args[0]!r}")


def _backbone_of(spec_like: CompareSpec) -> str:
    """The backbone the runs use, from parse_cli over config + common options."""
    from marl.run.config import parse_cli

    try:
        return str(parse_cli(spec_like.base_args()).backbone)
    except ValueError as exc:
        raise CompareError(f"--config/--common: {exc}") from None


def validate_spec(spec: CompareSpec) -> None:
    """Validate every variant's full train option list with ``marl.run.config.parse_cli``.

    Raises CompareError naming the variant and the unknown option or invalid value, before any
    run starts.
    """
    from marl.run.config import parse_cli

    for v in spec.variants:
        argv = spec.base_args() + v.args + ["--seed=0"]
        if spec.quiet_runs:
            argv += QUIET_RUN_OPTIONS
        try:
            parse_cli(argv)
        except ValueError as exc:
            options = " ".join(v.args) or "no options"
            raise CompareError(f"variant {v.name!r} ({options}): {exc}") from None


def build_spec(args: argparse.Namespace) -> CompareSpec:
    """Turn parsed CLI arguments into a checked CompareSpec (no validation via parse_cli)."""
    from marl.experiments.studies import get_study

    if args.seeds < 1:
        raise CompareError(f"--seeds must be >= 1, got {args.seeds}")
    if args.first_seed < 0:
        raise CompareError(f"--first-seed must be >= 0, got {args.first_seed}")
    if args.total_steps is not None and args.total_steps < 1:
        raise CompareError(f"--total-steps must be >= 1, got {args.total_steps}")
    if args.max_time is not None and not args.max_time > 0:
        raise CompareError(f"--max-time must be > 0 seconds, got {args.max_time}")
    if args.max_cpu_time is not None and not args.max_cpu_time > 0:
        raise CompareError(f"--max-cpu-time must be > 0 seconds, got {args.max_cpu_time}")
    if not args.cpus_per_run > 0:
        raise CompareError(f"--cpus-per-run must be > 0, got {args.cpus_per_run}")
    if args.launcher != "ray" and (args.address is not None or args.cpus_per_run != 1.0):
        raise CompareError("--address and --cpus-per-run apply to --launcher ray only")
    if args.launcher == "ray" and importlib.util.find_spec("ray") is None:
        raise CompareError(RAY_MISSING)
    jobs = args.jobs if args.jobs is not None else _cpu_count()
    if args.launcher == "ray" and args.jobs is None:
        jobs = max(1, int(_cpu_count() // args.cpus_per_run))  # until the cluster is known
    if jobs < 1:
        raise CompareError(f"--jobs must be >= 1, got {jobs}")
    if args.config is not None and not os.path.isfile(args.config):
        raise CompareError(f"--config: file not found: {args.config!r}")
    common = _split_options(args.common or "", "--common")
    _check_options(common, "--common")
    train_command = (
        shlex.split(args.train_command)
        if args.train_command
        else [sys.executable, "-m", "marl.train"]
    )
    if not train_command:
        raise CompareError("--train-command is empty")
    spec = CompareSpec(
        algo=args.algo,
        config=os.path.normpath(args.config) if args.config else None,
        variants=[],
        seeds=list(range(args.first_seed, args.first_seed + args.seeds)),
        out=os.path.normpath(args.out),
        reference="",
        total_steps=args.total_steps,
        max_time=args.max_time,
        max_cpu_time=args.max_cpu_time,
        common=common,
        jobs=jobs,
        train_command=train_command,
        quiet_runs=not args.verbose_runs,
        torch_threads=args.torch_threads,
        study=args.study,
        launcher=args.launcher,
        address=args.address,
        cpus_per_run=float(args.cpus_per_run),
        jobs_from_cluster=args.launcher == "ray" and args.jobs is None,
        final_eval_episodes=args.final_eval_episodes or None,
        primary_metric=args.primary_metric,
        allow_mixed_code=args.allow_mixed_code,
        pilot=args.pilot,
    )
    if args.final_eval_episodes is not None and args.final_eval_episodes < 0:
        raise CompareError(
            f"--final-eval-episodes must be >= 1 (or 0: the runs' own setting), got "
            f"{args.final_eval_episodes}"
        )
    variants: list[Variant] = []
    study_reference = None
    study_comparisons: list[tuple[str, str]] = []
    if args.study:
        try:
            study = get_study(args.study, backbone=_backbone_of(spec), algo=spec.algo)
        except ValueError as exc:
            raise CompareError(f"--study {args.study}: {exc}") from None
        variants += [Variant(n, list(a)) for n, a in study.variants.items()]
        study_reference = study.reference
        study_comparisons = list(study.comparisons)
    if args.variants:
        variants += load_variants_file(args.variants)
    variants += [parse_variant(text) for text in args.variant or []]
    if not variants:
        raise CompareError("no variants: give --variant NAME:ARGS, --variants FILE or --study")
    seen: set[str] = set()
    for v in variants:
        if v.name in seen:
            raise CompareError(f"variant name {v.name!r} given twice; names must be unique")
        seen.add(v.name)
        _check_options(v.args, f"variant {v.name!r}")
    spec.variants = variants
    reference = args.reference or study_reference or variants[0].name
    if reference not in seen:
        raise CompareError(
            f"--reference {reference!r} is not a variant; variants: {', '.join(sorted(seen))}"
        )
    spec.reference = reference
    spec.comparisons = [pair for pair in study_comparisons if reference == study_reference]
    for text in args.comparison or []:
        name, sep, baseline = text.partition(":")
        if not sep or not name or not baseline:
            raise CompareError(
                f"--comparison {text!r}: expected VARIANT:BASELINE (does VARIANT beat BASELINE?)"
            )
        for part in (name, baseline):
            if part not in seen:
                raise CompareError(
                    f"--comparison {text!r}: {part!r} is not a variant; variants: "
                    + ", ".join(sorted(seen))
                )
        if name == baseline:
            raise CompareError(f"--comparison {text!r}: a variant cannot be compared with itself")
        spec.comparisons.append((name, baseline))
    return spec


def check_design(spec: CompareSpec) -> str | None:
    """Whether the design can show anything; None when it can, else the reason (a sentence).

    Every variant runs the same seeds, so comparisons are paired by seed: with n seeds the
    smallest two-sided permutation p-value is 2 / 2**n, and Holm over m primary comparisons
    needs one below alpha / m.
    """
    from marl.experiments import significance

    m = len(spec.primary_comparisons())
    n = len(spec.seeds)
    if m == 0 or significance.can_conclude(n, m):
        return None
    needed = next(k for k in range(2, 64) if significance.can_conclude(k, m))
    smallest = significance.min_attainable_p(n, n, paired=True)
    return (
        f"with {n} seed(s) per variant and {m} primary comparison(s) the smallest attainable "
        f"p-value is {smallest:.3g}, not below {significance.ALPHA:g} / {m} = "
        f"{significance.ALPHA / m:.3g}: this study cannot show anything. Use --seeds "
        f"{needed} or more (or fewer comparisons), or pass --pilot to run it as a pilot"
    )


def finished_commits(spec: CompareSpec) -> dict[str, list[str]]:
    """commit -> the finished runs under OUT that recorded it (finished.json)."""
    found: dict[str, list[str]] = {}
    runs_dir = os.path.join(spec.out, "runs")
    if not os.path.isdir(runs_dir):
        return found
    for variant in sorted(os.listdir(runs_dir)):
        vdir = os.path.join(runs_dir, variant)
        if not os.path.isdir(vdir):
            continue
        for seed_dir in sorted(os.listdir(vdir)):
            marker = os.path.join(vdir, seed_dir, FINISHED_MARKER)
            try:
                with open(marker) as fh:
                    record = json.load(fh)
            except (OSError, ValueError):
                continue
            commits = record.get("commits") or [record.get("commit")]
            for commit in commits:
                if commit:
                    found.setdefault(str(commit), []).append(f"{variant}/{seed_dir}")
    return found


def check_code(spec: CompareSpec) -> None:
    """Refuse to start runs under a commit other than the finished runs' (unless
    ``spec.allow_mixed_code``): a study's arms must run the same code."""
    from marl.run.provenance import git_state

    if spec.allow_mixed_code:
        return
    now = git_state()["commit"]
    found = finished_commits(spec)
    other = {c: runs for c, runs in found.items() if c != now}
    if now is None or not other:
        return
    commit, runs = next(iter(other.items()))
    raise CompareError(
        f"{spec.out} holds {len(runs)} finished run(s) of commit {commit[:12]} (e.g. "
        f"{runs[0]}) and this code is commit {now[:12]}: new runs would mix code. Run the "
        "study from a checkout of that commit (git worktree add DIR COMMIT), use a new --out, "
        "or pass --allow-mixed-code"
    )


# ------------------------------------------------------------------------------------------
# planning and run state
# ------------------------------------------------------------------------------------------
def plan_runs(spec: CompareSpec) -> list[RunSpec]:
    """One RunSpec per variant x seed, ordered seed-major so early results cover variants."""
    threads = spec.torch_threads
    if threads is None and spec.launcher == "ray":
        threads = max(1, int(spec.cpus_per_run))
    if threads is None:
        threads = max(1, _cpu_count() // max(1, spec.jobs))
    runs = []
    for seed in spec.seeds:
        for v in spec.variants:
            run_dir = os.path.join(spec.out, "runs", v.name, f"seed_{seed}")
            log_path = os.path.join(spec.out, "logs", v.name, f"seed_{seed}.log")
            user_args = spec.common + v.args
            extra = []
            if not any(_flag_name(a) == "--torch-threads" for a in user_args):
                extra.append(f"--torch-threads={threads}")
            if spec.quiet_runs:
                extra += QUIET_RUN_OPTIONS
            train_args = (
                spec.base_args() + v.args + extra + [f"--seed={seed}", f"--run-dir={run_dir}"]
            )
            runs.append(RunSpec(v.name, seed, run_dir, log_path, train_args))
    return runs


def run_finished(run_dir: str, recorded: dict[str, Any] | None = None) -> bool:
    """Whether the run in ``run_dir`` trained to its end: it holds ``finished.json``
    (:data:`marl.run.train.FINISHED_MARKER`, written last by marl.train). A run trained before
    the marker existed counts when it holds ``eval.json`` and ``recorded`` (its status.json
    entry) says a compare saw it finish. eval.json alone is not enough: ``python -m
    marl.evaluate`` writes it into interrupted runs too."""
    if os.path.isfile(os.path.join(run_dir, FINISHED_MARKER)):
        return True
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


def _spec_record(spec: CompareSpec) -> dict[str, Any]:
    return {
        "algo": spec.algo,
        "config": spec.config,
        "config_sha256": _file_sha256(spec.config),
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
    }


def _atomic_write_json(path: str, obj: Any) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(obj, fh, indent=2, sort_keys=False)
        fh.write("\n")
    os.replace(tmp, path)


def check_and_store_spec(spec: CompareSpec, *, report_only: bool = False) -> None:
    """Write OUT/compare.json; refuse to mix results of a different setup into OUT.

    A rerun may add variants or seeds and change the reference, but a variant name whose options
    changed, or a changed algorithm, config file (content), budget or common options, would mix
    incomparable runs: that raises CompareError.
    """
    os.makedirs(spec.out, exist_ok=True)
    path = os.path.join(spec.out, "compare.json")
    record = _spec_record(spec)
    if os.path.isfile(path):
        with open(path) as fh:
            old = json.load(fh)
        keys = ["algo", "config_sha256", "total_steps", "max_time", "max_cpu_time", "common"]
        if report_only:  # nothing runs: keep the setting the runs were trained with
            record["final_eval_episodes"] = old.get("final_eval_episodes")
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
    _atomic_write_json(path, record)


# ------------------------------------------------------------------------------------------
# execution
# ------------------------------------------------------------------------------------------
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


def _package_root() -> str:
    """The folder holding the ``marl`` package (the checkout's root, or site-packages)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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
                p for p in (_package_root(), os.environ.get("PYTHONPATH")) if p
            )
            kwargs.update(
                address="local",
                num_cpus=_cpu_count(),
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


@dataclass
class _Active:
    run: RunSpec
    handle: Any  # the launcher's handle of the running train command
    started: float
    mode: str


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
    from tqdm import tqdm

    status = _load_status(spec.out)
    status_path = os.path.join(spec.out, "status.json")
    pending: deque[RunSpec] = deque()
    finished_before = 0
    for run in runs:
        if run_state(run, status) == "finished":
            finished_before += 1
            entry = status.setdefault(run.key, {})
            entry.update(state="finished", command=entry.get("command") or None)
        else:
            pending.append(run)
    _atomic_write_json(status_path, status)
    if not pending:
        return status

    own_launcher = launcher is None
    launcher = make_launcher(spec) if launcher is None else launcher
    pythonpath = os.environ.get("PYTHONPATH", "")
    env = {"PYTHONPATH": _package_root() + (os.pathsep + pythonpath if pythonpath else "")}

    active: list[_Active] = []
    bar = tqdm(
        total=len(runs),
        initial=finished_before,
        desc="runs",
        unit="run",
        disable=not progress,
        dynamic_ncols=True,
    )
    failed = 0

    def postfix() -> None:
        bar.set_postfix(running=len(active), left=len(pending), failed=failed, refresh=True)

    def start(run: RunSpec) -> _Active:
        # a run orphaned by a killed compare may still be finishing its update and writing
        # its checkpoint (it holds RUN_DIR/.lock): wait for it, then resume from that
        wait_for_run_dir(
            run.run_dir,
            on_wait=lambda: print(
                f"waiting for {run.key}: a previous process still writes {run.run_dir}",
                file=sys.stderr,
                flush=True,
            ),
        )
        state = run_state(run, status)
        argv = list(run.train_args)
        if state == "resumable":
            mode = "resume"
            argv.append(f"--resume={run.run_dir}")
        else:
            mode = "restart" if state == "partial" else "start"
            if state == "partial":
                shutil.rmtree(run.run_dir)
        os.makedirs(os.path.dirname(run.log_path), exist_ok=True)
        os.makedirs(os.path.dirname(run.run_dir), exist_ok=True)
        command = spec.train_command + argv
        with open(run.log_path, "a") as log:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            log.write(f"=== marl.compare {mode} {stamp}: {shlex.join(command)}\n")
        child_env = env
        m = [a for a in argv if _flag_name(a) == "--torch-threads"]
        if m and "=" in m[-1]:
            n = m[-1].split("=", 1)[1]
            if n.isdigit() and int(n) > 0:
                child_env = {**env, "OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n}
        handle = launcher.start(command, child_env, run.log_path)
        entry = status.setdefault(run.key, {})
        entry.update(
            state="running",
            mode=mode,
            command=shlex.join(command),
            attempts=int(entry.get("attempts", 0)) + 1,
            log=os.path.relpath(run.log_path, spec.out),
            launcher=launcher.name,
        )
        _atomic_write_json(status_path, status)
        return _Active(run, handle, time.monotonic(), mode)

    def finish(item: _Active, returncode: int) -> None:
        nonlocal failed
        wall = time.monotonic() - item.started
        entry = status[item.run.key]
        entry.update(returncode=returncode, wall_s=round(wall, 3))
        # exit 0 is a finished run (marl.train's contract); the marker or eval.json shows it
        # trained here (a --train-command may not write the marker)
        done = run_finished(item.run.run_dir, {"state": "finished"})
        if returncode == 0 and done:
            entry.update(state="finished", error=None)
            msg = f"done   {item.run.key} ({item.mode}) in {wall:.1f}s"
        else:
            failed += 1
            reason = (
                f"exit code {returncode}" if returncode != 0 else "exit code 0 but no eval.json"
            )
            entry.update(state="failed", error=f"{reason}\n{_log_tail(item.run.log_path)}")
            msg = f"FAILED {item.run.key} ({reason}); log: {item.run.log_path}"
        _atomic_write_json(status_path, status)
        bar.update(1)
        if progress:
            bar.write(msg)
        else:
            print(msg, file=sys.stderr, flush=True)

    def stop_all() -> None:
        for item in active:  # recorded first: a launcher that never returns may end compare
            status[item.run.key].update(state="interrupted", returncode=None)
        _atomic_write_json(status_path, status)
        codes = launcher.stop([item.handle for item in active], STOP_GRACE_S)
        for item, code in zip(active, codes, strict=True):
            status[item.run.key].update(returncode=code)
        _atomic_write_json(status_path, status)

    # Ctrl-C and SIGTERM raise KeyboardInterrupt, and are remembered: Ray may swallow the
    # exception when the signal lands inside one of its calls, and the loop checks the flag
    stop_signals: list[int] = []

    def on_signal(signum: int, frame: Any) -> None:
        stop_signals.append(signum)
        raise KeyboardInterrupt(f"signal {signum}")

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        postfix()
        while pending or active:
            if stop_signals:
                raise KeyboardInterrupt(f"signal {stop_signals[0]}")
            while pending and len(active) < spec.jobs:
                active.append(start(pending.popleft()))
                postfix()
            time.sleep(poll_s)
            for item in list(active):
                rc = launcher.poll(item.handle)
                if rc is not None:
                    active.remove(item)
                    finish(item, rc)
                    postfix()
    except KeyboardInterrupt:
        stop_all()
        bar.close()
        raise
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if own_launcher:
            launcher.close()
    bar.close()
    return status


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


def collect_runs(spec: CompareSpec, runs: list[RunSpec]) -> list[dict[str, Any]]:
    """One record per run for the report: state, error (log tail), command, timing."""
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
            }
        )
    return records


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
    p.add_argument("--algo", default="mappo", choices=("mappo", "grpo"), help="Algorithm.")
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
        help="Start no run: aggregate what OUT holds (unfinished runs listed as missing).",
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
    from marl.experiments import report

    raw_argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(raw_argv)
    if args.tasks is not None:
        return _main_tasks(parser, args, raw_argv)
    try:
        spec = build_spec(args)
        if args.no_validate and not args.train_command:
            raise CompareError("--no-validate is only allowed with --train-command")
        if not args.no_validate:
            validate_spec(spec)
        if args.bootstrap_reps < 1:
            raise CompareError(f"--bootstrap-reps must be >= 1, got {args.bootstrap_reps}")
        if not 0.0 < args.confidence < 1.0:
            raise CompareError(f"--confidence must be in (0, 1), got {args.confidence}")
        for n in args.at_env_steps or []:
            if n < 1:
                raise CompareError(
                    f"--at-env-steps must be a positive number of env steps, got {n}"
                )
        if args.primary_metric is not None and args.primary_metric not in report.METRICS:
            raise CompareError(
                f"--primary-metric {args.primary_metric!r}: allowed: " + ", ".join(report.METRICS)
            )
        from marl.experiments.stats import check_dependencies

        missing = check_dependencies()
        if missing is not None and not args.dry_run:
            raise CompareError(missing)
        design_problem = check_design(spec)
        if design_problem is not None and not (args.pilot or args.report_only or args.dry_run):
            raise CompareError(design_problem)
        runs = plan_runs(spec)
        if args.dry_run:
            status = _load_status(spec.out)
            for run in runs:
                command = shlex.join(spec.train_command + run.train_args)
                print(f"{run.key} [{run_state(run, status)}]: {command}")
            return 0
        check_and_store_spec(spec, report_only=args.report_only)
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
    for at_env_steps in [None, *(args.at_env_steps or [])]:
        try:
            summary = report.build_summary(
                spec,
                records,
                reps=args.bootstrap_reps,
                seed=args.bootstrap_seed,
                confidence=args.confidence,
                entropy_threshold=args.entropy_threshold,
                command=shlex.join(["python", "-m", "marl.compare", *raw_argv]),
                wall_s=time.time() - t0,
                title=args.title,
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
    n_bad = sum(r["status"] != "finished" for r in records)
    return 1 if n_bad else 0


def _main_tasks(
    parser: argparse.ArgumentParser, args: argparse.Namespace, raw_argv: list[str]
) -> int:
    """``--tasks``: one comparison per preset in OUT/<preset>/, then the table across tasks."""
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if not tasks or len(set(tasks)) != len(tasks):
        parser.exit(
            2, f"{parser.prog}: error: --tasks needs distinct preset names, got {args.tasks!r}\n"
        )
    common = _split_options(args.common or "", "--common")
    if any(_flag_name(a) == "--env.preset" for a in common):
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
    from marl.experiments.tasks import write_task_table

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
