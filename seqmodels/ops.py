"""The operations a Mamba / Mamba2 block is made of, written as readable torch, and the
dispatchers that run their fused numba twin (:mod:`seqmodels.kernels.numba_ops`, same
signature, equivalence-tested) on the numba backend.

=============================  ================================  =========================
readable (here)                fused twin                        dispatcher (here)
=============================  ================================  =========================
``conv_silu_reference``        ``conv_silu_numba``               ``causal_conv_silu``
``conv_step_silu_reference``   ``conv_step_silu_numba``          ``conv_step_silu``
``rmsnorm_gated_reference``    ``rmsnorm_gated_numba``           ``rmsnorm_gated``
``rmsnorm_reference``          ``rmsnorm_numba``                 ``rmsnorm``
``mamba_inner_reference``      ``mamba_inner_numba``             ``mamba_inner``
``mamba_block_reference``      ``mamba_block_numba``             (``seqmodels.Mamba``)
``mamba_step_reference``       ``mamba_step_numba``              ``mamba_step``
=============================  ================================  =========================

The scans and single-step state updates pair up the same way in :mod:`seqmodels.scan`.

Episode resets (``resets [B, L]`` bool, true where a new episode starts): the causal conv does
not read inputs from before the latest reset (its taps that cross one read zero) and the scans
restart from a zero state; both *replace* values by zeros (``masked_fill``, not a product with 0),
so not even a NaN or inf before a reset reaches the outputs from it on.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

from seqmodels.kernels import numba_ops
from seqmodels.scan import (
    resolve_backend,
    selective_scan,
    selective_state_update_gated_reference,
    use_step_kernel,
)

# --------------------------------------------------------------------------------------------
# causal depthwise convolution (+ SiLU) over a sequence and for one step
# --------------------------------------------------------------------------------------------


def _segment_ids(resets: Tensor) -> Tensor:
    """[B, L] episode index within the window: number of resets at or before t."""
    return torch.cumsum(resets.to(torch.long), dim=1)


def masked_causal_conv(
    x: Tensor, conv_state: Tensor, weight: Tensor, bias: Tensor | None, resets: Tensor | None
) -> tuple[Tensor, Tensor]:
    """Depthwise causal convolution that does not look across episode resets.

    Two branches, as mamba-ssm's ``mamba_simple.py`` keeps a fused and a composed one: without
    resets one ``F.conv1d`` over ``[history, x]``; with resets the taps one by one, each masked
    where it reaches before the latest reset (equal when ``resets`` is all false: tested).

    Args:
        x: ``[B, L, C]`` new inputs.
        conv_state: ``[B, C, W]`` the previous W raw inputs (mamba-ssm layout; the last column is
            the most recent), already zeroed before any earlier reset.
        weight: ``[C, 1, W]`` (``nn.Conv1d`` depthwise weight); tap W-1 reads the current input.
        bias: ``[C]`` or None.
        resets: ``[B, L]`` bool or None.

    Returns:
        out ``[B, L, C]`` (before the activation) and the new conv state ``[B, C, W]`` (the last W
        inputs, zeroed where they precede the last reset).
    """
    batch, length, _ = x.shape
    width = weight.shape[-1]
    if length == 0:
        return x, conv_state
    history = conv_state.transpose(1, 2).to(x.dtype)  # [B, W, C]
    padded = torch.cat([history[:, 1:], x], dim=1)  # [B, W-1+L, C]
    full = torch.cat([history, x], dim=1)[:, -width:]  # [B, W, C]: the new state
    if resets is None:
        # (bias inside the conv; one copy back to [B, L, C]-contiguous so that the activation,
        # x_proj and the scan kernels downstream read contiguous memory and copy nothing)
        out = F.conv1d(
            padded.transpose(1, 2),
            weight.to(x.dtype),
            None if bias is None else bias.to(x.dtype),
            groups=weight.shape[0],
        )
        return out.transpose(1, 2).contiguous(), full.transpose(1, 2).to(conv_state.dtype)
    w = weight[:, 0, :].to(x.dtype)  # [C, W]
    seg = _segment_ids(resets)
    out = x * w[:, width - 1]
    for k in range(width - 1):
        # tap k reads the input lag = W-1-k steps back: padded index t + k for output t; it
        # reads zero where an episode started after that input (episode index at t - lag < t's)
        lag = width - 1 - k
        seg_then = F.pad(seg, (lag, 0), value=0)[:, :length]
        tap = padded[:, k : k + length] * w[:, k]
        out = out + tap.masked_fill((seg_then != seg).unsqueeze(-1), 0)
    if bias is not None:
        out = out + bias.to(x.dtype)
    seg_full = torch.cat([seg.new_zeros(batch, width), seg], dim=1)[:, -width:]
    full = full.masked_fill((seg_full != seg[:, -1:]).unsqueeze(-1), 0)
    return out, full.transpose(1, 2).to(conv_state.dtype)


def conv_silu_reference(
    x: Tensor, conv_state: Tensor, weight: Tensor, bias: Tensor | None, resets: Tensor | None
) -> tuple[Tensor, Tensor]:
    """``silu`` of :func:`masked_causal_conv` (same arguments, shapes and state)."""
    out, new_state = masked_causal_conv(x, conv_state, weight, bias, resets)
    return F.silu(out), new_state


def causal_conv_silu(
    x: Tensor,
    conv_state: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    resets: Tensor | None,
    backend: str = "auto",
) -> tuple[Tensor, Tensor]:
    """:func:`conv_silu_reference`; on the numba backend its fused twin (one kernel per
    direction in the [B, L, C] layout, reading x in place when it is a channel slice of the
    in_proj output)."""
    if x.shape[0] * x.shape[1] > 0 and resolve_backend(backend, x.device, x.dtype) == "numba":
        return numba_ops.conv_silu_numba(x, conv_state, weight, bias, resets)
    return conv_silu_reference(x, conv_state, weight, bias, resets)


def conv_step_silu_reference(
    conv_state: Tensor, x: Tensor, weight: Tensor, bias: Tensor | None
) -> tuple[Tensor, Tensor]:
    """One causal-conv step then SiLU: conv_state ``[B, C, W]``, x ``[B, C]``, weight
    ``[C, 1, W]`` (nn.Conv1d depthwise), bias ``[C]`` or None -> (silu(out) ``[B, C]``, new
    state ``[B, C, W]``: the oldest input dropped, x appended)."""
    new_state = torch.cat([conv_state[:, :, 1:], x.unsqueeze(-1).to(conv_state.dtype)], dim=-1)
    out = torch.einsum("bcw,cw->bc", new_state.to(x.dtype), weight[:, 0, :].to(x.dtype))
    if bias is not None:
        out = out + bias.to(x.dtype)
    return F.silu(out), new_state


def conv_step_silu(
    conv_state: Tensor, x: Tensor, weight: Tensor, bias: Tensor | None, backend: str = "auto"
) -> tuple[Tensor, Tensor]:
    """:func:`conv_step_silu_reference`; its fused numba twin on the numba backend when no
    gradient is taken (rollouts)."""
    tensors = [x, conv_state, weight] + ([] if bias is None else [bias])
    if use_step_kernel(backend, tensors):
        return numba_ops.conv_step_silu_numba(conv_state, x, weight, bias)
    return conv_step_silu_reference(conv_state, x, weight, bias)


# --------------------------------------------------------------------------------------------
# gated RMSNorm (Mamba2's output norm)
# --------------------------------------------------------------------------------------------


def rmsnorm_reference(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm over the last dimension: ``x / sqrt(mean(x^2) + eps) * weight``; x ``[..., C]``,
    weight ``[C]`` (torch's ``F.rms_norm``)."""
    return F.rms_norm(x, weight.shape, weight.to(x.dtype), eps)


