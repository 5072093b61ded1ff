"""The clipped-surrogate policy update shared by MAPPO and GRPO, for S runs at once.

One update serves one run and many: :class:`PolicyUpdate` holds S runs' policies stacked
(a leading run axis on every parameter, :class:`marl.models.seed_policies.SeedMultiAgentPolicy`),
and a single run is a batch of one (S = 1). ``python -m marl.train --seed k`` and ``--seeds
0-15`` train through the same lines. An algorithm turns its batch into :class:`Minibatch`
units per agent type (single steps, training windows, or whole episodes) with their
advantages, then calls :meth:`PolicyUpdate.run` (one run) or
:meth:`PolicyUpdate.epochs_of_minibatches` (S runs, :class:`SeedMinibatch`): ``epochs``
passes over shuffled minibatches, each one (:meth:`PolicyUpdate.minibatch_step`)::

    count = each run's valid (step, agent) samples, all agent types   [S]
    optimizer.zero_grad()
    for every agent type:                                   (loss_and_backward)
        terms = objective(actor, minibatch, coef, count=count)   each term [S]
        objective.total(terms).sum().backward()             (run k's parameters get d loss[k])
    offset.loss(advantages).backward()                      (the optimism offset, if any)
    average_gradients (distributed, weighted by this rank's sample count)
    clip each run's gradients by its own norm (never the stack's); optimizer.step()

The optimizer is a stock ``torch.optim.Adam`` with one param group per run, over views of
the stack (:class:`marl.core.seed_batched.SeedViews`): each run's step count, moments and
learning rate are its own, a run whose loss turned non-finite is left out of the step, and
each run's own :class:`MultiAgentPolicy` *is* its slice of the stack (its parameters are the
views), so the rollout reads the latest parameters and checkpoints keep their single-run
format.

The loss is :class:`ClipPPOObjective`: named terms, as TorchRL's ``ClipPPOLoss`` returns
them. Every ``loss/...`` term is a sum over one agent type's valid samples divided by
``count``, so the types' terms add up to the joint mean. Subclass it to change a term, or
append hooks to its ``extra_terms`` list to add one (docs/extending.md; GRPO adds its KL
to the reference policy that way).

Two opt-in wrappers stand in for :func:`loss_and_backward`, the plain path, where the
configuration asks for them; neither changes the gradients:

- :func:`chunked_loss_and_backward` (``tbptt_chunk``): each truncated-BPTT chunk's backward
  runs before the next chunk's forward, so the activations kept are one chunk's;
- :func:`types_side_by_side` (``parallel_update``): each agent type's loss and backward in
  its own thread (the types' actors share no parameters); the only concurrency here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from marl.algos.parallel import side_by_side
from marl.core.losses import NonFiniteError, OptimismOffset, ppo_sample_stats, ppo_surrogate
from marl.core.seed_batched import SeedViews, clip_grads_per_seed_
from marl.models.policies import MaskedCategorical, MultiAgentPolicy, TypeActor
from marl.models.seed_policies import SeedMultiAgentPolicy
from marl.run.distributed import DistContext, average_gradients

__all__ = [
    "Minibatch",
    "PPOLossConfig",
    "ExtraTerm",
    "ClipPPOObjective",
    "per_run_sum",
    "loss_and_backward",
    "chunked_loss_and_backward",
    "types_side_by_side",
    "PolicyUpdate",
    "SeedMinibatch",
    "alias_parameters",
    "take_rows",
    "stack_windows",
    "window_plan",
]


@dataclass
class Minibatch:
    """One agent type's share of a batch: ``B`` units of ``L`` steps of its ``n`` agents.

    A unit is a single step (``L = 1``, feed-forward backbones), a training window, or a
    whole episode. ``select(idx)`` takes units along dim 0. Windows with burn-in carry ``P``
    more input steps (``obs``, ``resets``) than loss steps (the other per-step fields); the
    stored ``state`` is the one before the first input step.
    """

    #: the fields with one entry per loss step ``[B, L, ...]`` (:meth:`loss_steps` slices them)
    LOSS_FIELDS = ("action_mask", "actions", "old_logp", "advantages", "loss_mask", "ref_logp",
                   "agent_mask")  # fmt: skip

    obs: Tensor  # [B, P + L, n, D] (P burn-in prefix steps, 0 unless windows have burn-in)
    action_mask: Tensor  # [B, L, n, A] bool
    actions: Tensor  # [B, L, n] long
    old_logp: Tensor  # [B, L, n]
    advantages: Tensor  # [B, L, n]
    loss_mask: Tensor  # [B, L] bool: steps that enter the loss
    resets: Tensor | None = None  # [B, P + L] bool: an episode starts at this step (recurrent)
    state: tuple[Tensor, ...] | None = None  # backbone state before step 0, B * n rows
    #: [B] long: the burn-in steps of each unit, the last of its P prefix steps (None: P)
    burn_in: Tensor | None = None
    ref_logp: Tensor | None = None  # [B, L, n] reference policy log-probs (KL term)
    #: [B, L, n] bool: the agents still in the episode (envs whose agents may leave early,
    #: marl.adapters' ``active`` info); None: every agent of a loss step counts
    agent_mask: Tensor | None = None

    # counted from the end of obs's shape, so a leading run axis (SeedMinibatch) changes nothing
    @property
    def num_units(self) -> int:
        return int(self.obs.shape[-4])

    @property
    def n_agents(self) -> int:
        return int(self.obs.shape[-2])

    def sample_mask(self) -> Tensor:
        """``[B, L, n]`` bool: the (step, agent) samples that enter the loss."""
        mask = self.loss_mask[..., None].expand_as(self.actions)
        return mask if self.agent_mask is None else mask & self.agent_mask

    def select(self, idx: Tensor) -> Minibatch:
        """The units ``idx`` (1-D long); the state's rows are unit-major, agent-minor."""
        taken = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                taken[f.name] = None
            elif f.name == "state":
                n = self.n_agents
                rows = (idx[:, None] * n + torch.arange(n, device=idx.device)).reshape(-1)
                taken[f.name] = tuple(s.index_select(0, rows) for s in value)
            else:
                taken[f.name] = value.index_select(0, idx)
        return replace(self, **taken)

    def loss_steps(self, steps: slice) -> Minibatch:
        """The loss steps ``steps`` (a slice of ``[0, L)``) of every unit: the per-loss-step
        fields sliced along dim 1, the inputs (obs, resets, state, burn_in) kept whole."""
        taken = {
            name: None if getattr(self, name) is None else getattr(self, name)[:, steps]
            for name in self.LOSS_FIELDS
        }
        return replace(self, **taken)


