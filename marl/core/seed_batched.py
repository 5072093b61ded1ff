"""Seed-batched building blocks: S independent training runs stacked along a leading seed axis.

Issue 37 trains many seeds in one process by turning S small calls (one per seed) into one:
every parameter gains a leading seed axis ``S`` and every activation a leading ``[S, ...]``,
so seed k's rows only ever meet seed k's weights (batched matmuls, elementwise ops and
reductions that never cross the seed axis). This module is the foundation layer:

========================== ==================================================================
:class:`SeedLinear`        ``weight [S, out, in]``, ``bias [S, out]``; ``x [S, N, in]`` ->
                           ``[S, N, out]`` through ``torch.baddbmm``
:class:`SeedMLP`           SeedLinear layers and (parameterless) activations in order, the
                           stacked twin of an ``nn.Sequential`` such as ``MLPBackbone.net``,
                           ``GRUBackbone.proj`` or ``CentralCritic.trunk``
:class:`SeedGRU`           the stacked twin of ``nn.GRU(batch_first=True)`` (gates r, z, n;
                           any number of layers) with the project's episode resets
:func:`stack_modules`      S torch modules -> one seed module (parameters copied exactly);
:func:`unstack`            the inverse
:func:`per_seed_grad_norm` ``[S]`` gradient norms, each over one seed's slice of every
                           parameter; :func:`clip_grad_norm_per_seed_` clips each seed by its
                           own norm, as ``torch.nn.utils.clip_grad_norm_`` on that seed alone
:class:`SeedViews`         one leaf per (seed, parameter) aliasing the stack, for a stock
                           torch optimizer with per-seed state and a per-seed step mask
:func:`seed_group_key`     the whitening group key with the seed folded in
                           (``seed * G + group``): the grouped kernel of
                           :mod:`marl.core.whitening` then whitens each seed on its own
========================== ==================================================================

Independence and bit-equality (tests/test_seed_batched.py, one torch thread, CPU):

- seed k's forward and every gradient computed in a stack of 16 are bit-equal to the same
  computed in a stack of one (``--seeds 0-15`` vs ``--seeds k``): ``torch.bmm`` runs one
  GEMM per seed with the same shapes, and every elementwise kernel treats seed k's values
  alike. The one trap is an elementwise op whose vector lanes and scalar tail differ in
  the last bit (``sigmoid``, ``silu``, ``softplus``; not ``tanh``, ``exp``, ``log``,
  ``gelu``, add or multiply) run on a contiguous ``[S, ...]`` tensor: the tail is then the
  last values of the whole stack, not the last values of each seed's slice (unless that
  slice is a multiple of the vector width). :class:`SeedGRU` applies ``sigmoid`` to row
  views, row by row as ``nn.GRU`` does; :class:`SeedMLP` computes SiLU and sigmoid through
  ``exp``. Stacked Mamba blocks will need the same care (``silu``, ``softplus``).
- against the plain single-seed modules: ``SeedGRU`` with ``fused = False`` (its readable
  torch loop) is bit-equal to ``nn.GRU`` (forward and gradients); its default, the numba
  recurrence of :mod:`marl.core.kernels.gru_numba` (about 10x faster on a training
  minibatch), equals that loop to float rounding and keeps the seeds' independence bit for
  bit; ``SeedLinear``/``SeedMLP`` agree to float32 rounding (the batched GEMM may
  block its sums differently from ``addmm``, and autograd's ``bmm`` backward multiplies the
  weight gradient in the other orientation).
- a stock ``torch.optim.Adam`` over the stacked parameters is elementwise, so per-seed
  independent while every seed steps: bit-equal to S separate Adams with the for-loop and
  foreach implementations, to rounding with ``fused=True`` (its tails again). It keeps one
  step count per stacked tensor, which is why a step that leaves seeds out uses
  :class:`SeedViews` (one leaf per seed: bit-equal to S separate Adams, fused included).

With two threads the GEMMs may split their work by batch size, so S-invariance holds for
some shapes only (the test records which).

Seed k's initial parameters should come from the single-seed code (build seed k's modules
under its own generator, then :func:`stack_modules`): the stack then starts exactly where S
single-seed runs start.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from marl.core.kernels import gru_numba
from marl.core.whitening import whiten

__all__ = [
    "SeedGRU",
    "SeedLinear",
    "SeedMLP",
    "SeedViews",
    "clip_grad_norm_per_seed_",
    "clip_grads_per_seed_",
    "per_seed_grad_norm",
    "run_seed_mlp",
    "seed_group_key",
    "seed_linear",
    "stack_modules",
    "unstack",
    "whiten_per_seed",
]


def _check_same_type(modules: Sequence[nn.Module], what: type) -> list[nn.Module]:
    modules = list(modules)
    if not modules:
        raise ValueError("need at least one module to stack (one per seed), got none")
    for i, m in enumerate(modules):
        if type(m) is not type(modules[0]) or not isinstance(m, what):
            raise TypeError(
                f"modules to stack must all be {what.__name__} of one type; module {i} is "
                f"{type(m).__name__}, module 0 is {type(modules[0]).__name__}"
            )
    return modules


@torch.no_grad()
def _stack(tensors: Iterable[Tensor]) -> Tensor:
    """A new tensor ``[S, ...]``: the given per-seed tensors copied (exactly) and stacked."""
    return torch.stack([t.detach() for t in tensors])


def _seed_input(x: Tensor, num_seeds: int, features: int, name: str = "x") -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() < 2 or x.shape[0] != num_seeds or x.shape[-1] != features:
        raise ValueError(
            f"{name} must have shape [S={num_seeds}, ..., {features}], got {list(x.shape)}"
        )
    return x


# ------------------------------------------------------------------------------------------
# layers
# ------------------------------------------------------------------------------------------


class SeedLinear(nn.Module):
    """S independent ``nn.Linear(in_features, out_features)`` layers, stacked.

    Parameters: ``weight [S, out_features, in_features]``, ``bias [S, out_features]`` (or
    None), taken as given (usually :meth:`from_modules`, i.e. :func:`stack_modules`, which
    copies S layers built by the single-seed code). ``forward(x [S, ..., in_features]) ->
    [S, ..., out_features]``: seed s's rows times seed s's weight, one ``torch.baddbmm`` for
    all seeds (``torch.bmm`` without bias).
    """

    def __init__(self, weight: Tensor, bias: Tensor | None = None) -> None:
        super().__init__()
        if not isinstance(weight, Tensor) or weight.dim() != 3:
            raise ValueError("weight must be a tensor [S, out_features, in_features]")
        self.num_seeds, self.out_features, self.in_features = weight.shape
        self.weight = nn.Parameter(weight)
        if bias is not None and tuple(bias.shape) != (self.num_seeds, self.out_features):
            raise ValueError(
                f"bias must have shape [S, out_features] = {[self.num_seeds, self.out_features]},"
                f" got {list(bias.shape)}"
            )
        if bias is None:
            self.register_parameter("bias", None)
        else:
            self.bias = nn.Parameter(bias)

    @classmethod
    def from_modules(cls, layers: Sequence[nn.Linear]) -> SeedLinear:
        """The S layers stacked (parameters copied exactly), seed k = ``layers[k]``."""
        layers = _check_same_type(layers, nn.Linear)
        first = layers[0]
        for i, layer in enumerate(layers):
            if layer.weight.shape != first.weight.shape or (layer.bias is None) != (
                first.bias is None
            ):
                raise ValueError(
                    f"layer {i} has weight {list(layer.weight.shape)} (bias "
                    f"{layer.bias is not None}); layer 0 has {list(first.weight.shape)} "
                    f"(bias {first.bias is not None}): stacked layers must have one shape"
                )
        bias = None if first.bias is None else _stack(layer.bias for layer in layers)
        return cls(_stack(layer.weight for layer in layers), bias)

    def unstack(self) -> list[nn.Linear]:
        """S separate ``nn.Linear`` layers with copies of each seed's parameters."""
        layers = []
        for k in range(self.num_seeds):
            layer = nn.Linear(
                self.in_features,
                self.out_features,
                bias=self.bias is not None,
                device=self.weight.device,
                dtype=self.weight.dtype,
            )
            with torch.no_grad():
                layer.weight.copy_(self.weight[k])
                if self.bias is not None:
                    layer.bias.copy_(self.bias[k])
            layers.append(layer)
        return layers

    def forward(self, x: Tensor) -> Tensor:
        """``x [S, ..., in_features]`` -> ``[S, ..., out_features]``."""
        x = _seed_input(x, self.num_seeds, self.in_features)
        rows = x.reshape(self.num_seeds, -1, self.in_features)  # [S, N, in]
        y = seed_linear(rows, self.weight, self.bias)
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (
            f"num_seeds={self.num_seeds}, in_features={self.in_features}, "
            f"out_features={self.out_features}, bias={self.bias is not None}"
        )


