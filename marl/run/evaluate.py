"""Evaluation on fixed validation seeds, episode GIFs, and ``python -m marl.evaluate RUN_DIR``.

Figures (one episode per validation seed, envs without autoreset):
``success_rate`` (mean of the env's ``success`` info: fraction of targets collected),
``solved_rate`` (mean of ``solved``), ``mean_return`` (mean over episodes of the mean over
agents of the summed reward), ``coverage``, ``revisit_rate``, ``episode_length``; metrics the env
does not provide are reported as None. With ``eval_repeats`` >= 2 episodes per seed:
``search_diversity`` (the mean pairwise Jaccard distance between the team's visited-cell sets
of episodes from the same seed, ``envs.diversity``); ``entropy`` (the policy's mean per-step
entropy).

Evaluation samples actions with its own ``torch.Generator`` (seeded from the first validation
seed) so that it never disturbs the training RNG streams; ``deterministic=True`` takes the
most likely action instead.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from marl.collect import EVAL_KEYS, ObsBatcher, PolicyActor, evaluate_episodes
from marl.envapi import make_vector_env
from marl.policies import AgentLayout, MultiAgentPolicy
from marl.run.checkpoint import CheckpointError, load_newest_checkpoint
from marl.run.config import ConfigError, config_from_dict, load_run_config

__all__ = ["evaluate_policy", "record_episode", "format_table", "main", "EVAL_KEYS"]


def evaluate_policy(
    policy: MultiAgentPolicy,
    env_fn: str,
    env_kwargs: dict,
    seeds: Sequence[int],
    *,
    deterministic: bool = False,
    device: torch.device | str | None = None,
    repeats: int = 1,
) -> dict[str, Any]:
    """Run ``repeats`` episodes per seed (all in one vector env,
    :func:`marl.collect.evaluate_episodes`) and summarise (see the module doc), with
    ``entropy``: the policy's mean per-step entropy over the agents' steps (nats);
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
    vec = make_vector_env(env_fn, 1, {**env_kwargs, "render_mode": "rgb_array"}, autoreset=False)
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
    head = f"{'policy':<12}" + "".join(f"{c:>16}" for c in cols)
    lines = [head, "-" * len(head)]
    for name, r in rows.items():
        lines.append(f"{name:<12}" + "".join(f"{_fmt(r.get(c)):>16}" for c in cols))
    return "\n".join(lines)


def _warn(message: str) -> None:
    print(f"[marl.evaluate] warning: {message}", file=sys.stderr, flush=True)


def load_run_policy(
    run_dir: str, device: str = "cpu", *, warn: Any = _warn
) -> tuple[MultiAgentPolicy, Any, dict]:
    """(policy with the newest loadable checkpoint's weights, its config, the checkpoint).

    A checkpoint that fails to load is reported through ``warn`` by its file name and the next
    older one is used; :class:`ConfigError` when ``run_dir`` is not a run directory,
    :class:`marl.run.checkpoint.CheckpointError` when no checkpoint loads."""
    if not os.path.isfile(os.path.join(run_dir, "config.yaml")):
        raise ConfigError(f"{run_dir!r} is not a run directory (no config.yaml in it)")
    cfg = config_from_dict(load_run_config(run_dir))
    ckpt, path, _ = load_newest_checkpoint(run_dir, warn=warn)
    vec = make_vector_env(cfg.env_fn, 1, cfg.env, autoreset=False)
    policy = MultiAgentPolicy(
        AgentLayout.from_env(vec), cfg.backbone, cfg.hidden_dim, cfg.activation
    ).to(device)
    try:
        policy.load_state_dict(ckpt["algo"]["policy"])
    except (KeyError, RuntimeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        msg = f"checkpoint {path} does not fit {run_dir}/config.yaml ({first})"
        raise CheckpointError(msg) from exc
    return policy, cfg, ckpt


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m marl.evaluate",
        description="Re-evaluate a run's newest checkpoint on its validation seeds, print the "
        "figures and rewrite RUN_DIR/eval.json. A checkpoint that fails to load is reported "
        "and the next older one is used. Exit status: 0 done, 2 bad input (an 'error:' line).",
    )
    p.add_argument("run_dir")
    p.add_argument(
        "--episodes",
        type=int,
        default=None,
        help="validation episodes (default: the run's eval_episodes)",
    )
    p.add_argument("--deterministic", action="store_true", help="greedy actions")
    args = p.parse_args(argv)
    if not os.path.isdir(args.run_dir):
        print(f"error: {args.run_dir!r} is not a directory", file=sys.stderr)
        return 2
    if args.episodes is not None and args.episodes < 1:
        print("error: --episodes must be >= 1", file=sys.stderr)
        return 2
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    try:
        policy, cfg, _ = load_run_policy(args.run_dir)
    except (ConfigError, CheckpointError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    n = cfg.eval_episodes if args.episodes is None else args.episodes
    seeds = list(range(cfg.eval_seed, cfg.eval_seed + n))
    result = evaluate_policy(
        policy,
        cfg.env_fn,
        cfg.env,
        seeds,
        deterministic=args.deterministic or cfg.eval_deterministic,
        repeats=cfg.eval_repeats,
    )
    path = os.path.join(args.run_dir, "eval.json")
    try:
        with open(path + ".tmp", "w") as fh:
            json.dump(result, fh, indent=2)
        os.replace(path + ".tmp", path)
    except OSError as exc:
        print(f"error: cannot write {path!r}: {exc.strerror or exc}", file=sys.stderr)
        print(format_table({cfg.algo: result}))
        return 2
    print(format_table({cfg.algo: result}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
