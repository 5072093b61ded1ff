"""The clipped-surrogate policy update shared by MAPPO and GRPO.

An algorithm turns its batch into :class:`Minibatch` units per agent type (single steps,
training windows, or whole episodes) with their advantages, then calls
:meth:`PolicyUpdate.run`: ``epochs`` passes over shuffled minibatches, each one

    losses = ppo_loss(actor, minibatch) for every agent type     (named terms, as TorchRL's)
    optimizer.zero_grad(); sum(losses).backward()
    average_gradients (distributed, weighted by this rank's sample count)
    clip_grad_norm_(params, max_grad_norm); optimizer.step()

Every loss term is a sum over the valid (step, agent) samples of all agent types in the
minibatch divided by their count, so the types' terms add up to the joint mean. With
``parallel`` each agent type's forward and backward runs in its own thread (the types have
disjoint parameters, so the summed gradient is the same); that is the only concurrency here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields, replace
from typing import Any

import torch
from torch import Tensor, nn

from marl.algos.parallel import side_by_side
from marl.core.advantages import kl_k3
from marl.core.kernels.optim import clip_and_adam_step
from marl.core.losses import NonFiniteError, OptimismOffset, ppo_stats, ppo_surrogate
from marl.policies import MaskedCategorical, MultiAgentPolicy, TypeActor
from marl.run.distributed import DistContext, average_gradients

__all__ = [
    "Minibatch",
    "PPOLossConfig",
    "ppo_loss",
    "ppo_loss_chunks",
    "merge_chunk_terms",
    "PolicyUpdate",
    "ExtraTerms",
    "clip_and_step",
    "minibatch_indices",
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

    @property
    def num_units(self) -> int:
        return int(self.obs.shape[0])

    @property
    def n_agents(self) -> int:
        return int(self.obs.shape[2])

    def sample_mask(self) -> Tensor:
        """``[B, L, n]`` bool: the (step, agent) samples that enter the loss."""
        mask = self.loss_mask[..., None].expand(*self.loss_mask.shape, self.n_agents)
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
    """The objective's coefficients (one minibatch)."""

    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    ent_coef: float = 0.0
    kl_coef: float = 0.0


def ppo_loss(
    actor: TypeActor,
    mb: Minibatch,
    coef: PPOLossConfig,
    *,
    count: Tensor | float,
    offset: OptimismOffset | None = None,
    tbptt_chunk: int | None = None,
) -> dict[str, Tensor]:
    """The named loss terms of one agent type's minibatch (to minimise, summed by the caller).

    ``count``: the number of valid (step, agent) samples of *all* agent types in the
    minibatch, the denominator of every term, so the types' terms add up to the joint mean:

    - ``loss/policy = -sum(min(r A, clip(r) A)) / count`` (dual clip for A < 0 when set),
      ``r = exp(logp - old_logp)``, ``A`` the advantage (+ the optimism offset b, detached);
    - ``loss/entropy = -ent_coef * sum(entropy) / count``;
    - ``loss/kl = kl_coef * sum(k3(logp, ref_logp)) / count`` (when ``mb.ref_logp``).

    Also returns ``logits`` (the masked logits ``[B, L, n, A]``, with their graph, for extra
    terms) and detached pieces for the diagnostics: ``logp``, ``dual_active``,
    ``entropy_sum``, ``surrogate_sum`` and ``mask`` ``[B, L, n]``. ``tbptt_chunk``: truncated
    BPTT inside recurrent windows (:meth:`marl.policies.TypeActor.chunks`); the terms are
    those of :func:`ppo_loss_chunks` added up.
    """
    parts = list(
        ppo_loss_chunks(actor, mb, coef, count=count, offset=offset, tbptt_chunk=tbptt_chunk)
    )
    return parts[0] if len(parts) == 1 else merge_chunk_terms(parts)