@dataclass(frozen=True)
class PPOLossConfig:
    """The objective's coefficients for one update (the entropy coefficient may follow a
    schedule, so the algorithm builds them anew for every update)."""

    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    ent_coef: float = 0.0


#: ``hook(actor, minibatch, terms, mask) -> {"loss/NAME": scalar, ...}``: further terms of one
#: agent type's minibatch. ``terms`` holds the objective's terms so far, among them this
#: forward pass's masked ``logits [B, L, n, A]`` and ``logp [B, L, n]`` (with their graph)
#: and ``count``, the denominator of every term; ``mask [B, L, n]`` bool marks the samples
#: that enter the loss: valid steps of agents still in their episode. Return ``loss/...``
#: terms as sums over the masked samples divided by ``count`` (they are added to the loss);
#: any other scalar is reported as a metric.
ExtraTerm = Callable[[TypeActor, Minibatch, dict[str, Tensor], Tensor], dict[str, Tensor]]


class ClipPPOObjective:
    """The clipped-surrogate objective of one agent type's minibatch, as named terms.

    ``objective(actor, mb, coef, count=count)`` runs ``actor`` over the minibatch's units
    and returns, each a sum over the valid (step, agent) samples of ``mb`` divided by
    ``count`` (the valid samples of *all* agent types in the minibatch):

    - ``loss/policy = -sum(min(r A, clip(r) A)) / count`` (dual clip for A < 0 when set),
      ``r = exp(logp - old_logp)``, ``A`` the advantage (+ the optimism offset b, detached);
    - ``loss/entropy = -ent_coef * sum(entropy) / count``;
    - the diagnostics ``entropy``, ``approx_kl``, ``clip_frac_low``, ``clip_frac_high`` and
      ``dual_clip_frac`` (:func:`marl.core.losses.ppo_sample_stats`; the clip fractions use
      the advantage the surrogate used, offset included);
    - the terms of every hook in :attr:`extra_terms`, in order;

    and, as inputs of the hooks (:attr:`INTERMEDIATES`, neither losses nor metrics),
    ``logits``, ``logp`` and ``count``. :meth:`total` is the loss: the sum of the ``loss/``
    terms. Override :meth:`terms` to change the built-in terms.
    """

    #: terms that the hooks read, not losses or metrics
    INTERMEDIATES = ("logits", "logp", "count")

    def __init__(
        self,
        *,
        offset: OptimismOffset | None = None,
        tbptt_chunk: int | None = None,
        extra_terms: Iterable[ExtraTerm] = (),
    ) -> None:
        #: the learnable optimism offset b (A' = A + b), trained by :class:`PolicyUpdate`
        self.offset = offset
        #: truncated BPTT inside recurrent windows: the state between chunks of this many
        #: steps is detached (None: whole windows)
        self.tbptt_chunk = tbptt_chunk
        #: hooks adding terms (:data:`ExtraTerm`), applied in order
        self.extra_terms: list[ExtraTerm] = list(extra_terms)

    def __call__(
        self, actor: TypeActor, mb: Minibatch, coef: PPOLossConfig, *, count: Tensor | float
    ) -> dict[str, Tensor]:
        dist = actor.sequence(  # [B, L, n] over the loss steps, after burn-in without autograd
            mb.obs,
            mb.action_mask,
            mb.state,
            mb.resets,
            burn_in=mb.burn_in,
            tbptt_chunk=self.tbptt_chunk,
        )
        terms = self.terms(mb, dist, coef, count)
        mask = mb.sample_mask()
        for hook in self.extra_terms:
            terms.update(hook(actor, mb, terms, mask))
        return terms

    def terms(
        self, mb: Minibatch, dist: MaskedCategorical, coef: PPOLossConfig, count: Tensor | float
    ) -> dict[str, Tensor]:
        """The built-in terms (see the class docstring) of ``mb`` given the actor's action
        distribution ``[B, L, n]`` at its loss steps."""
        logp = dist.log_prob(mb.actions)  # [B, L, n]
        advantages = mb.advantages if self.offset is None else self.offset(mb.advantages)
        surrogate, dual_active = ppo_surrogate(
            logp,
            mb.old_logp,
            advantages,
            clip_low=coef.clip_low,
            clip_high=coef.clip_high,
            dual_clip=coef.dual_clip,
        )
        weight = mb.sample_mask().to(logp.dtype)  # [B, L, n]: 1 where a sample counts
        surrogate_sum = per_run_sum(surrogate * weight, count)
        entropy_sum = per_run_sum(dist.entropy() * weight, count)
        terms = {
            "loss/policy": -surrogate_sum / count,
            "loss/entropy": -coef.ent_coef * entropy_sum / count,
            "entropy": entropy_sum.detach() / count,
        }
        stats = ppo_sample_stats(
            logp.detach(),
            mb.old_logp,
            advantages,
            dual_active,
            clip_low=coef.clip_low,
            clip_high=coef.clip_high,
        )
        for key, per_sample in stats.items():
            terms[key] = per_run_sum(per_sample * weight, count) / count
        terms.update(logits=dist.logits, logp=logp, count=count)
        return terms

    def total(self, terms: dict[str, Tensor]) -> Tensor:
        """The loss to minimise: the sum of the ``loss/`` terms. Raises
        :class:`~marl.core.losses.NonFiniteError` naming a term that is NaN or inf (one run;
        for a batch of runs the terms are ``[S]`` and the seed update checks each run)."""
        losses = {key: value for key, value in terms.items() if key.startswith("loss/")}
        for key, value in losses.items():
            if value.dim() == 0 and not torch.isfinite(value):
                raise NonFiniteError(key)
        return sum(losses.values())


