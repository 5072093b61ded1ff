"""MAPPO's centralised critics, on the env's ``state()``.

:class:`CentralCritic` is one critic for every agent (``--share-critic all``, the default);
:class:`GroupedCritic` is several that share no parameters, one per agent type (``type``) or
per agent (``none``); :func:`make_critic` builds the one a config asks for.

Shapes: ``state[..., S]`` -> team values ``[..., G * K]`` (G critics, G = 1 for
:class:`CentralCritic`) and individual values ``[..., N, K]`` for the N agents of the env in
``possible_agents`` order (K = ensemble size).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["SHARE_CRITIC", "CentralCritic", "GroupedCritic", "critic_groups", "make_critic"]


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
        #: one critic for every agent (:class:`GroupedCritic` has several)
        self.num_critics, self.groups = 1, (0,) * n_agents
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


#: ``--share-critic``: ``all``, one critic for every agent; ``type``, one per agent type (its
#: agents' individual values, and its own team value); ``none``, one per agent
SHARE_CRITIC = ("all", "type", "none")


def critic_groups(layout: Any, share: str) -> tuple[int, ...]:
    """Each agent's critic, in ``possible_agents`` order, under ``--share-critic share``
    (``layout``: the env's :class:`~marl.models.policies.AgentLayout`):
    ``all`` 0 for every agent, ``type`` the index of its type in ``layout.types``, ``none``
    its own index."""
    if share not in SHARE_CRITIC:
        raise ValueError(f"share_critic must be one of {SHARE_CRITIC}, got {share!r}")
    groups = [0] * layout.n_agents
    for k, spec in enumerate(layout.types):
        for i in spec.agent_ids:
            groups[i] = {"all": 0, "type": k, "none": i}[share]
    return tuple(groups)


class GroupedCritic(nn.Module):
    """G centralised critics that share no parameters, each a :class:`CentralCritic` on the
    whole state for its agents (``groups[i]``: agent i's critic, G >= 2 of them).

    ``forward(state[..., S]) -> (team [..., G * K], individual [..., N, K])``: critic g's team
    values at ``team[..., g * K : (g + 1) * K]``, and agent i's individual values from critic
    ``groups[i]`` (its heads in the order of its agents). Each critic is built as
    ``CentralCritic(state_dim, n_g, ...)`` in turn, so it draws its initialisation as a
    critic of its n_g agents alone would.
    """

    def __init__(
        self,
        state_dim: int,
        groups: tuple[int, ...],
        hidden_dim: int = 128,
        ensemble: int = 1,
        activation: str = "tanh",
    ):
        super().__init__()
        groups = tuple(int(g) for g in groups)
        G = max(groups, default=-1) + 1
        if G < 2 or set(groups) != set(range(G)):
            raise ValueError(f"groups must number G >= 2 critics 0..G-1, got {groups}")
        self.groups, self.num_critics = groups, G
        self.n_agents, self.ensemble = len(groups), ensemble
        self.members = nn.ModuleList(
            CentralCritic(state_dim, groups.count(g), hidden_dim, ensemble, activation)
            for g in range(G)
        )
        # the members' individual heads, concatenated, list agents critic by critic:
        # ``gather[i]`` is agent i's row there
        order = [i for g in range(G) for i, gi in enumerate(groups) if gi == g]
        gather = torch.empty(len(order), dtype=torch.long)
        gather[torch.tensor(order)] = torch.arange(len(order))
        self.register_buffer("gather", gather, persistent=False)

    def forward(self, state: Tensor) -> tuple[Tensor, Tensor]:
        outs = [member(state) for member in self.members]
        team = torch.cat([t for t, _ in outs], dim=-1)
        individual = torch.cat([i for _, i in outs], dim=-2).index_select(-2, self.gather)
        return team, individual


def make_critic(layout: Any, cfg: Any) -> CentralCritic | GroupedCritic:
    """MAPPO's critic for ``layout`` (an :class:`~marl.models.policies.AgentLayout`) under
    ``cfg`` (``share_critic``, ``critic_hidden_dim``, ``value_ensemble``, ``activation``): one
    :class:`CentralCritic` when every agent shares one critic (``all``, or one type under
    ``type``, or one agent), else a :class:`GroupedCritic`."""
    groups = critic_groups(layout, getattr(cfg, "share_critic", "all"))
    args = (cfg.critic_hidden_dim, cfg.value_ensemble, cfg.activation)
    if max(groups) == 0:
        return CentralCritic(layout.state_dim, layout.n_agents, *args)
    return GroupedCritic(layout.state_dim, groups, *args)
