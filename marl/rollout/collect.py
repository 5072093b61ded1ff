"""Rollout collection on a contract-conforming vector env (docs/CONTRACTS.md section 1).

Algorithm-agnostic: :class:`RolloutCollector` steps ``E`` environments for ``T`` steps with a
:class:`marl.models.policies.MultiAgentPolicy`, carrying per-agent recurrent state (reset at episode
starts) and, when a ``value_fn`` is given (MAPPO's critic), the values of every state and the
bootstrap values of truncated episodes' final states. Nothing here depends on the
environment's internals: agent types come from name prefixes, rewards by channel from the
``reward_team`` / ``reward_individual`` / ``reward_penalty`` infos.

Buffer shapes (T steps, E envs, n_k agents of type k, N agents, S state size, K heads):

- ``obs[k]: [T, E, n_k, D_k]``, ``mask[k]: [T, E, n_k, A_k]`` bool, ``actions[k]``,
  ``logp[k]: [T, E, n_k]``
- ``reward_team: [T, E]``, ``reward_individual``, ``reward_penalty: [T, E, N]``
- ``terminated``, ``truncated``, ``episode_start: [T, E]`` bool (``episode_start[t]``: the
  observation at t is the first of an episode)
- ``state: [T, E, S]``; ``values_team: [T, E, K]``, ``values_individual: [T, E, N, K]``;
  ``next_values_*``: value of the next state in the same episode (the final state's value
  where the episode was truncated; zero where it terminated)
- ``window_states[k]``: the actor state before step ``t`` for each ``t`` in
  ``window_state_steps``, each a tuple of ``[E * n_k, ...]`` tensors.
"""

from __future__ import annotations

import math
import pickle
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import numpy as np
import torch
from torch import Tensor

from envs.diversity import grouped_pairwise_jaccard
from marl.adapters.envapi import VectorEnv, make_vector_env, resolve_env_fn
from marl.models.policies import AgentLayout, MaskedCategorical, MultiAgentPolicy, neg_gumbel_noise
from marl.rollout.episode_records import (
    EpisodeTracker,
    agent_activity,
    live_mean_reward,
    reward_channels,
)

__all__ = [
    "make_vector_env",
    "resolve_env_fn",
    "ObsBatcher",
    "RolloutBatch",
    "RolloutCollector",
    "EpisodeTracker",
    "GroupBatch",
    "collect_group_episodes",
    "GroupEpisodes",
    "limit_of",
    "group_reset_seeds",
    "group_ids_for",
    "evaluate_episodes",
    "PolicyActor",
    "BaselineActor",
    "EVAL_KEYS",
]

ValueFn = Callable[[Tensor], tuple[Tensor, Tensor]]


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

    @property
    def num_steps(self) -> int:
        return int(self.terminated.shape[0])

    @property
    def num_envs(self) -> int:
        return int(self.terminated.shape[1])


#: ``(values_team, values_individual, next_values_team, next_values_individual)`` of a rollout
Values = tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None]

BatchT = TypeVar("BatchT")


@dataclass
class RolloutBuffers:
    """The buffers one rollout writes, behind leading axes ``L``: ``[T]`` here, ``[S, T]`` in
    :mod:`marl.rollout.seed_collect` (per-step shapes as in the module docstring)."""

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


