"""Compare training variants over seeds in one command, with honest statistics.

::

    python -m marl.compare --algo mappo --config cfg.yaml \\
        --variant baseline:--recipe=baseline --variant calibrated:--recipe=calibrated \\
        --seeds 8 --total-steps 200000 --jobs 2 --out runs/cmp

    python -m marl.compare --study calibration_ladder --seeds 16 --total-steps 1000000 ...
    python -m marl.compare --study whitening --common=--backbone=gru --seeds 16 ...

The parts: :mod:`marl.experiments.spec` (what a study is, checked before anything runs),
:mod:`marl.experiments.launchers` (child processes or Ray tasks),
:mod:`marl.experiments.compare_runs` (running, resuming and collecting the runs),
:mod:`marl.experiments.compare_record` (OUT/compare.json, and ``--report-only`` reading it
back), :mod:`marl.experiments.compare_cli` (the options), this module (the CLI; it re-exports
the public names of those parts), :mod:`marl.experiments.report` (the summary, its
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
import os
import shlex
import sys
import time
from collections.abc import Sequence
from typing import Any

from marl.experiments import marl_eval, report
from marl.experiments.compare_cli import build_parser
from marl.experiments.compare_record import (
    ReportSettings,
    check_and_store_spec,
    explicit_options,
    recorded_options,
    report_only_spec,
)
from marl.experiments.compare_runs import (
    collect_runs,
    exclusive_lock,
    execute_runs,
    load_status,
    run_finished,
    run_state,
)
from marl.experiments.compare_runs import process_groups as process_groups  # re-exported
from marl.experiments.launchers import STOP_GRACE_S, LocalLauncher, RayLauncher
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
            status = load_status(spec.out)
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
            with exclusive_lock(spec.out):
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
