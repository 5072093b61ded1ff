"""Mamba and Mamba2 blocks, state-dict compatible with ``mamba_ssm.Mamba`` / ``mamba_ssm.Mamba2``.

Constructor arguments, parameter names, shapes and initialisation follow mamba-ssm
(``mamba_ssm/modules/mamba_simple.py`` and ``mamba_ssm/modules/mamba2.py``), so a state dict
loads in either direction. What differs is the interface, made for recurrent RL policies:

- ``forward(x [B, L, d_model], state=None, resets=None [B, L] bool) -> (y [B, L, d_model],
  state)``: runs from a given state (zeros when None) and returns the state after the last step.
- ``step(x [B, d_model], state=None, reset=None [B] bool) -> (y [B, d_model], state)``.
- ``initial_state(batch_size) -> (conv_state, ssm_state)``, zeros, laid out as mamba-ssm's
  inference cache: Mamba ``([B, d_inner, d_conv], [B, d_inner, d_state])``; Mamba2
  ``([B, d_ssm + 2 * ngroups * d_state, d_conv], [B, nheads, headdim, d_state])``.

``resets[b, t]`` true: a new episode starts at t in row b. Nothing before t influences the
outputs at t or later: the SSM state is dropped and the causal convolution does not read inputs
from before t (its taps that cross a reset are masked). States are never modified in place.

The scan backend (``backend=`` constructor argument or the ``backend`` attribute) is one of
:data:`seqmodels.scan.BACKENDS`; see :mod:`seqmodels.scan`. Each forward is written as the
composition of readable ops (:mod:`seqmodels.ops`, :mod:`seqmodels.scan`) whose dispatchers
run their fused numba twins on the numba backend (CPU); Mamba's forward has instead one fused
branch on the numba backend, as mamba-ssm's ``mamba_simple.py``: the whole block is one
autograd Function (``mamba_block_numba``, twin ``ops.mamba_block_reference``), which from
``kernels.numba_ops.MAMBA_WINDOWED_MIN_TOKENS`` tokens on runs in time windows and keeps no
``[B, L, d_inner]`` activation.

Inputs must have the dtype of the module's parameters (a clear ValueError otherwise), except
under ``torch.autocast``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from torch import Tensor, nn

from seqmodels.kernels import numba_ops
from seqmodels.ops import (
    causal_conv_silu,
    conv_step_silu,
    group_rmsnorm,
    mamba_inner,
    mamba_step,
    masked_causal_conv,
    rmsnorm_gated,
    rmsnorm_gated_reference,
)
from seqmodels.scan import (
    BACKENDS,
    TORCH_CHUNK,
    resolve_backend,
    ssd_scan,
    ssd_state_update,
)

State = tuple[Tensor, Tensor]


# --------------------------------------------------------------------------------------------
# shared helpers: input validation, resets
# --------------------------------------------------------------------------------------------


def _check_x(x: object, d_model: int, rank: int, name: str, param_dtype: torch.dtype) -> Tensor:
    """x as a tensor of shape ``[B, L, d_model]`` (rank 3) or ``[B, d_model]`` (rank 2) and
    of the parameters' dtype (any floating dtype under ``torch.autocast``)."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != rank:
        shape = "[B, L, d_model]" if rank == 3 else "[B, d_model]"
        raise ValueError(f"{name} must have shape {shape} (rank {rank}), got {tuple(x.shape)}")
    if x.shape[-1] != d_model:
        raise ValueError(f"{name}'s last dimension must be d_model={d_model}, got {x.shape[-1]}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {x.dtype}")
    if x.dtype != param_dtype and not torch.is_autocast_enabled(x.device.type):
        raise ValueError(
            f"{name} has dtype {x.dtype} but the module's parameters are {param_dtype}: convert "
            f"the input ({name}.to({param_dtype})) or the module (module.to({x.dtype}))"
        )
    return x


def _zero_rows(state: Tensor, reset: Tensor) -> Tensor:
    """state ``[B, ...]`` with the rows where ``reset [B]`` is true replaced by zeros (a
    replacement, not a product: a NaN or inf in a reset row does not survive)."""
    return state.masked_fill(reset.view(reset.shape[0], *([1] * (state.dim() - 1))), 0)


