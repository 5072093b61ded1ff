"""Selective-scan backends for Mamba (per-channel A) and Mamba2 (scalar A per head, SSD).

Two scan problems are solved here, both with episode resets and an initial state.

Mamba (``selective_scan``), for every batch row b, channel d and state index n::

    h_t[d, n] = keep_t * exp(delta_t[d] * A[d, n]) * h_{t-1}[d, n] + delta_t[d] * B_t[n] * u_t[d]
    y_t[d]    = sum_n C_t[n] * h_t[d, n]

Mamba2 (``ssd_scan``), for head h (group g = h // (nheads / ngroups)), head channel p::

    h_t[h, p, n] = keep_t * exp(dt_t[h] * A[h]) * h_{t-1}[h, p, n] + dt_t[h] * B_t[g, n] * x_t[h, p]
    y_t[h, p]    = sum_n C_t[g, n] * h_t[h, p, n]

where ``keep_t = 0`` where ``resets[:, t]`` is true (a new episode starts at t: the state coming
from t-1 is dropped) and 1 elsewhere; ``h_{-1}`` is the initial state (zeros when None). On the
torch backends the skip term ``D * u``, the gate ``silu(z)`` and the softplus of delta are
applied by the modules, outside the scan; the numba backend fuses them into its kernels (below).

Backends (``backend=`` argument):

- ``"reference"``: a plain sequential loop over time in torch, obviously correct, the ground
  truth for tests (slow).
- ``"chunked"``: pure torch; time is cut in chunks, each scanned with a log-depth
  (Hillis-Steele) scan on ``[B, chunk, d_inner, d_state]`` and recomputed in backward
  (activation checkpointing), so no ``[B, L, d_inner, d_state]`` tensor for the whole sequence
  exists. Works on any device and dtype; the fallback.
- ``"numba"``: compiled CPU kernels (forward and backward, wrapped in a
  ``torch.autograd.Function``), parallel over the batch. The forward keeps only per-chunk
  checkpoint states; the backward recomputes the states of one chunk at a time and runs the
  reverse recurrence. float32 and float64 CPU tensors. Fused training paths used by the
  modules, each with its own kernels and an equivalence test against the torch composition
  of the reference ops: ``conv_silu_numba`` (depthwise causal conv + SiLU in the
  ``[B, L, C]`` layout, reading its input in place from the in_proj output),
  ``mamba_inner_numba`` (softplus(dt_proj) + scan + D skip + SiLU gate),
  ``mamba_block_numba`` (a whole Mamba block in time windows: no ``[B, L, d_inner]``
  activation is kept for backward), ``ssd_scan(..., D=)`` (SSD with the D skip) and
  ``rmsnorm_gated_numba`` (Mamba2's gated RMSNorm).
- ``"cuda"``: mamba-ssm's kernels (``selective_scan_fn``, ``mamba_chunk_scan_combined``) for
  CUDA tensors when mamba-ssm is importable. Mamba-1's kernel takes neither an initial state
  nor resets: with either, the call falls back to ``"chunked"`` on the same device.
- ``"auto"``: ``cuda`` for CUDA tensors when mamba-ssm imports, else ``numba`` for float32 /
  float64 CPU tensors when numba imports, else ``chunked``.

Shapes (batch-first, time-major; the modules transpose nothing for the CPU kernels):

- selective_scan: u, delta ``[B, L, D]``; A ``[D, N]``; Bm, Cm ``[B, L, N]``;
  h0 ``[B, D, N]``; resets ``[B, L]`` bool -> y ``[B, L, D]``, h_last ``[B, D, N]``.
- ssd_scan: x ``[B, L, H, P]``; dt ``[B, L, H]``; A ``[H]``; Bm, Cm ``[B, L, G, N]``;
  h0 ``[B, H, P, N]``; resets ``[B, L]`` -> y ``[B, L, H, P]``, h_last ``[B, H, P, N]``.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

BACKENDS = ("auto", "reference", "chunked", "numba", "cuda")

# Time steps between stored states in the numba forward (the backward recomputes one chunk of
# states at a time from them). Memory of the checkpoints: [B, L / 64, D, N].
NUMBA_CHECKPOINT_EVERY = 64
# Chunk length of the pure-torch chunked scan.
TORCH_CHUNK = 32
# Tokens (batch rows x time steps) per window of the numba Mamba block (mamba_block_numba):
# windows of max(1, MAMBA_BLOCK_TOKENS // B) steps. Its forward keeps no [B, L, d_inner]
# activation and its backward recomputes one window at a time, so the peak memory of a training
# step is about 2 [B, L, d_model] tensors (output, input gradient) plus one window's worth of
# intermediates (measured at B=32, L=1024, d_model=64: 2048 tokens ~ 37 MB, 8192 ~ 81 MB, at
# the same speed).
MAMBA_BLOCK_TOKENS = 2048
# seqmodels.Mamba's numba training path takes those windows from B * L tokens on; below, one
# autograd graph of fused kernels (conv + SiLU, then softplus(dt_proj) + scan + D skip + gate)
# that keeps about 6 [B, L, d_inner]-sized activations but is ~12% faster (it recomputes no
# in_proj / conv / x_proj output in backward).
MAMBA_WINDOWED_MIN_TOKENS = 65536


# --------------------------------------------------------------------------------------------
# availability of optional accelerators (never raise at import)
# --------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def numba_available() -> bool:
    """True when numba can be imported (the compiled CPU backend is usable)."""
    try:
        import numba  # noqa: F401
    except Exception:  # pragma: no cover - numba is a declared dependency
        return False
    return True


@functools.lru_cache(maxsize=1)
def _mamba_ssm_ops() -> dict[str, Any] | None:
    """mamba-ssm's CUDA ops, or None when mamba-ssm (or triton, or CUDA) is unavailable."""
    if not torch.cuda.is_available():
        return None
    try:
        from mamba_ssm.ops.selective_scan_interface import selective_scan_fn
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
    except Exception:
        return None
    return {
        "selective_scan_fn": selective_scan_fn,
        "mamba_chunk_scan_combined": mamba_chunk_scan_combined,
    }


def mamba_ssm_available() -> bool:
    """True when mamba-ssm's CUDA kernels can be imported and CUDA is present."""
    return _mamba_ssm_ops() is not None


