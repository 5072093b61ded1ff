"""A planted ``marl.compare`` study: run directories with known numbers, no training.

Variant ``v`` of seed ``k`` ends with success rate :func:`final_success` (eval.json) and logs
its periodic validation evaluations :func:`evaluations` every 100 env steps (metrics.jsonl),
on the ``sparse`` preset of multisearch_v0, trained at commit :data:`COMMIT`.
"""

from __future__ import annotations

import json
from pathlib import Path

COMMIT = "c" * 40
#: variant -> (its options, its success rate above seed 0's, its periodic evaluations)
VARIANTS = {
    "a": ("--alpha=0.2", 0.0, 4),
    "b": ("--alpha=0.6", 0.2, 4),
    "c": ("--alpha=0.9", 0.1, 3),
}
SEEDS = range(6)


def final_success(variant: str, seed: int) -> float:
    return 0.5 + 0.01 * seed + VARIANTS[variant][1]


def evaluations(variant: str, seed: int) -> list[tuple[int, float]]:
    """(env steps, success rate) of each periodic evaluation."""
    n = VARIANTS[variant][2]
    return [(100 * (u + 1), final_success(variant, seed) * (u + 1) / n) for u in range(n)]


def write_run(path: Path, variant: str, seed: int) -> None:
    path.mkdir(parents=True)
    config = f"seed: {seed}\nenv_fn: envs.multisearch_v0:vector_env\nenv:\n  preset: sparse\n"
    (path / "config.yaml").write_text(config)
    success = final_success(variant, seed)
    final = {"success_rate": success, "solved_rate": success / 2, "mean_return": 10 * success}
    (path / "eval.json").write_text(json.dumps(final))
    rows = []
    for steps, e in evaluations(variant, seed):
        rows.append({"update": steps // 100, "env_steps": steps, "episode/success": e})
        rows[-1].update({"eval/success_rate": e, "eval/solved_rate": e / 2})
        rows[-1]["eval/mean_return"] = 10 * e
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    steps = rows[-1]["env_steps"]
    marker = {"update": len(rows), "env_steps": steps, "time_s": 2.0, "cpu_s": 1.5}
    marker.update(commit=COMMIT, commits=[COMMIT], dirty=False)
    (path / "finished.json").write_text(json.dumps(marker))


def plant_study(out: Path, missing: tuple[tuple[str, int], ...] = ()) -> list[str]:
    """Write every run but ``missing`` under ``out``; returns the compare options naming the
    study (variants, seeds, budget, out)."""
    argv = []
    for variant, (options, _, _) in VARIANTS.items():
        argv += ["--variant", f"{variant}:{options}"]
        for seed in SEEDS:
            if (variant, seed) not in missing:
                write_run(out / "runs" / variant / f"seed_{seed}", variant, seed)
    return [*argv, "--seeds", str(len(SEEDS)), "--total-steps", "400", "--out", str(out)]