class RolloutCollector:
    """Steps a vector env with a policy, keeping observations and actor state across calls."""

    def __init__(
        self,
        vec,
        layout: AgentLayout,
        policy: MultiAgentPolicy,
        *,
        seed: int | None,
        device: torch.device | str = "cpu",
    ) -> None:
        self.vec = vec
        self.layout = layout
        self.policy = policy
        self.device = torch.device(device)
        self.num_envs = int(vec.num_envs)
        self.batcher = ObsBatcher(layout, self.device)
        obs, _ = vec.reset(seed=seed)
        self.obs = obs
        self.episode_start = torch.ones(self.num_envs, dtype=torch.bool, device=self.device)
        self.policy_state = policy.initial_state(self.num_envs)
        self.tracker = EpisodeTracker(self.num_envs, layout.n_agents)
        # the torch buffers of the last rollout collected with ``reuse_buffers`` and that
        # batch (weakly): reused by the next such rollout once the batch is gone
        self._buffers: dict[str, Tensor] = {}
        self._buffers_batch: weakref.ref[RolloutBatch] | None = None

    def _buffer(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, reuse: bool) -> Tensor:
        """An uninitialised ``shape`` tensor: the previous rollout's when ``reuse`` allows."""
        old = self._buffers.get(name) if reuse else None
        if old is not None and tuple(old.shape) == shape and old.dtype == dtype:
            return old
        buf = torch.empty(shape, dtype=dtype, device=self.device)
        if reuse:
            self._buffers[name] = buf
        return buf

    def _state(self) -> Tensor:
        """``[E, D_s]``: the env's ``vec.state()``."""
        return torch.from_numpy(np.asarray(self.vec.state(), np.float32)).to(self.device)

    @torch.no_grad()
    def collect(
        self,
        num_steps: int,
        *,
        value_fn: ValueFn | None = None,
        window_state_steps: Sequence[int] = (),
        store_state: bool = False,
        before_values: Callable[[], Any] | None = None,
        reuse_buffers: bool = False,
    ) -> RolloutBatch:
        """Collect ``num_steps`` steps from every env (autoreset env, episodes continue).

        ``before_values``: called after the last env step, before ``value_fn`` (MAPPO waits
        there for value epochs that ran alongside the env steps).

        ``reuse_buffers``: write into the tensors of the previous rollout collected with it
        (observations, masks, actions, log-probs, episode starts, states) once that batch
        object has been dropped; the trainer's loop uses it, since fresh buffers of long
        rollouts are paged in anew each time (a T=128 rollout of the memory preset's 2314-wide
        states is 76 MB). A batch still referenced is never overwritten; tensors taken out of
        a batch (``s = batch.state; del batch``) are not protected: ``.clone()`` them."""
        T, E = num_steps, self.num_envs
        dev, types = self.device, self.layout.types
        reuse = reuse_buffers and (self._buffers_batch is None or self._buffers_batch() is None)
        buffers = RolloutBuffers.allocate(partial(self._buffer, reuse=reuse), (T,), E, self.layout)
        need_state = store_state or value_fn is not None
        # the sampling noise of the whole rollout in one draw per type (fewer small ops per step)
        noise = {
            t.name: neg_gumbel_noise((T, E, t.n_agents, t.n_actions), device=dev) for t in types
        }
        wanted = {int(s): i for i, s in enumerate(window_state_steps)}
        window_states: dict[str, list] = {t.name: [None] * len(wanted) for t in types}
        episodes: list[dict[str, float]] = []
        final_states: list[np.ndarray] = []
        final_index: list[tuple[int, np.ndarray]] = []
        cur_state = None
        if need_state:
            cur_state = self._state()
            # the states of every step and, in the last E rows, the state after the last step
            shape = ((T + 1) * E, cur_state.shape[-1])
            buffers.state_all = self._buffer("state", shape, torch.float32, reuse)
            buffers.state = buffers.state_all[: T * E].view(T, E, -1)
        for step in range(T):
            if step in wanted:
                for t in types:
                    window_states[t.name][wanted[step]] = tuple(
                        s.clone() for s in self.policy_state[t.name]
                    )
            actions = self._act(buffers, step, {name: n[step] for name, n in noise.items()})
            if need_state:
                buffers.state[step] = cur_state
            done, tr = self._step_env(buffers, step, actions, episodes)
            self.episode_start = torch.from_numpy(done.copy()).to(dev)
            if need_state:
                cur_state = self._state()
            if value_fn is not None and tr.any():
                final_states.append(np.asarray(self.vec.final_state, np.float32)[tr])
                final_index.append((step, np.flatnonzero(tr)))
        if before_values is not None:
            before_values()
        values: Values = (None, None, None, None)
        if value_fn is not None:
            buffers.state_all[T * E :] = cur_state
            values = self._values(value_fn, buffers, final_states, final_index)
        batch = buffers.batch(
            RolloutBatch, dev, values, window_state_steps, window_states, episodes
        )
        if reuse:
            self._buffers_batch = weakref.ref(batch)
        return batch

    def _act(
        self, buffers: RolloutBuffers, step: int, neg_gumbel: dict[str, Tensor]
    ) -> dict[str, Tensor]:
        """Observe the envs, sample the policy's actions with the noise ``neg_gumbel`` (per type
        ``[E, n_k, A_k]``) and record step ``step``'s observations, masks, actions, log-probs
        and episode starts; returns the actions, per type ``[E, n_k]``."""
        types = self.layout.types
        obs_buf, mask_buf = buffers.obs, buffers.mask
        act_buf, logp_buf = buffers.actions, buffers.logp
        obs_t, mask_t = self.batcher(self.obs)
        for t in types:
            obs_buf[t.name][step] = obs_t[t.name]
            mask_buf[t.name][step] = mask_t[t.name]
        reset = self.episode_start if self.policy.is_recurrent else None
        actions, logps, self.policy_state = self.policy.act(
            obs_t, mask_t, self.policy_state, reset, neg_gumbel=neg_gumbel
        )
        for t in types:
            act_buf[t.name][step] = actions[t.name]
            logp_buf[t.name][step] = logps[t.name]
        buffers.episode_start[step] = self.episode_start
        return actions

    def _step_env(
        self,
        buffers: RolloutBuffers,
        step: int,
        actions: dict[str, Tensor],
        episodes: list[dict[str, float]],
    ) -> tuple[np.ndarray, np.ndarray]:
        """Step the env with ``actions`` (per type ``[E, n_k]``), record step ``step``'s rewards,
        activity and end flags, and add the episodes that ended to ``episodes``; returns
        (ended, truncated), each ``[E]`` bool."""
        agents = self.layout.agents
        self.obs, rewards, terms, truncs, infos = self.vec.step(
            self.batcher.actions_to_env(actions)
        )
        team, ind, pen = reward_channels(infos, agents)
        buffers.reward_team[step], buffers.reward_individual[step] = team, ind
        buffers.reward_penalty[step] = pen
        if "active" in infos[agents[0]]:
            buffers.active[step] = agent_activity(infos, agents, self.num_envs)
            buffers.any_left |= not buffers.active[step].all()
        te = np.asarray(terms[agents[0]], bool)
        tr = np.asarray(truncs[agents[0]], bool) & ~te
        buffers.terminated[step], buffers.truncated[step] = te, tr
        done = te | tr
        reward = live_mean_reward(rewards, infos, agents)
        episodes.extend(self.tracker.step(team, ind, pen, done, infos, agents, reward))
        return done, tr

    def _values(
        self,
        value_fn: ValueFn,
        buffers: RolloutBuffers,
        final_states: list[np.ndarray],
        final_index: list[tuple[int, np.ndarray]],
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The values of every step's state and the next values inside each episode.

        ``buffers.state_all [(T + 1) * E, D_s]`` (every step's states, then the state after the
        last step) goes through ``value_fn`` in one batched call, then the final states of
        truncated episodes: ``final_states[i] [F_i, D_s]``, those of the env rows
        ``final_index[i] = (step, rows)``. Returns ``values_team [T, E, K]``,
        ``values_individual [T, E, N, K]`` and the next values of the same shapes (the final
        state's value where the episode was truncated, zero where it terminated)."""
        T, E = buffers.terminated.shape
        N, dev = self.layout.n_agents, self.device
        all_team, all_ind = value_fn(buffers.state_all)
        if final_states:
            fin_team, fin_ind = value_fn(torch.from_numpy(np.concatenate(final_states)).to(dev))
            all_team, all_ind = (
                torch.cat([all_team, fin_team]),
                torch.cat([all_ind, fin_ind]),
            )
        K = all_team.shape[-1]
        vt = all_team[: T * E].reshape(T, E, K)
        vi = all_ind[: T * E].reshape(T, E, N, K)
        last_team, last_ind = (
            all_team[T * E : T * E + E],
            all_ind[T * E : T * E + E],
        )
        nvt = torch.zeros_like(vt)
        nvi = torch.zeros_like(vi)
        pos = T * E + E
        for step, rows in final_index:
            r = torch.from_numpy(rows).to(dev)
            nvt[step, r] = all_team[pos : pos + len(rows)]
            nvi[step, r] = all_ind[pos : pos + len(rows)]
            pos += len(rows)
        # next value inside the episode: values[t+1] (or the value after the last step)
        follow_team = torch.cat([vt[1:], last_team.unsqueeze(0)], 0)
        follow_ind = torch.cat([vi[1:], last_ind.unsqueeze(0)], 0)
        cont = torch.from_numpy(~(buffers.terminated | buffers.truncated)).to(dev)
        nvt = torch.where(cont[..., None], follow_team, nvt)
        nvi = torch.where(cont[..., None, None], follow_ind, nvi)
        return vt, vi, nvt, nvi

    # -- checkpointing ------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything needed to continue collecting exactly (the env is pickled)."""
        try:
            env_blob = pickle.dumps(self.vec)
        except Exception:  # noqa: BLE001 - an env that cannot be pickled resumes with a reset
            env_blob = None
        return {
            "env": env_blob,
            "obs": self.obs,
            "episode_start": self.episode_start.cpu(),
            "policy_state": {k: tuple(s.cpu() for s in v) for k, v in self.policy_state.items()},
            "tracker": self.tracker.state_dict(),
        }

    def load_state_dict(self, d: dict, *, seed: int | None = None) -> bool:
        """Restore; returns False when the env could not be restored (it is reset instead)."""
        if d.get("env") is None:
            self.obs, _ = self.vec.reset(seed=seed)
            self.episode_start[:] = True
            self.policy_state = self.policy.initial_state(self.num_envs)
            return False
        self.vec = pickle.loads(d["env"])
        self.obs = d["obs"]
        self.episode_start = d["episode_start"].to(self.device)
        self.policy_state = {
            k: tuple(s.to(self.device) for s in v) for k, v in d["policy_state"].items()
        }
        self.tracker.load_state_dict(d["tracker"])
        return True


# ---------------------------------------------------------------- whole episodes (GRPO)


def group_reset_seeds(seeds: Sequence[int], group_size: int) -> list[int]:
    """``[s_p for p in range(P) for _ in range(G)]``: each seed repeated ``group_size`` times."""
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be an int >= 1, got {group_size!r}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"group seeds must be distinct, got {list(seeds)}")
    return [int(s) for s in seeds for _ in range(group_size)]


def group_ids_for(num_groups: int, group_size: int, device: torch.device | str = "cpu") -> Tensor:
    """Group id of each env: ``[P * G]`` long, ``[0]*G + [1]*G + ...``."""
    return torch.arange(num_groups, device=device).repeat_interleave(group_size)


@dataclass
class GroupBatch:
    """Whole episodes of P groups x G episodes (E = P * G envs, T = longest episode).

    Shapes (n_k agents of type k, N agents in ``possible_agents`` order):
    ``obs[k] [T, E, n_k, D_k]``, ``mask[k] [T, E, n_k, A_k]`` bool, ``actions[k]``,
    ``logp[k] [T, E, n_k]``; ``reward_team [T, E]``; ``reward_individual``,
    ``reward_penalty [T, E, N]``; ``valid [T, E]`` bool (the env was running at step t);
    ``lengths [E]``; ``terminated``/``truncated [E]`` (how each episode ended);
    ``group_ids [E]``; ``initial_state [E, S]`` (``vec.state()`` after the reset).
    """

    obs: dict[str, Tensor]
    mask: dict[str, Tensor]
    actions: dict[str, Tensor]
    logp: dict[str, Tensor]
    reward_team: Tensor
    reward_individual: Tensor
    reward_penalty: Tensor
    valid: Tensor
    lengths: Tensor
    terminated: Tensor
    truncated: Tensor
    group_ids: Tensor
    seeds: list[int]
    initial_state: Tensor
    episodes: list[dict[str, float]] = field(default_factory=list)
    #: [T, E] bool, the steps that enter the loss (set by the algorithm: valid and kept)
    loss_mask: Tensor | None = None
    #: [T, E, N] bool: the agent acted at the step (valid, and not left the episode)
    active: Tensor | None = None

    @property
    def num_steps(self) -> int:
        return int(self.valid.shape[0])

    @property
    def num_envs(self) -> int:
        return int(self.valid.shape[1])

    @property
    def env_steps(self) -> int:
        """Environment steps actually taken (valid steps summed over envs)."""
        return int(self.valid.sum())


@torch.no_grad()
def collect_group_episodes(
    vec: Any,
    layout: AgentLayout,
    policy: MultiAgentPolicy,
    seeds: Sequence[int],
    group_size: int,
    *,
    device: torch.device | str = "cpu",
    generator: torch.Generator | None = None,
    max_steps: int | None = None,
) -> GroupBatch:
    """Reset ``vec`` (``autoreset=False``, ``num_envs = len(seeds) * group_size``) with each
    seed repeated ``group_size`` times and run every env to the end of its episode.

    Args:
        vec: a vector env built with ``autoreset=False`` (docs/CONTRACTS.md section 1).
        layout, policy: the agent layout and the policy that samples actions.
        seeds: P distinct reset seeds.
        group_size: G.
        device: where the tensors live.
        generator: optional torch generator for the action samples.
        max_steps: safety cap on the episode length (default ``vec.max_cycles``); an env still
            running after it raises RuntimeError (the env broke its contract).

    Returns:
        A :class:`GroupBatch`; ``episodes[e]`` is env e's episode record (returns by channel
        and the env's end-of-episode info metrics, as :class:`EpisodeTracker`).
    """
    episodes = GroupEpisodes(vec, layout, seeds, group_size, device=device, max_steps=max_steps)
    state = policy.initial_state(episodes.num_envs)
    while not episodes.done:
        obs_t, mask_t = episodes.observe()
        actions, logps, state = policy.act(
            obs_t,
            mask_t,
            state,
            episodes.reset if policy.is_recurrent else None,
            generator=generator,
        )
        episodes.step(obs_t, mask_t, actions, logps)
    return episodes.batch()


class GroupEpisodes:
    """The episodes of one :func:`collect_group_episodes` call, step by step: reset ``vec``
    with each of ``seeds`` repeated ``group_size`` times, then :meth:`observe` the envs,
    :meth:`step` them with the policy's actions, until :attr:`done`; :meth:`batch` is the
    :class:`GroupBatch`. ``marl.rollout.seed_collect`` steps the episodes of several seeds' envs
    with one batched policy this way."""

    def __init__(
        self,
        vec: Any,
        layout: AgentLayout,
        seeds: Sequence[int],
        group_size: int,
        *,
        device: torch.device | str = "cpu",
        max_steps: int | None = None,
    ) -> None:
        self.device = dev = torch.device(device)
        if getattr(vec, "autoreset", False):
            raise ValueError("collect_group_episodes needs a vector env built with autoreset=False")
        self.reset_seeds = group_reset_seeds(seeds, group_size)
        E = self.num_envs = len(self.reset_seeds)
        if int(vec.num_envs) != E:
            raise ValueError(
                f"vec.num_envs={vec.num_envs} but {len(seeds)} seeds x group_size {group_size} "
                f"= {E}"
            )
        self.vec, self.layout = vec, layout
        self.num_groups, self.group_size = len(seeds), group_size
        self.limit = limit_of(vec, max_steps)
        self.batcher = ObsBatcher(layout, dev)
        self.tracker = EpisodeTracker(E, layout.n_agents)
        self.obs, _ = vec.reset(seed=self.reset_seeds)
        self.initial_state = torch.from_numpy(np.asarray(vec.state(), np.float32).copy()).to(dev)
        #: [E] bool: a new episode starts at this step (the first step only)
        self.reset = torch.ones(E, dtype=torch.bool, device=dev)
        self.alive = np.ones(E, bool)
        self.terminated, self.truncated = np.zeros(E, bool), np.zeros(E, bool)
        self.lengths = np.zeros(E, np.int64)
        self.records: list[dict[str, float] | None] = [None] * E
        self.steps: dict[str, list] = {
            k: [] for k in ("obs", "mask", "actions", "logp", "team", "ind", "pen", "valid",
                            "active")
        }  # fmt: skip
        self.t = 0

    @property
    def done(self) -> bool:
        """Whether every env's episode has ended."""
        return not self.alive.any()

    def observe(self) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """The policy's inputs of this step, per type ``[E, n_k, D_k]`` and masks; raises
        RuntimeError past the step limit (an env that never ends breaks its contract)."""
        if self.t >= self.limit:
            raise RuntimeError(
                f"{int(self.alive.sum())} env(s) still running after {self.limit} steps; the "
                "env must end every episode by max_cycles (truncation)"
            )
        return self.batcher(self.obs)

    def step(
        self,
        obs_t: dict[str, Tensor],
        mask_t: dict[str, Tensor],
        actions: dict[str, Tensor],
        logps: dict[str, Tensor],
    ) -> None:
        """Record this step's inputs and the policy's actions, and step the envs."""
        agents, E, steps, alive = self.layout.agents, self.num_envs, self.steps, self.alive
        steps["obs"].append(obs_t)
        steps["mask"].append(mask_t)
        steps["actions"].append(actions)
        steps["logp"].append(logps)
        steps["valid"].append(alive.copy())
        obs, rewards, terms, truncs, infos = self.vec.step(self.batcher.actions_to_env(actions))
        self.obs = obs
        team, ind, pen = reward_channels(infos, agents)
        team, ind, pen = team * alive, ind * alive[:, None], pen * alive[:, None]
        steps["team"].append(team)
        steps["ind"].append(ind)
        steps["pen"].append(pen)
        steps["active"].append(agent_activity(infos, agents, E) & alive[:, None])
        te = np.asarray(terms[agents[0]], bool)
        tr = np.asarray(truncs[agents[0]], bool) & ~te
        ended = (te | tr) & alive
        for i, rec in zip(
            np.flatnonzero(ended),
            self.tracker.step(
                team,
                ind,
                pen,
                ended,
                infos,
                agents,
                live_mean_reward(rewards, infos, agents) * alive,
            ),
            strict=True,
        ):
            self.records[i] = rec
        self.terminated |= te & ended
        self.truncated |= tr & ended
        self.lengths[ended] = self.t + 1
        alive &= ~ended
        self.reset = torch.zeros(E, dtype=torch.bool, device=self.device)
        self.t += 1

    def batch(self) -> GroupBatch:
        """The episodes collected, ``T`` = the longest one's length."""
        dev, types, steps = self.device, self.layout.types, self.steps

        def stack_typed(key: str) -> dict[str, Tensor]:
            return {tp.name: torch.stack([s[tp.name] for s in steps[key]]) for tp in types}

        def to_t(arrays: list, dtype: torch.dtype) -> Tensor:
            return torch.from_numpy(np.stack(arrays)).to(device=dev, dtype=dtype)

        return GroupBatch(
            obs=stack_typed("obs"),
            mask=stack_typed("mask"),
            actions=stack_typed("actions"),
            logp=stack_typed("logp"),
            reward_team=to_t(steps["team"], torch.float32),
            reward_individual=to_t(steps["ind"], torch.float32),
            reward_penalty=to_t(steps["pen"], torch.float32),
            valid=to_t(steps["valid"], torch.bool),
            active=to_t(steps["active"], torch.bool),
            lengths=torch.from_numpy(self.lengths).to(dev),
            terminated=torch.from_numpy(self.terminated).to(dev),
            truncated=torch.from_numpy(self.truncated).to(dev),
            group_ids=group_ids_for(self.num_groups, self.group_size, dev),
            seeds=self.reset_seeds,
            initial_state=self.initial_state,
            episodes=[r for r in self.records if r is not None],
        )


def limit_of(vec: Any, max_steps: int | None = None) -> int:
    """The episode-length cap of a group collection: ``max_steps``, else the env's
    ``max_cycles``, else 100,000."""
    return int(max_steps if max_steps is not None else getattr(vec, "max_cycles", 100_000))


# ---------------------------------------------------------------- evaluation


#: eval.json figure -> episode record key (:class:`EpisodeTracker`)
EVAL_KEYS = {
    "success_rate": "success",
    "solved_rate": "solved",
    "mean_return": "return",
    "coverage": "coverage",
    "revisit_rate": "revisit_rate",
    "episode_length": "episode_length",
}

#: ``act(obs, vec, active) -> actions``: env observations to env actions (dict agent -> int
#: array [N]); ``active [N]`` bool marks the envs whose episode is still running
ActFn = Callable[[Mapping[str, Any], VectorEnv, np.ndarray], dict[str, np.ndarray]]


class BaselineActor:
    """A scripted policy called as ``policy(obs, vec)`` (envs.baselines' convention) as an
    :data:`ActFn`."""

    def __init__(self, policy: Callable[[Mapping[str, Any], Any], dict[str, Any]]) -> None:
        self.policy = policy

    def __call__(
        self, obs: Mapping[str, Any], vec: VectorEnv, active: np.ndarray
    ) -> dict[str, np.ndarray]:
        return self.policy(obs, vec)


class PolicyActor:
    """A trained :class:`MultiAgentPolicy` as an :data:`ActFn`: it carries the recurrent
    state of ``num_envs`` envs from their first step on (a fresh actor per set of episodes)
    and sums the policy's entropy over the agents' steps in running episodes.

    ``temperature``: actions are sampled from ``softmax(logits / temperature)`` over the
    allowed actions (1: the policy's own distribution; the entropy summed is that of the
    distribution sampled from). Greedy actions (``deterministic``) ignore no temperature: the
    two exclude each other."""

    def __init__(
        self,
        policy: MultiAgentPolicy,
        layout: AgentLayout,
        num_envs: int,
        *,
        deterministic: bool = False,
        temperature: float = 1.0,
        seed: int = 0,
        device: torch.device | str | None = None,
    ) -> None:
        if not temperature > 0 or not math.isfinite(temperature):
            raise ValueError(f"temperature must be a finite number > 0, got {temperature}")
        if deterministic and temperature != 1.0:
            raise ValueError("greedy actions (deterministic) take no sampling temperature")
        self.temperature = float(temperature)
        self.policy, self.deterministic, self.num_envs = policy, deterministic, num_envs
        self.device = next(policy.parameters()).device if device is None else torch.device(device)
        self.batcher = ObsBatcher(layout, self.device)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(int(seed))
        self.state = policy.initial_state(num_envs)
        self.first = True
        self.entropy_sum, self.entropy_count = 0.0, 0

    @torch.no_grad()
    def __call__(
        self, obs: Mapping[str, Any], vec: VectorEnv, active: np.ndarray
    ) -> dict[str, np.ndarray]:
        obs_t, mask_t = self.batcher(obs)
        reset = torch.full((self.num_envs,), self.first, dtype=torch.bool, device=self.device)
        running = torch.from_numpy(np.asarray(active, bool)).to(self.device)
        actions = {}
        for name, actor in self.policy.actors.items():
            dist, self.state[name] = actor.step(obs_t[name], mask_t[name], self.state[name], reset)
            if self.temperature != 1.0:
                dist = MaskedCategorical(dist.logits / self.temperature, mask_t[name])
            if self.deterministic:
                actions[name] = dist.mode()
            else:
                actions[name] = dist.sample(self.generator)
            entropy = dist.entropy()  # [E, n_k]
            self.entropy_sum += float(entropy[running].sum())
            self.entropy_count += int(running.sum()) * entropy.shape[1]
        self.first = False
        return self.batcher.actions_to_env(actions)

    @property
    def mean_entropy(self) -> float | None:
        """The policy's mean per-step entropy over the agent-steps it acted in running
        episodes (nats); None before any."""
        return self.entropy_sum / self.entropy_count if self.entropy_count else None


def evaluate_episodes(
    act: ActFn, vec: VectorEnv, seeds: Sequence[int], *, repeats: int = 1
) -> dict[str, Any]:
    """Run ``repeats`` episodes per seed (env ``r * len(seeds) + i`` of ``vec``, built with
    ``autoreset=False`` and ``num_envs = repeats * len(seeds)``, reset with ``seeds[i]``) and
    summarise: the mean of each :data:`EVAL_KEYS` figure over the first episode of every seed
    (one per seed, ``n_episodes``; None when the env does not report it), and
    ``search_diversity`` (with ``repeats >= 2`` and an env that offers
    ``search_sets()``: the mean over seeds of the mean pairwise Jaccard distance between the
    sets its episodes searched, :mod:`envs.diversity`; else None), ``n_episodes``,
    ``seeds``. The one evaluation loop: the trainer's evaluations, ``python -m marl.evaluate``
    and the baselines printed next to them all go through it."""
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise ValueError("seeds must not be empty")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    reset_seeds = seeds * repeats
    n = len(reset_seeds)
    if int(vec.num_envs) != n:
        raise ValueError(f"vec.num_envs={vec.num_envs} but {len(seeds)} seeds x {repeats}")
    agents = list(vec.possible_agents)
    tracker = EpisodeTracker(n, len(agents))
    obs, _ = vec.reset(seed=reset_seeds)
    finished = np.zeros(n, bool)
    records: list[dict[str, float] | None] = [None] * n
    limit = int(getattr(vec, "max_cycles", 100_000)) + 1
    for _ in range(limit):
        obs, rewards, terms, truncs, infos = vec.step(act(obs, vec, ~finished))
        team, ind, pen = reward_channels(infos, agents)
        done = np.asarray(terms[agents[0]], bool) | np.asarray(truncs[agents[0]], bool)
        newly = done & ~finished
        team, ind, pen = (
            team * ~finished,
            ind * ~finished[:, None],
            pen * ~finished[:, None],
        )
        for i, rec in zip(
            np.flatnonzero(newly),
            tracker.step(
                team,
                ind,
                pen,
                newly,
                infos,
                agents,
                live_mean_reward(rewards, infos, agents) * ~finished,
            ),
            strict=True,
        ):
            records[i] = rec
        finished |= done
        if finished.all():
            break
    if not finished.all():
        raise RuntimeError(f"evaluation episodes did not end within {limit} steps")
    out: dict[str, Any] = {}
    first = records[: len(seeds)]  # the first episode of each seed
    for name, key in EVAL_KEYS.items():
        values = [r[key] for r in first if r is not None and key in r]
        out[name] = float(np.mean(values)) if len(values) == len(seeds) else None
    # every numeric info metric the env reports at episode end (mean over episodes)
    for key in dict.fromkeys(k for r in first if r is not None for k in r):
        if key not in EVAL_KEYS.values() and not key.startswith("return"):
            values = [r[key] for r in first if r is not None and key in r]
            out.setdefault(key, float(np.mean(values)))
    out["search_diversity"] = None
    search_sets = getattr(vec, "search_sets", None)
    if repeats >= 2 and callable(search_sets):
        out["search_diversity"] = grouped_pairwise_jaccard(search_sets(), reset_seeds)
    out["n_episodes"] = len(seeds)
    out["seeds"] = seeds
    return out
