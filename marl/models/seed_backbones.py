"""Seed-stacked backbones: S single-seed ``seqmodels.backbones`` as one module with a leading
seed axis, the backbones of :mod:`marl.models.seed_policies`' actors.

Every parameter is ``[S, ...]`` (seed k's slice is exactly seed k's single-seed parameter)
and every input, output and state gains a leading seed axis (:class:`SeedBackbone`'s
contract). The helpers below the imports (seed-axis shape checks, stacking, the batched
layer call) are shared with :mod:`marl.models.seed_policies`.

Backbones (:func:`stack_backbones`):

- ``mlp``: :class:`SeedMLPBackbone` (one ``baddbmm`` per layer for all seeds);
- ``gru``: :class:`SeedGRUBackbone` (projection and GRU cell batched over seeds);
- ``mamba``, ``mamba2`` and any other registered backbone: :class:`SeedLoopBackbone`, the
  *unbatched path*: its parameters are stacked like the others', but it calls seed k's own
  single-seed module on seed k's rows, one seed after another. Mamba's fused kernels take one
  set of per-channel parameters per call, so batching seeds needs a kernel with grouped B/C
  (mamba) or seeds folded into heads and groups (mamba2: ``H' = S H``, ``G' = S G``, the
  fused step kernel's field-by-field column layout for in_proj's output, the conv state and
  the conv weights). On one CPU thread the fold measured slower per seed than the unfolded
  kernel (the folded state no longer stays in cache, and per-seed episode resets force a
  copy of the folded SSM state at nearly every step), and batching the projections and norms
  around the blocks saved little (figures: ``benchmarks/seed_policies_probe.py``, git
  history of BENCHMARKS.md). So this module does not fold on CPU; a GPU, where kernel
  launches rather than arithmetic bound a step, is where a fold would pay.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call

from marl.core.seed_batched import SeedGRU, SeedLinear, SeedMLP, run_seed_mlp
from seqmodels.backbones import Backbone, GRUBackbone, MLPBackbone

__all__ = [
    "SEED_BACKBONES",
    "SeedBackbone",
    "SeedGRUBackbone",
    "SeedLoopBackbone",
    "SeedMLPBackbone",
    "Unstacks",
    "stack_backbones",
]

State = tuple[Tensor, ...]


def _same_type(modules: Sequence[nn.Module], what: type, name: str) -> list[nn.Module]:
    modules = list(modules)
    if not modules:
        raise ValueError(f"need at least one {name} to stack (one per seed), got none")
    for i, m in enumerate(modules):
        if type(m) is not type(modules[0]) or not isinstance(m, what):
            raise TypeError(
                f"{name}s to stack must be {what.__name__} of one type; {name} {i} is "
                f"{type(m).__name__}, {name} 0 is {type(modules[0]).__name__}"
            )
    return modules


def _check_seed_tensor(x: object, shape: Sequence[int | None], name: str) -> Tensor:
    """``x`` as a tensor whose shape matches ``shape`` (None: any size there)."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    mismatch = x.dim() != len(shape) or any(
        w is not None and w != g for w, g in zip(shape, x.shape, strict=True)
    )
    if mismatch:
        want = ", ".join("*" if w is None else str(w) for w in shape)
        raise ValueError(f"{name} must have shape [{want}], got {list(x.shape)}")
    return x


def _apply(net: SeedMLP | SeedLinear, x: Tensor) -> Tensor:
    """``net(x)`` for ``x [S, ..., in]`` -> ``[S, ..., out]`` through :func:`run_seed_mlp` (the
    same operations as the module call, without its per-module overhead)."""
    if x.dim() == 3:
        return run_seed_mlp(net, x)
    y = run_seed_mlp(net, x.reshape(x.shape[0], -1, x.shape[-1]))
    return y.reshape(*x.shape[:-1], y.shape[-1])


def _stack(tensors: Sequence[Tensor]) -> Tensor:
    """``[S, ...]`` from S tensors; one tensor gains the seed axis as a view (no copy)."""
    return tensors[0].unsqueeze(0) if len(tensors) == 1 else torch.stack(list(tensors))


