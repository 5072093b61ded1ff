"""The numba Mamba block's backward reuses its own temporaries (the scan input's gradient over
the out_proj input's gradient, the conv input's gradient over the recomputed out_proj input):
a second backward through the same graph (retain_graph) must see the saved tensors unchanged
and give the reference's gradients again."""

from __future__ import annotations

import pytest
import torch

from seqmodels import Mamba, ops
from seqmodels.kernels import numba_ops

pytest.importorskip("numba")

F64 = torch.float64


@pytest.mark.parametrize("windowed", [False, True])
def test_mamba_block_numba_second_backward_matches_reference(windowed, monkeypatch):
    monkeypatch.setattr(numba_ops, "MAMBA_WINDOWED_MIN_TOKENS", 0 if windowed else 10**9)
    monkeypatch.setattr(numba_ops, "MAMBA_BLOCK_TOKENS", 14)  # windows of 7 steps
    monkeypatch.setattr(numba_ops, "NUMBA_CHECKPOINT_EVERY", 4)
    torch.manual_seed(0)
    m = Mamba(d_model=6, d_state=3, dt_rank=2, dtype=F64)
    gen = torch.Generator().manual_seed(1)
    B, L = 2, 17
    x = torch.randn(B, L, 6, generator=gen, dtype=F64).requires_grad_(True)
    conv0 = torch.randn(B, m.d_inner, m.d_conv, generator=gen, dtype=F64)
    ssm0 = torch.randn(B, m.d_inner, m.d_state, generator=gen, dtype=F64)
    resets = torch.rand(B, L, generator=gen) < 0.2
    leaves = [x, *m.parameters()]
    weight = torch.randn(B, L, 6, generator=gen, dtype=F64)  # a dout that is not expanded

    def forward(fn):
        A = -torch.exp(m.A_log.to(F64))
        out, _, _ = fn(
            x, conv0, ssm0, resets, (m.in_proj.weight, m.in_proj.bias),
            (m.conv1d.weight, m.conv1d.bias), m.x_proj.weight,
            (m.dt_proj.weight, m.dt_proj.bias), A, m.D.to(F64),
            (m.out_proj.weight, m.out_proj.bias),
        )  # fmt: skip
        return (out * weight).sum()

    want = torch.autograd.grad(forward(ops.mamba_block_reference), leaves)
    loss = forward(numba_ops.mamba_block_numba)
    first = torch.autograd.grad(loss, leaves, retain_graph=True)
    second = torch.autograd.grad(loss, leaves)
    for g1, g2, w in zip(first, second, want, strict=True):
        torch.testing.assert_close(g1, w, rtol=1e-9, atol=1e-10)
        torch.testing.assert_close(g2, w, rtol=1e-9, atol=1e-10)
