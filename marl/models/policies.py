"""Actors (one per agent type), the masked categorical, and the centralised critic.

An actor's computations (step, rollout sampling, training windows with burn-in and truncated
BPTT) are written once, in :class:`ActorCore`, for S runs with a leading run axis;
:class:`TypeActor` is one run's actor (S = 1 around its own modules) and
:class:`marl.models.seed_policies.SeedTypeActor` S runs' stacked ones.

Algorithm-agnostic: MAPPO and GRPO both use :class:`MultiAgentPolicy`; only MAPPO uses a
critic (:mod:`marl.models.critics`, its names imported here too).

Shapes (E envs, n_k agents of type k, D_k observation size, A_k actions, S state size):

- actor step input: ``obs[E, n_k, D_k]``, ``mask[E, n_k, A_k]`` (bool), ``reset[E]`` (bool);
  the agent's index within its type is appended as a one-hot (``n_k`` extra inputs).
- actor sequence input (training): ``obs[B, P + L, n_k, D_k]`` with resets ``[B, P + L]``
  and the stored state of each of the ``B * n_k`` rows before step 0; the ``P`` prefix steps
  are the burn-in (run without autograd), the last ``L`` the loss window (optionally in
  truncated-BPTT chunks), see :meth:`TypeActor.chunks`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from marl.models.critics import (  # the critics live in their own module; named here too
    SHARE_CRITIC,
    CentralCritic,
    GroupedCritic,
    critic_groups,
    make_critic,
)

__all__ = [
    "MASK_LOGIT",
    "gumbel_max",
    "neg_gumbel_noise",
    "AgentLayout",
    "TypeSpec",
    "MaskedCategorical",
    "ActorCore",
    "TypeActor",
    "SharedTypeActor",
    "SharedView",
    "act_per_type",
    "SHARE_ACTOR",
    "MultiAgentPolicy",
    "CentralCritic",
    "GroupedCritic",
    "SHARE_CRITIC",
    "critic_groups",
    "make_critic",
]

#: Logit given to masked actions: large and negative but finite (no -inf NaNs).
MASK_LOGIT = -1e9


@dataclass(frozen=True)
class TypeSpec:
    """One agent type: its agents (in index order) and their spaces."""

    name: str
    agents: tuple[str, ...]
    agent_ids: tuple[int, ...]  # positions of the agents in possible_agents
    obs_dim: int
    n_actions: int

    @property
    def n_agents(self) -> int:
        return len(self.agents)


@dataclass(frozen=True)
class AgentLayout:
    """Agent types of a vector env (type = name prefix before the last '_')."""

    agents: tuple[str, ...]
    types: tuple[TypeSpec, ...]
    state_dim: int

    @property
    def n_agents(self) -> int:
        return len(self.agents)

    @property
    def type_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.types)

    @staticmethod
    def from_env(vec) -> AgentLayout:
        """Read agents, spaces and state size from a contract-conforming vector env."""
        agents = tuple(vec.possible_agents)
        if not agents:
            raise ValueError("the vector env has no agents (possible_agents is empty)")
        by_type: dict[str, list[tuple[int, str]]] = {}
        for a in agents:
            if "_" not in a:
                raise ValueError(f"agent name {a!r} has no '<type>_<index>' form")
            prefix, suffix = a.rsplit("_", 1)
            try:
                index = int(suffix)
            except ValueError:
                raise ValueError(f"agent name {a!r}: index suffix is not an integer") from None
            by_type.setdefault(prefix, []).append((index, a))
        types = []
        for name, members in by_type.items():
            members.sort()
            names = tuple(a for _, a in members)
            obs_space = vec.observation_space(names[0])
            obs_dim = int(obs_space["observation"].shape[0])
            n_actions = int(vec.action_space(names[0]).n)
            for a in names[1:]:
                if (
                    int(vec.observation_space(a)["observation"].shape[0]) != obs_dim
                    or int(vec.action_space(a).n) != n_actions
                ):
                    raise ValueError(f"agents of type {name!r} have different spaces")
            types.append(
                TypeSpec(name, names, tuple(agents.index(a) for a in names), obs_dim, n_actions)
            )
        state_dim = int(vec.state_space.shape[0])
        return AgentLayout(agents, tuple(types), state_dim)


def neg_gumbel_noise(
    shape: tuple[int, ...],
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    """Negated standard Gumbel noise ``log(-log u)``, u uniform, of ``shape`` (built in place)."""
    u = torch.rand(shape, generator=generator, device=device)
    return u.clamp_(1e-20, 1.0 - 1e-7).log_().neg_().log_()


def gumbel_max(
    log_probs: Tensor,
    generator: torch.Generator | None = None,
    neg_gumbel: Tensor | None = None,
) -> Tensor:
    """A sample of the categorical ``log_probs[..., A]`` by the Gumbel-max trick, ``[...]``:
    ``argmax(log_probs + g)``, with ``g = -neg_gumbel`` (drawn here unless given, e.g. drawn
    for a whole rollout at once by :func:`neg_gumbel_noise`)."""
    if neg_gumbel is None:
        neg_gumbel = neg_gumbel_noise(log_probs.shape, generator, log_probs.device)
    # subtracting log(-log u) gives exactly the same values as adding its negation
    return (log_probs - neg_gumbel).argmax(dim=-1)


def _check_mask(mask: Tensor, logits: Tensor) -> None:
    if mask.shape != logits.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} != logits shape {tuple(logits.shape)}")


class MaskedCategorical:
    """Categorical over ``logits[..., A]`` restricted to ``mask[..., A]`` (True = allowed).

    Masked logits are set to :data:`MASK_LOGIT` (finite), so a masked action has probability
    exactly 0 in float32 and entropies/log-probs stay finite. A row with no allowed action has
    all its logits equal to :data:`MASK_LOGIT`, i.e. the uniform distribution over all actions
    (instead of NaN).
    """

    def __init__(self, logits: Tensor, mask: Tensor | None = None) -> None:
        if mask is not None:
            _check_mask(mask, logits)
            mask = mask.bool()
            logits = logits.masked_fill(~mask, MASK_LOGIT)
        self.logits = logits
        self.log_probs = torch.log_softmax(logits, dim=-1)
        self.mask = mask

    @property
    def probs(self) -> Tensor:
        return self.log_probs.exp()

    def sample(self, generator: torch.Generator | None = None) -> Tensor:
        """Gumbel-max sample, ``[...]`` long."""
        return gumbel_max(self.log_probs, generator)

    def mode(self) -> Tensor:
        return self.log_probs.argmax(dim=-1)

    def log_prob(self, actions: Tensor) -> Tensor:
        return self.log_probs.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)

    def entropy(self) -> Tensor:
        p = self.log_probs.exp()
        return -(p * self.log_probs).sum(dim=-1)


def _backbone(kind: str, input_dim: int, hidden_dim: int, activation: str = "tanh", **options: Any):
    from seqmodels.backbones import backbone_spec, make_backbone

    if backbone_spec(kind).takes_activation:
        return make_backbone(kind, input_dim, hidden_dim, activation=activation, **options)
    return make_backbone(kind, input_dim, hidden_dim, **options)  # mamba: their own SiLU


#: a backbone's recurrent state: a tuple of tensors, each with the rows first
State = tuple[Tensor, ...]


class ActorCore(nn.Module):
    """The computations of one agent type's actor, written once, for S runs at once: every
    input and output has a leading run axis ``S`` (``obs [S, E, n_k, D]``, state tuples of
    ``[S, E * n_k, ...]``). :class:`TypeActor` is one run, S = 1 (its own plain modules; its
    methods take and return no run axis), and
    :class:`marl.models.seed_policies.SeedTypeActor` is S runs' stacked modules. A subclass
    gives the backbone and head calls (the hooks ``_backbone_step``, ``_backbone_run``,
    ``_backbone_run_one``, ``_head``, ``_initial_state``) and its interface's shapes
    (``_step_logits``, ``act``, ``chunks``: with a run axis or without); the rest is here.
    """

    num_seeds: int
    obs_dim: int
    n_agents: int
    n_actions: int
    #: ``[n_k, I]``: the identity features appended to each agent's observation (row i:
    #: agent i of the type; ``I = 0`` without them)
    agent_onehot: Tensor
    #: zeros appended after the observation (a shared actor's common input size)
    pad: int = 0
    #: the burn-in runs each run's units grouped by length, one backbone call per run and
    #: length (``_backbone_run_one``); else one call of every run's units per length
    per_run_burn_in: bool

    # -- hooks -------------------------------------------------------------------------------
    def _backbone_step(self, x: Tensor, state: State, reset: Tensor | None) -> tuple[Tensor, State]:
        """One step: ``x [S, R, D]``, ``reset [S, R]`` -> (``y [S, R, H]``, new state)."""
        raise NotImplementedError

    def _backbone_run(
        self, x: Tensor, state: State | None, resets: Tensor | None
    ) -> tuple[Tensor, State]:
        """Sequences: ``x [S, R, L, D]``, ``resets [S, R, L]`` -> (``y [S, R, L, H]``, state)."""
        raise NotImplementedError

    def _backbone_run_one(
        self, k: int, x: Tensor, state: State, resets: Tensor | None
    ) -> tuple[Tensor, State]:
        """Run k's backbone alone: ``x [R, L, D]``, state of ``[R, ...]``, ``resets [R, L]``."""
        raise NotImplementedError

    def _head(self, y: Tensor) -> Tensor:
        """Backbone outputs ``[S, ..., H]`` -> logits ``[S, ..., A]``."""
        raise NotImplementedError

    def _initial_state(self, rows: int) -> State:
        """The zero state of ``rows`` rows of every run: a tuple of ``[S, rows, ...]``."""
        raise NotImplementedError

    # -- the computations -------------------------------------------------------------------
    def inputs(self, obs: Tensor) -> Tensor:
        """Backbone inputs: ``obs[..., n_k, D]`` -> ``[..., n_k, D + pad + I]``: the
        observation, ``pad`` zeros (a shared actor's common size) and each agent's row of
        :attr:`agent_onehot` ``[n_k, I]`` (its index one-hot, ``I = n_k``, by default)."""
        lead = obs.shape[:-1]
        parts = [obs]
        if self.pad:
            parts.append(obs.new_zeros(*lead, self.pad))
        parts.append(self.agent_onehot.to(obs.dtype).expand(*lead, self.agent_onehot.shape[-1]))
        return torch.cat(parts, dim=-1)

    def agent_inputs(self, obs: Tensor, agent_index: Tensor) -> Tensor:
        """:meth:`inputs` of single agents: ``obs [B, D]``, ``agent_index [B]`` (each row's
        agent, its index within the type) -> ``[B, D + pad + I]``."""
        parts = [obs]
        if self.pad:
            parts.append(obs.new_zeros(obs.shape[0], self.pad))
        parts.append(self.agent_onehot.to(obs.dtype)[agent_index])
        return torch.cat(parts, dim=-1)

    def step(
        self, obs: Tensor, mask: Tensor, state: State, reset: Tensor | None
    ) -> tuple[MaskedCategorical, State]:
        """One step (the subclass's ``_step_logits``). One run: obs ``[E, n_k, D]``, mask ``[E,
        n_k, A]``, reset ``[E]`` -> dist over ``[E, n_k]``; S runs: a leading ``S`` on each."""
        logits, state = self._step_logits(obs, state, reset)
        return MaskedCategorical(logits, mask), state

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
        """Windows (the subclass's ``chunks``). One run: obs ``[B, P + L, n_k, D]``, mask
        ``[B, L, n_k, A]``, resets ``[B, P + L]``, state for ``B * n_k`` rows (env-major)
        before step 0 of each unit's input, burn_in ``[B]`` -> dist over the last ``L`` steps
        ``[B, L, n_k]``; S runs: a leading ``S`` on each. ``P = obs.shape[-4] -
        mask.shape[-3]`` prefix steps carry the burn-in, ``tbptt_chunk``: truncated
        backpropagation (:meth:`run_chunks`)."""
        length = mask.shape[-3]
        parts = list(self.chunks(obs, state, resets, length, burn_in, tbptt_chunk))
        logits = parts[0][1] if len(parts) == 1 else torch.cat([lg for _, lg in parts], dim=-3)
        return MaskedCategorical(logits, mask)

    def run_step_logits(
        self, obs: Tensor, state: State, reset: Tensor | None
    ) -> tuple[Tensor, State]:
        """obs ``[S, E, n_k, D]``, reset ``[S, E]`` -> (logits ``[S, E, n_k, A]``, new
        state): one backbone step."""
        S, E, n = obs.shape[0], obs.shape[1], self.n_agents
        x = self.inputs(obs).reshape(S, E * n, -1)
        r = None if reset is None else reset.repeat_interleave(n, dim=1)
        y, state = self._backbone_step(x, state, r)
        return self._head(y).reshape(S, E, n, self.n_actions), state

    def run_act(
        self,
        obs: Tensor,
        mask: Tensor,
        state: State,
        reset: Tensor | None,
        *,
        deterministic: bool,
        noise: Callable[[tuple[int, ...], torch.device], Tensor] | None,
    ) -> tuple[Tensor, Tensor, State]:
        """Rollout step without autograd: the same actions, log-probs and state as a step's
        distribution followed by ``sample`` / ``mode`` and ``log_prob`` (the same operations
        on the same values), in fewer operations (the masking in place, no distribution
        object). obs ``[S, E, n_k, D]``, mask ``[S, E, n_k, A]`` bool, reset ``[S, E]`` ->
        (actions ``[S, E, n_k]`` long, log-probs, new state); ``noise(shape, device)``: the
        negated Gumbel noise of the sample, drawn after the forward pass."""
        logits, state = self.run_step_logits(obs, state, reset)
        _check_mask(mask, logits)
        # masked in place (the logits are this call's own), as MaskedCategorical does
        log_probs = torch.log_softmax(logits.masked_fill_(~mask.bool(), MASK_LOGIT), dim=-1)
        if deterministic:
            a = log_probs.argmax(dim=-1)
        else:
            if noise is None:
                raise ValueError("sampling needs noise: neg_gumbel, or a source of it")
            a = gumbel_max(log_probs, None, noise(tuple(log_probs.shape), log_probs.device))
        return a, log_probs.gather(-1, a.unsqueeze(-1)).squeeze(-1), state

    def run_chunks(
        self,
        obs: Tensor,
        state: State | None,
        resets: Tensor | None,
        length: int,
        burn_in: Tensor | None = None,
        tbptt_chunk: int | None = None,
    ) -> Iterator[tuple[slice, Tensor]]:
        """The logits of the last ``length`` steps of each unit, chunk by chunk.

        Args:
            obs: ``[S, B, P + length, n_k, D]``; the first ``P`` steps are the burn-in
                prefix.
            state: backbone state for the ``B * n_k`` rows (unit-major, agent-minor) of each
                run before the first burn-in step of each unit (None: zeros).
            resets: ``[S, B, P + length]`` bool, an episode starts at that step (None: none).
            length: ``L``, the steps that get logits (the loss window).
            burn_in: ``[S, B]`` long, how many of the ``P`` prefix steps (the last ones) unit
                b runs before its loss window (None: all ``P``); the earlier prefix steps are
                padding and never read. The burn-in runs without autograd (R2D2): it only
                brings the stored state up to date with the current parameters.
            tbptt_chunk: ``k``: the loss window runs in chunks of ``k`` steps (the last one
                shorter) and the recurrent state passed between chunks is detached, so the
                gradient does not flow across chunk boundaries (truncated BPTT). None: one
                chunk. For gru this is ``h.detach()`` every ``k`` steps; for mamba/mamba2 the
                block's ``(conv_state, ssm_state)`` between chunk forwards, the same rule.

        Yields:
            ``(steps, logits)``: the slice of the ``length`` loss steps and their unmasked
            logits ``[S, B, len(steps), n_k, A]``. The next chunk is computed when asked for,
            so a caller may run the backward of each chunk before the next (activations of
            one chunk at a time).
        """
        S, B, total = obs.shape[:3]
        n, prefix = self.n_agents, total - length
        if prefix < 0:
            raise ValueError(f"obs has {total} steps, fewer than the {length} requested")
        x = self.inputs(obs).permute(0, 1, 3, 2, 4).reshape(S, B * n, total, -1)
        r = None if resets is None else resets.repeat_interleave(n, dim=1)
        if not self.is_recurrent:
            y, _ = self._backbone_run(x[:, :, prefix:], None, None)
            yield slice(0, length), self._logits(y, B)
            return
        if state is None:
            state = self._initial_state(B * n)
        state = self._burn_in(x, r, tuple(state), prefix, burn_in)
        k = length if tbptt_chunk is None else int(tbptt_chunk)
        if k < 1:
            raise ValueError(f"tbptt_chunk must be an int >= 1 or None, got {tbptt_chunk!r}")
        for start in range(0, length, k):
            stop = min(start + k, length)
            if start > 0:
                state = tuple(s.detach() for s in state)
            cut = slice(prefix + start, prefix + stop)
            y, state = self._backbone_run(x[:, :, cut], state, None if r is None else r[:, :, cut])
            yield slice(start, stop), self._logits(y, B)

    def _logits(self, y: Tensor, B: int) -> Tensor:
        """Backbone outputs ``[S, B * n_k, L, H]`` -> logits ``[S, B, L, n_k, A]``."""
        S, L = y.shape[0], y.shape[2]
        logits = self._head(y).reshape(S, B, self.n_agents, L, self.n_actions)
        return logits.permute(0, 1, 3, 2, 4)

    def _burn_in(
        self,
        x: Tensor,
        resets: Tensor | None,
        state: State,
        prefix: int,
        burn_in: Tensor | None,
    ) -> State:
        """The state at the loss window's start, without autograd. x ``[S, B * n_k, P + L,
        D]``, resets ``[S, B * n_k, P + L]``; unit b of run k runs its last ``burn_in[k, b]``
        prefix steps from its stored state.

        Per run (``per_run_burn_in``: one run, or runs whose backbones run one after another)
        each run's units are grouped by length, one backbone call per group (a few distinct
        lengths: the first windows of a rollout have shorter ones). Otherwise, for each length
        v that some run asks for, the last v prefix steps of *every* unit of every run, and
        the units whose length is v kept: the shapes of run k's calls then do not depend on
        the other runs' rows (so the result is independent of S bit for bit; the per-run
        grouping runs a group's rows only, and a GEMM's bits may depend on its row count:
        float32 rounding)."""
        if prefix == 0:
            return state
        S, rows = x.shape[:2]
        n = self.n_agents
        with torch.no_grad():
            if burn_in is None:  # every unit: the whole prefix
                cut = slice(0, prefix)
                _, out = self._backbone_run(
                    x[:, :, cut], state, None if resets is None else resets[:, :, cut]
                )
                return tuple(s.detach() for s in out)
            lengths = [int(v) for v in torch.unique(burn_in).tolist()]
            if min(lengths) < 0 or max(lengths) > prefix:
                raise ValueError(f"burn_in values must be in [0, {prefix}], got {lengths}")
            if self.per_run_burn_in:
                return self._burn_in_per_run(x, resets, state, prefix, burn_in)
            row_length = burn_in.repeat_interleave(n, dim=1)  # [S, B * n]
            new_state = list(state)
            for v in lengths:
                if v == 0:
                    continue
                cut = slice(prefix - v, prefix)
                _, out = self._backbone_run(
                    x[:, :, cut], state, None if resets is None else resets[:, :, cut]
                )
                keep = row_length == v
                for i, s in enumerate(out):
                    where = keep.view(S, rows, *([1] * (s.dim() - 2)))
                    new_state[i] = torch.where(where, s.to(new_state[i].dtype), new_state[i])
        return tuple(s.detach() for s in new_state)

    def _burn_in_per_run(
        self, x: Tensor, resets: Tensor | None, state: State, prefix: int, burn_in: Tensor
    ) -> State:
        """:meth:`_burn_in` run by run: each run's units grouped by length, one call of run
        k's backbone per group."""
        n = self.n_agents
        per_run = []
        for k in range(x.shape[0]):
            new_state = [s[k] for s in state]
            for v in [int(v) for v in torch.unique(burn_in[k]).tolist()]:
                if v == 0:
                    continue
                units = torch.nonzero(burn_in[k] == v).flatten()
                rows = (units[:, None] * n + torch.arange(n, device=units.device)).reshape(-1)
                cut = slice(prefix - v, prefix)
                _, out = self._backbone_run_one(
                    k,
                    x[k, rows, cut],
                    tuple(s[k].index_select(0, rows) for s in state),
                    None if resets is None else resets[k, rows, cut],
                )
                for i, s in enumerate(out):
                    new_state[i] = new_state[i].index_copy(0, rows, s.to(new_state[i].dtype))
            per_run.append(new_state)
        return tuple(torch.stack(parts).detach() for parts in zip(*per_run, strict=True))

    def run_logits_from_inputs(self, inputs: Tensor) -> Tensor:
        """Feed-forward backbones only: prepared :meth:`inputs` ``[S, ..., n_k, D + n_k]`` ->
        logits ``[S, ..., n_k, A]`` (no state, no resets)."""
        if self.is_recurrent:
            raise ValueError("sequence_from_inputs is for feed-forward backbones; use sequence")
        S, lead = inputs.shape[0], inputs.shape[:-1]
        y, _ = self._backbone_run(inputs.reshape(S, 1, -1, inputs.shape[-1]), None, None)
        return self._head(y).reshape(*lead, self.n_actions)


