"""Seed-stacked actors and critic: S single-seed policies as one module with a leading seed axis.

Issue 37 trains S seeds in one process by stacking them: every parameter of the modules here
is ``[S, ...]`` (seed k's slice is exactly seed k's single-seed parameter) and every input and
output gains a leading seed axis. They are built from the modules the single-seed code builds
(:func:`build_seed_policies` mirrors the trainer's seeding), and :meth:`unstack` gives those
modules back.

=============================== =========================================================
:class:`SeedTypeActor`          S :class:`marl.models.policies.TypeActor` of one agent type
:class:`SeedMultiAgentPolicy`   S :class:`marl.models.policies.MultiAgentPolicy`
:class:`SeedCentralCritic`      S :class:`marl.models.policies.CentralCritic`
:func:`stack_policies`          S TypeActor or MultiAgentPolicy -> the seed module
:func:`stack_critics`           S CentralCritic -> :class:`SeedCentralCritic`
:func:`stack_backbones`         S backbones of ``seqmodels.backbones`` -> a seed backbone
:func:`build_seed_policies`     the trainer's initialisation for each seed, stacked, and a
                                generator per seed continuing that run's global generator
:func:`seed_neg_gumbel_noise`   sampling noise ``[S, ...]``, seed k's from seed k's generator
=============================== =========================================================

Shapes (S seeds, E envs, n agents of the type, D observation size, A actions, B units of a
training window, P burn-in prefix steps, L loss steps; ``...`` a single-seed shape):

- actor step: ``obs [S, E, n, D]``, ``mask [S, E, n, A]``, ``reset [S, E]`` -> actions,
  log-probs ``[S, E, n]``; state: a tuple of ``[S, E * n, ...]`` (seed k's slice is the
  single-seed state of seed k's actor).
- actor windows: ``obs [S, B, P + L, n, D]``, ``mask [S, B, L, n, A]``, ``resets [S, B, P + L]``,
  ``burn_in [S, B]`` -> a distribution over ``[S, B, L, n]``.
- critic: ``state [S, ..., state_dim]`` -> team ``[S, ..., K]``, individual ``[S, ..., N, K]``.

Backbones (:func:`stack_backbones`: :class:`SeedMLPBackbone` and :class:`SeedGRUBackbone`
batched over seeds, :class:`SeedLoopBackbone` the unbatched path for mamba, mamba2 and any
other registered backbone) live in :mod:`marl.models.seed_backbones`, which says why mamba
is not folded over seeds; this module re-exports them.

Equality (tests/test_seed_policies.py, one torch thread, CPU):

- seed k in a stack of S equals seed k in a stack of one *bit for bit*: outputs, new states,
  sampled actions and every gradient (``--seeds 0-15`` vs ``--seeds k``). The seed modules only
  use batched matmuls (one GEMM per seed, shapes independent of S), row-wise or elementwise
  operations whose bits do not depend on the number of seeds (:mod:`marl.core.seed_batched`),
  and per-seed calls.
- against the single-seed modules: the unbatched path's backbone is the single-seed module
  itself (bit-equal); the batched layers (``baddbmm`` in place of ``addmm``; SiLU through
  ``exp``; a batched burn-in runs every unit, the single-seed one a group's rows) agree to
  float32 rounding, so logits, values and states agree to ``rtol=1e-5, atol=1e-6`` and
  gradients to ``rtol=1e-4, atol=1e-6``, not bit for bit (a GEMM's bits depend on its row
  count and on bmm vs addmm for some shapes; the rollout step's logits came out bit-equal
  for every backbone at the tested shapes, which the tests do not pin).
- action sampling: seed k's noise comes from seed k's generator only
  (:func:`seed_neg_gumbel_noise`), drawn as the single-seed ``TypeActor.act`` draws it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from marl.core.seed_batched import SeedLinear, SeedMLP
from marl.models.policies import (
    MASK_LOGIT,
    AgentLayout,
    CentralCritic,
    MaskedCategorical,
    MultiAgentPolicy,
    TypeActor,
    gumbel_max,
    neg_gumbel_noise,
)
from marl.models.seed_backbones import (
    SEED_BACKBONES,
    SeedBackbone,
    SeedGRUBackbone,
    SeedLoopBackbone,
    SeedMLPBackbone,
    State,
    _apply,
    _check_seed_tensor,
    _same_type,
    _stack_states,
    stack_backbones,
)

__all__ = [
    "SEED_BACKBONES",
    "SeedBackbone",
    "SeedCentralCritic",
    "SeedGRUBackbone",
    "SeedLoopBackbone",
    "SeedMLPBackbone",
    "SeedMultiAgentPolicy",
    "SeedPolicies",
    "SeedTypeActor",
    "build_seed_policies",
    "seed_neg_gumbel_noise",
    "stack_backbones",
    "stack_critics",
    "stack_policies",
]


# ------------------------------------------------------------------------------------------
# actors
# ------------------------------------------------------------------------------------------


def seed_neg_gumbel_noise(
    shape: Sequence[int],
    generators: Sequence[torch.Generator],
    device: torch.device | str | None = None,
) -> Tensor:
    """``[S, *shape]`` negated Gumbel noise: entry k drawn by
    :func:`marl.models.policies.neg_gumbel_noise` from ``generators[k]`` alone (what a single-seed
    run with that generator draws), so seed k's samples depend on seed k's generator only."""
    generators = list(generators)
    if not generators or not all(isinstance(g, torch.Generator) for g in generators):
        raise TypeError("generators must be a non-empty sequence of torch.Generator, one per seed")
    return torch.stack([neg_gumbel_noise(tuple(shape), g, device) for g in generators])


class SeedTypeActor(nn.Module):
    """S :class:`marl.models.policies.TypeActor` of one agent type, stacked; the same methods with a
    leading seed axis on every input and output (module docstring)."""

    def __init__(self, actors: Sequence[TypeActor]) -> None:
        super().__init__()
        actors = _same_type(actors, TypeActor, "actor")
        first = actors[0]
        for i, a in enumerate(actors):
            dims = (a.obs_dim, a.n_agents, a.n_actions)
            if dims != (first.obs_dim, first.n_agents, first.n_actions):
                raise ValueError(
                    f"actor {i} has (obs_dim, n_agents, n_actions) {dims}; actor 0 has "
                    f"{(first.obs_dim, first.n_agents, first.n_actions)}"
                )
        self.num_seeds = len(actors)
        self.obs_dim, self.n_agents, self.n_actions = first.obs_dim, first.n_agents, first.n_actions
        self.backbone = stack_backbones([a.backbone for a in actors])
        self.head = SeedLinear.from_modules([a.head for a in actors])
        self.register_buffer("agent_onehot", torch.eye(self.n_agents), persistent=False)
        self._template: tuple[TypeActor] = (copy.deepcopy(first),)

    @property
    def is_recurrent(self) -> bool:
        return bool(self.backbone.is_recurrent)

    # -- stacking ----------------------------------------------------------------------------

    def single_seed_names(self) -> dict[str, str]:
        """Stacked parameter name -> the single-seed ``TypeActor``'s parameter name."""
        names = {f"backbone.{s}": f"backbone.{t}"
                 for s, t in self.backbone.single_seed_names().items()}  # fmt: skip
        names.update({"head.weight": "head.weight", "head.bias": "head.bias"})
        return names

    def seed_state_dict(self, seed: int) -> dict[str, Tensor]:
        """Seed ``seed``'s parameters (views) under the ``TypeActor`` names: its state_dict."""
        params = dict(self.named_parameters())
        return {single: params[name][seed] for name, single in self.single_seed_names().items()}

    def unstack(self) -> list[TypeActor]:
        """S single-seed ``TypeActor`` with copies of each seed's parameters."""
        device = self.head.weight.device
        actors = []
        for k in range(self.num_seeds):
            actor = copy.deepcopy(self._template[0]).to(device)
            actor.load_state_dict(self.seed_state_dict(k))
            actors.append(actor)
        return actors

    # -- rollout -----------------------------------------------------------------------------

    def initial_state(self, num_envs: int) -> State:
        """State for ``num_envs * n_agents`` rows per seed: tuple of ``[S, E * n, ...]``."""
        return tuple(self.backbone.initial_state(num_envs * self.n_agents))

    def inputs(self, obs: Tensor) -> Tensor:
        """``obs [S, ..., n, D]`` -> ``[S, ..., n, D + n]`` (agent one-hot appended)."""
        onehot = self.agent_onehot.to(obs.dtype).expand(*obs.shape[:-1], self.n_agents)
        return torch.cat([obs, onehot], dim=-1)

    def _step_logits(self, obs: Tensor, state: State, reset: Tensor | None) -> tuple[Tensor, State]:
        """obs ``[S, E, n, D]``, reset ``[S, E]`` -> (logits ``[S, E, n, A]``, new state)."""
        S, n = self.num_seeds, self.n_agents
        obs = _check_seed_tensor(obs, [S, None, n, self.obs_dim], "obs")
        E = obs.shape[1]
        x = self.inputs(obs).reshape(S, E * n, -1)
        r = None
        if reset is not None:
            r = _check_seed_tensor(reset, [S, E], "reset").repeat_interleave(n, dim=1)
        y, state = self.backbone.step(x, state, r)
        return _apply(self.head, y).reshape(S, E, n, self.n_actions), state

    def step(
        self, obs: Tensor, mask: Tensor, state: State, reset: Tensor | None
    ) -> tuple[MaskedCategorical, State]:
        """One step: obs ``[S, E, n, D]``, mask ``[S, E, n, A]``, reset ``[S, E]`` -> dist over
        ``[S, E, n]`` and the new state."""
        logits, state = self._step_logits(obs, state, reset)
        return MaskedCategorical(logits, mask), state

    @torch.no_grad()
    def act(
        self,
        obs: Tensor,
        mask: Tensor,
        state: State,
        reset: Tensor | None,
        *,
        deterministic: bool = False,
        generators: Sequence[torch.Generator] | None = None,
        neg_gumbel: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, State]:
        """Rollout step without autograd, as ``TypeActor.act`` for every seed.

        obs ``[S, E, n, D]``, mask ``[S, E, n, A]`` bool, reset ``[S, E]`` -> (actions
        ``[S, E, n]`` long, log-probs ``[S, E, n]``, new state). The sampling noise:
        ``neg_gumbel [S, E, n, A]`` drawn in advance (:func:`seed_neg_gumbel_noise`), or
        drawn here from ``generators`` (one ``torch.Generator`` per seed); one of them is
        needed unless ``deterministic``.
        """
        logits, state = self._step_logits(obs, state, reset)
        if mask.shape != logits.shape:
            raise ValueError(
                f"mask shape {tuple(mask.shape)} != logits shape {tuple(logits.shape)}"
            )
        log_probs = torch.log_softmax(logits.masked_fill_(~mask.bool(), MASK_LOGIT), dim=-1)
        if deterministic:
            actions = log_probs.argmax(dim=-1)
        else:
            if neg_gumbel is None:
                neg_gumbel = self._noise(log_probs, generators)
            actions = gumbel_max(log_probs, None, neg_gumbel)
        return actions, log_probs.gather(-1, actions.unsqueeze(-1)).squeeze(-1), state

    def _noise(self, log_probs: Tensor, generators: Sequence[torch.Generator] | None) -> Tensor:
        if generators is None:
            raise ValueError(
                "sampling needs per-seed randomness: pass generators=[one torch.Generator per "
                "seed] or neg_gumbel=[S, E, n, A] noise (seed_neg_gumbel_noise), or "
                "deterministic=True"
            )
        if len(generators) != self.num_seeds:
            raise ValueError(
                f"need one generator per seed ({self.num_seeds}), got {len(generators)}"
            )
        return seed_neg_gumbel_noise(log_probs.shape[1:], generators, log_probs.device)

    # -- training windows --------------------------------------------------------------------

    def sequence(
        self,
        obs: Tensor,
        mask: Tensor,
        state: State | None,
        resets: Tensor | None,
        *,
        burn_in: Tensor | None = None,
        tbptt_chunk: int | None = None,
    ) -> MaskedCategorical:
        """Windows. obs ``[S, B, P + L, n, D]``, mask ``[S, B, L, n, A]``, resets
        ``[S, B, P + L]``, state for ``B * n`` rows per seed before step 0, burn_in ``[S, B]``
        -> dist over ``[S, B, L, n]`` (``TypeActor.sequence`` for every seed)."""
        parts = list(self.chunks(obs, state, resets, mask.shape[2], burn_in, tbptt_chunk))
        logits = parts[0][1] if len(parts) == 1 else torch.cat([lg for _, lg in parts], dim=2)
        return MaskedCategorical(logits, mask)

    def chunks(
        self,
        obs: Tensor,
        state: State | None,
        resets: Tensor | None,
        length: int,
        burn_in: Tensor | None = None,
        tbptt_chunk: int | None = None,
    ) -> Iterator[tuple[slice, Tensor]]:
        """``TypeActor.chunks`` for every seed: obs ``[S, B, P + length, n, D]``, state for the
        ``B * n`` rows of each seed (tuple of ``[S, B * n, ...]``, None: zeros), resets
        ``[S, B, P + length]``, burn_in ``[S, B]`` (None: all ``P``) -> ``(steps, logits
        [S, B, len(steps), n, A])`` chunk by chunk (truncated BPTT every ``tbptt_chunk``
        steps, the state detached between chunks)."""
        S, n = self.num_seeds, self.n_agents
        obs = _check_seed_tensor(obs, [S, None, None, n, self.obs_dim], "obs")
        B, total = obs.shape[1:3]
        prefix = total - length
        if prefix < 0:
            raise ValueError(f"obs has {total} steps, fewer than the {length} requested")
        x = self.inputs(obs).permute(0, 1, 3, 2, 4).reshape(S, B * n, total, -1)
        r = None
        if resets is not None:
            resets = _check_seed_tensor(resets, [S, B, total], "resets")
            r = resets.repeat_interleave(n, dim=1)
        if not self.is_recurrent:
            y, _ = self.backbone(x[:, :, prefix:], None, None)
            yield slice(0, length), self._logits(y, B)
            return
        if state is None:
            state = self.initial_state(B)
        state = self._burn_in(x, r, tuple(state), prefix, burn_in)
        k = length if tbptt_chunk is None else int(tbptt_chunk)
        if k < 1:
            raise ValueError(f"tbptt_chunk must be an int >= 1 or None, got {tbptt_chunk!r}")
        for start in range(0, length, k):
            stop = min(start + k, length)
            if start > 0:
                state = tuple(s.detach() for s in state)
            cut = slice(prefix + start, prefix + stop)
            y, state = self.backbone(x[:, :, cut], state, None if r is None else r[:, :, cut])
            yield slice(start, stop), self._logits(y, B)

    def _logits(self, y: Tensor, B: int) -> Tensor:
        """Backbone outputs ``[S, B * n, L, H]`` -> logits ``[S, B, L, n, A]``."""
        S, L = y.shape[0], y.shape[2]
        logits = _apply(self.head, y).reshape(S, B, self.n_agents, L, self.n_actions)
        return logits.permute(0, 1, 3, 2, 4)

    def _burn_in(
        self,
        x: Tensor,
        resets: Tensor | None,
        state: State,
        prefix: int,
        burn_in: Tensor | None,
    ) -> State:
        """The state at the loss window's start, without autograd (``TypeActor._burn_in`` for
        every seed). x ``[S, B * n, P + L, D]``, resets ``[S, B * n, P + L]``.

        Unit b of seed k runs its last ``burn_in[k, b]`` prefix steps from its stored state.
        The unbatched backbone runs each seed's groups of units as the single-seed actor does.
        A batched backbone runs, for each length v that some seed asks for, the last v prefix
        steps of *every* unit of every seed and keeps the units whose length is v: the shapes
        of seed k's calls then do not depend on the other seeds' rows (so the result is
        independent of S bit for bit; the single-seed actor runs a group's rows only, and a
        GEMM's bits may depend on its row count: float32 rounding)."""
        if prefix == 0:
            return state
        S, rows = self.num_seeds, x.shape[1]
        n, B = self.n_agents, x.shape[1] // self.n_agents
        with torch.no_grad():
            if burn_in is None:  # every unit: the whole prefix
                cut = slice(0, prefix)
                _, out = self.backbone(
                    x[:, :, cut], state, None if resets is None else resets[:, :, cut]
                )
                return tuple(s.detach() for s in out)
            burn_in = _check_seed_tensor(burn_in, [S, B], "burn_in")
            lengths = [int(v) for v in torch.unique(burn_in).tolist()]
            if min(lengths) < 0 or max(lengths) > prefix:
                raise ValueError(f"burn_in values must be in [0, {prefix}], got {lengths}")
            if isinstance(self.backbone, SeedLoopBackbone):
                return self._burn_in_per_seed(x, resets, state, prefix, burn_in)
            row_length = burn_in.repeat_interleave(n, dim=1)  # [S, B * n]
            new_state = list(state)
            for v in lengths:
                if v == 0:
                    continue
                cut = slice(prefix - v, prefix)
                _, out = self.backbone(
                    x[:, :, cut], state, None if resets is None else resets[:, :, cut]
                )
                keep = row_length == v
                for i, s in enumerate(out):
                    where = keep.view(S, rows, *([1] * (s.dim() - 2)))
                    new_state[i] = torch.where(where, s.to(new_state[i].dtype), new_state[i])
        return tuple(s.detach() for s in new_state)

    def _burn_in_per_seed(
        self, x: Tensor, resets: Tensor | None, state: State, prefix: int, burn_in: Tensor
    ) -> State:
        """:meth:`_burn_in` on the unbatched backbone: each seed's units grouped by length,
        one call of seed k's backbone per group (``TypeActor._burn_in``'s calls exactly)."""
        backbone: SeedLoopBackbone = self.backbone  # type: ignore[assignment]
        n = self.n_agents
        per_seed = []
        for k in range(self.num_seeds):
            new_state = [s[k] for s in state]
            for v in [int(v) for v in torch.unique(burn_in[k]).tolist()]:
                if v == 0:
                    continue
                units = torch.nonzero(burn_in[k] == v).flatten()
                rows = (units[:, None] * n + torch.arange(n, device=units.device)).reshape(-1)
                cut = slice(prefix - v, prefix)
                _, out = backbone.forward_seed(
                    k,
                    x[k, rows, cut],
                    tuple(s[k].index_select(0, rows) for s in state),
                    None if resets is None else resets[k, rows, cut],
                )
                for i, s in enumerate(out):
                    new_state[i] = new_state[i].index_copy(0, rows, s.to(new_state[i].dtype))
            per_seed.append(tuple(new_state))
        return tuple(s.detach() for s in _stack_states(per_seed))

    def sequence_from_inputs(self, inputs: Tensor, mask: Tensor) -> MaskedCategorical:
        """Feed-forward backbones only: prepared :meth:`inputs` ``[S, ..., n, D + n]`` and mask
        ``[S, ..., n, A]`` -> dist over ``[S, ..., n]``."""
        if self.is_recurrent:
            raise ValueError("sequence_from_inputs is for feed-forward backbones; use sequence")
        S, lead = self.num_seeds, inputs.shape[:-1]
        y, _ = self.backbone(inputs.reshape(S, 1, -1, inputs.shape[-1]), None, None)
        logits = _apply(self.head, y).reshape(*lead, self.n_actions)
        return MaskedCategorical(logits, mask)