def ppo_loss_chunks(
    actor: TypeActor,
    mb: Minibatch,
    coef: PPOLossConfig,
    *,
    count: Tensor | float,
    offset: OptimismOffset | None = None,
    tbptt_chunk: int | None = None,
) -> Iterator[dict[str, Tensor]]:
    """:func:`ppo_loss`'s terms chunk by chunk of the loss window (one chunk without
    ``tbptt_chunk``): each chunk's terms are sums over its samples divided by ``count``, so
    the chunks' terms add up to the window's, and a caller may run each chunk's backward
    before the next chunk is computed (the activations of one chunk at a time)."""
    length = mb.actions.shape[1]
    for steps, logits in actor.chunks(mb.obs, mb.state, mb.resets, length, mb.burn_in, tbptt_chunk):
        part = mb if (steps.start, steps.stop) == (0, length) else mb.loss_steps(steps)
        yield _loss_terms(MaskedCategorical(logits, part.action_mask), part, coef, count, offset)


def _loss_terms(
    dist: MaskedCategorical,
    mb: Minibatch,
    coef: PPOLossConfig,
    count: Tensor | float,
    offset: OptimismOffset | None,
) -> dict[str, Tensor]:
    logp = dist.log_prob(mb.actions)  # [B, L, n]
    advantages = mb.advantages if offset is None else offset(mb.advantages)
    surrogate, dual_active = ppo_surrogate(
        logp,
        mb.old_logp,
        advantages,
        clip_low=coef.clip_low,
        clip_high=coef.clip_high,
        dual_clip=coef.dual_clip,
    )
    mask = mb.sample_mask().to(logp.dtype)
    surrogate_sum = (surrogate * mask).sum()
    entropy_sum = (dist.entropy() * mask).sum()
    losses = {
        "loss/policy": -surrogate_sum / count,
        "loss/entropy": -coef.ent_coef * entropy_sum / count,
    }
    if mb.ref_logp is not None and coef.kl_coef > 0:
        losses["loss/kl"] = coef.kl_coef * (kl_k3(logp, mb.ref_logp) * mask).sum() / count
    losses["logits"] = dist.logits  # [B, L, n, A] masked logits, for extra terms
    losses["logp"] = logp.detach()
    losses["dual_active"] = dual_active
    losses["mask"] = mask
    losses["surrogate_sum"] = surrogate_sum.detach()
    losses["entropy_sum"] = entropy_sum.detach()
    return losses


#: chunk terms concatenated along the loss steps (dim 1); every other term is added up
_PER_STEP_TERMS = ("logits", "logp", "dual_active", "mask")


def merge_chunk_terms(parts: list[dict[str, Tensor]]) -> dict[str, Tensor]:
    """The terms of a whole window from its chunks' (:func:`ppo_loss_chunks`): per-step
    pieces concatenated along the steps, sums and losses added."""
    out: dict[str, Tensor] = {}
    for key in parts[0]:
        values = [p[key] for p in parts]
        if key in _PER_STEP_TERMS:
            out[key] = None if values[0] is None else torch.cat(values, dim=1)
        else:
            out[key] = sum(values[1:], values[0])
    return out


def clip_and_step(
    optimizer: torch.optim.Optimizer,
    params: list[nn.Parameter],
    max_norm: float | None,
    fast: bool = True,
) -> float:
    """Clip the gradients' total norm to ``max_norm`` (None: no clip) and take the optimiser
    step; returns the norm before clipping. ``fast``: the same two operations through
    :func:`marl.core.kernels.optim.clip_and_adam_step` (bit-identical, tested; about a tenth
    of an iteration faster on CPU, BENCHMARKS.md)."""
    if fast:
        return clip_and_adam_step(optimizer, params, max_norm)
    norm = nn.utils.clip_grad_norm_(params, math.inf if max_norm is None else max_norm)
    optimizer.step()
    return float(norm)


def minibatch_indices(num_units: int, num_minibatches: int) -> list[Tensor]:
    """A random permutation of the units cut into ``num_minibatches`` (the last may be
    smaller), drawn from torch's global generator."""
    size = max(1, math.ceil(num_units / num_minibatches))
    perm = torch.randperm(num_units)
    return [perm[start : start + size] for start in range(0, num_units, size)]