def per_run_sum(x: Tensor, count: Tensor | float) -> Tensor:
    """The sum of ``x`` over one run's samples: a scalar when ``count`` is one run's (a number
    or a 0-d tensor); ``[S]`` when ``count`` is ``[S]``, one per run of a seed batch (``x [S,
    ...]``, :class:`marl.algos.mappo.SeedMAPPO`)."""
    if isinstance(count, Tensor) and count.dim() == 1:
        return x.reshape(count.shape[0], -1).sum(1)
    return x.sum()


#: ``(objective, actors, batch, coef, count) -> terms per agent type``: a minibatch's loss
#: terms, computed and backpropagated (:func:`loss_and_backward` and its wrappers)
LossAndBackward = Callable[
    [ClipPPOObjective, Mapping[str, TypeActor], dict[str, Minibatch], PPOLossConfig, Tensor],
    dict[str, dict[str, Tensor]],
]


def loss_and_backward(
    objective: ClipPPOObjective,
    actors: Mapping[str, TypeActor],
    batch: dict[str, Minibatch],
    coef: PPOLossConfig,
    count: Tensor,
) -> dict[str, dict[str, Tensor]]:
    """The plain path: for every agent type, its terms from ``objective`` and the backward
    of their total (the types' actors share no parameters, so the gradients are those of the
    sum over the types). Returns the terms per agent type."""
    terms = {}
    for name, mb in batch.items():
        terms[name] = objective(actors[name], mb, coef, count=count)
        objective.total(terms[name]).sum().backward()
    return terms


