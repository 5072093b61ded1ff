"""The value update (marl.algos.value_update) and the batch-of-one policy update (issue 37).

References:

- one run's value epochs written out with stock torch on a separate copy of the critic
  (``value_loss`` in float64 by hand, ``torch.nn.utils.clip_grad_norm_``, ``torch.optim.Adam``):
  the same parameters after every step, to float32 rounding;
- independence: run 1 of a stack of three equals the same run updated alone, bit for bit
  (one torch thread), and a run left out of training is not touched;
- a run's critic and policy are their slices of the stack: a step moves them, and
  ``load_state_dict`` into the run's module moves the stack.
"""

from __future__ import annotations

import copy

import _update_worker as W
import pytest
import torch

from marl.algos.ppo import PolicyUpdate
from marl.algos.value_update import ValueTargets, ValueUpdate
from marl.models.policies import CentralCritic

D, N, K, M = 6, 3, 2, 40
LR, MAX_NORM, CLIP = 3e-3, 0.5, 0.2


def make_critic(seed: int) -> CentralCritic:
    torch.manual_seed(seed)
    return CentralCritic(D, N, hidden_dim=16, ensemble=K)


def make_data(seed: int, runs: int = 1, active: bool = True) -> ValueTargets:
    g = torch.Generator().manual_seed(seed)
    states = torch.randn(runs, M, D, generator=g)
    old_team, old_ind = (
        torch.randn(runs, M, K, generator=g),
        torch.randn(runs, M, N, K, generator=g),
    )
    target_team = old_team + torch.randn(runs, M, K, generator=g)
    target_ind = old_ind + torch.randn(runs, M, N, K, generator=g)
    mask = torch.rand(runs, M, N, 1, generator=g) > 0.3 if active else None
    return ValueTargets(states, old_team, old_ind, target_team, target_ind, mask)


def hand_loss(critic: CentralCritic, data: ValueTargets, idx: torch.Tensor) -> torch.Tensor:
    """0.5 * clipped squared error, team mean + individual masked mean, float64."""

    def clipped(pred, old, target):
        pred, old, target = pred.double(), old.double(), target.double()
        err = (pred - target) ** 2
        other = (old + (pred - old).clamp(-CLIP, CLIP) - target) ** 2
        return torch.max(err, other)

    team, ind = critic(data.states[0, idx])
    loss_team = 0.5 * clipped(team, data.old_team[0, idx], data.target_team[0, idx]).mean()
    m = data.active[0, idx].double().expand(len(idx), N, K)
    err = clipped(ind, data.old_ind[0, idx], data.target_ind[0, idx])
    return loss_team + 0.5 * (err * m).sum() / m.sum()


def test_one_run_equals_the_value_epochs_written_out_with_stock_torch(one_thread) -> None:
    critic, ref = make_critic(0), make_critic(0)
    update = ValueUpdate(critic, lr=LR, num_minibatches=4, max_grad_norm=MAX_NORM, value_clip=CLIP)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=LR, eps=1e-5, foreach=False)
    data = make_data(1)
    orders = [torch.randperm(M, generator=torch.Generator().manual_seed(e)) for e in range(2)]
    metrics, stops = update.epochs_of_minibatches(data, [o[None] for o in orders])
    assert not stops
    losses = []
    for order in orders:
        for start in range(0, M, 10):
            idx = order[start : start + 10]
            loss = hand_loss(ref, data, idx)
            ref_opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(ref.parameters(), MAX_NORM)
            ref_opt.step()
            losses.append(float(loss.detach()))
    for p, q in zip(critic.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6)
    assert float(metrics["loss/value"][0]) == pytest.approx(sum(losses) / len(losses), rel=1e-5)


def test_a_run_in_a_stack_equals_the_run_alone_and_a_stopped_run_is_untouched(one_thread):
    critics = [make_critic(s) for s in (0, 1, 2)]
    before = [p.detach().clone() for p in critics[2].parameters()]
    stacked = ValueUpdate(
        critics, lr=LR, num_minibatches=4, max_grad_norm=MAX_NORM, value_clip=CLIP
    )
    alone_critic = make_critic(1)
    alone = ValueUpdate(
        alone_critic, lr=LR, num_minibatches=4, max_grad_norm=MAX_NORM, value_clip=CLIP
    )
    data = make_data(3, runs=3)
    g = torch.Generator().manual_seed(7)
    orders = [torch.stack([torch.randperm(M, generator=g) for _ in range(3)]) for _ in range(2)]
    metrics, _ = stacked.epochs_of_minibatches(data, orders, training=[True, True, False])
    one = ValueTargets(*(None if t is None else t[1:2] for t in (
        data.states, data.old_team, data.old_ind, data.target_team, data.target_ind, data.active
    )))  # fmt: skip
    metrics_alone, _ = alone.epochs_of_minibatches(one, [o[1:2] for o in orders])
    for p, q in zip(critics[1].parameters(), alone_critic.parameters(), strict=True):
        assert torch.equal(p, q)
    assert torch.equal(metrics["loss/value"][1:2], metrics_alone["loss/value"])
    for p, q in zip(critics[2].parameters(), before, strict=True):
        assert torch.equal(p, q)  # the run that does not train
    assert not stacked.optimizer.state.get(stacked.views.per_seed[2][0])


def test_a_runs_modules_are_its_slices_of_the_stack() -> None:
    critic = make_critic(0)
    update = ValueUpdate(critic, lr=LR, num_minibatches=1, max_grad_norm=None, value_clip=None)
    for p, stacked in zip(critic.parameters(), update.views.stacked, strict=True):
        assert p.data_ptr() == stacked.data_ptr()  # run 0's slice starts the stack
    # loading a checkpoint into the run's own module moves the stack
    other = make_critic(5)
    critic.load_state_dict(other.state_dict())
    state = torch.randn(1, 4, D)
    torch.testing.assert_close(update.stack(state)[0][0], other(state[0])[0])
    # the optimizer's state_dict is that of an Adam over the run's own parameters
    data = make_data(2, active=False)
    update.epochs_of_minibatches(data, [torch.randperm(M)[None]])
    plain = torch.optim.Adam(copy.deepcopy(critic).parameters(), lr=LR, eps=1e-5)
    plain.load_state_dict(update.optimizer.state_dict())  # same layout: loads
    assert len(update.optimizer.param_groups) == 1


def test_the_runs_policy_is_its_slice_of_the_policy_stack() -> None:
    policy, _ = W.make_policy()
    update = PolicyUpdate(policy, lr=W.LR, epochs=1, num_minibatches=1, max_grad_norm=None)
    assert all(p is v for p, v in zip(policy.parameters(), update.views.per_seed[0], strict=True))
    before = [p.detach().clone() for p in policy.parameters()]
    update.step(W.global_minibatch(0), W.COEF)
    moved = [not torch.equal(p, q) for p, q in zip(policy.parameters(), before, strict=True)]
    assert all(moved)  # the step moved the run's own policy (every parameter has a gradient)
    for p, stacked in zip(policy.parameters(), update.views.stacked, strict=True):
        assert torch.equal(p, stacked[0])
