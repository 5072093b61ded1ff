"""``python -m marl.train``: train MAPPO (or GRPO) on a vector env and write a run directory.

Usage (docs/CONTRACTS.md section 4)::

    python -m marl.train --algo mappo [--config FILE] [--total-steps N | --max-time S]
                         [--seed S] [--run-dir DIR] [--resume DIR] [--<field> VALUE ...]

Without arguments it is the demo: MAPPO on the small multisearch preset for
``DEMO_MAX_TIME`` seconds on the CPU, then the evaluation table next to the scripted heuristic
and the random policy, plots and a GIF.

The budget is the first of ``--total-steps``, ``--max-time`` and ``--max-cpu-time`` reached
(``max_time = DEMO_MAX_TIME`` when none is given: :func:`resolve_budget`, so that config.yaml
records the budget the run trains for). The time budgets do not count numba's compilation of a
kernel on its first use (:mod:`marl.run.compile_clock`: one line per kernel family says it is
compiling; numba caches the kernels, so a later run loads them instead).

Algorithms are looked up in :data:`marl.algos.ALGORITHMS` (name -> class); each implements
:class:`marl.algos.base.Algorithm` (``iteration``, ``state_dict``, ``load_state_dict``,
``policy``, ``layout``) and declares its options in its ``config_class``.

The loop here is algorithm-agnostic: schedules, time budget, logging, checkpoints, signals,
evaluation, plots. Distributed (torchrun): every rank runs the loop; only rank 0 writes.
:func:`train` checks and sets up; :func:`_train_loop` is the story (iterate, log, evaluate,
checkpoint; finish) of one run, a batch of one (:class:`_OneRun`), and of a ``--seeds`` batch
(:mod:`marl.run.train_seeds`), told with small parts: :class:`marl.run.rundir.RunDir` (the
layout and its refuse / overwrite / resume rules), :class:`marl.run.signals.StopSignals`,
:mod:`marl.run.progress` (budget, clock, progress bar), and :mod:`marl.run.checkpointing`:
:class:`~marl.run.checkpointing.Cadence` (when to evaluate and checkpoint) and
:class:`~marl.run.checkpointing.Checkpoints`. The options of an invocation that are no config
fields (``--resume``, ``--overwrite``, ``--keep-checkpoints``, ``--wandb*``) come beside the
config as a :class:`marl.run.options.RunOptions` (:func:`marl.run.config.parse_train_args`).

Nothing is lost on a mistake or a fault (docs/CONTRACTS.md section 4): an existing run is
never overwritten without ``--overwrite``; ``--resume`` checks everything (config changes,
the newest checkpoint that loads) before it writes anything; SIGINT and SIGTERM finish the
update, write a checkpoint and exit :data:`EXIT_INTERRUPTED`; the last K checkpoints are kept;
file-system faults are ``error:`` lines (rc 2) naming the path and the cause.

Every checkpoint also writes the run's policy artifact, ``RUN_DIR/policy/`` (the policy's
weights without pickles and a JSON description, :mod:`marl.run.artifact`), which the end of the
run rewrites with the final evaluation; ``marl.load_policy``, ``marl.evaluate`` and
``marl.export`` read that, and only ``--resume`` reads the pickled checkpoints.

A run that trains to its end writes ``RUN_DIR/finished.json`` (:data:`FINISHED_MARKER`) last,
after eval.json, plots and GIF; starting or resuming a run removes it first. It is what
``marl.compare`` takes as "finished" (``python -m marl.evaluate`` writes its own file and never
the marker; with ``--update-run`` it also rewrites eval.json). ``--resume`` of a finished run
whose budget is not raised past the work finished.json records says so in one line and exits
0, every file left as it was.

``--wandb`` (and ``--wandb-project``, ``--wandb-entity``, ``--wandb-run-name``,
``--wandb-mode``): train flags outside the config, like ``--keep-checkpoints``; they add W&B
logging (:class:`marl.run.runlog.WandbOptions`) and change no result.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import importlib
import json
import os
import random
import sys
import time
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
import yaml

from marl.adapters.envapi import make_vector_env
from marl.algos import ALGORITHMS, Algorithm, register_algorithm, resolve_algorithm
from marl.core.losses import NonFiniteError
from marl.rollout.episodes import BaselineActor, evaluate_episodes
from marl.run import distributed
from marl.run.artifact import write_policy_artifact
from marl.run.checkpoint import (
    DEFAULT_KEEP,
    CheckpointError,
    RunDirBusyError,
    list_checkpoints,
    load_newest_checkpoint,
    rng_state,
    set_rng_state,
)
from marl.run.checkpointing import Cadence, Checkpoints, Start
from marl.run.compile_clock import compile_clock
from marl.run.config import (
    DEMO_MAX_TIME,
    EXIT_INTERRUPTED,
    BaseConfig,
    ConfigError,
    build_parser,
    config_to_dict,
    parse_train_args,
    split_wandb_flags,
)
from marl.run.evaluate import evaluate_policy, format_table, record_episode
from marl.run.options import RunOptions
from marl.run.plots import (
    headless_rendering,
    plot_advantage_histograms,
    plot_learning_curves,
    write_gif,
)
from marl.run.progress import Budget, ProgressBar, TrainingClock
from marl.run.progress import ProgressLines as _ProgressLines  # noqa: F401 - its older name
from marl.run.provenance import provenance
from marl.run.rundir import (
    FINISHED_MARKER,
    RUN_FILES,
    RUN_FOLDERS,
    RunDir,
    RunDirError,
    atomic_write_json,
    atomic_write_text,
    run_dir_contents,
)
from marl.run.runlog import (
    RunLogger,
    WandbError,
    WandbOptions,
    add_wandb_arguments,
    import_wandb,
    read_metrics,
)
from marl.run.signals import StopSignals
from seqmodels.kernels import (
    auto_threading_layer,
    numba_available,
    numba_threading_layer,
    set_malloc_thresholds,
    set_numba_threading_layer,
)

__all__ = [
    "ALGORITHMS",
    "EXIT_INTERRUPTED",
    "FINISHED_MARKER",
    "RUN_FILES",
    "RUN_FOLDERS",
    "RunOptions",
    "register_algorithm",
    "configure_process",
    "get_algorithm",
    "run_dir_contents",
    "train",
    "main",
    "resolve_budget",
]

#: :func:`marl.run.config.split_wandb_flags`, by its older name
_parse_wandb_flags = split_wandb_flags


def get_algorithm(name: str) -> type[Algorithm]:
    """The algorithm ``--algo name`` names (:func:`marl.algos.resolve_algorithm`)."""
    return resolve_algorithm(name)


def _init_distributed(cfg: BaseConfig) -> distributed.DistContext:
    device = cfg.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return distributed.init_distributed(device=device)


def resolve_budget(cfg: BaseConfig) -> None:
    """The demo budget, ``max_time = DEMO_MAX_TIME``, when none of ``total_steps``, ``max_time``
    and ``max_cpu_time`` is set: :func:`train` resolves it first, so that config.yaml, the
    checkpoints and finished.json record the budget the run trains for."""
    if cfg.total_steps is None and cfg.max_time is None and cfg.max_cpu_time is None:
        cfg.max_time = DEMO_MAX_TIME


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def _default_run_dir(cfg: BaseConfig) -> str:
    """``runs/<algo>-<backbone>-<timestamp>`` (``-2``, ``-3``, ... when that one exists)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = os.path.join("runs", f"{cfg.algo}-{cfg.backbone}-{stamp}")
    path, n = base, 1
    while os.path.lexists(path):
        n += 1
        path = f"{base}-{n}"
    return path


