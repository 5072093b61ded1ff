"""Selective-scan backends for Mamba (per-channel A) and Mamba2 (scalar A per head, SSD).

Two scan problems are solved here, both with episode resets and an initial state.

Mamba (``selective_scan``), for every batch row b, channel d and state index n::

    h_t[d, n] = keep_t * exp(delta_t[d] * A[d, n]) * h_{t-1}[d, n] + delta_t[d] * B_t[n] * u_t[d]
    y_t[d]    = sum_n C_t[n] * h_t[d, n]

Mamba2 (``ssd_scan``), for head h (group g = h // (nheads / ngroups)), head channel p::

    h_t[h, p, n] = keep_t * exp(dt_t[h] * A[h]) * h_{t-1}[h, p, n] + dt_t[h] * B_t[g, n] * x_t[h, p]
    y_t[h, p]    = sum_n C_t[g, n] * h_t[h, p, n]

where ``keep_t = 0`` where ``resets[:, t]`` is true (a new episode starts at t: the state coming
from t-1 is dropped) and 1 elsewhere; ``h_{-1}`` is the initial state (zeros when None). The
skip term ``D * u``, the gate ``silu(z)`` and the softplus of delta are applied by the modules,
outside the scan (cheap elementwise work on ``[B, L, d_inner]``).

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
  reverse recurrence. float32 and float64 CPU tensors.
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
from torch import Tensor
from torch.utils.checkpoint import checkpoint

BACKENDS = ("auto", "reference", "chunked", "numba", "cuda")

# Time steps between stored states in the numba forward (the backward recomputes one chunk of
# states at a time from them). Memory of the checkpoints: [B, L / 64, D, N].
NUMBA_CHECKPOINT_EVERY = 64
# Chunk length of the pure-torch chunked scan.
TORCH_CHUNK = 32


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


class _NumbaSSDScan(torch.autograd.Function):
    """Mamba2 scan on CPU: the kernels keep the state as [H, N, P] (head channels innermost)."""

    @staticmethod
    def forward(ctx, x, dt, A, Bm, Cm, keep, h0):  # type: ignore[override]
        _set_numba_threads()
        kern = _numba_kernels()
        every = NUMBA_CHECKPOINT_EVERY
        x, dt, Bm, Cm, keep = (t.detach().contiguous() for t in (x, dt, Bm, Cm, keep))
        arrays = [_np(t) for t in (x, dt, A, Bm, Cm, keep, h0.transpose(2, 3))]
        y, h_last, ckpt = kern["ssd_fwd_t"](*arrays, every)
        ctx.every = every
        ctx.save_for_backward(x, dt, A, Bm, Cm, keep, torch.from_numpy(ckpt))
        return torch.from_numpy(y), torch.from_numpy(h_last).transpose(2, 3)

    @staticmethod
    def backward(ctx, dy, dh_last):  # type: ignore[override]
        _set_numba_threads()
        x, dt, A, Bm, Cm, keep, ckpt = ctx.saved_tensors
        if dy is None:
            dy = torch.zeros_like(x)
        if dh_last is None:
            dh_last = x.new_zeros(x.shape[0], x.shape[2], x.shape[3], Bm.shape[-1])
        kern = _numba_kernels()
        arrays = [_np(t) for t in (x, dt, A, Bm, Cm, keep, ckpt, dy, dh_last.transpose(2, 3))]
        dx, ddt, dA, dB, dC, dh0 = kern["ssd_bwd_t"](*arrays, ctx.every)
        t = torch.from_numpy
        return t(dx), t(ddt), t(dA).sum(0), t(dB), t(dC), None, t(dh0).transpose(2, 3)


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
) -> tuple[Tensor, Tensor]:
    """Compiled CPU Mamba2 scan (forward + backward kernels); contract of the reference."""
    batch, _, nheads, headdim = x.shape
    if h0 is None:
        h0 = x.new_zeros(batch, nheads, headdim, Bm.shape[-1])
    dtype = x.dtype
    A, Bm, Cm, h0 = (t.to(dtype) for t in (A, Bm, Cm, h0))
    return _NumbaSSDScan.apply(x, dt.to(dtype), A, Bm, Cm, _keep_or_ones(resets, x), h0)


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
) -> tuple[Tensor, Tensor]:
    """The state update of :func:`selective_state_update` followed by the D skip and the SiLU
    gate: y = (C . h + D * x) * silu(z).

    h ``[B, D, N]``; dt (after softplus), x, z ``[B, D]``; D ``[D]``; A ``[D, N]``; Bm, Cm
    ``[B, N]`` -> (new h ``[B, D, N]``, gated y ``[B, D]``). One fused numba kernel on CPU
    when no gradient is taken (rollouts), else torch ops.
    """
    if _use_step_kernel(backend, [h, dt, x, z, A, D, Bm, Cm]):
        _set_numba_threads()
        dtype = x.dtype
        arrays = [_np(t.to(dtype)) for t in (h, dt, x, z, A, D, Bm, Cm)]
        h_new, y = _numba_kernels()["mamba_step_gated"](*arrays)
        return torch.from_numpy(h_new), torch.from_numpy(y)
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

    Returns:
        y ``[B, L, H, P]`` (without the D skip) and the last state ``[B, H, P, N]``.
    """
    name = resolve_backend(backend, x.device, x.dtype)
    if name == "reference":
        return ssd_scan_reference(x, dt, A, Bm, Cm, h0, resets)
    if name == "numba":
        return ssd_scan_numba(x, dt, A, Bm, Cm, h0, resets)
    if name == "cuda":
        return ssd_scan_cuda(x, dt, A, Bm, Cm, h0, resets, chunk_size=chunk_size)
    return ssd_scan_chunked(x, dt, A, Bm, Cm, h0, resets, chunk=chunk_size)


__all__ = [
    "BACKENDS",
    "conv_step_silu",
    "mamba_ssm_available",
    "numba_available",
    "resolve_backend",
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
