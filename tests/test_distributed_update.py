"""The distributed policy update and ValueNorm against one process on the concatenated data.

Two gloo processes (``torchrun``, as tests/test_distributed.py) each take a slice of the same
global minibatches with *unequal* numbers of valid samples (different ``loss_mask`` sums).
Every loss term of :class:`marl.algos.ppo.ClipPPOObjective` is a sum over the rank's valid samples
divided by their count, and :meth:`PolicyUpdate.step` passes that count as the weight of
:func:`marl.run.distributed.average_gradients`; so the averaged gradient is exactly the
gradient of the mean over the concatenation, and the optimiser steps are the same as one
process's on the concatenated minibatch. The optimism offset's loss ``(mean(A) + b)^2`` has
gradient ``2 (mean(A) + b)``, whose count-weighted average is again the global one. The
gradient-norm clip (binding here) acts on the averaged gradient, as in one process.

Catches: unweighted gradient averaging (a plain mean over ranks), weighting by the number of
units instead of valid samples, clipping or stepping before the average; ValueNorm averaging
the ranks' batch moments instead of reducing sums and counts.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "_update_worker.py"
sys.path.insert(0, str(ROOT / "tests"))
import _update_worker as W  # noqa: E402

from marl.core.losses import ValueNorm  # noqa: E402


@pytest.fixture(scope="module")
def rank_results(tmp_path_factory) -> list[dict]:
    """Run the 2-process worker once; each rank's saved result."""
    out_dir = tmp_path_factory.mktemp("dist_update")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(WORKER),
        str(out_dir),
    ]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = [torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(2)]
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["world_size"] == 2 for r in results)
    return results


def _valid_counts(step: int) -> list[int]:
    """Valid (step, agent) samples of each rank's slice of step ``step``'s minibatch."""
    units = W.global_minibatch(step)
    counts = []
    for r in range(2):
        local = W.rank_slice(units, r)
        counts.append(int(sum(local[t.name].loss_mask.sum() * t.n_agents for t in W.LAYOUT.types)))
    return counts


def _clipped(grads: list[torch.Tensor], max_norm: float) -> list[torch.Tensor]:
    """``clip_grad_norm_`` by hand: scaled by ``max_norm / (norm + 1e-6)`` when below 1."""
    norm = float(torch.cat([g.reshape(-1) for g in grads]).norm())
    scale = min(1.0, max_norm / (norm + 1e-6))
    return [g * scale for g in grads]


def _combine(grads: list[list[torch.Tensor]], weights: list[float]) -> list[torch.Tensor]:
    total = sum(weights)
    return [
        sum(w / total * g[i] for w, g in zip(weights, grads, strict=True))
        for i in range(len(grads[0]))
    ]


def _max_gap(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


def test_policy_step_with_unequal_valid_counts_equals_concatenated_step(rank_results):
    """Two ``PolicyUpdate.step`` calls on 2 ranks (gradients after averaging and clipping,
    parameters after each Adam step) equal one process's on the concatenated minibatches."""
    counts = [_valid_counts(step) for step in range(W.STEPS)]
    units_per_rank = [W.SPLIT[1] - W.SPLIT[0], W.SPLIT[2] - W.SPLIT[1]]
    for c in counts:  # unequal counts, and not in the ratio of the units
        assert c[0] != c[1]
        assert abs(c[0] / sum(c) - units_per_rank[0] / sum(units_per_rank)) > 0.1
    reference = W.run_policy_steps(None, None)  # one process, concatenated minibatches
    for step in range(W.STEPS):
        for res in rank_results:
            got = res["policy"]
            for g, want in zip(got["grads"][step], reference["grads"][step], strict=True):
                torch.testing.assert_close(g, want, rtol=1e-5, atol=1e-7)
            # Adam divides by |g|: a rounding-level gradient difference where g ~ eps moves a
            # parameter by up to ~lr * 1e-4, hence the looser absolute tolerance here
            for p, want in zip(got["params"][step], reference["params"][step], strict=True):
                torch.testing.assert_close(p, want, rtol=1e-5, atol=1e-6)
        for p0, p1 in zip(*(r["policy"]["params"][step] for r in rank_results), strict=True):
            assert torch.equal(p0, p1)  # the ranks hold bit-identical parameters

    # From single-process pieces: each rank's unclipped local gradient of step 0 (its own
    # mean loss), weighted by its valid count, then clipped, is the concatenation's gradient;
    # the other averages (and clipping before averaging) are far from it.
    local = [W.run_policy_steps(None, r, max_grad_norm=None)["grads"][0] for r in range(2)]
    want = reference["grads"][0]
    max_norm = W.MAX_GRAD_NORM
    right = _clipped(_combine(local, counts[0]), max_norm)
    for g, w in zip(right, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-7)
    mutants = {
        "a plain mean over ranks": _clipped(_combine(local, [1.0, 1.0]), max_norm),
        "weights = units per rank": _clipped(_combine(local, units_per_rank), max_norm),
        "clipping before averaging": _combine([_clipped(g, max_norm) for g in local], counts[0]),
    }
    for name, wrong in mutants.items():
        assert _max_gap(wrong, want) > 1e-3, f"the test is blind to {name}"


def _np_value_norm(batches: list[np.ndarray], beta: float) -> dict[str, np.ndarray]:
    """MAPPO ValueNorm by hand: EMA of the batch moments of every update, debiased."""
    rm = np.zeros(W.VN_SHAPE)
    rms = np.zeros(W.VN_SHAPE)
    debias = 0.0
    for x in batches:
        rows = x.reshape(-1, W.VN_SHAPE)
        rm = beta * rm + (1 - beta) * rows.mean(0)
        rms = beta * rms + (1 - beta) * (rows**2).mean(0)
        debias = beta * debias + (1 - beta)
    return {"running_mean": rm, "running_mean_sq": rms, "debiasing_term": np.array(debias)}


def test_distributed_value_norm_equals_one_on_the_concatenation(rank_results):
    """``ValueNorm(distributed=True)`` updated on slices of unequal size equals the EMA by
    hand (and a single ValueNorm) on the concatenation."""
    full = [W.value_norm_data(u).double().numpy() for u in range(W.VN_UPDATES)]
    expected = _np_value_norm(full, W.VN_BETA)
    mean = expected["running_mean"] / expected["debiasing_term"]
    var = np.maximum(expected["running_mean_sq"] / expected["debiasing_term"] - mean**2, 1e-2)
    probe = np.linspace(-2.0, 2.0, 4 * W.VN_SHAPE).reshape(4, W.VN_SHAPE)
    expected["normalized"] = (probe - mean) / np.sqrt(var)
    for res in rank_results:
        for key, want in expected.items():
            np.testing.assert_allclose(
                res["value_norm"][key].numpy(), want, rtol=1e-10, atol=1e-12, err_msg=key
            )
    single = ValueNorm(W.VN_SHAPE, W.VN_BETA)  # one process on the concatenation
    for u in range(W.VN_UPDATES):
        single.update(W.value_norm_data(u))
    for key in ("running_mean", "running_mean_sq", "debiasing_term"):
        torch.testing.assert_close(rank_results[0]["value_norm"][key], getattr(single, key))
    # averaging the two ranks' batch means (unequal sizes) would give another mean
    rows = full[0].reshape(-1, W.VN_SHAPE)
    cut = 2 * W.VN_ROWS[0]  # rank 0's rows (each of its entries holds 2 rows)
    mean_of_means = 0.5 * (rows[:cut].mean(0) + rows[cut:].mean(0))
    assert np.abs(mean_of_means - rows.mean(0)).max() > 1e-2
