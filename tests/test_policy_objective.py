"""The shared policy objective and the plain update path (issue 37, item 3).

- The default optimiser step is torch's own: ``PolicyUpdate.step`` equals a CleanRL-style step
  written out here (loss recomputed by hand, ``zero_grad``, ``backward``, the global-norm
  clip, ``Adam.step`` of a separate, unfused Adam).
- Extra-term hooks stack (a list, run in order, each seeing the terms before it) and receive
  the sample mask, which excludes agents that have left their episode.
- A subclass named as an algorithm's ``objective_class`` replaces a built-in term.
- The chunked-backward wrapper hands hooks whole windows (it falls back to the plain path).
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

import _update_worker as W
import pytest
import torch
from test_mappo import _cfg

from marl.algos.mappo import MAPPO
from marl.algos.ppo import (
    ClipPPOObjective,
    Minibatch,
    PolicyUpdate,
    chunked_loss_and_backward,
)
from marl.core.losses import OptimismOffset
from marl.models.policies import MultiAgentPolicy


def _hand_loss(policy, offset_b, units):
    """The minibatch's loss recomputed from its definition: per sample the clipped surrogate
    with dual clip on ``A + b`` and the entropy bonus, summed over the valid samples of all
    types over their count; plus the offset's ``(mean(A) + b)^2``."""
    coef = W.COEF
    count = sum(mb.sample_mask().sum() for mb in units.values()).double()
    loss = torch.zeros((), dtype=torch.float64)
    advantages, masks = [], []
    for name, mb in units.items():
        dist = policy.actors[name].sequence(mb.obs, mb.action_mask, None, None)
        logp = dist.log_prob(mb.actions).double()
        adv = mb.advantages.double() + float(offset_b)
        ratio = (logp - mb.old_logp.double()).exp()
        clipped = ratio.clamp(1 - coef.clip_low, 1 + coef.clip_high)
        surrogate = torch.min(ratio * adv, clipped * adv)
        surrogate = torch.where(adv < 0, torch.max(surrogate, coef.dual_clip * adv), surrogate)
        m = mb.sample_mask().double()
        loss = loss - (surrogate * m).sum() / count
        loss = loss - coef.ent_coef * (dist.entropy().double() * m).sum() / count
        advantages.append(mb.advantages.reshape(-1))
        masks.append(mb.sample_mask().reshape(-1))
    return loss, torch.cat(advantages), torch.cat(masks)


def test_default_step_is_a_plain_torch_step():
    policy, offset = W.make_policy()
    update = PolicyUpdate(
        policy,
        lr=W.LR,
        epochs=1,
        num_minibatches=1,
        max_grad_norm=W.MAX_GRAD_NORM,
        objective=ClipPPOObjective(offset=offset),
    )
    ref_policy, ref_offset = W.make_policy()
    ref_params = list(ref_policy.parameters()) + list(ref_offset.parameters())
    ref_opt = torch.optim.Adam(ref_params, lr=W.LR, eps=1e-5, foreach=False)
    for step in range(W.STEPS):
        units = W.global_minibatch(step)
        metrics = update.step(units, W.COEF)
        # the same step written out, CleanRL's order
        loss, adv, mask = _hand_loss(ref_policy, ref_offset.b.detach(), units)
        offset_loss = ((adv + ref_offset.b) * mask).sum() / mask.sum()
        ref_opt.zero_grad()
        (loss + offset_loss**2).backward()
        norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in ref_params))
        scale = min(1.0, W.MAX_GRAD_NORM / (float(norm) + 1e-6))
        for p in ref_params:
            p.grad.mul_(scale)
        ref_opt.step()
        assert float(norm) > W.MAX_GRAD_NORM  # the clip binds: the test sees its scale
        assert metrics["grad_norm"] == pytest.approx(float(norm), rel=1e-5)
        # fused Adam (the update's) and the per-tensor loop round differently in float32
        for p, q in zip(update.params, ref_params, strict=True):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def _hook_minibatch() -> Minibatch:
    """One type's minibatch of 2 units x 2 steps x 2 agents; agent 1 leaves after step 0."""
    g = torch.Generator().manual_seed(3)
    B, L, n, D, A = 2, 2, 2, 5, 4
    agent_mask = torch.ones(B, L, n, dtype=torch.bool)
    agent_mask[:, 1, 1] = False
    return Minibatch(
        obs=torch.randn(B, L, n, D, generator=g),
        action_mask=torch.ones(B, L, n, A, dtype=torch.bool),
        actions=torch.zeros(B, L, n, dtype=torch.long),
        old_logp=torch.full((B, L, n), -1.3),
        advantages=torch.randn(B, L, n, generator=g),
        loss_mask=torch.ones(B, L, dtype=torch.bool),
        agent_mask=agent_mask,
    )


