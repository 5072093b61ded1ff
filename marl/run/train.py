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

import argparse
import contextlib
import errno
import importlib
import json
import math
import os
import random
import shutil
import signal
import sys
import threading
import time
from typing import Any

import numpy as np
import torch
import yaml
from tqdm import tqdm

from marl.algos import ALGORITHMS, Algorithm, register_algorithm, resolve_algorithm
from marl.collect import BaselineActor, evaluate_episodes
from marl.core.losses import NonFiniteError
from marl.envapi import make_vector_env
from marl.run import distributed
from marl.run.artifact import write_policy_artifact
from marl.run.checkpoint import (
    DEFAULT_KEEP,
    CheckpointError,
    RunDirBusyError,
    list_checkpoints,
    load_newest_checkpoint,
    lock_run_dir,
    rng_state,
    save_run_checkpoint,
    set_rng_state,
)
from marl.run.compile_clock import compile_clock
from marl.run.config import (
    DEMO_MAX_TIME,
    EXIT_INTERRUPTED,
    BaseConfig,
    ConfigError,
    build_parser,
    config_to_dict,
    parse_cli,
)
from marl.run.evaluate import evaluate_policy, format_table, record_episode
from marl.run.plots import (
    headless_rendering,
    plot_advantage_histograms,
    plot_learning_curves,
    write_gif,
)
from marl.run.provenance import provenance
from marl.run.rundir import FINISHED_MARKER
from marl.run.runlog import (
    RunLogger,
    WandbError,
    WandbOptions,
    add_wandb_arguments,
    import_wandb,
    read_metrics,
    wandb_options_from_args,
)
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
    "register_algorithm",
    "configure_process",
    "get_algorithm",
    "run_dir_contents",
    "train",
    "main",
    "resolve_budget",
]


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


class _Budget:
    """Progress in [0, 1]: the largest of step, wall-time and CPU-time progress (of a budget
    resolved by :func:`resolve_budget`)."""

    def __init__(self, cfg: BaseConfig) -> None:
        self.total_steps = cfg.total_steps
        self.max_time = cfg.max_time
        self.max_cpu_time = cfg.max_cpu_time
        if self.total_steps is None and self.max_time is None and self.max_cpu_time is None:
            raise ValueError("no budget: resolve_budget(cfg) first")

    def progress(self, env_steps: int, elapsed: float, cpu: float) -> float:
        """``elapsed``: wall seconds of training so far; ``cpu``: CPU seconds so far."""
        p = 0.0
        if self.total_steps is not None:
            p = max(p, env_steps / self.total_steps)
        if self.max_time is not None:
            p = max(p, elapsed / self.max_time)
        if self.max_cpu_time is not None:
            p = max(p, cpu / self.max_cpu_time)
        return p

    def describe(self) -> str:
        """The budget as flags, e.g. ``--total-steps 4000 --max-time 180``."""
        limits = (
            ("--total-steps", self.total_steps),
            ("--max-time", self.max_time),
            ("--max-cpu-time", self.max_cpu_time),
        )
        return " ".join(
            f"{flag} {int(value) if float(value).is_integer() else value}"
            for flag, value in limits
            if value is not None
        )

    def bar_total(self) -> tuple[float, str]:
        """What the progress bar counts: (its total, its unit: 'step', 's' or 'cpu s')."""
        if self.total_steps is not None:
            return self.total_steps, "step"
        if self.max_time is not None:
            return self.max_time, "s"
        return float(self.max_cpu_time), "cpu s"  # type: ignore[arg-type]


