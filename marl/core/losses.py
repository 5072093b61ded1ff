"""PPO-family losses: clipped policy loss (asymmetric, dual-clip), value losses, ValueNorm,
the learnable optimism offset, and linear schedules.

Every function takes an optional ``mask`` (True = a valid sample) and averages over valid
samples only. Shapes are arbitrary but equal (``[...]``) unless stated otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from marl.core.advantages import kl_k3

__all__ = [
    "NonFiniteError",
    "masked_mean",
    "ppo_policy_loss",
    "ppo_surrogate",
    "ppo_sample_stats",
    "ppo_stats",
    "value_loss",
    "explained_variance",
    "ValueNorm",
    "OptimismOffset",
    "linear_schedule",
]


class NonFiniteError(FloatingPointError):
    """A NaN or inf appeared in a training quantity; the message names the quantity."""

    def __init__(self, quantity: str) -> None:
        self.quantity = quantity
        super().__init__(f"non-finite value (NaN or inf) in {quantity}; training stopped")


def masked_mean(x: Tensor, mask: Tensor | None = None, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over entries where ``mask`` (broadcastable) is true; 0 when none is.
    With ``dim``, the means along that dimension (one per remaining index)."""
    if mask is None:
        return x.mean() if dim is None else x.mean(dim)
    m = mask.to(x.dtype).expand_as(x)
    if dim is None:
        return (x * m).sum() / m.sum().clamp_min(1.0)
    return (x * m).sum(dim) / m.sum(dim).clamp_min(1.0)


