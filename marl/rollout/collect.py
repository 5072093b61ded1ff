"""Rollout collection on contract-conforming vector envs (docs/CONTRACTS.md section 1), for
one run and for S runs at once: the one collector of MAPPO and of ``--seeds``.

Algorithm-agnostic: :class:`RolloutCollector` steps ``E`` environments of each of S runs for
``T`` steps with their policies, carrying per-agent recurrent state (reset at episode starts)
and, when a ``value_fn`` is given (MAPPO's critic), the values of every state and the
bootstrap values of truncated episodes' final states. Nothing here depends on the
environment's internals: agent types come from name prefixes, rewards by channel from the
``reward_team`` / ``reward_individual`` / ``reward_penalty`` infos.

S runs (``--seeds``): run k has its own vector env, built and reset as a single run with
``--seed seeds[k]`` builds and resets its env, its own episode tracker, and its own sampling
noise drawn from its own generator (:func:`marl.models.seed_policies.build_seed_policies`
gives generators positioned where that run's global generator stands). The envs step one
after another (they are numpy code); the policy's forward (one stacked
:class:`~marl.models.seed_policies.SeedMultiAgentPolicy`), the critic's values and the
buffers are stacked over runs. One run is the case S = 1: the collector is built with the
run's own :class:`~marl.models.policies.MultiAgentPolicy`, draws its noise from torch's
global generator, and drops the run axis at its boundary (``collect`` returns a
:class:`RolloutBatch`, ``value_fn`` and ``state_dict`` are a single run's).

Buffer shapes (S runs, T steps, E envs per run, n_k agents of type k, N agents, D_s state
size, K value heads); one run's batch has no leading S, and run k's slice of a stacked batch
(:meth:`SeedRolloutBatch.seed`) is exactly what a single run's collector stores:

- ``obs[k]: [S, T, E, n_k, D_k]``, ``mask[k]: [S, T, E, n_k, A_k]`` bool, ``actions[k]``,
  ``logp[k]: [S, T, E, n_k]``
- ``reward_team: [S, T, E]``, ``reward_individual``, ``reward_penalty: [S, T, E, N]``
- ``terminated``, ``truncated``, ``episode_start: [S, T, E]`` bool (``episode_start[t]``:
  the observation at t is the first of an episode)
- ``state: [S, T, E, D_s]``; ``values_team: [S, T, E, G * K]``, ``values_individual: [S, T, E,
  N, K]``; ``next_values_*``: value of the next state in the same episode (the final state's
  value where the episode was truncated; zero where it terminated)
- ``window_states[k]``: the actor state before step ``t`` for each ``t`` in
  ``window_state_steps``, each a tuple of ``[S, E * n_k, ...]`` tensors
- ``episodes``: one list of episode records per run

Equality (tests/test_seed_collect.py, one torch thread, CPU):

- run k in a stack of S and run k in a stack of one (``--seeds 0-2`` vs ``--seeds k``): bit
  for bit, every buffer, values included, for a critic with two or more value heads. The
  shapes of every call on run k's rows depend on run k alone (the values of truncated
  episodes' final states are computed in one call per distinct count ``F_k``, so run k's
  rows always form an ``[F_k, D_s]`` block), and the critic's inputs are built with each
  run's block on a 64-byte boundary (:data:`SEED_ALIGN`: MKL's GEMMs with few rows give
  bits that depend on the input's address modulo 16 bytes; measured for ``addmm`` and
  ``bmm`` with 3 rows). With one value head (``value_ensemble=1``, the default) the team
  values of a stack of one differ in the last bit: ``torch.baddbmm`` with one output column
  takes another kernel for a batch of one than for several (``SeedLinear``; an xfail test
  pins it).
- against a single run's collector (``MAPPO(cfg)`` after ``torch.manual_seed(k)``, two
  consecutive rollouts): environment data (observations, masks, rewards, flags, episode
  starts, states, episode records) and the sampled actions bit-equal; with a value function
  that runs each run's own ``CentralCritic`` the values are bit-equal too, so stacking adds
  no difference of its own. The stacked modules agree with the single-run ones to float32
  rounding (``baddbmm`` for ``addmm``): the stacked critic's values always to rounding, the
  actor's log-probs and states bit-equal at some shapes (4 envs in the test) and to rounding
  at others (3 envs).

Whole episode groups (GRPO) and the evaluation loop are in :mod:`marl.rollout.episodes`.
"""

from __future__ import annotations

import pickle
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from functools import partial
from typing import Any, TypeVar

import numpy as np
import torch
from torch import Tensor