def _check_resets(resets: object, shape: tuple[int, ...], name: str) -> Tensor | None:
    """None, or a bool tensor of exactly ``shape`` (integer 0/1 tensors are converted)."""
    if resets is None:
        return None
    if not isinstance(resets, Tensor):
        raise TypeError(f"{name} must be a bool torch.Tensor or None, got {type(resets).__name__}")
    if tuple(resets.shape) != tuple(shape):
        raise ValueError(
            f"{name} must have shape {list(shape)} (batch-first, one flag per step), "
            f"got {list(resets.shape)}"
        )
    if resets.dtype == torch.bool:
        return resets
    if resets.is_floating_point() or resets.is_complex():
        raise TypeError(f"{name} must be a bool (or integer 0/1) tensor, got {resets.dtype}")
    return resets != 0


def _check_state(state: object, expected: Sequence[tuple[int, ...]], batch: int) -> State:
    if not isinstance(state, (tuple, list)) or len(state) != 2:
        raise TypeError(
            "state must be a tuple (conv_state, ssm_state) as returned by initial_state/forward/"
            f"step, got {type(state).__name__}"
            + (f" of length {len(state)}" if isinstance(state, (tuple, list)) else "")
        )
    names = ("conv_state", "ssm_state")
    for name, tensor, shape in zip(names, state, expected, strict=True):
        if not isinstance(tensor, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
        want = (batch, *shape)
        if tuple(tensor.shape) != want:
            raise ValueError(
                f"{name} has shape {list(tensor.shape)}, expected {list(want)} for this module "
                "(a state from another configuration or batch size?)"
            )
    return state[0], state[1]


def _inv_softplus_dt(n: int, dt_min: float, dt_max: float, dt_init_floor: float, **factory):
    dt = torch.exp(
        torch.rand(n, **factory) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)
    ).clamp(min=dt_init_floor)
    return dt + torch.log(-torch.expm1(-dt))  # inverse of softplus


def _step_backend(backend: str, x: Tensor) -> str:
    """Backend for the single-step update: the cuda scan backend has no step kernel here, so
    steps on CUDA use torch ops ("chunked"); "numba" and "reference" are kept as chosen."""
    return "chunked" if backend in ("cuda", "auto") and x.is_cuda else backend


def _cached_step_views(
    block: nn.Module,
    backend: str,
    x: Tensor,
    params: tuple[Tensor | None, ...],
    build: Callable[[], tuple | None],
) -> tuple | None:
    """The step kernel's parameter views of ``block`` (Mamba or Mamba2), cached in
    ``block._step_views_cache`` keyed on the ``data_ptr`` of ``params`` (the conv weight
    first; None entries allowed): ``build()`` on a miss; None where the step takes the general
    path (backend not numba for x, conv weight not of x's dtype, or ``build`` says so)."""
    conv_w = params[0]
    assert conv_w is not None
    if conv_w.dtype != x.dtype or resolve_backend(backend, x.device, x.dtype) != "numba":
        return None
    key = tuple(0 if t is None else t.data_ptr() for t in params)
    cached = block._step_views_cache
    if cached is not None and cached[0] == key:
        return cached[1]
    views = build()
    block._step_views_cache = None if views is None else (key, views)
    return views


def _check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return backend


def _check_positive_ints(**values: object) -> None:
    """A ValueError naming the first of ``values`` (in order) that is not a positive int."""
    for name, value in values.items():
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")


def _check_dt_range(dt_min: float, dt_max: float) -> None:
    """A ValueError unless ``0 < dt_min <= dt_max`` (the range of the initial step sizes)."""
    if not 0 < dt_min <= dt_max:
        raise ValueError(f"need 0 < dt_min <= dt_max, got dt_min={dt_min}, dt_max={dt_max}")


# --------------------------------------------------------------------------------------------
# Mamba (mamba_simple.py)
# --------------------------------------------------------------------------------------------


