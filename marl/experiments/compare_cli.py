"""The options of ``python -m marl.compare`` as a table, and the parser built from it.

Each :class:`Option` in :data:`OPTIONS` is one ``add_argument`` call: the flag, its help text,
the group that lists it (the parser's own options, the budget, of which at most one may be
given, or the study protocol) and ``add_argument``'s other keywords. :func:`build_parser`
reads the table in order, so ``--help`` lists the options as the table does;
:mod:`marl.experiments.compare` runs what they ask for.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from marl.experiments.spec import FINAL_EVAL_EPISODES, QUIET_RUN_OPTIONS
from marl.experiments.studies import STUDIES

__all__ = ["Option", "OPTIONS", "build_parser"]

#: Group of the budget options: at most one of them may be given.
BUDGET = "budget"
#: Group of the options that say what a study shows, listed under its own heading.
PROTOCOL = "study protocol"
PROTOCOL_DESCRIPTION = (
    "Every comparison of a variant with the reference on the primary metric, plus the "
    "--comparison pairs, is a primary comparison: it gets a permutation-test p-value "
    "(paired by seed), Holm-adjusted over all of them (p_holm), and is 'shown' only when "
    "p_holm < 0.05 and the bootstrap CI of P(improvement) agrees. Other metrics are "
    "exploratory."
)


@dataclass(frozen=True)
class Option:
    """One option of the parser: ``add_argument(flag, help=help, **settings)`` on ``group``."""

    flag: str
    help: str
    group: str | None
    """None: the parser's own options; :data:`BUDGET` or :data:`PROTOCOL`."""
    settings: Mapping[str, Any]
    """``add_argument``'s other keywords (default, type, action, choices, metavar, ...)."""


def _option(flag: str, help: str, group: str | None = None, **settings: Any) -> Option:
    return Option(flag, help, group, settings)