from marl.adapters.envapi import VectorEnv, make_vector_env, resolve_env_fn
from marl.models.policies import AgentLayout, MultiAgentPolicy, neg_gumbel_noise
from marl.models.seed_policies import SeedMultiAgentPolicy
from marl.rollout.episode_records import (
    EpisodeTracker,
    agent_activity,
    live_mean_reward,
    reward_channels,
)

__all__ = [
    "make_vector_env",
    "resolve_env_fn",
    "SEED_ALIGN",
    "ObsBatcher",
    "OneRunPolicy",
    "RolloutBatch",
    "SeedRolloutBatch",
    "RolloutCollector",
    "EpisodeTracker",
    "stack_runs",
]

#: ``state [M, D_s] -> (team [M, K], individual [M, N, K])``: a single run's critic
ValueFn = Callable[[Tensor], tuple[Tensor, Tensor]]
#: ``state [S, M, D_s] -> (team [S, M, K], individual [S, M, N, K])`` (the stacked critic)
SeedValueFn = Callable[[Tensor], tuple[Tensor, Tensor]]

#: the run stride, in float32 elements, of the blocks the collector hands to the critic
SEED_ALIGN = 16


def stack_runs(tensors: Sequence[Tensor]) -> Tensor:
    """The runs' tensors with a leading run axis (one run's: a view, no copy)."""
    return tensors[0].unsqueeze(0) if len(tensors) == 1 else torch.stack(list(tensors))


class OneRunPolicy:
    """A single run's :class:`MultiAgentPolicy` with the stacked policy's interface: every
    input and output has a leading run axis of 1 (views; the run's own modules compute)."""

    num_seeds = 1

    def __init__(self, policy: MultiAgentPolicy) -> None:
        self.policy = policy

    @property
    def is_recurrent(self) -> bool:
        return self.policy.is_recurrent

    def initial_state(self, num_envs: int) -> dict[str, tuple[Tensor, ...]]:
        return _lead(self.policy.initial_state(num_envs))

    @torch.no_grad()
    def act(
        self,
        obs: Mapping[str, Tensor],
        mask: Mapping[str, Tensor],
        state: Mapping[str, tuple[Tensor, ...]],
        reset: Tensor | None = None,
        *,
        neg_gumbel: Mapping[str, Tensor],
    ) -> tuple[dict[str, Tensor], dict[str, Tensor], dict[str, tuple[Tensor, ...]]]:
        """:meth:`MultiAgentPolicy.act` with the run axis kept (``[1, E, ...]`` in and out):
        each type's actor's computations for S runs
        (:meth:`~marl.models.policies.ActorCore.run_act`, S = 1) with the noise
        ``neg_gumbel`` per type ``[1, E, n_k, A_k]``; the same values as ``policy.act`` on
        run 0's slice, without dropping and adding the axis on every call."""
        if reset is not None and not bool(reset.any()):
            reset = None  # as MultiAgentPolicy.act: the same result, fewer state copies
        actions, logps, new_state = {}, {}, {}
        for name, actor in self.policy.actors.items():
            actions[name], logps[name], new_state[name] = actor.run_act(
                obs[name],
                mask[name],
                state[name],
                reset,
                deterministic=False,
                noise=lambda shape, device, noise=neg_gumbel[name]: noise,
            )
        return actions, logps, new_state


def _lead(d: Mapping[str, Any]) -> dict[str, Any]:
    """Every tensor of ``d`` (or of its tuples) with a leading axis of 1."""
    return {k: tuple(s.unsqueeze(0) for s in v) if isinstance(v, tuple) else v.unsqueeze(0)
            for k, v in d.items()}  # fmt: skip


class ObsBatcher:
    """Stacks per-agent observation dicts into per-type tensors ``[E, n_k, D]``."""

    def __init__(self, layout: AgentLayout, device: torch.device | str = "cpu") -> None:
        self.layout = layout
        self.device = torch.device(device)

    def __call__(self, obs: dict) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        obs_t, mask_t = {}, {}
        for t in self.layout.types:
            o = np.stack([obs[a]["observation"] for a in t.agents], axis=1)
            m = np.stack([obs[a]["action_mask"] for a in t.agents], axis=1)
            obs_t[t.name] = torch.from_numpy(np.ascontiguousarray(o, dtype=np.float32)).to(
                self.device
            )
            mask_t[t.name] = torch.from_numpy(m.astype(bool)).to(self.device)
        return obs_t, mask_t

    def actions_to_env(self, actions: dict[str, Tensor]) -> dict[str, np.ndarray]:
        """Per-type ``[E, n_k]`` actions -> dict agent -> int64 array ``[E]``."""
        out = {}
        for t in self.layout.types:
            a = actions[t.name].cpu().numpy().astype(np.int64)
            for j, name in enumerate(t.agents):
                out[name] = a[:, j]
        return out