def _check_env(cfg: BaseConfig) -> None:
    """Build one env with the configured kwargs so that bad env arguments fail before work."""
    try:
        vec = make_vector_env(cfg.env_fn, 1, cfg.env)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"--env (env_fn {cfg.env_fn}, kwargs {cfg.env}): {exc}") from exc
    close = getattr(vec, "close", None)
    if callable(close):
        close()


def _baseline_policies(cfg: BaseConfig) -> dict[str, Any]:
    """The env's scripted heuristic and random policies, ``policy(obs, vec)``: from the module
    named by the env module's ``BASELINES`` attribute, else ``<package>.baselines`` (for
    ``envs.multisearch_v0``: ``envs.baselines``); {} when there is none."""
    module_name = cfg.env_fn.split(":")[0]
    try:
        env_module = importlib.import_module(module_name)
        name = getattr(env_module, "BASELINES", module_name.rsplit(".", 1)[0] + ".baselines")
        baselines = importlib.import_module(name)
        return {"heuristic": baselines.HeuristicPolicy(), "random": baselines.RandomPolicy(0)}
    except (ImportError, AttributeError):
        return {}


def _baseline_rows(cfg: BaseConfig, seeds: list[int]) -> dict[str, dict[str, Any]]:
    """The baselines evaluated by the same loop as the trained policy."""
    rows = {}
    for name, policy in _baseline_policies(cfg).items():
        try:
            n = len(seeds) * cfg.eval_repeats
            vec = make_vector_env(cfg.env_fn, n, cfg.env, autoreset=False)
            rows[name] = evaluate_episodes(
                BaselineActor(policy), vec, seeds, repeats=cfg.eval_repeats
            )
        except Exception as exc:  # noqa: BLE001 - baselines are a courtesy, never fatal
            print(f"[marl.train] baseline {name!r} not evaluated: {exc}", file=sys.stderr)
    return rows