def rmsnorm(x: Tensor, weight: Tensor, eps: float, backend: str = "auto") -> Tensor:
    """:func:`rmsnorm_reference`; its numba twin (one kernel per direction) for ``[B, L, C]``
    inputs on the numba backend. (On CPU torch composes the norm's backward from five
    elementwise ops; the twin fuses them: its speed against torch is in BENCHMARKS.md. A
    rollout step's ``[B, C]`` input stays on torch's forward.)"""
    if x.dim() == 3 and x.numel() > 0 and resolve_backend(backend, x.device, x.dtype) == "numba":
        return numba_ops.rmsnorm_numba(x, weight, eps)
    return rmsnorm_reference(x, weight, eps)


def group_rmsnorm(x: Tensor, weight: Tensor, group_size: int, eps: float) -> Tensor:
    """RMSNorm over groups of ``group_size`` channels: x ``[..., C]``, weight ``[C]``."""
    grouped = rearrange(x, "... (g d) -> ... g d", d=group_size)
    rstd = torch.rsqrt(grouped.pow(2).mean(dim=-1, keepdim=True) + eps)
    return rearrange(grouped * rstd, "... g d -> ... (g d)") * weight.to(x.dtype)


def rmsnorm_gated_reference(
    x: Tensor, z: Tensor, weight: Tensor, group_size: int, eps: float, norm_before_gate: bool
) -> Tensor:
    """Gated RMSNorm as mamba-ssm's ``layernorm_gated.rmsnorm_fn``: x, z ``[..., C]``, weight
    ``[C]``, the RMS taken over groups of ``group_size`` channels. ``norm_before_gate``:
    ``rmsnorm(x) * weight * silu(z)``; else ``rmsnorm(x * silu(z)) * weight``."""
    if not norm_before_gate:
        x = x * F.silu(z)
    out = group_rmsnorm(x, weight, group_size, eps)
    if norm_before_gate:
        out = out * F.silu(z)
    return out


