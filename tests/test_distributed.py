"""Tests for marl.run.distributed: single-process behaviour and real 2-process gloo runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from marl.run import distributed as D

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "_ddp_worker.py"
sys.path.insert(0, str(ROOT / "tests"))
import _ddp_worker as W  # noqa: E402


def _clear_dist_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)


def torchrun(mode: str, out_dir: Path, timeout: float = 90.0) -> subprocess.CompletedProcess:
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
        mode,
        str(out_dir),
    ]
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


# ------------------------------------------------------------------ single process


def test_single_process_context_is_disabled_and_helpers_are_identity(monkeypatch):
    _clear_dist_env(monkeypatch)
    ctx = D.init_distributed()
    assert not ctx.enabled and ctx.rank == 0 and ctx.world_size == 1 and ctx.is_main
    assert ctx.backend is None and ctx.device.type in ("cpu", "cuda")
    assert ctx.seed_offset(5) == 5
    t = torch.tensor([1.0, 2.0])
    assert D.all_reduce_sum(t, ctx) is t and t.tolist() == [1.0, 2.0]
    assert D.all_gather_objects({"a": 1}, ctx) == [{"a": 1}]
    assert D.broadcast_object("x", ctx) == "x"
    model = torch.nn.Linear(2, 2)
    before = [p.clone() for p in model.parameters()]
    D.broadcast_parameters(model, ctx)
    model(torch.ones(3, 2)).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    D.average_gradients(model.parameters(), ctx)
    D.average_gradients(model, ctx, weight=3)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert all(torch.equal(a, p.grad) for a, p in zip(grads, model.parameters(), strict=True))
    D.barrier(ctx)
    D.shutdown(ctx)


def test_liveness_exit_joins_the_heartbeat_thread(monkeypatch):
    """mark_exit returns only after the heartbeat thread ended, even when a beat is inside a
    slow store call: a daemon thread left in a store call at interpreter exit aborts the
    process (seen once as SIGABRT on a torchrun resume)."""
    import threading
    import time

    in_set = threading.Event()

    class SlowStore:
        def __init__(self) -> None:
            self.keys: list[str] = []

        def set(self, key: str, value: str) -> None:
            if "heartbeat" in key and self.keys:
                in_set.set()
                time.sleep(0.3)
            self.keys.append(key)

    store = SlowStore()
    monkeypatch.setattr(D, "_default_store", lambda: store)
    monkeypatch.setattr(D, "_HEARTBEAT_INTERVAL_S", 0.01)
    live = D._Liveness(D.DistContext(enabled=True, rank=1, world_size=2))
    live.start()
    assert in_set.wait(5.0), "the heartbeat thread never beat"
    live.mark_exit("test")
    assert live.thread is not None and not live.thread.is_alive()
    assert store.keys[-1].endswith("/exit/1")


def test_seed_offset_distinct_per_rank():
    offsets = [D.DistContext(enabled=True, rank=r, world_size=4).seed_offset(3) for r in range(4)]
    assert offsets == [3 + r * D.RANK_SEED_STRIDE for r in range(4)]
    with pytest.raises(ValueError, match="base_seed"):
        D.DistContext().seed_offset(-1)
    with pytest.raises(TypeError, match="base_seed"):
        D.DistContext().seed_offset(1.5)


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan")])
def test_init_rejects_bad_timeout(bad, monkeypatch):
    _clear_dist_env(monkeypatch)
    with pytest.raises(ValueError, match="timeout_s"):
        D.init_distributed(timeout_s=bad)
    with pytest.raises(TypeError, match="timeout_s"):
        D.init_distributed(timeout_s="10")


def test_init_rejects_broken_torchrun_env(monkeypatch):
    _clear_dist_env(monkeypatch)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="MASTER_ADDR"):
        D.init_distributed()
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(ValueError, match="RANK=2, WORLD_SIZE=2"):
        D.init_distributed()
    monkeypatch.setenv("RANK", "zero")
    with pytest.raises(ValueError, match="RANK must be an integer"):
        D.init_distributed()


def test_average_gradients_rejects_bad_weight():
    ctx = D.DistContext()
    model = torch.nn.Linear(2, 1)
    with pytest.raises(ValueError, match="weight"):
        D.average_gradients(model, ctx, weight=-1.0)
    with pytest.raises(TypeError, match="weight"):
        D.average_gradients(model, ctx, weight="3")


def test_guard_passes_through_when_not_enabled():
    with pytest.raises(RuntimeError, match="boom"), D.guard(D.DistContext(), "op"):
        raise RuntimeError("boom")


# ------------------------------------------------------------------ two processes


def _full_batch_grads(model: torch.nn.Module, x, y) -> list[torch.Tensor]:
    model.zero_grad()
    W.loss_fn(model, x, y).backward()
    return [p.grad.clone() for p in model[:3].parameters()]


def test_two_process_gloo_matches_single_process_reference(tmp_path):
    proc = torchrun("checks", tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r0 = torch.load(tmp_path / "rank0.pt", weights_only=False)
    r1 = torch.load(tmp_path / "rank1.pt", weights_only=False)
    assert (r0["rank"], r1["rank"]) == (0, 1)
    assert r0["enabled"] and r0["world_size"] == 2 and r0["backend"] == "gloo"
    assert r0["is_main"] and not r1["is_main"]
    assert r0["seed_offset"] != r1["seed_offset"]

    # Broadcast: rank 1 starts different and ends with rank 0's initial state (incl. buffers).
    reference = W.make_model(100).state_dict()
    assert not torch.equal(r1["before_broadcast"]["0.weight"], reference["0.weight"])
    for key, value in reference.items():
        assert torch.equal(r0["after_broadcast"][key], value), key
        assert torch.equal(r1["after_broadcast"][key], value), key

    # Gradient averaging equals the gradient of the mean loss on the concatenated batch.
    model = W.make_model(100)
    x, y = W.global_data(0)
    expected = _full_batch_grads(model, x, y)
    for res in (r0, r1):
        for got, want in zip(res["grads_equal"], expected, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        for got, want in zip(res["grads_weighted"], expected, strict=True):  # 3 vs 5 rows, weighted
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)

    # After optimizer steps both ranks hold bit-identical parameters, equal to one process
    # training on the concatenated batches.
    for key in r0["after_steps"]:
        assert torch.equal(r0["after_steps"][key], r1["after_steps"][key]), key
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    for step in range(1, 4):
        x, y = W.global_data(step)
        opt.zero_grad()
        W.loss_fn(model, x, y).backward()
        opt.step()
    for key, value in model.state_dict().items():
        torch.testing.assert_close(r0["after_steps"][key], value, rtol=1e-5, atol=1e-6)

    assert r0["all_reduce_sum"].tolist() == [3.0, 30.0] == r1["all_reduce_sum"].tolist()
    expected_gather = [{"rank": 0, "tag": "r0"}, {"rank": 1, "tag": "r1"}]
    assert r0["all_gather"] == expected_gather == r1["all_gather"]
    assert r0["broadcast_object"] == {"from": 0} == r1["broadcast_object"]


@pytest.mark.slow
def test_rank_exiting_early_fails_peer_fast_naming_it(tmp_path):
    proc = torchrun("exit_early", tmp_path)
    out = json.loads((tmp_path / "error.json").read_text())
    assert out["raised"], (out, proc.stderr[-2000:])
    assert out["type"] == "DistributedError"
    assert "rank 1" in out["message"] and "rank 0 of 2" in out["message"]
    assert out["elapsed_s"] < out["timeout_s"] + 5.0


@pytest.mark.slow
def test_hung_rank_makes_peer_raise_within_timeout(tmp_path):
    proc = torchrun("hang", tmp_path)
    assert proc.returncode != 0  # rank 0 failed, torchrun tore the job down
    out = json.loads((tmp_path / "error.json").read_text())
    assert out["raised"] and out["type"] == "DistributedError"
    assert "rank 1" in out["message"] and "timeout 3 s" in out["message"]
    assert out["timeout_s"] - 0.5 <= out["elapsed_s"] < out["timeout_s"] + 5.0


def test_guard_wraps_only_communication_failures():
    ctx = D.DistContext(enabled=True, rank=1, world_size=2, timeout_s=5.0)
    with pytest.raises(RuntimeError, match="shape mismatch") as info, D.guard(ctx, "op"):
        raise RuntimeError("shape mismatch")  # an ordinary bug is not blamed on a peer
    assert not isinstance(info.value, D.DistributedError)
    expected = r"op failed on rank 1 of 2 .*timeout 5 s"
    with pytest.raises(D.DistributedError, match=expected), D.guard(ctx, "op"):
        raise RuntimeError("[gloo] Connection closed by peer [127.0.0.1]:1234")