def seed_linear(rows: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``rows [S, N, in]`` times ``weight [S, out, in]`` (+ ``bias [S, out]``) -> ``[S, N,
    out]``: one ``torch.baddbmm`` (``bmm`` without bias). A single output column (a value
    head) is an elementwise product summed over ``in`` instead: ``baddbmm`` with one column
    takes another kernel for a batch of one seed than for several, so its bits would depend
    on S; the product and sum do not."""
    if weight.shape[1] == 1:
        y = (rows * weight[:, None, 0, :]).sum(-1, keepdim=True)
        return y if bias is None else y + bias[:, None, :]
    weight_t = weight.transpose(1, 2)  # [S, in, out]
    if bias is None:
        return torch.bmm(rows, weight_t)
    return torch.baddbmm(bias.unsqueeze(1), rows, weight_t)


def _sigmoid_by_exp(x: Tensor) -> Tensor:
    """``sigmoid(x) = 1 / (1 + exp(-x))`` from ``exp`` and exact arithmetic: ``torch.sigmoid``
    and ``F.silu`` compute their vector lanes and their scalar tail differently (the last
    bit), and on a contiguous ``[S, ...]`` tensor the tail falls on other values than on one
    seed's ``[1, ...]``; ``torch.exp`` treats every value alike, so this form gives seed k
    the same bits in any stack (equal to ``torch.sigmoid`` to float32 rounding)."""
    return 1.0 / (1.0 + torch.exp(-x))


def _silu_by_exp(x: Tensor) -> Tensor:
    """``silu(x) = x / (1 + exp(-x))``, independent of the stack as :func:`_sigmoid_by_exp`."""
    return x / (1.0 + torch.exp(-x))


#: the functional forms of the activation modules: the same operation without a module call
#: (as ``seqmodels.backbones.run_sequential``), and for sigmoid and SiLU a form whose bits do
#: not depend on the number of seeds stacked; other parameterless modules are called
_FUNCTIONAL: dict[type, Callable[[Tensor], Tensor]] = {
    nn.Tanh: torch.tanh,
    nn.ReLU: torch.relu,
    nn.SiLU: _silu_by_exp,
    nn.Sigmoid: _sigmoid_by_exp,
}


class SeedMLP(nn.Module):
    """The stacked twin of an ``nn.Sequential`` of ``nn.Linear`` layers and parameterless
    activation modules (the project's MLP torso: ``MLPBackbone.net``, ``GRUBackbone.proj``,
    ``CentralCritic.trunk``, or a whole feed-forward actor: backbone layers then the head).

    ``forward(x [S, ..., in_features]) -> [S, ..., out_features]``: the layers in order, each
    :class:`SeedLinear` on every seed at once, each activation elementwise (the same module
    type as the torso's, applied through its functional form where one is known; SiLU and
    sigmoid through ``exp``, see :func:`_sigmoid_by_exp`). The
    project's MLP torso has no normalisation layer; a Sequential holding one (LayerNorm,
    RMSNorm: modules with parameters other than Linear) is refused.
    """

    def __init__(self, layers: Sequence[nn.Module]) -> None:
        super().__init__()
        layers = list(layers)
        linear = [m for m in layers if isinstance(m, SeedLinear)]
        if not linear:
            raise ValueError("a SeedMLP needs at least one SeedLinear layer")
        for m in layers:
            if not isinstance(m, SeedLinear) and any(True for _ in m.parameters()):
                raise TypeError(
                    f"SeedMLP layers are SeedLinear and parameterless activations; "
                    f"{type(m).__name__} has parameters"
                )
        self.layers = nn.ModuleList(layers)
        self.num_seeds = linear[0].num_seeds
        self.in_features, self.out_features = linear[0].in_features, linear[-1].out_features

    @classmethod
    def from_modules(cls, nets: Sequence[nn.Sequential]) -> SeedMLP:
        """S Sequentials of one architecture stacked (parameters copied exactly)."""
        nets = _check_same_type(nets, nn.Sequential)
        kinds = [type(m) for m in nets[0]]
        for i, net in enumerate(nets):
            if [type(m) for m in net] != kinds:
                raise ValueError(
                    f"Sequential {i} has layers {[t.__name__ for t in map(type, net)]}; "
                    f"Sequential 0 has {[t.__name__ for t in kinds]}"
                )
        layers: list[nn.Module] = []
        for position, module in enumerate(nets[0]):
            if isinstance(module, nn.Linear):
                layers.append(SeedLinear.from_modules([net[position] for net in nets]))
            elif any(True for _ in module.parameters()):
                raise TypeError(
                    f"cannot stack {type(module).__name__} (layer {position}): a SeedMLP holds "
                    "nn.Linear layers and parameterless activation modules only"
                )
            else:
                layers.append(copy.deepcopy(module))
        return cls(layers)

    def unstack(self) -> list[nn.Sequential]:
        """S separate ``nn.Sequential`` with copies of each seed's parameters."""
        nets = [nn.Sequential() for _ in range(self.num_seeds)]
        for layer in self.layers:
            if isinstance(layer, SeedLinear):
                parts: list[nn.Module] = list(layer.unstack())
            else:
                parts = [copy.deepcopy(layer) for _ in range(self.num_seeds)]
            for net, part in zip(nets, parts, strict=True):
                net.append(part)
        return nets

    def forward(self, x: Tensor) -> Tensor:
        """``x [S, ..., in_features]`` -> ``[S, ..., out_features]``."""
        for layer in self.layers:
            fn = _FUNCTIONAL.get(type(layer))
            x = fn(x) if fn is not None else layer(x)
        return x