class SeedMultiAgentPolicy(nn.Module):
    """S :class:`marl.models.policies.MultiAgentPolicy` of one layout: one :class:`SeedTypeActor`
    per agent type."""

    def __init__(self, policies: Sequence[MultiAgentPolicy]) -> None:
        super().__init__()
        policies = _same_type(policies, MultiAgentPolicy, "policy")
        first = policies[0]
        for i, p in enumerate(policies):
            if p.layout != first.layout or p.backbone_kind != first.backbone_kind:
                raise ValueError(f"policy {i} has another layout or backbone than policy 0")
        self.num_seeds = len(policies)
        self.layout: AgentLayout = first.layout
        self.backbone_kind = first.backbone_kind
        self.actors = nn.ModuleDict(
            {name: SeedTypeActor([p.actors[name] for p in policies]) for name in first.actors}
        )
        self._template: tuple[MultiAgentPolicy] = (copy.deepcopy(first),)

    @property
    def is_recurrent(self) -> bool:
        return any(a.is_recurrent for a in self.actors.values())

    def initial_state(self, num_envs: int) -> dict[str, State]:
        return {name: actor.initial_state(num_envs) for name, actor in self.actors.items()}

    def seed_state_dict(self, seed: int) -> dict[str, Tensor]:
        """Seed ``seed``'s parameters (views) under the ``MultiAgentPolicy`` names."""
        return {f"actors.{name}.{key}": value
                for name, actor in self.actors.items()
                for key, value in actor.seed_state_dict(seed).items()}  # fmt: skip

    def unstack(self) -> list[MultiAgentPolicy]:
        """S single-seed ``MultiAgentPolicy`` with copies of each seed's parameters."""
        device = next(self.parameters()).device
        policies = []
        for k in range(self.num_seeds):
            policy = copy.deepcopy(self._template[0]).to(device)
            policy.load_state_dict(self.seed_state_dict(k))
            policies.append(policy)
        return policies

    @torch.no_grad()
    def act(
        self,
        obs: Mapping[str, Tensor],
        mask: Mapping[str, Tensor],
        state: Mapping[str, State],
        reset: Tensor | None = None,
        *,
        deterministic: bool = False,
        generators: Sequence[torch.Generator] | None = None,
        neg_gumbel: Mapping[str, Tensor] | None = None,
    ) -> tuple[dict[str, Tensor], dict[str, Tensor], dict[str, State]]:
        """``MultiAgentPolicy.act`` for every seed: per type, obs ``[S, E, n_k, D_k]``, mask,
        reset ``[S, E]`` -> (actions ``[S, E, n_k]``, log-probs, new state). The noise of
        each type is drawn in type order from each seed's generator, as a single-seed run
        with that generator draws it."""
        if reset is not None and not bool(reset.any()):
            reset = None
        actions, logps, new_state = {}, {}, {}
        for name, actor in self.actors.items():
            actions[name], logps[name], new_state[name] = actor.act(
                obs[name],
                mask[name],
                state[name],
                reset,
                deterministic=deterministic,
                generators=generators,
                neg_gumbel=None if neg_gumbel is None else neg_gumbel[name],
            )
        return actions, logps, new_state