class _ProgressLines:
    """The progress bar where stderr is not a terminal (a log file, a pipe, a scheduler's
    output): one plain line every :attr:`interval` seconds instead of tqdm's carriage-return
    frames, e.g. ``[marl.train] mappo 33.3% of budget (64/192 step, 00:30 elapsed):
    update=1 env_steps=64 agent_sps=2133 eval_success=0.50``. It takes the calls the training
    loop makes on a tqdm bar (``n``, ``total``, ``set_postfix``, ``refresh``, ``close``)."""

    interval: float = 30.0
    #: the bar's postfix names -> the names in the line (those of metrics.jsonl)
    _NAMES = {
        "upd": "update",
        "steps": "env_steps",
        "sps": "agent_sps",
        "succ": "episode_success",
        "ret": "episode_return",
        "eval": "eval_success",
    }

    def __init__(self, total: float, initial: int, desc: str, unit: str) -> None:
        self.total, self.n, self.desc, self.unit = total, initial, desc, unit
        self.postfix: dict[str, Any] = {}
        self.start = self.last = time.perf_counter()

    def set_postfix(self, postfix: dict[str, Any], refresh: bool = False) -> None:  # noqa: ARG002
        self.postfix = dict(postfix)

    def refresh(self) -> None:
        """Write a line if :attr:`interval` seconds have passed since the last one."""
        now = time.perf_counter()
        if now - self.last < self.interval:
            return
        self.last = now
        fields = " ".join(f"{self._NAMES.get(k, k)}={v}" for k, v in self.postfix.items())
        print(
            f"[marl.train] {self.desc} {self.n / self.total:.1%} of budget ({self.n}/"
            f"{self.total:.0f} {self.unit}, {tqdm.format_interval(now - self.start)} elapsed): "
            f"{fields}",
            file=sys.stderr,
            flush=True,
        )

    def close(self) -> None:
        pass


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


def _write_json(path: str, obj: Any) -> None:
    with open(path + ".tmp", "w") as fh:
        json.dump(obj, fh, indent=2)
    os.replace(path + ".tmp", path)


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


