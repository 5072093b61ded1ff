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

The policy comes from the run's policy artifact, ``RUN_DIR/policy/`` (weights loaded with
``torch.load(weights_only=True)`` and a JSON description, :mod:`marl.run.artifact`): loading
never unpickles a run's files, except for a run directory written before artifacts existed,
and then only with ``trust=True``.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from marl.models.policies import AgentLayout, MultiAgentPolicy
from marl.run.artifact import load_run_policy

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
        description: dict[str, Any] | None = None,
    ) -> None:
        self.policy = policy.eval()
        self.layout = layout
        self.config = config
        #: the run's policy.json (None for a policy loaded from a trusted pickled checkpoint)
        self.description = description
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
    run_dir: str,
    device: str | torch.device = "cpu",
    checkpoint: str | None = None,
    *,
    trust: bool = False,
) -> TrainedPolicy:
    """The trained policy of run directory ``run_dir`` (or of its ``policy/`` folder, copied
    anywhere), on ``device``, from the run's policy artifact (:mod:`marl.run.artifact`): its
    newest weights, or with ``checkpoint`` those of that checkpoint (``ckpt_40.pt`` or a path
    to it: read as ``policy/weights_40.pt``; or a weights file). Nothing is unpickled: a run
    directory written before policy artifacts (pickled checkpoints only) is loaded only with
    ``trust=True``, which unpickles its checkpoint. Raises ValueError (one line) naming what
    is missing."""
    try:
        loaded = load_run_policy(run_dir, device, checkpoint=checkpoint, trust=trust, warn=_note)
    except ValueError as exc:
        raise ValueError(str(exc)) from None
    return TrainedPolicy(
        loaded.policy, loaded.layout, config=loaded.config, description=loaded.description
    )