class SeedGRU(nn.Module):
    """The stacked twin of S ``nn.GRU(input_size, hidden_size, num_layers, batch_first=True)``,
    with the project's episode resets (``seqmodels.backbones.GRUBackbone``).

    Parameters, for each layer ``l`` (``I_0 = input_size``, ``I_l = hidden_size`` after):
    ``weight_ih_l{l} [S, 3H, I_l]``, ``weight_hh_l{l} [S, 3H, H]``, ``bias_ih_l{l} [S, 3H]``,
    ``bias_hh_l{l} [S, 3H]``: nn.GRU's names and gate order ``(r, z, n)`` with a leading seed
    axis. Each step is torch's GRU cell::

        r = sigmoid(W_ir x + b_ir + W_hr h + b_hr)
        z = sigmoid(W_iz x + b_iz + W_hz h + b_hz)
        n = tanh(W_in x + b_in + r * (W_hn h + b_hn))
        h' = (h - n) * z + n                    # = (1 - z) * n + z * h

    with the input projections of the whole sequence in one ``baddbmm`` per layer (rows in
    time-major order, as ``nn.GRU``, so their gradient sums in its order) and the recurrence
    either the torch loop below (``fused = False``: one ``baddbmm`` and the cell per step,
    bit-equal to ``nn.GRU``) or, by default on CPU, one compiled loop forward and one
    backward (:mod:`marl.core.kernels.gru_numba`; equal to the loop to float rounding,
    seeds independent bit for bit, about 10x faster on a minibatch's windows).

    State: ``h [S, B, num_layers, H]`` (the backbone's batch-first ``[B, num_layers, H]``
    with the seed axis in front). ``resets[s, b, t]`` true: the state of row b of seed s is
    zeroed (every layer) before step t, as ``GRUBackbone`` does at episode starts.
    """

    #: the recurrence in numba (the default where it applies: CPU, float32/64, numba
    #: importable); False: the readable torch loop, bit-equal to ``nn.GRU``
    fused: bool = True

    def __init__(self, parameters: Mapping[str, Tensor]) -> None:
        """``parameters``: nn.GRU's parameter names, each tensor with a leading seed axis
        (usually :meth:`from_modules`, i.e. :func:`stack_modules`)."""
        super().__init__()
        weight_ih, weight_hh = parameters.get("weight_ih_l0"), parameters.get("weight_hh_l0")
        if weight_ih is None or weight_hh is None or weight_ih.dim() != 3:
            raise ValueError("parameters must hold weight_ih_l0 [S, 3H, I], weight_hh_l0, ...")
        self.num_seeds, three_h, self.input_size = weight_ih.shape
        self.hidden_size = three_h // 3
        self.num_layers = sum(1 for name in parameters if name.startswith("weight_ih_l"))
        expected = set(self._param_names())
        if set(parameters) != expected:
            raise ValueError(
                f"parameters must be exactly {sorted(expected)}, got {sorted(parameters)}"
            )
        for name in self._param_names():
            setattr(self, name, nn.Parameter(parameters[name]))

    def _param_names(self) -> list[str]:
        return [f"{kind}_l{layer}" for layer in range(self.num_layers)
                for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]  # fmt: skip

    @classmethod
    def from_modules(cls, grus: Sequence[nn.GRU]) -> SeedGRU:
        """S ``nn.GRU`` of one configuration stacked (parameters copied exactly). Refuses
        the options this twin does not compute: bidirectional, dropout, no bias."""
        grus = _check_same_type(grus, nn.GRU)
        first = grus[0]
        for i, g in enumerate(grus):
            if g.bidirectional or g.dropout or not g.bias:
                raise ValueError(
                    f"GRU {i}: SeedGRU computes unidirectional GRUs with biases and without "
                    "dropout (bidirectional=False, dropout=0, bias=True)"
                )
            shape = (g.input_size, g.hidden_size, g.num_layers)
            if shape != (first.input_size, first.hidden_size, first.num_layers):
                raise ValueError(
                    f"GRU {i} has (input_size, hidden_size, num_layers) {shape}; GRU 0 has "
                    f"{(first.input_size, first.hidden_size, first.num_layers)}"
                )
        names = [name for name, _ in first.named_parameters()]
        return cls({name: _stack(getattr(g, name) for g in grus) for name in names})

    def unstack(self) -> list[nn.GRU]:
        """S separate ``nn.GRU(batch_first=True)`` with copies of each seed's parameters."""
        weight = self.weight_hh_l0
        grus = []
        for k in range(self.num_seeds):
            g = nn.GRU(
                self.input_size,
                self.hidden_size,
                self.num_layers,
                batch_first=True,
                device=weight.device,
                dtype=weight.dtype,
            )
            with torch.no_grad():
                for name in self._param_names():
                    getattr(g, name).copy_(getattr(self, name)[k])
            grus.append(g)
        return grus

    def initial_state(self, batch_size: int) -> Tensor:
        """Zeros ``[S, batch_size, num_layers, H]``."""
        w = self.weight_hh_l0
        return w.new_zeros(self.num_seeds, batch_size, self.num_layers, self.hidden_size)

    def _check_state(self, h: Tensor | None, batch: int) -> Tensor:
        if h is None:
            return self.initial_state(batch)
        want = [self.num_seeds, batch, self.num_layers, self.hidden_size]
        if not isinstance(h, Tensor) or list(h.shape) != want:
            got = list(h.shape) if isinstance(h, Tensor) else type(h).__name__
            raise ValueError(f"SeedGRU state must have shape {want} [S, B, layers, H], got {got}")
        return h

    def forward(
        self,
        x: Tensor,
        h: Tensor | None = None,
        resets: Tensor | None = None,
        *,
        fused: bool | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Sequence mode (``fused``: None = :attr:`fused`; the numba recurrence applies on CPU
        to float32/64 only, elsewhere the torch loop runs).

        Args:
            x: ``[S, B, L, input_size]``.
            h: ``[S, B, num_layers, H]`` state before step 0, or None (zeros).
            resets: ``[S, B, L]`` bool or None: zero row b's state (all layers) before step t.

        Returns:
            ``(y [S, B, L, H], h [S, B, num_layers, H])``: the last layer's outputs and the
            state after the last step.
        """
        x = _seed_input(x, self.num_seeds, self.input_size)
        if x.dim() != 4:
            raise ValueError(f"x must have shape [S, B, L, input_size], got {list(x.shape)}")
        S, B, L, _ = x.shape
        h = self._check_state(h, B)
        if resets is not None:
            if not isinstance(resets, Tensor) or list(resets.shape) != [S, B, L]:
                got = list(resets.shape) if isinstance(resets, Tensor) else type(resets).__name__
                raise ValueError(f"resets must have shape [S, B, L] = {[S, B, L]}, got {got}")
            # kept even where no row resets: dropping it when no seed resets would change
            # the autograd graph (the order in which a state's gradient terms are summed),
            # and so the last bits of seed k's gradient, with the other seeds' episodes
            resets = resets.bool()
        H = self.hidden_size
        # time-major inside, as nn.GRU: the input gates of step t are rows [t * B, (t+1) * B)
        # of one baddbmm, so their gradient sums the rows in nn.GRU's order
        layer_in = x.transpose(1, 2)  # [S, L, B, I]
        fused = (
            (self.fused if fused is None else fused)
            and gru_numba.AVAILABLE
            and x.device.type == "cpu"
            and x.dtype in (torch.float32, torch.float64)
        )
        finals = []
        for layer in range(self.num_layers):
            w_ih, w_hh = getattr(self, f"weight_ih_l{layer}"), getattr(self, f"weight_hh_l{layer}")
            b_ih, b_hh = getattr(self, f"bias_ih_l{layer}"), getattr(self, f"bias_hh_l{layer}")
            rows = layer_in.reshape(S, L * B, layer_in.shape[-1])
            gates_in = torch.baddbmm(b_ih.unsqueeze(1), rows, w_ih.transpose(1, 2))
            if fused:
                layer_in = gru_numba.gru_recurrence(
                    gates_in.view(S, L, B, 3 * H), w_hh, b_hh, h[:, :, layer], resets
                )  # [S, L, B, H]
                finals.append(layer_in[:, -1])
                continue
            # unbind, not gates_in[:, t]: the backward of L selects would zero-fill the whole
            # [S, L, B, 3H] gradient once per step (quadratic in L); unbind's stacks it once
            steps_in = gates_in.view(S, L, B, 3 * H).unbind(1)
            w_hh_t, b_hh_row = w_hh.transpose(1, 2), b_hh.unsqueeze(1)
            state = h[:, :, layer]  # [S, B, H]
            outputs = []
            for t in range(L):
                if resets is not None:
                    state = state.masked_fill(resets[:, :, t, None], 0.0)
                gates_h = torch.baddbmm(b_hh_row, state, w_hh_t)  # [S, B, 3H]
                state = _gru_cell(steps_in[t], gates_h, state)
                outputs.append(state)
            layer_in = torch.stack(outputs, dim=1)  # [S, L, B, H]
            finals.append(state)
        return layer_in.transpose(1, 2), torch.stack(finals, dim=2)

    def step(
        self, x: Tensor, h: Tensor | None = None, reset: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """One step: ``x [S, B, input_size]``, ``h [S, B, num_layers, H]``, ``reset [S, B]``
        -> ``(y [S, B, H], h [S, B, num_layers, H])``. Always the torch loop: a rollout's
        step is then bit-equal to ``nn.GRU``'s, whatever runs the update."""
        reset = None if reset is None else reset.unsqueeze(2)
        y, h = self.forward(x.unsqueeze(2), h, reset, fused=False)
        return y[:, :, 0], h

    def extra_repr(self) -> str:
        return (
            f"num_seeds={self.num_seeds}, input_size={self.input_size}, "
            f"hidden_size={self.hidden_size}, num_layers={self.num_layers}"
        )


def _gru_cell(gates_in: Tensor, gates_h: Tensor, h: Tensor) -> Tensor:
    """torch's GRU cell on CPU (aten ``GRUCell``: the same operations in the same order)
    from the input gates ``[..., 3H]`` (``W_ih x + b_ih``), the hidden gates ``[..., 3H]``
    (``W_hh h + b_hh``) and the state ``h [..., H]``; gate order r, z, n.

    ``sigmoid`` reads the r and z gates as views with row stride ``2H``, so it runs row by
    row over ``H`` contiguous values, as in ``nn.GRU`` (whose gates are chunk views): the
    split of a row into vector lanes and a scalar tail, whose results differ in the last bit
    for ``sigmoid``, is then the same whatever the number of rows, i.e. of seeds stacked.
    (On one contiguous ``[S, B, H]`` tensor the split would depend on ``S * B * H``.)
    """
    H = h.shape[-1]
    pre_rz = gates_h[..., : 2 * H] + gates_in[..., : 2 * H]  # [..., 2H]
    reset_gate = pre_rz[..., :H].sigmoid()
    update_gate = pre_rz[..., H:].sigmoid()
    new_gate = (gates_in[..., 2 * H :] + gates_h[..., 2 * H :] * reset_gate).tanh()
    return (h - new_gate) * update_gate + new_gate


# ------------------------------------------------------------------------------------------
# stacking
# ------------------------------------------------------------------------------------------

#: torch module type -> the seed module class whose ``from_modules`` stacks it
_STACKABLE: dict[type, Any] = {nn.Linear: SeedLinear, nn.Sequential: SeedMLP, nn.GRU: SeedGRU}


def stack_modules(modules: Sequence[nn.Module]) -> nn.Module:
    """One seed module from S torch modules of one type and shape (seed k = ``modules[k]``;
    parameters copied exactly, the modules themselves left untouched).

    ``nn.Linear`` -> :class:`SeedLinear`; ``nn.Sequential`` of Linear and activation modules
    -> :class:`SeedMLP`; ``nn.GRU`` -> :class:`SeedGRU`. A backbone stacks by its parts:
    ``MLPBackbone.net`` is a Sequential; ``GRUBackbone`` is ``proj`` (a Sequential) then
    ``gru``.
    """
    modules = list(modules)
    if not modules:
        raise ValueError("need at least one module to stack (one per seed), got none")
    seed_cls = _STACKABLE.get(type(modules[0]))
    if seed_cls is None:
        raise TypeError(
            f"cannot stack {type(modules[0]).__name__}; stackable: "
            + ", ".join(t.__name__ for t in _STACKABLE)
        )
    return seed_cls.from_modules(modules)


def unstack(seed_module: nn.Module) -> list[nn.Module]:
    """The S torch modules of a seed module (copies of each seed's parameters): the inverse
    of :func:`stack_modules`."""
    if not isinstance(seed_module, (SeedLinear, SeedMLP, SeedGRU)):
        raise TypeError(
            f"unstack takes a SeedLinear, SeedMLP or SeedGRU, got {type(seed_module).__name__}"
        )
    return seed_module.unstack()


# ------------------------------------------------------------------------------------------
# per-seed optimisation
# ------------------------------------------------------------------------------------------


def _stacked_grads(params: Iterable[Tensor]) -> tuple[list[Tensor], int]:
    """The gradients of ``params`` (those that have one) and their common seed count."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        raise ValueError("no parameter has a gradient (run backward first)")
    num_seeds = grads[0].shape[0]
    for g in grads:
        if g.dim() == 0 or g.shape[0] != num_seeds:
            raise ValueError(
                f"every gradient must have the seed axis first ([S={num_seeds}, ...]), got "
                f"shape {list(g.shape)}"
            )
    return grads, num_seeds


@torch.no_grad()
def per_seed_grad_norm(params: Iterable[Tensor], norm_type: float = 2.0) -> Tensor:
    """``[S]``: entry s is the ``norm_type``-norm of seed s's gradients over every parameter
    (``params``: stacked, ``[S, ...]`` each; those without gradient are skipped), the total
    norm ``torch.nn.utils.clip_grad_norm_`` would compute for seed s alone: the norm of the
    per-parameter norms."""
    grads, _ = _stacked_grads(params)
    return clip_grads_per_seed_(grads, None, norm_type)  # the norms only, nothing clipped


@torch.no_grad()
def clip_grad_norm_per_seed_(
    params: Iterable[Tensor], max_norm: float | None, norm_type: float = 2.0
) -> Tensor:
    """Clip each seed's gradients by its own total norm, in place; returns the norms before
    clipping, ``[S]``.

    For each seed s, the same arithmetic as ``torch.nn.utils.clip_grad_norm_(seed s's
    parameters, max_norm)``: ``coef = min(max_norm / (norm_s + 1e-6), 1)``, every gradient
    slice of seed s multiplied by it. ``max_norm`` None: no clipping (norms only). A seed
    whose norm is NaN or inf gets NaN gradients and leaves the others untouched: pass
    ``torch.isfinite(norms)`` into the step mask (:meth:`SeedViews.attach_grads`).
    """
    grads, _ = _stacked_grads(params)
    return clip_grads_per_seed_(grads, max_norm, norm_type)


@torch.no_grad()
def clip_grads_per_seed_(
    grads: Sequence[Tensor], max_norm: float | None, norm_type: float = 2.0
) -> Tensor:
    """:func:`clip_grad_norm_per_seed_` on the gradients themselves (``grads``: ``[S, ...]``
    each, clipped in place); returns the norms before clipping, ``[S]``.

    Each seed's total norm is reduced over its own row alone. A norm over the seed axis of a
    ``[P, S]`` table (``vector_norm(dim=0)``) vectorises across the seeds, so its summation
    order, and the last bits of seed s's norm, depend on S. Here each seed's per-parameter
    norms form one contiguous row of ``[S, P]`` and that row is reduced by itself: the same
    arithmetic whatever the stack size, so a seed in a stack logs and clips by exactly the
    norm it has alone (``--seeds k``)."""
    grads = list(grads)
    if not grads:
        raise ValueError("no gradients to clip (run backward first)")
    num_seeds, norm_type = grads[0].shape[0], float(norm_type)
    per_param = torch.stack(
        [torch.linalg.vector_norm(g.reshape(num_seeds, -1), norm_type, dim=1) for g in grads],
        dim=1,
    )  # [S, P], each row contiguous
    norms = torch.stack([torch.linalg.vector_norm(row, norm_type) for row in per_param])
    if max_norm is None:
        return norms
    coef = (float(max_norm) / (norms + 1e-6)).clamp(max=1.0)  # [S]
    for g in grads:
        g.mul_(coef.to(g.dtype).view(-1, *([1] * (g.dim() - 1))))
    return norms


class SeedViews:
    """One leaf parameter per (seed, stacked parameter), aliasing the stack: a stock torch
    optimizer over them keeps per-seed state and can leave seeds out of a step.

    A stock ``torch.optim.Adam`` over the stacked parameters themselves is elementwise and so
    per-seed independent while every seed steps, but it keeps one step count per stacked
    tensor: a seed that skips steps (target-KL early stop, a non-finite loss) would then get
    the others' bias correction. Over the views, each seed's state (``step``, ``exp_avg``,
    ``exp_avg_sq``) is its own, exactly what a single-seed run's optimiser holds, and a view
    without gradient is skipped by the optimiser (no parameter change, no state change).

    Usage (one update step)::

        views = SeedViews(model.parameters())                 # model: a seed module
        optimizer = torch.optim.Adam(views.parameters(), lr=3e-4, eps=1e-5)
        ...
        views.zero_grad()                                     # stacked and view gradients
        per_seed_loss.sum().backward()                        # per_seed_loss: [S]
        norms = clip_grad_norm_per_seed_(views.stacked, max_norm)
        views.attach_grads(active & torch.isfinite(norms))    # step_mask [S] bool
        optimizer.step()

    The views share storage with the stacked parameters (the optimizer's in-place update is
    the stack's update) and their gradients are views of the stacked gradients (no copy):
    build the views after the module is on its device and dtype (``.to()`` makes new
    tensors). Cost: the optimizer's per-tensor Python runs S times as often as over the
    stack (measured by ``benchmarks/seed_batched_probe.py``).
    """

    def __init__(self, stacked: Iterable[Tensor]) -> None:
        self.stacked: list[Tensor] = list(stacked)
        if not self.stacked:
            raise ValueError("SeedViews needs at least one stacked parameter")
        self.num_seeds = int(self.stacked[0].shape[0]) if self.stacked[0].dim() else 0
        for p in self.stacked:
            if p.dim() == 0 or p.shape[0] != self.num_seeds:
                raise ValueError(
                    f"every parameter must have the seed axis first ([S={self.num_seeds}, "
                    f"...]), got shape {list(p.shape)}"
                )
        #: ``per_seed[k][i]``: seed k's slice of stacked parameter i, a leaf aliasing it
        self.per_seed: list[list[nn.Parameter]] = [
            [nn.Parameter(p.detach()[k], requires_grad=p.requires_grad) for p in self.stacked]
            for k in range(self.num_seeds)
        ]

    def parameters(self) -> list[nn.Parameter]:
        """Every view, seed-major (seed 0's parameters first): the optimizer's parameters."""
        return [v for views in self.per_seed for v in views]

    def zero_grad(self) -> None:
        """Drop the gradients of the stacked parameters and of the views."""
        for p in self.stacked:
            p.grad = None
        for views in self.per_seed:
            for v in views:
                v.grad = None

    def attach_grads(self, step_mask: Tensor | Sequence[bool] | None = None) -> None:
        """Give seed k's views seed k's slice of the stacked gradients where ``step_mask[k]``
        (``[S]`` bool; None: every seed), and no gradient elsewhere, so that the next
        ``optimizer.step()`` leaves the masked-out seeds exactly as they are (parameters and
        optimiser state)."""
        if step_mask is None:
            active = [True] * self.num_seeds
        elif isinstance(step_mask, (list, tuple)):
            active = [bool(v) for v in step_mask]
        else:
            active = [bool(v) for v in torch.as_tensor(step_mask).reshape(-1).tolist()]
            if len(active) != self.num_seeds:
                raise ValueError(
                    f"step_mask must have one entry per seed ({self.num_seeds}), got {len(active)}"
                )
        for k, views in enumerate(self.per_seed):
            for v, p in zip(views, self.stacked, strict=True):
                v.grad = p.grad[k] if active[k] and p.grad is not None else None

    def seed_state_dict(self, optimizer: torch.optim.Optimizer, seed: int) -> dict[str, Any]:
        """Seed ``seed``'s share of ``optimizer`` (over :meth:`parameters`, in one param group
        or in one group per seed)
        as the ``state_dict`` of the same optimizer over that seed's unstacked parameters
        (in the stacked parameters' order): loadable by a single-seed run's optimizer."""
        views = self.per_seed[seed]
        groups = [g for g in optimizer.param_groups if any(p is views[0] for p in g["params"])]
        if len(groups) != 1:
            raise ValueError("seed_state_dict: the optimizer does not hold this seed's views")
        group = {k: v for k, v in groups[0].items() if k != "params"}
        state = {}
        for i, v in enumerate(views):
            if v in optimizer.state and optimizer.state[v]:
                state[i] = {k: t.clone() if isinstance(t, Tensor) else t
                            for k, t in optimizer.state[v].items()}  # fmt: skip
        return {"state": state, "param_groups": [{**group, "params": list(range(len(views)))}]}


# ------------------------------------------------------------------------------------------
# per-seed whitening
# ------------------------------------------------------------------------------------------


def seed_group_key(
    x: Tensor, group: Tensor | None = None, *, num_groups: int | None = None
) -> Tensor:
    """The group key that makes the grouped whitening kernel per seed: ``seed * G + group``.

    Args:
        x: ``[S, ...]`` the values to whiten (only its shape is read).
        group: integer ids broadcastable to ``x`` (``[S, ...]``, or ``x.shape[1:]``-like
            shared by all seeds), or None: one group per seed. Negative ids (padding at
            masked-out entries) stay negative.
        num_groups: ``G``, an upper bound on the ids (default: the largest id + 1).

    Returns:
        int64 ids broadcastable to ``x``: in ``[s * G, (s + 1) * G)`` for seed s, so
        :func:`marl.core.whitening.whiten` (and ``group_moments``, ``RunningMoments`` with
        ``num_groups = S * G``) computes every statistic over one seed's entries only.
    """
    if not isinstance(x, Tensor) or x.dim() < 1:
        raise ValueError("x must be a tensor [S, ...] with the seed axis first")
    num_seeds = x.shape[0]
    seed = torch.arange(num_seeds, device=x.device).view(num_seeds, *([1] * (x.dim() - 1)))
    if group is None:
        return seed
    group = group.long()
    if group.dim() > x.dim():
        raise ValueError(f"group has shape {list(group.shape)}, more dims than x {list(x.shape)}")
    if num_groups is None:
        num_groups = int(group.max()) + 1 if group.numel() else 1
    return torch.where(group >= 0, seed * num_groups + group, -1)


def whiten_per_seed(
    x: Tensor,
    *,
    mask: Tensor | None = None,
    group: Tensor | None = None,
    num_groups: int | None = None,
    **whiten_kw: Any,
) -> Tensor:
    """``whiten`` of each seed's slice ``x[s]`` on its own (``x [S, ...]``, mask and group as
    :func:`seed_group_key`), in one call of the grouped kernel."""
    key = seed_group_key(x, group, num_groups=num_groups)
    return whiten(x, mask=mask, group=key, **whiten_kw)


# ------------------------------------------------------------------------------------------
# the rollout's fast path (appended for marl.models.seed_policies)
# ------------------------------------------------------------------------------------------


def run_seed_mlp(net: SeedMLP | SeedLinear, x: Tensor) -> Tensor:
    """``net(x)`` for ``x [S, N, in_features]`` (3-D) without module calls: the same
    operations as :meth:`SeedMLP.forward` / :meth:`SeedLinear.forward` (so the same bits),
    without their checks and per-module call overhead, which a rollout step's small batched
    matmuls feel (as ``seqmodels.backbones.run_sequential`` for the single-seed torso)."""
    layers = (net,) if isinstance(net, SeedLinear) else net.layers
    for layer in layers:
        if type(layer) is SeedLinear:
            x = seed_linear(x, layer.weight, layer.bias)
        else:
            fn = _FUNCTIONAL.get(type(layer))
            x = fn(x) if fn is not None else layer(x)
    return x