def _finish(
    algo,
    cfg: BaseConfig,
    run_dir: str,
    rows: list[dict] | None,
    *,
    update: int = 0,
    env_steps: int = 0,
    provenance_record: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Final evaluation, eval.json, the policy artifact with it (policy/), plots, GIF and the
    table (rank 0)."""
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
    _write_json(os.path.join(run_dir, "eval.json"), result)
    write_policy_artifact(
        run_dir,
        algo.policy,
        cfg,
        update=update,
        env_steps=env_steps,
        provenance=provenance_record,
        evaluation=result,
    )
    if cfg.plots:
        metrics_rows = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
        title = f"{cfg.algo} / {cfg.backbone} / seed {cfg.seed}"
        plot_learning_curves(
            metrics_rows, os.path.join(run_dir, "plots", "learning_curves.png"), title
        )
        adv = algo.last_advantages
        if adv:
            plot_advantage_histograms(
                adv,
                os.path.join(run_dir, "plots", "advantages.png"),
                f"last update, whitening={cfg.whitening}",
            )
    if cfg.gif:
        try:
            with headless_rendering():
                frames = record_episode(
                    algo.policy,
                    cfg.env_fn,
                    cfg.env,
                    seeds[0],
                    deterministic=cfg.eval_deterministic,
                )
            write_gif(frames, os.path.join(run_dir, "episode.gif"))
        except Exception as exc:  # noqa: BLE001 - a GIF failure must not lose the run
            print(f"[marl.run.train] episode.gif not written: {exc}", file=sys.stderr)
    table = {cfg.algo: result}
    if cfg.baselines:
        table.update(_baseline_rows(cfg, seeds))
    print(
        f"\nEvaluation on {len(seeds)} validation seeds "
        f"({seeds[0]}..{seeds[-1]}), run dir {run_dir}:"
    )
    print(format_table(table))
    return result


#: The files and folders a run writes in its directory: a directory holding any of them is a
#: run (and is refused as the --run-dir of a new run without --overwrite).
RUN_FILES = ("config.yaml", "metrics.jsonl", "eval.json", "episode.gif", FINISHED_MARKER)
RUN_FOLDERS = ("checkpoints", "policy", "tb", "plots")


def run_dir_contents(run_dir: str) -> list[str]:
    """The run files and folders present in ``run_dir`` ([] for a missing or empty directory,
    or one holding only other files)."""
    if not os.path.isdir(run_dir):
        return []
    return [n for n in RUN_FILES + RUN_FOLDERS if os.path.lexists(os.path.join(run_dir, n))]


def _check_new_run_dir(run_dir: str, overwrite: bool) -> None:
    """A new run must not silently destroy an existing one."""
    if os.path.lexists(run_dir) and not os.path.isdir(run_dir):
        raise ConfigError(f"--run-dir {run_dir!r} exists and is not a directory")
    found = run_dir_contents(run_dir)
    if found and not overwrite:
        raise ConfigError(
            f"--run-dir {run_dir!r} already holds a run ({', '.join(found)}): continue it "
            f"with --resume {run_dir}, or start it again with --overwrite (deletes those "
            "files), or choose another --run-dir"
        )


def _remove_run_files(run_dir: str) -> None:
    """--overwrite: delete the previous run's files (only those; other files stay)."""
    for name in RUN_FOLDERS:
        path = os.path.join(run_dir, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.remove(path)
    for name in RUN_FILES:
        if os.path.lexists(os.path.join(run_dir, name)):
            os.remove(os.path.join(run_dir, name))


def _warn(message: str) -> None:
    print(f"[marl.train] warning: {message}", file=sys.stderr, flush=True)


def _kept_note(saved: dict[str, Any], cfg: BaseConfig) -> str:
    """What a failed run kept: its newest good checkpoint, or that it had none yet."""
    if saved["path"] is not None:
        return (
            f"The last good checkpoint is kept: {saved['path']} (update {saved['update']}); "
            f"python -m marl.train --resume {cfg.run_dir} continues from it."
        )
    return (
        "No checkpoint was kept: the run stopped before its first checkpoint (due at update "
        f"{cfg.checkpoint_every}, --checkpoint-every)."
    )


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
    *,
    resume: bool = False,
    overwrite: bool | None = None,
    keep_checkpoints: int | None = None,
    wandb: WandbOptions | None = None,
) -> dict[str, Any] | None:
    """Run training as configured; returns the final evaluation ({} on ranks other than 0),
    or None when SIGINT/SIGTERM interrupted it (a checkpoint was written).

    Everything is checked before anything is written: the run directory (an existing run is
    refused unless ``overwrite``; default ``cfg._overwrite`` from ``--overwrite``), the device,
    the env, and on ``resume`` the newest checkpoint that loads (older ones are tried when a
    newer one is corrupt) and that it fits the algorithm. ``keep_checkpoints``: how many
    checkpoints to keep (default ``--keep-checkpoints``, else the resumed run's value, else
    :data:`marl.run.checkpoint.DEFAULT_KEEP`). ``wandb``: also log to Weights & Biases
    (default ``cfg._wandb`` from ``--wandb``; a resumed run continues its W&B run).
    """
    resolve_budget(cfg)
    if resume and cfg.run_dir is not None:
        finished = _finished_within_budget(cfg, cfg.run_dir)
        if finished is not None:
            return finished
    if wandb is None:
        wandb = getattr(cfg, "_wandb", None)
    if wandb is not None:
        try:
            import_wandb()
        except WandbError as exc:
            raise ConfigError(str(exc)) from None
    if overwrite is None:
        overwrite = bool(getattr(cfg, "_overwrite", False))
    if keep_checkpoints is None:
        keep_checkpoints = getattr(cfg, "_keep_checkpoints", None)
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: CUDA is not available here; allowed here: cpu, auto")
    configure_process(cfg)
    compile_clock()  # from here on numba's compilations are announced and timed
    ctx = _init_distributed(cfg)
    is_main = ctx.is_main
    # default: up to 2 threads per process, the cores shared among torchrun's local ranks
    local_world = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    threads = cfg.torch_threads or max(1, min(2, (os.cpu_count() or 1) // local_world))
    torch.set_num_threads(threads)
    device = torch.device(
        "cuda"
        if cfg.device == "auto" and torch.cuda.is_available()
        else ("cpu" if cfg.device == "auto" else cfg.device)
    )
    run_dir = cfg.run_dir or _default_run_dir(cfg)
    cfg.run_dir = run_dir
    if not resume and is_main:  # rank 0 decides (the others may look after it wrote)
        _check_new_run_dir(run_dir, overwrite)
    _check_env(cfg)
    algo_cls = get_algorithm(cfg.algo)
    ckpt, ckpt_path = None, None
    if resume:
        ckpt, ckpt_path, _ = load_newest_checkpoint(run_dir, warn=_warn if is_main else None)
        if keep_checkpoints is None:
            keep_checkpoints = ckpt.get("keep_checkpoints")
    keep = int(keep_checkpoints or DEFAULT_KEEP)
    seed = ctx.seed_offset(cfg.seed)
    _seed_everything(seed)
    algo = algo_cls(cfg, ctx, device)
    update, env_steps, elapsed_before, cpu_before = 0, 0, 0.0, 0.0
    if ckpt is not None:
        try:
            algo.load_state_dict(ckpt["algo"])
        except (KeyError, RuntimeError, ValueError, TypeError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise CheckpointError(
                f"checkpoint {ckpt_path} does not fit the run's configuration ({first})"
            ) from exc
        update, env_steps = int(ckpt["update"]), int(ckpt["env_steps"])
        elapsed_before = float(ckpt["elapsed"])
        # checkpoints from before the CPU-time budget: their wall time bounds the CPU time of a
        # one-thread run from above (no run goes over its --max-cpu-time for the missing key)
        cpu_before = float(ckpt.get("cpu_elapsed", elapsed_before))
        if is_main:
            set_rng_state(ckpt["rng"])
        else:
            _seed_everything(seed + update)
        if is_main:
            print(
                f"[marl.train] resuming {run_dir} from {os.path.relpath(ckpt_path, run_dir)} "
                f"(update {update}, {env_steps} env steps)",
                file=sys.stderr,
                flush=True,
            )
    # everything is checked: from here on the run directory is written (rank 0 only)
    with contextlib.ExitStack() as held:
        if is_main:
            os.makedirs(run_dir, exist_ok=True)
            held.enter_context(lock_run_dir(run_dir))
            if not resume and overwrite:
                _remove_run_files(run_dir)
            # the marker (and eval.json) of a finished run: a continued or restarted run removes
            # them first
            outputs = (FINISHED_MARKER, "eval.json")
            for stale in outputs if resume else (*outputs, "episode.gif"):
                if os.path.exists(os.path.join(run_dir, stale)):
                    os.remove(os.path.join(run_dir, stale))
            if not resume:
                for stale_dir in ("tb", "checkpoints", "policy", "plots"):
                    shutil.rmtree(os.path.join(run_dir, stale_dir), ignore_errors=True)
            _write_text(
                os.path.join(run_dir, "config.yaml"),
                yaml.safe_dump(config_to_dict(cfg), sort_keys=False),
            )
        return _train_loop(
            cfg,
            ctx,
            algo,
            run_dir,
            resume,
            keep,
            update,
            env_steps,
            (elapsed_before, cpu_before),
            ckpt_path,
            wandb=wandb,
            wandb_resume_id=ckpt.get("wandb_run_id") if ckpt is not None else None,
            earlier_provenance=ckpt.get("provenance") if ckpt is not None else None,
        )


def _finished_within_budget(cfg: BaseConfig, run_dir: str) -> dict[str, Any] | None:
    """``--resume`` of a run that finished (finished.json) within the budget it is given now:
    one line saying so and the run's final evaluation (eval.json; {} without one), every file
    left as it is; None when the run is unfinished or the budget is larger."""
    try:
        with open(os.path.join(run_dir, FINISHED_MARKER)) as fh:
            marker = json.load(fh)
        env_steps, time_s = int(marker["env_steps"]), float(marker["time_s"])
        cpu_s = float(marker.get("cpu_s", time_s))  # markers from before --max-cpu-time
    except (OSError, ValueError, KeyError, TypeError):
        return None  # unfinished, or a damaged marker: the resume rewrites it
    budget = _Budget(cfg)
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
        with open(os.path.join(run_dir, "eval.json")) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {}


def _finished_record(
    cfg: BaseConfig,
    history: list[dict[str, Any]],
    *,
    update: int,
    env_steps: int,
    time_s: float,
    cpu_s: float,
    checkpoint: str | None,
) -> dict[str, Any]:
    """finished.json: the work the run consumed (env steps, wall and CPU seconds, over all its
    invocations), the budget it was given, and its provenance: ``commit`` / ``dirty`` of the
    invocation that finished it, ``commits`` of every invocation (more than one when it was
    resumed under other code) and the last invocation's full :func:`provenance` record."""
    last = history[-1]
    commits = list(dict.fromkeys(p.get("commit") for p in history if p.get("commit")))
    return {
        "update": update,
        "env_steps": env_steps,
        "time_s": time_s,
        "cpu_s": cpu_s,
        "checkpoint": checkpoint,
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


def _write_text(path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically; an OSError names ``path``."""
    try:
        with open(path + ".tmp", "w") as fh:
            fh.write(text)
        os.replace(path + ".tmp", path)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror or str(exc), path) from exc


def _train_loop(
    cfg: BaseConfig,
    ctx: distributed.DistContext,
    algo: Algorithm,
    run_dir: str,
    resume: bool,
    keep: int,
    update: int,
    env_steps: int,
    before: tuple[float, float],
    ckpt_path: str | None,
    *,
    wandb: WandbOptions | None = None,
    wandb_resume_id: str | None = None,
    earlier_provenance: list[dict[str, Any]] | None = None,
) -> dict[str, Any] | None:
    """The loop of :func:`train` once the run directory is prepared (and locked).

    ``before``: (wall seconds, CPU seconds) of training in earlier invocations (a resume);
    ``earlier_provenance``: their :func:`marl.run.provenance.provenance` records.
    """
    elapsed_before, cpu_before = before
    is_main = ctx.is_main
    world = ctx.world_size
    budget = _Budget(cfg)
    logger = RunLogger(
        run_dir,
        enabled=is_main,
        resume_update=update if resume else None,
        resume_env_steps=env_steps if resume else None,
        wandb=wandb if is_main else None,
        wandb_config=config_to_dict(cfg),
        wandb_resume_id=wandb_resume_id,
    )
    agents = algo.layout.n_agents
    saved: dict[str, Any] = {"path": ckpt_path, "update": update if resume else None}
    # provenance of every invocation of this run (a resumed run keeps its earlier parts')
    history = [*(earlier_provenance or []), provenance()]

    def save(path_update: int) -> None:
        if not is_main or saved["update"] == path_update:
            return
        for p in algo.policy.parameters():
            if not torch.isfinite(p).all():
                raise NonFiniteError("policy parameters (checkpoint not written)")
        payload = {
            "algo": algo.state_dict(),
            "update": path_update,
            "env_steps": env_steps,
            "elapsed": elapsed_now(),
            "cpu_elapsed": cpu_now(),
            "rng": rng_state(),
            "config": config_to_dict(cfg),
            "keep_checkpoints": keep,
            # kept through resumes without --wandb, for a later one with it
            "wandb_run_id": logger.wandb_run_id or wandb_resume_id,
            "provenance": history,
        }
        logger.flush()  # the TensorBoard events up to this update are on disk first
        saved["path"] = save_run_checkpoint(run_dir, path_update, payload, keep)
        saved["update"] = path_update
        # the policy apart from the resume state (no pickle), so that an interrupted run can
        # be evaluated and exported too
        write_policy_artifact(
            run_dir,
            algo.policy,
            cfg,
            update=path_update,
            env_steps=env_steps,
            provenance=history[-1],
        )

    if is_main and resume:  # the artifact of the timeline resumed (no final evaluation yet)
        write_policy_artifact(
            run_dir, algo.policy, cfg, update=update, env_steps=env_steps, provenance=history[-1]
        )

    # SIGINT (Ctrl-C) and SIGTERM (schedulers, timeout, marl.compare): finish the update,
    # write a checkpoint, exit EXIT_INTERRUPTED. A second SIGINT stops at once; repeated
    # SIGTERMs do not (a scheduler or a dying parent may send several). During the final
    # evaluation either signal stops at once (the final checkpoint is already written).
    stop: dict[str, Any] = {"flag": False, "signal": None, "at": None, "finishing": False}

    def on_signal(signum: int, frame: Any) -> None:  # noqa: ARG001
        if stop["finishing"] or (signum == signal.SIGINT and stop["flag"]):
            raise KeyboardInterrupt
        if not stop["flag"]:
            stop.update(flag=True, signal=signal.Signals(signum).name, at=time.perf_counter())
            if is_main:
                print(
                    f"\n[marl.train] {stop['signal']} received: stopping after this update "
                    "and writing a checkpoint (Ctrl-C again to stop at once)",
                    file=sys.stderr,
                    flush=True,
                )

    handled = (signal.SIGINT, signal.SIGTERM)
    old_handlers = {s: signal.signal(s, on_signal) for s in handled} if _main_thread() else {}
    bar = None
    # the bar counts env steps towards --total-steps, else seconds towards --max-time, else
    # CPU seconds towards --max-cpu-time
    bar_total, bar_unit = budget.bar_total()
    bar_in_steps = bar_unit == "step"

    def bar_position(steps: int, elapsed: float, cpu: float) -> int:
        return steps if bar_in_steps else int(elapsed if bar_unit == "s" else cpu)

    if is_main and cfg.progress and not sys.stderr.isatty():
        bar = _ProgressLines(
            bar_total, bar_position(env_steps, elapsed_before, cpu_before), cfg.algo, bar_unit
        )
    elif is_main and cfg.progress:
        bar = tqdm(
            total=bar_total if bar_in_steps else math.ceil(bar_total),
            initial=bar_position(env_steps, elapsed_before, cpu_before),
            desc=f"{cfg.algo}",
            unit=bar_unit,
            unit_scale=bar_in_steps,
            # seconds of budget per second is no rate: show the times instead
            bar_format=None
            if bar_in_steps
            else "{l_bar}{bar}| {n_fmt}/{total_fmt} "
            + bar_unit
            + " [{elapsed}<{remaining}{postfix}]",
            leave=False,
            dynamic_ncols=True,
            file=sys.stderr,
        )
    # numba compiles a kernel on its first use (once: it is cached for later runs); the budget
    # does not count that time
    clock = compile_clock()
    compiled_wall, compiled_cpu = clock.wall_s, clock.cpu_s
    t_start = time.perf_counter()
    cpu_start = time.process_time()

    def elapsed_now() -> float:
        """Wall seconds of training, this invocation's and the earlier ones', numba's
        compilations left out: what --max-time counts."""
        return elapsed_before + time.perf_counter() - t_start - (clock.wall_s - compiled_wall)

    def cpu_now() -> float:
        """CPU seconds of training, this invocation's and the earlier ones', numba's
        compilations left out: what --max-cpu-time counts."""
        return cpu_before + time.process_time() - cpu_start - (clock.cpu_s - compiled_cpu)

    last_eval: dict[str, Any] = {}
    interrupted = False
    try:
        while True:
            elapsed = elapsed_now()
            progress = budget.progress(env_steps, elapsed, cpu_now())
            if ctx.enabled:  # every rank takes rank 0's decision
                progress = float(distributed.broadcast_object(progress, ctx))
            if progress >= 1.0:
                break
            t_iter = time.perf_counter()
            metrics = algo.iteration(min(progress, 1.0))
            delta = int(metrics.pop("env_steps_delta")) * world
            env_steps += delta
            update += 1
            dt = time.perf_counter() - t_iter
            elapsed = elapsed_now()
            row = {
                "update": update,
                "env_steps": env_steps,
                "time_s": elapsed,
                "cpu_s": cpu_now(),
                "sps": delta / dt,
                "agent_sps": delta * agents / dt,
            }
            row.update(metrics)
            if is_main and cfg.eval_every and update % cfg.eval_every == 0:
                seeds = list(range(cfg.eval_seed, cfg.eval_seed + cfg.eval_episodes))
                res = evaluate_policy(
                    algo.policy,
                    cfg.env_fn,
                    cfg.env,
                    seeds,
                    deterministic=cfg.eval_deterministic,
                    repeats=cfg.eval_repeats,
                )
                last_eval = {
                    f"eval/{k}": v
                    for k, v in res.items()
                    if isinstance(v, (int, float)) and not isinstance(v, bool)
                }
                # the short names of docs/CONTRACTS.md section 4 (eval/success, eval/solved)
                for short, long in (("success", "success_rate"), ("solved", "solved_rate")):
                    if f"eval/{long}" in last_eval:
                        last_eval[f"eval/{short}"] = last_eval[f"eval/{long}"]
                row.update(last_eval)
            logger.log(row)
            if bar is not None:
                bar.n = min(bar_position(env_steps, elapsed, row["cpu_s"]), bar.total)
                post = {"upd": update, "steps": env_steps, "sps": f"{row['agent_sps']:.0f}"}
                if "episode/success" in row:
                    post["succ"] = f"{row['episode/success']:.2f}"
                if "episode/return" in row:
                    post["ret"] = f"{row['episode/return']:.2f}"
                if "eval/success_rate" in last_eval:
                    post["eval"] = f"{last_eval['eval/success_rate']:.2f}"
                bar.set_postfix(post, refresh=False)
                bar.refresh()
            if update % cfg.checkpoint_every == 0:
                save(update)
            if ctx.enabled:  # stop together if any rank was interrupted
                flag = torch.tensor([float(stop["flag"])], device=ctx.device)
                stop["flag"] = bool(distributed.all_reduce_sum(flag, ctx).item() > 0)
            if stop["flag"]:
                interrupted = True
                break
        if bar is not None:
            bar.close()
            bar = None
        save(update)
        logger.close()
        if interrupted:
            if is_main:
                took = ""
                if stop["at"] is not None:
                    took = f" {time.perf_counter() - stop['at']:.1f}s after {stop['signal']}"
                print(
                    f"[marl.train] interrupted: checkpoint {saved['path']} (update {update}) "
                    f"written{took}; continue with: python -m marl.train --resume {run_dir}",
                    file=sys.stderr,
                    flush=True,
                )
            return None
        stop["finishing"] = True
        result = (
            _finish(
                algo,
                cfg,
                run_dir,
                None,
                update=update,
                env_steps=env_steps,
                provenance_record=history[-1],
            )
            if is_main
            else {}
        )
        if is_main:  # last: everything a finished run holds is written
            _write_json(
                os.path.join(run_dir, FINISHED_MARKER),
                _finished_record(
                    cfg,
                    history,
                    update=update,
                    env_steps=env_steps,
                    time_s=elapsed_now(),
                    cpu_s=cpu_now(),
                    checkpoint=saved["path"] and os.path.relpath(saved["path"], run_dir),
                ),
            )
    except (NonFiniteError, OSError) as exc:
        exc.marl_kept = _kept_note(saved, cfg)  # type: ignore[attr-defined]
        raise
    except KeyboardInterrupt as exc:
        exc.marl_kept = _kept_note(saved, cfg)  # type: ignore[attr-defined]
        raise
    finally:
        for s, old in old_handlers.items():
            signal.signal(s, old)
        if bar is not None:
            bar.close()
        if not logger.closed:
            with contextlib.suppress(OSError):
                logger.close()
    if ctx.enabled:
        distributed.shutdown(ctx)
    return result


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


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


class _FlagParser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        raise ConfigError(message)


def _parse_wandb_flags(argv: list[str]) -> tuple[WandbOptions | None, list[str]]:
    """(the ``--wandb*`` options, the other arguments for :func:`parse_cli`)."""
    parser = _FlagParser(add_help=False, allow_abbrev=False)
    add_wandb_arguments(parser)
    ns, rest = parser.parse_known_args(list(argv))
    try:
        return wandb_options_from_args(ns), rest
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the process exit status: 0 finished, 1 stopped by the
    non-finite guard, 2 bad input or a file-system error, :data:`EXIT_INTERRUPTED` (3)
    interrupted by SIGINT/SIGTERM with a checkpoint written."""
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:
        parser = build_parser()
        add_wandb_arguments(parser)
        parser.print_help()
        return 0
    try:
        wandb, argv = _parse_wandb_flags(argv)
        cfg = parse_cli(argv)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    cfg._wandb = wandb  # type: ignore[attr-defined]
    resume = getattr(cfg, "_resume", None) is not None
    if resume and not list_checkpoints(cfg.run_dir):
        print(
            f"error: --resume {cfg.run_dir!r}: no checkpoint in {cfg.run_dir}/checkpoints (the "
            "run stopped before its first checkpoint); start it again with --run-dir "
            f"{cfg.run_dir} --overwrite",
            file=sys.stderr,
        )
        return 2
    try:
        result = train(cfg, resume=resume)
    except (ConfigError, CheckpointError, RunDirBusyError, WandbError) as exc:
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
