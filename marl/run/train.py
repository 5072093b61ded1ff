"""``python -m marl.train``: train MAPPO (or GRPO) on a vector env and write a run directory.

Usage (docs/CONTRACTS.md section 4)::

    python -m marl.train --algo mappo [--config FILE] [--total-steps N | --max-time S]
                         [--seed S] [--run-dir DIR] [--resume DIR] [--<field> VALUE ...]

Without arguments it is the demo: MAPPO on the small multisearch preset for
``DEMO_MAX_TIME`` seconds on the CPU, then the evaluation table next to the scripted heuristic
and the random policy, plots and a GIF.

Algorithms are looked up in :data:`marl.algos.ALGORITHMS` (name -> class); each implements
:class:`marl.algos.base.Algorithm` (``iteration``, ``state_dict``, ``load_state_dict``,
``policy``, ``layout``) and declares its options in its ``config_class``.

The loop here is algorithm-agnostic: schedules, time budget, logging, checkpoints, signals,
evaluation, plots. Distributed (torchrun): every rank runs the loop; only rank 0 writes.
"""

from __future__ import annotations

import importlib
import json
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

from marl.algos import ALGORITHMS, Algorithm, register_algorithm
from marl.collect import BaselineActor, evaluate_episodes
from marl.core.losses import NonFiniteError
from marl.envapi import make_vector_env
from marl.run import distributed
from marl.run.checkpoint import (
    latest_path,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from marl.run.config import DEMO_MAX_TIME, BaseConfig, ConfigError, config_to_dict, parse_cli
from marl.run.evaluate import evaluate_policy, format_table, record_episode
from marl.run.plots import plot_advantage_histograms, plot_learning_curves, write_gif
from marl.run.runlog import RunLogger, read_metrics

__all__ = ["ALGORITHMS", "register_algorithm", "get_algorithm", "train", "main"]


def get_algorithm(name: str) -> type[Algorithm]:
    """The algorithm class registered as ``name``."""
    if name not in ALGORITHMS:
        raise ConfigError(f"--algo: unknown algorithm {name!r}; allowed: {', '.join(ALGORITHMS)}")
    return ALGORITHMS[name]


def _init_distributed(cfg: BaseConfig) -> distributed.DistContext:
    device = cfg.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return distributed.init_distributed(device=device)


class _Budget:
    """Progress in [0, 1]: the larger of step progress and time progress."""

    def __init__(self, cfg: BaseConfig) -> None:
        self.total_steps = cfg.total_steps
        self.max_time = cfg.max_time
        if self.total_steps is None and self.max_time is None:
            self.max_time = DEMO_MAX_TIME

    def progress(self, env_steps: int, elapsed: float) -> float:
        p = 0.0
        if self.total_steps is not None:
            p = max(p, env_steps / self.total_steps)
        if self.max_time is not None:
            p = max(p, elapsed / self.max_time)
        return p


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def _default_run_dir(cfg: BaseConfig) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return os.path.join("runs", f"{cfg.algo}-{cfg.backbone}-{stamp}")


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


def _finish(algo, cfg: BaseConfig, run_dir: str, rows: list[dict] | None) -> dict[str, Any]:
    """Final evaluation, eval.json, plots, GIF and the table (rank 0)."""
    seeds = list(range(cfg.eval_seed, cfg.eval_seed + cfg.eval_episodes))
    result = evaluate_policy(
        algo.policy,
        cfg.env_fn,
        cfg.env,
        seeds,
        deterministic=cfg.eval_deterministic,
        repeats=cfg.eval_repeats,
    )
    _write_json(os.path.join(run_dir, "eval.json"), result)
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
            frames = record_episode(
                algo.policy, cfg.env_fn, cfg.env, seeds[0], deterministic=cfg.eval_deterministic
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


def train(cfg: BaseConfig, *, resume: bool = False) -> dict[str, Any] | None:
    """Run training as configured; returns the final evaluation (None if interrupted)."""
    ctx = _init_distributed(cfg)
    is_main = ctx.is_main
    world = ctx.world_size
    # default: up to 2 threads per process, the cores shared among torchrun's local ranks
    local_world = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    threads = cfg.torch_threads or max(1, min(2, (os.cpu_count() or 1) // local_world))
    torch.set_num_threads(threads)
    device = torch.device(
        "cuda"
        if cfg.device == "auto" and torch.cuda.is_available()
        else ("cpu" if cfg.device == "auto" else cfg.device)
    )
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: CUDA is not available; allowed here: cpu, auto")
    run_dir = cfg.run_dir or _default_run_dir(cfg)
    cfg.run_dir = run_dir
    _check_env(cfg)
    algo_cls = get_algorithm(cfg.algo)
    ckpt = None
    if resume:
        ckpt = load_checkpoint(latest_path(run_dir))
    if is_main:
        os.makedirs(run_dir, exist_ok=True)
        # eval.json marks a finished run: a continued or restarted run removes it first
        for stale in ("eval.json",) if resume else ("eval.json", "episode.gif"):
            if os.path.exists(os.path.join(run_dir, stale)):
                os.remove(os.path.join(run_dir, stale))
        if not resume:
            for stale_dir in ("tb", "checkpoints", "plots"):
                shutil.rmtree(os.path.join(run_dir, stale_dir), ignore_errors=True)
        with open(os.path.join(run_dir, "config.yaml.tmp"), "w") as fh:
            yaml.safe_dump(config_to_dict(cfg), fh, sort_keys=False)
        os.replace(os.path.join(run_dir, "config.yaml.tmp"), os.path.join(run_dir, "config.yaml"))
    seed = ctx.seed_offset(cfg.seed)
    _seed_everything(seed)
    algo = algo_cls(cfg, ctx, device)
    update, env_steps, elapsed_before = 0, 0, 0.0
    if ckpt is not None:
        algo.load_state_dict(ckpt["algo"])
        update, env_steps = int(ckpt["update"]), int(ckpt["env_steps"])
        elapsed_before = float(ckpt["elapsed"])
        if is_main:
            set_rng_state(ckpt["rng"])
        else:
            _seed_everything(seed + update)
    budget = _Budget(cfg)
    logger = RunLogger(run_dir, enabled=is_main, resume_update=update if resume else None)
    agents = algo.layout.n_agents

    def save(path_update: int) -> None:
        if not is_main:
            return
        for p in algo.policy.parameters():
            if not torch.isfinite(p).all():
                raise NonFiniteError("policy parameters (checkpoint not written)")
        payload = {
            "algo": algo.state_dict(),
            "update": path_update,
            "env_steps": env_steps,
            "elapsed": elapsed_before + (time.perf_counter() - t_start),
            "rng": rng_state(),
            "config": config_to_dict(cfg),
        }
        save_checkpoint(latest_path(run_dir), payload)

    stop = {"flag": False}

    def on_sigint(signum, frame):  # noqa: ARG001
        if stop["flag"]:
            raise KeyboardInterrupt
        stop["flag"] = True

    old_handler = signal.signal(signal.SIGINT, on_sigint) if _main_thread() else None
    bar = None
    if is_main and cfg.progress:
        bar = tqdm(
            total=1000,
            desc=f"{cfg.algo}",
            unit="‰",
            leave=False,
            dynamic_ncols=True,
            file=sys.stderr,
        )
    t_start = time.perf_counter()
    last_eval: dict[str, Any] = {}
    interrupted = False
    try:
        while True:
            elapsed = elapsed_before + time.perf_counter() - t_start
            progress = budget.progress(env_steps, elapsed)
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
            elapsed = elapsed_before + time.perf_counter() - t_start
            row = {
                "update": update,
                "env_steps": env_steps,
                "time_s": elapsed,
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
                bar.n = int(min(budget.progress(env_steps, elapsed), 1.0) * 1000)
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
    except NonFiniteError:
        if bar is not None:
            bar.close()
        logger.close()
        raise
    finally:
        if old_handler is not None:
            signal.signal(signal.SIGINT, old_handler)
    if bar is not None:
        bar.close()
    save(update)
    logger.close()
    if interrupted:
        if is_main:
            print(
                f"\n[marl.run.train] interrupted: checkpoint written to {latest_path(run_dir)}; "
                f"continue with: python -m marl.train --resume {run_dir}",
                file=sys.stderr,
            )
        return None
    result = _finish(algo, cfg, run_dir, None) if is_main else None
    if ctx.enabled:
        distributed.shutdown(ctx)
    return result


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the process exit status."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        cfg = parse_cli(argv)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    resume = getattr(cfg, "_resume", None) is not None
    if resume and not os.path.isfile(latest_path(cfg.run_dir)):
        print(f"error: --resume {cfg.run_dir!r}: no checkpoints/latest.pt", file=sys.stderr)
        return 2
    try:
        train(cfg, resume=resume)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except NonFiniteError as exc:
        print(
            f"error: {exc}. The last good checkpoint is kept in {latest_path(cfg.run_dir)}.",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
