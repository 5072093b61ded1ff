"""mamba-ssm's CUDA kernels behind seqmodels' ``cuda`` backend (mamba-ssm imported lazily, only
when CUDA is present; importing this module never needs mamba-ssm, triton or CUDA).

Twins (same signature, :mod:`seqmodels.scan`): ``selective_scan_cuda`` ~
``selective_scan_reference``, ``ssd_scan_cuda`` ~ ``ssd_scan_reference`` (plus the kernel's
keyword-only ``chunk_size``); equivalence tests in ``tests/test_seqmodels.py`` (GPU only).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor


@functools.lru_cache(maxsize=1)
def _mamba_ssm_ops() -> dict[str, Any] | None:
    """mamba-ssm's CUDA ops, or None when mamba-ssm (or triton, or CUDA) is unavailable."""
    if not torch.cuda.is_available():
        return None
    try:  # optional dependency ([cuda] extra)
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


def _ops() -> dict[str, Any]:
    ops = _mamba_ssm_ops()
    if ops is None:
        raise RuntimeError(
            "the cuda backend needs CUDA and mamba-ssm: pip install 'coopsearch[cuda]' (mamba-ssm)"
        )
    return ops


def selective_scan_cuda(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    Bm: Tensor,
    Cm: Tensor,
    h0: Tensor | None = None,
    resets: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """mamba-ssm's ``selective_scan_fn`` with the contract of ``selective_scan_reference``
    (u, delta ``[B, L, D]``; A ``[D, N]``; Bm, Cm ``[B, L, N]`` -> y ``[B, L, D]``, h_last
    ``[B, D, N]``). The kernel honours neither an initial state nor resets: h0 and resets must
    be None (``seqmodels.scan.selective_scan`` runs the chunked path for those)."""
    if h0 is not None or resets is not None:
        raise ValueError(
            "selective_scan_cuda: mamba-ssm's kernel takes no initial state or resets "
            "(seqmodels.scan.selective_scan falls back to the chunked scan for them)"
        )
    y, h_last = _ops()["selective_scan_fn"](
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
    D: Tensor | None = None,
    *,
    chunk_size: int = 256,
) -> tuple[Tensor, Tensor]:
    """mamba-ssm's ``mamba_chunk_scan_combined`` with the contract of ``ssd_scan_reference``:
    initial state via ``initial_states``, resets via ``seq_idx`` (the cumulative reset count:
    the state does not cross a change of it); the D skip added in torch."""
    seq_idx = None
    if resets is not None:
        seq_idx = torch.cumsum(resets.to(torch.int32), dim=1).to(torch.int32).contiguous()
    y, h_last = _ops()["mamba_chunk_scan_combined"](
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
    y = y.to(x.dtype)
    if D is not None:
        y = y + x * D.to(x.dtype).reshape(x.shape[2], -1)
    return y, h_last.to(x.dtype)


__all__ = ["mamba_ssm_available", "selective_scan_cuda", "ssd_scan_cuda"]