def ppo_surrogate(
    logp: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Per-sample clipped surrogate ``s`` (to maximise) and the dual-clip indicator.

    ``ratio = exp(logp - logp_old)`` is clipped to ``[1 - clip_low, 1 + clip_high]``;
    ``s = min(ratio * A, clip(ratio) * A)``; with ``dual_clip = c`` (> 1) the surrogate of
    samples with ``A < 0`` is bounded below: ``s = max(s, c * A)`` (Ye et al. 2020).
    Returns ``(s [...], dual_active [...] bool or None)``, ``dual_active`` marking the samples
    where the dual bound is active.
    """
    if not 0.0 < clip_low < 1.0:
        raise ValueError(f"clip_low must be in (0, 1), got {clip_low}")
    if clip_high <= 0.0:
        raise ValueError(f"clip_high must be > 0, got {clip_high}")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (or None), got {dual_clip}")
    if not (logp.shape == logp_old.shape == advantages.shape):
        raise ValueError(
            f"shapes differ: logp {tuple(logp.shape)}, logp_old {tuple(logp_old.shape)}, "
            f"advantages {tuple(advantages.shape)}"
        )
    ratio = (logp - logp_old).exp()
    surr1 = ratio * advantages
    surr2 = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * advantages
    surr = torch.min(surr1, surr2)
    if dual_clip is None:
        return surr, None
    neg = advantages < 0
    bound = dual_clip * advantages
    active = neg & (surr < bound)
    return torch.where(neg, torch.max(surr, bound), surr), active.detach()


@torch.no_grad()
def ppo_sample_stats(
    logp: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    dual_active: Tensor | None,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
) -> dict[str, Tensor]:
    """Per-sample diagnostics of a clipped update (detached, the shape of ``logp``), whose
    means are :func:`ppo_stats`: 1.0 where a bound *binds* (the clipped term is the one taken,
    so its gradient is zero), else 0.0: ``clip_frac_low`` (ratio < 1 - clip_low with A < 0),
    ``clip_frac_high`` (ratio > 1 + clip_high with A > 0), ``dual_clip_frac`` (the dual bound
    is active; 0 without dual clip); and ``approx_kl``, the k3 estimate of KL(old || new):
    ``ratio - 1 - log ratio``."""
    ratio = (logp - logp_old).exp()
    return {
        "clip_frac_low": ((ratio < 1.0 - clip_low) & (advantages < 0)).float(),
        "clip_frac_high": ((ratio > 1.0 + clip_high) & (advantages > 0)).float(),
        "dual_clip_frac": torch.zeros_like(ratio) if dual_active is None else dual_active.float(),
        "approx_kl": kl_k3(logp_old, logp),
    }


@torch.no_grad()
def ppo_stats(
    logp: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    dual_active: Tensor | None,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    mask: Tensor | None = None,
    dim: int | None = None,
) -> dict[str, Tensor]:
    """Diagnostics of a clipped update (detached scalars): the masked means of
    :func:`ppo_sample_stats` (``clip_frac_low``, ``clip_frac_high``: the fraction of samples
    where that bound binds; ``dual_clip_frac``; ``approx_kl``). With ``dim``, each is the
    per-index mean along ``dim``."""
    samples = ppo_sample_stats(
        logp, logp_old, advantages, dual_active, clip_low=clip_low, clip_high=clip_high
    )
    return {key: masked_mean(value, mask, dim) for key, value in samples.items()}


def ppo_policy_loss(
    logp: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    mask: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped surrogate loss ``-mean(s)`` (to minimise; ``s`` from :func:`ppo_surrogate`)
    and the diagnostics of :func:`ppo_stats`."""
    surr, dual_active = ppo_surrogate(
        logp, logp_old, advantages, clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip
    )
    loss = -masked_mean(surr, mask)
    stats = ppo_stats(
        logp.detach(),
        logp_old.detach(),
        advantages.detach(),
        dual_active,
        clip_low=clip_low,
        clip_high=clip_high,
        mask=mask,
    )
    return loss, stats


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    *,
    value_clip: float | None = None,
    mask: Tensor | None = None,
    runs: int | None = None,
) -> Tensor:
    """Squared-error value loss ``0.5 * (v - R)^2``; with ``value_clip = eps`` the PPO clipped
    form ``0.5 * max((v - R)^2, (v_old + clip(v - v_old, -eps, eps) - R)^2)``. ``runs = S``:
    the inputs have a leading axis of S runs (a seed batch) and the loss is ``[S]``, each
    run's masked mean."""
    if not (values.shape == old_values.shape == returns.shape):
        raise ValueError(
            f"shapes differ: values {tuple(values.shape)}, old_values {tuple(old_values.shape)}, "
            f"returns {tuple(returns.shape)}"
        )
    err = (values - returns) ** 2
    if value_clip is not None:
        if value_clip <= 0:
            raise ValueError(f"value_clip must be > 0 (or None), got {value_clip}")
        clipped = old_values + (values - old_values).clamp(-value_clip, value_clip)
        err = torch.max(err, (clipped - returns) ** 2)
    if runs is None:
        return 0.5 * masked_mean(err, mask)
    err = err.reshape(runs, -1)
    if mask is None:
        return 0.5 * err.mean(1)
    m = mask.to(err.dtype).expand(*values.shape).reshape(runs, -1)
    return 0.5 * (err * m).sum(1) / m.sum(1).clamp_min(1.0)


def explained_variance(pred: Tensor, target: Tensor) -> float:
    """``1 - Var(target - pred) / Var(target)`` (nan when the target is constant)."""
    var = target.double().var(unbiased=False)
    if var.item() == 0.0:
        return float("nan")
    return float(1.0 - (target.double() - pred.double()).var(unbiased=False) / var)