def test_extra_terms_stack_and_see_the_sample_mask():
    seen = []

    def first(actor, mb, terms, mask):
        seen.append(("first", mask.clone(), sorted(terms)))
        per_sample = terms["logits"].pow(2).mean(-1)  # [B, L, n]
        return {"loss/first": 0.1 * (per_sample * mask).sum() / terms["count"]}

    def second(actor, mb, terms, mask):
        seen.append(("second", mask.clone(), sorted(terms)))
        return {"loss/second": 2.0 * terms["loss/first"], "second_stat": mask.sum().float()}

    layout = W.LAYOUT
    torch.manual_seed(0)
    policy = MultiAgentPolicy(layout, "mlp", 8, "tanh")
    objective = ClipPPOObjective(extra_terms=[first])
    objective.extra_terms.append(second)
    mb = _hook_minibatch()
    actor = policy.actors["caller"]
    terms = objective(actor, mb, W.COEF, count=torch.tensor(6.0))
    # the mask: loss steps of agents still in their episode (agent 1 left after step 0)
    expected = torch.tensor([[True, True], [True, False]]).expand(2, 2, 2)
    assert [name for name, _, _ in seen] == ["first", "second"]
    for _, mask, _ in seen:
        assert mask.dtype == torch.bool and torch.equal(mask, expected)
    assert "loss/first" in seen[1][2]  # the second hook sees the first one's term
    total = objective.total(terms)
    parts = ("loss/policy", "loss/entropy", "loss/first", "loss/second")
    torch.testing.assert_close(total, sum(terms[k] for k in parts))
    assert float(terms["second_stat"]) == 6.0
    # through an update: every hook's term is a metric (summed over the types)
    update = PolicyUpdate(
        policy, lr=1e-3, epochs=1, num_minibatches=1, max_grad_norm=None, objective=objective
    )
    metrics = update.step(W.global_minibatch(0), W.COEF)
    assert {"loss/first", "loss/second", "second_stat"} <= set(metrics)
    assert metrics["loss/second"] == pytest.approx(2.0 * metrics["loss/first"], rel=1e-6)
    assert not set(ClipPPOObjective.INTERMEDIATES) & set(metrics)


class _NoEntropyObjective(ClipPPOObjective):
    def terms(self, mb, dist, coef, count):
        terms = super().terms(mb, dist, coef, count)
        terms["loss/entropy"] = terms["loss/entropy"] * 0.0
        return terms


class _NoEntropyMAPPO(MAPPO):
    objective_class: ClassVar[type[ClipPPOObjective]] = _NoEntropyObjective


def test_objective_class_replaces_a_built_in_term():
    torch.manual_seed(0)
    algo = _NoEntropyMAPPO(_cfg(ent_coef=0.05, optimism_offset=0.2), None)
    assert isinstance(algo.policy_update.objective, _NoEntropyObjective)
    assert isinstance(algo.policy_update.objective.offset, OptimismOffset)
    metrics = algo.iteration(0.0)
    assert metrics["loss/entropy"] == 0.0 and metrics["entropy"] > 0


def test_chunked_backward_hands_hooks_whole_windows():
    torch.manual_seed(0)
    policy = MultiAgentPolicy(W.LAYOUT, "gru", 8, "tanh")
    actor = policy.actors["caller"]
    mb = replace(_hook_minibatch(), state=actor.initial_state(2))
    lengths = []

    def record(actor, mb, terms, mask):
        lengths.append(terms["logits"].shape[1])
        return {}

    objective = ClipPPOObjective(tbptt_chunk=1, extra_terms=[record])
    count = mb.sample_mask().sum().float()
    terms = chunked_loss_and_backward(objective, policy.actors, {"caller": mb}, W.COEF, count)
    assert lengths == [2] and "logits" in terms["caller"]