class TrainedRun(Protocol):
    """One run as :class:`Checkpoints`, :func:`_evaluation_row` and :func:`_finish` read it: an
    :class:`Algorithm`'s ``policy``, ``layout``, ``last_advantages`` and ``state_dict()``, and
    ``rng()``, the RNG states its checkpoint holds."""

    policy: Any
    layout: Any
    last_advantages: Any

    def state_dict(self) -> dict[str, Any]: ...

    def rng(self) -> dict[str, Any]: ...


class RunBatch(Protocol):
    """S >= 1 runs trained together, as :func:`_train_loop` drives them: one run
    (:class:`_OneRun`, a batch of one) or ``--seeds`` (:class:`marl.algos.seeds.SeedBatch`).
    ``iteration(progress)``: one collect + update of every run that trains (``progress[k]``:
    run k's budget progress), each run's metrics with ``env_steps_delta`` ({} for a run that
    no longer trains); ``sync(k)``: run k brought up to date to evaluate or checkpoint it."""

    #: the quantity that turned non-finite and stopped run k (None: it trains)
    stopped: list[str | None]
    #: the runs that spent their budget (they step no more)
    done: set[int]

    def iteration(self, progress: list[float]) -> list[dict[str, float]]: ...

    def sync(self, k: int) -> Any: ...


class _OneRun:
    """A single run, any :class:`Algorithm` (a user's registered one, a torchrun rank's), as
    the batch of one :func:`_train_loop` drives, and that batch's only run (its RNG states
    are the process's generators). Its non-finite guard raises NonFiniteError instead of
    stopping the run in ``stopped``."""

    def __init__(self, algo: Algorithm) -> None:
        self.algo = algo
        self.stopped: list[str | None] = [None]
        self.done: set[int] = set()

    def iteration(self, progress: list[float]) -> list[dict[str, float]]:
        return [self.algo.iteration(progress[0])]

    def sync(self, k: int) -> Algorithm:  # noqa: ARG002 - one run is always up to date
        return self.algo

    def rng(self) -> dict[str, Any]:
        return rng_state()

    def __getattr__(self, name: str) -> Any:  # policy, layout, last_advantages, state_dict
        return getattr(self.algo, name)


@dataclass
class _RunBook:
    """Run k's bookkeeping in :func:`_train_loop`: its config, run directory, logger and
    checkpoints, the update and env steps it reached, and how it ended."""

    k: int
    cfg: BaseConfig
    run: TrainedRun
    dir: RunDir
    logger: RunLogger
    checkpoints: Checkpoints
    update: int
    env_steps: int
    #: finished, or stopped on a non-finite value
    ended: bool = False
    #: the final evaluation ({} on ranks other than 0)
    result: dict[str, Any] | None = None

    def advance(
        self, metrics: dict[str, Any], dt: float, clock: TrainingClock, world_size: int
    ) -> dict[str, Any]:
        """Count the update of ``metrics`` (which took ``dt`` seconds); its metrics row: the
        update's number and the env steps (of every rank) after it, time_s and cpu_s (what
        the budget counts), sps and agent_sps, then the algorithm's metrics."""
        delta = int(metrics.pop("env_steps_delta")) * world_size
        self.update, self.env_steps = self.update + 1, self.env_steps + delta
        return {
            "update": self.update,
            "env_steps": self.env_steps,
            "time_s": clock.elapsed(),
            "cpu_s": clock.cpu(),
            "sps": delta / dt,
            "agent_sps": delta * self.run.layout.n_agents / dt,
            **metrics,
        }

    def close(self, batch: RunBatch, clock: TrainingClock) -> None:
        """The run's last checkpoint (brought up to date first); its logger closed."""
        batch.sync(self.k)
        self.checkpoints.save(self.update, self.env_steps, clock)
        self.logger.close()