class Mamba(nn.Module):
    """Mamba block (selective SSM with per-channel A), as ``mamba_ssm.Mamba``.

    Args (mamba-ssm's, same defaults): d_model, d_state=16, d_conv=4, expand=2, dt_rank="auto"
    (ceil(d_model / 16)), dt_min=0.001, dt_max=0.1, dt_init="random" | "constant",
    dt_scale=1.0, dt_init_floor=1e-4, conv_bias=True, bias=False, use_fast_path=True (only
    meaningful for the cuda backend, where mamba-ssm's fused kernel is not used because it
    returns no state; kept for signature compatibility), layer_idx=None, device=None,
    dtype=None. Ours: backend="auto" (see :mod:`seqmodels.scan`).

    Parameters: in_proj ``[2*d_inner, d_model]``, conv1d ``[d_inner, 1, d_conv]`` (+ bias),
    x_proj ``[dt_rank + 2*d_state, d_inner]``, dt_proj ``[d_inner, dt_rank]`` + bias,
    A_log ``[d_inner, d_state]``, D ``[d_inner]``, out_proj ``[d_model, d_inner]``.
    """

    def __init__(
        self,
        d_model: int,
        d_state: int = 16,
        d_conv: int = 4,
        expand: float = 2,
        dt_rank: int | str = "auto",
        dt_min: float = 0.001,
        dt_max: float = 0.1,
        dt_init: str = "random",
        dt_scale: float = 1.0,
        dt_init_floor: float = 1e-4,
        conv_bias: bool = True,
        bias: bool = False,
        use_fast_path: bool = True,
        layer_idx: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        backend: str = "auto",
    ) -> None:
        factory = {"device": device, "dtype": dtype}
        super().__init__()
        _check_positive_ints(d_model=d_model, d_state=d_state, d_conv=d_conv)
        if dt_rank != "auto" and (not isinstance(dt_rank, int) or dt_rank < 1):
            raise ValueError(f"dt_rank must be 'auto' or a positive int, got {dt_rank!r}")
        if dt_init not in ("random", "constant"):
            raise ValueError(f"dt_init must be 'random' or 'constant', got {dt_init!r}")
        _check_dt_range(dt_min, dt_max)
        self.d_model = d_model
        self.d_state = d_state
        self.d_conv = d_conv
        self.expand = expand
        self.d_inner = int(expand * d_model)
        if self.d_inner < 1:
            raise ValueError(f"expand * d_model must be >= 1, got {expand} * {d_model}")
        self.dt_rank = math.ceil(d_model / 16) if dt_rank == "auto" else dt_rank
        self.use_fast_path = use_fast_path
        self.layer_idx = layer_idx
        self.backend = _check_backend(backend)

        self.in_proj = nn.Linear(d_model, self.d_inner * 2, bias=bias, **factory)
        self.conv1d = nn.Conv1d(
            self.d_inner,
            self.d_inner,
            kernel_size=d_conv,
            groups=self.d_inner,
            padding=d_conv - 1,
            bias=conv_bias,
            **factory,
        )
        self.activation = "silu"
        self.act = nn.SiLU()
        self.x_proj = nn.Linear(self.d_inner, self.dt_rank + 2 * d_state, bias=False, **factory)
        self.dt_proj = nn.Linear(self.dt_rank, self.d_inner, bias=True, **factory)

        dt_init_std = self.dt_rank**-0.5 * dt_scale
        if dt_init == "constant":
            nn.init.constant_(self.dt_proj.weight, dt_init_std)
        else:
            nn.init.uniform_(self.dt_proj.weight, -dt_init_std, dt_init_std)
        with torch.no_grad():
            self.dt_proj.bias.copy_(
                _inv_softplus_dt(self.d_inner, dt_min, dt_max, dt_init_floor, **factory)
            )
        self.dt_proj.bias._no_reinit = True  # type: ignore[attr-defined]

        # S4D real initialisation, A_log kept in float32 (as mamba-ssm)
        A = repeat(
            torch.arange(1, d_state + 1, dtype=torch.float32, device=device),
            "n -> d n",
            d=self.d_inner,
        ).contiguous()
        self.A_log = nn.Parameter(torch.log(A))
        self.A_log._no_weight_decay = True  # type: ignore[attr-defined]
        self.D = nn.Parameter(torch.ones(self.d_inner, device=device))
        self.D._no_weight_decay = True  # type: ignore[attr-defined]
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=bias, **factory)
        # (parameter data_ptrs, numpy views of the step kernel's parameters): see _step_views
        self._step_views_cache: tuple[tuple[int, ...], tuple] | None = None

    # -- state -----------------------------------------------------------------------------

    def _state_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return (self.d_inner, self.d_conv), (self.d_inner, self.d_state)

    def initial_state(
        self,
        batch_size: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> State:
        """Zero state ``(conv_state [B, d_inner, d_conv], ssm_state [B, d_inner, d_state])``."""
        if not isinstance(batch_size, int) or batch_size < 0:
            raise ValueError(f"batch_size must be a non-negative int, got {batch_size!r}")
        device = self.out_proj.weight.device if device is None else device
        conv_dtype = self.conv1d.weight.dtype if dtype is None else dtype
        ssm_dtype = self.dt_proj.weight.dtype if dtype is None else dtype
        conv_shape, ssm_shape = self._state_shapes()
        return (
            torch.zeros(batch_size, *conv_shape, device=device, dtype=conv_dtype),
            torch.zeros(batch_size, *ssm_shape, device=device, dtype=ssm_dtype),
        )

    # -- forward ---------------------------------------------------------------------------

    def forward(
        self, x: Tensor, state: State | None = None, resets: Tensor | None = None
    ) -> tuple[Tensor, State]:
        """Sequence mode.

        Args:
            x: ``[B, L, d_model]``.
            state: ``(conv_state [B, d_inner, d_conv], ssm_state [B, d_inner, d_state])`` or
                None (zeros).
            resets: ``[B, L]`` bool or None; true where a new episode starts.

        Returns:
            y ``[B, L, d_model]`` and the state after the last step.
        """
        x = _check_x(x, self.d_model, 3, "x", self.in_proj.weight.dtype)
        batch, length, _ = x.shape
        resets = _check_resets(resets, (batch, length), "resets")
        if state is None:
            conv_state, ssm_state = self.initial_state(batch, device=x.device, dtype=x.dtype)
            h0 = None
        else:
            conv_state, ssm_state = _check_state(state, self._state_shapes(), batch)
            h0 = ssm_state.to(x.dtype)
        A = -torch.exp(self.A_log.to(x.dtype))
        backend = resolve_backend(self.backend, x.device, x.dtype)
        if backend == "numba" and batch * length > 0:
            # fused branch: the whole block as one autograd Function (in time windows that keep
            # no [B, L, d_inner] activation from MAMBA_WINDOWED_MIN_TOKENS tokens on)
            out, new_conv, h_last = numba_ops.mamba_block_numba(
                x,
                conv_state,
                ssm_state if h0 is None else h0,
                resets,
                (self.in_proj.weight, self.in_proj.bias),
                (self.conv1d.weight, self.conv1d.bias),
                self.x_proj.weight,
                (self.dt_proj.weight, self.dt_proj.bias),
                A,
                self.D,
                (self.out_proj.weight, self.out_proj.bias),
            )
            return out, (new_conv.to(conv_state.dtype), h_last.to(ssm_state.dtype))
        # composed branch (its ops run their fused numba twins on the numba backend)
        xs, z = self.in_proj(x).chunk(2, dim=-1)  # [B, L, d_inner] each
        xs, new_conv = causal_conv_silu(
            xs, conv_state, self.conv1d.weight, self.conv1d.bias, resets, backend
        )
        dt, Bm, Cm = self.x_proj(xs).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        y, h_last = mamba_inner(
            xs, dt, self.dt_proj.weight, self.dt_proj.bias, A, Bm, Cm, z, self.D, h0, resets,
            backend,
        )  # fmt: skip
        return self.out_proj(y), (new_conv, h_last.to(ssm_state.dtype))

    def step(
        self, x: Tensor, state: State | None = None, reset: Tensor | None = None
    ) -> tuple[Tensor, State]:
        """One step (rollouts). x ``[B, d_model]``, state as :meth:`initial_state`, reset
        ``[B]`` bool (zero that row's state first). Returns (y ``[B, d_model]``, new state)."""
        x = _check_x(x, self.d_model, 2, "x", self.in_proj.weight.dtype)
        batch = x.shape[0]
        reset = _check_resets(reset, (batch,), "reset")
        if state is None:
            conv_state, ssm_state = self.initial_state(batch, device=x.device, dtype=x.dtype)
        else:
            conv_state, ssm_state = _check_state(state, self._state_shapes(), batch)
        # in_proj, then the rest of the block but out_proj in one numba kernel on CPU (resets,
        # conv + SiLU, x_proj, softplus(dt_proj), state update, D skip, gate), then out_proj
        xz = F.linear(x, self.in_proj.weight, self.in_proj.bias)
        backend = _step_backend(self.backend, x)
        same_dtype = conv_state.dtype == ssm_state.dtype == xz.dtype == x.dtype
        if same_dtype and not torch.is_grad_enabled():
            views = self._step_views(backend, x)
            if views is not None:  # rollouts: mamba_step's numba twin on cached views
                y, conv_state, ssm_state = numba_ops.mamba_step_numba_views(
                    xz, conv_state, ssm_state, reset, views
                )
                return F.linear(y, self.out_proj.weight, self.out_proj.bias), (
                    conv_state,
                    ssm_state,
                )
        y, conv_state, ssm_state = mamba_step(
            xz,
            conv_state,
            ssm_state,
            reset,
            (self.conv1d.weight, self.conv1d.bias),
            self.x_proj.weight,
            (self.dt_proj.weight, self.dt_proj.bias),
            -torch.exp(self.A_log.to(x.dtype)),
            self.D,
            backend=backend,
        )
        return F.linear(y, self.out_proj.weight, self.out_proj.bias), (conv_state, ssm_state)

    def _step_views(self, backend: str, x: Tensor) -> tuple | None:
        """numpy views of the step kernel's parameters (``numba_ops.mamba_step_views``), or
        None where :meth:`step` takes the general path (backend not numba for x, parameters not
        contiguous CPU tensors of x's dtype). Views, not values: an in-place update of a
        parameter (an optimizer step) is read by the next step as is; the cache is keyed on
        the parameters' ``data_ptr`` (a replaced tensor, ``module.to(...)``, rebuilds it)."""
        conv_w, conv_b = self.conv1d.weight, self.conv1d.bias
        params = (conv_w, conv_b, self.x_proj.weight, self.dt_proj.weight, self.dt_proj.bias)
        return _cached_step_views(
            self,
            backend,
            x,
            params + (self.A_log, self.D),
            lambda: numba_ops.mamba_step_views(
                (conv_w, conv_b), params[2], (params[3], params[4]), self.A_log, self.D
            ),
        )


# --------------------------------------------------------------------------------------------
# Mamba2 (mamba2.py, layernorm_gated.py)
# --------------------------------------------------------------------------------------------


class RMSNormGated(nn.Module):
    """Gated RMSNorm as mamba-ssm's ``ops.triton.layernorm_gated.RMSNorm``.

    ``norm_before_gate=False`` (Mamba2's default): ``rmsnorm(x * silu(z)) * weight``; True:
    ``rmsnorm(x) * weight * silu(z)``. The RMS is taken over groups of ``group_size`` channels.
    Parameter: weight ``[hidden_size]`` (no bias).
    """

    def __init__(
        self,
        hidden_size: int,
        eps: float = 1e-5,
        group_size: int | None = None,
        norm_before_gate: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        group_size = hidden_size if group_size is None else group_size
        if group_size < 1 or hidden_size % group_size != 0:
            raise ValueError(
                f"group_size must divide hidden_size={hidden_size}, got group_size={group_size}"
            )
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
        self.register_parameter("bias", None)
        self.group_size = group_size
        self.norm_before_gate = norm_before_gate

    def forward(self, x: Tensor, z: Tensor | None = None) -> Tensor:
        """x, z: ``[..., hidden_size]`` -> ``[..., hidden_size]``."""
        if z is None:
            return group_rmsnorm(x, self.weight, self.group_size, self.eps)
        args = (self.weight, self.group_size, self.eps, self.norm_before_gate)
        return rmsnorm_gated_reference(x, z, *args)


class Mamba2(nn.Module):
    """Mamba2 block (SSD: scalar A per head), as ``mamba_ssm.Mamba2``.

    Args (mamba-ssm's, same defaults): d_model, d_state=128, d_conv=4, conv_init=None,
    expand=2, headdim=64, d_ssm=None (SSM on this many channels, a gated MLP on the rest),
    ngroups=1, A_init_range=(1, 16), D_has_hdim=False, rmsnorm=True, norm_before_gate=False,
    dt_min=0.001, dt_max=0.1, dt_init_floor=1e-4, dt_limit=(0.0, inf), bias=False,
    conv_bias=True, chunk_size=256 (chunk length of the cuda kernel; the CPU chunked path uses
    ``min(chunk_size, 32)``), use_mem_eff_path=True (cuda only; the fused kernel is not used
    since it returns no state), layer_idx=None, process_group=None (tensor parallelism is not
    supported: must be None), sequence_parallel=True, device=None, dtype=None.
    Ours: backend="auto".

    Parameters: in_proj ``[2*d_inner + 2*ngroups*d_state + nheads, d_model]``,
    conv1d ``[d_ssm + 2*ngroups*d_state, 1, d_conv]``, dt_bias ``[nheads]``, A_log ``[nheads]``,
    D ``[nheads]`` (``[d_ssm]`` with D_has_hdim), norm.weight ``[d_ssm]`` (rmsnorm),
    out_proj ``[d_model, d_inner]``.
    """

    def __init__(
        self,
        d_model: int,
        d_state: int = 128,
        d_conv: int = 4,
        conv_init: float | None = None,
        expand: int = 2,
        headdim: int = 64,
        d_ssm: int | None = None,
        ngroups: int = 1,
        A_init_range: tuple[float, float] = (1, 16),
        D_has_hdim: bool = False,
        rmsnorm: bool = True,
        norm_before_gate: bool = False,
        dt_min: float = 0.001,
        dt_max: float = 0.1,
        dt_init_floor: float = 1e-4,
        dt_limit: tuple[float, float] = (0.0, float("inf")),
        bias: bool = False,
        conv_bias: bool = True,
        chunk_size: int = 256,
        use_mem_eff_path: bool = True,
        layer_idx: int | None = None,
        process_group: object | None = None,
        sequence_parallel: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        backend: str = "auto",
    ) -> None:
        factory = {"device": device, "dtype": dtype}
        super().__init__()
        if process_group is not None:
            raise ValueError(
                "process_group (tensor parallelism) is not supported by seqmodels.Mamba2; "
                "pass process_group=None"
            )
        _check_positive_ints(
            d_model=d_model,
            d_state=d_state,
            d_conv=d_conv,
            headdim=headdim,
            ngroups=ngroups,
            chunk_size=chunk_size,
        )
        self.d_model = d_model
        self.d_state = d_state
        self.d_conv = d_conv
        self.conv_init = conv_init
        self.expand = expand
        self.process_group = None
        self.sequence_parallel = sequence_parallel
        self.world_size = 1
        self.local_rank = 0
        self.d_inner = expand * d_model
        self.headdim = headdim
        self.d_ssm = self.d_inner if d_ssm is None else d_ssm
        if not 0 < self.d_ssm <= self.d_inner:
            raise ValueError(f"d_ssm must be in (0, d_inner={self.d_inner}], got {self.d_ssm}")
        if self.d_ssm % headdim != 0:
            raise ValueError(
                f"d_ssm (= expand * d_model = {self.d_ssm} unless given) must be divisible by "
                f"headdim={headdim}"
            )
        self.ngroups = ngroups
        self.nheads = self.d_ssm // headdim
        if self.nheads % ngroups != 0:
            raise ValueError(
                f"nheads = d_ssm / headdim = {self.nheads} must be divisible by ngroups={ngroups}"
            )
        if not (A_init_range[0] > 0 and A_init_range[1] >= A_init_range[0]):
            raise ValueError(f"A_init_range must satisfy 0 < low <= high, got {A_init_range}")
        _check_dt_range(dt_min, dt_max)
        if not dt_limit[0] < dt_limit[1]:
            raise ValueError(f"dt_limit must be (low, high) with low < high, got {dt_limit}")
        self.D_has_hdim = D_has_hdim
        self.rmsnorm = rmsnorm
        self.norm_before_gate = norm_before_gate
        self.dt_limit = tuple(dt_limit)
        self.activation = "silu"
        self.chunk_size = chunk_size
        self.use_mem_eff_path = use_mem_eff_path
        self.layer_idx = layer_idx
        self.backend = _check_backend(backend)
        self._init_layers(A_init_range, dt_min, dt_max, dt_init_floor, bias, conv_bias, factory)

    def _init_layers(
        self,
        A_init_range: tuple[float, float],
        dt_min: float,
        dt_max: float,
        dt_init_floor: float,
        bias: bool,
        conv_bias: bool,
        factory: dict[str, Any],
    ) -> None:
        """Create and initialise the layers and parameters (as mamba-ssm, in its order), once
        ``__init__`` has set the sizes; ``factory`` holds ``device`` and ``dtype``."""
        d_model, d_state, ngroups = self.d_model, self.d_state, self.ngroups
        device, dtype = factory["device"], factory["dtype"]
        # order of in_proj outputs: [z0, x0, z, xBC, dt]
        d_in_proj = 2 * self.d_inner + 2 * ngroups * d_state + self.nheads
        self.in_proj = nn.Linear(d_model, d_in_proj, bias=bias, **factory)
        conv_dim = self.conv_dim
        self.conv1d = nn.Conv1d(
            conv_dim,
            conv_dim,
            kernel_size=self.d_conv,
            groups=conv_dim,
            padding=self.d_conv - 1,
            bias=conv_bias,
            **factory,
        )
        if self.conv_init is not None:
            nn.init.uniform_(self.conv1d.weight, -self.conv_init, self.conv_init)
        self.act = nn.SiLU()

        self.dt_bias = nn.Parameter(
            _inv_softplus_dt(self.nheads, dt_min, dt_max, dt_init_floor, **factory)
        )
        self.dt_bias._no_weight_decay = True  # type: ignore[attr-defined]
        A = torch.empty(self.nheads, dtype=torch.float32, device=device).uniform_(*A_init_range)
        self.A_log = nn.Parameter(torch.log(A).to(dtype=dtype))
        self.A_log._no_weight_decay = True  # type: ignore[attr-defined]
        self.D = nn.Parameter(
            torch.ones(self.d_ssm if self.D_has_hdim else self.nheads, device=device)
        )
        self.D._no_weight_decay = True  # type: ignore[attr-defined]
        if self.rmsnorm:
            self.norm = RMSNormGated(
                self.d_ssm,
                eps=1e-5,
                norm_before_gate=self.norm_before_gate,
                group_size=self.d_ssm // ngroups,
                **factory,
            )
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=bias, **factory)
        # (parameter data_ptrs, numpy views of the step kernel's parameters): see _step_views
        self._step_views_cache: tuple[tuple[int, ...], tuple] | None = None

    # -- state -----------------------------------------------------------------------------

    @property
    def conv_dim(self) -> int:
        return self.d_ssm + 2 * self.ngroups * self.d_state

    def _state_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return (self.conv_dim, self.d_conv), (self.nheads, self.headdim, self.d_state)

    def initial_state(
        self,
        batch_size: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> State:
        """Zero state ``(conv_state [B, d_ssm + 2*ngroups*d_state, d_conv],
        ssm_state [B, nheads, headdim, d_state])``."""
        if not isinstance(batch_size, int) or batch_size < 0:
            raise ValueError(f"batch_size must be a non-negative int, got {batch_size!r}")
        device = self.out_proj.weight.device if device is None else device
        conv_dtype = self.conv1d.weight.dtype if dtype is None else dtype
        ssm_dtype = self.in_proj.weight.dtype if dtype is None else dtype
        conv_shape, ssm_shape = self._state_shapes()
        return (
            torch.zeros(batch_size, *conv_shape, device=device, dtype=conv_dtype),
            torch.zeros(batch_size, *ssm_shape, device=device, dtype=ssm_dtype),
        )

    # -- pieces shared by forward and step -------------------------------------------------

    def _split_in_proj(self, zxbcdt: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        d_mlp = self.d_inner - self.d_ssm
        return torch.split(
            zxbcdt,
            [d_mlp, d_mlp, self.d_ssm, self.conv_dim, self.nheads],
            dim=-1,
        )  # type: ignore[return-value]

    def _dt(self, dt: Tensor) -> Tensor:
        dt = F.softplus(dt + self.dt_bias.to(dt.dtype))
        if self.dt_limit != (0.0, float("inf")):
            dt = dt.clamp(min=self.dt_limit[0], max=self.dt_limit[1])
        return dt

    def _skip(self, x: Tensor) -> Tensor:
        """D skip term for x ``[..., nheads, headdim]``."""
        return x * self.D.to(x.dtype).view(self.nheads, -1)

    def _output(self, y: Tensor, z: Tensor, z0: Tensor, x0: Tensor) -> Tensor:
        """The gated norm (or gate), the gated MLP channels, out_proj: y, z ``[..., d_ssm]``,
        z0, x0 ``[..., d_inner - d_ssm]`` -> ``[..., d_model]``."""
        if self.rmsnorm:
            norm = self.norm
            args = (norm.weight, norm.group_size, norm.eps, norm.norm_before_gate)
            y = rmsnorm_gated(y, z, *args, backend=_step_backend(self.backend, y))
        else:
            y = y * F.silu(z)
        if self.d_inner > self.d_ssm:
            y = torch.cat([F.silu(z0) * x0, y], dim=-1)
        return self.out_proj(y)

    # -- forward ---------------------------------------------------------------------------

    def forward(
        self, x: Tensor, state: State | None = None, resets: Tensor | None = None
    ) -> tuple[Tensor, State]:
        """Sequence mode.

        Args:
            x: ``[B, L, d_model]``.
            state: ``(conv_state [B, conv_dim, d_conv], ssm_state [B, nheads, headdim,
                d_state])`` or None (zeros).
            resets: ``[B, L]`` bool or None; true where a new episode starts.

        Returns:
            y ``[B, L, d_model]`` and the state after the last step.
        """
        x = _check_x(x, self.d_model, 3, "x", self.in_proj.weight.dtype)
        batch, length, _ = x.shape
        resets = _check_resets(resets, (batch, length), "resets")
        if state is None:
            conv_state, ssm_state = self.initial_state(batch, device=x.device, dtype=x.dtype)
            h0 = None
        else:
            conv_state, ssm_state = _check_state(state, self._state_shapes(), batch)
            h0 = ssm_state.to(x.dtype)
        z0, x0, z, xBC, dt = self._split_in_proj(self.in_proj(x))
        xBC, new_conv = causal_conv_silu(
            xBC, conv_state, self.conv1d.weight, self.conv1d.bias, resets, self.backend
        )
        xs, Bm, Cm = torch.split(
            xBC, [self.d_ssm, self.ngroups * self.d_state, self.ngroups * self.d_state], dim=-1
        )
        xh = rearrange(xs, "b l (h p) -> b l h p", p=self.headdim)
        A = -torch.exp(self.A_log.to(x.dtype))
        chunk = self.chunk_size
        if not x.is_cuda:
            chunk = min(chunk, TORCH_CHUNK)
        y, h_last = ssd_scan(
            xh,
            self._dt(dt),
            A,
            rearrange(Bm, "b l (g n) -> b l g n", g=self.ngroups),
            rearrange(Cm, "b l (g n) -> b l g n", g=self.ngroups),
            h0=h0,
            resets=resets,
            backend=self.backend,
            chunk_size=chunk,
            D=self.D.view(self.nheads, -1),  # the D skip, fused into the numba kernels
        )
        y = rearrange(y, "b l h p -> b l (h p)")
        return self._output(y, z, z0, x0), (new_conv, h_last.to(ssm_state.dtype))

    def step(
        self, x: Tensor, state: State | None = None, reset: Tensor | None = None
    ) -> tuple[Tensor, State]:
        """One step (rollouts). x ``[B, d_model]``, state as :meth:`initial_state`, reset
        ``[B]`` bool (zero that row's state first). Returns (y ``[B, d_model]``, new state)."""
        x = _check_x(x, self.d_model, 2, "x", self.in_proj.weight.dtype)
        batch = x.shape[0]
        reset = _check_resets(reset, (batch,), "reset")
        if state is None:
            conv_state, ssm_state = self.initial_state(batch, device=x.device, dtype=x.dtype)
        else:
            conv_state, ssm_state = _check_state(state, self._state_shapes(), batch)
        # in_proj, then the rest of the block but out_proj in one numba kernel on CPU (resets,
        # conv + SiLU, step size, state update, D skip, gated norm, gated-MLP channels), then
        # out_proj; the general path below is its readable twin
        zxbcdt = F.linear(x, self.in_proj.weight, self.in_proj.bias)
        same_dtype = conv_state.dtype == ssm_state.dtype == zxbcdt.dtype == x.dtype
        if same_dtype and not torch.is_grad_enabled():
            views = self._step_views(_step_backend(self.backend, x), x)
            if views is not None:  # rollouts: the fused kernel on cached parameter views
                norm = (self.norm.eps, self.norm.norm_before_gate) if self.rmsnorm else (0.0, False)
                y, conv_state, ssm_state = numba_ops.mamba2_step_numba_views(
                    zxbcdt, conv_state, ssm_state, reset, views, norm, self.dt_limit
                )
                return F.linear(y, self.out_proj.weight, self.out_proj.bias), (
                    conv_state,
                    ssm_state,
                )
        if reset is not None:
            conv_state, ssm_state = _zero_rows(conv_state, reset), _zero_rows(ssm_state, reset)
        z0, x0, z, xBC, dt = self._split_in_proj(zxbcdt)
        xBC, conv_state = conv_step_silu(
            conv_state, xBC, self.conv1d.weight, self.conv1d.bias, _step_backend(self.backend, x)
        )
        xs, Bm, Cm = torch.split(
            xBC, [self.d_ssm, self.ngroups * self.d_state, self.ngroups * self.d_state], dim=-1
        )
        dt = self._dt(dt)  # [B, H]
        A = -torch.exp(self.A_log.to(x.dtype))
        xh = rearrange(xs, "b (h p) -> b h p", p=self.headdim)
        h, y = ssd_state_update(
            ssm_state.to(x.dtype),
            dt,
            xh,
            A,
            rearrange(Bm, "b (g n) -> b g n", g=self.ngroups),
            rearrange(Cm, "b (g n) -> b g n", g=self.ngroups),
            backend=_step_backend(self.backend, x),
        )
        y = y + self._skip(xh)
        y = rearrange(y, "b h p -> b (h p)")
        return self._output(y, z, z0, x0), (conv_state, h.to(ssm_state.dtype))

    def _step_views(self, backend: str, x: Tensor) -> tuple | None:
        """As :meth:`Mamba._step_views`, for ``numba_ops.mamba2_step_views``."""
        conv_w, conv_b = self.conv1d.weight, self.conv1d.bias
        norm_weight = self.norm.weight if self.rmsnorm else None
        return _cached_step_views(
            self,
            backend,
            x,
            (conv_w, conv_b, self.dt_bias, self.A_log, self.D, norm_weight),
            lambda: numba_ops.mamba2_step_views(
                (conv_w, conv_b), self.dt_bias, self.A_log, self.D, norm_weight
            ),
        )


__all__ = ["Mamba", "Mamba2", "RMSNormGated", "causal_conv_silu", "masked_causal_conv"]
