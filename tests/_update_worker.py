"""Worker launched by tests/test_distributed_update.py under ``torchrun --nproc_per_node=2``.

Usage: ``torchrun --standalone --nproc_per_node=2 tests/_update_worker.py OUT_DIR``

Each rank takes its own slice of a global minibatch (units ``SPLIT[r]:SPLIT[r+1]``, with
unequal numbers of valid samples: rank 0's loss mask is sparse, rank 1's dense) and runs
``STEPS`` :meth:`marl.algos.ppo.PolicyUpdate.step` calls on it (gloo, gradients averaged with
the local valid count as weight); then a ``ValueNorm(distributed=True)`` update on slices of
unequal size. It saves its gradients, parameters and ValueNorm statistics to
``OUT_DIR/rank{r}.pt``; the test compares them with one process on the concatenation.

The data builders below are shared with the test (imported as a module), so both sides see
exactly the same global minibatches.
"""

from __future__ import annotations

import os
import sys

import torch

from marl.algos.ppo import ClipPPOObjective, Minibatch, PolicyUpdate, PPOLossConfig
from marl.core.losses import OptimismOffset, ValueNorm
from marl.models.policies import AgentLayout, MultiAgentPolicy, TypeSpec
from marl.run.distributed import DistContext, init_distributed, shutdown

LAYOUT = AgentLayout(
    agents=("caller_0", "caller_1", "picker_0"),
    types=(
        TypeSpec("caller", ("caller_0", "caller_1"), (0, 1), obs_dim=5, n_actions=4),
        TypeSpec("picker", ("picker_0",), (2,), obs_dim=5, n_actions=3),
    ),
    state_dim=1,
)
#: rank r holds units SPLIT[r]:SPLIT[r+1] of each global minibatch
SPLIT = (0, 4, 10)
UNIT_STEPS = 3  # L: steps per unit
#: probability that a step enters the loss, per rank: unequal valid counts
VALID_PROB = (0.2, 0.9)
COEF = PPOLossConfig(clip_low=0.1, clip_high=0.3, dual_clip=2.0, ent_coef=0.05)
LR = 0.01
MAX_GRAD_NORM = 0.5  # binds on the global gradient and on rank 0's local one, not rank 1's
STEPS = 2

#: rows of each ValueNorm update on each rank (unequal), of shape [rows, 2, VN_SHAPE]
VN_ROWS = (5, 11)
VN_SHAPE = 3
VN_BETA = 0.9
VN_UPDATES = 2


def make_policy() -> tuple[MultiAgentPolicy, OptimismOffset]:
    """The same policy (non-uniform heads) and optimism offset on every rank."""
    torch.manual_seed(0)
    policy = MultiAgentPolicy(LAYOUT, "mlp", 16, "tanh")
    with torch.no_grad():
        for actor in policy.actors.values():
            actor.head.weight.normal_()
    return policy, OptimismOffset(0.3)


def global_minibatch(step: int) -> dict[str, Minibatch]:
    """Per agent type, the global minibatch of optimiser step ``step``: ``SPLIT[-1]`` units of
    ``UNIT_STEPS`` steps; behaviour log-probs away from the policy (ratios spread around 1)."""
    g = torch.Generator().manual_seed(100 + step)
    B, L = SPLIT[-1], UNIT_STEPS
    prob = torch.tensor([VALID_PROB[0]] * SPLIT[1] + [VALID_PROB[1]] * (B - SPLIT[1]))
    loss_mask = torch.rand(B, L, generator=g) < prob[:, None]
    loss_mask[SPLIT[0] : SPLIT[1], 0] = True  # every unit has a valid step
    loss_mask[SPLIT[1] :, 0] = True
    units = {}
    for t in LAYOUT.types:
        n, D, A = t.n_agents, t.obs_dim, t.n_actions
        action_mask = torch.rand(B, L, n, A, generator=g) < 0.7
        action_mask[..., 0] = True
        scores = torch.rand(B, L, n, A, generator=g).masked_fill(~action_mask, -1.0)
        actions = scores.argmax(-1)  # uniform among the allowed actions
        uniform = -torch.log(action_mask.sum(-1).float())
        units[t.name] = Minibatch(
            obs=torch.randn(B, L, n, D, generator=g),
            action_mask=action_mask,
            actions=actions,
            old_logp=uniform + 2.0 * torch.rand(B, L, n, generator=g) - 1.0,
            advantages=torch.randn(B, L, n, generator=g),
            loss_mask=loss_mask,
        )
    return units


def rank_slice(units: dict[str, Minibatch], rank: int) -> dict[str, Minibatch]:
    idx = torch.arange(SPLIT[rank], SPLIT[rank + 1])
    return {k: mb.select(idx) for k, mb in units.items()}


def run_policy_steps(
    ctx: DistContext | None, rank: int | None, max_grad_norm: float | None = MAX_GRAD_NORM
) -> dict[str, list]:
    """``STEPS`` optimiser steps on the global minibatches (``rank`` None) or on ``rank``'s
    slices; the gradients (after averaging and clipping) and parameters after each step."""
    policy, offset = make_policy()
    update = PolicyUpdate(
        policy,
        lr=LR,
        epochs=1,
        num_minibatches=1,
        max_grad_norm=max_grad_norm,
        objective=ClipPPOObjective(offset=offset),
        ctx=ctx,
    )
    grads, params = [], []
    for step in range(STEPS):
        units = global_minibatch(step)
        if rank is not None:
            units = rank_slice(units, rank)
        update.step(units, COEF)
        grads.append([p.grad.detach().clone() for p in update.params])
        params.append([p.detach().clone() for p in update.params])
    return {"grads": grads, "params": params}


def value_norm_data(update: int) -> torch.Tensor:
    """``[sum(VN_ROWS), 2, VN_SHAPE]`` returns of ValueNorm update ``update`` (all ranks)."""
    g = torch.Generator().manual_seed(200 + update)
    scale = torch.tensor([1.0, 3.0, 0.5])
    shift = torch.tensor([-1.0, 2.0, 0.0]) * (update + 1)
    return torch.randn(sum(VN_ROWS), 2, VN_SHAPE, generator=g) * scale + shift


def run_value_norm(rank: int, distributed: bool) -> dict[str, torch.Tensor]:
    vn = ValueNorm(VN_SHAPE, VN_BETA, distributed=distributed)
    bounds = (0, VN_ROWS[0], sum(VN_ROWS))
    for u in range(VN_UPDATES):
        vn.update(value_norm_data(u)[bounds[rank] : bounds[rank + 1]])
    probe = torch.linspace(-2.0, 2.0, 4 * VN_SHAPE, dtype=torch.float64).reshape(4, VN_SHAPE)
    return {
        "running_mean": vn.running_mean.clone(),
        "running_mean_sq": vn.running_mean_sq.clone(),
        "debiasing_term": vn.debiasing_term.clone(),
        "normalized": vn.normalize(probe),
    }


def main() -> None:
    out_dir = sys.argv[1]
    torch.set_num_threads(1)
    ctx = init_distributed(timeout_s=60.0, device="cpu")
    result = {
        "rank": ctx.rank,
        "world_size": ctx.world_size,
        "policy": run_policy_steps(ctx, ctx.rank),
        "value_norm": run_value_norm(ctx.rank, distributed=True),
    }
    torch.save(result, os.path.join(out_dir, f"rank{ctx.rank}.pt"))
    shutdown(ctx)


if __name__ == "__main__":
    main()