def _finish(book: _RunBook, clock: TrainingClock, *, baselines: bool = True) -> dict[str, Any]:
    """The end of a run that trained to its budget (rank 0): the final evaluation, eval.json,
    the policy artifact with it (policy/), plots, GIF, the table, and last finished.json
    (everything a finished run holds is written). ``baselines``: the baselines' rows in the
    table, when configured (a batch prints them with its first run to finish)."""
    algo, run, cfg = book.run, book.dir, book.cfg
    episodes = cfg.final_eval_episodes or cfg.eval_episodes
    seeds = list(range(cfg.eval_seed, cfg.eval_seed + episodes))
    result = evaluate_policy(
        algo.policy,
        cfg.env_fn,
        cfg.env,
        seeds,
        deterministic=cfg.eval_deterministic,
        repeats=cfg.eval_repeats,
    )
    atomic_write_json(run.eval_json, result, final_newline=False)
    write_policy_artifact(
        run.path,
        algo.policy,
        cfg,
        update=book.update,
        env_steps=book.env_steps,
        provenance=book.checkpoints.history[-1],
        evaluation=result,
    )
    if cfg.plots:
        _write_plots(algo, cfg, run)
    if cfg.gif:
        _write_gif(algo, cfg, run, seeds[0])
    table = {cfg.algo: result}
    if cfg.baselines and baselines:
        table.update(_baseline_rows(cfg, seeds))
    print(
        f"\nEvaluation on {len(seeds)} validation seeds "
        f"({seeds[0]}..{seeds[-1]}), run dir {run.path}:"
    )
    print(format_table(table))
    record = _finished_record(book, clock, update=book.update)
    atomic_write_json(run.finished_json, record, final_newline=False)
    return result


def _write_plots(algo: TrainedRun, cfg: BaseConfig, run: RunDir) -> None:
    """plots/learning_curves.png (of metrics.jsonl) and plots/advantages.png (of the last
    update's advantages, when the algorithm kept them)."""
    title = f"{cfg.algo} / {cfg.backbone} / seed {cfg.seed}"
    curves = os.path.join(run.plots, "learning_curves.png")
    plot_learning_curves(read_metrics(run.metrics_jsonl), curves, title)
    adv = algo.last_advantages
    if adv:
        plot_advantage_histograms(
            adv,
            os.path.join(run.plots, "advantages.png"),
            f"last update, whitening={cfg.whitening}",
        )


def _write_gif(algo: TrainedRun, cfg: BaseConfig, run: RunDir, seed: int) -> None:
    """episode.gif: the episode of evaluation seed ``seed``; a failure is a line, not an
    error (it must not lose the run)."""
    try:
        with headless_rendering():
            frames = record_episode(
                algo.policy, cfg.env_fn, cfg.env, seed, deterministic=cfg.eval_deterministic
            )
        write_gif(frames, run.episode_gif)
    except Exception as exc:  # noqa: BLE001 - a GIF failure must not lose the run
        print(f"[marl.run.train] episode.gif not written: {exc}", file=sys.stderr)


def _warn(message: str) -> None:
    print(f"[marl.train] warning: {message}", file=sys.stderr, flush=True)


def configure_process(cfg: BaseConfig) -> None:
    """The process-wide settings a run asks for, applied before its first kernel runs: numba's
    threading layer (``--numba-threading-layer``) and glibc's allocator thresholds
    (``--malloc-tuning``; nothing to tune off glibc). :func:`train` calls it; so do the
    benchmarks that build a trainer themselves."""
    _set_threading_layer(cfg.numba_threading_layer)
    if cfg.malloc_tuning:
        set_malloc_thresholds()


def _set_threading_layer(name: str) -> None:
    """numba's threading layer for this process (``--numba-threading-layer``); a process whose
    numba already runs on another layer (e.g. a second run in one Python session) keeps it,
    with a warning ('auto' keeps it silently: it names no layer)."""
    if name == "default" or not numba_available():
        return
    if name == "auto":
        if numba_threading_layer() is not None:
            return
        name = auto_threading_layer()
    try:
        set_numba_threading_layer(name)
    except ValueError as exc:
        raise ConfigError(f"--numba-threading-layer {name}: {exc}") from None
    except RuntimeError as exc:
        _warn(f"--numba-threading-layer {name} not applied: {exc}")


