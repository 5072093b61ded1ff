"""Whole episodes: the episode groups GRPO trains on (one run and S runs at once) and the
one evaluation loop (the trainer's evaluations, ``python -m marl.evaluate`` and the baselines).

:func:`collect_group_episodes` resets a vector env (``autoreset=False``) with P seeds, each
repeated G times, and runs every env to the end of its episode (:class:`GroupEpisodes` steps
them, :class:`GroupBatch` holds the result); :func:`collect_seed_group_episodes` does it for
the S runs of a ``--seeds`` batch with one stacked policy, and one run is its case S = 1.
:func:`evaluate_episodes` runs evaluation episodes with any :data:`ActFn` (a trained policy,
:class:`PolicyActor`, or a scripted one, :class:`BaselineActor`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from envs.diversity import grouped_pairwise_jaccard
from marl.adapters.envapi import VectorEnv
from marl.models.policies import AgentLayout, MaskedCategorical, MultiAgentPolicy, neg_gumbel_noise
from marl.models.seed_policies import SeedMultiAgentPolicy
from marl.rollout.collect import ObsBatcher, OneRunPolicy, stack_runs
from marl.rollout.episode_records import (
    EpisodeTracker,
    agent_activity,
    live_mean_reward,
    reward_channels,
)

__all__ = [
    "GroupBatch",
    "GroupEpisodes",
    "collect_group_episodes",
    "collect_seed_group_episodes",
    "group_reset_seeds",
    "group_ids_for",
    "limit_of",
    "EVAL_KEYS",
    "ActFn",
    "BaselineActor",
    "PolicyActor",
    "evaluate_episodes",
]


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
    seed repeated ``group_size`` times and run every env to the end of its episode: the case
    of one run of :func:`collect_seed_group_episodes`.

    Args:
        vec: a vector env built with ``autoreset=False`` (docs/CONTRACTS.md section 1).
        layout, policy: the agent layout and the policy that samples actions.
        seeds: P distinct reset seeds.
        group_size: G.
        device: where the tensors live.
        generator: optional torch generator for the action samples (None: torch's global
            one, on ``device``).
        max_steps: safety cap on the episode length (default ``vec.max_cycles``); an env still
            running after it raises RuntimeError (the env broke its contract).

    Returns:
        A :class:`GroupBatch`; ``episodes[e]`` is env e's episode record (returns by channel
        and the env's end-of-episode info metrics, as :class:`EpisodeTracker`).
    """
    return collect_seed_group_episodes(
        [vec],
        layout,
        OneRunPolicy(policy),
        [seeds],
        group_size,
        [generator],
        device=device,
        max_steps=max_steps,
    )[0]


@torch.no_grad()
def collect_seed_group_episodes(
    vecs: Sequence[VectorEnv | None],
    layout: AgentLayout,
    policy: SeedMultiAgentPolicy | OneRunPolicy,
    seeds: Sequence[Sequence[int] | None],
    group_size: int,
    generators: Sequence[torch.Generator | None],
    *,
    device: torch.device | str = "cpu",
    max_steps: int | None = None,
) -> list[GroupBatch | None]:
    """:func:`collect_group_episodes` for every run of a batch at once (S runs):
    seed k's env ``vecs[k]`` (``autoreset=False``) reset with its P group seeds ``seeds[k]``, each
    repeated ``group_size`` times, and run to the end of every episode, its actions from
    seed k's actor in the stacked ``policy``. A seed stops stepping (and drawing noise from
    ``generators[k]``) when all its episodes have ended, so seed k's episodes, samples and
    generator state are exactly a single-seed run's. ``seeds[k]`` None: seed k collects
    nothing (None in the result). ``generators[k]`` None: torch's global generator, on
    ``device``; ``max_steps``: :class:`GroupEpisodes`'s."""
    S = policy.num_seeds
    runs = [
        None
        if s is None
        else GroupEpisodes(vec, layout, s, group_size, device=device, max_steps=max_steps)
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
            obs[name] = stack_runs(
                [x[0][name] if x else torch.zeros_like(template[0][name]) for x in seen]
            )
            mask[name] = stack_runs(
                [x[1][name] if x else torch.ones_like(template[1][name]) for x in seen]
            )
            shape = (E, t.n_agents, t.n_actions)
            noise[name] = stack_runs(
                [
                    neg_gumbel_noise(shape, g, dev) if go else torch.zeros(shape, device=dev)
                    for g, go in zip(generators, stepping, strict=True)
                ]
            )
        reset = None
        if policy.is_recurrent:
            reset = stack_runs(
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


class GroupEpisodes:
    """The episodes of one :func:`collect_group_episodes` call, step by step: reset ``vec``
    with each of ``seeds`` repeated ``group_size`` times, then :meth:`observe` the envs,
    :meth:`step` them with the policy's actions, until :attr:`done`; :meth:`batch` is the
    :class:`GroupBatch`. :func:`collect_seed_group_episodes` steps the episodes of S runs'
    envs with one stacked policy this way."""

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
