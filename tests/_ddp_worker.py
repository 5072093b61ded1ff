"""Worker launched by tests/test_distributed.py under ``torchrun --nproc_per_node=2``.

Usage: ``torchrun --standalone --nproc_per_node=2 tests/_ddp_worker.py MODE OUT_DIR``

MODE:
  checks      broadcast, gradient averaging (equal and unequal batches), identical parameters
              after optimizer steps, all_reduce_sum, all_gather_objects, broadcast_object.
              Each rank saves what it saw to OUT_DIR/rank{r}.pt; the test compares with a
              single-process reference computed independently.
  exit_early  rank 1 leaves without joining the collective; rank 0 must raise
              DistributedError quickly; it writes the message and elapsed time to
              OUT_DIR/error.json.
  hang        rank 1 stays alive but never joins; rank 0 must raise within the process-group
              timeout (TIMEOUT_S) and writes OUT_DIR/error.json, then exits with code 3.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
from torch import nn

from marl.run.distributed import (
    DistributedError,
    all_gather_objects,
    all_reduce_sum,
    average_gradients,
    broadcast_object,
    broadcast_parameters,
    init_distributed,
    shutdown,
)

TIMEOUT_S = 3.0


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3), nn.BatchNorm1d(3))
    with torch.no_grad():
        model[3].running_mean.normal_()  # a buffer that differs per seed
    return model


def global_data(step: int, n: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(n, 4, generator=g), torch.randn(n, 3, generator=g)


def loss_fn(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((model[:3](x) - y) ** 2).mean()


def run_checks(out_dir: str) -> None:
    ctx = init_distributed(timeout_s=60.0)
    r = ctx.rank
    result: dict = {
        "enabled": ctx.enabled,
        "rank": r,
        "world_size": ctx.world_size,
        "backend": ctx.backend,
        "is_main": ctx.is_main,
        "seed_offset": ctx.seed_offset(7),
    }
    model = make_model(100 + r)  # different on each rank before the broadcast
    result["before_broadcast"] = {k: v.clone() for k, v in model.state_dict().items()}
    broadcast_parameters(model, ctx)
    result["after_broadcast"] = {k: v.clone() for k, v in model.state_dict().items()}

    # Equal halves of the global batch, mean loss: averaged grads = full-batch grads.
    x, y = global_data(0)
    half = x.shape[0] // 2
    model.zero_grad()
    loss_fn(model, x[r * half : (r + 1) * half], y[r * half : (r + 1) * half]).backward()
    average_gradients(model.parameters(), ctx)
    result["grads_equal"] = [p.grad.clone() for p in model[:3].parameters()]

    # Unequal split (3 vs 5 rows), weighted by the local sample count.
    split = [0, 3, 8]
    model.zero_grad()
    loss_fn(model, x[split[r] : split[r + 1]], y[split[r] : split[r + 1]]).backward()
    average_gradients(model, ctx, weight=split[r + 1] - split[r])
    result["grads_weighted"] = [p.grad.clone() for p in model[:3].parameters()]

    # Optimizer steps: every rank must end with bit-identical parameters.
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    for step in range(1, 4):
        x, y = global_data(step)
        opt.zero_grad()
        loss_fn(model, x[r * half : (r + 1) * half], y[r * half : (r + 1) * half]).backward()
        average_gradients(model.parameters(), ctx)
        opt.step()
    result["after_steps"] = {k: v.clone() for k, v in model.state_dict().items()}

    t = torch.tensor([r + 1.0, 10.0 * (r + 1)], dtype=torch.float64)
    result["all_reduce_sum"] = all_reduce_sum(t, ctx).clone()
    result["all_gather"] = all_gather_objects({"rank": r, "tag": f"r{r}"}, ctx)
    result["broadcast_object"] = broadcast_object({"from": r}, ctx)
    torch.save(result, os.path.join(out_dir, f"rank{r}.pt"))
    shutdown(ctx)


def run_failure(out_dir: str, mode: str) -> None:
    ctx = init_distributed(timeout_s=TIMEOUT_S)
    # One successful collective first, so that both ranks are connected.
    all_reduce_sum(torch.ones(2), ctx)
    if ctx.rank == 1:
        if mode == "exit_early":
            return  # leaves the group (normal interpreter exit) without joining the next op
        time.sleep(10 * TIMEOUT_S)  # alive but never joins; torchrun kills it when rank 0 fails
        return
    t0 = time.monotonic()
    try:
        all_reduce_sum(torch.ones(2), ctx)
        outcome = {"raised": False}
    except DistributedError as err:
        outcome = {"raised": True, "type": type(err).__name__, "message": str(err)}
    outcome["elapsed_s"] = time.monotonic() - t0
    outcome["timeout_s"] = TIMEOUT_S
    with open(os.path.join(out_dir, "error.json"), "w") as fh:
        json.dump(outcome, fh)
    if mode == "hang":
        sys.stdout.flush()
        os._exit(3)


def main() -> None:
    mode, out_dir = sys.argv[1], sys.argv[2]
    if mode == "checks":
        run_checks(out_dir)
    elif mode in ("exit_early", "hang"):
        run_failure(out_dir, mode)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