def _stack_states(per_seed: Sequence[State]) -> State:
    """S single-seed states (tuples of ``[B, ...]``) -> one tuple of ``[S, B, ...]``."""
    return tuple(_stack(parts) for parts in zip(*per_seed, strict=True))


# ------------------------------------------------------------------------------------------
# backbones
# ------------------------------------------------------------------------------------------


class Unstacks:
    """What every stacked module does with its seeds, from its ``single_seed_names()``
    (stacked parameter name -> the single-seed module's), ``num_seeds`` and ``_template`` (a
    copy of seed 0's single-seed module, not a submodule)."""

    num_seeds: int
    _template: tuple[nn.Module]

    def seed_state_dict(self, seed: int) -> dict[str, Tensor]:
        """Seed ``seed``'s parameters (views of the stack) under the single-seed names: a
        ``state_dict`` that the single-seed module loads."""
        params = dict(self.named_parameters())  # type: ignore[attr-defined]
        return {single: params[name][seed] for name, single in self.single_seed_names().items()}

    def single_seed_names(self) -> dict[str, str]:
        """Stacked parameter name -> the single-seed module's parameter name."""
        raise NotImplementedError

    def unstack(self) -> list[Any]:
        """S single-seed modules holding copies of each seed's parameters."""
        device = next(self.parameters()).device  # type: ignore[attr-defined]
        modules = []
        for k in range(self.num_seeds):
            module = copy.deepcopy(self._template[0]).to(device)
            module.load_state_dict(self.seed_state_dict(k))
            modules.append(module)
        return modules


class SeedBackbone(Unstacks, nn.Module):
    """S backbones of one kind with a leading seed axis (``seqmodels.backbones``' contract)::

        initial_state(batch) -> tuple of [S, batch, ...]
        step(x [S, B, D], state, reset [S, B] | None) -> (y [S, B, H], state)
        forward(x [S, B, L, D], state | None, resets [S, B, L] | None) -> (y [S, B, L, H], state)
        unstack() -> S single-seed backbones (copies)
        seed_state_dict(k) -> seed k's parameters under the single-seed module's names

    ``batched`` says whether the seeds are computed together (one call for all seeds) or one
    after another (:class:`SeedLoopBackbone`).
    """

    num_seeds: int
    input_dim: int
    output_dim: int
    is_recurrent: bool
    batched: bool = True

    def _init_from(self, backbones: Sequence[Backbone]) -> None:
        first = backbones[0]
        self.num_seeds = len(backbones)
        self.input_dim, self.output_dim = first.input_dim, first.output_dim
        self.is_recurrent = bool(first.is_recurrent)
        #: seed 0's module, the structure :meth:`unstack` copies (not a submodule: its
        #: parameters are not the stack's)
        self._template: tuple[Backbone] = (copy.deepcopy(first),)

    def _check_step(self, x: Tensor, reset: Tensor | None) -> tuple[Tensor, Tensor | None]:
        x = _check_seed_tensor(x, [self.num_seeds, None, self.input_dim], "x")
        if reset is not None:
            reset = _check_seed_tensor(reset, [self.num_seeds, x.shape[1]], "reset").bool()
        return x, reset

    def _check_seq(self, x: Tensor, resets: Tensor | None) -> tuple[Tensor, Tensor | None]:
        x = _check_seed_tensor(x, [self.num_seeds, None, None, self.input_dim], "x")
        if resets is not None:
            want = [self.num_seeds, x.shape[1], x.shape[2]]
            resets = _check_seed_tensor(resets, want, "resets").bool()
        return x, resets


