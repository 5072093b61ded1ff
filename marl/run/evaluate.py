"""Evaluation on fixed validation seeds, episode GIFs, and ``python -m marl.evaluate RUN_DIR``.

Figures (one episode per validation seed, envs without autoreset):
``success_rate`` (mean of the env's ``success`` info: fraction of targets collected),
``solved_rate`` (mean of ``solved``), ``mean_return`` (mean over episodes of the mean over
agents of the summed reward), ``coverage``, ``revisit_rate``, ``episode_length``; metrics the env
does not provide are reported as None. With ``eval_repeats`` >= 2 episodes per seed:
``search_diversity`` (the mean pairwise Jaccard distance between the team's search sets of
episodes from the same seed, ``envs.diversity``: visited cells in multisearch, issued queries in
websearch, the env's ``search_sets()``); ``entropy`` (the policy's mean per-step
entropy).

Evaluation samples actions with its own ``torch.Generator`` (seeded from the first validation
seed) so that it never disturbs the training RNG streams; ``deterministic=True`` takes the
most likely action instead.

``python -m marl.evaluate RUN_DIR [--episodes N | --seeds 100-131] [--checkpoint FILE]
[--trust-checkpoint] [--device cpu|cuda|auto] [--gif PATH] [--deterministic] [--out PATH]
[--update-run]`` evaluates a run's policy, read from its policy artifact (``RUN_DIR/policy/``,
:mod:`marl.run.artifact`: the newest weights, or with ``--checkpoint ckpt_N.pt`` the weights
``policy/weights_N.pt`` of that checkpoint; no pickle is loaded unless
``--trust-checkpoint`` for a run written before artifacts), with :func:`evaluate_policy`
(the run's ``eval_repeats``) and writes
the figures, with the checkpoint evaluated (``checkpoint``: its path relative to RUN_DIR,
``update``, ``env_steps``) and the episodes (``seeds``, ``n_episodes``, ``repeats``), to a new
file ``RUN_DIR/eval_<checkpoint stem>_<YYYYmmdd-HHMMSS>.json`` (or ``--out PATH``). It leaves
``RUN_DIR/eval.json``, the run's own final evaluation that ``marl.compare`` aggregates,
unchanged unless ``--update-run`` (then it is replaced by the same record), and never writes
``RUN_DIR/finished.json``, the marker of a run that trained to its end.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from marl.adapters.envapi import make_vector_env
from marl.models.policies import AgentLayout, MultiAgentPolicy
from marl.rollout.collect import ObsBatcher
from marl.rollout.episodes import EVAL_KEYS, PolicyActor, evaluate_episodes
from marl.run.artifact import TRUST_CHECKPOINT_HELP, PolicyArtifactError
from marl.run.artifact import load_run_policy as load_artifact_policy
from marl.run.checkpoint import describe_checkpoint
from marl.run.cli import StrictArgumentParser
from marl.run.config import MAX_SEED
from marl.run.plots import headless_rendering, write_gif
from marl.run.rundir import atomic_write_json

__all__ = [
    "evaluate_policy",
    "record_episode",
    "format_table",
    "load_run_policy",
    "parse_seeds",
    "main",
    "EVAL_KEYS",
]


def evaluate_policy(
    policy: MultiAgentPolicy,
    env_fn: str,
    env_kwargs: dict,
    seeds: Sequence[int],
    *,
    deterministic: bool = False,
    temperature: float = 1.0,
    device: torch.device | str | None = None,
    repeats: int = 1,
) -> dict[str, Any]:
    """Run ``repeats`` episodes per seed (all in one vector env,
    :func:`marl.rollout.episodes.evaluate_episodes`) and summarise (see the module doc), with
    ``entropy``: the mean per-step entropy over the agents' steps (nats) of the distribution
    the actions were sampled from (``temperature``: ``softmax(logits / temperature)``,
    recorded as ``temperature`` when not 1);
    ``device``: where observations go (default: the policy's device)."""
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise ValueError("seeds must not be empty")
    vec = make_vector_env(env_fn, len(seeds) * repeats, env_kwargs, autoreset=False)
    actor = PolicyActor(
        policy,
        AgentLayout.from_env(vec),
        len(seeds) * repeats,
        deterministic=deterministic,
        temperature=temperature,
        seed=seeds[0],
        device=device,
    )
    was_training = policy.training
    policy.eval()
    try:
        out = evaluate_episodes(actor, vec, seeds, repeats=repeats)
    finally:
        policy.train(was_training)
    out["entropy"] = actor.mean_entropy
    out["deterministic"] = bool(deterministic)
    if temperature != 1.0:  # recorded where it changes the figures (not in every metrics row)
        out["temperature"] = float(temperature)
    return out


@torch.no_grad()
def record_episode(
    policy: MultiAgentPolicy,
    env_fn: str,
    env_kwargs: dict,
    seed: int,
    *,
    deterministic: bool = False,
    device: torch.device | str | None = None,
) -> list[np.ndarray]:
    """RGB frames (uint8 ``[H, W, 3]``) of one episode; [] if the env cannot render.

    Uses the vector env's optional ``render(index)`` (rgb_array), so any env following the
    contract and offering it works.
    """
    if device is None:
        device = next(policy.parameters()).device
    with headless_rendering():  # an env that draws with SDL (pygame) needs no display
        vec = make_vector_env(
            env_fn, 1, {**env_kwargs, "render_mode": "rgb_array"}, autoreset=False
        )
        if not hasattr(vec, "render"):
            return []
        layout = AgentLayout.from_env(vec)
        batcher = ObsBatcher(layout, device)
        obs, _ = vec.reset(seed=[int(seed)])
        state = policy.initial_state(1)
        reset = torch.ones(1, dtype=torch.bool, device=device)
        gen = torch.Generator(device=device)
        gen.manual_seed(int(seed))
        frames = [np.asarray(vec.render(0))]
        for _ in range(int(getattr(vec, "max_cycles", 10_000))):
            obs_t, mask_t = batcher(obs)
            actions, _, state = policy.act(
                obs_t, mask_t, state, reset, deterministic=deterministic, generator=gen
            )
            reset = torch.zeros(1, dtype=torch.bool, device=device)
            obs, _, terms, truncs, _ = vec.step(batcher.actions_to_env(actions))
            frames.append(np.asarray(vec.render(0)))
            a0 = layout.agents[0]
            if bool(np.asarray(terms[a0])[0]) or bool(np.asarray(truncs[a0])[0]):
                break
        return frames


def _fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "   n/a"
    return f"{v:6.3f}" if abs(v) < 1000 else f"{v:6.0f}"


def format_table(rows: dict[str, dict[str, Any]]) -> str:
    """A plain-text table: one row per policy, columns = the eval figures."""
    cols = ["success_rate", "solved_rate", "mean_return", "coverage", "episode_length"]
    cols += ["search_diversity"]
    head = f"{'policy':<12}" + "".join(f"{c:>18}" for c in cols)
    lines = [head, "-" * len(head)]
    for name, r in rows.items():
        lines.append(f"{name:<12}" + "".join(f"{_fmt(r.get(c)):>18}" for c in cols))
    return "\n".join(lines)


def _warn(message: str) -> None:
    print(f"[marl.evaluate] warning: {message}", file=sys.stderr, flush=True)


def load_run_policy(
    run_dir: str,
    device: str | torch.device = "cpu",
    *,
    checkpoint: str | None = None,
    trust: bool = False,
    warn: Any = _warn,
) -> tuple[MultiAgentPolicy, Any, dict]:
    """(the run's policy, its config, what was loaded: ``path`` the checkpoint whose weights
    these are, ``weights`` the file read, ``update``, ``env_steps``), from the run's policy
    artifact (:func:`marl.run.artifact.load_run_policy`: never a pickle unless ``trust``).

    The newest weights; a weights file that fails to load is reported through ``warn`` and
    the next newest is used. ``checkpoint``: that checkpoint's weights (a path, or a name in
    RUN_DIR/checkpoints or RUN_DIR/policy), without fallback. Raises
    :class:`marl.run.artifact.PolicyArtifactError` (one line) when nothing usable loads."""
    loaded = load_artifact_policy(run_dir, device, checkpoint=checkpoint, trust=trust, warn=warn)
    info = {
        "path": loaded.checkpoint,
        "weights": loaded.weights,
        "update": loaded.update,
        "env_steps": loaded.env_steps,
    }
    return loaded.policy, loaded.config, info


def parse_seeds(text: str) -> list[int]:
    """``--seeds``: comma-separated seeds and inclusive ranges, ``"100,101"``, ``"100-131"``,
    ``"0-3,10"``; raises ValueError naming the bad item (or a seed given twice)."""
    seeds: list[int] = []
    for item in (part.strip() for part in text.split(",")):
        m = re.fullmatch(r"(\d+)(?:\s*-\s*(\d+))?", item)
        if not m:
            raise ValueError(
                f"--seeds: invalid item {item!r}; expected seeds and ranges like 100,101 or "
                "100-131 (non-negative integers)"
            )
        first = int(m.group(1))
        last = first if m.group(2) is None else int(m.group(2))
        if last < first:
            raise ValueError(f"--seeds: empty range {item!r} (the end is before the start)")
        seeds.extend(range(first, last + 1))
    too_big = [s for s in seeds if s > MAX_SEED]
    if too_big:
        raise ValueError(f"--seeds: {too_big[0]} is larger than {MAX_SEED} (2**32 - 1)")
    twice = sorted({s for s in seeds if seeds.count(s) > 1})
    if twice:
        raise ValueError(f"--seeds: seed {twice[0]} given twice")
    return seeds


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m marl.evaluate`` argument parser."""
    p = StrictArgumentParser(
        prog="python -m marl.evaluate",
        allow_abbrev=False,
        description="Evaluate a run's policy (the newest weights of its policy artifact "
        "RUN_DIR/policy/, or those of --checkpoint FILE; no pickled file is loaded unless "
        "--trust-checkpoint) with the trainer's evaluation (the run's eval_repeats episodes per "
        "seed), print the figures and write them, with the checkpoint evaluated and the seeds, "
        "to a new file RUN_DIR/eval_<checkpoint stem>_<YYYYmmdd-HHMMSS>.json (or --out PATH); "
        "the path written is printed. RUN_DIR/eval.json, the run's own final evaluation that "
        "marl.compare aggregates, is left unchanged unless --update-run. A weights file that "
        "fails to load is reported and the next older one is used. Nothing here marks the run "
        "as finished (RUN_DIR/finished.json, written by marl.train, does). Exit status: 0 "
        "done, 2 bad input (an 'error:' line).",
    )
    p.add_argument("run_dir", metavar="RUN_DIR")
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--episodes",
        type=int,
        default=None,
        metavar="N",
        help="validation seeds eval_seed..eval_seed+N-1 (default: the run's eval_episodes)",
    )
    which.add_argument(
        "--seeds",
        default=None,
        metavar="LIST",
        help="the seeds themselves: comma-separated seeds and inclusive ranges (100,101 or "
        "100-131)",
    )
    p.add_argument(
        "--checkpoint",
        default=None,
        metavar="FILE",
        help="evaluate the policy of this checkpoint (a path, or a name in RUN_DIR/checkpoints "
        "such as ckpt_40.pt: its weights RUN_DIR/policy/weights_40.pt are read, not the "
        "pickled checkpoint) instead of the newest policy weights",
    )
    p.add_argument(
        "--trust-checkpoint",
        action="store_true",
        help=TRUST_CHECKPOINT_HELP,
    )
    p.add_argument(
        "--device",
        default="cpu",
        choices=("cpu", "cuda", "auto"),
        help="torch device of the policy ('auto': cuda when available) [default: cpu]",
    )
    p.add_argument(
        "--gif",
        default=None,
        metavar="PATH",
        help="also write a GIF of one episode (the first seed) to PATH",
    )
    p.add_argument("--deterministic", action="store_true", help="greedy actions")
    p.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        metavar="T",
        help="sample actions from softmax(logits / T) (default 1: the policy's own "
        "distribution; > 1 more random, < 1 greedier); not with --deterministic",
    )
    p.add_argument(
        "--out",
        default=None,
        metavar="PATH",
        help="write the results to PATH (replaced if it exists) [default: a new file "
        "RUN_DIR/eval_<checkpoint stem>_<YYYYmmdd-HHMMSS>.json]",
    )
    p.add_argument(
        "--update-run",
        action="store_true",
        help="also replace RUN_DIR/eval.json (the run's final evaluation, which marl.compare "
        "aggregates) with these results",
    )
    return p


def default_output_path(run_dir: str, checkpoint: str) -> str:
    """``RUN_DIR/eval_<checkpoint stem>_<YYYYmmdd-HHMMSS>.json`` (local time), a file that
    does not exist yet (``_2``, ``_3``, ... added when one evaluation follows another within
    the second)."""
    stem = os.path.splitext(os.path.basename(checkpoint))[0]
    base = os.path.join(run_dir, f"eval_{stem}_{time.strftime('%Y%m%d-%H%M%S')}")
    path, k = base + ".json", 1
    while os.path.exists(path):
        k += 1
        path = f"{base}_{k}.json"
    return path


def _write_json(path: str, obj: Any) -> None:
    """Write ``obj`` to ``path`` atomically (a temporary file, then a rename)."""
    atomic_write_json(path, obj, final_newline=False)


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if not os.path.isdir(args.run_dir):
        return _error(f"{args.run_dir!r} is not a directory")
    if args.episodes is not None and args.episodes < 1:
        return _error(f"--episodes must be >= 1, got {args.episodes}")
    if not (args.temperature > 0 and math.isfinite(args.temperature)):
        return _error(f"--temperature must be a finite number > 0, got {args.temperature}")
    if args.deterministic and args.temperature != 1.0:
        return _error("--temperature applies to sampled actions: not with --deterministic")
    seeds_given = None
    if args.seeds is not None:
        try:
            seeds_given = parse_seeds(args.seeds)
        except ValueError as exc:
            return _error(str(exc))
    if args.device == "cuda" and not torch.cuda.is_available():
        return _error("--device cuda: CUDA is not available here; allowed here: cpu, auto")
    device = "cuda" if args.device == "auto" and torch.cuda.is_available() else args.device
    device = "cpu" if device == "auto" else device
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    try:
        policy, cfg, ckpt = load_run_policy(
            args.run_dir, device, checkpoint=args.checkpoint, trust=args.trust_checkpoint
        )
    except PolicyArtifactError as exc:
        return _error(str(exc))
    if seeds_given is None:
        n = cfg.eval_episodes if args.episodes is None else args.episodes
        seeds = list(range(cfg.eval_seed, cfg.eval_seed + n))
    else:
        seeds = seeds_given
    # a run that evaluates greedily samples when asked for a temperature
    deterministic = args.deterministic or (cfg.eval_deterministic and args.temperature == 1.0)
    print(
        f"[marl.evaluate] {describe_checkpoint(args.run_dir, ckpt['path'])} (update "
        f"{ckpt.get('update', '?')}, {ckpt.get('env_steps', '?')} env steps; weights "
        f"{os.path.relpath(ckpt['weights'], args.run_dir)}) on {len(seeds)} seeds x "
        f"{cfg.eval_repeats} episodes, device {device}",
        file=sys.stderr,
        flush=True,
    )
    result = evaluate_policy(
        policy,
        cfg.env_fn,
        cfg.env,
        seeds,
        deterministic=deterministic,
        temperature=args.temperature,
        repeats=cfg.eval_repeats,
    )
    # what was evaluated, beside the figures (seeds and n_episodes come with them)
    record = {
        **result,
        "checkpoint": os.path.relpath(ckpt["path"], args.run_dir),
        "update": ckpt.get("update"),
        "env_steps": ckpt.get("env_steps"),
        "repeats": cfg.eval_repeats,
    }
    print(format_table({cfg.algo: result}))
    paths = [args.out or default_output_path(args.run_dir, ckpt["path"])]
    if args.update_run:
        paths.append(os.path.join(args.run_dir, "eval.json"))
    for path in paths:
        try:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            _write_json(path, record)
        except OSError as exc:
            return _error(f"cannot write {path!r}: {exc.strerror or exc}")
        print(f"[marl.evaluate] wrote {path}")
    if args.gif is not None:
        frames = record_episode(
            policy, cfg.env_fn, cfg.env, seeds[0], deterministic=deterministic, device=device
        )
        if not frames:
            return _error(f"--gif: the env {cfg.env_fn} cannot render rgb_array frames")
        try:
            os.makedirs(os.path.dirname(os.path.abspath(args.gif)), exist_ok=True)
            write_gif(frames, args.gif)
        except OSError as exc:
            return _error(f"--gif: cannot write {args.gif!r}: {exc.strerror or exc}")
        print(f"[marl.evaluate] {args.gif}: {len(frames)} frames (seed {seeds[0]})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