def chunked_loss_and_backward(
    objective: ClipPPOObjective,
    actors: Mapping[str, TypeActor],
    batch: dict[str, Minibatch],
    coef: PPOLossConfig,
    count: Tensor,
) -> dict[str, dict[str, Tensor]]:
    """Opt-in (``tbptt_chunk``): :func:`loss_and_backward` with the backward of each
    truncated-BPTT chunk run before the next chunk's forward, so that the activations kept
    are one chunk's. Each chunk's terms are sums over its samples divided by ``count``, so
    the gradient and the terms (added up over the chunks, detached) are the whole window's;
    the hooks' inputs are not returned. Extra-term hooks see whole windows: with any, this
    is the plain path."""
    if objective.extra_terms:
        return loss_and_backward(objective, actors, batch, coef, count)
    out = {}
    for name, mb in batch.items():
        length = mb.actions.shape[-2]
        chunks = actors[name].chunks(
            mb.obs, mb.state, mb.resets, length, mb.burn_in, objective.tbptt_chunk
        )
        window: dict[str, Tensor] = {}
        for steps, logits in chunks:
            part = mb if (steps.start, steps.stop) == (0, length) else mb.loss_steps(steps)
            dist = MaskedCategorical(logits, part.action_mask)
            terms = objective.terms(part, dist, coef, count)
            objective.total(terms).sum().backward()  # frees this chunk's activations
            for key, value in terms.items():
                if key not in objective.INTERMEDIATES:
                    value = value.detach()
                    window[key] = value if key not in window else window[key] + value
        out[name] = window
    return out


def types_side_by_side(inner: LossAndBackward) -> LossAndBackward:
    """Opt-in (``parallel_update``): ``inner`` on each agent type's share of the minibatch in
    its own thread (:func:`marl.algos.parallel.side_by_side`). The types' actors share no
    parameters, so the gradients are those of ``inner`` on the whole minibatch."""

    def run(
        objective: ClipPPOObjective,
        actors: Mapping[str, TypeActor],
        batch: dict[str, Minibatch],
        coef: PPOLossConfig,
        count: Tensor,
    ) -> dict[str, dict[str, Tensor]]:
        names = list(batch)
        jobs = [
            partial(inner, objective, actors, {name: batch[name]}, coef, count) for name in names
        ]
        results = side_by_side(jobs, parallel=True)
        return {name: result[name] for name, result in zip(names, results, strict=True)}

    return run


