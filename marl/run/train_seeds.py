"""``python -m marl.train --seeds 0-15``: S independent runs trained in one process.

The seeds are batched through one rollout and one update (:class:`marl.algos.mappo.SeedMAPPO`,
:class:`marl.algos.grpo.SeedGRPO`: what a plain run trains with, as a batch of one); each
seed still gets a complete run directory, ``RUN_DIR/seed_<k>/``, exactly as a single-seed run
writes it (config.yaml with its own seed, metrics.jsonl, checkpoints,
policy/, eval.json, plots, finished.json), so ``marl.evaluate``, ``load_policy``,
``marl.export`` and ``marl.compare`` read each one as a single run (compare's own layout,
``OUT/runs/<variant>/seed_<k>``, is a batch directory per variant), and a plain ``--resume
RUN_DIR/seed_<k>`` continues that seed alone. ``--resume RUN_DIR`` continues every seed run
in RUN_DIR (``--seeds`` picks some of them) from the newest update all of them hold a
checkpoint of.

Budgets are the batch's: every seed trains the same env steps; ``--max-time`` and
``--max-cpu-time`` count the batch's time (each seed's time_s and cpu_s are the batch's). The
progress bar counts the batch (one update = one update of every seed). A seed whose losses or
advantages turn non-finite stops: its finished.json says so (``"stopped": why``, no
eval.json), its last good checkpoint stays, and the other seeds go on.

``--seeds`` takes a range ``0-15``, a list ``0,3,7`` or both (``0-3,8``); it excludes
``--seed``. :func:`train_seeds` prepares the seed runs; :func:`marl.run.train._train_loop`, the
loop of a single run too, trains them.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import sys
from typing import Any

import torch
import yaml

from marl.algos import resolve_algorithm
from marl.algos.seeds import SeedBatch, unsupported_with_seeds
from marl.run.checkpoint import (
    DEFAULT_KEEP,
    CheckpointError,
    checkpoint_path,
    load_checkpoint,
    numbered_checkpoints,
    rng_state,
)
from marl.run.checkpointing import Start
from marl.run.compile_clock import compile_clock
from marl.run.config import (
    EXIT_INTERRUPTED,
    BaseConfig,
    ConfigError,
    config_to_dict,
    parse_train_args,
)
from marl.run.options import RunOptions
from marl.run.progress import Budget
from marl.run.rundir import (
    RunDir,
    RunDirBusyError,
    RunDirError,
    atomic_write_text,
)
from marl.run.train import (
    _default_run_dir,
    _start_process,
    _train_loop,
    configure_process,
    resolve_budget,
)

__all__ = [
    "batch_seeds",
    "is_seed_batch",
    "parse_seeds",
    "seed_dir",
    "seeds_invocation",
    "train_seeds",
]


def parse_seeds(spec: str) -> list[int]:
    """``"0-15"``, ``"0,3,7"`` or ``"0-3,8"`` -> the seeds, in order; ConfigError naming what
    is wrong (the forms allowed, a seed below 0, a seed twice)."""
    seeds: list[int] = []
    allowed = "a range 0-15, a list 0,3,7 or both (0-3,8) of integers >= 0"
    for part in str(spec).split(","):
        part = part.strip()
        try:
            if "-" in part[1:]:
                lo, hi = (int(x) for x in part.split("-", 1))
                if hi < lo:
                    raise ValueError
                seeds.extend(range(lo, hi + 1))
            else:
                seeds.append(int(part))
        except ValueError:
            raise ConfigError(
                f"--seeds {spec!r}: cannot read {part!r}; allowed: {allowed}"
            ) from None
    if any(s < 0 for s in seeds):
        raise ConfigError(f"--seeds {spec!r}: seeds must be >= 0; allowed: {allowed}")
    twice = sorted({s for s in seeds if seeds.count(s) > 1})
    if twice:
        raise ConfigError(f"--seeds {spec!r}: seeds {twice} appear twice")
    return seeds


def seed_dir(run_dir: str, seed: int) -> str:
    """``RUN_DIR/seed_<seed>``: the run directory of one seed of a batch."""
    return os.path.join(run_dir, f"seed_{seed}")


def batch_seeds(run_dir: str) -> list[int]:
    """The seeds of the batch in ``run_dir``: those with a run directory ``seed_<k>/``
    holding a config.yaml, in order ([] when ``run_dir`` holds none, or is itself a run)."""
    if not os.path.isdir(run_dir) or os.path.isfile(os.path.join(run_dir, "config.yaml")):
        return []
    seeds = []
    for name in os.listdir(run_dir):
        config = os.path.join(run_dir, name, "config.yaml")
        if name.startswith("seed_") and name[5:].isdigit() and os.path.isfile(config):
            seeds.append(int(name[5:]))
    return sorted(seeds)


def is_seed_batch(run_dir: str) -> bool:
    """Whether ``run_dir`` holds seed runs ``seed_<k>/`` of a batch (and is no run itself)."""
    return bool(batch_seeds(run_dir))


def seeds_invocation(argv: list[str]) -> tuple[list[int], list[str], str | None] | None:
    """``(seeds, argv for the config parser, batch directory resumed)`` when ``argv`` trains a
    seed batch (``--seeds SPEC``, or ``--resume`` of a batch directory), else None. A
    resumed batch's config is read from its first seed's config.yaml."""
    spec, rest = None, []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--seeds":
            if i + 1 >= len(argv):
                raise ConfigError("--seeds needs a value: a range 0-15, a list 0,3,7 or both")
            spec, i = argv[i + 1], i + 2
            continue
        if arg.startswith("--seeds="):
            spec = arg.split("=", 1)[1]
        else:
            rest.append(arg)
        i += 1
    resumed = None
    for j, arg in enumerate(rest):
        value = None
        if arg == "--resume" and j + 1 < len(rest):
            value = rest[j + 1]
        elif arg.startswith("--resume="):
            value = arg.split("=", 1)[1]
        if value is not None and is_seed_batch(value):
            resumed = value
    if spec is None and resumed is None:
        return None
    if any(a == "--seed" or a.startswith("--seed=") for a in rest):
        raise ConfigError("--seeds and --seed exclude each other: give one of them")
    seeds = parse_seeds(spec) if spec is not None else batch_seeds(resumed)
    if resumed is not None:
        missing = sorted(set(seeds) - set(batch_seeds(resumed)))
        if missing:
            raise ConfigError(
                f"--resume {resumed!r}: no run of seeds {missing} there (it holds seeds "
                f"{batch_seeds(resumed)})"
            )
        first = seed_dir(resumed, seeds[0])
        rest = [first if a == resumed else a.replace(f"--resume={resumed}", f"--resume={first}")
                for a in rest]  # fmt: skip
    return seeds, rest, resumed


class _SeedRun:
    """Seed k of the batch as one run of :func:`marl.run.train._train_loop` (a
    :class:`marl.run.train.TrainedRun`: policy, layout, last advantages, state_dict, rng)."""

    def __init__(self, batch: SeedBatch, k: int) -> None:
        self.batch, self.k = batch, k

    @property
    def policy(self) -> torch.nn.Module:
        return self.batch.runs[self.k].policy

    @property
    def layout(self) -> Any:
        return self.batch.layout

    @property
    def last_advantages(self) -> Any:
        return self.batch.runs[self.k].last_advantages

    def state_dict(self) -> dict[str, Any]:
        return self.batch.seed_state_dict(self.k)

    def rng(self) -> dict[str, Any]:
        """The RNG states of seed k's checkpoint: its generator as torch's global one."""
        return {**rng_state(), "torch": self.batch.generator_state(self.k)}


def _seed_config(cfg: BaseConfig, seed: int, run_dir: str) -> BaseConfig:
    one = copy.copy(cfg)
    one.seed, one.run_dir = seed, run_dir
    return one


def train_seeds(
    cfg: BaseConfig, seeds: list[int], options: RunOptions | None = None
) -> list[dict[str, Any] | None] | None:
    """Train ``seeds`` as one batch (see the module docstring); returns each seed's final
    evaluation (None for a seed that stopped), or None when SIGINT/SIGTERM interrupted the
    batch (a checkpoint of every seed was written)."""
    options = options or RunOptions()
    problems = unsupported_with_seeds(cfg, distributed=int(os.environ.get("WORLD_SIZE", "1")) > 1)
    if problems:
        raise ConfigError("--seeds: " + "; ".join(problems))
    resolve_budget(cfg)
    if options.wandb is not None:
        raise ConfigError("--seeds does not log to W&B yet (leave out --wandb)")
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: CUDA is not available here; allowed here: cpu, auto")
    root = options.resume or cfg.run_dir or _default_run_dir(cfg)
    cfg.run_dir = root
    runs = [RunDir(seed_dir(root, s)) for s in seeds]
    if options.resuming:
        missing = sorted(set(seeds) - set(batch_seeds(root)))
        if missing:
            raise RunDirError(f"--resume {root!r}: no run of seeds {missing} there")
        if all(_finished(run, cfg) for run in runs):
            print(f"[marl.train] {root}: every seed finished within its budget: nothing to do",
                  file=sys.stderr)  # fmt: skip
            return [_read_json(run.eval_json) for run in runs]
    else:
        if os.path.isfile(os.path.join(root, "config.yaml")):
            raise RunDirError(
                f"{root} holds a single run; a seed batch needs a directory of its own"
            )
        for run in runs:
            run.check_new(options.overwrite)
    configure_process(cfg)
    compile_clock()
    ctx, device = _start_process(cfg)  # threads and device (no process group: one process)
    cfgs = [_seed_config(cfg, s, run.path) for s, run in zip(seeds, runs, strict=True)]
    algorithm = resolve_algorithm(cfg.algo)
    batched = algorithm.batch_class()
    batch = batched(cfgs, device, algorithm=algorithm)
    starts = _restore(batch, runs, options) if options.resuming else None
    keep = int(options.keep_checkpoints or DEFAULT_KEEP)
    if starts is None:
        starts = [Start(keep=keep) for _ in seeds]
    with contextlib.ExitStack() as held:
        os.makedirs(root, exist_ok=True)
        for one, run in zip(cfgs, runs, strict=True):
            held.enter_context(run.claim(resume=options.resuming, overwrite=options.overwrite))
            atomic_write_text(run.config_yaml, yaml.safe_dump(config_to_dict(one), sort_keys=False))
        seed_runs = [_SeedRun(batch, k) for k in range(len(seeds))]
        return _train_loop(cfgs, ctx, batch, seed_runs, runs, starts)


def _finished(run: RunDir, cfg: BaseConfig) -> bool:
    """Whether the seed run in ``run`` is done: finished within ``cfg``'s budget, or stopped
    on a non-finite value."""
    record = _read_json(run.finished_json)
    if record is None or "stopped" in record:
        return record is not None
    return Budget(cfg).progress(record["env_steps"], record["time_s"], record["cpu_s"]) >= 1.0


def _read_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def _restore(batch: SeedBatch, runs: list[RunDir], options: RunOptions) -> list[Start]:
    """Every seed's checkpoint of the newest update that all of them hold, loaded into
    ``batch``; each seed's :class:`Start`."""
    held = [dict(numbered_checkpoints(run.path)) for run in runs]
    common = set.intersection(*(set(h) for h in held)) if held else set()
    if not common:
        raise CheckpointError(
            "--resume: the seeds hold no checkpoint of a common update "
            f"({', '.join(f'{r.path}: {sorted(h)}' for r, h in zip(runs, held, strict=True))})"
        )
    update = max(common)
    starts = []
    for k, run in enumerate(runs):
        path = checkpoint_path(run.path, update)
        payload = load_checkpoint(path)
        try:
            batch.load_seed_state(k, payload["algo"], payload["rng"]["torch"])
        except (KeyError, RuntimeError, ValueError, TypeError) as exc:
            raise CheckpointError(f"checkpoint {path} does not fit the batch ({exc})") from exc
        keep = options.keep_checkpoints or payload.get("keep_checkpoints") or DEFAULT_KEEP
        starts.append(Start(keep=int(keep), payload=payload, path=path))
    print(f"[marl.train] resuming the batch {os.path.dirname(runs[0].path)} from update "
          f"{update}", file=sys.stderr, flush=True)  # fmt: skip
    return starts


def main(argv: list[str]) -> int | None:
    """``python -m marl.train`` for a seed batch: the exit status (0 finished, even where some
    seeds stopped; 2 bad input or a file-system error; 3 interrupted), or None when ``argv``
    is no seed batch (the single-run trainer takes it)."""
    try:
        invocation = seeds_invocation(argv)
        if invocation is None:
            return None
        seeds, rest, resumed = invocation
        cfg, options = parse_train_args(rest)
        if resumed is not None:
            options = dataclasses.replace(options, resume=resumed)
            cfg.run_dir = resumed
        result = train_seeds(cfg, seeds, options)
    except (ConfigError, RunDirError, CheckpointError, RunDirBusyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        if exc.filename is None:
            raise
        print(f"error: file-system error on {exc.filename!r}: {exc.strerror}", file=sys.stderr)
        return 2
    return EXIT_INTERRUPTED if result is None else 0
