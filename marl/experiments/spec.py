"""What a ``python -m marl.compare`` study is: its variants, seeds, budget and protocol.

:class:`CompareSpec` (stored as ``OUT/compare.json``) and :class:`RunSpec` (one variant x
seed), parsed from the command line (:func:`build_spec`), checked before anything runs
(:func:`validate_spec`: every variant's train options, and no two variants that are one
configuration; :func:`check_design`: whether the design can show anything;
:func:`check_code`: no runs of another commit) and planned seed-major (:func:`plan_runs`).
Nothing here imports torch (but for the option checks, which parse the train options) or
starts a run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from marl.run.rundir import FINISHED_MARKER

if TYPE_CHECKING:
    from marl.algos.base import BaseConfig

__all__ = [
    "CompareError",
    "Variant",
    "CompareSpec",
    "RunSpec",
    "MANAGED_OPTIONS",
    "QUIET_RUN_OPTIONS",
    "FINAL_EVAL_EPISODES",
    "parse_variant",
    "load_variants_file",
    "build_spec",
    "validate_spec",
    "check_distinct_variants",
    "check_design",
    "check_code",
    "finished_commits",
    "plan_runs",
    "cpu_count",
    "split_options",
    "RAY_MISSING",
    "flag_name",
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
    seeds_per_process: int = 1
    """Seeds of one variant trained by one process (``marl.train --seeds``, batched through
    one rollout and one update); 1: a process per run."""

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
def split_options(text: str, where: str) -> list[str]:
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


def cpu_count() -> int:
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
    return Variant(name, split_options(rest, f"--variant {name}"))


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
            args = split_options(options, f"--variants {path!r}: {name}")
        elif isinstance(options, list) and all(isinstance(o, str | int | float) for o in options):
            args = [str(o) for o in options]
        else:
            raise CompareError(
                f"--variants {path!r}: variant {name!r} has {options!r}; expected a list of "
                "option strings or one comma-separated string"
            )
        variants.append(Variant(name, args))
    return variants


def flag_name(token: str) -> str:
    return token.split("=", 1)[0].replace("_", "-")


def _check_options(args: Sequence[str], where: str) -> None:
    for token in args:
        if token.startswith("--") and flag_name(token) in MANAGED_OPTIONS:
            flag = flag_name(token)
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


def validate_spec(spec: CompareSpec, *, allow_one_configuration: bool = False) -> None:
    """Validate every variant's full train option list with ``marl.run.config.parse_cli``,
    and refuse variants that are one configuration (:func:`check_distinct_variants`).

    Raises CompareError naming the variant and the unknown option or invalid value, or both
    variants and the option that makes them one, before any run starts.
    ``allow_one_configuration``: skip the second check (``--report-only`` of a directory whose
    runs exist already: the report flags such arms itself).
    """
    from marl.run.config import parse_cli

    configs = {}
    for v in spec.variants:
        argv = spec.base_args() + v.args + ["--seed=0"]
        if spec.quiet_runs:
            argv += QUIET_RUN_OPTIONS
        try:
            configs[v.name] = parse_cli(argv)
        except ValueError as exc:
            options = " ".join(v.args) or "no options"
            raise CompareError(f"variant {v.name!r} ({options}): {exc}") from None
    if not allow_one_configuration:
        check_distinct_variants(configs)


def check_distinct_variants(configs: Mapping[str, BaseConfig]) -> None:
    """Refuse two variants that train identically (``marl.run.config.one_configuration``:
    equal effective configurations, e.g. GRPO's ``--whitening none`` and ``team_individual``
    at one alpha): comparing them would be an A/A test counted as a comparison. Raises
    CompareError naming every such pair and the options that make them one."""
    from marl.run.config import one_configuration

    names = list(configs)
    found = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            why = one_configuration(configs[a], configs[b])
            if why is not None:
                found.append(f"variants {a!r} and {b!r} are one configuration: {why}")
    if found:
        raise CompareError(
            "; ".join(found) + ". They would train identically, and comparing them is an A/A "
            "test: drop one of each pair, or make them differ in an option that changes training"
        )


def build_spec(args: argparse.Namespace) -> CompareSpec:
    """Turn parsed CLI arguments into a checked CompareSpec (no validation via parse_cli)."""
    _check_budget_and_launcher(args)
    jobs = _jobs(args)
    if args.config is not None and not os.path.isfile(args.config):
        raise CompareError(f"--config: file not found: {args.config!r}")
    common = split_options(args.common or "", "--common")
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
    spec.variants, study_reference, study_comparisons = _variants_of(args, spec)
    names = {v.name for v in spec.variants}
    reference = args.reference or study_reference or spec.variants[0].name
    if reference not in names:
        raise CompareError(
            f"--reference {reference!r} is not a variant; variants: {', '.join(sorted(names))}"
        )
    spec.reference = reference
    spec.comparisons = [pair for pair in study_comparisons if reference == study_reference]
    spec.comparisons += [_parse_comparison(text, names) for text in args.comparison or []]
    per_process = getattr(args, "seeds_per_process", None)
    spec.seeds_per_process = 1 if per_process is None else int(per_process)
    _check_seeds_per_process(spec)
    return spec


def _check_budget_and_launcher(args: argparse.Namespace) -> None:
    """Refuse out-of-range seeds, budgets and launcher options (CompareError)."""
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


def _jobs(args: argparse.Namespace) -> int:
    """Runs at once: ``--jobs``, else the CPU cores (with ``--launcher ray``: cores //
    ``--cpus-per-run`` until the cluster is known)."""
    jobs = args.jobs if args.jobs is not None else cpu_count()
    if args.launcher == "ray" and args.jobs is None:
        jobs = max(1, int(cpu_count() // args.cpus_per_run))  # until the cluster is known
    if jobs < 1:
        raise CompareError(f"--jobs must be >= 1, got {jobs}")
    return jobs


def _variants_of(
    args: argparse.Namespace, spec: CompareSpec
) -> tuple[list[Variant], str | None, list[tuple[str, str]]]:
    """The variants of ``--study`` (for ``spec``'s backbone and algorithm), ``--variants`` and
    ``--variant``, in that order, with the study's reference and comparisons (None and []
    without a study). Raises CompareError for none, a name given twice or a managed option."""
    from marl.experiments.studies import get_study

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
    return variants, study_reference, study_comparisons


def _parse_comparison(text: str, names: set[str]) -> tuple[str, str]:
    """A ``--comparison VARIANT:BASELINE`` as a pair of the variant ``names``."""
    name, sep, baseline = text.partition(":")
    if not sep or not name or not baseline:
        raise CompareError(
            f"--comparison {text!r}: expected VARIANT:BASELINE (does VARIANT beat BASELINE?)"
        )
    for part in (name, baseline):
        if part not in names:
            raise CompareError(
                f"--comparison {text!r}: {part!r} is not a variant; variants: "
                + ", ".join(sorted(names))
            )
    if name == baseline:
        raise CompareError(f"--comparison {text!r}: a variant cannot be compared with itself")
    return name, baseline


#: options whose runs ``marl.train --seeds`` cannot batch
_UNBATCHED = {"--tbptt-chunk": "truncated BPTT", "--optimism-offset": "the optimism offset"}


def _check_seeds_per_process(spec: CompareSpec) -> None:
    """``--seeds-per-process S > 1``: every variant must be batchable (mappo or grpo, no
    option the batch refuses) and the budget env steps (a time budget would be the
    batch's)."""
    S = spec.seeds_per_process
    if S < 1:
        raise CompareError(f"--seeds-per-process must be >= 1, got {S}")
    if S == 1:
        return
    if spec.total_steps is None or spec.max_time is not None or spec.max_cpu_time is not None:
        raise CompareError(
            "--seeds-per-process > 1 needs an env-step budget (--total-steps) and no "
            "--max-time / --max-cpu-time: a batch's time is shared by its seeds"
        )
    for v in spec.variants:
        args = spec.common + v.args
        algo = spec.algo
        for i, token in enumerate(args):
            if flag_name(token) == "--algo":
                algo = token.split("=", 1)[1] if "=" in token else args[i + 1]
            if flag_name(token) in _UNBATCHED:
                raise CompareError(
                    f"--seeds-per-process {S}: variant {v.name!r} sets {flag_name(token)} "
                    f"({_UNBATCHED[flag_name(token)]}), which marl.train --seeds does not batch"
                )
        if algo not in ("mappo", "grpo"):
            raise CompareError(
                f"--seeds-per-process {S}: variant {v.name!r} trains {algo}; marl.train "
                "--seeds batches mappo and grpo (use --seeds-per-process 1)"
            )


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
        threads = max(1, cpu_count() // max(1, spec.jobs))
    runs = []
    for seed in spec.seeds:
        for v in spec.variants:
            run_dir = os.path.join(spec.out, "runs", v.name, f"seed_{seed}")
            log_path = os.path.join(spec.out, "logs", v.name, f"seed_{seed}.log")
            user_args = spec.common + v.args
            extra = []
            if not any(flag_name(a) == "--torch-threads" for a in user_args):
                extra.append(f"--torch-threads={threads}")
            if spec.quiet_runs:
                extra += QUIET_RUN_OPTIONS
            train_args = (
                spec.base_args() + v.args + extra + [f"--seed={seed}", f"--run-dir={run_dir}"]
            )
            runs.append(RunSpec(v.name, seed, run_dir, log_path, train_args))
    return runs