@dataclass
class SeedMinibatch(Minibatch):
    """:class:`Minibatch` of S runs: a leading run axis on every field (``obs [S, B, P + L,
    n, D]``, ``loss_mask [S, B, L]``, ``burn_in [S, B]``, the state a tuple of ``[S, B * n,
    ...]``). :meth:`select` takes each run's own units, ``idx [S, b]``."""

    @classmethod
    def stack(cls, per_run: Sequence[Minibatch]) -> SeedMinibatch:
        """S single-run minibatches of one shape -> one with the run axis first."""

        def stacked(name: str) -> Any:
            values = [getattr(mb, name) for mb in per_run]
            if values[0] is None:
                return None
            if name == "state":
                return tuple(torch.stack(parts) for parts in zip(*values, strict=True))
            return torch.stack(values)

        return cls(**{f.name: stacked(f.name) for f in fields(Minibatch)})

    def select(self, idx: Tensor) -> SeedMinibatch:
        """Run s's units ``idx[s]`` (``idx [S, b]`` long) of every run (one ``index_select``
        of whole rows per field: the run and unit axes flattened)."""
        taken = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                taken[f.name] = None
            elif f.name == "state":
                n = self.obs.shape[-2]  # the agents: obs [S, B, P + L, n, D]
                rows = (idx[..., None] * n + torch.arange(n, device=idx.device)).flatten(1)
                taken[f.name] = tuple(take_rows(s, rows) for s in value)
            else:
                taken[f.name] = take_rows(value, idx)
        return replace(self, **taken)

    def loss_steps(self, steps: slice) -> SeedMinibatch:
        """:meth:`Minibatch.loss_steps` of every run (the step axis is dim 2)."""
        taken = {
            name: None if getattr(self, name) is None else getattr(self, name)[:, :, steps]
            for name in self.LOSS_FIELDS
        }
        return replace(self, **taken)


def take_rows(x: Tensor, idx: Tensor) -> Tensor:
    """``x [S, U, ...]`` at ``idx [S, b]`` along dim 1 -> ``[S, b, ...]`` (``x[s, idx[s]]``)."""
    S, U = x.shape[:2]
    if S == 1:  # one run (the same rows, without the offsets)
        return x[0].index_select(0, idx[0]).unsqueeze(0)
    flat = (idx + torch.arange(S, device=idx.device)[:, None] * U).reshape(-1)
    return x.reshape(S * U, *x.shape[2:]).index_select(0, flat).reshape(S, -1, *x.shape[2:])


def alias_parameters(module: nn.Module, params: Sequence[nn.Parameter]) -> None:
    """Make ``params`` (in ``module.named_parameters()`` order) the parameters of
    ``module``: afterwards the module reads and ``load_state_dict`` writes them."""
    names = [name for name, _ in module.named_parameters()]
    if len(names) != len(params):
        raise ValueError(f"{len(params)} parameters for a module with {len(names)}")
    for name, p in zip(names, params, strict=True):
        owner_name, _, attr = name.rpartition(".")
        owner = module.get_submodule(owner_name) if owner_name else module
        if getattr(owner, attr).shape != p.shape:
            raise ValueError(
                f"{name}: shape {list(p.shape)} for {list(getattr(owner, attr).shape)}"
            )
        setattr(owner, attr, p)