def resolve_backend(backend: str, device: torch.device, dtype: torch.dtype) -> str:
    """The concrete backend ``"auto"`` (or an explicit choice) means for tensors here.

    Raises ValueError for an unknown name or a backend that cannot run on this device/dtype.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        if device.type == "cuda" and mamba_ssm_available():
            return "cuda"
        if device.type == "cpu" and dtype in (torch.float32, torch.float64) and numba_available():
            return "numba"
        return "chunked"
    if backend == "numba":
        if device.type != "cpu":
            raise ValueError(f"backend 'numba' runs on CPU tensors only, got device {device}")
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"backend 'numba' supports float32 and float64, got {dtype}")
        if not numba_available():
            raise ValueError("backend 'numba' needs numba: pip install numba")
    if backend == "cuda":
        if device.type != "cuda":
            raise ValueError(f"backend 'cuda' needs CUDA tensors, got device {device}")
        if not mamba_ssm_available():
            raise ValueError(
                "backend 'cuda' needs mamba-ssm: pip install 'coopsearch[cuda]' (mamba-ssm)"
            )
    return backend


def _keep(resets: Tensor | None, like: Tensor) -> Tensor | None:
    """[B, L] multiplier: 0 where an episode starts, 1 elsewhere (None when no resets)."""
    if resets is None:
        return None
    return (~resets).to(like.dtype)


# --------------------------------------------------------------------------------------------
# reference (sequential loop): the ground truth
# --------------------------------------------------------------------------------------------


def selective_scan_reference(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    Bm: Tensor,
    Cm: Tensor,
    h0: Tensor | None = None,
    resets: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Sequential Mamba scan (see module docstring). Returns (y [B, L, D], h_last [B, D, N])."""
    batch, length, d_inner = u.shape
    h = u.new_zeros(batch, d_inner, A.shape[1]) if h0 is None else h0
    ys = []
    for t in range(length):
        if resets is not None:
            h = h * (~resets[:, t]).to(h.dtype)[:, None, None]
        decay = torch.exp(delta[:, t, :, None] * A)
        h = decay * h + (delta[:, t] * u[:, t])[:, :, None] * Bm[:, t, None, :]
        ys.append((h * Cm[:, t, None, :]).sum(-1))
    y = torch.stack(ys, dim=1) if ys else u.new_zeros(batch, 0, d_inner)
    return y, h