class SeedMLPBackbone(SeedBackbone):
    """S :class:`seqmodels.backbones.MLPBackbone` (no memory; state ``()``): ``net`` is their
    layers as one :class:`SeedMLP`."""

    is_recurrent = False

    def __init__(self, backbones: Sequence[MLPBackbone]) -> None:
        super().__init__()
        backbones = _same_type(backbones, MLPBackbone, "backbone")
        self._init_from(backbones)
        self.net = SeedMLP.from_modules([b.net for b in backbones])

    def single_seed_names(self) -> dict[str, str]:
        return {f"net.layers.{name[len('layers.') :]}": f"net.{name[len('layers.') :]}"
                for name, _ in self.net.named_parameters()}  # fmt: skip

    def initial_state(self, batch_size: int) -> State:
        return ()

    def step(
        self, x: Tensor, state: State | None = (), reset: Tensor | None = None
    ) -> tuple[Tensor, State]:
        """x ``[S, B, input_dim]`` -> (y ``[S, B, hidden_dim]``, ())."""
        x, _ = self._check_step(x, reset)
        return _apply(self.net, x), ()

    def forward(
        self, x: Tensor, state: State | None = None, resets: Tensor | None = None
    ) -> tuple[Tensor, State]:
        """x ``[S, B, L, input_dim]`` -> (y ``[S, B, L, hidden_dim]``, ())."""
        x, _ = self._check_seq(x, resets)
        return _apply(self.net, x), ()


class SeedGRUBackbone(SeedBackbone):
    """S :class:`seqmodels.backbones.GRUBackbone`: ``proj`` (Linear + activation, a
    :class:`SeedMLP`) then ``gru`` (:class:`SeedGRU`); state ``(h [S, B, num_layers, H],)``,
    zeroed per row at episode starts as ``GRUBackbone`` does."""

    is_recurrent = True

    def __init__(self, backbones: Sequence[GRUBackbone]) -> None:
        super().__init__()
        backbones = _same_type(backbones, GRUBackbone, "backbone")
        self._init_from(backbones)
        self.num_layers = backbones[0].num_layers
        self.proj = SeedMLP.from_modules([b.proj for b in backbones])
        self.gru = SeedGRU.from_modules([b.gru for b in backbones])

    def single_seed_names(self) -> dict[str, str]:
        names = {f"proj.layers.{name[len('layers.') :]}": f"proj.{name[len('layers.') :]}"
                 for name, _ in self.proj.named_parameters()}  # fmt: skip
        names.update({f"gru.{name}": f"gru.{name}" for name, _ in self.gru.named_parameters()})
        return names

    def initial_state(self, batch_size: int) -> State:
        return (self.gru.initial_state(batch_size),)

    @staticmethod
    def _h(state: State | None) -> Tensor | None:
        """``h`` of a state ``(h,)`` (None: zeros; SeedGRU checks its shape)."""
        if state is None:
            return None
        if not isinstance(state, (tuple, list)) or len(state) != 1:
            raise TypeError("gru state must be a 1-tuple (h,) as returned by initial_state")
        return state[0]

    def step(
        self, x: Tensor, state: State | None, reset: Tensor | None = None
    ) -> tuple[Tensor, State]:
        """x ``[S, B, input_dim]``, state ``(h [S, B, num_layers, H],)``, reset ``[S, B]`` ->
        (y ``[S, B, H]``, state)."""
        x, reset = self._check_step(x, reset)
        y, h = self.gru.step(_apply(self.proj, x), self._h(state), reset)
        return y, (h,)

    def forward(
        self, x: Tensor, state: State | None = None, resets: Tensor | None = None
    ) -> tuple[Tensor, State]:
        """x ``[S, B, L, input_dim]``, state ``(h [S, B, num_layers, H],)`` or None, resets
        ``[S, B, L]`` -> (y ``[S, B, L, H]``, state after the last step)."""
        x, resets = self._check_seq(x, resets)
        y, h = self.gru(_apply(self.proj, x), self._h(state), resets)
        return y, (h,)


class _BackboneCall(nn.Module):
    """One backbone behind a single ``forward`` (``torch.func.functional_call`` calls
    ``forward`` only): ``step=True`` runs ``backbone.step``."""

    def __init__(self, backbone: Backbone) -> None:
        super().__init__()
        self.backbone = backbone

    def forward(
        self, x: Tensor, state: State | None, resets: Tensor | None, step: bool
    ) -> tuple[Tensor, State]:
        if step:
            return self.backbone.step(x, state, resets)
        return self.backbone(x, state, resets)


