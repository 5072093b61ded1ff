"""Actors (one per agent type), the masked categorical, and the centralised critic.

Algorithm-agnostic: MAPPO and GRPO both use :class:`MultiAgentPolicy`; only MAPPO uses
:class:`CentralCritic`.

Shapes (E envs, n_k agents of type k, D_k observation size, A_k actions, S state size):

- actor step input: ``obs[E, n_k, D_k]``, ``mask[E, n_k, A_k]`` (bool), ``reset[E]`` (bool);
  the agent's index within its type is appended as a one-hot (``n_k`` extra inputs).
- actor sequence input (training): ``obs[B, P + L, n_k, D_k]`` with resets ``[B, P + L]``
  and the stored state of each of the ``B * n_k`` rows before step 0; the ``P`` prefix steps
  are the burn-in (run without autograd), the last ``L`` the loss window (optionally in
  truncated-BPTT chunks), see :meth:`TypeActor.chunks`.
- critic: ``state[..., S]`` -> team values ``[..., K]`` and individual values
  ``[..., N, K]`` for the N agents of the env in ``possible_agents`` order (K = ensemble size).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn

__all__ = [
    "MASK_LOGIT",
    "gumbel_max",
    "neg_gumbel_noise",
    "AgentLayout",
    "TypeSpec",
    "MaskedCategorical",
    "TypeActor",
    "MultiAgentPolicy",
    "CentralCritic",
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


def _backbone(kind: str, input_dim: int, hidden_dim: int, activation: str = "tanh"):
    from seqmodels.backbones import backbone_spec, make_backbone

    if backbone_spec(kind).takes_activation:
        return make_backbone(kind, input_dim, hidden_dim, activation=activation)
    return make_backbone(kind, input_dim, hidden_dim)  # e.g. mamba blocks: their own SiLU


class TypeActor(nn.Module):
    """Actor shared by the ``n_agents`` agents of one type (agent index one-hot as input)."""

    def __init__(
        self,
        obs_dim: int,
        n_agents: int,
        n_actions: int,
        backbone: str,
        hidden_dim: int,
        activation: str = "tanh",
    ) -> None:
        super().__init__()
        self.obs_dim, self.n_agents, self.n_actions = obs_dim, n_agents, n_actions
        self.backbone = _backbone(backbone, obs_dim + n_agents, hidden_dim, activation)
        self.head = nn.Linear(self.backbone.output_dim, n_actions)
        nn.init.orthogonal_(self.head.weight, gain=0.01)
        nn.init.zeros_(self.head.bias)
        self.register_buffer("agent_onehot", torch.eye(n_agents), persistent=False)

    @property
    def is_recurrent(self) -> bool:
        return bool(self.backbone.is_recurrent)

    def initial_state(self, num_envs: int) -> tuple[Tensor, ...]:
        """State for ``num_envs * n_agents`` rows (env-major, agent-minor)."""
        return tuple(self.backbone.initial_state(num_envs * self.n_agents))

    def inputs(self, obs: Tensor) -> Tensor:
        """Backbone inputs: ``obs[..., n_k, D]`` -> ``[..., n_k, D + n_k]`` (agent one-hot
        appended)."""
        onehot = self.agent_onehot.to(obs.dtype).expand(*obs.shape[:-1], self.n_agents)
        return torch.cat([obs, onehot], dim=-1)

    def step(
        self, obs: Tensor, mask: Tensor, state: tuple[Tensor, ...], reset: Tensor | None
    ) -> tuple[MaskedCategorical, tuple[Tensor, ...]]:
        """One step.

        obs ``[E, n_k, D]``, mask ``[E, n_k, A]``, reset ``[E]`` -> dist over ``[E, n_k]``.
        """
        logits, state = self._step_logits(obs, state, reset)
        return MaskedCategorical(logits, mask), state

    def _step_logits(
        self, obs: Tensor, state: tuple[Tensor, ...], reset: Tensor | None
    ) -> tuple[Tensor, tuple[Tensor, ...]]:
        """obs ``[E, n_k, D]`` -> (logits ``[E, n_k, A]``, new state): one backbone step."""
        E = obs.shape[0]
        x = self.inputs(obs).reshape(E * self.n_agents, -1)
        r = None if reset is None else reset.repeat_interleave(self.n_agents)
        y, state = self.backbone.step(x, state, r)
        return self.head(y).reshape(E, self.n_agents, self.n_actions), state

    @torch.no_grad()
    def act(
        self,
        obs: Tensor,
        mask: Tensor,
        state: tuple[Tensor, ...],
        reset: Tensor | None,
        *,
        deterministic: bool = False,
        generator: torch.Generator | None = None,
        neg_gumbel: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, tuple[Tensor, ...]]:
        """Rollout step without autograd: the same actions, log-probs and state as :meth:`step`
        followed by ``sample`` / ``mode`` and ``log_prob`` (the same operations on the same
        values), in fewer operations (the masking in place, no distribution object).

        obs ``[E, n_k, D]``, mask ``[E, n_k, A]`` bool, reset ``[E]`` -> (actions ``[E, n_k]``
        long, log-probs ``[E, n_k]``, new state). ``neg_gumbel`` ``[E, n_k, A]``: the sampling
        noise, drawn in advance (:func:`neg_gumbel_noise`); None: drawn here from
        ``generator``.
        """
        logits, state = self._step_logits(obs, state, reset)
        _check_mask(mask, logits)
        # masked in place (the logits are this call's own), as MaskedCategorical does
        log_probs = torch.log_softmax(logits.masked_fill_(~mask.bool(), MASK_LOGIT), dim=-1)
        if deterministic:
            a = log_probs.argmax(dim=-1)
        else:
            a = gumbel_max(log_probs, generator, neg_gumbel)
        return a, log_probs.gather(-1, a.unsqueeze(-1)).squeeze(-1), state

    def sequence(
        self,
        obs: Tensor,
        mask: Tensor,
        state: tuple[Tensor, ...] | None,
        resets: Tensor | None,
        *,
        burn_in: Tensor | None = None,
        tbptt_chunk: int | None = None,
    ) -> MaskedCategorical:
        """Windows. obs ``[B, P + L, n_k, D]``, mask ``[B, L, n_k, A]``, resets
        ``[B, P + L]``, state for ``B * n_k`` rows (env-major) before step 0 of each unit's
        input -> dist over the last ``L`` steps ``[B, L, n_k]``.

        ``P = obs.shape[1] - mask.shape[1]`` prefix steps carry the burn-in (see
        :meth:`chunks`); ``tbptt_chunk``: truncated backpropagation (see :meth:`chunks`).
        """
        parts = list(self.chunks(obs, state, resets, mask.shape[1], burn_in, tbptt_chunk))
        logits = parts[0][1] if len(parts) == 1 else torch.cat([lg for _, lg in parts], dim=1)
        return MaskedCategorical(logits, mask)

    def chunks(
        self,
        obs: Tensor,
        state: tuple[Tensor, ...] | None,
        resets: Tensor | None,
        length: int,
        burn_in: Tensor | None = None,
        tbptt_chunk: int | None = None,
    ) -> Iterator[tuple[slice, Tensor]]:
        """The logits of the last ``length`` steps of each unit, chunk by chunk.

        Args:
            obs: ``[B, P + length, n_k, D]``; the first ``P`` steps are the burn-in prefix.
            state: backbone state for the ``B * n_k`` rows (unit-major, agent-minor) before
                the first burn-in step of each unit (None: zeros).
            resets: ``[B, P + length]`` bool, an episode starts at that step (None: none).
            length: ``L``, the steps that get logits (the loss window).
            burn_in: ``[B]`` long, how many of the ``P`` prefix steps (the last ones) unit b
                runs before its loss window (None: all ``P``); the earlier prefix steps are
                padding and never read. The burn-in runs without autograd (R2D2): it only
                brings the stored state up to date with the current parameters.
            tbptt_chunk: ``k``: the loss window runs in chunks of ``k`` steps (the last one
                shorter) and the recurrent state passed between chunks is detached, so the
                gradient does not flow across chunk boundaries (truncated BPTT). None: one
                chunk. For gru this is ``h.detach()`` every ``k`` steps; for mamba/mamba2 the
                block's ``(conv_state, ssm_state)`` between chunk forwards, the same rule.

        Yields:
            ``(steps, logits)``: the slice of the ``length`` loss steps and their unmasked
            logits ``[B, len(steps), n_k, A]``. The next chunk is computed when asked for, so
            a caller may run the backward of each chunk before the next (activations of one
            chunk at a time).
        """
        B, total = obs.shape[:2]
        n, prefix = self.n_agents, total - length
        if prefix < 0:
            raise ValueError(f"obs has {total} steps, fewer than the {length} requested")
        x = self.inputs(obs).permute(0, 2, 1, 3).reshape(B * n, total, -1)
        r = None if resets is None else resets.repeat_interleave(n, dim=0)
        if not self.is_recurrent:
            y, _ = self.backbone(x[:, prefix:], None, None)
            yield slice(0, length), self._logits(y, B)
            return
        if state is None:
            state = self.initial_state(B)
        state = self._burn_in(x, r, state, prefix, burn_in)
        k = length if tbptt_chunk is None else int(tbptt_chunk)
        if k < 1:
            raise ValueError(f"tbptt_chunk must be an int >= 1 or None, got {tbptt_chunk!r}")
        for start in range(0, length, k):
            stop = min(start + k, length)
            if start > 0:
                state = tuple(s.detach() for s in state)
            cut = slice(prefix + start, prefix + stop)
            y, state = self.backbone(x[:, cut], state, None if r is None else r[:, cut])
            yield slice(start, stop), self._logits(y, B)

    def _logits(self, y: Tensor, B: int) -> Tensor:
        """Backbone outputs ``[B * n_k, L, H]`` -> logits ``[B, L, n_k, A]``."""
        L = y.shape[1]
        return self.head(y).reshape(B, self.n_agents, L, self.n_actions).permute(0, 2, 1, 3)

    def _burn_in(
        self,
        x: Tensor,
        resets: Tensor | None,
        state: tuple[Tensor, ...],
        prefix: int,
        burn_in: Tensor | None,
    ) -> tuple[Tensor, ...]:
        """The state at the loss window's start: each unit's last ``burn_in[b]`` prefix steps
        run from its stored state, without autograd. Units are grouped by burn-in length
        (a few distinct lengths: the first windows of a rollout have shorter ones), one
        backbone call per group. x ``[B * n_k, P + L, D]``, resets ``[B * n_k, P + L]``."""
        if prefix == 0:
            return tuple(state)
        n = self.n_agents
        if burn_in is None:
            lengths = [prefix]
            groups = [None]
        else:
            if burn_in.shape != (x.shape[0] // n,):
                raise ValueError(
                    f"burn_in must have shape [B={x.shape[0] // n}], got {tuple(burn_in.shape)}"
                )
            lengths = [int(v) for v in torch.unique(burn_in).tolist()]
            if min(lengths) < 0 or max(lengths) > prefix:
                raise ValueError(f"burn_in values must be in [0, {prefix}], got {lengths}")
            groups = [torch.nonzero(burn_in == v).flatten() for v in lengths]
        new_state = list(state)
        with torch.no_grad():
            for v, units in zip(lengths, groups, strict=True):
                if v == 0:
                    continue
                cut = slice(prefix - v, prefix)
                if units is None:  # every unit: the whole prefix
                    _, out = self.backbone(
                        x[:, cut], tuple(state), None if resets is None else resets[:, cut]
                    )
                    return tuple(s.detach() for s in out)
                rows = (units[:, None] * n + torch.arange(n, device=units.device)).reshape(-1)
                _, out = self.backbone(
                    x[rows, cut],
                    tuple(s.index_select(0, rows) for s in state),
                    None if resets is None else resets[rows, cut],
                )
                for i, s in enumerate(out):
                    new_state[i] = new_state[i].index_copy(0, rows, s.to(new_state[i].dtype))
        return tuple(s.detach() for s in new_state)

    def sequence_from_inputs(self, inputs: Tensor, mask: Tensor) -> MaskedCategorical:
        """Feed-forward backbones only: prepared :meth:`inputs` ``[..., n_k, D + n_k]`` and
        mask ``[..., n_k, A]`` -> dist over ``[..., n_k]`` (no state, no resets)."""
        if self.is_recurrent:
            raise ValueError("sequence_from_inputs is for feed-forward backbones; use sequence")
        lead = inputs.shape[:-1]
        y, _ = self.backbone(inputs.reshape(1, -1, inputs.shape[-1]), None, None)
        logits = self.head(y).reshape(*lead, self.n_actions)
        return MaskedCategorical(logits, mask)


class MultiAgentPolicy(nn.Module):
    """One :class:`TypeActor` per agent type of ``layout``."""

    def __init__(
        self,
        layout: AgentLayout,
        backbone: str = "mlp",
        hidden_dim: int = 64,
        activation: str = "tanh",
    ) -> None:
        super().__init__()
        self.layout = layout
        self.backbone_kind = backbone
        self.actors = nn.ModuleDict(
            {
                t.name: TypeActor(
                    t.obs_dim, t.n_agents, t.n_actions, backbone, hidden_dim, activation
                )
                for t in layout.types
            }
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
        ``neg_gumbel``: per type, sampling noise drawn in advance (see :meth:`TypeActor.act`).
        A ``reset`` with no True entry is dropped (the same result: the backbones then skip
        zeroing the state rows, two copies of every state tensor per step)."""
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
                generator=generator,
                neg_gumbel=None if neg_gumbel is None else neg_gumbel[name],
            )
        return actions, logps, new_state


