"""Kernel: the optimiser step of :class:`marl.algos.ppo.PolicyUpdate` and MAPPO's critic in
fewer operations (private torch APIs are allowed in this file, whose path says it is a kernel).

The readable twin is the stock pair ``torch.nn.utils.clip_grad_norm_(params, max_norm)`` and
``optimizer.step()``; :func:`clip_and_adam_step` performs the same arithmetic (tested
bit-identical in tests/test_optim_kernel.py) without the per-call Python of those wrappers
(the profiler context, dynamo guard and parameter grouping of ``Optimizer.step``, the
device/dtype grouping of ``clip_grad_norm_``), which costs more than the arithmetic for these
small networks: about a tenth of a MAPPO iteration on CPU (BENCHMARKS.md, MAPPO throughput).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["adam_step", "clip_grad_norm", "clip_and_adam_step"]


def adam_step(optimizer: torch.optim.Optimizer) -> None:
    """``optimizer.step()``; for a fused single-group Adam (no amsgrad, not maximising) whose
    parameters all have a gradient and a state, the same kernel with the same arguments as
    ``Optimizer.step`` passes it (``torch._fused_adam_`` after the step counts' increment;
    tested equal), without its per-call Python, about half the cost of a step for these
    small networks. Anything else goes to ``optimizer.step()``."""
    groups = optimizer.param_groups
    g = groups[0]
    odd = ("amsgrad", "maximize", "decoupled_weight_decay", "capturable", "differentiable")
    if len(groups) != 1 or not g.get("fused") or any(g.get(k) for k in odd):
        optimizer.step()
        return
    params = g["params"]
    states = [optimizer.state.get(p) for p in params]
    if any(p.grad is None or not st for p, st in zip(params, states, strict=True)) or (
        len({(p.device, p.dtype) for p in params}) > 1
    ):
        # the first step (creates the state), a parameter without gradient, or parameters
        # that Optimizer.step would group by device and dtype
        optimizer.step()
        return
    steps = [st["step"] for st in states]
    torch._foreach_add_(steps, 1)
    beta1, beta2 = g["betas"]
    torch._fused_adam_(
        params,
        [p.grad for p in params],
        [st["exp_avg"] for st in states],
        [st["exp_avg_sq"] for st in states],
        [],
        steps,
        amsgrad=False,
        lr=g["lr"],
        beta1=beta1,
        beta2=beta2,
        weight_decay=g["weight_decay"],
        eps=g["eps"],
        maximize=False,
        grad_scale=None,
        found_inf=None,
    )


def clip_grad_norm(grads: list[Tensor], max_norm: float | None) -> Tensor:
    """``torch.nn.utils.clip_grad_norm_`` on the gradients themselves, the same operations
    (the 2-norm of the per-tensor 2-norms; ``grads *= min(max_norm / (norm + 1e-6), 1)``) without
    its per-call grouping by device and dtype, which costs more than the arithmetic for a few
    small tensors (~0.2 ms per call). ``max_norm=None``: the norm only. Returns the norm before
    clipping (a 0-dim tensor)."""
    if not grads:
        return torch.tensor(0.0)
    if len({(g.device, g.dtype) for g in grads}) > 1:  # mixed: torch's grouping
        bound = float("inf") if max_norm is None else max_norm
        params = [nn.Parameter(torch.empty_like(g)) for g in grads]
        for p, g in zip(params, grads, strict=True):
            p.grad = g  # the gradient tensors themselves: clipped in place
        return torch.nn.utils.clip_grad_norm_(params, bound)
    norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0)
    if max_norm is not None:
        torch._foreach_mul_(grads, torch.clamp(max_norm / (norm + 1e-6), max=1.0))
    return norm


def clip_and_adam_step(
    optimizer: torch.optim.Optimizer, params: list[nn.Parameter], max_norm: float | None
) -> float:
    """``clip_grad_norm_(params, max_norm)`` then ``optimizer.step()``; returns the norm
    before clipping."""
    norm = clip_grad_norm([p.grad for p in params if p.grad is not None], max_norm)
    adam_step(optimizer)
    return float(norm)
