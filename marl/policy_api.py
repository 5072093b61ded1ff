"""Use a trained policy outside the trainer: ``marl.load_policy(run_dir).act(obs, state)``.

>>> from envs import multisearch_v0
>>> import marl
>>> policy = marl.load_policy("runs/demo")                    # doctest: +SKIP
>>> env = multisearch_v0.parallel_env(render_mode="rgb_array")
>>> obs, _ = env.reset(seed=0)
>>> state = policy.initial_state()                            # doctest: +SKIP
>>> while env.agents:                                         # doctest: +SKIP
...     actions, state = policy.act(obs, state)
...     obs, rewards, terms, truncs, infos = env.step(actions)

``act`` takes the observation dict of one PettingZoo ``parallel_env`` step (``obs[agent] =
{"observation": float array, "action_mask": int array}``) and returns the action dict for the
agents present in it. Recurrent backbones carry their state in ``state`` (``None`` or
``initial_state()`` starts an episode); agents that have left (absent from ``obs``) get no
action, and their rows are fed zeros with every action allowed.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from marl.envapi import make_vector_env
from marl.policies import AgentLayout, MultiAgentPolicy
from marl.run.checkpoint import CheckpointError, load_checkpoint, load_newest_checkpoint
from marl.run.config import config_from_dict, load_run_config

__all__ = ["TrainedPolicy", "load_policy"]

#: ``{type name: backbone state tuple}`` for one env
PolicyState = dict[str, tuple[torch.Tensor, ...]]


class TrainedPolicy:
    """A :class:`MultiAgentPolicy` with the agent layout of its env, acting on one env's
    PettingZoo observation dicts (see the module docstring)."""

    def __init__(
        self,
        policy: MultiAgentPolicy,
        layout: AgentLayout,
        *,
        config: Any = None,
        seed: int = 0,
    ) -> None:
        self.policy = policy.eval()
        self.layout = layout
        self.config = config
        self.device = next(policy.parameters()).device
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(int(seed))

    @property
    def agents(self) -> tuple[str, ...]:
        """The agent names the policy was trained for (``possible_agents`` order)."""
        return self.layout.agents

    @property
    def is_recurrent(self) -> bool:
        return self.policy.is_recurrent

    def initial_state(self) -> PolicyState:
        """The backbone state at an episode's start (empty tuples for the mlp backbone)."""
        return self.policy.initial_state(1)

    def reset(self, seed: int | None = None) -> PolicyState:
        """A fresh episode: the initial state (and, with ``seed``, a reseeded sampler)."""
        if seed is not None:
            self.generator.manual_seed(int(seed))
        return self.initial_state()

    @torch.no_grad()
    def act(
        self,
        obs: Mapping[str, Mapping[str, Any]],
        state: PolicyState | None = None,
        deterministic: bool = True,
    ) -> tuple[dict[str, int], PolicyState]:
        """One step: ``obs`` of the agents present -> (their actions, the new state).

        ``deterministic``: the most likely allowed action (else a sample from the policy's
        own generator). ``state=None`` starts an episode.
        """
        unknown = sorted(set(obs) - set(self.layout.agents))
        if unknown:
            raise ValueError(
                f"observations for agents the policy was not trained for: {unknown}; "
                f"its agents: {list(self.layout.agents)}"
            )
        first = state is None
        state = self.initial_state() if state is None else state
        reset = torch.tensor([first], device=self.device)
        actions: dict[str, int] = {}
        new_state: PolicyState = {}
        for t in self.layout.types:
            dist, new_state[t.name] = self._step(t, obs, state, reset)
            chosen = dist.mode() if deterministic else dist.sample(self.generator)
            for j, agent in enumerate(t.agents):
                if agent in obs:
                    actions[agent] = int(chosen[0, j])
        return actions, new_state

    def log_prob(
        self,
        obs: Mapping[str, Mapping[str, Any]],
        actions: Mapping[str, int],
        state: PolicyState | None = None,
    ) -> dict[str, float]:
        """The policy's log-probability of ``actions`` (agents in ``obs``) at this step."""
        first = state is None
        state = self.initial_state() if state is None else state
        reset = torch.tensor([first], device=self.device)
        out = {}
        with torch.no_grad():
            for t in self.layout.types:
                dist, _ = self._step(t, obs, state, reset)
                for j, agent in enumerate(t.agents):
                    if agent in obs:
                        out[agent] = float(dist.log_probs[0, j, int(actions[agent])])
        return out

    def _step(
        self, t: Any, obs: Mapping[str, Mapping[str, Any]], state: PolicyState, reset: torch.Tensor
    ) -> tuple[Any, tuple[torch.Tensor, ...]]:
        """Agent type ``t``'s distribution ``[1, n_k]`` and new state from the observations of
        its agents present in ``obs`` (absent ones: zeros, every action allowed)."""
        o = np.zeros((1, t.n_agents, t.obs_dim), np.float32)
        m = np.ones((1, t.n_agents, t.n_actions), bool)
        for j, agent in enumerate(t.agents):
            if agent in obs:
                o[0, j] = np.asarray(obs[agent]["observation"], np.float32).reshape(-1)
                m[0, j] = np.asarray(obs[agent]["action_mask"]).astype(bool).reshape(-1)
        return self.policy.actors[t.name].step(
            torch.from_numpy(o).to(self.device),
            torch.from_numpy(m).to(self.device),
            state[t.name],
            reset,
        )


def _note(message: str) -> None:
    print(f"[marl.load_policy] {message}", file=sys.stderr)


def load_policy(
    run_dir: str, device: str | torch.device = "cpu", checkpoint: str | None = None
) -> TrainedPolicy:
    """The trained policy of run directory ``run_dir`` (its latest checkpoint, or the file
    ``checkpoint``), on ``device``. Raises ValueError naming what is missing."""
    try:
        cfg = config_from_dict(load_run_config(run_dir))
    except ValueError as exc:
        raise ValueError(f"{run_dir!r} is not a run directory: {exc}") from None
    try:
        if checkpoint is not None:
            ckpt = load_checkpoint(checkpoint, map_location=device)
        else:  # the newest checkpoint that loads (a corrupt newer one is skipped, with a note)
            ckpt, _, _ = load_newest_checkpoint(run_dir, device, warn=_note)
    except FileNotFoundError:
        raise ValueError(f"{run_dir!r}: no checkpoint at {checkpoint!r}") from None
    except CheckpointError as exc:
        raise ValueError(f"{run_dir!r}: {exc}") from None
    vec = make_vector_env(cfg.env_fn, 1, cfg.env, autoreset=False)
    layout = AgentLayout.from_env(vec)
    policy = MultiAgentPolicy(layout, cfg.backbone, cfg.hidden_dim, cfg.activation).to(device)
    policy.load_state_dict(ckpt["algo"]["policy"])
    return TrainedPolicy(policy, layout, config=cfg)