def stack_policies(
    policies: Sequence[TypeActor] | Sequence[MultiAgentPolicy],
) -> SeedTypeActor | SeedMultiAgentPolicy:
    """S single-seed actors (``TypeActor``) or policies (``MultiAgentPolicy``), seed k =
    ``policies[k]``, as one seed module (parameters copied exactly; the inputs untouched)."""
    policies = list(policies)
    if policies and isinstance(policies[0], MultiAgentPolicy):
        return SeedMultiAgentPolicy(policies)  # type: ignore[arg-type]
    return SeedTypeActor(policies)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------
# critic
# ------------------------------------------------------------------------------------------


class SeedCentralCritic(nn.Module):
    """S :class:`marl.models.policies.CentralCritic`, stacked: ``forward(state [S, ..., state_dim])
    -> (team [S, ..., K], individual [S, ..., N, K])``."""

    def __init__(self, critics: Sequence[CentralCritic]) -> None:
        super().__init__()
        critics = _same_type(critics, CentralCritic, "critic")
        first = critics[0]
        for i, c in enumerate(critics):
            if (c.n_agents, c.ensemble) != (first.n_agents, first.ensemble):
                raise ValueError(f"critic {i} has another (n_agents, ensemble) than critic 0")
        self.num_seeds = len(critics)
        self.n_agents, self.ensemble = first.n_agents, first.ensemble
        self.trunk = SeedMLP.from_modules([c.trunk for c in critics])
        self.team_head = SeedLinear.from_modules([c.team_head for c in critics])
        self.individual_head = SeedLinear.from_modules([c.individual_head for c in critics])
        self._template: tuple[CentralCritic] = (copy.deepcopy(first),)

    def single_seed_names(self) -> dict[str, str]:
        """Stacked parameter name -> the single-seed ``CentralCritic``'s parameter name."""
        names = {f"trunk.layers.{name[len('layers.') :]}": f"trunk.{name[len('layers.') :]}"
                 for name, _ in self.trunk.named_parameters()}  # fmt: skip
        for head in ("team_head", "individual_head"):
            names.update({f"{head}.{p}": f"{head}.{p}" for p in ("weight", "bias")})
        return names

    def seed_state_dict(self, seed: int) -> dict[str, Tensor]:
        """Seed ``seed``'s parameters (views) under the ``CentralCritic`` names."""
        params = dict(self.named_parameters())
        return {single: params[name][seed] for name, single in self.single_seed_names().items()}

    def unstack(self) -> list[CentralCritic]:
        """S single-seed ``CentralCritic`` with copies of each seed's parameters."""
        device = self.team_head.weight.device
        critics = []
        for k in range(self.num_seeds):
            critic = copy.deepcopy(self._template[0]).to(device)
            critic.load_state_dict(self.seed_state_dict(k))
            critics.append(critic)
        return critics

    def forward(self, state: Tensor) -> tuple[Tensor, Tensor]:
        """state ``[S, ..., state_dim]`` -> (team ``[S, ..., K]``, individual ``[S, ..., N,
        K]``)."""
        h = _apply(self.trunk, state)
        team = _apply(self.team_head, h)
        individual = _apply(self.individual_head, h).reshape(
            *state.shape[:-1], self.n_agents, self.ensemble
        )
        return team, individual


