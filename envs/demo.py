"""Demo: the scripted heuristic and the random masked policy on fixed seeds.

``python -m envs.demo`` evaluates both baselines on every preset (or ``--preset NAME``),
prints a table of success / solved / coverage / revisit rate / steps, and writes an episode of
the heuristic as ``episode.gif`` plus its first and last frames as ``episode.png`` into
``--out`` (default ``out/demo``).
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
import time
from collections.abc import Sequence

import numpy as np

from envs._multisearch_core import PRESETS
from envs.baselines import HeuristicPolicy, evaluate_baseline
from envs.multisearch_v0 import parallel_env

__all__ = ["format_table", "main", "record_episode"]

COLUMNS = ("success_rate", "solved_rate", "coverage", "revisit_rate", "steps")


def format_table(rows: Sequence[tuple[str, str, dict[str, float]]]) -> str:
    """Rows of (preset, policy, evaluate_baseline result) as an aligned text table."""
    header = f"{'preset':<10}{'policy':<11}" + "".join(f"{c:>14}" for c in COLUMNS)
    lines = [header, "-" * len(header)]
    for preset, policy, result in rows:
        cells = "".join(
            f"{result[c]:>14.1f}" if c == "steps" else f"{result[c]:>14.3f}" for c in COLUMNS
        )
        lines.append(f"{preset:<10}{policy:<11}{cells}")
    return "\n".join(lines)


def record_episode(preset: str, seed: int, max_frames: int = 400) -> list[np.ndarray]:
    """Frames (uint8 [H, W, 3]) of one heuristic episode of ``preset`` reset with ``seed``."""
    env = parallel_env(preset=preset, render_mode="rgb_array")
    policy = HeuristicPolicy()
    obs, _ = env.reset(seed=seed)
    frames = [env.render()]
    while env.agents and len(frames) < max_frames:
        obs, *_ = env.step(policy(obs, env))
        frames.append(env.render())
    env.close()
    return frames


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m envs.demo",
        description="Evaluate the heuristic and random baselines of multisearch_v0 on fixed "
        "seeds, print a table, and write an episode GIF/PNG.",
    )
    parser.add_argument(
        "--preset", choices=[*PRESETS, "all"], default="all", help="preset(s) to evaluate"
    )
    parser.add_argument("--episodes", type=int, default=32, help="episodes (seeds 0..N-1)")
    parser.add_argument("--out", default=os.path.join("out", "demo"), help="output directory")
    parser.add_argument(
        "--episode-preset",
        default="small",
        choices=list(PRESETS),
        help="preset of the recorded episode",
    )
    parser.add_argument("--episode-seed", type=int, default=0, help="seed of the episode")
    parser.add_argument("--no-media", action="store_true", help="skip the GIF/PNG")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override an env argument for every evaluated preset, e.g. --set grid_size=10 "
        "(repeatable; values are Python literals)",
    )
    args = parser.parse_args(argv)
    if args.episodes < 1:
        parser.error(f"--episodes must be >= 1, got {args.episodes}")
    overrides = {}
    for item in args.set:
        key, sep, text = item.partition("=")
        if not sep or not key:
            parser.error(f"--set expects KEY=VALUE, got {item!r}")
        try:
            overrides[key] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            parser.error(f"--set {key}: {text!r} is not a Python literal")

    presets = list(PRESETS) if args.preset == "all" else [args.preset]
    rows = []
    start = time.perf_counter()
    for preset in presets:
        for policy in ("heuristic", "random"):
            try:
                result = evaluate_baseline(
                    policy, seeds=range(args.episodes), preset=preset, **overrides
                )
            except (TypeError, ValueError) as exc:
                parser.error(f"--set: {exc}")
            rows.append((preset, policy, result))
    extra = f", overrides {overrides}" if overrides else ""
    print(f"multisearch_v0 baselines, seeds 0..{args.episodes - 1} (one episode each){extra}")
    print(format_table(rows))
    print(f"({time.perf_counter() - start:.1f} s)")

    if not args.no_media:
        import imageio.v2 as imageio

        os.makedirs(args.out, exist_ok=True)
        frames = record_episode(args.episode_preset, args.episode_seed)
        gif = os.path.join(args.out, "episode.gif")
        png = os.path.join(args.out, "episode.png")
        imageio.mimsave(gif, frames, duration=1000 / 8, loop=0)
        gap = np.full((frames[0].shape[0], 8, 3), 255, dtype=np.uint8)
        imageio.imwrite(png, np.concatenate([frames[0], gap, frames[-1]], axis=1))
        print(f"wrote {gif} ({len(frames)} frames) and {png} (first | last frame)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