def _expand_groups(m: Tensor, nheads: int) -> Tensor:
    """[..., G, N] -> [..., H, N]: head h reads group h // (H // G) (mamba-ssm's convention)."""
    ngroups = m.shape[-2]
    return m.repeat_interleave(nheads // ngroups, dim=-2)


def ssd_scan_reference(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    Bm: Tensor,
    Cm: Tensor,
    h0: Tensor | None = None,
    resets: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Sequential Mamba2 (SSD) scan. Returns (y [B, L, H, P], h_last [B, H, P, N])."""
    batch, length, nheads, headdim = x.shape
    d_state = Bm.shape[-1]
    h = x.new_zeros(batch, nheads, headdim, d_state) if h0 is None else h0
    Bh = _expand_groups(Bm, nheads)
    Ch = _expand_groups(Cm, nheads)
    ys = []
    for t in range(length):
        if resets is not None:
            h = h * (~resets[:, t]).to(h.dtype)[:, None, None, None]
        decay = torch.exp(dt[:, t] * A)[:, :, None, None]
        inp = (dt[:, t, :, None] * x[:, t])[..., None] * Bh[:, t, :, None, :]
        h = decay * h + inp
        ys.append((h * Ch[:, t, :, None, :]).sum(-1))
    y = torch.stack(ys, dim=1) if ys else x.new_zeros(batch, 0, nheads, headdim)
    return y, h


# --------------------------------------------------------------------------------------------
# chunked torch: log-depth scan inside chunks, state carried across chunks, recomputed in bwd
# --------------------------------------------------------------------------------------------


def _linear_scan(a: Tensor, b: Tensor, h0: Tensor) -> Tensor:
    """All states of h_t = a_t * h_{t-1} + b_t over dim 1 (Hillis-Steele, log2(T) steps).

    a broadcasts against b (a may have size-1 trailing dims); h0: b.shape without dim 1.
    """
    length = b.shape[1]
    offset = 1
    while offset < length:
        b = torch.cat([b[:, :offset], b[:, offset:] + a[:, offset:] * b[:, :-offset]], dim=1)
        a = torch.cat([a[:, :offset], a[:, offset:] * a[:, :-offset]], dim=1)
        offset *= 2
    return b + a * h0.unsqueeze(1)


def _mamba_chunk(
    u: Tensor, delta: Tensor, A: Tensor, Bm: Tensor, Cm: Tensor, keep: Tensor | None, h: Tensor
) -> tuple[Tensor, Tensor]:
    decay = torch.exp(delta[..., None] * A)  # [B, T, D, N]
    if keep is not None:
        decay = decay * keep[:, :, None, None]
    inp = (delta * u)[..., None] * Bm[:, :, None, :]
    hs = _linear_scan(decay, inp, h)
    return torch.einsum("btdn,btn->btd", hs, Cm), hs[:, -1]


def _ssd_chunk(
    x: Tensor, dt: Tensor, A: Tensor, Bm: Tensor, Cm: Tensor, keep: Tensor | None, h: Tensor
) -> tuple[Tensor, Tensor]:
    nheads = x.shape[2]
    decay = torch.exp(dt * A)  # [B, T, H]
    if keep is not None:
        decay = decay * keep[:, :, None]
    Bh = _expand_groups(Bm, nheads)
    Ch = _expand_groups(Cm, nheads)
    inp = (dt[..., None] * x)[..., None] * Bh[:, :, :, None, :]  # [B, T, H, P, N]
    hs = _linear_scan(decay[..., None, None], inp, h)
    return torch.einsum("bthpn,bthn->bthp", hs, Ch), hs[:, -1]


def _run_chunks(chunk_fn: Any, seq_args: list[Tensor | None], A: Tensor, h: Tensor, chunk: int):
    length = seq_args[0].shape[1]
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in [*seq_args, A, h]
    )
    ys = []
    for start in range(0, length, chunk):
        sl = [None if t is None else t[:, start : start + chunk] for t in seq_args]
        u, d, Bm, Cm, keep = sl
        if needs_grad:
            y, h = checkpoint(chunk_fn, u, d, A, Bm, Cm, keep, h, use_reentrant=False)
        else:
            y, h = chunk_fn(u, d, A, Bm, Cm, keep, h)
        ys.append(y)
    return torch.cat(ys, dim=1), h


def selective_scan_chunked(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    Bm: Tensor,
    Cm: Tensor,
    h0: Tensor | None = None,
    resets: Tensor | None = None,
    chunk: int = TORCH_CHUNK,
) -> tuple[Tensor, Tensor]:
    """Pure-torch chunked Mamba scan; same contract as :func:`selective_scan_reference`."""
    batch, length, d_inner = u.shape
    h = u.new_zeros(batch, d_inner, A.shape[1]) if h0 is None else h0
    if length == 0:
        return u.new_zeros(batch, 0, d_inner), h
    return _run_chunks(_mamba_chunk, [u, delta, Bm, Cm, _keep(resets, u)], A, h, chunk)


def ssd_scan_chunked(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    Bm: Tensor,
    Cm: Tensor,
    h0: Tensor | None = None,
    resets: Tensor | None = None,
    chunk: int = TORCH_CHUNK,
) -> tuple[Tensor, Tensor]:
    """Pure-torch chunked Mamba2 scan; same contract as :func:`ssd_scan_reference`."""
    batch, length, nheads, headdim = x.shape
    h = x.new_zeros(batch, nheads, headdim, Bm.shape[-1]) if h0 is None else h0
    if length == 0:
        return x.new_zeros(batch, 0, nheads, headdim), h
    return _run_chunks(_ssd_chunk, [x, dt, Bm, Cm, _keep(resets, x)], A, h, chunk)


# --------------------------------------------------------------------------------------------
# numba kernels
# --------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _numba_kernels() -> dict[str, Any]:
    """The compiled CPU kernels (compiled, or loaded from numba's disk cache, on first use)."""
    from seqmodels import _numba_kernels as kernels

    return {
        "mamba_fwd_t": kernels.mamba_fwd_t,
        "mamba_bwd_t": kernels.mamba_bwd_t,
        "ssd_fwd_t": kernels.ssd_fwd_t,
        "ssd_bwd_t": kernels.ssd_bwd_t,
        "mamba_step": kernels.mamba_step,
        "ssd_step": kernels.ssd_step,
        "conv_step_silu": kernels.conv_step_silu,
        "mamba_step_gated": kernels.mamba_step_gated,
        "conv_silu_fwd": kernels.conv_silu_fwd,
        "conv_silu_bwd": kernels.conv_silu_bwd,
        "rmsnorm_gated_fwd": kernels.rmsnorm_gated_fwd,
        "rmsnorm_gated_bwd": kernels.rmsnorm_gated_bwd,
        "mamba_fused_fwd": kernels.mamba_fused_fwd,
        "mamba_fused_bwd": kernels.mamba_fused_bwd,
    }


def _np(t: Tensor) -> Any:
    return t.detach().contiguous().numpy()


def _set_numba_threads() -> None:
    """Use as many numba threads as torch uses (after the kernels module chose the threading
    layer: numba's thread pool starts at the first set_num_threads or parallel launch)."""
    _numba_kernels()
    import numba

    numba.set_num_threads(max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)))


class _NumbaSelectiveScan(torch.autograd.Function):
    """Mamba scan on CPU: the kernels keep the state as [N, D] (channels innermost)."""

    @staticmethod
    def forward(ctx, u, delta, A, Bm, Cm, keep, h0):  # type: ignore[override]
        _set_numba_threads()
        kern = _numba_kernels()
        every = NUMBA_CHECKPOINT_EVERY
        At = A.t().contiguous()
        # contiguous once, saved as such: the backward reads the same memory without copying
        u, delta, Bm, Cm, keep = (t.detach().contiguous() for t in (u, delta, Bm, Cm, keep))
        arrays = [_np(t) for t in (u, delta, At, Bm, Cm, keep, h0.transpose(1, 2))]
        y, h_last, ckpt = kern["mamba_fwd_t"](*arrays, every)
        ctx.every = every
        ctx.save_for_backward(u, delta, At, Bm, Cm, keep, torch.from_numpy(ckpt))
        return torch.from_numpy(y), torch.from_numpy(h_last).transpose(1, 2)

    @staticmethod
    def backward(ctx, dy, dh_last):  # type: ignore[override]
        _set_numba_threads()
        u, delta, At, Bm, Cm, keep, ckpt = ctx.saved_tensors
        if dy is None:
            dy = torch.zeros_like(u)
        if dh_last is None:
            dh_last = u.new_zeros(u.shape[0], At.shape[1], At.shape[0])
        kern = _numba_kernels()
        arrays = [_np(t) for t in (u, delta, At, Bm, Cm, keep, ckpt, dy, dh_last.transpose(1, 2))]
        du, ddelta, dA, dB, dC, dh0 = kern["mamba_bwd_t"](*arrays, ctx.every)
        t = torch.from_numpy
        return t(du), t(ddelta), t(dA).sum(0).t(), t(dB), t(dC), None, t(dh0).transpose(1, 2)


def _ssd_state_to_kernel(h: Tensor, ngroups: int) -> Tensor:
    """[B, H, P, N] (mamba-ssm layout) -> [B, G, N, Q] (the SSD kernels' layout, Q = H*P/G)."""
    batch, nheads, headdim, d_state = h.shape
    h = h.reshape(batch, ngroups, nheads // ngroups, headdim, d_state)
    return h.permute(0, 1, 4, 2, 3).reshape(batch, ngroups, d_state, -1).contiguous()


def _ssd_state_from_kernel(h: Tensor, nheads: int) -> Tensor:
    """[B, G, N, Q] -> [B, H, P, N] (a view, not a copy)."""
    batch, ngroups, d_state, q_len = h.shape
    headdim = q_len * ngroups // nheads
    h = h.view(batch, ngroups, d_state, nheads // ngroups, headdim)
    return h.permute(0, 1, 3, 4, 2).reshape(batch, nheads, headdim, d_state)


class _NumbaSSDScan(torch.autograd.Function):
    """Mamba2 scan on CPU, D skip included (``Dq``: D per channel, ``[H * P]``). The kernels
    see x as ``[B, L, H * P]`` and keep the state of group g as ``[N, Q]``."""

    @staticmethod
    def forward(ctx, x, dt, A, Bm, Cm, keep, h0, Dq):  # type: ignore[override]
        _set_numba_threads()
        kern = _numba_kernels()
        every = NUMBA_CHECKPOINT_EVERY
        batch, length, nheads, headdim = x.shape
        ngroups = Bm.shape[2]
        x2 = x.detach().reshape(batch, length, nheads * headdim).contiguous()
        dt, Bm, Cm, keep = (t.detach().contiguous() for t in (dt, Bm, Cm, keep))
        h0k = _ssd_state_to_kernel(h0.detach(), ngroups)
        arrays = [_np(t) for t in (x2, dt, A, Dq, Bm, Cm, keep, h0k)]
        y, h_last, ckpt = kern["ssd_fwd_t"](*arrays, every)
        ctx.every = every
        ctx.save_for_backward(x2, dt, A, Dq, Bm, Cm, keep, torch.from_numpy(ckpt))
        y = torch.from_numpy(y).view(batch, length, nheads, headdim)
        return y, _ssd_state_from_kernel(torch.from_numpy(h_last), nheads)

    @staticmethod
    def backward(ctx, dy, dh_last):  # type: ignore[override]
        _set_numba_threads()
        x2, dt, A, Dq, Bm, Cm, keep, ckpt = ctx.saved_tensors
        batch, length, channels = x2.shape
        nheads = dt.shape[2]
        ngroups = Bm.shape[2]
        if dy is None:
            dy = torch.zeros_like(x2)
        dy = dy.reshape(batch, length, channels)
        if dh_last is None:
            dhk = x2.new_zeros(batch, ngroups, Bm.shape[3], channels // ngroups)
        else:
            dhk = _ssd_state_to_kernel(dh_last, ngroups)
        kern = _numba_kernels()
        arrays = [_np(t) for t in (x2, dt, A, Dq, Bm, Cm, keep, ckpt, dy, dhk)]
        dx, ddt, dA, dD, dB, dC, dh0 = kern["ssd_bwd_t"](*arrays, ctx.every)
        t = torch.from_numpy
        dx = t(dx).view(batch, length, nheads, channels // nheads)
        dh0 = _ssd_state_from_kernel(t(dh0), nheads)
        return dx, t(ddt), t(dA).sum(0), t(dB), t(dC), None, dh0, t(dD).sum(0)


def _keep_or_ones(resets: Tensor | None, like: Tensor) -> Tensor:
    keep = _keep(resets, like)
    return like.new_ones(like.shape[0], like.shape[1]) if keep is None else keep


def selective_scan_numba(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    Bm: Tensor,
    Cm: Tensor,
    h0: Tensor | None = None,
    resets: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Compiled CPU Mamba scan (forward + backward kernels); contract of the reference."""
    batch, _, d_inner = u.shape
    if h0 is None:
        h0 = u.new_zeros(batch, d_inner, A.shape[1])
    dtype = u.dtype
    A, Bm, Cm, h0 = (t.to(dtype) for t in (A, Bm, Cm, h0))
    return _NumbaSelectiveScan.apply(u, delta.to(dtype), A, Bm, Cm, _keep_or_ones(resets, u), h0)


def ssd_scan_numba(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    Bm: Tensor,
    Cm: Tensor,
    h0: Tensor | None = None,
    resets: Tensor | None = None,
    D: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Compiled CPU Mamba2 scan (forward + backward kernels); contract of the reference, plus
    the D skip fused when ``D`` (``[H]`` or ``[H, P]``) is given: y = C . h + D * x."""
    batch, _, nheads, headdim = x.shape
    if h0 is None:
        h0 = x.new_zeros(batch, nheads, headdim, Bm.shape[-1])
    dtype = x.dtype
    A, Bm, Cm, h0 = (t.to(dtype) for t in (A, Bm, Cm, h0))
    if D is None:
        Dq = x.new_zeros(nheads * headdim)
    else:
        Dq = D.to(dtype).reshape(nheads, -1).expand(nheads, headdim).reshape(-1)
    keep = _keep_or_ones(resets, x)
    return _NumbaSSDScan.apply(x, dt.to(dtype), A, Bm, Cm, keep, h0, Dq)


def _row_buffer(x: Tensor) -> tuple[Tensor, int]:
    """A C-contiguous ``[B, L, S]`` tensor and a channel offset such that
    ``x == buf[..., off : off + C]``: the tensor x is a channel slice of (a split of the
    in_proj output), else a contiguous copy of x with offset 0."""
    base = x._base
    if (
        base is not None
        and x.stride(-1) == 1
        and base.dim() == 3
        and base.is_contiguous()
        and base.shape[:2] == x.shape[:2]
        and x.stride(1) == base.shape[2]
        and x.stride(0) == base.stride(0)
    ):
        off = x.storage_offset() - base.storage_offset()
        if 0 <= off <= base.shape[2] - x.shape[2]:
            return base.detach(), off
    return x.detach().contiguous(), 0


class _NumbaConvSiLU(torch.autograd.Function):
    """Depthwise causal conv + SiLU on CPU in the [B, L, C] layout (taps masked at resets)."""

    @staticmethod
    def forward(ctx, x, w, bias, hist, keep):  # type: ignore[override]
        _set_numba_threads()
        src, off = _row_buffer(x)
        w, bias, hist, keep = (t.detach().contiguous() for t in (w, bias, hist, keep))
        arrays = [_np(t) for t in (w, bias, hist, keep)]
        out, state = _numba_kernels()["conv_silu_fwd"](_np(src), off, *arrays)
        ctx.off = off
        ctx.save_for_backward(src, w, bias, hist, keep)
        return torch.from_numpy(out), torch.from_numpy(state)

    @staticmethod
    def backward(ctx, dout, dstate):  # type: ignore[override]
        _set_numba_threads()
        src, w, bias, hist, keep = ctx.saved_tensors
        batch, length = keep.shape
        width, channels = w.shape
        if dout is None:
            dout = src.new_zeros(batch, length, channels)
        if dstate is None:
            dstate = src.new_zeros(batch, channels, width)
        dx = src.new_empty(batch, length, channels)
        arrays = [_np(t) for t in (w, bias, hist, keep, dout.contiguous(), dstate.contiguous())]
        kernel = _numba_kernels()["conv_silu_bwd"]
        dw, dbias, dhist = kernel(_np(src), ctx.off, *arrays, _np(dx), 0)
        t = torch.from_numpy
        return dx, t(dw).sum(0), t(dbias).sum(0), t(dhist), None


def conv_silu_numba(
    x: Tensor, conv_state: Tensor, weight: Tensor, bias: Tensor | None, resets: Tensor | None
) -> tuple[Tensor, Tensor]:
    """silu(depthwise causal conv) over a sequence with compiled CPU kernels, taps masked at
    episode resets (contract of ``seqmodels.mamba.masked_causal_conv`` followed by SiLU).

    x ``[B, L, C]`` (may be a channel slice of a larger ``[B, L, S]`` tensor: read in place);
    conv_state ``[B, C, W]``; weight ``[C, 1, W]``; bias ``[C]`` or None; resets ``[B, L]``.
    Returns silu(out) ``[B, L, C]`` and the new conv state ``[B, C, W]``.
    """
    dtype = x.dtype
    w = weight[:, 0, :].t().to(dtype)  # [W, C]
    b = x.new_zeros(w.shape[1]) if bias is None else bias.to(dtype)
    hist = conv_state[:, :, 1:].transpose(1, 2).to(dtype)  # [B, W-1, C]
    out, state = _NumbaConvSiLU.apply(x, w, b, hist, _keep_or_ones(resets, x))
    return out, state.to(conv_state.dtype)


class _NumbaRMSNormGated(torch.autograd.Function):
    """Gated RMSNorm on CPU (one kernel per direction; z read in place from its buffer)."""

    @staticmethod
    def forward(ctx, x, z, weight, group_size, eps, norm_before_gate):  # type: ignore[override]
        _set_numba_threads()
        src, off = _row_buffer(z)
        x, weight = x.detach().contiguous(), weight.detach().contiguous()
        args = (off, _np(weight), group_size, float(eps), bool(norm_before_gate))
        out = _numba_kernels()["rmsnorm_gated_fwd"](_np(x), _np(src), *args)
        ctx.args = args[2:]
        ctx.off = off
        ctx.save_for_backward(x, src, weight)
        return torch.from_numpy(out)

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        _set_numba_threads()
        x, src, weight = ctx.saved_tensors
        arrays = (_np(x), _np(src), ctx.off, _np(weight), *ctx.args, _np(dout.contiguous()))
        dx, dz, dweight = _numba_kernels()["rmsnorm_gated_bwd"](*arrays)
        t = torch.from_numpy
        return t(dx), t(dz), t(dweight).sum(0), None, None, None


def rmsnorm_gated_numba(
    x: Tensor, z: Tensor, weight: Tensor, group_size: int, eps: float, norm_before_gate: bool
) -> Tensor:
    """Gated RMSNorm (``seqmodels.RMSNormGated``'s contract, gate z given) with compiled CPU
    kernels: x, z ``[B, L, C]`` (z may be a channel slice of a larger tensor), weight ``[C]``."""
    dtype = x.dtype
    return _NumbaRMSNormGated.apply(
        x, z.to(dtype), weight.to(dtype), group_size, eps, norm_before_gate
    )


class _NumbaMambaFused(torch.autograd.Function):
    """Mamba's inner part on CPU: softplus(dt_proj), the scan, the D skip and the SiLU gate in
    one kernel per direction. Saves u, the small x_proj outputs, the buffer z lives in (the
    in_proj output, which the conv kernel keeps anyway) and the checkpoint states."""

    @staticmethod
    def forward(ctx, u, dt_low, W_dt, dt_bias, A, Bm, Cm, z, D, keep, h0):  # type: ignore[override]
        _set_numba_threads()
        every = NUMBA_CHECKPOINT_EVERY
        zsrc, zoff = _row_buffer(z)
        u, dt_low, Bm, Cm, dt_bias, D, keep = (
            t.detach().contiguous() for t in (u, dt_low, Bm, Cm, dt_bias, D, keep)
        )
        Wt = W_dt.detach().t().contiguous()  # [R, D]
        At = A.detach().t().contiguous()  # [N, D]
        arrays = [_np(t) for t in (u, dt_low, Wt, dt_bias, At, Bm, Cm, zsrc)]
        tail = [_np(t) for t in (D, keep, h0.transpose(1, 2))]
        y, h_last, ckpt = _numba_kernels()["mamba_fused_fwd"](*arrays, zoff, *tail, every)
        ctx.every, ctx.zoff = every, zoff
        ckpt = torch.from_numpy(ckpt)
        ctx.save_for_backward(u, dt_low, Wt, dt_bias, At, Bm, Cm, zsrc, D, keep, ckpt)
        return torch.from_numpy(y), torch.from_numpy(h_last).transpose(1, 2)

    @staticmethod
    def backward(ctx, dy, dh_last):  # type: ignore[override]
        _set_numba_threads()
        u, dt_low, Wt, dt_bias, At, Bm, Cm, zsrc, D, keep, ckpt = ctx.saved_tensors
        if dy is None:
            dy = torch.zeros_like(u)
        if dh_last is None:
            dh_last = u.new_zeros(u.shape[0], At.shape[1], At.shape[0])
        arrays = [_np(t) for t in (u, dt_low, Wt, dt_bias, At, Bm, Cm, zsrc)]
        tail = [_np(t) for t in (D, keep, ckpt, dy.contiguous(), dh_last.transpose(1, 2))]
        dz = torch.empty_like(u)
        kernel = _numba_kernels()["mamba_fused_bwd"]
        grads = kernel(*arrays, ctx.zoff, *tail, ctx.every, _np(dz), 0)
        du, ddtl, dWt, ddbias, dA, dD, dB, dC, dh0, _ = (torch.from_numpy(g) for g in grads)
        return (
            du,
            ddtl,
            dWt.sum(0).t(),
            ddbias.sum(0),
            dA.sum(0).t(),
            dB,
            dC,
            dz,
            dD.sum(0),
            None,
            dh0.transpose(1, 2),
        )


def mamba_inner_numba(
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
) -> tuple[Tensor, Tensor]:
    """Mamba's gated SSM output with compiled CPU kernels (forward and backward):

        delta = softplus(dt_low @ dt_weight^T + dt_bias)
        y, h_last = selective_scan(u, delta, A, Bm, Cm, h0, resets)
        y = (y + D * u) * silu(z)

    u, z ``[B, L, D]`` (z may be a channel slice of the in_proj output: read in place);
    dt_low ``[B, L, R]``; dt_weight ``[D, R]``; dt_bias, D ``[D]``; A ``[D, N]``; Bm, Cm
    ``[B, L, N]``; h0 ``[B, D, N]`` or None; resets ``[B, L]``. Returns (y ``[B, L, D]``,
    h_last ``[B, D, N]``).
    """
    batch, _, d_inner = u.shape
    dtype = u.dtype
    if h0 is None:
        h0 = u.new_zeros(batch, d_inner, A.shape[1])
    cast = [t.to(dtype) for t in (dt_low, dt_weight, dt_bias, A, Bm, Cm, z, D, h0)]
    dt_low, dt_weight, dt_bias, A, Bm, Cm, z, D, h0 = cast
    keep = _keep_or_ones(resets, u)
    return _NumbaMambaFused.apply(u, dt_low, dt_weight, dt_bias, A, Bm, Cm, z, D, keep, h0)


class _NumbaMambaBlock(torch.autograd.Function):
    """A whole Mamba block on CPU (in_proj, conv + SiLU, x_proj, the gated inner part,
    out_proj), processed in windows of ``chunk`` time steps that carry the conv and SSM states
    from one to the next (exact: the split invariance of the block).

    Saved for backward: the input x, per window its starting conv state and the scan's
    checkpoint states. The backward walks the windows in reverse, recomputes a window's
    in_proj, conv and x_proj outputs, runs the fused backward kernels and the matmuls' weight
    gradients by hand; every [B, T, *] intermediate lives for one window only. Costs one extra
    in_proj, conv and x_proj forward; the scan's forward is not recomputed (its backward kernel
    recomputes states from the checkpoints and returns out_proj's input as a by-product).
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        x,
        conv_state,
        h0,
        keep,
        W_in,
        b_in,
        w_conv,
        b_conv,
        W_x,
        Wt_dt,
        b_dt,
        At,
        D,
        W_out,
        b_out,
        dt_rank,
        chunk,
    ):
        _set_numba_threads()
        kern = _numba_kernels()
        every = NUMBA_CHECKPOINT_EVERY
        x, W_in, W_x, W_out = (t.detach() for t in (x, W_in, W_x, W_out))
        b_in = None if b_in is None else b_in.detach()
        b_out = None if b_out is None else b_out.detach()
        w_conv, b_conv, Wt_dt, b_dt, At, D, keep = (
            t.detach().contiguous() for t in (w_conv, b_conv, Wt_dt, b_dt, At, D, keep)
        )
        batch, length, _ = x.shape
        d_inner = D.shape[0]
        d_state = At.shape[0]
        small = [_np(t) for t in (Wt_dt, b_dt, At)]
        conv_np = [_np(w_conv), _np(b_conv)]
        out = x.new_empty(batch, length, W_out.shape[0])
        state = conv_state.detach()
        h = h0.detach().transpose(1, 2).contiguous()  # [B, N, D]
        starts, ckpts = [], []
        for s in range(0, length, chunk):
            e = min(length, s + chunk)
            keep_c = keep[:, s:e].contiguous()
            xz = F.linear(x[:, s:e], W_in, b_in)  # [B, T, 2 D]
            hist = state[:, :, 1:].transpose(1, 2).contiguous()
            xs, new_state = kern["conv_silu_fwd"](_np(xz), 0, *conv_np, _np(hist), _np(keep_c))
            xs = torch.from_numpy(xs)
            dt_low, Bm, Cm = (
                t.contiguous()
                for t in torch.split(F.linear(xs, W_x), [dt_rank, d_state, d_state], dim=-1)
            )
            y, h_next, ckpt = kern["mamba_fused_fwd"](
                _np(xs), _np(dt_low), small[0], small[1], small[2], _np(Bm), _np(Cm), _np(xz),
                d_inner, _np(D), _np(keep_c), _np(h), every,
            )  # fmt: skip
            out[:, s:e] = F.linear(torch.from_numpy(y), W_out, b_out)
            starts.append(state)
            ckpts.append(torch.from_numpy(ckpt))
            state, h = torch.from_numpy(new_state), torch.from_numpy(h_next)
        ctx.dims = (dt_rank, chunk, every)
        ctx.starts, ctx.ckpts = starts, ckpts
        ctx.has_bias = (b_in is not None, b_out is not None)
        ctx.save_for_backward(x, keep, W_in, b_in, w_conv, b_conv, W_x, Wt_dt, b_dt, At, D, W_out)
        return out, state, h.transpose(1, 2)

    @staticmethod
    def backward(ctx, dout, dstate, dh):  # type: ignore[override]
        _set_numba_threads()
        kern = _numba_kernels()
        x, keep, W_in, b_in, w_conv, b_conv, W_x, Wt_dt, b_dt, At, D, W_out = ctx.saved_tensors
        dt_rank, chunk, every = ctx.dims
        batch, length, d_model = x.shape
        d_inner = D.shape[0]
        d_state, width = At.shape[0], w_conv.shape[0]
        if dout is None:
            dout = x.new_zeros(batch, length, W_out.shape[0])
        g_state = x.new_zeros(batch, d_inner, width) if dstate is None else dstate.contiguous()
        g_h = x.new_zeros(batch, d_state, d_inner) if dh is None else dh.transpose(1, 2)
        g_h = g_h.contiguous()
        small = [_np(t) for t in (Wt_dt, b_dt, At)]
        conv_np = [_np(w_conv), _np(b_conv)]
        dx = torch.empty_like(x)
        dW_in, dW_x, dW_out = (torch.zeros_like(t) for t in (W_in, W_x, W_out))
        db_in = x.new_zeros(W_in.shape[0])
        db_out = x.new_zeros(W_out.shape[0])
        per_row: list[Tensor | int] = [0] * 6  # dw_conv, db_conv, dWt, db_dt, dAt, dD
        for c in range(len(ctx.starts) - 1, -1, -1):
            s = c * chunk
            e = min(length, s + chunk)
            keep_c = keep[:, s:e].contiguous()
            x_c = x[:, s:e].reshape(-1, d_model)
            xz = F.linear(x_c, W_in, b_in).view(batch, e - s, 2 * d_inner)
            hist = ctx.starts[c][:, :, 1:].transpose(1, 2).contiguous()
            xs, _ = kern["conv_silu_fwd"](_np(xz), 0, *conv_np, _np(hist), _np(keep_c))
            xs = torch.from_numpy(xs).view(-1, d_inner)
            dt_low, Bm, Cm = (
                t.contiguous().view(batch, e - s, -1)
                for t in torch.split(F.linear(xs, W_x), [dt_rank, d_state, d_state], dim=-1)
            )
            dout_c = dout[:, s:e].reshape(-1, dout.shape[-1])
            g_y = (dout_c @ W_out).view(batch, e - s, d_inner)
            dxz = x.new_empty(batch, e - s, 2 * d_inner)  # d in_proj output: conv | gate
            grads = kern["mamba_fused_bwd"](
                _np(xs.view(batch, e - s, d_inner)), _np(dt_low), small[0], small[1], small[2],
                _np(Bm), _np(Cm), _np(xz), d_inner, _np(D), _np(keep_c), _np(ctx.ckpts[c]),
                _np(g_y), _np(g_h), every, _np(dxz), d_inner,
            )  # fmt: skip
            del g_y, dt_low, Bm, Cm
            du, ddtl, dWt, ddbias, dAt, dDv, dB, dC, dh0, y = map(torch.from_numpy, grads)
            dW_out.addmm_(dout_c.t(), y.view(-1, d_inner))
            if ctx.has_bias[1]:
                db_out += dout_c.sum(0)
            del y, dout_c
            d_dbl = torch.cat([ddtl, dB, dC], dim=-1).view(-1, W_x.shape[0])
            dW_x.addmm_(d_dbl.t(), xs)
            dxs = du.view(-1, d_inner).addmm_(d_dbl, W_x).view(batch, e - s, d_inner)
            del xs, du, d_dbl
            conv_grads = kern["conv_silu_bwd"](
                _np(xz), 0, *conv_np, _np(hist), _np(keep_c), _np(dxs), _np(g_state), _np(dxz), 0
            )
            del xz, dxs
            dw_conv, db_conv, dhist = map(torch.from_numpy, conv_grads)
            dxz = dxz.view(-1, 2 * d_inner)
            dW_in.addmm_(dxz.t(), x_c)
            if ctx.has_bias[0]:
                db_in += dxz.sum(0)
            dx[:, s:e] = (dxz @ W_in).view(batch, e - s, d_model)
            del dxz
            for i, g in enumerate((dw_conv, db_conv, dWt, ddbias, dAt, dDv)):
                per_row[i] = per_row[i] + g.sum(0)
            g_h = dh0
            g_state = torch.cat([x.new_zeros(batch, d_inner, 1), dhist.transpose(1, 2)], dim=-1)
        dw_conv, db_conv, dWt, db_dt, dAt, dD = per_row
        return (
            dx, g_state, g_h.transpose(1, 2), None, dW_in, db_in if ctx.has_bias[0] else None,
            dw_conv, db_conv, dW_x, dWt, db_dt, dAt, dD, dW_out,
            db_out if ctx.has_bias[1] else None, None, None,
        )  # fmt: skip


def mamba_block_numba(
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
    """A Mamba block's forward (``seqmodels.Mamba``'s, numba backend) in time windows of
    ``MAMBA_BLOCK_TOKENS // B`` steps that keep no ``[B, L, d_inner]`` activation for backward.

    x ``[B, L, d_model]``; conv_state ``[B, d_inner, d_conv]``; h0 ``[B, d_inner, d_state]``;
    resets ``[B, L]`` or None; in_proj, conv (``[d_inner, 1, d_conv]`` weight), dt_proj and
    out_proj as (weight, bias); A ``[d_inner, d_state]`` (= -exp(A_log)); D ``[d_inner]``.
    Returns y ``[B, L, d_model]``, the new conv state and the last SSM state.
    """
    dtype = x.dtype
    d_inner = D.shape[0]
    W_in, b_in = (None if t is None else t.to(dtype) for t in in_proj)
    W_out, b_out = (None if t is None else t.to(dtype) for t in out_proj)
    conv_w, conv_b = conv
    w_conv = conv_w[:, 0, :].t().to(dtype)  # [W, d_inner]
    b_conv = x.new_zeros(d_inner) if conv_b is None else conv_b.to(dtype)
    Wt_dt = dt_proj[0].t().to(dtype)  # [R, d_inner]
    out, state, h_last = _NumbaMambaBlock.apply(
        x, conv_state.to(dtype), h0.to(dtype), _keep_or_ones(resets, x), W_in, b_in, w_conv,
        b_conv, x_proj_weight.to(dtype), Wt_dt, dt_proj[1].to(dtype), A.t().to(dtype),
        D.to(dtype), W_out, b_out, Wt_dt.shape[0], max(1, MAMBA_BLOCK_TOKENS // x.shape[0]),
    )  # fmt: skip
    return out, state, h_last


# --------------------------------------------------------------------------------------------
# cuda (mamba-ssm)
# --------------------------------------------------------------------------------------------


def selective_scan_cuda(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    Bm: Tensor,
    Cm: Tensor,
    h0: Tensor | None = None,
    resets: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """mamba-ssm's ``selective_scan_fn``; falls back to the chunked scan when an initial state
    or resets are given (the kernel honours neither)."""
    if h0 is not None or resets is not None:
        return selective_scan_chunked(u, delta, A, Bm, Cm, h0, resets)
    ops = _mamba_ssm_ops()
    assert ops is not None
    y, h_last = ops["selective_scan_fn"](
        u.transpose(1, 2).contiguous(),
        delta.transpose(1, 2).contiguous(),
        A.float().contiguous(),
        Bm.transpose(1, 2).contiguous(),
        Cm.transpose(1, 2).contiguous(),
        None,
        None,
        None,
        False,
        True,
    )
    return y.transpose(1, 2).to(u.dtype), h_last.to(u.dtype)


def ssd_scan_cuda(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    Bm: Tensor,
    Cm: Tensor,
    h0: Tensor | None = None,
    resets: Tensor | None = None,
    chunk_size: int = 256,
) -> tuple[Tensor, Tensor]:
    """mamba-ssm's ``mamba_chunk_scan_combined``: initial state via ``initial_states``, resets
    via ``seq_idx`` (the cumulative reset count: the state does not cross a change of it)."""
    ops = _mamba_ssm_ops()
    assert ops is not None
    seq_idx = None
    if resets is not None:
        seq_idx = torch.cumsum(resets.to(torch.int32), dim=1).to(torch.int32).contiguous()
    y, h_last = ops["mamba_chunk_scan_combined"](
        x.contiguous(),
        dt.contiguous(),
        A.float().contiguous(),
        Bm.contiguous(),
        Cm.contiguous(),
        chunk_size=chunk_size,
        initial_states=h0,
        seq_idx=seq_idx,
        dt_softplus=False,
        return_final_states=True,
    )
    return y.to(x.dtype), h_last.to(x.dtype)


# --------------------------------------------------------------------------------------------
# single-step state updates (rollouts)
# --------------------------------------------------------------------------------------------


def _use_step_kernel(backend: str, tensors: list[Tensor]) -> bool:
    """The numba step kernel has no autograd: use it only when no gradient is being taken."""
    name = resolve_backend(backend, tensors[0].device, tensors[0].dtype)
    if name != "numba":
        return False
    return not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))


def conv_step_silu(
    conv_state: Tensor, x: Tensor, weight: Tensor, bias: Tensor | None, backend: str = "auto"
) -> tuple[Tensor, Tensor]:
    """One causal-conv step then SiLU: conv_state ``[B, C, W]``, x ``[B, C]``, weight
    ``[C, 1, W]`` (nn.Conv1d depthwise), bias ``[C]`` -> (silu(out) ``[B, C]``, new state
    ``[B, C, W]``). A fused numba kernel on CPU when no gradient is taken, else torch."""
    w = weight[:, 0, :]
    if _use_step_kernel(backend, [x, conv_state, w] + ([] if bias is None else [bias])):
        _set_numba_threads()
        dtype = x.dtype
        b = torch.zeros(w.shape[0], dtype=dtype) if bias is None else bias.to(dtype)
        arrays = [_np(t.to(dtype)) for t in (conv_state, x, w, b)]
        new_state, out = _numba_kernels()["conv_step_silu"](*arrays)
        return torch.from_numpy(out), torch.from_numpy(new_state).to(conv_state.dtype)
    new_state = torch.cat([conv_state[:, :, 1:], x.unsqueeze(-1).to(conv_state.dtype)], dim=-1)
    out = torch.einsum("bcw,cw->bc", new_state.to(x.dtype), w.to(x.dtype))
    if bias is not None:
        out = out + bias.to(x.dtype)
    return torch.nn.functional.silu(out), new_state


def selective_state_update(
    h: Tensor, dt: Tensor, x: Tensor, A: Tensor, Bm: Tensor, Cm: Tensor, backend: str = "auto"
) -> tuple[Tensor, Tensor]:
    """One Mamba step: h ``[B, D, N]``, dt (after softplus) and x ``[B, D]``, A ``[D, N]``,
    Bm, Cm ``[B, N]`` -> (new h ``[B, D, N]``, y = C . h ``[B, D]``). Resets are applied by the
    caller (zeroing h). A fused numba kernel on CPU when no gradient is taken, else torch."""
    if _use_step_kernel(backend, [h, dt, x, A, Bm, Cm]):
        _set_numba_threads()
        dtype = x.dtype
        arrays = [_np(t.to(dtype)) for t in (h, dt, x, A, Bm, Cm)]
        h_new, y = _numba_kernels()["mamba_step"](*arrays)
        return torch.from_numpy(h_new), torch.from_numpy(y)
    h = torch.exp(dt.unsqueeze(-1) * A) * h + (dt * x).unsqueeze(-1) * Bm.unsqueeze(1)
    return h, torch.einsum("bdn,bn->bd", h, Cm)


def selective_state_update_gated(
    h: Tensor,
    dt: Tensor,
    x: Tensor,
    z: Tensor,
    A: Tensor,
    D: Tensor,
    Bm: Tensor,
    Cm: Tensor,
    backend: str = "auto",
    dt_bias: Tensor | None = None,
    dt_softplus: bool = False,
) -> tuple[Tensor, Tensor]:
    """The state update of :func:`selective_state_update` followed by the D skip and the SiLU
    gate: y = (C . h + D * x) * silu(z).

    h ``[B, D, N]``; dt, x, z ``[B, D]``; D ``[D]``; A ``[D, N]``; Bm, Cm ``[B, N]`` -> (new h
    ``[B, D, N]``, gated y ``[B, D]``). The step size is ``dt + dt_bias`` (``dt_bias [D]`` or
    None), passed through softplus when ``dt_softplus`` (mamba-ssm's ``selective_state_update``
    convention). One fused numba kernel on CPU when no gradient is taken (rollouts), else torch.
    """
    tensors = [h, dt, x, z, A, D, Bm, Cm] + ([] if dt_bias is None else [dt_bias])
    if _use_step_kernel(backend, tensors):
        _set_numba_threads()
        dtype = x.dtype
        bias = x.new_zeros(x.shape[-1]) if dt_bias is None else dt_bias.to(dtype)
        h, dt, bias = (_np(t.to(dtype)) for t in (h, dt, bias))
        rest = [_np(t.to(dtype)) for t in (x, z, A, D, Bm, Cm)]
        h_new, y = _numba_kernels()["mamba_step_gated"](h, dt, bias, bool(dt_softplus), *rest)
        return torch.from_numpy(h_new), torch.from_numpy(y)
    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)
    if dt_softplus:
        dt = torch.nn.functional.softplus(dt)
    h, y = selective_state_update(h, dt, x, A, Bm, Cm, backend=backend)
    return h, (y + D.to(x.dtype) * x) * torch.nn.functional.silu(z)


def ssd_state_update(
    h: Tensor, dt: Tensor, x: Tensor, A: Tensor, Bm: Tensor, Cm: Tensor, backend: str = "auto"
) -> tuple[Tensor, Tensor]:
    """One Mamba2 step: h ``[B, H, P, N]``, dt ``[B, H]`` (after softplus), x ``[B, H, P]``,
    A ``[H]``, Bm, Cm ``[B, G, N]`` -> (new h, y ``[B, H, P]``)."""
    if _use_step_kernel(backend, [h, dt, x, A, Bm, Cm]):
        _set_numba_threads()
        dtype = x.dtype
        arrays = [_np(t.to(dtype)) for t in (h, dt, x, A, Bm, Cm)]
        h_new, y = _numba_kernels()["ssd_step"](*arrays)
        return torch.from_numpy(h_new), torch.from_numpy(y)
    nheads = h.shape[1]
    Bh = _expand_groups(Bm, nheads)
    Ch = _expand_groups(Cm, nheads)
    h = torch.exp(dt * A)[:, :, None, None] * h + (dt[:, :, None] * x).unsqueeze(-1) * Bh.unsqueeze(
        2
    )
    return h, torch.einsum("bhpn,bhn->bhp", h, Ch)


# --------------------------------------------------------------------------------------------
# dispatch
# --------------------------------------------------------------------------------------------


def selective_scan(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    Bm: Tensor,
    Cm: Tensor,
    h0: Tensor | None = None,
    resets: Tensor | None = None,
    backend: str = "auto",
) -> tuple[Tensor, Tensor]:
    """Mamba selective scan with resets and an initial state (see module docstring).

    Args:
        u: ``[B, L, D]`` input (after conv and activation).
        delta: ``[B, L, D]`` step sizes (after softplus).
        A: ``[D, N]`` (negative) state matrix diagonal.
        Bm, Cm: ``[B, L, N]`` input and output projections.
        h0: ``[B, D, N]`` initial state or None (zeros).
        resets: ``[B, L]`` bool or None; true where a new episode starts.
        backend: one of :data:`BACKENDS`.

    Returns:
        y ``[B, L, D]`` (``C . h``, without the D skip and gate) and the last state ``[B, D, N]``.
    """
    name = resolve_backend(backend, u.device, u.dtype)
    if name == "reference":
        return selective_scan_reference(u, delta, A, Bm, Cm, h0, resets)
    if name == "numba":
        return selective_scan_numba(u, delta, A, Bm, Cm, h0, resets)
    if name == "cuda":
        return selective_scan_cuda(u, delta, A, Bm, Cm, h0, resets)
    return selective_scan_chunked(u, delta, A, Bm, Cm, h0, resets)


def ssd_scan(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    Bm: Tensor,
    Cm: Tensor,
    h0: Tensor | None = None,
    resets: Tensor | None = None,
    backend: str = "auto",
    chunk_size: int = TORCH_CHUNK,
    D: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Mamba2 (SSD, scalar A per head) scan with resets and an initial state.

    Args:
        x: ``[B, L, H, P]`` input (after conv and activation).
        dt: ``[B, L, H]`` step sizes (after softplus and any dt limit).
        A: ``[H]`` (negative) per-head decay rate.
        Bm, Cm: ``[B, L, G, N]``; head h uses group ``h // (H // G)``.
        h0: ``[B, H, P, N]`` initial state or None (zeros).
        resets: ``[B, L]`` bool or None.
        backend: one of :data:`BACKENDS`.
        chunk_size: chunk length of the chunked torch path and the cuda kernel.
        D: ``[H]`` or ``[H, P]`` skip weights, or None (no skip term); fused into the numba
            kernels, added in torch on the other backends.

    Returns:
        y ``[B, L, H, P]`` (``C . h``, plus ``D * x`` when D is given) and the last state
        ``[B, H, P, N]``.
    """
    name = resolve_backend(backend, x.device, x.dtype)
    if name == "numba":
        return ssd_scan_numba(x, dt, A, Bm, Cm, h0, resets, D=D)
    if name == "reference":
        y, h_last = ssd_scan_reference(x, dt, A, Bm, Cm, h0, resets)
    elif name == "cuda":
        y, h_last = ssd_scan_cuda(x, dt, A, Bm, Cm, h0, resets, chunk_size=chunk_size)
    else:
        y, h_last = ssd_scan_chunked(x, dt, A, Bm, Cm, h0, resets, chunk=chunk_size)
    if D is not None:
        y = y + x * D.to(x.dtype).reshape(x.shape[2], -1)
    return y, h_last


__all__ = [
    "BACKENDS",
    "conv_silu_numba",
    "conv_step_silu",
    "mamba_block_numba",
    "mamba_inner_numba",
    "mamba_ssm_available",
    "numba_available",
    "resolve_backend",
    "rmsnorm_gated_numba",
    "selective_scan",
    "selective_scan_chunked",
    "selective_scan_cuda",
    "selective_scan_numba",
    "selective_scan_reference",
    "selective_state_update",
    "selective_state_update_gated",
    "ssd_scan",
    "ssd_scan_chunked",
    "ssd_state_update",
    "ssd_scan_cuda",
    "ssd_scan_numba",
    "ssd_scan_reference",
]
