"""Episode records from a contract-conforming vector env's step infos (docs/CONTRACTS.md
section 1): the reward channels, which agents acted, the mean reward over the agents that
acted, and :class:`EpisodeTracker`, which sums them per env into one record per finished
episode. Used by every collection loop in :mod:`marl.rollout`; depends on numpy alone."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["EpisodeTracker", "agent_activity", "live_mean_reward", "reward_channels"]


class EpisodeTracker:
    """Per-env running returns by channel; emits one record per finished episode.

    A record holds ``return`` (mean over agents of the summed reward), ``return_team``,
    ``return_individual`` and ``return_penalty`` (means over agents), and the mean over agents
    of every numeric info key not starting with ``reward_`` at the final step
    (``success``, ``coverage``, ... when the env provides them).
    """

    def __init__(self, num_envs: int, n_agents: int) -> None:
        self.reward = np.zeros(num_envs)  # sum of the mean over live agents of the rewards
        self.team = np.zeros(num_envs)
        self.individual = np.zeros((num_envs, n_agents))
        self.penalty = np.zeros((num_envs, n_agents))

    def step(
        self,
        team: np.ndarray,
        individual: np.ndarray,
        penalty: np.ndarray,
        done: np.ndarray,
        infos: dict,
        agents: Sequence[str],
        reward: np.ndarray | None = None,
    ) -> list[dict[str, float]]:
        """``reward [E]``: this step's mean over live agents of the env's rewards
        (:func:`live_mean_reward`); None: the channels' sum (team + mean individual + mean
        penalty), which equals it for an env whose rewards are the sum of its channels."""
        if reward is None:
            reward = team + individual.mean(axis=1) + penalty.mean(axis=1)
        self.reward += reward
        self.team += team
        self.individual += individual
        self.penalty += penalty
        records = []
        if done.any():
            keys = [k for k in infos[agents[0]] if not k.startswith("reward_") and k != "active"]
            for i in np.flatnonzero(done):
                rec = {
                    "return_team": float(self.team[i]),
                    "return_individual": float(self.individual[i].mean()),
                    "return_penalty": float(self.penalty[i].mean()),
                }
                rec["return"] = float(self.reward[i])
                for k in keys:
                    rec[k] = float(np.mean([float(np.asarray(infos[a][k])[i]) for a in agents]))
                records.append(rec)
            self.reward[done] = 0.0
            self.team[done] = 0.0
            self.individual[done] = 0.0
            self.penalty[done] = 0.0
        return records

    def state_dict(self) -> dict:
        return {
            "reward": self.reward.copy(),
            "team": self.team.copy(),
            "individual": self.individual.copy(),
            "penalty": self.penalty.copy(),
        }

    def load_state_dict(self, d: dict) -> None:
        self.reward = d["reward"].copy() if "reward" in d else np.zeros_like(d["team"])
        self.team, self.individual, self.penalty = (
            d["team"].copy(),
            d["individual"].copy(),
            d["penalty"].copy(),
        )


def live_mean_reward(
    rewards: Mapping[str, np.ndarray], infos: Mapping[str, Any], agents: Sequence[str]
) -> np.ndarray:
    """``[E]``: the mean over the agents that acted (``infos[a]["active"]``, 1 where absent) of
    the env's rewards ``rewards[a] [E]``; 0 where none acted."""
    r = np.stack([np.asarray(rewards[a], np.float64) for a in agents], 1)
    active = np.stack(
        [
            np.broadcast_to(np.asarray(infos[a].get("active", 1.0), np.float64), r.shape[:1])
            for a in agents
        ],
        1,
    )
    return (r * active).sum(axis=1) / np.maximum(active.sum(axis=1), 1.0)


def agent_activity(infos: Mapping[str, Any], agents: Sequence[str], num_envs: int) -> np.ndarray:
    """``[E, N]`` bool: whether each agent acted at this step (``infos[a]["active"]``, true
    where absent)."""
    return np.stack(
        [
            np.broadcast_to(np.asarray(infos[a].get("active", 1.0), np.float64), (num_envs,)) > 0
            for a in agents
        ],
        axis=1,
    )


def reward_channels(
    infos: dict, agents: Sequence[str], rewards: dict | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(team ``[E]`` (mean over agents), individual ``[E, N]``, penalty ``[E, N]``) from infos."""
    try:
        team, ind, pen = (
            np.stack([infos[a][key] for a in agents], 1).astype(np.float64, copy=False)
            for key in ("reward_team", "reward_individual", "reward_penalty")
        )
    except KeyError as exc:
        raise ValueError(
            f"the env's infos lack the reward channel {exc.args[0]!r} required by the trainer "
            "(docs/CONTRACTS.md section 1: reward_team, reward_individual, reward_penalty)"
        ) from None
    return team.mean(axis=1), ind, pen
