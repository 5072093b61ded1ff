"""Seed-stacked actors and critic: S single-seed policies as one module with a leading seed axis.

Issue 37 trains S seeds in one process by stacking them: every parameter of the modules here
is ``[S, ...]`` (seed k's slice is exactly seed k's single-seed parameter) and every input and
output gains a leading seed axis. They are built from the modules the single-seed code builds
(:func:`build_seed_policies` mirrors the trainer's seeding), and :meth:`unstack` gives those
modules back. An actor's computations are written once, in
:class:`marl.models.policies.ActorCore`: :class:`SeedTypeActor` is that core on stacked
modules, ``TypeActor`` the same core on one run's own modules (S = 1).

=============================== =========================================================
:class:`SeedTypeActor`          S :class:`marl.models.policies.TypeActor` of one agent type
:class:`SeedMultiAgentPolicy`   S :class:`marl.models.policies.MultiAgentPolicy`
:class:`SeedCentralCritic`      S :class:`marl.models.policies.CentralCritic`
:class:`SeedGroupedCritic`      S :class:`marl.models.policies.GroupedCritic`
:func:`stack_policies`          S TypeActor or MultiAgentPolicy -> the seed module
:func:`stack_critics`           S CentralCritic or GroupedCritic -> the seed module
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
from marl.models.critics import CentralCritic, GroupedCritic, make_critic
from marl.models.policies import (
    ActorCore,
    AgentLayout,
    MaskedCategorical,
    MultiAgentPolicy,
    SharedTypeActor,
    SharedView,
    TypeActor,
    act_per_type,
    neg_gumbel_noise,
)
from marl.models.seed_backbones import (
    SEED_BACKBONES,
    SeedBackbone,
    SeedGRUBackbone,
    SeedLoopBackbone,
    SeedMLPBackbone,
    State,
    Unstacks,
    _apply,
    _check_seed_tensor,
    _same_type,
    stack_backbones,
)

__all__ = [
    "SEED_BACKBONES",
    "SeedBackbone",
    "SeedCentralCritic",
    "SeedGroupedCritic",
    "SeedGRUBackbone",
    "SeedLoopBackbone",
    "SeedMLPBackbone",
    "SeedMultiAgentPolicy",
    "SeedPolicies",
    "SeedSharedTypeActor",
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


class SeedTypeActor(Unstacks, ActorCore):
    """S :class:`marl.models.policies.TypeActor` of one agent type, stacked: the computations of
    :class:`~marl.models.policies.ActorCore` on stacked modules, the same methods as
    ``TypeActor`` with a leading seed axis on every input and output (module docstring)."""

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
        #: whether the backbone carries a state across steps (gru, mamba): fixed, as it is
        self.is_recurrent = bool(self.backbone.is_recurrent)
        self.head = SeedLinear.from_modules([a.head for a in actors])
        self.pad = first.pad
        self.register_buffer("agent_onehot", first.agent_onehot.clone(), persistent=False)
        self._template: tuple[TypeActor] = (copy.deepcopy(first),)
        #: the unbatched backbone burns in each seed's units as its own actor does
        self.per_run_burn_in = isinstance(self.backbone, SeedLoopBackbone)

    # -- stacking ----------------------------------------------------------------------------

    def single_seed_names(self) -> dict[str, str]:
        """Stacked parameter name -> the single-seed ``TypeActor``'s parameter name."""
        names = {f"backbone.{s}": f"backbone.{t}"
                 for s, t in self.backbone.single_seed_names().items()}  # fmt: skip
        names.update({"head.weight": "head.weight", "head.bias": "head.bias"})
        return names

    # -- the hooks: the stacked modules ----------------------------------------------------------

    def _backbone_step(self, x: Tensor, state: State, reset: Tensor | None) -> tuple[Tensor, State]:
        return self.backbone.step(x, state, reset)

    def _backbone_run(
        self, x: Tensor, state: State | None, resets: Tensor | None
    ) -> tuple[Tensor, State]:
        return self.backbone(x, state, resets)

    def _backbone_run_one(
        self, k: int, x: Tensor, state: State, resets: Tensor | None
    ) -> tuple[Tensor, State]:
        return self.backbone.forward_seed(k, x, state, resets)  # type: ignore[operator]

    def _head(self, y: Tensor) -> Tensor:
        return _apply(self.head, y)

    def _initial_state(self, rows: int) -> State:
        return tuple(self.backbone.initial_state(rows))

    # -- rollout -----------------------------------------------------------------------------

    def initial_state(self, num_envs: int) -> State:
        """State for ``num_envs * n_agents`` rows per seed: tuple of ``[S, E * n, ...]``."""
        return self._initial_state(num_envs * self.n_agents)

    def _step_logits(self, obs: Tensor, state: State, reset: Tensor | None) -> tuple[Tensor, State]:
        """obs ``[S, E, n, D]``, reset ``[S, E]`` -> (logits ``[S, E, n, A]``, new state)."""
        obs = _check_seed_tensor(obs, [self.num_seeds, None, self.n_agents, self.obs_dim], "obs")
        if reset is not None:
            reset = _check_seed_tensor(reset, [self.num_seeds, obs.shape[1]], "reset")
        return self.run_step_logits(obs, state, reset)

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
        obs = _check_seed_tensor(obs, [self.num_seeds, None, self.n_agents, self.obs_dim], "obs")
        if reset is not None:
            reset = _check_seed_tensor(reset, [self.num_seeds, obs.shape[1]], "reset")

        def noise(shape: tuple[int, ...], device: torch.device) -> Tensor:
            if neg_gumbel is not None:
                return neg_gumbel
            return self._noise(shape, device, generators)

        return self.run_act(obs, mask, state, reset, deterministic=deterministic, noise=noise)

    def _noise(
        self,
        shape: tuple[int, ...],
        device: torch.device,
        generators: Sequence[torch.Generator] | None,
    ) -> Tensor:
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
        return seed_neg_gumbel_noise(shape[1:], generators, device)

    # -- training windows --------------------------------------------------------------------

    def chunks(
        self,
        obs: Tensor,
        state: State | None,
        resets: Tensor | None,
        length: int,
        burn_in: Tensor | None = None,
        tbptt_chunk: int | None = None,
    ) -> Iterator[tuple[slice, Tensor]]:
        """:meth:`~marl.models.policies.ActorCore.run_chunks` (``TypeActor.chunks`` for every
        seed): obs ``[S, B, P + length, n, D]``, state for the ``B * n`` rows of each seed
        (tuple of ``[S, B * n, ...]``, None: zeros), resets ``[S, B, P + length]``, burn_in
        ``[S, B]`` (None: all ``P``) -> ``(steps, logits [S, B, len(steps), n, A])`` chunk by
        chunk."""
        S = self.num_seeds
        obs = _check_seed_tensor(obs, [S, None, None, self.n_agents, self.obs_dim], "obs")
        B, total = obs.shape[1:3]
        if resets is not None:
            resets = _check_seed_tensor(resets, [S, B, total], "resets")
        if burn_in is not None:
            burn_in = _check_seed_tensor(burn_in, [S, B], "burn_in")
        return self.run_chunks(obs, state, resets, length, burn_in, tbptt_chunk)

    def sequence_from_inputs(self, inputs: Tensor, mask: Tensor) -> MaskedCategorical:
        """Feed-forward backbones only: prepared :meth:`inputs` ``[S, ..., n, D + n]`` and mask
        ``[S, ..., n, A]`` -> dist over ``[S, ..., n]``."""
        return MaskedCategorical(self.run_logits_from_inputs(inputs), mask)


