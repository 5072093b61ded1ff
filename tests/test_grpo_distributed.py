"""A real 2-process gloo ``torchrun -m marl.train --algo grpo`` run (tiny config), then resumed.

Checks: both ranks end with identical parameters; the advantages (group-relative, then batch
whitening whose statistics are reduced across ranks, then the clip) equal those computed in
one process on the concatenation of both ranks' data; groups never span ranks; the resumed
run continues the update count and the seed sequence.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from marl.algos import grpo

ROOT = Path(__file__).resolve().parents[1]
P_PER_RANK, G = 2, 4
TINY = [
    "--algo", "grpo", "--seed", "5", "--num-envs", str(P_PER_RANK * G), "--group-size", str(G),
    "--hidden-dim", "16", "--epochs", "2", "--num-minibatches", "2",
    "--whitening", "batch", "--adv-clip", "2.0",
    "--eval-every", "0", "--eval-episodes", "2", "--checkpoint-every", "1",
    "--plots", "false", "--gif", "false", "--baselines", "false", "--progress", "false",
    "--env.grid_size", "8", "--env.max_cycles", "25", "--env.n_targets", "2",
]  # fmt: skip


def _torchrun(args: list[str], debug_dir: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", MARL_GRPO_DEBUG_DIR=str(debug_dir))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    cmd += ["-m", "marl.train", *args]
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=240)


def _load(debug_dir: Path) -> list[dict]:
    return [torch.load(debug_dir / f"rank{r}.pt", weights_only=False) for r in (0, 1)]


def _check_identical_params(dumps: list[dict]) -> None:
    assert dumps[0]["param_sha256"] == dumps[1]["param_sha256"]
    for key, value in dumps[0]["params"].items():
        assert torch.equal(value, dumps[1]["params"][key]), key


def _check_advantages_equal_single_process(dumps: list[dict]) -> None:
    """Recompute rank 0 + rank 1 advantages in one process from the concatenated data."""
    team = torch.cat([d["team_return"] for d in dumps])
    ind = torch.cat([d["individual_return"] + d["penalty_return"] for d in dumps])
    groups = torch.cat([d["group_ids"] + r * P_PER_RANK for r, d in enumerate(dumps)])
    types = dumps[0]["type_ids"]
    adv_episode, _ = grpo.outcome_advantages(team, ind, groups, types, alpha=0.5)
    # per rank: broadcast over that rank's valid steps, then pool all valid entries
    pooled, got = [], []
    for r, d in enumerate(dumps):
        E = d["valid"].shape[1]
        valid3 = d["valid"][:, :, None].expand(-1, -1, types.numel())
        a = adv_episode[r * E : (r + 1) * E][None].expand_as(valid3)
        pooled.append(a[valid3].numpy())
        got.append(d["advantages"][valid3].numpy())
        assert torch.all(d["advantages"][~valid3] == 0)
    x = np.concatenate(pooled).astype(np.float64)
    z = (x - x.mean()) / (x.std() + 1e-8)  # batch whitening of the concatenation (float64)
    want = np.clip(z, -2.0, 2.0)
    np.testing.assert_allclose(np.concatenate(got), want, rtol=1e-4, atol=1e-4)
    # groups never span ranks: each rank's P groups were reset with its own seeds
    seeds = [set(d["seeds"]) for d in dumps]
    assert not seeds[0] & seeds[1]
    for d in dumps:
        s = np.array(d["seeds"]).reshape(P_PER_RANK, G)
        assert (s == s[:, :1]).all() and len(set(s[:, 0])) == P_PER_RANK


@pytest.mark.slow
def test_two_process_grpo_run_matches_single_process_and_resumes(tmp_path):
    run_dir, debug = tmp_path / "run", tmp_path / "debug"
    proc = _torchrun([*TINY, "--total-steps", "300", "--run-dir", str(run_dir)], debug)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (run_dir / "eval.json").exists() and (run_dir / "checkpoints" / "latest.pt").exists()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in rows] == list(range(1, len(rows) + 1))
    assert all(0.0 <= r["frac_zero_std"] <= 1.0 for r in rows)
    assert rows[-1]["groups"] == 2 * P_PER_RANK  # statistics of both ranks
    dumps = _load(debug)
    assert dumps[0]["update"] == dumps[1]["update"] == len(rows)
    _check_identical_params(dumps)
    _check_advantages_equal_single_process(dumps)

    # resume: continues the update count, the seed sequence, and stays in sync
    first = len(rows)
    proc = _torchrun(["--resume", str(run_dir), "--total-steps", "700"], debug)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) > first
    assert [r["update"] for r in rows] == list(range(1, len(rows) + 1))
    dumps = _load(debug)
    assert dumps[0]["update"] == dumps[1]["update"] == len(rows)
    for r, d in enumerate(dumps):
        expected = grpo.group_seeds(5, len(rows) - 1, P_PER_RANK, rank=r, world_size=2)
        assert d["seeds"] == [s for s in expected for _ in range(G)]
    _check_identical_params(dumps)
    _check_advantages_equal_single_process(dumps)
