"""Selective scans for Mamba (per-channel A) and Mamba2 (scalar A per head, SSD): the readable
implementations, the backend choice, and the dispatchers the modules call.

Two scan problems are solved here, both with episode resets and an initial state.

Mamba (``selective_scan``), for every batch row b, channel d and state index n::

    h_t[d, n] = exp(delta_t[d] * A[d, n]) * h'_{t-1}[d, n] + delta_t[d] * B_t[n] * u_t[d]
    y_t[d]    = sum_n C_t[n] * h_t[d, n]

Mamba2 (``ssd_scan``), for head h (group g = h // (nheads / ngroups)), head channel p::

    h_t[h, p, n] = exp(dt_t[h] * A[h]) * h'_{t-1}[h, p, n] + dt_t[h] * B_t[g, n] * x_t[h, p]
    y_t[h, p]    = sum_n C_t[g, n] * h_t[h, p, n]  (+ D[h, p] * x_t[h, p] when D is given)

where ``h'_{t-1}`` is 0 where ``resets[:, t]`` is true (a new episode starts at t: the state
coming from t-1 is *replaced* by zeros, so not even a NaN or inf before t reaches t) and
``h_{t-1}`` elsewhere; ``h_{-1}`` is the initial state (zeros when None). The skip term
``D * u``, the gate ``silu(z)`` and the softplus of delta of Mamba are applied outside the scan
(:mod:`seqmodels.ops`, or fused with it in :func:`seqmodels.kernels.numba_ops.mamba_inner_numba`).

Backends (``backend=`` argument, :data:`BACKENDS`):

- ``"reference"``: a plain sequential loop over time in torch, obviously correct, the ground
  truth for tests (slow).
- ``"chunked"``: pure torch; time is cut in chunks, each scanned with a log-depth
  (Hillis-Steele) scan on ``[B, chunk, d_inner, d_state]`` and recomputed in backward
  (activation checkpointing), so no ``[B, L, d_inner, d_state]`` tensor for the whole sequence
  exists. Works on any device and dtype; the fallback.
- ``"numba"``: compiled CPU kernels with their own backward
  (:mod:`seqmodels.kernels.numba_ops`; float32 / float64 CPU tensors). Each has the signature
  of the readable op here it replaces and an equivalence test against it.
- ``"cuda"``: mamba-ssm's kernels (:mod:`seqmodels.kernels.cuda_ops`) for CUDA tensors when
  mamba-ssm is importable. Mamba-1's kernel takes neither an initial state nor resets: with
  either, the call runs the ``"chunked"`` scan on the same device.
- ``"auto"``: ``cuda`` for CUDA tensors when mamba-ssm imports, else ``numba`` for float32 /
  float64 CPU tensors when numba imports, else ``chunked``.

Single steps (rollouts): :func:`selective_state_update`, :func:`selective_state_update_gated`
and :func:`ssd_state_update` run their numba kernel on the numba backend when no gradient is
taken, else the readable ``*_reference`` update (the kernels have no backward).

Shapes (batch-first, time-major):

- selective_scan: u, delta ``[B, L, D]``; A ``[D, N]``; Bm, Cm ``[B, L, N]``;
  h0 ``[B, D, N]``; resets ``[B, L]`` bool -> y ``[B, L, D]``, h_last ``[B, D, N]``.
- ssd_scan: x ``[B, L, H, P]``; dt ``[B, L, H]``; A ``[H]``; Bm, Cm ``[B, L, G, N]``;
  h0 ``[B, H, P, N]``; resets ``[B, L]``; D ``[H]`` or ``[H, P]`` -> y ``[B, L, H, P]``,
  h_last ``[B, H, P, N]``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from seqmodels.kernels import cuda_ops, numba_ops
from seqmodels.kernels.cuda_ops import mamba_ssm_available
from seqmodels.kernels.numba_runtime import numba_available

BACKENDS = ("auto", "reference", "chunked", "numba", "cuda")

# Chunk length of the pure-torch chunked scan.
TORCH_CHUNK = 32


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


def _expand_groups(m: Tensor, nheads: int) -> Tensor:
    """[..., G, N] -> [..., H, N]: head h reads group h // (H // G) (mamba-ssm's convention)."""
    ngroups = m.shape[-2]
    return m.repeat_interleave(nheads // ngroups, dim=-2)


def _ssd_skip(y: Tensor, x: Tensor, D: Tensor | None) -> Tensor:
    """y + D * x for x ``[..., H, P]``, D ``[H]`` or ``[H, P]`` (None: y)."""
    if D is None:
        return y
    return y + x * D.to(x.dtype).reshape(x.shape[-2], -1)


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
            h = h.masked_fill(resets[:, t, None, None], 0)
        decay = torch.exp(delta[:, t, :, None] * A)
        h = decay * h + (delta[:, t] * u[:, t])[:, :, None] * Bm[:, t, None, :]
        ys.append((h * Cm[:, t, None, :]).sum(-1))
    y = torch.stack(ys, dim=1) if ys else u.new_zeros(batch, 0, d_inner)
    return y, h


def ssd_scan_reference(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    Bm: Tensor,
    Cm: Tensor,
    h0: Tensor | None = None,
    resets: Tensor | None = None,
    D: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Sequential Mamba2 (SSD) scan, plus ``D * x`` when D is given. Returns (y [B, L, H, P],
    h_last [B, H, P, N])."""
    batch, length, nheads, headdim = x.shape
    d_state = Bm.shape[-1]
    h = x.new_zeros(batch, nheads, headdim, d_state) if h0 is None else h0
    Bh = _expand_groups(Bm, nheads)
    Ch = _expand_groups(Cm, nheads)
    ys = []
    for t in range(length):
        if resets is not None:
            h = h.masked_fill(resets[:, t, None, None, None], 0)
        decay = torch.exp(dt[:, t] * A)[:, :, None, None]
        inp = (dt[:, t, :, None] * x[:, t])[..., None] * Bh[:, t, :, None, :]
        h = decay * h + inp
        ys.append((h * Ch[:, t, :, None, :]).sum(-1))
    y = torch.stack(ys, dim=1) if ys else x.new_zeros(batch, 0, nheads, headdim)
    return _ssd_skip(y, x, D), h


# --------------------------------------------------------------------------------------------
# chunked torch: log-depth scan inside chunks, state carried across chunks, recomputed in bwd
# --------------------------------------------------------------------------------------------


def _all_finite(*tensors: Tensor) -> bool:
    """True when every entry is finite (one sum per tensor; a sum that overflows says False,
    which only costs the caller its slower exact path)."""
    with torch.no_grad():
        return bool(torch.isfinite(sum(t.sum() for t in tensors)))


def _linear_scan(a: Tensor, b: Tensor, h0: Tensor, cut: Tensor | None) -> Tensor:
    """All states of h_t = a_t * h'_{t-1} + b_t over dim 1 (Hillis-Steele, log2(T) steps),
    h'_{t-1} = 0 where ``cut[:, t]`` (a reset at t), else h_{t-1}.

    a broadcasts against b (a may have size-1 trailing dims); h0: b.shape without dim 1; cut
    ``[B, T]`` bool or None. After each pass entry t holds the composition of the steps in its
    window since the latest reset in it (``cut[:, t]``: there is one; the entry then starts
    from zero). What an entry would read from before a reset is replaced (by 0 for b, 1 for a)
    before it is multiplied, never multiplied by 0, so a non-finite value before a reset
    crosses it neither in the outputs nor in the gradients.
    """
    length = b.shape[1]
    if cut is not None:
        cut = cut.view(*cut.shape, *([1] * (b.dim() - 2)))
        if not b.is_cuda and _all_finite(a, b, h0):
            # the common case (checked on CPU only, where the check costs no device sync): a
            # decay of 0 at each reset then drops exactly what came before it, and saves the
            # masking in every pass (~25% of the scan)
            a, cut = a.masked_fill(cut, 0), None
    offset = 1
    while offset < length:
        a_now, a_before, b_before = a[:, offset:], a[:, :-offset], b[:, :-offset]
        if cut is not None:  # entries t - offset, read by the entries t after a reset: none
            cut_now = cut[:, offset:]
            a_before = a_before.masked_fill(cut_now, 1)
            b_before = b_before.masked_fill(cut_now, 0)
            cut = torch.cat([cut[:, :offset], cut_now | cut[:, :-offset]], dim=1)
        b = torch.cat([b[:, :offset], b[:, offset:] + a_now * b_before], dim=1)
        a = torch.cat([a[:, :offset], a_now * a_before], dim=1)
        offset *= 2
    h_before = h0.unsqueeze(1)
    if cut is not None:
        h_before = h_before.masked_fill(cut, 0)
    return b + a * h_before


def _mamba_chunk(
    u: Tensor, delta: Tensor, A: Tensor, Bm: Tensor, Cm: Tensor, cut: Tensor | None, h: Tensor
) -> tuple[Tensor, Tensor]:
    decay = torch.exp(delta[..., None] * A)  # [B, T, D, N]
    inp = (delta * u)[..., None] * Bm[:, :, None, :]
    hs = _linear_scan(decay, inp, h, cut)
    return torch.einsum("btdn,btn->btd", hs, Cm), hs[:, -1]


def _ssd_chunk(
    x: Tensor, dt: Tensor, A: Tensor, Bm: Tensor, Cm: Tensor, cut: Tensor | None, h: Tensor
) -> tuple[Tensor, Tensor]:
    nheads = x.shape[2]
    decay = torch.exp(dt * A)  # [B, T, H]
    Bh = _expand_groups(Bm, nheads)
    Ch = _expand_groups(Cm, nheads)
    inp = (dt[..., None] * x)[..., None] * Bh[:, :, :, None, :]  # [B, T, H, P, N]
    hs = _linear_scan(decay[..., None, None], inp, h, cut)
    return torch.einsum("bthpn,bthn->bthp", hs, Ch), hs[:, -1]


ChunkFn = Callable[..., tuple[Tensor, Tensor]]


def _run_chunks(
    chunk_fn: ChunkFn, seq_args: list[Tensor | None], A: Tensor, h: Tensor, chunk: int
) -> tuple[Tensor, Tensor]:
    length = seq_args[0].shape[1]
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in [*seq_args, A, h]
    )
    ys = []
    for start in range(0, length, chunk):
        u, d, Bm, Cm, cut = (None if t is None else t[:, start : start + chunk] for t in seq_args)
        if needs_grad:
            y, h = checkpoint(chunk_fn, u, d, A, Bm, Cm, cut, h, use_reentrant=False)
        else:
            y, h = chunk_fn(u, d, A, Bm, Cm, cut, h)
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
    *,
    chunk: int = TORCH_CHUNK,
) -> tuple[Tensor, Tensor]:
    """Pure-torch chunked Mamba scan; same contract as :func:`selective_scan_reference`."""
    batch, length, d_inner = u.shape
    h = u.new_zeros(batch, d_inner, A.shape[1]) if h0 is None else h0
    if length == 0:
        return u.new_zeros(batch, 0, d_inner), h
    return _run_chunks(_mamba_chunk, [u, delta, Bm, Cm, resets], A, h, chunk)


def ssd_scan_chunked(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    Bm: Tensor,
    Cm: Tensor,
    h0: Tensor | None = None,
    resets: Tensor | None = None,
    D: Tensor | None = None,
    *,
    chunk: int = TORCH_CHUNK,
) -> tuple[Tensor, Tensor]:
    """Pure-torch chunked Mamba2 scan; same contract as :func:`ssd_scan_reference`."""
    batch, length, nheads, headdim = x.shape
    h = x.new_zeros(batch, nheads, headdim, Bm.shape[-1]) if h0 is None else h0
    if length == 0:
        return x.new_zeros(batch, 0, nheads, headdim), h
    y, h_last = _run_chunks(_ssd_chunk, [x, dt, Bm, Cm, resets], A, h, chunk)
    return _ssd_skip(y, x, D), h_last


# --------------------------------------------------------------------------------------------
# single-step state updates (rollouts): readable references; resets are the caller's (it
# replaces the state rows that reset by zeros first)
# --------------------------------------------------------------------------------------------


def selective_state_update_reference(
    h: Tensor, dt: Tensor, x: Tensor, A: Tensor, Bm: Tensor, Cm: Tensor
) -> tuple[Tensor, Tensor]:
    """One Mamba step: h ``[B, D, N]``, dt (after softplus) and x ``[B, D]``, A ``[D, N]``,
    Bm, Cm ``[B, N]`` -> (new h ``[B, D, N]``, y = C . h ``[B, D]``)."""
    h = torch.exp(dt.unsqueeze(-1) * A) * h + (dt * x).unsqueeze(-1) * Bm.unsqueeze(1)
    return h, torch.einsum("bdn,bn->bd", h, Cm)


def selective_state_update_gated_reference(
    h: Tensor,
    dt: Tensor,
    x: Tensor,
    z: Tensor,
    A: Tensor,
    D: Tensor,
    Bm: Tensor,
    Cm: Tensor,
    dt_bias: Tensor | None = None,
    dt_softplus: bool = False,
) -> tuple[Tensor, Tensor]:
    """The state update of :func:`selective_state_update_reference` followed by the D skip and
    the SiLU gate: y = (C . h + D * x) * silu(z).

    h ``[B, D, N]``; dt, x, z ``[B, D]``; D ``[D]``; A ``[D, N]``; Bm, Cm ``[B, N]`` -> (new h
    ``[B, D, N]``, gated y ``[B, D]``). The step size is ``dt + dt_bias`` (``dt_bias [D]`` or
    None), passed through softplus when ``dt_softplus`` (mamba-ssm's ``selective_state_update``
    convention).
    """
    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)
    if dt_softplus:
        dt = F.softplus(dt)
    h, y = selective_state_update_reference(h, dt, x, A, Bm, Cm)
    return h, (y + D.to(x.dtype) * x) * F.silu(z)


def ssd_state_update_reference(
    h: Tensor, dt: Tensor, x: Tensor, A: Tensor, Bm: Tensor, Cm: Tensor
) -> tuple[Tensor, Tensor]:
    """One Mamba2 step: h ``[B, H, P, N]``, dt ``[B, H]`` (after softplus), x ``[B, H, P]``,
    A ``[H]``, Bm, Cm ``[B, G, N]`` -> (new h, y = C . h ``[B, H, P]``)."""
    nheads = h.shape[1]
    Bh = _expand_groups(Bm, nheads)  # [B, H, N]
    Ch = _expand_groups(Cm, nheads)
    decay = torch.exp(dt * A)[:, :, None, None]
    h = decay * h + (dt[:, :, None] * x).unsqueeze(-1) * Bh.unsqueeze(2)
    return h, torch.einsum("bhpn,bhn->bhp", h, Ch)


def use_step_kernel(backend: str, tensors: list[Tensor]) -> bool:
    """Whether a single-step op runs its numba kernel: on the numba backend (``backend``
    resolved for ``tensors[0]``) when no gradient is being taken (the kernels have none)."""
    name = resolve_backend(backend, tensors[0].device, tensors[0].dtype)
    if name != "numba":
        return False
    return not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))


def selective_state_update(
    h: Tensor, dt: Tensor, x: Tensor, A: Tensor, Bm: Tensor, Cm: Tensor, backend: str = "auto"
) -> tuple[Tensor, Tensor]:
    """:func:`selective_state_update_reference`, on its numba kernel where
    :func:`use_step_kernel` says so."""
    if use_step_kernel(backend, [h, dt, x, A, Bm, Cm]):
        return numba_ops.selective_state_update_numba(h, dt, x, A, Bm, Cm)
    return selective_state_update_reference(h, dt, x, A, Bm, Cm)


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
    """:func:`selective_state_update_gated_reference`, on its numba kernel where
    :func:`use_step_kernel` says so (rollouts)."""
    tensors = [h, dt, x, z, A, D, Bm, Cm] + ([] if dt_bias is None else [dt_bias])
    fn = (
        numba_ops.selective_state_update_gated_numba
        if use_step_kernel(backend, tensors)
        else selective_state_update_gated_reference
    )
    return fn(h, dt, x, z, A, D, Bm, Cm, dt_bias, dt_softplus)


def ssd_state_update(
    h: Tensor, dt: Tensor, x: Tensor, A: Tensor, Bm: Tensor, Cm: Tensor, backend: str = "auto"
) -> tuple[Tensor, Tensor]:
    """:func:`ssd_state_update_reference`, on its numba kernel where :func:`use_step_kernel`
    says so."""
    if use_step_kernel(backend, [h, dt, x, A, Bm, Cm]):
        return numba_ops.ssd_state_update_numba(h, dt, x, A, Bm, Cm)
    return ssd_state_update_reference(h, dt, x, A, Bm, Cm)


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
    if name == "cuda" and h0 is None and resets is None:
        return cuda_ops.selective_scan_cuda(u, delta, A, Bm, Cm)
    if name == "reference":
        return selective_scan_reference(u, delta, A, Bm, Cm, h0, resets)
    if name == "numba":
        return numba_ops.selective_scan_numba(u, delta, A, Bm, Cm, h0, resets)
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
            kernels.

    Returns:
        y ``[B, L, H, P]`` (``C . h``, plus ``D * x`` when D is given) and the last state
        ``[B, H, P, N]``.
    """
    name = resolve_backend(backend, x.device, x.dtype)
    if name == "numba":
        return numba_ops.ssd_scan_numba(x, dt, A, Bm, Cm, h0, resets, D)
    if name == "reference":
        return ssd_scan_reference(x, dt, A, Bm, Cm, h0, resets, D)
    if name == "cuda":
        return cuda_ops.ssd_scan_cuda(x, dt, A, Bm, Cm, h0, resets, D, chunk_size=chunk_size)
    return ssd_scan_chunked(x, dt, A, Bm, Cm, h0, resets, D, chunk=chunk_size)


__all__ = [
    "BACKENDS",
    "TORCH_CHUNK",
    "mamba_ssm_available",
    "numba_available",
    "resolve_backend",
    "selective_scan",
    "selective_scan_chunked",
    "selective_scan_reference",
    "selective_state_update",
    "selective_state_update_gated",
    "selective_state_update_gated_reference",
    "selective_state_update_reference",
    "ssd_scan",
    "ssd_scan_chunked",
    "ssd_scan_reference",
    "ssd_state_update",
    "ssd_state_update_reference",
    "use_step_kernel",
]
