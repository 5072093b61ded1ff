"""Rollout collection for S seeds at once (issue 37): S vector envs, one stacked policy.

:class:`SeedRolloutCollector` is :class:`marl.rollout.collect.RolloutCollector` with a leading seed
axis. Seed k has its own vector env, built and reset as a single-seed MAPPO run with
``--seed seeds[k]`` builds and resets its env, its own episode tracker, and its own sampling
noise drawn from its own generator (:func:`marl.models.seed_policies.build_seed_policies` gives
generators positioned where that run's global generator stands). The envs step one after
another (they are numpy code); the policy's forward, the critic's values and the buffers
are stacked over seeds.

Buffer shapes (S seeds, T steps, E envs per seed, n_k agents of type k, N agents, D_s state
size, K value heads); seed k's slice is exactly what the single-seed collector stores:

- ``obs[k]: [S, T, E, n_k, D_k]``, ``mask[k]: [S, T, E, n_k, A_k]`` bool, ``actions[k]``,
  ``logp[k]: [S, T, E, n_k]``
- ``reward_team: [S, T, E]``, ``reward_individual``, ``reward_penalty: [S, T, E, N]``
- ``terminated``, ``truncated``, ``episode_start: [S, T, E]`` bool
- ``state: [S, T, E, D_s]``; ``values_team``, ``next_values_team: [S, T, E, K]``;
  ``values_individual``, ``next_values_individual: [S, T, E, N, K]``
- ``window_states[k]``: the actor state before step ``t`` for each ``t`` in
  ``window_state_steps``, each a tuple of ``[S, E * n_k, ...]`` tensors
- ``episodes``: one list of episode records per seed

Equality (tests/test_seed_collect.py, one torch thread, CPU):

- seed k in a stack of S and seed k in a stack of one (``--seeds 0-2`` vs ``--seeds k``): bit
  for bit, every buffer, values included, for a critic with two or more value heads. The
  shapes of every call on seed k's rows depend on seed k alone (the values of truncated
  episodes' final states are computed in one call per distinct count ``F_k``, so seed k's
  rows always form an ``[F_k, D_s]`` block), and the critic's inputs are built with each
  seed's block on a 64-byte boundary (:data:`SEED_ALIGN`: MKL's GEMMs with few rows give
  bits that depend on the input's address modulo 16 bytes; measured for ``addmm`` and
  ``bmm`` with 3 rows). With one value head (``value_ensemble=1``, the default) the team
  values of a stack of one differ in the last bit: ``torch.baddbmm`` with one output column
  takes another kernel for a batch of one than for several (``SeedLinear``; an xfail test
  pins it).
- against MAPPO's single-seed collector (``MAPPO(cfg)`` after ``torch.manual_seed(k)``, two
  consecutive rollouts): environment data (observations, masks, rewards, flags, episode
  starts, states, episode records) and the sampled actions bit-equal; with a value function
  that runs each seed's own ``CentralCritic`` the values are bit-equal too, so the collector
  itself adds no difference. The stacked modules agree with the single-seed ones to float32
  rounding (``baddbmm`` for ``addmm``): the stacked critic's values always to rounding, the
  actor's log-probs and states bit-equal at some shapes (4 envs in the test) and to rounding
  at others (3 envs).
"""

from __future__ import annotations

import pickle
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import torch
from torch import Tensor

from marl.adapters.envapi import VectorEnv
from marl.models.policies import AgentLayout, neg_gumbel_noise
from marl.models.seed_policies import SeedMultiAgentPolicy, seed_neg_gumbel_noise
from marl.rollout.collect import (
    GroupBatch,
    GroupEpisodes,
    ObsBatcher,
    RolloutBatch,
    RolloutBuffers,
    Values,
)
from marl.rollout.episode_records import (
    EpisodeTracker,
    agent_activity,
    live_mean_reward,
    reward_channels,
)

__all__ = [
    "SEED_ALIGN",
    "SeedRolloutBatch",
    "SeedRolloutCollector",
    "SeedValueFn",
    "collect_seed_group_episodes",
]

#: the seed stride, in float32 elements, of the blocks the collector hands to the critic
SEED_ALIGN = 16

#: ``state [S, M, D_s] -> (team [S, M, K], individual [S, M, N, K])`` (MAPPO's stacked critic)
SeedValueFn = Callable[[Tensor], tuple[Tensor, Tensor]]