class TypeActor(ActorCore):
    """Actor shared by the ``n_agents`` agents of one type (agent index one-hot as input).

    One run's actor: :class:`ActorCore`'s computations with S = 1 around the run's own
    modules (its backbone and head on run 0's slice: the operations, and bits, of a plain
    module call), its methods taking and returning no run axis.
    """

    num_seeds = 1
    per_run_burn_in = True

    def __init__(
        self,
        obs_dim: int,
        n_agents: int,
        n_actions: int,
        backbone: str,
        hidden_dim: int,
        activation: str = "tanh",
        agent_ids: bool = True,
        backbone_options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.obs_dim, self.n_agents, self.n_actions = obs_dim, n_agents, n_actions
        onehot = torch.eye(n_agents) if agent_ids else torch.zeros(n_agents, 0)
        self.backbone = _backbone(
            backbone, obs_dim + onehot.shape[1], hidden_dim, activation, **(backbone_options or {})
        )
        self.head = nn.Linear(self.backbone.output_dim, n_actions)
        nn.init.orthogonal_(self.head.weight, gain=0.01)
        nn.init.zeros_(self.head.bias)
        self.register_buffer("agent_onehot", onehot, persistent=False)

    @property
    def is_recurrent(self) -> bool:
        return bool(self.backbone.is_recurrent)

    def initial_state(self, num_envs: int) -> State:
        """State for ``num_envs * n_agents`` rows (env-major, agent-minor)."""
        return tuple(self.backbone.initial_state(num_envs * self.n_agents))

    # -- the hooks: this run's modules on run 0's slice ----------------------------------------
    def _backbone_step(self, x: Tensor, state: State, reset: Tensor | None) -> tuple[Tensor, State]:
        y, state = self.backbone.step(x[0], _one(state), None if reset is None else reset[0])
        return y.unsqueeze(0), _run_axis(state)

    def _backbone_run(
        self, x: Tensor, state: State | None, resets: Tensor | None
    ) -> tuple[Tensor, State]:
        y, state = self.backbone(
            x[0], None if state is None else _one(state), None if resets is None else resets[0]
        )
        return y.unsqueeze(0), _run_axis(state)

    def _backbone_run_one(
        self, k: int, x: Tensor, state: State, resets: Tensor | None
    ) -> tuple[Tensor, State]:
        return self.backbone(x, state, resets)

    def _head(self, y: Tensor) -> Tensor:
        return self.head(y[0]).unsqueeze(0)

    def _initial_state(self, rows: int) -> State:
        return _run_axis(tuple(self.backbone.initial_state(rows)))

    # -- one run's interface --------------------------------------------------------------------
    def _step_logits(self, obs: Tensor, state: State, reset: Tensor | None) -> tuple[Tensor, State]:
        """obs ``[E, n_k, D]`` -> (logits ``[E, n_k, A]``, new state): one backbone step."""
        logits, state = self.run_step_logits(
            obs.unsqueeze(0), _run_axis(state), None if reset is None else reset.unsqueeze(0)
        )
        return logits[0], _one(state)

    @torch.no_grad()
    def act(
        self,
        obs: Tensor,
        mask: Tensor,
        state: State,
        reset: Tensor | None,
        *,
        deterministic: bool = False,
        generator: torch.Generator | None = None,
        neg_gumbel: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, State]:
        """Rollout step without autograd (:meth:`ActorCore.run_act`).

        obs ``[E, n_k, D]``, mask ``[E, n_k, A]`` bool, reset ``[E]`` -> (actions ``[E, n_k]``
        long, log-probs ``[E, n_k]``, new state). ``neg_gumbel`` ``[E, n_k, A]``: the sampling
        noise, drawn in advance (:func:`neg_gumbel_noise`); None: drawn here from
        ``generator``.
        """

        def noise(shape: tuple[int, ...], device: torch.device) -> Tensor:
            if neg_gumbel is not None:
                return neg_gumbel.unsqueeze(0)
            return neg_gumbel_noise(shape[1:], generator, device).unsqueeze(0)

        actions, logps, state = self.run_act(
            obs.unsqueeze(0),
            mask.unsqueeze(0),
            _run_axis(state),
            None if reset is None else reset.unsqueeze(0),
            deterministic=deterministic,
            noise=noise,
        )
        return actions[0], logps[0], _one(state)

    def chunks(
        self,
        obs: Tensor,
        state: State | None,
        resets: Tensor | None,
        length: int,
        burn_in: Tensor | None = None,
        tbptt_chunk: int | None = None,
    ) -> Iterator[tuple[slice, Tensor]]:
        """:meth:`ActorCore.run_chunks` of this run: obs ``[B, P + length, n_k, D]``, state
        for its ``B * n_k`` rows, resets ``[B, P + length]``, burn_in ``[B]`` -> ``(steps,
        logits [B, len(steps), n_k, A])`` chunk by chunk."""
        if burn_in is not None and burn_in.shape != (obs.shape[0],):
            raise ValueError(
                f"burn_in must have shape [B={obs.shape[0]}], got {tuple(burn_in.shape)}"
            )
        for steps, logits in self.run_chunks(
            obs.unsqueeze(0),
            None if state is None else _run_axis(state),
            None if resets is None else resets.unsqueeze(0),
            length,
            None if burn_in is None else burn_in.unsqueeze(0),
            tbptt_chunk,
        ):
            yield steps, logits[0]

    def sequence_from_inputs(self, inputs: Tensor, mask: Tensor) -> MaskedCategorical:
        """Feed-forward backbones only: prepared :meth:`inputs` ``[..., n_k, D + n_k]`` and
        mask ``[..., n_k, A]`` -> dist over ``[..., n_k]`` (no state, no resets)."""
        return MaskedCategorical(self.run_logits_from_inputs(inputs.unsqueeze(0))[0], mask)


class SharedView:
    """What a type's view of a shared actor adds, for one run or S: the backbone and head
    are the shared core's (``_core``, held unregistered: the policy registers it once), and
    the head's logits are cut to the type's own ``n_actions``."""

    _core: tuple[ActorCore]
    n_actions: int

    @property
    def backbone(self) -> nn.Module:
        return self._core[0].backbone  # type: ignore[return-value]

    @property
    def head(self) -> nn.Module:
        return self._core[0].head  # type: ignore[return-value]

    def _head(self, y: Tensor) -> Tensor:
        return super()._head(y)[..., : self.n_actions]  # type: ignore[misc]


class SharedTypeActor(SharedView, TypeActor):  # type: ignore[misc]
    """One agent type's view of the actor that every type shares (``--share-actor all``).

    The view owns no parameters: its backbone and head are those of ``core``, a
    :class:`TypeActor` over the common input (the policy's ``shared`` module). It gives the
    type's agents their inputs, ``obs [..., n_k, D_k]`` padded with ``pad = D - D_k`` zeros
    to the largest observation size ``D`` and followed by ``ids [n_k, I]`` (the type one-hot
    and the agent's one-hot over every agent, or nothing), and keeps the first ``A_k`` of the
    head's ``A = max A_k`` logits: the shared head's output i is action i of every type that
    has it, and a type never sees, let alone takes, an action beyond its own.
    """

    def __init__(self, core: TypeActor, spec: TypeSpec, pad: int, ids: Tensor) -> None:
        nn.Module.__init__(self)
        self.obs_dim, self.n_agents, self.n_actions = spec.obs_dim, spec.n_agents, spec.n_actions
        self.pad = int(pad)
        self._core = (core,)  # a tuple: the policy registers the core once, as ``shared``
        self.register_buffer("agent_onehot", ids, persistent=False)


def _shared_ids(layout: AgentLayout, k: int, agent_ids: bool) -> Tensor:
    """Type k's identity rows for a shared actor: ``[n_k, K + N]`` (type one-hot over the K
    types, then the agent's one-hot over the N agents in ``possible_agents`` order), or
    ``[n_k, 0]`` without ids."""
    t = layout.types[k]
    if not agent_ids:
        return torch.zeros(t.n_agents, 0)
    K = len(layout.types)
    ids = torch.zeros(t.n_agents, K + layout.n_agents)
    ids[:, k] = 1.0
    ids[torch.arange(t.n_agents), K + torch.tensor(t.agent_ids)] = 1.0
    return ids


#: ``--share-actor``: none and type are today's per-type actors (each shared by its type's
#: agents); all is one actor for every agent of every type
SHARE_ACTOR = ("none", "type", "all")


def _run_axis(state: State) -> State:
    """One run's state with a leading run axis of 1 (views)."""
    return tuple(s.unsqueeze(0) for s in state)


def _one(state: State) -> State:
    """Run 0's state of a stack (views)."""
    return tuple(s[0] for s in state)


class MultiAgentPolicy(nn.Module):
    """The actor of every agent type of ``layout``: ``actors[type]``.

    ``share_actor`` (``--share-actor``): ``"none"`` and ``"type"`` (the same configuration)
    give each type its own :class:`TypeActor`, shared by the type's agents;
    ``"all"`` one actor for every agent of every type (:attr:`shared`, seen by each type
    through a :class:`SharedTypeActor`): observations zero-padded to the largest type's,
    one head over ``max A_k`` actions cut to each type's ``A_k``. ``agent_ids``: append the
    identity one-hots (per type: the agent's index within the type; shared: the type's
    one-hot, then the agent's over all N agents); False: the observation alone.
    """

    def __init__(
        self,
        layout: AgentLayout,
        backbone: str = "mlp",
        hidden_dim: int = 64,
        activation: str = "tanh",
        *,
        share_actor: str = "none",
        agent_ids: bool = True,
        backbone_options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if share_actor not in SHARE_ACTOR:
            raise ValueError(f"share_actor must be one of {SHARE_ACTOR}, got {share_actor!r}")
        self.layout = layout
        self.backbone_kind = backbone
        self.share_actor, self.agent_ids = share_actor, bool(agent_ids)
        types = layout.types
        if share_actor != "all":
            self.actors = nn.ModuleDict(
                {
                    t.name: TypeActor(
                        t.obs_dim, t.n_agents, t.n_actions, backbone, hidden_dim, activation,
                        agent_ids=agent_ids, backbone_options=backbone_options,
                    )
                    for t in types
                }
            )  # fmt: skip
            return
        D = max(t.obs_dim for t in types)
        ids = [_shared_ids(layout, k, agent_ids) for k in range(len(types))]
        width = D + ids[0].shape[1]
        A = max(t.n_actions for t in types)
        core = TypeActor(
            width, 1, A, backbone, hidden_dim, activation, agent_ids=False,
            backbone_options=backbone_options,
        )  # fmt: skip
        self.actors = nn.ModuleDict(
            {t.name: SharedTypeActor(core, t, D - t.obs_dim, ids[k]) for k, t in enumerate(types)}
        )
        #: the one actor of every type (``--share-actor all``)
        self.shared = core

    @classmethod
    def from_config(cls, layout: AgentLayout, cfg: Any) -> MultiAgentPolicy:
        """The policy a run's config asks for (``backbone``, ``hidden_dim``, ``activation``,
        ``share_actor``, ``agent_ids``, ``chrono_init``; configs written before the last
        three: their defaults)."""
        chrono = getattr(cfg, "chrono_init", None)
        return cls(
            layout,
            cfg.backbone,
            cfg.hidden_dim,
            cfg.activation,
            share_actor=getattr(cfg, "share_actor", "none"),
            agent_ids=getattr(cfg, "agent_ids", True),
            backbone_options=None if chrono is None else {"chrono": chrono},
        )

    @property
    def is_recurrent(self) -> bool:
        return any(a.is_recurrent for a in self.actors.values())

    def initial_state(self, num_envs: int) -> dict[str, tuple[Tensor, ...]]:
        return {name: actor.initial_state(num_envs) for name, actor in self.actors.items()}

    @torch.no_grad()
    def act(
        self,
        obs: dict[str, Tensor],
        mask: dict[str, Tensor],
        state: dict[str, tuple[Tensor, ...]],
        reset: Tensor | None = None,
        *,
        deterministic: bool = False,
        generator: torch.Generator | None = None,
        neg_gumbel: dict[str, Tensor] | None = None,
    ) -> tuple[dict[str, Tensor], dict[str, Tensor], dict[str, tuple[Tensor, ...]]]:
        """Sample actions for every type: returns (actions ``[E, n_k]``, log-probs, new state).
        ``neg_gumbel``: per type, sampling noise drawn in advance (see :meth:`TypeActor.act`);
        :func:`act_per_type`."""
        return act_per_type(
            self.actors, obs, mask, state, reset, deterministic, neg_gumbel, generator=generator
        )


def act_per_type(
    actors: Mapping[str, Any],
    obs: Mapping[str, Tensor],
    mask: Mapping[str, Tensor],
    state: Mapping[str, State],
    reset: Tensor | None,
    deterministic: bool,
    neg_gumbel: Mapping[str, Tensor] | None,
    **source: Any,
) -> tuple[dict[str, Tensor], dict[str, Tensor], dict[str, State]]:
    """Every type's ``actor.act`` in type order (one run's actors or S runs'; ``source``:
    their noise source, ``generator=`` or ``generators=``). A ``reset`` with no True entry
    is dropped (the same result: the backbones then skip zeroing the state rows, two copies
    of every state tensor per step)."""
    if reset is not None and not bool(reset.any()):
        reset = None
    actions, logps, new_state = {}, {}, {}
    for name, actor in actors.items():
        actions[name], logps[name], new_state[name] = actor.act(
            obs[name],
            mask[name],
            state[name],
            reset,
            deterministic=deterministic,
            neg_gumbel=None if neg_gumbel is None else neg_gumbel[name],
            **source,
        )
    return actions, logps, new_state