class SeedSharedTypeActor(SharedView, SeedTypeActor):  # type: ignore[misc]
    """S runs' :class:`~marl.models.policies.SharedTypeActor` of one type: the type's view of
    the stacked shared actor ``core`` (its inputs padded and identified, its logits cut to
    the type's actions, as the one-run view's); it owns no parameters."""

    def __init__(self, core: SeedTypeActor, view: SharedTypeActor) -> None:
        nn.Module.__init__(self)
        self.num_seeds, self.per_run_burn_in = core.num_seeds, core.per_run_burn_in
        self.is_recurrent = core.is_recurrent
        self.obs_dim, self.n_agents, self.n_actions = view.obs_dim, view.n_agents, view.n_actions
        self.pad = view.pad
        self._core = (core,)
        self.register_buffer("agent_onehot", view.agent_onehot.clone(), persistent=False)

    def single_seed_names(self) -> dict[str, str]:
        return {}  # the parameters are the policy's ``shared``


class SeedMultiAgentPolicy(Unstacks, nn.Module):
    """S :class:`marl.models.policies.MultiAgentPolicy` of one layout: one :class:`SeedTypeActor`
    per agent type, or (``share_actor == "all"``) the shared actor stacked once
    (:attr:`shared`) and each type's :class:`SeedSharedTypeActor` view of it."""

    def __init__(self, policies: Sequence[MultiAgentPolicy]) -> None:
        super().__init__()
        policies = _same_type(policies, MultiAgentPolicy, "policy")
        first = policies[0]
        for i, p in enumerate(policies):
            if (p.layout, p.backbone_kind, p.share_actor, p.agent_ids) != (
                first.layout, first.backbone_kind, first.share_actor, first.agent_ids
            ):  # fmt: skip
                raise ValueError(
                    f"policy {i} has another layout, backbone or sharing than policy 0"
                )
        self.num_seeds = len(policies)
        self.layout: AgentLayout = first.layout
        self.backbone_kind = first.backbone_kind
        self.share_actor, self.agent_ids = first.share_actor, first.agent_ids
        if first.share_actor == "all":
            core = SeedTypeActor([p.shared for p in policies])
            self.actors = nn.ModuleDict(
                {name: SeedSharedTypeActor(core, view) for name, view in first.actors.items()}
            )
            self.shared = core
        else:
            self.actors = nn.ModuleDict(
                {name: SeedTypeActor([p.actors[name] for p in policies]) for name in first.actors}
            )
        self._template: tuple[MultiAgentPolicy] = (copy.deepcopy(first),)

    def single_seed_names(self) -> dict[str, str]:
        """Stacked parameter name -> the ``MultiAgentPolicy``'s parameter name."""
        names = {f"actors.{t}.{stacked}": f"actors.{t}.{one}"
                 for t, actor in self.actors.items()
                 for stacked, one in actor.single_seed_names().items()}  # fmt: skip
        if self.share_actor == "all":
            names.update({f"shared.{s}": f"shared.{t}"
                          for s, t in self.shared.single_seed_names().items()})  # fmt: skip
        return names

    @property
    def is_recurrent(self) -> bool:
        return any(a.is_recurrent for a in self.actors.values())

    def initial_state(self, num_envs: int) -> dict[str, State]:
        return {name: actor.initial_state(num_envs) for name, actor in self.actors.items()}

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
        with that generator draws it (:func:`~marl.models.policies.act_per_type`)."""
        return act_per_type(
            self.actors, obs, mask, state, reset, deterministic, neg_gumbel, generators=generators
        )


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


class SeedCentralCritic(Unstacks, nn.Module):
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

    def forward(self, state: Tensor) -> tuple[Tensor, Tensor]:
        """state ``[S, ..., state_dim]`` -> (team ``[S, ..., K]``, individual ``[S, ..., N,
        K]``)."""
        h = _apply(self.trunk, state)
        team = _apply(self.team_head, h)
        individual = _apply(self.individual_head, h).reshape(
            *state.shape[:-1], self.n_agents, self.ensemble
        )
        return team, individual


class SeedGroupedCritic(Unstacks, nn.Module):
    """S :class:`marl.models.policies.GroupedCritic`, stacked: each of the G critics a
    :class:`SeedCentralCritic` of the runs' critic g; ``forward(state [S, ..., state_dim]) ->
    (team [S, ..., G * K], individual [S, ..., N, K])``."""

    def __init__(self, critics: Sequence[GroupedCritic]) -> None:
        super().__init__()
        critics = _same_type(critics, GroupedCritic, "critic")
        first = critics[0]
        for i, c in enumerate(critics):
            if (c.groups, c.ensemble) != (first.groups, first.ensemble):
                raise ValueError(f"critic {i} has another (groups, ensemble) than critic 0")
        self.num_seeds = len(critics)
        self.n_agents, self.ensemble = first.n_agents, first.ensemble
        self.groups, self.num_critics = first.groups, first.num_critics
        self.members = nn.ModuleList(
            SeedCentralCritic([c.members[g] for c in critics]) for g in range(self.num_critics)
        )
        self.register_buffer("gather", first.gather.clone(), persistent=False)
        self._template: tuple[GroupedCritic] = (copy.deepcopy(first),)

    def single_seed_names(self) -> dict[str, str]:
        """Stacked parameter name -> the single-seed ``GroupedCritic``'s parameter name."""
        return {
            f"members.{g}.{stacked}": f"members.{g}.{one}"
            for g, member in enumerate(self.members)
            for stacked, one in member.single_seed_names().items()
        }

    def forward(self, state: Tensor) -> tuple[Tensor, Tensor]:
        """state ``[S, ..., state_dim]`` -> (team ``[S, ..., G * K]``, individual ``[S, ...,
        N, K]``), as :meth:`GroupedCritic.forward` of each run."""
        outs = [member(state) for member in self.members]
        team = torch.cat([t for t, _ in outs], dim=-1)
        individual = torch.cat([i for _, i in outs], dim=-2).index_select(-2, self.gather)
        return team, individual


