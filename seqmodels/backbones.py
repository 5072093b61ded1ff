"""Policy backbones with one interface: mlp (no memory), gru, mamba, mamba2.

Contract (docs/CONTRACTS.md, section 3)::

    make_backbone(kind, input_dim, hidden_dim=64, **kw) -> Backbone
    backbone.output_dim, backbone.is_recurrent
    backbone.initial_state(batch_size) -> tuple[Tensor, ...]    # () for mlp; batch-first
    backbone.step(x [B, D], state, reset [B] bool | None) -> (y [B, H], state)
    backbone(x [B, L, D], state=None, resets [B, L] bool | None) -> (y [B, L, H], state)

``reset[b]`` / ``resets[b, t]`` true: the input at that step is the first of a new episode (the
state is zeroed before processing it). Every state tensor has the batch as leading dimension,
so rollout buffers can store and index states per agent / env directly.

Architecture: ``Linear(input_dim, hidden_dim)`` input projection, then the core:

- ``mlp``: ``num_layers`` x (Linear + activation) after the projection's activation.
- ``gru``: activation, then ``nn.GRU(hidden_dim, hidden_dim, num_layers, batch_first=True)``;
  state ``(h [B, num_layers, hidden_dim],)``.
- ``mamba`` / ``mamba2``: ``num_layers`` pre-norm residual blocks ``x + block(norm(x))``
  (mamba-ssm's ``Block``), then a final norm; state ``(conv_0, ssm_0, conv_1, ssm_1, ...)``,
  each block's ``(conv_state, ssm_state)`` as :class:`seqmodels.Mamba` / ``Mamba2``.

Keyword arguments (unknown ones raise TypeError):

- all: ``num_layers`` (default 1; mlp 2), ``activation`` ("tanh" default, "relu", "silu",
  "gelu": used by mlp and by gru's projection).
- gru: ``chrono`` (None default: torch's initialisation): chrono initialisation of the update
  gate for timescales up to ``chrono`` steps (:func:`chrono_init_`).
- mamba: ``d_state=16, d_conv=4, expand=2, backend="auto"``, any other ``seqmodels.Mamba``
  argument (``dt_rank``, ``dt_min``, ...), ``norm`` ("rmsnorm" default, "layernorm").
- mamba2: ``d_state=16, d_conv=4, expand=2, headdim=16, ngroups=1, chunk_size=64,
  backend="auto"``, any other ``seqmodels.Mamba2`` argument, ``norm``. Defaults suit small
  hidden sizes (mamba-ssm's are d_state=128, headdim=64); ``expand * hidden_dim`` must be
  divisible by ``headdim``.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqmodels.kernels.numba_runtime import numba_thread_safe
from seqmodels.mamba import Mamba, Mamba2, _check_resets
from seqmodels.ops import rmsnorm, rmsnorm_reference
from seqmodels.scan import resolve_backend

KINDS = ("mlp", "gru", "mamba", "mamba2")
_ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "silu": nn.SiLU, "gelu": nn.GELU}
#: Names accepted by :func:`activation` (and the mlp / gru backbones' ``activation=``).
ACTIVATIONS = tuple(_ACTIVATIONS)


# functional forms of the activation modules (same operation, no module call overhead)
_FUNCTIONAL = {nn.Tanh: torch.tanh, nn.ReLU: torch.relu, nn.SiLU: F.silu}


def run_sequential(net: nn.Sequential, x: Tensor) -> Tensor:
    """``net(x)`` (its readable twin, equivalence-tested) for a Sequential of Linear and
    activation modules, through the functional forms: the same operations without the
    per-module call overhead, which dominates a rollout step's small matmuls."""
    for layer in net:
        kind = type(layer)
        if kind is nn.Linear:
            x = F.linear(x, layer.weight, layer.bias)
        else:
            fn = _FUNCTIONAL.get(kind)
            x = fn(x) if fn is not None else layer(x)
    return x


def activation(name: str) -> nn.Module:
    """A new activation module by name: one of :data:`ACTIVATIONS`."""
    if name not in _ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {name!r}")
    return _ACTIVATIONS[name]()