def rmsnorm_gated(
    x: Tensor,
    z: Tensor,
    weight: Tensor,
    group_size: int,
    eps: float,
    norm_before_gate: bool,
    backend: str = "auto",
) -> Tensor:
    """:func:`rmsnorm_gated_reference`; its fused numba twin for ``[B, L, C]`` inputs on the
    numba backend."""
    if x.dim() == 3 and x.numel() > 0 and resolve_backend(backend, x.device, x.dtype) == "numba":
        return numba_ops.rmsnorm_gated_numba(x, z, weight, group_size, eps, norm_before_gate)
    return rmsnorm_gated_reference(x, z, weight, group_size, eps, norm_before_gate)


# --------------------------------------------------------------------------------------------
# Mamba's gated SSM (softplus(dt_proj) -> scan -> D skip -> gate) and the whole block
# --------------------------------------------------------------------------------------------


def mamba_inner_reference(
    u: Tensor,
    dt_low: Tensor,
    dt_weight: Tensor,
    dt_bias: Tensor,
    A: Tensor,
    Bm: Tensor,
    Cm: Tensor,
    z: Tensor,
    D: Tensor,
    h0: Tensor | None = None,
    resets: Tensor | None = None,
    *,
    scan_backend: str = "reference",
) -> tuple[Tensor, Tensor]:
    """Mamba's gated SSM output::

        delta = softplus(dt_low @ dt_weight^T + dt_bias)
        y, h_last = selective_scan(u, delta, A, Bm, Cm, h0, resets)
        y = (y + D * u) * silu(z)

    u, z ``[B, L, D]``; dt_low ``[B, L, R]``; dt_weight ``[D, R]``; dt_bias, D ``[D]``;
    A ``[D, N]``; Bm, Cm ``[B, L, N]``; h0 ``[B, D, N]`` or None; resets ``[B, L]``. Returns
    (y ``[B, L, D]``, h_last ``[B, D, N]``). ``scan_backend`` picks the scan (keyword only).
    """
    delta = F.softplus(F.linear(dt_low, dt_weight) + dt_bias.to(u.dtype))
    y, h_last = selective_scan(u, delta, A, Bm, Cm, h0=h0, resets=resets, backend=scan_backend)
    return (y + u * D.to(u.dtype)) * F.silu(z), h_last


def mamba_inner(
    u: Tensor,
    dt_low: Tensor,
    dt_weight: Tensor,
    dt_bias: Tensor,
    A: Tensor,
    Bm: Tensor,
    Cm: Tensor,
    z: Tensor,
    D: Tensor,
    h0: Tensor | None = None,
    resets: Tensor | None = None,
    backend: str = "auto",
) -> tuple[Tensor, Tensor]:
    """:func:`mamba_inner_reference` with the scan of ``backend``; on the numba backend its
    fused twin (softplus, scan, D skip and gate in one kernel per direction)."""
    if u.shape[0] * u.shape[1] > 0 and resolve_backend(backend, u.device, u.dtype) == "numba":
        return numba_ops.mamba_inner_numba(
            u, dt_low, dt_weight, dt_bias, A, Bm, Cm, z, D, h0, resets
        )
    return mamba_inner_reference(
        u, dt_low, dt_weight, dt_bias, A, Bm, Cm, z, D, h0, resets, scan_backend=backend
    )