def stack_critics(
    critics: Sequence[CentralCritic | GroupedCritic],
) -> SeedCentralCritic | SeedGroupedCritic:
    """S single-seed critics, seed k = ``critics[k]``, as one :class:`SeedCentralCritic` (or
    :class:`SeedGroupedCritic` for grouped ones)."""
    critics = list(critics)
    if critics and isinstance(critics[0], GroupedCritic):
        return SeedGroupedCritic(critics)
    return SeedCentralCritic(critics)


# ------------------------------------------------------------------------------------------
# initialisation
# ------------------------------------------------------------------------------------------


class SeedPolicies(NamedTuple):
    """What :func:`build_seed_policies` builds."""

    #: seed k's ``MultiAgentPolicy`` at stack index k
    policy: SeedMultiAgentPolicy
    #: seed k's critic at stack index k (None without a critic: GRPO)
    critic: SeedCentralCritic | SeedGroupedCritic | None
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
    hidden_dim, activation)`` and (MAPPO) its critic (``make_critic(layout, cfg)``) on the
    CPU, then moves them to the device. This does the
    same for each seed inside ``torch.random.fork_rng``, so the global generator is left as
    it was. (The env is built once by the caller, ``layout``: building one draws nothing
    from torch's generator for the project's envs; tests/test_seed_policies.py pins the
    modules and the generator states against ``MAPPO(cfg)`` and ``GRPO(cfg)`` built after
    seeding.)

    Args:
        cfg: the run's config (``MAPPOConfig`` / ``GRPOConfig``): reads ``backbone``,
            ``hidden_dim``, ``activation``, and with ``critic`` ``critic_hidden_dim``,
            ``value_ensemble`` and ``share_critic``.
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
            policies.append(MultiAgentPolicy.from_config(layout, cfg))
            if critic:
                critics.append(make_critic(layout, cfg))
            generator = torch.Generator()
            generator.set_state(torch.get_rng_state())
            generators.append(generator)
    seed_policy = SeedMultiAgentPolicy(policies).to(device)
    seed_critic = stack_critics(critics).to(device) if critic else None
    return SeedPolicies(seed_policy, seed_critic, generators)