class CentralCritic(nn.Module):
    """Centralised critic on the global state with a team head and per-agent individual heads.

    ``forward(state[..., S]) -> (team [..., K], individual [..., N, K])``: an MLP trunk on the
    state, a team head (K outputs, one per ensemble member) and an individual head with one
    output per agent and member (equivalent to concatenating the agent one-hot before a
    linear layer).
    """

    def __init__(
        self,
        state_dim: int,
        n_agents: int,
        hidden_dim: int = 128,
        ensemble: int = 1,
        activation: str = "tanh",
    ):
        super().__init__()
        self.n_agents, self.ensemble = n_agents, ensemble
        from seqmodels.backbones import _activation  # the backbones' activation modules

        self.trunk = nn.Sequential(
            nn.Linear(state_dim, hidden_dim),
            _activation(activation),
            nn.Linear(hidden_dim, hidden_dim),
            _activation(activation),
        )
        for m in self.trunk:
            if isinstance(m, nn.Linear):
                nn.init.orthogonal_(m.weight, gain=2**0.5)
                nn.init.zeros_(m.bias)
        # Each ensemble member gets its own heads; members differ by head initialisation.
        self.team_head = nn.Linear(hidden_dim, ensemble)
        self.individual_head = nn.Linear(hidden_dim, n_agents * ensemble)
        for head in (self.team_head, self.individual_head):
            nn.init.orthogonal_(head.weight, gain=1.0)
            nn.init.zeros_(head.bias)

    def forward(self, state: Tensor) -> tuple[Tensor, Tensor]:
        h = self.trunk(state)
        team = self.team_head(h)
        individual = self.individual_head(h).reshape(
            *state.shape[:-1], self.n_agents, self.ensemble
        )
        return team, individual