def train(
    cfg: BaseConfig,
    options: RunOptions | None = None,
    *,
    resume: bool | None = None,
    overwrite: bool | None = None,
    keep_checkpoints: int | None = None,
    wandb: WandbOptions | None = None,
) -> dict[str, Any] | None:
    """Run training as configured; returns the final evaluation ({} on ranks other than 0),
    or None when SIGINT/SIGTERM interrupted it (a checkpoint was written).

    ``options`` (:func:`marl.run.config.parse_train_args`; default: a new run, nothing else):
    ``resume`` continues the run in that directory; ``overwrite`` lets a new run replace an
    existing one; ``keep_checkpoints`` how many checkpoints to keep (default: the resumed
    run's value, else :data:`marl.run.checkpoint.DEFAULT_KEEP`); ``wandb`` also logs to
    Weights & Biases (a resumed run continues its W&B run). The keyword arguments, when given,
    replace those options (``resume=True``: continue ``cfg.run_dir``).

    Everything is checked before anything is written: the run directory (an existing run is
    refused unless ``overwrite``), the device, the env, and on resume the newest checkpoint
    that loads (older ones are tried when a newer one is corrupt) and that it fits the
    algorithm.
    """
    options = _with_overrides(
        cfg,
        options,
        resume=resume,
        overwrite=overwrite,
        keep_checkpoints=keep_checkpoints,
        wandb=wandb,
    )
    resolve_budget(cfg)
    if options.resume is not None:
        finished = _finished_within_budget(cfg, options.resume)
        if finished is not None:
            return finished
    if options.wandb is not None:
        try:
            import_wandb()
        except WandbError as exc:
            raise ConfigError(str(exc)) from None
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: CUDA is not available here; allowed here: cpu, auto")
    configure_process(cfg)
    compile_clock()  # from here on numba's compilations are announced and timed
    ctx, device = _start_process(cfg)
    run = RunDir(options.resume or cfg.run_dir or _default_run_dir(cfg))
    cfg.run_dir = run.path
    if not options.resuming and ctx.is_main:  # rank 0 decides (the others may look later)
        run.check_new(options.overwrite)
    _check_env(cfg)
    algo_cls = get_algorithm(cfg.algo)
    start = _starting_point(run, options, ctx.is_main)
    seed = ctx.seed_offset(cfg.seed)
    _seed_everything(seed)
    algo = algo_cls(cfg, ctx, device)
    if start.resumed:
        _restore(algo, start, run, seed=seed, is_main=ctx.is_main)
    # everything is checked: from here on the run directory is written (rank 0 only)
    with contextlib.ExitStack() as held:
        if ctx.is_main:
            held.enter_context(run.claim(resume=options.resuming, overwrite=options.overwrite))
            config_yaml = yaml.safe_dump(config_to_dict(cfg), sort_keys=False)
            atomic_write_text(run.config_yaml, config_yaml)
        one = _OneRun(algo)
        results = _train_loop([cfg], ctx, one, [one], [run], [start], options.wandb)
    return None if results is None else results[0]


def _with_overrides(cfg: BaseConfig, options: RunOptions | None, **overrides: Any) -> RunOptions:
    """``options`` (default ``RunOptions()``) with the keyword arguments of :func:`train` that
    are not None; ``resume=True`` continues ``cfg.run_dir``."""
    given = {name: value for name, value in overrides.items() if value is not None}
    if given.get("resume") is True:
        if cfg.run_dir is None:
            raise ConfigError("resume=True: cfg.run_dir names no run directory to continue")
        given["resume"] = cfg.run_dir
    elif given.get("resume") is False:
        given["resume"] = None
    return dataclasses.replace(options or RunOptions(), **given)


