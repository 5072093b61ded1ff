"""The rollout conv kernels (kernels.numba.conv.conv_step_silu and
kernels.numba.block_step.mamba_step_fused, through conv.conv_silu_step_row) have an unrolled
branch for d_conv = 4 and a general loop for other widths: both branches against the torch
reference ops, in float32 and float64, with resets (rows carrying NaN states)."""

from __future__ import annotations

import pytest
import torch

from seqmodels import Mamba, ops
from seqmodels.kernels import numba_ops

WIDTHS = [2, 3, 4, 5]
DTYPES = {"float32": (torch.float32, 2e-5), "float64": (torch.float64, 1e-12)}


def _randn(*shape, seed: int, dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("conv_bias", [True, False])
def test_conv_step_silu_numba_matches_reference(width, dtype_name, conv_bias):
    dtype, tol = DTYPES[dtype_name]
    B, C = 6, 13
    conv_state = _randn(B, C, width, seed=1, dtype=dtype)
    x = _randn(B, C, seed=2, dtype=dtype)
    weight = _randn(C, 1, width, seed=3, dtype=dtype)
    bias = _randn(C, seed=4, dtype=dtype) if conv_bias else None
    got = numba_ops.conv_step_silu_numba(conv_state, x, weight, bias)
    want = ops.conv_step_silu_reference(conv_state, x, weight, bias)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("width", WIDTHS)
def test_mamba_step_numba_matches_reference(width, dtype_name):
    # rows 1 and 4 reset and carry NaN states: their outputs must come from zero states
    dtype, tol = DTYPES[dtype_name]
    B, D, N, R = 6, 11, 4, 3
    xz = _randn(B, 2 * D, seed=1, dtype=dtype)
    conv_state = _randn(B, D, width, seed=2, dtype=dtype)
    ssm_state = _randn(B, D, N, seed=3, dtype=dtype)
    reset = torch.tensor([False, True, False, False, True, False])
    conv_state[reset], ssm_state[reset] = float("nan"), float("nan")
    conv = (_randn(D, 1, width, seed=4, dtype=dtype), _randn(D, seed=5, dtype=dtype))
    x_proj_weight = _randn(R + 2 * N, D, seed=6, dtype=dtype)
    dt_proj = (_randn(D, R, seed=7, dtype=dtype) * 0.3, _randn(D, seed=8, dtype=dtype))
    A = -torch.rand(D, N, generator=torch.Generator().manual_seed(9)).to(dtype) - 0.1
    Dv = _randn(D, seed=10, dtype=dtype)
    args = (xz, conv_state, ssm_state, reset, conv, x_proj_weight, dt_proj, A, Dv)
    got, want = numba_ops.mamba_step_numba(*args), ops.mamba_step_reference(*args)
    for g, w in zip(got, want, strict=True):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, w, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("width", WIDTHS)
def test_mamba_block_step_numba_matches_reference(width, dtype_name):
    # Mamba.step's rollout path (mamba_step_numba_views: A = -exp(A_log) in the kernel) over a
    # few steps, so the conv state carries older inputs through the shift
    dtype, tol = DTYPES[dtype_name]
    torch.manual_seed(0)
    m = Mamba(d_model=8, d_state=4, d_conv=width, dtype=dtype, backend="numba")
    B, T = 5, 7
    xs = _randn(T, B, 8, seed=11, dtype=dtype)
    resets = torch.rand(T, B, generator=torch.Generator().manual_seed(12)) < 0.25
    states = {}
    with torch.no_grad():
        for backend in ("numba", "reference"):
            m.backend = backend
            state, ys = m.initial_state(B), []
            for t in range(T):
                y, state = m.step(xs[t], state, resets[t])
                ys.append(y)
            states[backend] = (torch.stack(ys), *state)
    for g, w in zip(states["numba"], states["reference"], strict=True):
        torch.testing.assert_close(g, w, rtol=tol, atol=tol)