#: ``extra_terms(actor, minibatch, terms, count) -> {"loss/NAME": scalar}``: further loss
#: terms of one agent type's minibatch (sums divided by ``count``, as the built-in ones), added
#: to the loss and reported as metrics (docs/extending.md)
ExtraTerms = Callable[[TypeActor, Minibatch, dict[str, Tensor], Tensor], dict[str, Tensor]]


class PolicyUpdate:
    """Adam on a :class:`MultiAgentPolicy` (plus extra parameters such as the optimism offset)
    and the epochs of clipped policy updates (see the module docstring)."""

    def __init__(
        self,
        policy: MultiAgentPolicy,
        *,
        lr: float,
        epochs: int,
        num_minibatches: int,
        max_grad_norm: float | None,
        parallel: bool = False,
        offset: OptimismOffset | None = None,
        ctx: DistContext | None = None,
        extra_terms: ExtraTerms | None = None,
        tbptt_chunk: int | None = None,
    ) -> None:
        self.policy, self.offset, self.ctx = policy, offset, ctx
        self.extra_terms = extra_terms
        #: truncated BPTT chunk inside recurrent windows (None: whole windows); each chunk's
        #: backward runs before the next chunk's forward unless extra terms need the window
        self.tbptt_chunk = tbptt_chunk
        #: the optimiser step through marl.core.kernels.optim (same arithmetic, fewer ops)
        self.fast_step = True
        self.epochs, self.num_minibatches = epochs, num_minibatches
        self.max_grad_norm = max_grad_norm
        self.params = list(policy.parameters()) + (
            list(offset.parameters()) if offset is not None else []
        )
        # fused: torch's one-kernel Adam (the same update, faster than the per-tensor loop
        # torch uses by default on CPU for these small networks)
        self.optimizer = torch.optim.Adam(self.params, lr=lr, eps=1e-5, fused=True)
        self.distributed = ctx is not None and ctx.enabled
        # agent types side by side only where their backbones may run in two threads at once,
        # and not where both types would add several gradients each to the shared optimism
        # offset (truncated BPTT: one backward per chunk), whose sum order would then vary
        self.parallel = (
            parallel
            and not self.distributed
            and len(policy.actors) > 1
            and all(bool(getattr(a.backbone, "thread_safe", True)) for a in policy.actors.values())
            and (offset is None or tbptt_chunk is None)
        )

    @classmethod
    def from_config(
        cls,
        policy: MultiAgentPolicy,
        cfg: Any,
        *,
        parallel: bool,
        ctx: DistContext | None,
    ) -> PolicyUpdate:
        """The update a config asks for (lr, epochs, minibatches, grad clip and, when
        ``cfg.optimism_offset`` is set, a learnable offset on ``policy``'s device, available
        as ``.offset``)."""
        offset = None
        if cfg.optimism_offset is not None:
            device = next(policy.parameters()).device
            offset = OptimismOffset(cfg.optimism_offset).to(device)
        return cls(
            policy,
            lr=cfg.lr,
            epochs=cfg.epochs,
            num_minibatches=cfg.num_minibatches,
            max_grad_norm=cfg.max_grad_norm,
            parallel=parallel,
            offset=offset,
            ctx=ctx,
            tbptt_chunk=getattr(cfg, "tbptt_chunk", None),
        )

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def run(self, units: dict[str, Minibatch], coef: PPOLossConfig) -> dict[str, float]:
        """``epochs`` x minibatches of clipped updates on ``units`` (per agent type, the same
        number of units each); returns the mean over minibatches of every metric."""
        num_units = next(iter(units.values())).num_units
        sums: dict[str, float] = {}
        steps = 0
        for _epoch in range(self.epochs):
            for idx in minibatch_indices(num_units, self.num_minibatches):
                batch = {name: mb.select(idx) for name, mb in units.items()}
                metrics = self.step(batch, coef)
                for key, value in metrics.items():
                    sums[key] = sums.get(key, 0.0) + value
                steps += 1
        return {key: value / max(steps, 1) for key, value in sums.items()}

    def step(self, batch: dict[str, Minibatch], coef: PPOLossConfig) -> dict[str, float]:
        """One optimiser step on one minibatch; returns its metrics."""
        n_valid = sum(mb.sample_mask().sum() for mb in batch.values())
        count = n_valid.clamp_min(1).float()
        self.optimizer.zero_grad(set_to_none=True)
        parts = self._losses_and_backward(batch, coef, count)
        if self.offset is not None:
            advantages = torch.cat([batch[k].advantages.reshape(-1) for k in batch])
            mask = torch.cat([parts[k]["mask"].reshape(-1) for k in batch])
            self.offset.loss(advantages, mask).backward()
        if self.distributed:
            # each rank's loss is a mean over its own samples: the mean weighted by the
            # sample counts is the gradient of the mean over the concatenated batch
            average_gradients(self.params, self.ctx, weight=float(n_valid))
        grad_norm = clip_and_step(self.optimizer, self.params, self.max_grad_norm, self.fast_step)
        if not math.isfinite(grad_norm):
            raise NonFiniteError("grad_norm (policy)")
        return self._metrics(batch, parts, coef, count, grad_norm)

    def _losses_and_backward(
        self, batch: dict[str, Minibatch], coef: PPOLossConfig, count: Tensor
    ) -> dict[str, dict[str, Tensor]]:
        """Every agent type's loss terms and their backward (in threads with ``parallel``)."""

        def backward(terms: dict[str, Tensor]) -> None:
            losses = {k: v for k, v in terms.items() if k.startswith("loss/")}
            for key, value in losses.items():
                if not torch.isfinite(value):
                    raise NonFiniteError(key)
            sum(losses.values()).backward()

        def one_type(name: str) -> dict[str, Tensor]:
            actor, mb = self.policy.actors[name], batch[name]
            kw = {"count": count, "offset": self.offset, "tbptt_chunk": self.tbptt_chunk}
            if self.extra_terms is not None:  # extra terms see the whole window at once
                terms = ppo_loss(actor, mb, coef, **kw)
                terms.update(self.extra_terms(actor, mb, terms, count))
                backward(terms)
                return terms
            parts = []
            for terms in ppo_loss_chunks(actor, mb, coef, **kw):
                backward(terms)  # this chunk's activations are freed before the next chunk
                terms["logits"] = terms["logits"].detach()
                parts.append({k: v.detach() if k.startswith("loss/") else v
                              for k, v in terms.items()})  # fmt: skip
            return parts[0] if len(parts) == 1 else merge_chunk_terms(parts)

        names = list(batch)
        jobs = [lambda name=name: one_type(name) for name in names]
        return dict(zip(names, side_by_side(jobs, parallel=self.parallel), strict=True))

    def _metrics(
        self,
        batch: dict[str, Minibatch],
        parts: dict[str, dict[str, Tensor]],
        coef: PPOLossConfig,
        count: Tensor,
        grad_norm: float,
    ) -> dict[str, float]:
        cat = torch.cat
        names = list(batch)
        # the advantages the surrogate used (with the optimism offset), for where clips bind
        advantages = cat([batch[k].advantages.reshape(-1) for k in names])
        if self.offset is not None:
            advantages = self.offset(advantages)
        stats = ppo_stats(
            cat([parts[k]["logp"].reshape(-1) for k in names]),
            cat([batch[k].old_logp.reshape(-1) for k in names]),
            advantages,
            None
            if coef.dual_clip is None
            else cat([parts[k]["dual_active"].reshape(-1) for k in names]),
            clip_low=coef.clip_low,
            clip_high=coef.clip_high,
            mask=cat([parts[k]["mask"].reshape(-1) for k in names]).bool(),
        )
        out = {key: float(value) for key, value in stats.items()}
        for key in sorted({k for k in names for k in parts[k] if k.startswith("loss/")}):
            out[key] = float(sum(parts[k][key].detach() for k in names if key in parts[k]))
        out["entropy"] = float(sum(parts[k]["entropy_sum"] for k in names) / count)
        out["grad_norm"] = grad_norm
        return out


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