def stack_critics(critics: Sequence[CentralCritic]) -> SeedCentralCritic:
    """S single-seed critics, seed k = ``critics[k]``, as one :class:`SeedCentralCritic`."""
    return SeedCentralCritic(critics)


# ------------------------------------------------------------------------------------------
# initialisation
# ------------------------------------------------------------------------------------------


class SeedPolicies(NamedTuple):
    """What :func:`build_seed_policies` builds."""

    #: seed k's ``MultiAgentPolicy`` at stack index k
    policy: SeedMultiAgentPolicy
    #: seed k's ``CentralCritic`` at stack index k (None without a critic: GRPO)
    critic: SeedCentralCritic | None
    #: one CPU generator per seed, in the state torch's global generator has in a
    #: single-seed run right after its modules were built: the stand-in for the global
    #: generator wherever that run draws from it next (rollout noise, minibatch permutations)
    generators: list[torch.Generator]


def build_seed_policies(
    cfg: Any,
    seeds: Sequence[int],
    layout: AgentLayout,
    *,
    critic: bool,
    device: torch.device | str = "cpu",
) -> SeedPolicies:
    """Seed k's policy (and critic) exactly as a single-seed run with ``--seed seeds[k]``
    builds them, stacked, with a generator per seed that continues where that run's global
    generator stands after building them.

    The trainer (``marl.run.train.train``) seeds torch's global generator with the run's seed
    and then constructs the algorithm, whose constructor (``MAPPO.__init__``,
    ``GRPO.__init__``) builds the vector env, then ``MultiAgentPolicy(layout, backbone,
    hidden_dim, activation)`` and (MAPPO) ``CentralCritic(state_dim, N, critic_hidden_dim,
    value_ensemble, activation)`` on the CPU, then moves them to the device. This does the
    same for each seed inside ``torch.random.fork_rng``, so the global generator is left as
    it was. (The env is built once by the caller, ``layout``: building one draws nothing
    from torch's generator for the project's envs; tests/test_seed_policies.py pins the
    modules and the generator states against ``MAPPO(cfg)`` and ``GRPO(cfg)`` built after
    seeding.)

    Args:
        cfg: the run's config (``MAPPOConfig`` / ``GRPOConfig``): reads ``backbone``,
            ``hidden_dim``, ``activation``, and with ``critic`` ``critic_hidden_dim`` and
            ``value_ensemble``.
        seeds: the S run seeds, seed k's modules at stack index k.
        layout: the env's agent layout (``AgentLayout.from_env``).
        critic: build MAPPO's centralised critic too (False for GRPO: ``critic`` is None).
        device: where the stacked modules go (the generators stay on the CPU, as the
            global generator a single-seed run draws from).
    """
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise ValueError("seeds must name at least one seed")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be distinct, got {seeds}")
    policies, critics, generators = [], [], []
    for seed in seeds:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            policies.append(MultiAgentPolicy(layout, cfg.backbone, cfg.hidden_dim, cfg.activation))
            if critic:
                critics.append(
                    CentralCritic(
                        layout.state_dim,
                        layout.n_agents,
                        cfg.critic_hidden_dim,
                        cfg.value_ensemble,
                        cfg.activation,
                    )
                )
            generator = torch.Generator()
            generator.set_state(torch.get_rng_state())
            generators.append(generator)
    seed_policy = SeedMultiAgentPolicy(policies).to(device)
    seed_critic = SeedCentralCritic(critics).to(device) if critic else None
    return SeedPolicies(seed_policy, seed_critic, generators)