@dataclass
class RolloutBatch:
    """One rollout (see the module docstring for shapes)."""

    obs: dict[str, Tensor]
    mask: dict[str, Tensor]
    actions: dict[str, Tensor]
    logp: dict[str, Tensor]
    reward_team: Tensor
    reward_individual: Tensor
    reward_penalty: Tensor
    terminated: Tensor
    truncated: Tensor
    episode_start: Tensor
    state: Tensor | None = None
    values_team: Tensor | None = None
    values_individual: Tensor | None = None
    next_values_team: Tensor | None = None
    next_values_individual: Tensor | None = None
    window_state_steps: tuple[int, ...] = ()
    window_states: dict[str, list[tuple[Tensor, ...]]] = field(default_factory=dict)
    episodes: list[dict[str, float]] = field(default_factory=list)
    #: [T, E, N] bool: the agent acted at the step (the ``active`` info of envs whose agents
    #: may leave early; None: every agent always acts)
    active: Tensor | None = None

    # counted from the end of the flags' shape, so a leading run axis (SeedRolloutBatch)
    # changes nothing
    @property
    def num_steps(self) -> int:
        return int(self.terminated.shape[-2])

    @property
    def num_envs(self) -> int:
        return int(self.terminated.shape[-1])


#: ``(values_team, values_individual, next_values_team, next_values_individual)`` of a rollout
Values = tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None]

BatchT = TypeVar("BatchT")


@dataclass
class RolloutBuffers:
    """The buffers one rollout writes, behind leading axes ``L = [S, T]`` (per-step shapes as
    in the module docstring)."""

    obs: dict[str, Tensor]
    mask: dict[str, Tensor]
    actions: dict[str, Tensor]
    logp: dict[str, Tensor]
    episode_start: Tensor
    reward_team: np.ndarray
    reward_individual: np.ndarray
    reward_penalty: np.ndarray
    #: ``[*L, E, N]`` bool: false where an agent did not act (the env's ``active`` info)
    active: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    #: whether some agent did not act at some step (``active`` then goes into the batch)
    any_left: bool = False
    #: the states of every step, then the state after the last step: ``[(T + 1) * E, D_s]``
    #: (``[S, ...]`` stacked), the values' input without a concatenation; None: not stored
    state_all: Tensor | None = None
    #: ``[*L, E, D_s]``: the steps' rows of ``state_all``
    state: Tensor | None = None

    @classmethod
    def allocate(
        cls,
        buffer: Callable[[str, tuple[int, ...], torch.dtype], Tensor],
        lead: tuple[int, ...],
        num_envs: int,
        layout: AgentLayout,
    ) -> RolloutBuffers:
        """The tensors from ``buffer(name, shape, dtype)`` (a collector's reusable ones,
        uninitialised), the rewards and flags zeroed, ``active`` true; no state buffers."""
        L, N, types = (*lead, num_envs), layout.n_agents, layout.types
        f32, i64, b = torch.float32, torch.long, torch.bool
        return cls(
            obs={t.name: buffer(f"obs/{t.name}", (*L, t.n_agents, t.obs_dim), f32) for t in types},
            mask={
                t.name: buffer(f"mask/{t.name}", (*L, t.n_agents, t.n_actions), b) for t in types
            },
            actions={t.name: buffer(f"act/{t.name}", (*L, t.n_agents), i64) for t in types},
            logp={t.name: buffer(f"logp/{t.name}", (*L, t.n_agents), f32) for t in types},
            episode_start=buffer("starts", L, b),
            reward_team=np.zeros(L, np.float32),
            reward_individual=np.zeros((*L, N), np.float32),
            reward_penalty=np.zeros((*L, N), np.float32),
            active=np.ones((*L, N), bool),
            terminated=np.zeros(L, bool),
            truncated=np.zeros(L, bool),
        )

    def batch(
        self,
        batch_type: type[BatchT],
        device: torch.device,
        values: Values,
        window_state_steps: Sequence[int],
        window_states: dict[str, list],
        episodes: list,
    ) -> BatchT:
        """The buffers as a ``batch_type`` (:class:`RolloutBatch`, or the seed-stacked batch),
        the numpy ones moved to ``device``; ``values``: None each without a value function;
        ``episodes``: the episode records (one list per seed, stacked)."""
        vt, vi, nvt, nvi = values
        return batch_type(
            obs=self.obs,
            mask=self.mask,
            actions=self.actions,
            logp=self.logp,
            reward_team=torch.from_numpy(self.reward_team).to(device),
            reward_individual=torch.from_numpy(self.reward_individual).to(device),
            reward_penalty=torch.from_numpy(self.reward_penalty).to(device),
            active=torch.from_numpy(self.active).to(device) if self.any_left else None,
            terminated=torch.from_numpy(self.terminated).to(device),
            truncated=torch.from_numpy(self.truncated).to(device),
            episode_start=self.episode_start,
            state=self.state,
            values_team=vt,
            values_individual=vi,
            next_values_team=nvt,
            next_values_individual=nvi,
            window_state_steps=tuple(int(s) for s in window_state_steps),
            window_states=window_states,
            episodes=episodes,
        )


