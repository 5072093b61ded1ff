"""A real 2-process torch.distributed (gloo) run of the whitening kernel.

Each rank's output must equal whitening the concatenation of both ranks' data (unequal sizes
per rank, a group present on one rank only, masked padding ids), computed here in numpy
float64 (loops over groups), not by the code under test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from marl.core.whitening import whiten

WORKER = Path(__file__).with_name("_dist_worker.py")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not available")
    # Compile the numba kernels here first so both workers load them from the disk cache
    # instead of compiling them concurrently.
    whiten(torch.randn(8), mask=torch.rand(8) > 0.5, group=torch.randint(0, 3, (8,)))
    tmp = tmp_path_factory.mktemp("dist")
    init_file = tmp / "init"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(rank), "2", str(init_file), str(tmp)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    logs = []
    for proc in procs:
        try:
            logs.append(proc.communicate(timeout=90)[0])
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            pytest.fail("distributed worker timed out")
    for proc, log in zip(procs, logs, strict=True):
        assert proc.returncode == 0, f"worker failed:\n{log}"
    return [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in range(2)]


def _cat(results: list[dict], key: str) -> np.ndarray:
    return torch.cat([r[key] for r in results]).numpy()


def _split(full: np.ndarray, results: list[dict]) -> list[np.ndarray]:
    sizes = np.cumsum([r["x"].numel() for r in results])[:-1]
    return np.split(full, sizes)


def test_setup_is_nontrivial(results: list[dict]) -> None:
    sizes = [r["x"].numel() for r in results]
    assert sizes[0] != sizes[1]
    g0, g1 = results[0]["group"], results[1]["group"]
    assert 4 not in g0[results[0]["mask"]].tolist() and 4 in g1[results[1]["mask"]].tolist()


def ref_moments(x: np.ndarray, mask: np.ndarray, group: np.ndarray, k: int) -> tuple:
    """(count, mean, population var) of the valid entries of group k, numpy float64."""
    v = x[mask & (group == k)].astype(np.float64)
    return v.size, (v.mean() if v.size else 0.0), (v.var() if v.size else 0.0)


def ref_whiten(x, mask=None, group=None, eps=1e-8, center=True, scale=True) -> np.ndarray:
    """numpy float64 loop over groups: (x - mean_g) / (std_g + eps), 0 where masked."""
    x = np.asarray(x, np.float64)
    mask = np.ones(x.shape, bool) if mask is None else mask
    group = np.zeros(x.shape, np.int64) if group is None else group
    out = np.zeros_like(x)
    for k in np.unique(group[mask]):
        sel = mask & (group == k)
        n, mean, var = ref_moments(x, mask, group, k)
        if n > 1 and var > 0:
            num = x[sel] - mean if center else x[sel]
            out[sel] = num / (np.sqrt(var) + eps) if scale else num
    return out


@pytest.mark.parametrize(
    ("key", "kw"),
    [
        ("grouped", {"group": True, "mask": True}),
        ("batch", {}),
        ("no_center", {"group": True, "mask": True, "center": False}),
        ("no_scale", {"group": True, "mask": True, "scale": False}),
    ],
)
def test_whiten_equals_concatenation(results: list[dict], key: str, kw: dict) -> None:
    x = _cat(results, "x")
    call = {k: v for k, v in kw.items() if k in ("center", "scale")}
    if kw.get("group"):
        call["group"] = _cat(results, "group")
    if kw.get("mask"):
        call["mask"] = _cat(results, "mask")
    expected = _split(ref_whiten(x, **call), results)
    for rank, r in enumerate(results):
        np.testing.assert_allclose(r[key].double().numpy(), expected[rank], rtol=1e-6, atol=1e-5)
        assert r[key].abs().sum() > 0


def test_group_relative_equals_concatenation(results: list[dict]) -> None:
    """RLOO outcome advantages: n_g / (n_g - 1) * (R - mean_g) / (std_g + eps)."""
    returns, groups = _cat(results, "returns"), _cat(results, "ep_group")
    valid = np.ones(returns.shape, bool)
    expected = ref_whiten(returns, valid, groups)
    degenerate = []
    for k in np.unique(groups):
        n, _, var = ref_moments(returns, valid, groups, k)
        expected[groups == k] *= n / (n - 1) if n > 1 else 0.0
        degenerate.append(n <= 1 or var == 0)
    for rank, r in enumerate(results):
        np.testing.assert_allclose(r["grpo"].numpy(), _split(expected, results)[rank], atol=1e-5)
        assert r["grpo_frac"] == pytest.approx(np.mean(degenerate))


def test_running_moments_equal_concatenation(results: list[dict]) -> None:
    x, group, mask = _cat(results, "x"), _cat(results, "group"), _cat(results, "mask")
    # exact: update 1 = all data (masked), update 2 = the first 10 + rank entries, unmasked
    heads = np.concatenate([r["x"][: 10 + i].numpy() for i, r in enumerate(results)])
    head_groups = np.concatenate(
        [r["group"][: 10 + i].clamp_min(0).numpy() for i, r in enumerate(results)]
    )
    all_x = np.concatenate([x, heads])
    all_g = np.concatenate([group, head_groups])
    all_m = np.concatenate([mask, np.ones(heads.shape, bool)])
    exact = [ref_moments(all_x, all_m, all_g, k) for k in range(6)]
    # EMA (momentum 0.9) over update 1 = x, update 2 = 2 x: mixture formula by hand
    ema = []
    for k in range(6):
        n, mean1, var1 = ref_moments(x, mask, group, k)
        if n == 0:
            ema.append((0, 0.0, 0.0))
            continue
        mean2, var2 = 2 * mean1, 4 * var1
        mean = 0.9 * mean1 + 0.1 * mean2
        var = 0.9 * (var1 + (mean1 - mean) ** 2) + 0.1 * (var2 + (mean2 - mean) ** 2)
        ema.append((2 * n, mean, var))
    for r in results:
        for ref, key in ((exact, "running"), (ema, "ema")):
            state = r[key]
            count, mean, var = (np.array(col, np.float64) for col in zip(*ref, strict=True))
            np.testing.assert_array_equal(state["count"].numpy(), count)
            np.testing.assert_allclose(state["mean"].numpy(), mean, rtol=1e-9, atol=1e-9)
            np.testing.assert_allclose(state["var"].numpy(), var, rtol=1e-7, atol=1e-9)


def test_nan_on_one_rank_raises_on_every_rank(results: list[dict]) -> None:
    for r in results:
        assert "NaN" in r["nan_error"]


def test_bad_input_on_one_rank_raises_on_every_rank(results: list[dict]) -> None:
    assert "non-negative" in results[0]["bad_input_error"]
    assert "another rank" in results[1]["bad_input_error"]
    x, group = _cat(results, "x"), _cat(results, "group").clip(min=0)
    expected = _split(ref_whiten(x, None, group), results)
    for rank, r in enumerate(results):
        np.testing.assert_allclose(r["after_error"].numpy(), expected[rank], atol=1e-5)


def test_distributed_without_process_group_is_a_clear_error() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        pytest.skip("a process group is initialised in this process")
    with pytest.raises(ValueError, match="process group"):
        whiten(torch.randn(5), distributed=True)
