"""What the baselines modules of both envs (:mod:`envs.baselines`,
:mod:`envs.websearch_baselines`) share: the policy type, the random masked policy, the action
format of both faces and the one-episode-per-seed evaluation loop."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from envs._pettingzoo import CoreVectorEnv

Policy = Callable[[Mapping[str, Any], Any], dict[str, Any]]


def to_env_format(env: Any, actions: np.ndarray) -> dict[str, Any]:
    """actions [N, A] -> {agent: int array [N]} (vector) or {agent: int} (parallel)."""
    inner = getattr(env, "unwrapped", env)
    names = inner.possible_agents
    if isinstance(inner, CoreVectorEnv):
        return {a: actions[:, i].copy() for i, a in enumerate(names)}
    return {a: int(actions[0, i]) for i, a in enumerate(names) if a in inner.agents}


class RandomPolicy:
    """Uniform over each agent's legal actions (its ``action_mask``)."""

    def __init__(self, seed: int | None = None) -> None:
        self.rng = np.random.default_rng(seed)

    def __call__(self, obs: Mapping[str, Any], env: Any = None) -> dict[str, Any]:
        actions: dict[str, Any] = {}
        for agent, parts in obs.items():
            mask = np.asarray(parts["action_mask"])
            if mask.ndim == 1:
                legal = np.flatnonzero(mask)
                actions[agent] = int(self.rng.choice(legal))
            else:  # [N, n_actions]: argmax of uniform noise over legal actions
                noise = self.rng.random(mask.shape) + 1.0
                actions[agent] = np.argmax(noise * mask, axis=1)
        return actions


def run_episodes(
    vec: CoreVectorEnv, policy: Policy, seeds: Sequence[int], keys: Sequence[str]
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """One episode per env of ``vec`` (``autoreset=False``, env i reset with ``seeds[i]``)
    under ``policy``: each info key's value at the episode's end, float64 [N], and each
    episode's return (the mean over agents of their summed rewards), float64 [N]."""
    obs, _ = vec.reset(seed=seeds)
    final = {k: np.zeros(len(seeds)) for k in keys}
    returns = np.zeros(len(seeds))
    recorded = np.zeros(len(seeds), dtype=bool)
    first = vec.possible_agents[0]
    while not recorded.all():
        actions = policy(obs, vec)
        obs, rewards, terminations, truncations, infos = vec.step(actions)
        returns += np.mean([rewards[a] for a in vec.possible_agents], axis=0)
        now = (terminations[first] | truncations[first]) & ~recorded
        for k in keys:
            final[k][now] = infos[first][k][now]
        recorded |= now
    return final, returns
