"""A real 2-process torch.distributed (gloo) run of the whitening kernel.

Each rank's output must equal single-process whitening of the concatenation of both ranks'
data (unequal sizes per rank, a group present on one rank only, masked padding ids).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from marl.core.advantages import group_relative_advantages
from marl.core.whitening import RunningMoments, whiten

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


def _cat(results: list[dict], key: str) -> torch.Tensor:
    return torch.cat([r[key] for r in results])


def _split(full: torch.Tensor, results: list[dict]) -> list[torch.Tensor]:
    sizes = [r["x"].numel() for r in results]
    return list(torch.split(full, sizes))


def test_setup_is_nontrivial(results: list[dict]) -> None:
    sizes = [r["x"].numel() for r in results]
    assert sizes[0] != sizes[1]
    g0, g1 = results[0]["group"], results[1]["group"]
    assert 4 not in g0[results[0]["mask"]].tolist() and 4 in g1[results[1]["mask"]].tolist()


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
    expected = _split(whiten(x, **call), results)
    for rank, r in enumerate(results):
        torch.testing.assert_close(r[key], expected[rank], rtol=0, atol=1e-5)
        assert r[key].abs().sum() > 0


def test_group_relative_equals_concatenation(results: list[dict]) -> None:
    adv, frac = group_relative_advantages(
        _cat(results, "returns"), _cat(results, "ep_group"), leave_one_out=True
    )
    for rank, r in enumerate(results):
        torch.testing.assert_close(r["grpo"], _split(adv, results)[rank], rtol=0, atol=1e-5)
        assert r["grpo_frac"] == pytest.approx(frac)


def test_running_moments_equal_concatenation(results: list[dict]) -> None:
    exact = RunningMoments(num_groups=6)
    x, group, mask = _cat(results, "x"), _cat(results, "group"), _cat(results, "mask")
    exact.update(x, mask=mask, group=group)
    heads = [r["x"][: 10 + i] for i, r in enumerate(results)]
    head_groups = [r["group"][: 10 + i].clamp_min(0) for i, r in enumerate(results)]
    exact.update(torch.cat(heads), group=torch.cat(head_groups))
    ema = RunningMoments(num_groups=6, momentum=0.9)
    ema.update(x, mask=mask, group=group)
    ema.update(x * 2, mask=mask, group=group)
    for r in results:
        for ref, key in ((exact, "running"), (ema, "ema")):
            state = r[key]
            torch.testing.assert_close(state["count"], ref.count, rtol=0, atol=0)
            torch.testing.assert_close(state["mean"], ref.mean, rtol=1e-12, atol=1e-9)
            torch.testing.assert_close(state["var"], ref.var, rtol=1e-9, atol=1e-9)


def test_nan_on_one_rank_raises_on_every_rank(results: list[dict]) -> None:
    for r in results:
        assert "NaN" in r["nan_error"]


def test_bad_input_on_one_rank_raises_on_every_rank(results: list[dict]) -> None:
    assert "non-negative" in results[0]["bad_input_error"]
    assert "another rank" in results[1]["bad_input_error"]
    x, group = _cat(results, "x"), _cat(results, "group").clamp_min(0)
    expected = _split(whiten(x, group=group), results)
    for rank, r in enumerate(results):
        torch.testing.assert_close(r["after_error"], expected[rank], rtol=0, atol=1e-5)


def test_distributed_without_process_group_is_a_clear_error() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        pytest.skip("a process group is initialised in this process")
    with pytest.raises(ValueError, match="process group"):
        whiten(torch.randn(5), distributed=True)