def mamba_block_reference(
    x: Tensor,
    conv_state: Tensor,
    h0: Tensor,
    resets: Tensor | None,
    in_proj: tuple[Tensor, Tensor | None],
    conv: tuple[Tensor, Tensor | None],
    x_proj_weight: Tensor,
    dt_proj: tuple[Tensor, Tensor],
    A: Tensor,
    D: Tensor,
    out_proj: tuple[Tensor, Tensor | None],
) -> tuple[Tensor, Tensor, Tensor]:
    """A Mamba block's forward from its weights (mamba_simple.py's composed branch): in_proj,
    causal conv + SiLU, x_proj, the gated SSM, out_proj.

    x ``[B, L, d_model]``; conv_state ``[B, d_inner, d_conv]``; h0 ``[B, d_inner, d_state]``;
    resets ``[B, L]`` or None; in_proj, conv (``[d_inner, 1, d_conv]`` weight), dt_proj and
    out_proj as (weight, bias); x_proj_weight ``[dt_rank + 2 d_state, d_inner]``;
    A ``[d_inner, d_state]`` (= -exp(A_log)); D ``[d_inner]``. Returns y ``[B, L, d_model]``,
    the new conv state ``[B, d_inner, d_conv]`` and the last SSM state.
    """
    dt_rank, d_state = dt_proj[0].shape[1], A.shape[1]
    xs, z = F.linear(x, *in_proj).chunk(2, dim=-1)
    xs, new_conv = conv_silu_reference(xs, conv_state, *conv, resets)
    dt_low, Bm, Cm = F.linear(xs, x_proj_weight).split([dt_rank, d_state, d_state], dim=-1)
    y, h_last = mamba_inner_reference(xs, dt_low, *dt_proj, A, Bm, Cm, z, D, h0, resets)
    return F.linear(y, *out_proj), new_conv, h_last


def mamba_step_reference(
    xz: Tensor,
    conv_state: Tensor,
    ssm_state: Tensor,
    reset: Tensor | None,
    conv: tuple[Tensor, Tensor | None],
    x_proj_weight: Tensor,
    dt_proj: tuple[Tensor, Tensor],
    A: Tensor,
    D: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    """One Mamba step after in_proj (``seqmodels.Mamba.step``'s core, before out_proj):
    the rows that reset start from zero states, then one causal-conv step + SiLU, x_proj,
    softplus(dt_proj), the state update, the D skip and the SiLU gate.

    xz ``[B, 2 d_inner]`` (in_proj output: x | z); conv_state ``[B, d_inner, d_conv]``;
    ssm_state ``[B, d_inner, d_state]``; reset ``[B]`` bool or None; conv
    (``[d_inner, 1, d_conv]`` weight, bias) and dt_proj as (weight, bias);
    x_proj_weight ``[dt_rank + 2 d_state, d_inner]``; A ``[d_inner, d_state]`` (= -exp(A_log));
    D ``[d_inner]``. Returns (y ``[B, d_inner]``, new conv state, new SSM state).
    """
    if reset is not None:
        conv_state = conv_state.masked_fill(reset[:, None, None], 0)
        ssm_state = ssm_state.masked_fill(reset[:, None, None], 0)
    dt_rank, d_state = dt_proj[0].shape[1], A.shape[1]
    xs, z = xz.chunk(2, dim=-1)
    xs, new_conv = conv_step_silu_reference(conv_state, xs, *conv)
    dt_low, Bm, Cm = F.linear(xs, x_proj_weight).split([dt_rank, d_state, d_state], dim=-1)
    h, y = selective_state_update_gated_reference(
        ssm_state.to(xz.dtype), F.linear(dt_low, dt_proj[0]), xs, z, A, D, Bm, Cm,
        dt_bias=dt_proj[1], dt_softplus=True,
    )  # fmt: skip
    return y, new_conv, h.to(ssm_state.dtype)


def mamba_step(
    xz: Tensor,
    conv_state: Tensor,
    ssm_state: Tensor,
    reset: Tensor | None,
    conv: tuple[Tensor, Tensor | None],
    x_proj_weight: Tensor,
    dt_proj: tuple[Tensor, Tensor],
    A: Tensor,
    D: Tensor,
    backend: str = "auto",
) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`mamba_step_reference`; its fused numba twin (one kernel, no state copies) on the
    numba backend when no gradient is taken (rollouts)."""
    tensors = [xz, conv_state, ssm_state, conv[0], x_proj_weight, *dt_proj, A, D]
    if use_step_kernel(backend, tensors):
        return numba_ops.mamba_step_numba(
            xz, conv_state, ssm_state, reset, conv, x_proj_weight, dt_proj, A, D
        )
    return mamba_step_reference(
        xz, conv_state, ssm_state, reset, conv, x_proj_weight, dt_proj, A, D
    )


__all__ = [
    "causal_conv_silu",
    "conv_silu_reference",
    "conv_step_silu",
    "conv_step_silu_reference",
    "group_rmsnorm",
    "mamba_block_reference",
    "mamba_inner",
    "mamba_inner_reference",
    "mamba_step",
    "mamba_step_reference",
    "masked_causal_conv",
    "rmsnorm",
    "rmsnorm_gated",
    "rmsnorm_gated_reference",
    "rmsnorm_reference",
]