# alias: marl.models.policies imports this name, and the backbones' ``activation`` argument shadows
# the function inside their constructors
_activation = activation


def _check_positive(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


class Backbone(nn.Module):
    """Common interface; see the module docstring. Subclasses set ``output_dim`` and
    ``is_recurrent`` and implement ``initial_state``, ``step`` and ``forward``."""

    output_dim: int
    is_recurrent: bool
    input_dim: int
    #: Whether two instances may run forward/backward in two Python threads at the same time.
    thread_safe: bool = True

    def _check_seq(self, x: object, state: Any, resets: object) -> tuple[Tensor, Tensor | None]:
        if not isinstance(x, Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 3 or x.shape[-1] != self.input_dim:
            raise ValueError(
                f"x must have shape [B, L, input_dim={self.input_dim}], got {list(x.shape)}"
            )
        return x, _check_resets(resets, (x.shape[0], x.shape[1]), "resets")

    def _check_step(self, x: object, reset: object) -> tuple[Tensor, Tensor | None]:
        if not isinstance(x, Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 2 or x.shape[-1] != self.input_dim:
            raise ValueError(
                f"x must have shape [B, input_dim={self.input_dim}], got {list(x.shape)}"
            )
        return x, _check_resets(reset, (x.shape[0],), "reset")


class MLPBackbone(Backbone):
    """Feed-forward backbone (no memory); state is the empty tuple."""

    is_recurrent = False

    def __init__(
        self, input_dim: int, hidden_dim: int, num_layers: int = 2, activation: str = "tanh"
    ) -> None:
        super().__init__()
        self.input_dim, self.output_dim = input_dim, hidden_dim
        layers: list[nn.Module] = []
        dim = input_dim
        for _ in range(_check_positive("num_layers", num_layers)):
            layers += [nn.Linear(dim, hidden_dim), _activation(activation)]
            dim = hidden_dim
        self.net = nn.Sequential(*layers)

    def initial_state(self, batch_size: int) -> tuple[Tensor, ...]:
        return ()

    def step(
        self, x: Tensor, state: tuple[Tensor, ...] = (), reset: Tensor | None = None
    ) -> tuple[Tensor, tuple[Tensor, ...]]:
        """x ``[B, input_dim]`` -> (y ``[B, hidden_dim]``, ())."""
        x, _ = self._check_step(x, reset)
        return run_sequential(self.net, x), ()

    def forward(
        self, x: Tensor, state: tuple[Tensor, ...] | None = None, resets: Tensor | None = None
    ) -> tuple[Tensor, tuple[Tensor, ...]]:
        """x ``[B, L, input_dim]`` -> (y ``[B, L, hidden_dim]``, ())."""
        x, _ = self._check_seq(x, state, resets)
        return run_sequential(self.net, x), ()


def chrono_init_(gru: nn.GRU, t_max: int) -> None:
    """Chrono initialisation of ``gru``'s update gate (Tallec & Ollivier 2018, "Can
    recurrent neural networks warp time?"): in every layer the gate's bias (``bias_ih``'s,
    ``bias_hh``'s set to 0) is ``log(u)``, ``u ~ U[1, t_max - 1]`` per unit, so at a zero
    input each unit keeps ``z = u / (1 + u)`` of its state per step, a characteristic time
    of about ``u`` steps: timescales spread up to ``t_max``, where torch's default (biases
    near 0, ``z`` near 1/2) forgets within a few steps. torch's gate order is (r, z, n) with
    ``h' = (1 - z) * n + z * h``. Draws ``hidden_size`` uniforms per layer from torch's
    global generator."""
    if not isinstance(t_max, int) or isinstance(t_max, bool) or t_max < 3:
        raise ValueError(f"chrono must be an int >= 3 (the longest timescale), got {t_max!r}")
    H = gru.hidden_size
    with torch.no_grad():
        for layer in range(gru.num_layers):
            bias = torch.empty(H).uniform_(1.0, float(t_max - 1)).log_()
            getattr(gru, f"bias_ih_l{layer}")[H : 2 * H] = bias
            getattr(gru, f"bias_hh_l{layer}")[H : 2 * H] = 0.0


class GRUBackbone(Backbone):
    """Linear + activation + ``nn.GRU``; state ``(h [B, num_layers, hidden_dim],)``.

    Sequence mode with resets cuts the window at every step where any row resets and zeroes
    the rows that reset there, so the GRU kernel still runs on the reset-free segments.
    """

    is_recurrent = True

    def __init__(
        self,
        input_dim: int,
        hidden_dim: int,
        num_layers: int = 1,
        activation: str = "tanh",
        chrono: int | None = None,
    ) -> None:
        super().__init__()
        self.input_dim, self.output_dim = input_dim, hidden_dim
        self.num_layers = _check_positive("num_layers", num_layers)
        self.proj = nn.Sequential(nn.Linear(input_dim, hidden_dim), _activation(activation))
        self.gru = nn.GRU(hidden_dim, hidden_dim, num_layers=num_layers, batch_first=True)
        if chrono is not None:
            chrono_init_(self.gru, chrono)

    def initial_state(self, batch_size: int) -> tuple[Tensor, ...]:
        w = self.gru.weight_hh_l0
        return (w.new_zeros(batch_size, self.num_layers, self.output_dim),)

    def _check_state(self, state: Any, batch: int) -> Tensor:
        if state is None:
            return self.initial_state(batch)[0]
        want = [batch, self.num_layers, self.output_dim]
        if not isinstance(state, (tuple, list)) or len(state) != 1:
            raise TypeError("gru state must be a 1-tuple (h,) as returned by initial_state")
        if not isinstance(state[0], Tensor) or list(state[0].shape) != want:
            got = list(state[0].shape) if isinstance(state[0], Tensor) else type(state[0])
            raise ValueError(f"gru state h must have shape {want}, got {got}")
        return state[0]

    def step(
        self, x: Tensor, state: tuple[Tensor, ...] | None, reset: Tensor | None = None
    ) -> tuple[Tensor, tuple[Tensor, ...]]:
        """x ``[B, input_dim]``, state ``(h [B, num_layers, H],)`` -> (y ``[B, H]``, state)."""
        x, reset = self._check_step(x, reset)
        y, state = self.forward(
            x.unsqueeze(1), state, None if reset is None else reset.unsqueeze(1)
        )
        return y[:, 0], state

    def forward(
        self, x: Tensor, state: tuple[Tensor, ...] | None = None, resets: Tensor | None = None
    ) -> tuple[Tensor, tuple[Tensor, ...]]:
        """x ``[B, L, input_dim]``, state ``(h [B, num_layers, H],)`` or None, resets ``[B, L]``
        -> (y ``[B, L, H]``, state after the last step)."""
        x, resets = self._check_seq(x, state, resets)
        h = self._check_state(state, x.shape[0]).transpose(0, 1).contiguous()  # [layers, B, H]
        feats = self.proj(x)
        length = x.shape[1]
        if resets is None or not bool(resets.any()):
            cuts = [0]
        else:
            cuts = sorted(set([0] + torch.nonzero(resets.any(dim=0)).flatten().tolist()))
        ys = []
        for i, start in enumerate(cuts):
            stop = cuts[i + 1] if i + 1 < len(cuts) else length
            if resets is not None:
                h = h * (~resets[:, start]).to(h.dtype)[None, :, None]
            y, h = self.gru(feats[:, start:stop], h)
            ys.append(y)
        y = torch.cat(ys, dim=1) if len(ys) > 1 else ys[0]
        return y, (h.transpose(0, 1),)


class _RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return rmsnorm_reference(x, self.weight, self.eps)


def _normalize(norm: nn.Module, x: Tensor, backend: str = "auto") -> Tensor:
    """``norm(x)`` for the backbones' norms (RMSNorm or LayerNorm) through the functional form:
    the same operation without the module call (a rollout step runs a few of them); RMSNorm on
    ``backend`` (:func:`seqmodels.ops.rmsnorm`: its numba twin on CPU)."""
    if type(norm) is _RMSNorm:
        return rmsnorm(x, norm.weight, norm.eps, backend)
    if type(norm) is nn.LayerNorm:
        return F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)
    return norm(x)


class MambaBackbone(Backbone):
    """Linear projection + ``num_layers`` pre-norm residual Mamba/Mamba2 blocks + final norm.

    State: ``(conv_0, ssm_0, conv_1, ssm_1, ...)``, each pair laid out as the block's state.
    """

    is_recurrent = True

    def __init__(
        self,
        kind: str,
        input_dim: int,
        hidden_dim: int,
        num_layers: int = 1,
        norm: str = "rmsnorm",
        **block_kw: Any,
    ) -> None:
        super().__init__()
        self.input_dim, self.output_dim = input_dim, hidden_dim
        self.kind = kind
        self.num_layers = _check_positive("num_layers", num_layers)
        if norm not in ("rmsnorm", "layernorm"):
            raise ValueError(f"norm must be 'rmsnorm' or 'layernorm', got {norm!r}")
        block_cls = Mamba if kind == "mamba" else Mamba2
        if kind == "mamba":
            defaults: dict[str, Any] = {"d_state": 16, "d_conv": 4, "expand": 2}
        else:
            defaults = {"d_state": 16, "d_conv": 4, "expand": 2, "headdim": 16, "chunk_size": 64}
        allowed = set(inspect.signature(block_cls.__init__).parameters) - {"self", "d_model"}
        unknown = sorted(set(block_kw) - allowed - {"layer_idx"})
        if unknown:
            raise TypeError(
                f"unknown argument(s) for the {kind} backbone: {unknown}; allowed: "
                f"num_layers, norm, {sorted(allowed - {'layer_idx'})}"
            )
        if "layer_idx" in block_kw:
            raise TypeError("layer_idx is set per block by the backbone; do not pass it")
        kw = {**defaults, **block_kw}
        if kind == "mamba2" and (kw["expand"] * hidden_dim) % kw["headdim"] != 0:
            raise ValueError(
                f"mamba2 needs expand * hidden_dim = {kw['expand'] * hidden_dim} divisible by "
                f"headdim={kw['headdim']}; pass headdim=... that divides it"
            )
        self.proj = nn.Linear(input_dim, hidden_dim)
        make_norm = _RMSNorm if norm == "rmsnorm" else nn.LayerNorm
        self.norms = nn.ModuleList(make_norm(hidden_dim) for _ in range(num_layers))
        self.blocks = nn.ModuleList(
            block_cls(hidden_dim, layer_idx=i, **kw) for i in range(num_layers)
        )
        self.norm_f = make_norm(hidden_dim)

    @property
    def backend(self) -> str:
        return self.blocks[0].backend

    @backend.setter
    def backend(self, value: str) -> None:
        for block in self.blocks:
            block.backend = value

    @property
    def thread_safe(self) -> bool:  # type: ignore[override]
        """False where the blocks run seqmodels' numba kernels (CPU, backend numba or auto)
        and numba's threading layer is one that terminates the process when two Python
        threads enter it at once (workqueue: the trainer picks it for pools of two or more
        threads; see :func:`seqmodels.kernels.numba_thread_safe`); True otherwise (omp,
        tbb, or torch ops only)."""
        weight = self.proj.weight
        if resolve_backend(self.backend, weight.device, weight.dtype) != "numba":
            return True
        return numba_thread_safe()

    def initial_state(self, batch_size: int) -> tuple[Tensor, ...]:
        return tuple(t for block in self.blocks for t in block.initial_state(batch_size))

    def _split_state(self, state: Any, batch: int) -> list[Any]:
        if state is None:
            return [None] * self.num_layers
        if not isinstance(state, (tuple, list)) or len(state) != 2 * self.num_layers:
            raise TypeError(
                f"{self.kind} state must be a tuple of {2 * self.num_layers} tensors "
                "(conv, ssm per layer) as returned by initial_state"
            )
        return [(state[2 * i], state[2 * i + 1]) for i in range(self.num_layers)]

    def step(
        self, x: Tensor, state: tuple[Tensor, ...] | None, reset: Tensor | None = None
    ) -> tuple[Tensor, tuple[Tensor, ...]]:
        """x ``[B, input_dim]`` -> (y ``[B, hidden_dim]``, state). (The functional forms of
        the projection and norms: the same operations as :meth:`forward`'s.)"""
        x, reset = self._check_step(x, reset)
        h = F.linear(x, self.proj.weight, self.proj.bias)
        new_state: list[Tensor] = []
        for norm, block, s in zip(
            self.norms, self.blocks, self._split_state(state, x.shape[0]), strict=True
        ):
            out, s = block.step(_normalize(norm, h, block.backend), s, reset)
            h = h + out
            new_state += s
        return _normalize(self.norm_f, h, self.backend), tuple(new_state)

    def forward(
        self, x: Tensor, state: tuple[Tensor, ...] | None = None, resets: Tensor | None = None
    ) -> tuple[Tensor, tuple[Tensor, ...]]:
        """x ``[B, L, input_dim]`` -> (y ``[B, L, hidden_dim]``, state after the last step)."""
        x, resets = self._check_seq(x, state, resets)
        h = F.linear(x, self.proj.weight, self.proj.bias)
        new_state: list[Tensor] = []
        for norm, block, s in zip(
            self.norms, self.blocks, self._split_state(state, x.shape[0]), strict=True
        ):
            out, s = block(_normalize(norm, h, block.backend), s, resets)
            h = h + out
            new_state += s
        return _normalize(self.norm_f, h, self.backend), tuple(new_state)


# ------------------------------------------------------------------------------------------
# the backbone registry
# ------------------------------------------------------------------------------------------
# The backbone registry: every policy backbone, by name, with what the rest of the suite
# needs to know about it.
#
# A :class:`BackboneSpec` carries the constructor (``build(input_dim, hidden_dim, **kw) ->
# Backbone``, this module's interface), whether it carries state, the trainer
# settings it wants when the user leaves them unset (``rollout_steps``, ``seq_len``,
# ``burn_in``, ``penalty_channel``), whether the trainer's ``--activation`` applies, and the
# names of its state tensors in an exported step function (None: not exportable).
#
# ``python -m marl.train --backbone NAME`` takes a registered name, or ``package.module:NAME``
# for a backbone defined outside the package (the module is imported; ``NAME`` is a
# :class:`BackboneSpec` in it, registered under the whole string so that a run's config.yaml
# finds it again in a new process). docs/extending.md shows one.

#: What a backbone gets when it declares no trainer defaults (the feed-forward settings).
TRAINER_DEFAULTS = {
    "rollout_steps": 32,
    "seq_len": 16,
    "burn_in": 0,
    "penalty_channel": "individual",
}


@dataclass(frozen=True)
class BackboneSpec:
    """One backbone kind (see the module docstring)."""

    name: str
    build: Callable[..., Any]
    recurrent: bool
    defaults: Mapping[str, Any] = field(default_factory=dict)
    takes_activation: bool = True
    export_state_names: tuple[str, ...] | None = None

    def default(self, key: str) -> Any:
        """The trainer setting ``key`` this backbone wants when the user left it unset."""
        return self.defaults.get(key, TRAINER_DEFAULTS[key])


#: name -> spec, the built-in kinds first (registered by :mod:`seqmodels.backbones`)
BACKBONES: dict[str, BackboneSpec] = {}


def register_backbone(spec: BackboneSpec) -> BackboneSpec:
    """Make ``spec`` available as ``--backbone spec.name``; returns it."""
    if not isinstance(spec, BackboneSpec):
        raise TypeError(f"register_backbone: expected a BackboneSpec, got {spec!r}")
    unknown = sorted(set(spec.defaults) - set(TRAINER_DEFAULTS))
    if unknown:
        raise ValueError(
            f"backbone {spec.name!r}: unknown trainer defaults {unknown}; allowed: "
            + ", ".join(TRAINER_DEFAULTS)
        )
    BACKBONES[spec.name] = spec
    return spec


def registered_backbones() -> dict[str, BackboneSpec]:
    """Every registered backbone, the built-in kinds included (name -> spec)."""
    return dict(BACKBONES)


def backbone_spec(name: str) -> BackboneSpec:
    """The spec ``--backbone name`` names: a registered name, or ``package.module:NAME``.
    Raises ValueError listing what is allowed."""
    if name in BACKBONES:
        return BACKBONES[name]
    module_name, sep, attr = str(name).partition(":")
    if not sep:
        raise ValueError(
            f"unknown backbone {name!r}; allowed: {', '.join(BACKBONES)}, or "
            "package.module:NAME for a BackboneSpec defined in your own module"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"backbone {name!r}: cannot import {module_name!r} ({exc})") from None
    spec = getattr(module, attr, None)
    if not isinstance(spec, BackboneSpec):
        raise ValueError(f"backbone {name!r}: {module_name} has no BackboneSpec named {attr!r}")
    BACKBONES[name] = spec
    return spec


def make_backbone(kind: str, input_dim: int, hidden_dim: int = 64, **kw: Any) -> Backbone:
    """Build a backbone: a kind of the registry (:mod:`seqmodels.backbones`: "mlp", "gru",
    "mamba", "mamba2", or one registered or named as ``package.module:NAME``); see the module
    docstring for the keyword arguments of the built-in kinds."""
    try:
        spec = backbone_spec(kind)
    except ValueError as exc:
        raise ValueError(f"kind: {exc}") from None
    _check_positive("input_dim", input_dim)
    _check_positive("hidden_dim", hidden_dim)
    return spec.build(input_dim, hidden_dim, **kw)


def _feed_forward_or_gru(cls: type[Backbone], kind: str) -> Any:
    def build(input_dim: int, hidden_dim: int, **kw: Any) -> Backbone:
        allowed = {"num_layers", "activation"} | ({"chrono"} if kind == "gru" else set())
        unknown = sorted(set(kw) - allowed)
        if unknown:
            raise TypeError(
                f"unknown argument(s) for the {kind} backbone: {unknown}; "
                f"allowed: {sorted(allowed)}"
            )
        return cls(input_dim, hidden_dim, **kw)

    return build


def _mamba(kind: str) -> Any:
    def build(input_dim: int, hidden_dim: int, **kw: Any) -> Backbone:
        return MambaBackbone(kind, input_dim, hidden_dim, **kw)

    return build


#: Long-episode trainer defaults of the recurrent kinds: rollouts of 128 steps, windows of 64
#: (the states stored at window starts make burn-in unnecessary) and the penalty channel
#: dropped. docs/results/memory_factorial/ (16 seeds a cell) showed these settings better than
#: rollouts of 32, windows of 16 and the penalty channel for gru, mamba and mamba2 on the
#: memory preset (under the short settings most runs collapsed onto one action). mlp keeps the
#: library-wide settings (TRAINER_DEFAULTS): that study covers one preset only.
RECURRENT_DEFAULTS = {"rollout_steps": 128, "seq_len": 64, "burn_in": 0, "penalty_channel": "none"}

register_backbone(
    BackboneSpec("mlp", _feed_forward_or_gru(MLPBackbone, "mlp"), recurrent=False,
                 export_state_names=())
)  # fmt: skip
register_backbone(
    BackboneSpec("gru", _feed_forward_or_gru(GRUBackbone, "gru"), recurrent=True,
                 defaults=RECURRENT_DEFAULTS, export_state_names=("state_h",))
)  # fmt: skip
for _kind in ("mamba", "mamba2"):
    register_backbone(
        BackboneSpec(_kind, _mamba(_kind), recurrent=True, defaults=RECURRENT_DEFAULTS,
                     takes_activation=False, export_state_names=("state_conv", "state_ssm"))
    )  # fmt: skip


__all__ = [
    "ACTIVATIONS",
    "BACKBONES",
    "KINDS",
    "RECURRENT_DEFAULTS",
    "TRAINER_DEFAULTS",
    "Backbone",
    "BackboneSpec",
    "backbone_spec",
    "register_backbone",
    "registered_backbones",
    "GRUBackbone",
    "MLPBackbone",
    "chrono_init_",
    "MambaBackbone",
    "activation",
    "make_backbone",
    "run_sequential",
]