@dataclass
class SeedRolloutBatch(RolloutBatch):
    """One rollout of S runs: :class:`RolloutBatch`'s fields with a leading run axis (see the
    module docstring for shapes; ``episodes``: one list of episode records per run;
    ``active [S, T, E, N]``, None where every agent of every run acted). :meth:`seed` gives
    run k's as a single run's :class:`RolloutBatch`."""

    @property
    def num_seeds(self) -> int:
        return int(self.terminated.shape[0])

    @classmethod
    def of_one(cls, batch: RolloutBatch) -> SeedRolloutBatch:
        """One run's ``batch`` as a stack of one (views, no copy)."""

        def lead(x: Tensor | None) -> Tensor | None:
            return None if x is None else x.unsqueeze(0)

        return cls(
            **{f.name: lead(getattr(batch, f.name)) for f in fields(RolloutBatch)
               if f.name not in ("obs", "mask", "actions", "logp", "window_state_steps",
                                 "window_states", "episodes")},
            **{name: {k: x.unsqueeze(0) for k, x in getattr(batch, name).items()}
               for name in ("obs", "mask", "actions", "logp")},
            window_state_steps=batch.window_state_steps,
            window_states={
                name: [tuple(s.unsqueeze(0) for s in state) for state in states]
                for name, states in batch.window_states.items()
            },
            episodes=[batch.episodes],
        )  # fmt: skip

    def seed(self, k: int) -> RolloutBatch:
        """Run index ``k``'s rollout as a single run's :class:`RolloutBatch` (views, no copy);
        ``active`` is None where every agent of run k acted, as a single run's collector
        leaves it."""

        def pick(x: Tensor | None) -> Tensor | None:
            return None if x is None else x[k]

        active = pick(self.active)
        one = RolloutBatch(
            obs={name: x[k] for name, x in self.obs.items()},
            mask={name: x[k] for name, x in self.mask.items()},
            actions={name: x[k] for name, x in self.actions.items()},
            logp={name: x[k] for name, x in self.logp.items()},
            reward_team=self.reward_team[k],
            reward_individual=self.reward_individual[k],
            reward_penalty=self.reward_penalty[k],
            terminated=self.terminated[k],
            truncated=self.truncated[k],
            episode_start=self.episode_start[k],
            state=pick(self.state),
            values_team=pick(self.values_team),
            values_individual=pick(self.values_individual),
            next_values_team=pick(self.next_values_team),
            next_values_individual=pick(self.next_values_individual),
            window_state_steps=self.window_state_steps,
            window_states={
                name: [tuple(s[k] for s in state) for state in states]
                for name, states in self.window_states.items()
            },
            episodes=self.episodes[k],
            active=None if active is None or bool(active.all()) else active,
        )
        one._stacked = self  # type: ignore[attr-defined]  # its buffers live while this does
        return one