OPTIONS: tuple[Option, ...] = (
    _option(
        "--algo",
        "Algorithm: mappo (default), grpo, a registered name or package.module:Class.",
        default="mappo",
    ),
    _option("--config", "YAML train config shared by every run.", default=None),
    _option(
        "--variant",
        "A variant: NAME, a colon, train options separated by commas "
        "(ti:--whitening=team_individual,--alpha=0.5). Repeatable.",
        action="append",
        metavar="NAME:ARGS",
    ),
    _option("--variants", "YAML file: variant name -> list of train options.", metavar="FILE"),
    _option(
        "--study",
        "A built-in set of variants (marl.experiments.studies); --variant adds to it.",
        choices=tuple(STUDIES),
    ),
    _option(
        "--common",
        "Train options for every variant, comma-separated (--common=--backbone=gru).",
        metavar="ARGS",
    ),
    _option(
        "--tasks",
        "Run the comparison once per env preset (small,sparse,hard,memory, ...) in "
        "OUT/<preset>/ (each run gets --env.preset=<preset>), then write a benchmark table "
        "across tasks: OUT/tasks.md (success / solved IQM with 95%% CIs per task, next to the "
        "heuristic and random policies) and OUT/plots/performance_profile.png.",
        metavar="P1,P2,...",
    ),
    _option("--seeds", "Seeds per variant (default 5).", type=int, default=5),
    _option("--first-seed", "Seeds are FIRST..FIRST+K-1.", type=int, default=0),
    _option("--total-steps", "Env steps per run.", BUDGET, type=int),
    _option("--max-time", "Wall-clock seconds per run.", BUDGET, type=float),
    _option(
        "--max-cpu-time",
        "CPU seconds per run (marl.train --max-cpu-time: the run's own user + system "
        "time). The fair equal-time budget when runs share the cores: with --jobs above the "
        "free cores, --max-time gives each run less work; this does not.",
        BUDGET,
        type=float,
    ),
    _option(
        "--jobs",
        "Runs at once (default: number of CPU cores; with --launcher ray: the cluster's "
        "CPUs // --cpus-per-run).",
        type=int,
        default=None,
    ),
    _option(
        "--launcher",
        "Where the runs train: 'local' child processes (default) or 'ray' tasks on a Ray "
        "cluster (pip install 'coopsearch[ray]'). Same bookkeeping, resumption and results.",
        choices=("local", "ray"),
        default="local",
    ),
    _option(
        "--address",
        "--launcher ray: the cluster to use (ray.init's address: 'auto', 'HOST:6379', "
        "'ray://HOST:10001'); default: RAY_ADDRESS, else a local Ray cluster on this machine.",
        default=None,
        metavar="ADDR",
    ),
    _option(
        "--cpus-per-run",
        "--launcher ray: CPUs each run's task requests (default 1); the run's torch "
        "threads follow it unless --torch-threads or the options set them.",
        type=float,
        default=1.0,
        metavar="N",
    ),
    _option("--out", "Output directory.", required=True),
    _option("--reference", "Variant the others are compared with (default: study's or first)."),
    _option("--bootstrap-reps", "Bootstrap resamples (default 2000).", type=int, default=2000),
    _option("--bootstrap-seed", "Seed of the bootstrap.", type=int, default=0),
    _option("--confidence", "CI level (default 0.95).", type=float, default=0.95),
    _option(
        "--entropy-threshold",
        "Entropy collapse: first update with policy entropy below this (nats; default 0.1).",
        type=float,
        default=0.1,
    ),
    _option(
        "--torch-threads",
        "torch threads per run (default: cores // jobs, at least 1).",
        type=int,
        default=None,
    ),
    _option("--title", "Report title (default from the study / variants)."),
    _option(
        "--report-only",
        "Start no run: report what OUT holds (unfinished runs listed as missing). "
        "'--report-only --out OUT' alone regenerates OUT's report: the study (algorithm, "
        "variants, seeds, budget, reference, comparisons, primary metric) and its report "
        "settings (bootstrap, confidence, entropy threshold, title, --at-env-steps reports) "
        "come from OUT/compare.json; options given replace them (those saying how the runs "
        "trained must agree with it).",
        action="store_true",
    ),
    _option(
        "--at-env-steps",
        "Also score the runs at N env steps (repeatable): each run's validation "
        "evaluation logged last at or before N (runs evaluate every --eval-every updates) "
        "instead of its final eval.json, curves up to N; runs that stopped earlier are left "
        "out. Written to OUT/at_<N>_env_steps/ (OUT's own report is unchanged). Compares "
        "time-budgeted runs at equal samples when nothing is scheduled over the budget "
        "(constant learning rate and entropy coefficient, the defaults).",
        type=int,
        action="append",
        metavar="N",
    ),
    _option(
        "--primary-metric",
        "The metric of the primary comparisons: success_rate (the final evaluation, the "
        "default when runs report it), success_rate_last5 (mean of the last 5 periodic "
        "evaluations), solved_rate, solved_rate_last5, mean_return (the default otherwise), "
        "auc_success.",
        PROTOCOL,
        default=None,
    ),
    _option(
        "--comparison",
        "A pre-registered primary comparison beyond each variant vs the reference: does "
        "variant A beat variant B? Repeatable.",
        PROTOCOL,
        action="append",
        metavar="A:B",
    ),
    _option(
        "--final-eval-episodes",
        f"Validation episodes of every run's final evaluation, the primary endpoint "
        f"(default {FINAL_EVAL_EPISODES}; 0: the runs' own --eval-episodes).",
        PROTOCOL,
        type=int,
        default=FINAL_EVAL_EPISODES,
        metavar="N",
    ),
    _option(
        "--seeds-per-process",
        "Train up to S seeds of a variant in one process (marl.train --seeds: one "
        "batched rollout and update; seed k's results equal a batch of one bit for bit). "
        "Needs --total-steps (mappo or grpo). A resumed run continues alone. Default 1: a process "
        "per run: on two cores batching gained too little and too unevenly across backbones to "
        "change it (BENCHMARKS.md, 'Many seeds at once').",
        type=int,
        default=1,
        metavar="S",
    ),
    _option(
        "--pilot",
        "Run a design that cannot show anything (too few seeds for its number of "
        "comparisons): compare refuses it otherwise, saying how many seeds it needs.",
        PROTOCOL,
        action="store_true",
    ),
    _option(
        "--allow-mixed-code",
        "Aggregate (and add to) runs trained at different git commits; the report says "
        "so. Without it compare refuses.",
        PROTOCOL,
        action="store_true",
    ),
    _option("--dry-run", "Validate and print the run commands; run nothing.", action="store_true"),
    _option("--no-progress", "No tqdm progress bar.", action="store_true"),
    _option("--no-plots", "Skip the PNG plots.", action="store_true"),
    _option(
        "--export-marl-eval",
        "Also write the study to FILE in marl-eval's JSON layout (environment / task / "
        "algorithm = variant / run_<seed> / step_<k> = the k-th periodic validation "
        "evaluation, absolute_metrics = the final one), for marl_eval's data_process_pipeline "
        "and create_matrices_for_rliable. The runs record each evaluation's mean, not its "
        "episodes: every metric's list holds that one mean. Works with --report-only.",
        metavar="FILE",
    ),
    _option(
        "--verbose-runs",
        f"Do not add {' '.join(QUIET_RUN_OPTIONS)} to the runs.",
        action="store_true",
    ),
    _option(
        "--train-command",
        "Command that trains one run, instead of 'python -m marl.train' (e.g. "
        "'torchrun --nproc-per-node 2 -m marl.train'); it receives the train options.",
    ),
    _option(
        "--no-validate",
        "Skip marl.run.config.parse_cli validation (only for a --train-command that does "
        "not take marl.run.train's options).",
        action="store_true",
    ),
)


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m marl.compare`` argument parser: :data:`OPTIONS`, in order."""
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
    groups: dict[str | None, Any] = {
        None: p,
        BUDGET: p.add_mutually_exclusive_group(),
        PROTOCOL: p.add_argument_group(PROTOCOL, PROTOCOL_DESCRIPTION),
    }
    for option in OPTIONS:
        groups[option.group].add_argument(option.flag, help=option.help, **option.settings)
    return p