class PolicyUpdate:
    """The policy update of S runs at once; one run is a batch of one (see the module
    docstring).

    ``policy`` is one run's :class:`MultiAgentPolicy` or S runs' (one per seed, of one
    layout and backbone). They are stacked into :attr:`stack` (a
    :class:`~marl.models.seed_policies.SeedMultiAgentPolicy`, a leading run axis on every
    parameter), and each run's policy then *is* its slice of the stack: its parameters are
    the views :attr:`views` holds (``views.per_seed[k]``), so the rollout's single-run policy
    always sees the stack's latest step, and its ``state_dict`` is the run's checkpoint. The
    optimizer is a stock ``torch.optim.Adam`` over the views with one param group per run:
    each run's step count, moments and learning rate are its own, and for one run it is
    exactly the Adam a plain single-run trainer would build over ``policy.parameters()``.
    """

    def __init__(
        self,
        policy: MultiAgentPolicy | Sequence[MultiAgentPolicy],
        *,
        lr: float,
        epochs: int,
        num_minibatches: int,
        max_grad_norm: float | None,
        objective: ClipPPOObjective | None = None,
        offsets: Sequence[OptimismOffset] | None = None,
        parallel: bool = False,
        ctx: DistContext | None = None,
    ) -> None:
        self.policies = [policy] if isinstance(policy, MultiAgentPolicy) else list(policy)
        self.num_runs = len(self.policies)
        self.ctx = ctx
        self.objective = ClipPPOObjective() if objective is None else objective
        self.distributed = ctx is not None and ctx.enabled
        if self.num_runs > 1 and self.distributed:
            raise ValueError(f"distributed training updates one run, got {self.num_runs}")
        self.epochs, self.num_minibatches = epochs, num_minibatches
        self.max_grad_norm = max_grad_norm
        #: the runs' policies stacked: ``[S, ...]`` parameters
        self.stack = SeedMultiAgentPolicy(self.policies)
        # the runs' optimism offsets (``offsets``, or one run's objective's), stacked as
        # ``b [S]``: the objective then adds run s's to run s's advantages
        if offsets is None and self.objective.offset is not None:
            offsets = [self.objective.offset]
        offsets = list(offsets or [])
        if offsets and len(offsets) != self.num_runs:
            raise ValueError(f"{len(offsets)} optimism offsets for {self.num_runs} runs")
        #: run 0's own offset module (a single run's: its checkpoint and metric), or None
        self.offset = offsets[0] if offsets else None
        self.offset_stack = OptimismOffset.stack(offsets) if offsets else None
        self.objective.offset = self.offset_stack
        self.views = _ordered_views(self.stack, self.policies[0], self.offset_stack)
        n_policy = len(self.views.stacked) - (1 if offsets else 0)
        for k, views_k in enumerate(self.views.per_seed):
            alias_parameters(self.policies[k], views_k[:n_policy])
            if offsets:  # run k's offset is its entry of the stacked one
                alias_parameters(offsets[k], views_k[n_policy:])
        #: the optimizer's parameters: every run's policy and offset (run-major)
        self.params = self.views.parameters()
        groups = [{"params": list(views_k)} for views_k in self.views.per_seed]
        # a stock Adam; fused=True: torch's one-kernel step (the maths of its default
        # per-tensor loop, in fewer operations for these many small tensors)
        self.optimizer = torch.optim.Adam(groups, lr=lr, eps=1e-5, fused=True)
        #: opt-in: each agent type's loss and backward in its own thread
        #: (:func:`types_side_by_side`), where the types' backbones may run in two threads
        #: at once; distributed runs keep the types in turn, so that collectives match
        first = self.policies[0]
        self.parallel = (
            parallel
            and not self.distributed
            and len(first.actors) > 1
            and first.share_actor != "all"  # one actor's gradients: the types in turn
            and all(bool(getattr(a.backbone, "thread_safe", True)) for a in first.actors.values())
        )

    @classmethod
    def from_config(
        cls,
        policy: MultiAgentPolicy | Sequence[MultiAgentPolicy],
        cfg: Any,
        *,
        parallel: bool,
        ctx: DistContext | None,
        objective_class: type[ClipPPOObjective] = ClipPPOObjective,
    ) -> PolicyUpdate:
        """The update a config asks for: lr, epochs, minibatches, grad clip, and an
        ``objective_class`` objective with truncated BPTT (``cfg.tbptt_chunk``, where the
        config has it) and, when ``cfg.optimism_offset`` is set, a
        learnable offset on ``policy``'s device (available as ``.offset``)."""
        offset = None
        if cfg.optimism_offset is not None:
            first = policy if isinstance(policy, MultiAgentPolicy) else policy[0]
            device = next(first.parameters()).device
            offset = OptimismOffset(cfg.optimism_offset).to(device)
        objective = objective_class(offset=offset, tbptt_chunk=getattr(cfg, "tbptt_chunk", None))
        return cls(
            policy,
            lr=cfg.lr,
            epochs=cfg.epochs,
            num_minibatches=cfg.num_minibatches,
            max_grad_norm=cfg.max_grad_norm,
            objective=objective,
            parallel=parallel,
            ctx=ctx,
        )

    def set_lr(self, lr: float | Sequence[float]) -> None:
        """Every run's learning rate (a number), or run k's ``lr[k]``."""
        rates = [lr] * self.num_runs if isinstance(lr, (int, float)) else list(lr)
        for group, rate in zip(self.optimizer.param_groups, rates, strict=True):
            group["lr"] = float(rate)

    # -- one run ---------------------------------------------------------------------------
    def run(self, units: dict[str, Minibatch], coef: PPOLossConfig) -> dict[str, float]:
        """One run's update (a batch of one): ``epochs`` x minibatches on ``units`` (per agent
        type, the same number of units each), each epoch's permutation drawn from torch's
        global generator; returns the mean over minibatches of every metric. Raises
        :class:`~marl.core.losses.NonFiniteError` naming what turned NaN or inf."""
        num_units = next(iter(units.values())).num_units
        orders = [torch.randperm(num_units)[None] for _ in range(self.epochs)]
        stacked = {name: SeedMinibatch.stack([mb]) for name, mb in units.items()}
        metrics, stops = self.epochs_of_minibatches(stacked, [coef], orders)
        return self._one_run(metrics, stops)

    def step(self, batch: dict[str, Minibatch], coef: PPOLossConfig) -> dict[str, float]:
        """One run's optimiser step on one minibatch (a batch of one); its metrics."""
        stops: dict[int, str] = {}
        stacked = {name: SeedMinibatch.stack([mb]) for name, mb in batch.items()}
        return self._one_run(self.minibatch_step(stacked, [coef], stops), stops)

    def _one_run(self, metrics: dict[str, Tensor], stops: dict[int, str]) -> dict[str, float]:
        if self.num_runs != 1:
            raise ValueError(f"run() and step() update one run; this update holds {self.num_runs}")
        if stops:
            raise NonFiniteError(stops[0])
        # a hook may report a run's metric as a scalar (one run: the same number)
        return {key: float(value.reshape(-1)[0]) for key, value in metrics.items()}

    # -- S runs ----------------------------------------------------------------------------
    def epochs_of_minibatches(
        self,
        units: dict[str, SeedMinibatch],
        coefs: Sequence[PPOLossConfig],
        orders: Sequence[Tensor],
        training: Sequence[bool] | None = None,
    ) -> tuple[dict[str, Tensor], dict[int, str]]:
        """One pass over every run's minibatches per ``orders[e] [S, U]`` (run s's
        permutation of its units in epoch e; ``coefs[s]``: run s's coefficients; runs not
        ``training`` are left as they are); returns each metric's mean over the minibatches,
        ``[S]``, and the runs that stopped (index -> the quantity that turned non-finite)."""
        U = next(iter(units.values())).obs.shape[1]  # obs [S, U, P + L, n, D]
        size = max(1, math.ceil(U / self.num_minibatches))
        sums: dict[str, Tensor] = {}
        steps, stops = 0, {}
        for order in orders:
            for start in range(0, U, size):
                idx = order[:, start : start + size].to(self.views.stacked[0].device)
                batch = {name: mb.select(idx) for name, mb in units.items()}
                for key, value in self.minibatch_step(batch, coefs, stops, training).items():
                    sums[key] = sums[key] + value if key in sums else value
                steps += 1
        return {key: value / max(steps, 1) for key, value in sums.items()}, stops

    def minibatch_step(
        self,
        batch: dict[str, SeedMinibatch],
        coefs: Sequence[PPOLossConfig],
        stops: dict[int, str],
        training: Sequence[bool] | None = None,
    ) -> dict[str, Tensor]:
        """One optimiser step of every run on its minibatch; returns the metrics ``[S]``:
        every term but the hooks' inputs, summed over the agent types, and ``grad_norm``
        (before clipping). A run whose loss or gradient norm is NaN or inf is added to
        ``stops`` and left as it is (parameters and optimiser state)."""
        n_valid = sum(mb.sample_mask().flatten(1).sum(1) for mb in batch.values())  # [S]
        count = n_valid.clamp_min(1).float()  # each run's denominator of every term
        # one PPOLossConfig for the stack: the runs share the clip settings; the entropy
        # coefficient (each run's own schedule) is a [S] tensor when the runs' differ
        coef, ent = coefs[0], [c.ent_coef for c in coefs]
        if not all(e == ent[0] for e in ent):
            coef = replace(coef, ent_coef=torch.tensor(ent, device=count.device))
        self.views.zero_grad()
        terms = self.loss_and_backward(batch, coef, count)
        loss = sum(self.objective.total(t).detach() for t in terms.values())  # [S]
        if self.offset_stack is not None:  # each run's offset toward its advantages' mean
            S = self.num_runs
            advantages = torch.cat([mb.advantages.reshape(S, -1) for mb in batch.values()], 1)
            mask = torch.cat([mb.sample_mask().reshape(S, -1) for mb in batch.values()], 1)
            self.offset_stack.loss(advantages, mask).sum().backward()
        if self.distributed:
            # each rank's loss is a mean over its own samples: the mean weighted by the
            # sample counts is the gradient of the mean over the concatenated batch
            average_gradients(self.views.stacked, self.ctx, weight=float(n_valid[0]))
        grad_norm = self.clip_gradients()  # [S]: each run by its own norm
        finite = (torch.isfinite(loss) & torch.isfinite(grad_norm)).cpu()
        steps = []
        for k in range(self.num_runs):
            if (training is None or training[k]) and k not in stops and not finite[k]:
                stops[k] = ("loss" if not torch.isfinite(loss[k]) else "grad_norm") + " (policy)"
            steps.append((training is None or training[k]) and k not in stops)
        self.views.attach_grads(steps)
        self.optimizer.step()
        keys = sorted({k for t in terms.values() for k in t} - set(self.objective.INTERMEDIATES))
        metrics = {key: sum(t[key].detach() for t in terms.values() if key in t) for key in keys}
        metrics["grad_norm"] = grad_norm
        return metrics

    def loss_and_backward(
        self, batch: dict[str, SeedMinibatch], coef: PPOLossConfig, count: Tensor
    ) -> dict[str, dict[str, Tensor]]:
        """Every agent type's terms, after their backward: :func:`loss_and_backward`, or the
        opt-in wrappers around it that the configuration chose (``tbptt_chunk``:
        :func:`chunked_loss_and_backward`; ``parallel``: :func:`types_side_by_side`)."""
        path = loss_and_backward
        if self.objective.tbptt_chunk is not None:
            path = chunked_loss_and_backward
        if self.parallel:
            path = types_side_by_side(path)
        return path(self.objective, self.stack.actors, batch, coef, count)

    def clip_gradients(self) -> Tensor:
        """Clip each run's gradients (its policy's and offset's) by the run's own total norm,
        as ``torch.nn.utils.clip_grad_norm_`` on that run alone; the norms ``[S]`` before."""
        grads = [p.grad for p in self.views.stacked if p.grad is not None]
        return clip_grads_per_seed_(grads, self.max_grad_norm)