def _start_process(cfg: BaseConfig) -> tuple[distributed.DistContext, torch.device]:
    """The process group (under torchrun), torch's thread count and the device."""
    ctx = _init_distributed(cfg)
    # default: up to 2 threads per process, the cores shared among torchrun's local ranks
    local_world = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    threads = cfg.torch_threads or max(1, min(2, (os.cpu_count() or 1) // local_world))
    torch.set_num_threads(threads)
    device = torch.device(
        "cuda"
        if cfg.device == "auto" and torch.cuda.is_available()
        else ("cpu" if cfg.device == "auto" else cfg.device)
    )
    return ctx, device


def _starting_point(run: RunDir, options: RunOptions, is_main: bool) -> Start:
    """A new run's start; on resume the newest checkpoint that loads (each newer one that does
    not is reported, on rank 0). The checkpoints kept: ``--keep-checkpoints``, else the resumed
    run's value, else :data:`marl.run.checkpoint.DEFAULT_KEEP`."""
    keep = options.keep_checkpoints
    if not options.resuming:
        return Start(keep=int(keep or DEFAULT_KEEP))
    payload, path, _ = load_newest_checkpoint(run.path, warn=_warn if is_main else None)
    if keep is None:
        keep = payload.get("keep_checkpoints")
    return Start(keep=int(keep or DEFAULT_KEEP), payload=payload, path=path)


def _restore(algo: Algorithm, start: Start, run: RunDir, *, seed: int, is_main: bool) -> None:
    """Load the resumed checkpoint into ``algo`` and restore the RNGs (rank 0: the saved ones;
    the other ranks are seeded anew from their seed and the update)."""
    assert start.payload is not None and start.path is not None
    try:
        algo.load_state_dict(start.payload["algo"])
    except (KeyError, RuntimeError, ValueError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(
            f"checkpoint {start.path} does not fit the run's configuration ({first})"
        ) from exc
    if is_main:
        set_rng_state(start.payload["rng"])
    else:
        _seed_everything(seed + start.update)
    if is_main:
        print(
            f"[marl.train] resuming {run.path} from {os.path.relpath(start.path, run.path)} "
            f"(update {start.update}, {start.env_steps} env steps)",
            file=sys.stderr,
            flush=True,
        )


def _finished_within_budget(cfg: BaseConfig, run_dir: str) -> dict[str, Any] | None:
    """``--resume`` of a run that finished (finished.json) within the budget it is given now:
    one line saying so and the run's final evaluation (eval.json; {} without one), every file
    left as it is; None when the run is unfinished or the budget is larger."""
    try:
        with open(RunDir(run_dir).finished_json) as fh:
            marker = json.load(fh)
        env_steps, time_s = int(marker["env_steps"]), float(marker["time_s"])
        cpu_s = float(marker.get("cpu_s", time_s))  # markers from before --max-cpu-time
    except (OSError, ValueError, KeyError, TypeError):
        return None  # unfinished, or a damaged marker: the resume rewrites it
    budget = Budget(cfg)
    if budget.progress(env_steps, time_s, cpu_s) < 1.0:
        return None
    if os.environ.get("RANK", "0") == "0":  # under torchrun: rank 0 says it
        print(
            f"[marl.train] {run_dir} finished at {env_steps} env steps ({time_s:.0f} s, "
            f"{cpu_s:.0f} CPU s), which spends its budget {budget.describe()}: nothing to do, "
            "nothing written; give a larger --total-steps, --max-time or --max-cpu-time to "
            "continue ('none' lifts a limit)",
            file=sys.stderr,
            flush=True,
        )
    try:
        with open(RunDir(run_dir).eval_json) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {}


def _finished_record(book: _RunBook, clock: TrainingClock, *, update: int) -> dict[str, Any]:
    """finished.json of the run at ``update``: the work it consumed (env steps, wall and CPU
    seconds, over all its invocations), the budget it was given, and its provenance:
    ``commit`` / ``dirty`` of the invocation that finished it, ``commits`` of every invocation
    (more than one when it was resumed under other code) and the last invocation's full
    :func:`provenance` record."""
    cfg, history = book.cfg, book.checkpoints.history
    last = history[-1]
    commits = list(dict.fromkeys(p.get("commit") for p in history if p.get("commit")))
    return {
        "update": update,
        "env_steps": book.env_steps,
        "time_s": clock.elapsed(),
        "cpu_s": clock.cpu(),
        "checkpoint": book.checkpoints.relative_path(),
        "budget": {
            "total_steps": cfg.total_steps,
            "max_time": cfg.max_time,
            "max_cpu_time": cfg.max_cpu_time,
        },
        "commit": last.get("commit"),
        "dirty": any(bool(p.get("dirty")) for p in history),
        "commits": commits,
        "invocations": len(history),
        "provenance": last,
    }


def _evaluation_row(cfg: BaseConfig, algo: TrainedRun) -> dict[str, float]:
    """An evaluation during training (``eval_episodes`` seeds from ``eval_seed``): its numeric
    figures as ``eval/`` keys of the metrics row, with the short names of docs/CONTRACTS.md
    section 4 too (eval/success, eval/solved)."""
    seeds = list(range(cfg.eval_seed, cfg.eval_seed + cfg.eval_episodes))
    res = evaluate_policy(
        algo.policy,
        cfg.env_fn,
        cfg.env,
        seeds,
        deterministic=cfg.eval_deterministic,
        repeats=cfg.eval_repeats,
    )
    row = {
        f"eval/{k}": v
        for k, v in res.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    for short, long in (("success", "success_rate"), ("solved", "solved_rate")):
        if f"eval/{long}" in row:
            row[f"eval/{short}"] = row[f"eval/{long}"]
    return row


def _train_loop(
    cfgs: list[BaseConfig],
    ctx: distributed.DistContext,
    batch: RunBatch,
    runs: list[TrainedRun],
    dirs: list[RunDir],
    starts: list[Start],
    wandb: WandbOptions | None = None,
) -> list[dict[str, Any] | None] | None:
    """The story of S >= 1 runs trained together once their directories are prepared (and
    locked): iterate, log, evaluate and checkpoint until a run's budget is spent, then finish
    it (final evaluation, plots, finished.json last; a run whose env steps per update vary,
    GRPO's, may finish before the others). A run of a batch that stops on a non-finite value
    records why and the others go on (one run's NonFiniteError propagates). Returns each
    run's final evaluation (None: it stopped), or None when SIGINT/SIGTERM stopped the loop
    (every training run checkpointed)."""
    S, cfg, is_main = len(cfgs), cfgs[0], ctx.is_main
    books = _run_books(cfgs, runs, dirs, starts, wandb, enabled=is_main)
    cadence = Cadence(cfg.eval_every, cfg.checkpoint_every, evaluates=is_main)
    budget = Budget(cfg)
    label = cfg.algo if S == 1 else f"{cfg.algo} x{S} seeds"
    bar = ProgressBar(budget, label, starts[0].position, enabled=is_main and cfg.progress)
    try:
        with StopSignals(announce=is_main) as stop:
            clock = TrainingClock(starts[0].elapsed, starts[0].cpu)
            while True:
                progress = _agreed_progress(budget, [b.env_steps for b in books], clock, ctx)
                due = [b for b in books if not b.ended and progress[b.k] >= 1.0]
                if due and len(due) == sum(not b.ended for b in books):
                    bar.close()  # the last runs finish
                for book in due:  # the final checkpoint, then (rank 0) the run's end
                    first = all(b.result is None for b in books)  # prints the baselines' rows
                    book.ended = True
                    batch.done.add(book.k)
                    book.close(batch, clock)
                    stop.finishing = S == 1  # one run: a signal stops its final evaluation
                    book.result = _finish(book, clock, baselines=first) if is_main else {}
                if all(b.ended for b in books) or (due and stop.requested):
                    break  # (a signal during a final evaluation of a batch's run)
                t_iter = time.perf_counter()
                rows = batch.iteration(progress)
                dt = time.perf_counter() - t_iter
                shown = next(b for b in books if not b.ended)  # the bar's run
                for book, metrics in zip(books, rows, strict=True):
                    if not metrics:
                        continue
                    row = book.advance(metrics, dt, clock, ctx.world_size)
                    if cadence.evaluate_at(book.update):
                        batch.sync(book.k)
                        row.update(_evaluation_row(book.cfg, book.run))
                    book.logger.log(row)
                    if book is shown:
                        bar.show(row)
                    if cadence.checkpoint_at(book.update):
                        batch.sync(book.k)
                        book.checkpoints.save(book.update, book.env_steps, clock)
                for book in books:
                    if batch.stopped[book.k] is not None and not book.ended:
                        _record_stop(book, batch.stopped[book.k], clock)
                if _stop_agreed(stop, ctx):
                    break
            bar.close()
            training = [b for b in books if not b.ended]
            for book in training:
                book.close(batch, clock)
            if training:  # interrupted
                if is_main:
                    _say_interrupted(stop, books)
                return None
    except (NonFiniteError, OSError, KeyboardInterrupt) as exc:
        kept = " ".join(b.checkpoints.kept_note() for b in books)
        exc.marl_kept = kept  # type: ignore[attr-defined]
        raise
    finally:
        bar.close()
        for book in books:
            if not book.logger.closed:
                with contextlib.suppress(OSError):
                    book.logger.close()
    if ctx.enabled:
        distributed.shutdown(ctx)
    return [b.result for b in books]


def _run_books(
    cfgs: list[BaseConfig],
    runs: list[TrainedRun],
    dirs: list[RunDir],
    starts: list[Start],
    wandb: WandbOptions | None,
    *,
    enabled: bool,
) -> list[_RunBook]:
    """Each run's logger (metrics.jsonl, TensorBoard and W&B; a resumed run's rows and events
    past its checkpoint are dropped, and its W&B run continued), provenance and checkpoints,
    written on rank 0 (``enabled``); a resumed run's policy artifact is rewritten to the
    update it continues from."""
    books = []
    for k, (cfg, run, rundir, start) in enumerate(zip(cfgs, runs, dirs, starts, strict=True)):
        logger = RunLogger(
            rundir.path,
            enabled=enabled,
            resume_update=start.update if start.resumed else None,
            resume_env_steps=start.env_steps if start.resumed else None,
            wandb=wandb if enabled else None,
            wandb_config=config_to_dict(cfg),
            wandb_resume_id=start.wandb_run_id,
        )
        # provenance of every invocation of this run (a resumed run keeps its earlier parts')
        history = [*start.provenance, provenance()]
        checkpoints = Checkpoints(
            cfg, run, rundir, start, logger, history, enabled=enabled, rng=run.rng
        )
        if enabled and start.resumed:  # the artifact of the timeline resumed
            checkpoints.write_policy(start.update, start.env_steps)
        books.append(
            _RunBook(k, cfg, run, rundir, logger, checkpoints, start.update, start.env_steps)
        )
    return books


def _agreed_progress(
    budget: Budget, env_steps: list[int], clock: TrainingClock, ctx: distributed.DistContext
) -> list[float]:
    """Each run's budget progress; every rank takes rank 0's (they stop together)."""
    progress = [budget.progress(e, clock.elapsed(), clock.cpu()) for e in env_steps]
    if ctx.enabled:
        progress = [float(p) for p in distributed.broadcast_object(progress, ctx)]
    return progress


def _record_stop(book: _RunBook, reason: str, clock: TrainingClock) -> None:
    """finished.json of a run of a batch that stopped on a non-finite value: why, at which
    update, the checkpoint kept (no eval.json); the other runs go on."""
    book.ended = True
    error, update = NonFiniteError(reason), book.update + 1
    record = _finished_record(book, clock, update=update)
    record["stopped"] = f"{error}. {book.checkpoints.kept_note()}"
    book.logger.close()
    atomic_write_json(book.dir.finished_json, record, final_newline=False)
    _warn(f"seed {book.cfg.seed} stopped at update {update}: {error}; the other seeds go on")


def _stop_agreed(stop: StopSignals, ctx: distributed.DistContext) -> bool:
    """Whether a stop signal came, on any rank (every rank stops with it)."""
    if ctx.enabled:
        flag = torch.tensor([float(stop.requested)], device=ctx.device)
        stop.requested = bool(distributed.all_reduce_sum(flag, ctx).item() > 0)
    return stop.requested


def _say_interrupted(stop: StopSignals, books: list[_RunBook]) -> None:
    """Where the interrupted runs' checkpoints are and how to continue them (a batch: its
    directory, the seed runs' parent)."""
    one, path = books[0], books[0].dir.path
    said = f"checkpoint {one.checkpoints.path} (update {one.update}) written{stop.since()}"
    if len(books) > 1:
        said, path = "every training seed's checkpoint written", os.path.dirname(path)
    print(
        f"[marl.train] interrupted: {said}; continue with: python -m marl.train --resume {path}",
        file=sys.stderr,
        flush=True,
    )


#: errno values of a file-system fault (full disk, quota, read-only, permissions, I/O)
_FS_ERRNOS = frozenset(
    getattr(errno, name)
    for name in ("ENOSPC", "EDQUOT", "EROFS", "EACCES", "EPERM", "EFBIG", "EIO", "ENOTDIR")
    if hasattr(errno, name)
)


def _is_file_system_error(exc: OSError) -> bool:
    """An OSError about a path (or a full / read-only disk), reported as an ``error:`` line;
    others (a broken pipe to a worker, ...) keep their traceback."""
    return exc.filename is not None or exc.errno in _FS_ERRNOS


def _describe_os_error(exc: OSError) -> str:
    """``file-system error on 'PATH': cause (ERRNO)`` for an error line."""
    cause = exc.strerror or str(exc)
    code = errno.errorcode.get(exc.errno or -1)
    where = f" on {exc.filename!r}" if exc.filename else ""
    return f"file-system error{where}: {cause}" + (f" ({code})" if code else "")


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the process exit status: 0 finished, 1 stopped by the
    non-finite guard, 2 bad input or a file-system error, :data:`EXIT_INTERRUPTED` (3)
    interrupted by SIGINT/SIGTERM with a checkpoint written."""
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:
        parser = build_parser()
        add_wandb_arguments(parser)
        parser.add_argument_group("many seeds in one process (marl.run.train_seeds)").add_argument(
            "--seeds",
            metavar="SPEC",
            help="Train several seeds as one batch through one rollout and one update "
            "(mappo, grpo): a range 0-15, a list 0,3,7 or both (0-3,8); excludes --seed. "
            "Writes "
            "RUN_DIR/seed_<k>/ per seed, each a complete run directory; --resume RUN_DIR "
            "continues the batch. Seed k equals --seeds k bit for bit (one thread).",
        )
        parser.print_help()
        return 0
    try:
        cfg, options = parse_train_args(argv)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if options.resuming and not list_checkpoints(cfg.run_dir):
        print(
            f"error: --resume {cfg.run_dir!r}: no checkpoint in {cfg.run_dir}/checkpoints (the "
            "run stopped before its first checkpoint); start it again with --run-dir "
            f"{cfg.run_dir} --overwrite",
            file=sys.stderr,
        )
        return 2
    try:
        result = train(cfg, options)
    except (ConfigError, RunDirError, CheckpointError, RunDirBusyError, WandbError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except NonFiniteError as exc:
        print(f"error: {exc}. {getattr(exc, 'marl_kept', '')}".rstrip(), file=sys.stderr)
        return 1
    except OSError as exc:
        if not _is_file_system_error(exc):
            raise
        note = getattr(exc, "marl_kept", "")
        print(f"error: {_describe_os_error(exc)}. {note}".rstrip(), file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        note = getattr(exc, "marl_kept", "nothing was written yet")
        print(f"\n[marl.train] interrupted at once. {note}", file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_INTERRUPTED if result is None else 0


if __name__ == "__main__":
    raise SystemExit(main())