class SeedLoopBackbone(SeedBackbone):
    """The unbatched path: S backbones of any kind (mamba, mamba2, a registered one) with
    stacked parameters, computed one seed after another by seed k's own module.

    ``stacked`` holds the parameters: a copy of seed 0's backbone whose every parameter is
    replaced by the stack ``[S, ...]`` of the seeds' (the single-seed names and nesting, so
    ``state_dict`` keys are the single-seed keys under ``stacked.``). It is a container and
    is never called. Seed k is computed by a private single-seed module ("runner") of the
    same kind: without autograd (rollouts) its parameters are views of seed k's slices of the
    stack (no copy; an optimizer's in-place step is seen at once; rebuilt when the stack's
    tensors are replaced, e.g. by ``.to()``); with autograd, ``torch.func.functional_call``
    runs it on the slices, so the gradients land in the stack. Each runner keeps its own
    caches (Mamba's step-kernel parameter views).

    Seed k's outputs, states and gradients (for the same inputs and upstream gradients) are
    those of the single-seed module, bit for bit. The cost over S single-seed modules is the
    per-seed slicing of inputs and states, the stacking of outputs and new states (a copy
    the separate modules do not make) and, with autograd, ``functional_call``'s parameter
    swap (measured by benchmarks/seed_policies_probe.py), the fused step kernels and the
    per-seed torch ops being the same.

    Backbones with buffers are refused (none of the built-in kinds has one).
    """

    batched = False

    def __init__(self, backbones: Sequence[Backbone]) -> None:
        super().__init__()
        backbones = _same_type(backbones, nn.Module, "backbone")
        first = backbones[0]
        if any(True for _ in first.buffers()):
            raise TypeError(
                f"SeedLoopBackbone stacks parameters only; {type(first).__name__} has buffers "
                f"({[name for name, _ in first.named_buffers()]})"
            )
        names = [name for name, _ in first.named_parameters()]
        for i, b in enumerate(backbones):
            shapes = {name: tuple(p.shape) for name, p in b.named_parameters()}
            if shapes != {name: tuple(p.shape) for name, p in first.named_parameters()}:
                raise ValueError(f"backbone {i} has other parameters than backbone 0: {shapes}")
        self._init_from(backbones)
        self.stacked = copy.deepcopy(first)
        with torch.no_grad():
            for name in names:
                owner, attr = self._owner(self.stacked, name)
                parts = [b.get_parameter(name) for b in backbones]
                stacked = torch.stack([p.detach() for p in parts])
                setattr(owner, attr, nn.Parameter(stacked, requires_grad=parts[0].requires_grad))
        self._names = names
        #: (module, attribute) of each stacked parameter in ``stacked``, and in each runner
        self._slots = [self._owner(self.stacked, name) for name in names]
        self._runners = [_BackboneCall(copy.deepcopy(first)) for _ in backbones]
        self._runner_slots = [
            [self._owner(runner.backbone, name) for name in names] for runner in self._runners
        ]
        self._aliased: tuple[int, ...] | None = None

    @staticmethod
    def _owner(root: nn.Module, name: str) -> tuple[nn.Module, str]:
        path, _, attr = name.rpartition(".")
        return root.get_submodule(path), attr

    def single_seed_names(self) -> dict[str, str]:
        return {f"stacked.{name}": name for name in self._names}

    def _stacked_params(self) -> list[Tensor]:
        return [getattr(owner, attr) for owner, attr in self._slots]

    def _alias_runners(self, stacked: Sequence[Tensor]) -> None:
        """Make every runner's parameters views of its seed's slices of the stack (once per
        set of stacked tensors: keyed on their data pointers)."""
        key = tuple(p.data_ptr() for p in stacked)
        if key == self._aliased:
            return
        for k, slots in enumerate(self._runner_slots):
            for (owner, attr), p in zip(slots, stacked, strict=True):
                setattr(owner, attr, nn.Parameter(p.detach()[k], requires_grad=False))
        self._aliased = key

    def _run(
        self,
        step: bool,
        xs: Sequence[Tensor],
        states: Sequence[State | None],
        resets: Sequence[Tensor | None] | None,
        seeds: Sequence[int] | None = None,
    ) -> list[tuple[Tensor, State]]:
        """Seed ``seeds[i]``'s backbone on ``xs[i]``, ``states[i]``, ``resets[i]`` (single-seed
        shapes; ``seeds`` None: every seed in order), one after another."""
        seeds = range(self.num_seeds) if seeds is None else seeds
        stacked = self._stacked_params()
        outs = []
        if torch.is_grad_enabled() and any(p.requires_grad for p in stacked):
            names = [f"backbone.{name}" for name in self._names]
            for i, k in enumerate(seeds):
                params = {name: p[k] for name, p in zip(names, stacked, strict=True)}
                args = (xs[i], states[i], None if resets is None else resets[i], step)
                outs.append(
                    functional_call(self._runners[k], params, args, strict=True, tie_weights=False)
                )
            return outs
        self._alias_runners(stacked)
        for i, k in enumerate(seeds):
            outs.append(
                self._runners[k](xs[i], states[i], None if resets is None else resets[i], step)
            )
        return outs

    def initial_state(self, batch_size: int) -> State:
        self._alias_runners(self._stacked_params())
        return _stack_states([r.backbone.initial_state(batch_size) for r in self._runners])

    def _seed_states(self, state: State | None, batch: int) -> list[State | None]:
        if state is None:
            return [None] * self.num_seeds
        if not isinstance(state, (tuple, list)):
            raise TypeError("state must be a tuple of [S, B, ...] tensors (initial_state)")
        for i, s in enumerate(state):
            if not isinstance(s, Tensor) or tuple(s.shape[:2]) != (self.num_seeds, batch):
                got = list(s.shape) if isinstance(s, Tensor) else type(s).__name__
                raise ValueError(
                    f"state[{i}] must have shape [S={self.num_seeds}, B={batch}, ...], got {got}"
                )
        return [tuple(s[k] for s in state) for k in range(self.num_seeds)]

    def step(
        self, x: Tensor, state: State | None, reset: Tensor | None = None
    ) -> tuple[Tensor, State]:
        """x ``[S, B, input_dim]``, state (tuple of ``[S, B, ...]``), reset ``[S, B]`` ->
        (y ``[S, B, H]``, state): ``backbone_k.step(x[k], state[k], reset[k])`` for each k."""
        x, reset = self._check_step(x, reset)
        outs = self._run(True, x, self._seed_states(state, x.shape[1]), reset)
        return _stack([y for y, _ in outs]), _stack_states([s for _, s in outs])

    def forward(
        self, x: Tensor, state: State | None = None, resets: Tensor | None = None
    ) -> tuple[Tensor, State]:
        """x ``[S, B, L, input_dim]``, state or None, resets ``[S, B, L]`` -> (y ``[S, B, L,
        H]``, state after the last step): ``backbone_k(x[k], state[k], resets[k])`` for each
        k."""
        x, resets = self._check_seq(x, resets)
        outs = self._run(False, x, self._seed_states(state, x.shape[1]), resets)
        return _stack([y for y, _ in outs]), _stack_states([s for _, s in outs])

    def forward_seed(
        self, seed: int, x: Tensor, state: State | None, resets: Tensor | None
    ) -> tuple[Tensor, State]:
        """Seed ``seed``'s backbone alone on single-seed inputs (any batch size):
        ``x [B, L, D]`` -> (``y [B, L, H]``, state). Used where seeds need different rows
        (the burn-in of :meth:`marl.models.seed_policies.SeedTypeActor.chunks`)."""
        return self._run(False, [x], [state], None if resets is None else [resets], [seed])[0]


#: single-seed backbone type -> the seed backbone class that stacks it batched; any other
#: backbone stacks as a :class:`SeedLoopBackbone`
SEED_BACKBONES: dict[type, Callable[[Sequence[Any]], SeedBackbone]] = {
    MLPBackbone: SeedMLPBackbone,
    GRUBackbone: SeedGRUBackbone,
}


def stack_backbones(backbones: Sequence[Backbone]) -> SeedBackbone:
    """S single-seed backbones of one kind -> one seed backbone (parameters copied exactly):
    batched for mlp and gru (:data:`SEED_BACKBONES`), the unbatched
    :class:`SeedLoopBackbone` otherwise."""
    backbones = _same_type(backbones, nn.Module, "backbone")
    build = SEED_BACKBONES.get(type(backbones[0]), SeedLoopBackbone)
    return build(backbones)