class RolloutCollector:
    """Steps the vector envs of S runs with their policies, keeping observations, episode
    starts and actor state across calls (see the module docstring).

    Two ways to build it:

    - S runs: ``RolloutCollector(vecs, layout, policy, seeds=..., generators=...)`` with one
      vector env, reset seed and CPU ``torch.Generator`` per run (each env built as the
      single run builds its env, ``make_vector_env(cfg.env_fn, cfg.num_envs, cfg.env)``; the
      generators those of :func:`marl.models.seed_policies.build_seed_policies`) and the
      stacked :class:`SeedMultiAgentPolicy`;
    - one run: ``RolloutCollector(vec, layout, policy, seed=...)`` with the run's vector env,
      its :class:`MultiAgentPolicy` and reset seed: the case S = 1, its noise from torch's
      global generator, the run axis dropped at the boundary.
    """

    def __init__(
        self,
        vecs: VectorEnv | Sequence[VectorEnv],
        layout: AgentLayout,
        policy: MultiAgentPolicy | SeedMultiAgentPolicy,
        *,
        seed: int | None = None,
        seeds: Sequence[int | None] | None = None,
        generators: Sequence[torch.Generator | None] | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        #: one run, its axis dropped at the boundary (built with a ``MultiAgentPolicy``)
        self.one_run = isinstance(policy, MultiAgentPolicy)
        if self.one_run:
            if seeds is not None or generators is not None:
                raise ValueError("one run's collector takes seed=, not seeds= or generators=")
            vecs, seeds, generators = [vecs], [seed], [None]
            policy = OneRunPolicy(policy)  # type: ignore[arg-type]
        elif seed is not None or seeds is None or generators is None:
            raise ValueError("a stacked policy's collector takes seeds= and generators=")
        vecs, seeds, generators = list(vecs), list(seeds), list(generators)  # type: ignore[arg-type]
        S = len(vecs)
        if S == 0:
            raise ValueError("vecs must hold one vector env per run, got none")
        if policy.num_seeds != S or len(seeds) != S or len(generators) != S:
            raise ValueError(
                f"need one env, one reset seed and one generator per policy seed "
                f"({policy.num_seeds}); got {S} envs, {len(seeds)} seeds, "
                f"{len(generators)} generators"
            )
        num_envs = {int(v.num_envs) for v in vecs}
        if len(num_envs) != 1:
            raise ValueError(f"every seed's env must have the same num_envs, got {num_envs}")
        self.vecs, self.layout, self.policy = vecs, layout, policy
        self.seeds, self.generators = seeds, generators
        self.device = torch.device(device)
        self.num_seeds, self.num_envs = S, num_envs.pop()
        self.batcher = ObsBatcher(layout, self.device)
        self.obs = [vec.reset(seed=s)[0] for vec, s in zip(vecs, seeds, strict=True)]
        self.episode_start = torch.ones(S, self.num_envs, dtype=torch.bool, device=self.device)
        self.policy_state = policy.initial_state(self.num_envs)
        self.trackers = [EpisodeTracker(self.num_envs, layout.n_agents) for _ in range(S)]
        # the torch buffers of the last rollout collected with ``reuse_buffers`` and that
        # batch (weakly): reused by the next such rollout once the batch is gone
        self._buffers: dict[str, Tensor] = {}
        self._buffers_batch: weakref.ref[SeedRolloutBatch] | None = None

    @property
    def vec(self) -> VectorEnv:
        """One run's vector env (the first run's of a stack)."""
        return self.vecs[0]

    def _buffer(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, reuse: bool) -> Tensor:
        """An uninitialised ``shape`` tensor: the previous rollout's when ``reuse`` allows."""
        old = self._buffers.get(name) if reuse else None
        if old is not None and tuple(old.shape) == shape and old.dtype == dtype:
            return old
        buf = torch.empty(shape, dtype=dtype, device=self.device)
        if reuse:
            self._buffers[name] = buf
        return buf

    def _seed_blocks(
        self, name: str, num_seeds: int, shape: tuple[int, ...], reuse: bool
    ) -> Tensor:
        """An uninitialised float32 ``[S, *shape]`` tensor whose run blocks each start on a
        64-byte boundary (run stride rounded up to :data:`SEED_ALIGN` floats).

        MKL's GEMMs with few rows give bits that depend on their input's address modulo 16
        bytes (measured with ``addmm`` and ``bmm`` on 3 rows), so run k's block sits on the
        alignment of a freshly allocated single-run tensor, whatever k and S."""
        size = int(np.prod(shape))
        stride = -(-size // SEED_ALIGN) * SEED_ALIGN
        flat = self._buffer(name, (num_seeds, stride), torch.float32, reuse)
        return flat[:, :size].view(num_seeds, *shape)

    def _states(self) -> Tensor:
        """``[S, E, D_s]``: every run's ``vec.state()``."""
        return stack_runs(
            [torch.from_numpy(np.asarray(vec.state(), np.float32)) for vec in self.vecs]
        ).to(self.device)

    def _noise(self, T: int) -> dict[str, Tensor]:
        """Per type ``[S, T, E, n_k, A_k]``: the rollout's sampling noise, drawn per type in
        type order from each run's generator (torch's global one, on the device, for None)."""
        E, dev = self.num_envs, self.device
        noise = {}
        for t in self.layout.types:
            shape = (T, E, t.n_agents, t.n_actions)
            noise[t.name] = stack_runs([
                neg_gumbel_noise(shape, device=dev) if g is None
                else neg_gumbel_noise(shape, g).to(dev)
                for g in self.generators
            ])  # fmt: skip
        return noise

    @torch.no_grad()
    def collect(
        self,
        num_steps: int,
        *,
        value_fn: ValueFn | SeedValueFn | None = None,
        window_state_steps: Sequence[int] = (),
        store_state: bool = False,
        before_values: Callable[[], Any] | None = None,
        reuse_buffers: bool = False,
    ) -> RolloutBatch | SeedRolloutBatch:
        """Collect ``num_steps`` steps from every env of every run (autoreset envs, episodes
        continue across calls): a :class:`SeedRolloutBatch`, one run's :class:`RolloutBatch`.

        ``value_fn``: the critic, ``state [S, M, D_s] -> ([S, M, K], [S, M, N, K])``; one
        run's takes and returns no run axis. ``before_values``: called after the last env
        step, before ``value_fn`` (MAPPO waits there for value epochs that ran alongside the
        env steps).

        ``reuse_buffers``: write into the tensors of the previous rollout collected with it
        (observations, masks, actions, log-probs, episode starts, states) once that batch
        object has been dropped; the trainer's loop uses it, since fresh buffers of long
        rollouts are paged in anew each time (a T=128 rollout of the memory preset's 2314-wide
        states is 76 MB). A batch still referenced is never overwritten (one run's batch holds
        the stacked one); tensors taken out of a batch (``s = batch.state; del batch``) are
        not protected: ``.clone()`` them."""
        if self.one_run and value_fn is not None:
            value_fn = _one_run_values(value_fn)
        S, T, E = self.num_seeds, num_steps, self.num_envs
        dev, types = self.device, self.layout.types
        reuse = reuse_buffers and (self._buffers_batch is None or self._buffers_batch() is None)
        buffers = RolloutBuffers.allocate(
            partial(self._buffer, reuse=reuse), (S, T), E, self.layout
        )
        need_state = store_state or value_fn is not None
        # the sampling noise of the whole rollout in one draw per type (fewer small ops per step)
        noise = self._noise(T)
        wanted = {int(s): i for i, s in enumerate(window_state_steps)}
        window_states: dict[str, list] = {t.name: [None] * len(wanted) for t in types}
        episodes: list[list[dict[str, float]]] = [[] for _ in range(S)]
        # per run: the final states of truncated episodes and their (step, env rows)
        final_states: list[list[np.ndarray]] = [[] for _ in range(S)]
        final_index: list[list[tuple[int, np.ndarray]]] = [[] for _ in range(S)]
        cur_state = None
        if need_state:
            cur_state = self._states()
            # run k's states of every step, then (its last E rows) the state after the last one
            shape = ((T + 1) * E, cur_state.shape[-1])
            buffers.state_all = self._seed_blocks("state", S, shape, reuse)
            buffers.state = buffers.state_all[:, : T * E].view(S, T, E, -1)
        for step in range(T):
            if step in wanted:
                for t in types:
                    window_states[t.name][wanted[step]] = tuple(
                        s.clone() for s in self.policy_state[t.name]
                    )
            actions = self._act(buffers, step, {name: x[:, step] for name, x in noise.items()})
            if need_state:
                buffers.state[:, step] = cur_state
            done = self._step_envs(
                buffers, step, actions, episodes, final_states, final_index, value_fn is not None
            )
            self.episode_start = torch.from_numpy(done).to(dev)
            if need_state:
                cur_state = self._states()
        if before_values is not None:
            before_values()
        values: Values = (None, None, None, None)
        if value_fn is not None:
            buffers.state_all[:, T * E :] = cur_state
            cont = torch.from_numpy(~(buffers.terminated | buffers.truncated)).to(dev)
            values = self._values(value_fn, buffers.state_all, cont, final_states, final_index)
        batch = buffers.batch(
            SeedRolloutBatch, dev, values, window_state_steps, window_states, episodes
        )
        if reuse:
            self._buffers_batch = weakref.ref(batch)
        return batch.seed(0) if self.one_run else batch

    def _act(
        self, buffers: RolloutBuffers, step: int, neg_gumbel: dict[str, Tensor]
    ) -> dict[str, Tensor]:
        """Observe every run's envs, sample the policy's actions with the noise
        ``neg_gumbel`` (per type ``[S, E, n_k, A_k]``) and record step ``step``'s
        observations, masks, actions, log-probs and episode starts; returns the actions, per
        type ``[S, E, n_k]``."""
        types = self.layout.types
        obs_buf, mask_buf = buffers.obs, buffers.mask
        act_buf, logp_buf = buffers.actions, buffers.logp
        per_seed = [self.batcher(obs) for obs in self.obs]
        obs_t = {t.name: stack_runs([o[t.name] for o, _ in per_seed]) for t in types}
        mask_t = {t.name: stack_runs([m[t.name] for _, m in per_seed]) for t in types}
        for t in types:
            obs_buf[t.name][:, step] = obs_t[t.name]
            mask_buf[t.name][:, step] = mask_t[t.name]
        reset = self.episode_start if self.policy.is_recurrent else None
        actions, logps, self.policy_state = self.policy.act(
            obs_t, mask_t, self.policy_state, reset, neg_gumbel=neg_gumbel
        )
        for t in types:
            act_buf[t.name][:, step] = actions[t.name]
            logp_buf[t.name][:, step] = logps[t.name]
        buffers.episode_start[:, step] = self.episode_start
        return actions

    def _step_envs(
        self,
        buffers: RolloutBuffers,
        step: int,
        actions: dict[str, Tensor],
        episodes: list[list[dict[str, float]]],
        final_states: list[list[np.ndarray]],
        final_index: list[list[tuple[int, np.ndarray]]],
        keep_final: bool,
    ) -> np.ndarray:
        """Step each run's env with its ``actions`` (per type ``[S, E, n_k]``), record step
        ``step``'s rewards, activity and end flags, add the episodes that ended to
        ``episodes[k]`` and, with ``keep_final`` (a value function), the final states of
        truncated episodes to ``final_states[k]`` and their (step, env rows) to
        ``final_index[k]``; returns ended ``[S, E]`` bool."""
        agents, E = self.layout.agents, self.num_envs
        done = np.zeros((self.num_seeds, E), bool)
        for k, vec in enumerate(self.vecs):
            env_actions = self.batcher.actions_to_env({n: a[k] for n, a in actions.items()})
            self.obs[k], rewards, terms, truncs, infos = vec.step(env_actions)
            team, ind, pen = reward_channels(infos, agents)
            buffers.reward_team[k, step], buffers.reward_individual[k, step] = team, ind
            buffers.reward_penalty[k, step] = pen
            if "active" in infos[agents[0]]:
                buffers.active[k, step] = agent_activity(infos, agents, E)
                buffers.any_left |= not buffers.active[k, step].all()
            te = np.asarray(terms[agents[0]], bool)
            tr = np.asarray(truncs[agents[0]], bool) & ~te
            buffers.terminated[k, step], buffers.truncated[k, step] = te, tr
            done[k] = te | tr
            reward = live_mean_reward(rewards, infos, agents)
            episodes[k].extend(
                self.trackers[k].step(team, ind, pen, done[k], infos, agents, reward)
            )
            if keep_final and tr.any():
                final_states[k].append(np.asarray(vec.final_state, np.float32)[tr])
                final_index[k].append((step, np.flatnonzero(tr)))
        return done

    def _values(
        self,
        value_fn: SeedValueFn,
        state_all: Tensor,
        cont: Tensor,
        final_states: list[list[np.ndarray]],
        final_index: list[list[tuple[int, np.ndarray]]],
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The values of every step's state and the next values inside each episode.

        ``state_all [S, (T + 1) * E, D_s]``: every step's states, then the state after the
        last step; ``cont [S, T, E]``: the episode goes on after the step. The final states of
        truncated episodes (run k has ``F_k``) go through ``value_fn`` in one call per
        distinct ``F_k``, run k's rows at its own index and zeros for the runs with another
        count: run k's rows always make an ``[F_k, D_s]`` block, whatever the other runs
        did. Returns ``values_team [S, T, E, G * K]``, ``values_individual [S, T, E, N, K]`` and
        the next values of the same shapes (the final state's value where the episode was
        truncated, zero where it terminated)."""
        S, T, E = cont.shape
        N = self.layout.n_agents
        all_team, all_ind = value_fn(state_all)
        GK, K = all_team.shape[-1], all_ind.shape[-1]  # G critics' team heads
        vt = all_team[:, : T * E].reshape(S, T, E, GK)
        vi = all_ind[:, : T * E].reshape(S, T, E, N, K)
        last_team, last_ind = all_team[:, T * E :], all_ind[:, T * E :]
        nvt, nvi = torch.zeros_like(vt), torch.zeros_like(vi)
        counts = [sum(len(rows) for _, rows in index) for index in final_index]
        for count in sorted({c for c in counts if c > 0}):
            group = [k for k in range(S) if counts[k] == count]
            x = self._seed_blocks("final_states", S, (count, state_all.shape[-1]), False)
            x.zero_()
            for k in group:
                x[k] = torch.from_numpy(np.concatenate(final_states[k])).to(self.device)
            fin_team, fin_ind = value_fn(x)
            for k in group:
                pos = 0
                for step, rows in final_index[k]:
                    r = torch.from_numpy(rows).to(self.device)
                    nvt[k, step, r] = fin_team[k, pos : pos + len(rows)]
                    nvi[k, step, r] = fin_ind[k, pos : pos + len(rows)]
                    pos += len(rows)
        # next value inside the episode: values[t + 1] (or the value after the last step)
        follow_team = torch.cat([vt[:, 1:], last_team.unsqueeze(1)], 1)
        follow_ind = torch.cat([vi[:, 1:], last_ind.unsqueeze(1)], 1)
        nvt = torch.where(cont[..., None], follow_team, nvt)
        nvi = torch.where(cont[..., None, None], follow_ind, nvi)
        return vt, vi, nvt, nvi

    # -- checkpointing ------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything needed to continue collecting exactly. One run: :meth:`seed_state_dict`
        (its generator is torch's global one, the caller's). S runs: per run, the pickled env
        (None where it cannot be pickled), the observations and the episode tracker; the
        episode starts ``[S, E]``, the stacked actor state and the generators' states."""
        if self.one_run:
            return self.seed_state_dict(0)
        return {
            "envs": [_pickled(vec) for vec in self.vecs],
            "obs": list(self.obs),
            "episode_start": self.episode_start.cpu(),
            "policy_state": {k: tuple(s.cpu() for s in v) for k, v in self.policy_state.items()},
            "trackers": [tracker.state_dict() for tracker in self.trackers],
            "generators": [g.get_state() for g in self.generators],
        }

    def seed_state_dict(self, k: int) -> dict:
        """Run index k's collector state as a single run's collector holds it."""
        return {
            "env": _pickled(self.vecs[k]),
            "obs": self.obs[k],
            "episode_start": self.episode_start[k].cpu().clone(),
            "policy_state": {
                name: tuple(s[k].cpu().clone() for s in state)
                for name, state in self.policy_state.items()
            },
            "tracker": self.trackers[k].state_dict(),
        }

    def load_seed_state_dict(self, k: int, d: dict, *, vec: VectorEnv | None = None) -> bool:
        """Restore run index k from a single run's collector state (:meth:`seed_state_dict`);
        ``vec``: the env already restored from it (else it is unpickled here). Returns False
        when the env had not been pickled: it is reset with the run's seed instead."""
        if vec is None and d.get("env") is not None:
            vec = pickle.loads(d["env"])
        if vec is not None:
            self.vecs[k] = vec
        if d.get("env") is None:
            self.obs[k] = self.vecs[k].reset(seed=self.seeds[k])[0]
            self.episode_start[k] = True
            fresh = self.policy.initial_state(self.num_envs)
            for name, state in self.policy_state.items():
                for s, new in zip(state, fresh[name], strict=True):
                    s[k] = new[k]
            return False
        self.obs[k] = d["obs"]
        self.episode_start[k] = d["episode_start"].to(self.device)
        for name, state in self.policy_state.items():
            for s, saved in zip(state, d["policy_state"][name], strict=True):
                s[k] = saved.to(self.device)
        self.trackers[k].load_state_dict(d["tracker"])
        return True

    def load_state_dict(self, d: dict) -> bool:
        """Restore (:meth:`state_dict`); returns False when some run's env could not be
        restored: every run is then reset with its seed, as a single run resumes such an
        env."""
        if self.one_run:
            return self.load_seed_state_dict(0, d)
        for g, state in zip(self.generators, d["generators"], strict=True):
            g.set_state(state)
        if any(blob is None for blob in d["envs"]):
            self.obs = [vec.reset(seed=s)[0] for vec, s in zip(self.vecs, self.seeds, strict=True)]
            self.episode_start[:] = True
            self.policy_state = self.policy.initial_state(self.num_envs)
            return False
        self.vecs = [pickle.loads(blob) for blob in d["envs"]]
        self.obs = list(d["obs"])
        self.episode_start = d["episode_start"].to(self.device)
        self.policy_state = {
            k: tuple(s.to(self.device) for s in v) for k, v in d["policy_state"].items()
        }
        for tracker, state in zip(self.trackers, d["trackers"], strict=True):
            tracker.load_state_dict(state)
        return True


def _one_run_values(value_fn: ValueFn) -> SeedValueFn:
    """A single run's critic with a leading run axis of 1 on its input and outputs."""

    def values(state: Tensor) -> tuple[Tensor, Tensor]:
        team, individual = value_fn(state[0])
        return team.unsqueeze(0), individual.unsqueeze(0)

    return values


def _pickled(vec: VectorEnv) -> bytes | None:
    """The pickled env, None for an env that cannot be pickled (it resumes with a reset)."""
    try:
        return pickle.dumps(vec)
    except Exception:  # noqa: BLE001 - an env that cannot be pickled resumes with a reset
        return None