def _ordered_views(
    stack: SeedMultiAgentPolicy, single: MultiAgentPolicy, offset: OptimismOffset | None = None
) -> SeedViews:
    """:class:`SeedViews` over ``stack``'s parameters in the order of a single run's
    ``single.named_parameters()`` (then the stacked offset's ``b [S]``, if any), so that run
    k's views line up with its own policy's parameters (and its offset)."""
    names = stack.single_seed_names()
    by_single = {one: name for name, one in names.items()}
    params = dict(stack.named_parameters())
    ordered = [params[by_single[name]] for name, _ in single.named_parameters()]
    return SeedViews(ordered + ([] if offset is None else [offset.b]))


def stack_windows(x: Tensor, index: Tensor) -> Tensor:
    """``x [T, E, ...]`` gathered at ``index [W, Lw]`` (step numbers) -> ``[W * E, Lw, ...]``
    (window-major, env-minor)."""
    W, Lw = index.shape
    y = x[index.to(x.device)].transpose(1, 2)  # [W, E, Lw, ...]
    return y.reshape(W * x.shape[1], Lw, *x.shape[2:])


def window_plan(T: int, seq_len: int, burn_in: int) -> tuple[Tensor, Tensor, list[int]]:
    """Training windows over a rollout of T steps.

    Window w's loss covers steps ``[w*L, (w+1)*L)``; its input has ``burn_in + L`` steps:
    ``burn_in`` prefix steps, then the loss steps. Its burn-in is the ``b_w =
    min(burn_in, w*L)`` steps before ``w*L`` (shorter for the first windows, which cannot reach
    before the rollout's first step); the prefix positions before them are padding (step 0,
    never read). The collector stores the actor state before step ``w*L - b_w``.

    Returns ``(time_index [W, burn_in + L], burn_in_steps [W] long, starts [W])``.
    """
    if T % seq_len:
        raise ValueError(f"seq_len={seq_len} must divide rollout_steps={T}")
    if burn_in < 0:
        raise ValueError(f"burn_in must be >= 0, got {burn_in}")
    W, Lw = T // seq_len, burn_in + seq_len
    loss_start = torch.arange(W) * seq_len
    index = (loss_start[:, None] - burn_in + torch.arange(Lw)[None, :]).clamp_min(0)
    steps = loss_start.clamp_max(burn_in)
    starts = (loss_start - steps).tolist()
    return index, steps, starts