@dataclass
class SeedRolloutBatch:
    """One rollout of S seeds (see the module docstring for shapes); :meth:`seed` gives seed
    k's as the single-seed :class:`marl.rollout.collect.RolloutBatch`."""

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
    #: one list of episode records per seed
    episodes: list[list[dict[str, float]]] = field(default_factory=list)
    #: [S, T, E, N] bool: the agent acted at the step (None: every agent of every seed always
    #: acted in this rollout)
    active: Tensor | None = None

    @property
    def num_seeds(self) -> int:
        return int(self.terminated.shape[0])

    @property
    def num_steps(self) -> int:
        return int(self.terminated.shape[1])

    @property
    def num_envs(self) -> int:
        return int(self.terminated.shape[2])

    def seed(self, k: int) -> RolloutBatch:
        """Seed index ``k``'s rollout as a single-seed :class:`RolloutBatch` (views, no copy);
        ``active`` is None where every agent of seed k acted, as the single-seed collector
        leaves it."""

        def pick(x: Tensor | None) -> Tensor | None:
            return None if x is None else x[k]

        active = pick(self.active)
        return RolloutBatch(
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


class SeedRolloutCollector:
    """Steps S vector envs (``vecs[k]``: seed k's) with a :class:`SeedMultiAgentPolicy`,
    keeping observations, episode starts and actor state across calls.

    Args:
        vecs: one vector env per seed, each with the same agents and ``num_envs``, built as
            the single-seed run builds its env (``make_vector_env(cfg.env_fn, cfg.num_envs,
            cfg.env)``).
        layout: the agent layout shared by the envs.
        policy: the stacked policy, ``policy.num_seeds == len(vecs)``.
        seeds: the reset seed of each env (a single-seed run resets with its run seed).
        generators: one CPU ``torch.Generator`` per seed, the sampling noise's source (a
            single-seed run draws it from torch's global generator; use the generators of
            :func:`marl.models.seed_policies.build_seed_policies`).
        device: where the tensors live.
    """

    def __init__(
        self,
        vecs: Sequence[VectorEnv],
        layout: AgentLayout,
        policy: SeedMultiAgentPolicy,
        *,
        seeds: Sequence[int | None],
        generators: Sequence[torch.Generator],
        device: torch.device | str = "cpu",
    ) -> None:
        vecs, seeds, generators = list(vecs), list(seeds), list(generators)
        S = len(vecs)
        if S == 0:
            raise ValueError("vecs must hold one vector env per seed, got none")
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
        self.obs = [vec.reset(seed=seed)[0] for vec, seed in zip(vecs, seeds, strict=True)]
        self.episode_start = torch.ones(S, self.num_envs, dtype=torch.bool, device=self.device)
        self.policy_state = policy.initial_state(self.num_envs)
        self.trackers = [EpisodeTracker(self.num_envs, layout.n_agents) for _ in range(S)]
        self._buffers: dict[str, Tensor] = {}
        self._buffers_batch: weakref.ref[SeedRolloutBatch] | None = None

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
        """An uninitialised float32 ``[S, *shape]`` tensor whose seed blocks each start on a
        64-byte boundary (seed stride rounded up to :data:`SEED_ALIGN` floats).

        MKL's GEMMs with few rows give bits that depend on their input's address modulo 16
        bytes (measured with ``addmm`` and ``bmm`` on 3 rows), so seed k's block sits on the
        alignment of a freshly allocated single-seed tensor, whatever k and S."""
        size = int(np.prod(shape))
        stride = -(-size // SEED_ALIGN) * SEED_ALIGN
        flat = self._buffer(name, (num_seeds, stride), torch.float32, reuse)
        return flat[:, :size].view(num_seeds, *shape)

    def _states(self) -> Tensor:
        """``[S, E, D_s]``: every seed's ``vec.state()``."""
        return torch.from_numpy(
            np.stack([np.asarray(vec.state(), np.float32) for vec in self.vecs])
        ).to(self.device)

    def _noise(self, T: int) -> dict[str, Tensor]:
        """Per type ``[S, T, E, n_k, A_k]``: the rollout's sampling noise, drawn per type in
        type order from each seed's generator (the single-seed collector's draws)."""
        E, gens = self.num_envs, self.generators
        return {
            t.name: seed_neg_gumbel_noise((T, E, t.n_agents, t.n_actions), gens).to(self.device)
            for t in self.layout.types
        }

    @torch.no_grad()
    def collect(
        self,
        num_steps: int,
        *,
        value_fn: SeedValueFn | None = None,
        window_state_steps: Sequence[int] = (),
        store_state: bool = False,
        before_values: Callable[[], Any] | None = None,
        reuse_buffers: bool = False,
    ) -> SeedRolloutBatch:
        """Collect ``num_steps`` steps from every env of every seed (autoreset envs, episodes
        continue across calls); the arguments are :meth:`RolloutCollector.collect`'s, with
        ``value_fn`` taking and returning a leading seed axis (:data:`SeedValueFn`)."""
        S, T, E = self.num_seeds, num_steps, self.num_envs
        dev, types = self.device, self.layout.types
        reuse = reuse_buffers and (self._buffers_batch is None or self._buffers_batch() is None)
        buffers = RolloutBuffers.allocate(
            partial(self._buffer, reuse=reuse), (S, T), E, self.layout
        )
        need_state = store_state or value_fn is not None
        noise = self._noise(T)
        wanted = {int(s): i for i, s in enumerate(window_state_steps)}
        window_states: dict[str, list] = {t.name: [None] * len(wanted) for t in types}
        episodes: list[list[dict[str, float]]] = [[] for _ in range(S)]
        # per seed: the final states of truncated episodes and their (step, env rows)
        final_states: list[list[np.ndarray]] = [[] for _ in range(S)]
        final_index: list[list[tuple[int, np.ndarray]]] = [[] for _ in range(S)]
        cur_state = None
        if need_state:
            cur_state = self._states()
            # seed k's states of every step, then (its last E rows) the state after the last one
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
        return batch

    def _act(
        self, buffers: RolloutBuffers, step: int, neg_gumbel: dict[str, Tensor]
    ) -> dict[str, Tensor]:
        """Observe every seed's envs, sample the stacked policy's actions with the noise
        ``neg_gumbel`` (per type ``[S, E, n_k, A_k]``) and record step ``step``'s
        observations, masks, actions, log-probs and episode starts; returns the actions, per
        type ``[S, E, n_k]``."""
        types = self.layout.types
        obs_buf, mask_buf = buffers.obs, buffers.mask
        act_buf, logp_buf = buffers.actions, buffers.logp
        per_seed = [self.batcher(obs) for obs in self.obs]
        obs_t = {t.name: torch.stack([o[t.name] for o, _ in per_seed]) for t in types}
        mask_t = {t.name: torch.stack([m[t.name] for _, m in per_seed]) for t in types}
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
        """Step each seed's env with its ``actions`` (per type ``[S, E, n_k]``), record step
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
        """The values of every step's state and the next values inside each episode, as the
        single-seed collector computes them for each seed.

        ``state_all [S, (T + 1) * E, D_s]``: every step's states, then the state after the
        last step; ``cont [S, T, E]``: the episode goes on after the step. The final states of
        truncated episodes (seed k has ``F_k``) go through ``value_fn`` in one call per
        distinct ``F_k``, seed k's rows at its own index and zeros for the seeds with another
        count: seed k's rows always make an ``[F_k, D_s]`` block, whatever the other seeds
        did. Returns ``values_team [S, T, E, K]``, ``values_individual [S, T, E, N, K]`` and
        the next values of the same shapes."""
        S, T, E = cont.shape
        N = self.layout.n_agents
        all_team, all_ind = value_fn(state_all)
        K = all_team.shape[-1]
        vt = all_team[:, : T * E].reshape(S, T, E, K)
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
        """Everything needed to continue collecting exactly: per seed, the pickled env (None
        where it cannot be pickled), the observations and the episode tracker; the episode
        starts ``[S, E]``, the stacked actor state and the generators' states."""
        envs = []
        for vec in self.vecs:
            try:
                envs.append(pickle.dumps(vec))
            except Exception:  # noqa: BLE001 - an env that cannot be pickled resumes with a reset
                envs.append(None)
        return {
            "envs": envs,
            "obs": list(self.obs),
            "episode_start": self.episode_start.cpu(),
            "policy_state": {k: tuple(s.cpu() for s in v) for k, v in self.policy_state.items()},
            "trackers": [tracker.state_dict() for tracker in self.trackers],
            "generators": [g.get_state() for g in self.generators],
        }

    def seed_state_dict(self, k: int) -> dict:
        """Seed index k's collector state as the single-seed
        :meth:`marl.rollout.collect.RolloutCollector.state_dict` holds it (its generator is the
        caller's: a single-seed run's global generator)."""
        try:
            env_blob = pickle.dumps(self.vecs[k])
        except Exception:  # noqa: BLE001 - an env that cannot be pickled resumes with a reset
            env_blob = None
        return {
            "env": env_blob,
            "obs": self.obs[k],
            "episode_start": self.episode_start[k].cpu().clone(),
            "policy_state": {
                name: tuple(s[k].cpu().clone() for s in state)
                for name, state in self.policy_state.items()
            },
            "tracker": self.trackers[k].state_dict(),
        }

    def load_seed_state_dict(self, k: int, d: dict, *, vec: VectorEnv | None = None) -> None:
        """Restore seed index k from a single-seed collector state (:meth:`seed_state_dict`);
        ``vec``: the env already restored from it (else it is unpickled here, or reset with
        the seed when it could not be pickled)."""
        if vec is None:
            vec = pickle.loads(d["env"]) if d.get("env") is not None else self.vecs[k]
        self.vecs[k] = vec
        if d.get("env") is None:
            self.obs[k] = vec.reset(seed=self.seeds[k])[0]
            self.episode_start[k] = True
            fresh = self.policy.initial_state(self.num_envs)
            for name, state in self.policy_state.items():
                for s, new in zip(state, fresh[name], strict=True):
                    s[k] = new[k]
            return
        self.obs[k] = d["obs"]
        self.episode_start[k] = d["episode_start"].to(self.device)
        for name, state in self.policy_state.items():
            for s, saved in zip(state, d["policy_state"][name], strict=True):
                s[k] = saved.to(self.device)
        self.trackers[k].load_state_dict(d["tracker"])

    def load_state_dict(self, d: dict) -> bool:
        """Restore; returns False when some seed's env could not be restored: every seed is
        then reset with its seed, as a single-seed run resumes such an env."""
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


@torch.no_grad()
def collect_seed_group_episodes(
    vecs: Sequence[VectorEnv | None],
    layout: AgentLayout,
    policy: SeedMultiAgentPolicy,
    seeds: Sequence[Sequence[int] | None],
    group_size: int,
    generators: Sequence[torch.Generator],
    *,
    device: torch.device | str = "cpu",
) -> list[GroupBatch | None]:
    """:func:`marl.rollout.collect.collect_group_episodes` for every seed of a batch at once:
    seed k's env ``vecs[k]`` (``autoreset=False``) reset with its P group seeds ``seeds[k]``, each
    repeated ``group_size`` times, and run to the end of every episode, its actions from
    seed k's actor in the stacked ``policy``. A seed stops stepping (and drawing noise from
    ``generators[k]``) when all its episodes have ended, so seed k's episodes, samples and
    generator state are exactly a single-seed run's. ``seeds[k]`` None: seed k collects
    nothing (None in the result)."""
    S = policy.num_seeds
    runs = [
        None if s is None else GroupEpisodes(vec, layout, s, group_size, device=device)
        for vec, s in zip(vecs, seeds, strict=True)
    ]
    E = next(r.num_envs for r in runs if r is not None)
    state = policy.initial_state(E)
    dev = torch.device(device)
    while any(r is not None and not r.done for r in runs):
        stepping = [r is not None and not r.done for r in runs]
        seen = [r.observe() if go else None for r, go in zip(runs, stepping, strict=True)]
        template = next(x for x in seen if x is not None)
        obs, mask, noise = {}, {}, {}
        for t in layout.types:  # per type in type order, as TypeActor.act draws its noise
            name = t.name
            obs[name] = torch.stack(
                [x[0][name] if x else torch.zeros_like(template[0][name]) for x in seen]
            )
            mask[name] = torch.stack(
                [x[1][name] if x else torch.ones_like(template[1][name]) for x in seen]
            )
            shape = (E, t.n_agents, t.n_actions)
            noise[name] = torch.stack(
                [
                    neg_gumbel_noise(shape, g, dev) if go else torch.zeros(shape, device=dev)
                    for g, go in zip(generators, stepping, strict=True)
                ]
            )
        reset = None
        if policy.is_recurrent:
            reset = torch.stack(
                [
                    r.reset if go else torch.zeros(E, dtype=torch.bool, device=dev)
                    for r, go in zip(runs, stepping, strict=True)
                ]  # fmt: skip
            )
        actions, logps, state = policy.act(obs, mask, state, reset, neg_gumbel=noise)
        for k in range(S):
            if stepping[k]:
                runs[k].step(
                    seen[k][0],
                    seen[k][1],
                    {name: a[k] for name, a in actions.items()},
                    {name: lp[k] for name, lp in logps.items()},
                )
    return [None if r is None else r.batch() for r in runs]