class ValueNorm(nn.Module):
    """Debiased EMA normaliser of value targets, as MAPPO's ``ValueNorm``.

    Keeps ``running_mean``, ``running_mean_sq`` (per feature of ``shape``) and a debiasing
    term, all float64; ``mean = running_mean / debias``, ``var = running_mean_sq / debias -
    mean^2`` (clamped at 1e-2 like MAPPO). ``update(x[..., *shape])`` uses the batch mean of
    ``x`` and ``x^2`` over the leading dimensions; with ``distributed=True`` those batch
    moments are the exact means over all ranks (sums and counts all-reduced).
    """

    def __init__(
        self,
        shape: int | tuple[int, ...] = 1,
        beta: float = 0.99999,
        epsilon: float = 1e-5,
        *,
        distributed: bool = False,
    ) -> None:
        super().__init__()
        if not 0.0 < beta < 1.0:
            raise ValueError(f"beta must be in (0, 1), got {beta}")
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        self.shape, self.beta, self.epsilon, self.distributed = shape, beta, epsilon, distributed
        self.register_buffer("running_mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("running_mean_sq", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("debiasing_term", torch.zeros((), dtype=torch.float64))

    def mean_var(self) -> tuple[Tensor, Tensor]:
        debias = self.debiasing_term.clamp(min=self.epsilon)
        mean = self.running_mean / debias
        mean_sq = self.running_mean_sq / debias
        return mean, (mean_sq - mean**2).clamp(min=1e-2)

    @torch.no_grad()
    def update(self, x: Tensor) -> None:
        x = x.detach().double().reshape(-1, *self.shape)
        total = torch.cat([x.sum(0).reshape(-1), (x**2).sum(0).reshape(-1)])
        count = torch.tensor([float(x.shape[0])], dtype=torch.float64, device=x.device)
        if self.distributed:
            import torch.distributed as dist

            dist.all_reduce(total)
            dist.all_reduce(count)
        n = int(torch.tensor(self.shape).prod().item()) if self.shape else 1
        batch_mean = (total[:n] / count).reshape(self.shape)
        batch_sq = (total[n:] / count).reshape(self.shape)
        b = self.beta
        self.running_mean.mul_(b).add_(batch_mean * (1 - b))
        self.running_mean_sq.mul_(b).add_(batch_sq * (1 - b))
        self.debiasing_term.mul_(b).add_(1 - b)

    def normalize(self, x: Tensor) -> Tensor:
        mean, var = self.mean_var()
        return ((x.double() - mean) / var.sqrt()).to(x.dtype)

    def denormalize(self, x: Tensor) -> Tensor:
        mean, var = self.mean_var()
        return (x.double() * var.sqrt() + mean).to(x.dtype)


class OptimismOffset(nn.Module):
    """Learnable optimism offset ``b`` (seed 000, docs/seeds.md): ``A' = A + b``.

    ``forward(A)`` returns ``A + b`` with ``b`` detached (the policy gradient does not move
    ``b``); ``loss(A)`` is ``mean(A.detach() + b)^2``, whose minimiser is ``b = -mean(A)``: the
    offset anneals from its initial value to the data's zero point.

    ``init`` a number: one run's offset (``b`` a scalar). A 1-D tensor ``[S]``: the offsets
    of S runs stacked (:meth:`stack`); the advantages then carry a leading run axis ``[S,
    ...]``, run s's get ``b[s]``, and ``loss`` is ``[S]``, each run's own.
    """

    def __init__(self, init: float | Tensor = 0.5) -> None:
        super().__init__()
        b = init.detach().clone().float() if isinstance(init, Tensor) else torch.tensor(float(init))
        if b.dim() > 1:
            raise ValueError(f"init must be a number or a 1-D tensor of runs, got {list(b.shape)}")
        self.b = nn.Parameter(b)

    @classmethod
    def stack(cls, offsets: Sequence[OptimismOffset]) -> OptimismOffset:
        """S one-run offsets -> one with ``b [S]`` (values copied)."""
        return cls(torch.stack([o.b.detach() for o in offsets])).to(offsets[0].b.device)

    def _per_run(self, b: Tensor, like: Tensor) -> Tensor:
        return b if b.dim() == 0 else b.view(-1, *([1] * (like.dim() - 1)))

    def forward(self, advantages: Tensor) -> Tensor:
        return advantages + self._per_run(self.b.detach(), advantages)

    def loss(self, advantages: Tensor, mask: Tensor | None = None) -> Tensor:
        if self.b.dim() == 0:
            return masked_mean(advantages.detach() + self.b, mask) ** 2
        S = self.b.shape[0]
        shifted = (advantages.detach() + self._per_run(self.b, advantages)).reshape(S, -1)
        if mask is None:
            return shifted.mean(1) ** 2
        m = mask.reshape(S, -1).to(shifted.dtype)
        return ((shifted * m).sum(1) / m.sum(1).clamp_min(1.0)) ** 2


def linear_schedule(start: float, end: float | None, progress: float) -> float:
    """``start`` annealed linearly to ``end`` as ``progress`` goes 0 -> 1 (constant if None)."""
    if end is None:
        return float(start)
    p = min(max(float(progress), 0.0), 1.0)
    return float(start + (end - start) * p)
