"""Mamba2.step's rollout path (``kernels.numba.block_step.mamba2_step_fused`` on cached
parameter views) against its readable twin, the general path (the same module on the
"reference" backend: torch ops for the conv step, the SSD state update and the gated norm), and
a step loop against forward.
"""

from __future__ import annotations

import copy

import pytest
import torch

from seqmodels import Mamba2
from seqmodels.kernels import numba_available

pytestmark = pytest.mark.skipif(not numba_available(), reason="the fused step needs numba")

F64 = torch.float64
TOL = {torch.float32: 1e-5, F64: 1e-12}

# block configurations (d_model=32, d_state=8, headdim=8 unless given: nheads = 8)
CONFIGS = {
    "default": {},
    "ngroups2": {"ngroups": 2},
    "no_rmsnorm": {"rmsnorm": False},
    "norm_before_gate": {"norm_before_gate": True},
    "d_mlp": {"d_ssm": 32},  # d_inner = 64: 32 gated-MLP channels
    "D_has_hdim_ngroups4": {"D_has_hdim": True, "ngroups": 4},
    "dt_limit": {"dt_limit": (0.02, 0.08)},
    "d_conv3_no_bias": {"d_conv": 3, "conv_bias": False, "bias": True},
}


def _block(dtype: torch.dtype, seed: int = 0, **kw) -> Mamba2:
    """A Mamba2 block on the numba backend with every step parameter moved off its init (D
    ones, norm weight ones and conv bias would hide a missing term)."""
    torch.manual_seed(seed)
    args = {"d_state": 8, "headdim": 8, "backend": "numba", **kw}
    m = Mamba2(32, **args).to(dtype)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return m


def _twin(m: Mamba2) -> Mamba2:
    """The same block on the reference backend: Mamba2.step's general path, torch ops only."""
    twin = copy.deepcopy(m)
    twin.backend = "reference"
    return twin


def _assert_close(got, want, tol):
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, F64], ids=["f32", "f64"])
@pytest.mark.parametrize("batch", [1, 6])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_fused_step_matches_general_path_across_resets(name, batch, dtype):
    # 10 steps with resets; the rows that reset hold NaN before (a reset replaces the state)
    m = _block(dtype, **CONFIGS[name])
    twin = _twin(m)
    tol = TOL[dtype]
    gen = torch.Generator().manual_seed(1)
    state = twin_state = m.initial_state(batch)
    with torch.no_grad():
        for t in range(10):
            x = torch.randn(batch, 32, generator=gen, dtype=dtype)
            reset = torch.rand(batch, generator=gen) < 0.3 if t else None
            if reset is not None and reset.any():
                state = tuple(s.clone() for s in state)
                for s in state:
                    s[reset] = float("nan")
                twin_state = state
            y, state = m.step(x, state, reset)
            assert m._step_views_cache is not None  # the fused path ran
            y_twin, twin_state = twin.step(x, twin_state, reset)
            assert torch.isfinite(y).all()
            _assert_close(y, y_twin, tol)
            for got, want in zip(state, twin_state, strict=True):
                assert got.dtype == dtype
                _assert_close(got, want, tol)


def test_fused_step_leaves_input_states_unmodified():
    m = _block(F64)
    state = tuple(torch.randn_like(s) for s in m.initial_state(4))
    before = tuple(s.clone() for s in state)
    with torch.no_grad():
        m.step(torch.randn(4, 32, dtype=F64), state, torch.tensor([True, False, True, False]))
    for s, b in zip(state, before, strict=True):
        torch.testing.assert_close(s, b, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["default", "d_mlp", "norm_before_gate", "ngroups2"])
def test_step_loop_matches_forward_with_resets(name):
    # float64: the fused step, step after step, reproduces forward (numba scan kernels) from a
    # non-zero initial state over a sequence with resets
    m = _block(F64, seed=2, **CONFIGS[name])
    batch, length = 5, 12
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(batch, length, 32, generator=gen, dtype=F64)
    resets = torch.rand(batch, length, generator=gen) < 0.15
    resets[0, 0] = True
    state0 = tuple(
        0.5 * torch.randn(s.shape, generator=gen, dtype=F64) for s in m.initial_state(batch)
    )
    with torch.no_grad():
        y_seq, state_seq = m(x, state0, resets)
        state, ys = state0, []
        for t in range(length):
            y, state = m.step(x[:, t], state, resets[:, t])
            ys.append(y)
    assert m._step_views_cache is not None
    _assert_close(torch.stack(ys, dim=1), y_seq, 1e-12)
    for got, want in zip(state, state_seq, strict=True):
        _assert_close(got, want, 1e-12)


def test_grad_enabled_step_takes_the_general_path():
    m = _block(F64)
    x = torch.randn(3, 32, dtype=F64)
    y, _ = m.step(x, m.initial_state(3))
    assert m._step_views_cache is None and y.requires_grad
    y.sum().backward()
    assert m.A_log.grad is not None


def test_fused_step_reads_parameters_updated_in_place_or_replaced():
    # the cached views follow an optimizer step (in place: every step parameter moves) and a
    # replaced tensor (.data = ..., module.to): each step uses the current weights
    m = _block(F64, seed=4)
    batch = 4
    x = torch.randn(batch, 32, dtype=F64)
    state = tuple(torch.randn_like(s) for s in m.initial_state(batch))
    opt = torch.optim.Adam(m.parameters(), lr=0.05)
    for _ in range(3):
        with torch.no_grad():
            y, _ = m.step(x, state)
            _assert_close(y, _twin(m).step(x, state)[0], 1e-12)
        out, _ = m(x[:, None], state)
        opt.zero_grad()
        out.square().sum().backward()
        opt.step()
        with torch.no_grad():
            y_new, _ = m.step(x, state)
        assert not torch.allclose(y_new, y)
        _assert_close(y_new, _twin(m).step(x, state)[0], 1e-12)
    with torch.no_grad():
        m.A_log.data = m.A_log.data * 0.5  # a new tensor
        m.norm.weight.data = torch.randn_like(m.norm.weight)
        y, _ = m.step(x, state)
        _assert_close(y, _twin(m).step(x, state)[0], 1e-12)
        m.float()
        y32, _ = m.step(x.float(), tuple(s.float() for s in state))
        _assert_close(y32.double(), y, 1e-4)
