"""MAPPO: decentralised actors per agent type, a centralised critic on ``state()``.

One iteration reads top to bottom in :meth:`SeedMAPPO.iteration` and :meth:`SeedMAPPO.update`,
for S runs at once; a plain run is a batch of one (:attr:`MAPPO.trainer`):

1. **collect** ``T`` steps from ``E`` envs (:class:`marl.rollout.collect.RolloutCollector`) with the
   critic's team values ``[T, E, G * K]`` and per-agent individual values ``[T, E, N, K]``
   (K = ensemble size; G critics, one unless ``--share-critic`` is ``type`` or ``none``), and
   the values of truncated episodes' final states;
2. **advantages per channel**: GAE (:func:`marl.advantages.gae`) for the team channel (team
   reward) and the individual channel (individual reward, plus the penalty reward unless
   penalty shaping is on or ``penalty_channel='none'``), for every ensemble head; the K heads'
   advantages are averaged, and each agent takes the team advantage of its own critic;
3. **whitening** (:class:`marl.whitening.AdvantageWhitener`): by default ``team_individual``
   (team and individual advantages whitened separately per agent type, mixed by alpha); any
   other scheme whitens ``team + individual``; then the symmetric clip ``adv_clip``. Optional
   penalty shaping (seed 003, docs/seeds.md; see :meth:`MAPPO.advantages`);
4. **policy epochs** of clipped updates over minibatches (:class:`marl.algos.ppo.PolicyUpdate`:
   single steps for the mlp backbone, windows of ``seq_len`` steps for recurrent ones, each
   from the actor state stored at its start (or ``burn_in`` steps before it: those steps run
   without autograd and refresh the state), optionally in truncated-BPTT chunks of
   ``tbptt_chunk`` steps with one backward per chunk): loss (the named terms of
   :class:`marl.algos.ppo.ClipPPOObjective`), ``zero_grad``, ``backward``,
   ``clip_grad_norm_``, ``optimizer.step()``;
5. **value epochs** (:meth:`SeedMAPPO.value_epochs_run`): clipped value loss on
   ValueNorm-normalised returns, its own Adam.

With ``parallel_update`` steps 4 and 5 run side by side in two threads (they share nothing;
the critic's minibatch orders are drawn first, so the results are the same either way), and,
for recurrent actors whose backbones allow it (``thread_safe``), step 4 runs each agent
type's forward and backward in its own thread too (one optimiser step after both).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from marl.adapters.envapi import make_vector_env
from marl.algos.base import (
    BACKBONES,
    Algorithm,
    BaseConfig,
    NoOp,
    backbone_default,
    config_field,
    penalty_schedule,
    whitener_from_config,
)
from marl.algos.base import _check as check_value
from marl.algos.parallel import side_by_side
from marl.algos.ppo import (
    ClipPPOObjective,
    Minibatch,
    PolicyUpdate,
    PPOLossConfig,
    stack_windows,
    window_plan,
)
from marl.algos.seeds import SeedBatch, SeedMinibatch, load_views_state
from marl.algos.value_update import ValueTargets, ValueUpdate
from marl.core.advantages import gae, shape_with_penalty
from marl.core.losses import (
    NonFiniteError,
    ValueNorm,
    explained_variance,
    linear_schedule,
)
from marl.core.whitening import GroupKeys, advantage_stats, episode_segments, whiten
from marl.models.critics import SHARE_CRITIC, make_critic
from marl.models.policies import AgentLayout, MultiAgentPolicy
from marl.rollout.collect import RolloutBatch, RolloutCollector, SeedRolloutBatch, stack_runs
from marl.run.distributed import DistContext, broadcast_parameters

__all__ = ["MAPPO", "MAPPOConfig", "MAPPOAdvantages", "SeedMAPPO", "episode_segments"]

_f = config_field


#: The built-in backbones' values of the rollout and window fields that are None in a config
#: (the user did not set them), from the backbone registry (:mod:`seqmodels.backbones`, where
#: each backbone declares them and why), resolved in :meth:`MAPPOConfig.__post_init__`.
BACKBONE_DEFAULTS: dict[str, dict[str, int]] = {
    name: {key: backbone_default(name, key) for key in ("rollout_steps", "seq_len", "burn_in")}
    for name in BACKBONES
}


def _backbone_defaults_text(name: str) -> str:
    """``'mlp 32, gru 32, ...'``: field ``name``'s per-backbone defaults, for the help."""
    by_value: dict[int, list[str]] = {}
    for backbone, values in BACKBONE_DEFAULTS.items():
        by_value.setdefault(values[name], []).append(backbone)
    return ", ".join(f"{'/'.join(names)} {value}" for value, names in by_value.items())


@dataclass
class MAPPOConfig(BaseConfig):
    """MAPPO's configuration: the shared fields plus rollouts, GAE and the critic."""

    algo_name: ClassVar[str] = "mappo"

    no_ops: ClassVar[tuple[NoOp, ...]] = (
        *BaseConfig.no_ops,
        NoOp(
            "value_epochs",
            None,
            equal_to="epochs",
            why="--value-epochs none means as many value epochs as --epochs",
        ),
        NoOp("critic_lr", None, equal_to="lr", why="--critic-lr none means the actor's --lr"),
        # a feed-forward actor has no windows: seq_len only sets the whitening keys' positions
        # and sequences (MAPPO.group_keys), which these groupings never read
        NoOp(
            "seq_len",
            BACKBONE_DEFAULTS["mlp"]["seq_len"],
            when=(("backbone", ("mlp",)), ("whitening", ("none", "batch", "type", "center"))),
            why="the mlp actor trains on single steps, and this whitening reads no positions",
        ),
        NoOp(
            "seq_len",
            BACKBONE_DEFAULTS["mlp"]["seq_len"],
            when=(
                ("backbone", ("mlp",)),
                ("whitening", ("team_individual", "running", "running_ema")),
                ("whiten_inner", ("batch", "type")),
            ),
            why="the mlp actor trains on single steps, and this whitening reads no positions",
        ),
    )

    algo: str = _f("mappo", "Algorithm.")
    rollout_steps: int | None = _f(
        None,
        "Steps T per rollout (one update uses T*E env steps). None: the backbone's default "
        f"({_backbone_defaults_text('rollout_steps')}), resolved when the config is built and "
        "saved so in config.yaml.",
    )
    seq_len: int | None = _f(
        None,
        "Training window length for recurrent backbones (must divide rollout_steps; up to "
        "rollout_steps); for every backbone also the window of the position/chunk/sequence "
        "whitening keys (position = step index within the rollout modulo seq_len, i.e. within "
        "the loss window). None: the backbone's default "
        f"({_backbone_defaults_text('seq_len')}).",
    )
    burn_in: int | None = _f(
        None,
        "Recurrent burn-in steps before each window, run without autograd from the stored "
        "state (R2D2) to bring it up to date with the current parameters; no loss on them "
        "(the first windows of a rollout get min(burn_in, window start) steps). None: the "
        f"backbone's default ({_backbone_defaults_text('burn_in')}).",
    )
    tbptt_chunk: int | None = _f(
        None,
        "Truncated backpropagation through time inside a window (recurrent backbones): the "
        "window runs in chunks of k steps and the state passed between chunks is detached "
        "(gru: h.detach() every k steps; mamba/mamba2: the block state between chunk "
        "forwards); each chunk's backward runs before the next chunk, so the activations "
        "kept are one chunk's. None: whole windows. 1 <= k <= seq_len.",
    )
    gamma: float = _f(0.99, "Discount factor.")
    gae_lambda: float = _f(0.95, "GAE lambda.")
    critic_hidden_dim: int = _f(64, "Centralised critic MLP width.")
    share_critic: str = _f(
        "all",
        "Critic parameter sharing; every critic sees the whole state(). all: one critic for "
        "every agent (a team value head and one individual value head per agent). type: one "
        "critic per agent type, each with its own team value and its agents' individual "
        "values; each agent's team advantage comes from its type's critic. none: one critic "
        "per agent. Critics share no parameters; a run's value loss (team heads and agents "
        "averaged) and its gradient clip span all of them. type with one agent type, or none "
        "with one agent, is all.",
        choices=SHARE_CRITIC,
    )
    critic_lr: float | None = _f(None, "Critic learning rate (None: same as lr).")
    value_epochs: int | None = _f(
        2,
        "Value epochs per update (none: same as epochs). 2 learns as fast per env step as 4 "
        "at half the critic's cost (BENCHMARKS.md, MAPPO defaults).",
    )
    value_clip: float | None = _f(None, "Clipped value loss epsilon (None: off).")
    value_norm: bool = _f(True, "Normalise value targets with a debiased EMA (MAPPO ValueNorm).")
    value_norm_beta: float = _f(0.99999, "ValueNorm EMA coefficient.")
    value_ensemble: int = _f(1, "Number K of value heads; their advantages are averaged.")

    def __post_init__(self) -> None:
        """Resolve the per-backbone defaults (:data:`BACKBONE_DEFAULTS`) of the rollout and
        window fields left None; the resolved values are the config's (and config.yaml's)."""
        super().__post_init__()
        for name in ("rollout_steps", "seq_len", "burn_in"):
            if getattr(self, name) is None:
                setattr(self, name, backbone_default(self.backbone, name))

    @property
    def resolved_value_epochs(self) -> int:
        """Value epochs (falls back to ``epochs``)."""
        return self.epochs if self.value_epochs is None else self.value_epochs

    @property
    def resolved_critic_lr(self) -> float:
        """Critic learning rate (falls back to ``lr``)."""
        return self.lr if self.critic_lr is None else self.critic_lr

    def option_rules(self) -> list[tuple[str, bool, str]]:
        return [
            *super().option_rules(),
            ("value_norm_beta", bool(self.value_norm), "--value-norm true"),
        ]

    def validate(self) -> None:
        super().validate()
        for name in ("rollout_steps", "seq_len", "critic_hidden_dim", "value_ensemble"):
            value = getattr(self, name)
            check_value(value >= 1, name, value, "an integer >= 1")
        check_value(self.burn_in >= 0, "burn_in", self.burn_in, "an integer >= 0")
        if self.value_epochs is not None:
            check_value(
                self.value_epochs >= 1, "value_epochs", self.value_epochs, "an integer >= 1 or none"
            )
        for name in ("gamma", "gae_lambda"):
            value = getattr(self, name)
            check_value(0.0 <= value <= 1.0, name, value, "a number in [0, 1]")
        beta = self.value_norm_beta
        check_value(0.0 < beta < 1.0, "value_norm_beta", beta, "a number in (0, 1)")
        if self.critic_lr is not None:
            check_value(self.critic_lr > 0, "critic_lr", self.critic_lr, "a number > 0 or none")
        if self.value_clip is not None:
            check_value(self.value_clip > 0, "value_clip", self.value_clip, "a number > 0 or none")
        if self.tbptt_chunk is not None:
            check_value(
                self.is_recurrent,
                "tbptt_chunk",
                self.tbptt_chunk,
                "none for the mlp backbone (no recurrent state to truncate)",
            )
            check_value(
                1 <= self.tbptt_chunk <= self.seq_len,
                "tbptt_chunk",
                self.tbptt_chunk,
                f"none or an integer in [1, seq_len = {self.seq_len}]",
            )
        if self.is_recurrent:
            check_value(
                self.rollout_steps % self.seq_len == 0,
                "seq_len",
                self.seq_len,
                f"a divisor of rollout_steps={self.rollout_steps} for recurrent backbones",
            )
            check_value(
                self.burn_in + self.seq_len <= self.rollout_steps,
                "burn_in",
                self.burn_in,
                f"an integer in [0, rollout_steps - seq_len = {self.rollout_steps - self.seq_len}]",
            )
        else:
            check_value(
                self.burn_in == 0, "burn_in", self.burn_in, "0 for the mlp backbone (no memory)"
            )


@dataclass
class MAPPOAdvantages:
    """The advantages of one rollout and what the value epochs need (N agents, K heads)."""

    raw: Tensor  # [T, E, N] the mix before whitening (alpha-weighted or summed)
    final: Tensor  # [T, E, N] what the policy loss uses
    returns_team: Tensor  # [T, E, G * K] GAE returns (value targets), unnormalised
    returns_individual: Tensor  # [T, E, N, K]
    values_team: Tensor  # [T, E, G * K] the rollout's values, unnormalised
    values_individual: Tensor  # [T, E, N, K]
    clip_frac: float  # fraction of advantages clipped by adv_clip
    penalty_beta: float | None  # the shaping coefficient, when penalty shaping is on

    def explained_variance(self) -> float:
        """How much of the returns' variance the rollout's values explain (team and
        individual channels together, each critic's ensemble heads averaged)."""
        K = self.values_individual.shape[-1]
        team_v, team_r = (x.unflatten(-1, (-1, K)).mean(-1).reshape(-1)
                          for x in (self.values_team, self.returns_team))  # fmt: skip
        return explained_variance(
            torch.cat([team_v, self.values_individual.mean(-1).reshape(-1)]),
            torch.cat([team_r, self.returns_individual.mean(-1).reshape(-1)]),
        )


class MAPPO(Algorithm):
    """One MAPPO run: its env, actors, critic, statistics and advantages; it trains as a
    batch of one (:attr:`trainer`), as each run of ``--seeds`` trains in its batch."""

    name: ClassVar[str] = "mappo"
    config_class: ClassVar[type[BaseConfig]] = MAPPOConfig
    #: the policy loss (subclass it to change a term: docs/extending.md)
    objective_class: ClassVar[type[ClipPPOObjective]] = ClipPPOObjective

    def __init__(
        self, cfg: MAPPOConfig, ctx: DistContext | None, device: torch.device | str = "cpu"
    ) -> None:
        self.cfg, self.ctx = cfg, ctx
        self.device = torch.device(device)
        self.distributed = ctx is not None and ctx.enabled
        self.parallel = bool(cfg.parallel_update) and not self.distributed
        self.vec = make_vector_env(cfg.env_fn, cfg.num_envs, cfg.env)
        self.layout = AgentLayout.from_env(self.vec)
        N = self.layout.n_agents
        self.policy = MultiAgentPolicy.from_config(self.layout, cfg).to(self.device)
        self.critic = make_critic(self.layout, cfg).to(self.device)
        #: agent i's critic (its team advantage comes from that critic's team value) ``[N]``
        self.critic_of_agent = torch.tensor(self.critic.groups, device=self.device)
        if self.distributed:
            broadcast_parameters(self.policy, ctx)
            broadcast_parameters(self.critic, ctx)
        # the critic's epochs run beside the policy's; each agent type's actor in its own
        # thread as well pays only for recurrent actors, whose windows outweigh the hand-off
        # (measured: BENCHMARKS.md, trainer speed)
        self.policy_update = PolicyUpdate.from_config(
            self.policy,
            cfg,
            parallel=self.parallel and self.policy.is_recurrent,
            ctx=ctx,
            objective_class=self.objective_class,
        )
        self.offset = self.policy_update.offset
        self.value_update = ValueUpdate.from_config(self.critic, cfg, ctx=ctx)
        self.critic_opt = self.value_update.optimizer
        self.value_norm_team = self.value_norm_ind = None
        if cfg.value_norm:
            self.value_norm_team = ValueNorm(1, cfg.value_norm_beta, distributed=self.distributed)
            self.value_norm_ind = ValueNorm(N, cfg.value_norm_beta, distributed=self.distributed)
            self.value_norm_team.to(self.device)
            self.value_norm_ind.to(self.device)
        self.whitener = whitener_from_config(
            cfg, num_groups=len(self.layout.types), distributed=self.distributed
        )
        self.penalty_schedule = penalty_schedule(cfg)
        seed = cfg.seed if ctx is None else ctx.seed_offset(cfg.seed)
        self.collector = RolloutCollector(
            self.vec, self.layout, self.policy, seed=seed, device=self.device
        )
        self.type_of_agent = torch.zeros(N, dtype=torch.long)
        for i, t in enumerate(self.layout.types):
            self.type_of_agent[list(t.agent_ids)] = i
        self.window_starts: list[int] = []
        if self.policy.is_recurrent:
            # distinct steps: with burn_in >= seq_len several windows start their burn-in at
            # the rollout's first step (policy_units maps each window to its stored state)
            starts = window_plan(cfg.rollout_steps, cfg.seq_len, cfg.burn_in)[2]
            self.window_starts = sorted(set(starts))
        self.last_advantages: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    # -- one iteration ---------------------------------------------------------------------
    @classmethod
    def batch_class(cls) -> type[SeedMAPPO]:
        return SeedMAPPO

    @functools.cached_property
    def trainer(self) -> SeedMAPPO:
        """This run as a batch of one (:meth:`SeedMAPPO.of_run`): what it trains with."""
        return SeedMAPPO.of_run(self)

    def iteration(self, progress: float) -> dict[str, float]:
        """Collect one rollout of ``T x E`` env steps and update on it; returns its metrics
        (:meth:`SeedMAPPO.iteration` of this run alone). Raises
        :class:`~marl.core.losses.NonFiniteError` naming what turned NaN or inf."""
        return self.trainer.plain_row(self.trainer.iteration([progress]))

    def collect(self, *, reuse_buffers: bool = False) -> RolloutBatch:
        """One rollout with the critic's values of every state (normalised space);
        ``reuse_buffers``: see :meth:`RolloutCollector.collect`."""
        self.policy.eval()
        try:
            return self.collector.collect(
                self.cfg.rollout_steps,
                value_fn=self.values,
                window_state_steps=self.window_starts,
                reuse_buffers=reuse_buffers,
            )
        finally:
            self.policy.train()

    @torch.no_grad()
    def values(self, state: Tensor) -> tuple[Tensor, Tensor]:
        """``state [M, S]`` -> critic outputs ``[M, G * K]``, ``[M, N, K]`` (normalised space)."""
        return self.critic(state)

    def update(self, batch: RolloutBatch, progress: float) -> dict[str, float]:
        """Advantages, then the policy epochs and the value epochs on one rollout
        (:meth:`SeedMAPPO.update` of this run alone); its metrics. Raises
        :class:`~marl.core.losses.NonFiniteError` naming what turned NaN or inf."""
        rows = self.trainer.update(SeedRolloutBatch.of_one(batch), [progress])
        return self.trainer.plain_row(rows)

    # -- advantages ------------------------------------------------------------------------
    def advantages(self, batch: RolloutBatch, progress: float) -> MAPPOAdvantages:
        """GAE per channel, whitening and mixing, then the optional penalty shaping.

        Penalty shaping (``--penalty-beta-schedule``, seed 003's ``A - beta * R_penalty``):
        ``A' = A - beta(t) * whiten_type(c_t)`` with ``c_t = -reward_penalty_t`` the penalty
        cost of the step itself, whitened per agent type. The step's own cost is what the
        action at t causes; a cost-to-go summed only to the rollout's end (unbootstrapped)
        would add an action-independent ramp across the rollout instead. The penalty is then
        not added to the individual channel (it enters once).
        """
        cfg = self.cfg
        T, E, N = batch.num_steps, batch.num_envs, self.layout.n_agents
        GK, K = batch.values_team.shape[-1], batch.values_individual.shape[-1]  # G critics
        v_team, v_ind = self._denormalize(batch.values_team, batch.values_individual)
        next_team, next_ind = self._denormalize(
            batch.next_values_team, batch.next_values_individual
        )
        shaping = self.penalty_schedule is not None
        reward_ind = batch.reward_individual
        if not shaping and cfg.penalty_channel == "individual":
            reward_ind = reward_ind + batch.reward_penalty
        term, trunc = batch.terminated, batch.truncated
        # an agent that left the episode (adapted envs) ends its individual channel there
        term_ind = term[..., None].expand(T, E, N)
        if batch.active is not None:
            left = torch.zeros_like(batch.active)
            left[:-1] = batch.active[:-1] & ~batch.active[1:]
            term_ind = term_ind | left
        for name, x in (("rewards (team)", batch.reward_team), ("rewards", reward_ind)):
            if not torch.isfinite(x).all():
                raise NonFiniteError(name)
        team_adv, team_ret = gae(
            batch.reward_team[..., None].expand(T, E, GK),
            v_team,
            next_team,
            term[..., None].expand(T, E, GK),
            trunc[..., None].expand(T, E, GK),
            gamma=cfg.gamma,
            lam=cfg.gae_lambda,
        )
        ind_adv, ind_ret = gae(
            reward_ind[..., None].expand(T, E, N, K),
            v_ind,
            next_ind,
            term_ind[..., None].expand(T, E, N, K),
            trunc[..., None, None].expand(T, E, N, K),
            gamma=cfg.gamma,
            lam=cfg.gae_lambda,
        )
        # each critic's heads averaged [T, E, G], then each agent's critic's [T, E, N]
        team = team_adv.unflatten(-1, (-1, K)).mean(-1)[..., self.critic_of_agent]
        individual = ind_adv.mean(-1)  # [T, E, N]
        for name, x in (("advantages/team", team), ("advantages/individual", individual)):
            if not torch.isfinite(x).all():
                raise NonFiniteError(name)
        keys = self.group_keys(batch)
        raw, final = self.mix_and_whiten(team, individual, keys, mask=batch.active)
        beta = None
        if shaping:
            beta = float(self.penalty_schedule(progress))
            cost = -batch.reward_penalty  # [T, E, N]
            final = shape_with_penalty(
                final, whiten(cost, group=keys.type_id.expand(T, E, N)), beta
            )
        if not torch.isfinite(final).all():
            raise NonFiniteError("advantages (after whitening)")
        return MAPPOAdvantages(
            raw=raw,
            final=final,
            returns_team=team_ret,
            returns_individual=ind_ret,
            values_team=v_team,
            values_individual=v_ind,
            clip_frac=float(self.whitener.last_clip_frac),
            penalty_beta=beta,
        )

    def mix_and_whiten(
        self, team: Tensor, individual: Tensor, keys: GroupKeys, mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """The advantage scheme: team and individual advantages ``[T, E, N]`` -> (the raw mix,
        for statistics; the final advantages). Here the configured whitener: by default each
        channel whitened per agent type and mixed by alpha. Override to try another scheme
        (docs/extending.md). ``mask [T, E, N]``: the agents still in their episode (None:
        all); the others get 0 and no say in the statistics."""
        if self.whitener.scheme == "team_individual":
            raw = self.cfg.alpha * team + (1 - self.cfg.alpha) * individual
        else:
            raw = team + individual
        return raw, self.whitener(team, individual, mask=mask, keys=keys)

    def group_keys(self, batch: RolloutBatch) -> GroupKeys:
        """Whitening group keys ``[T, E, N]``-broadcastable: agent type, position in the
        training window, and sequence = (window, episode, env, agent).

        ``position[t] = t % seq_len``: the step's index within its loss window (windows cover
        ``[w * seq_len, (w + 1) * seq_len)``; a burn-in before a window is not part of it, so
        positions count from the loss window's first step); the chunk scheme groups by
        ``position // chunk_size``."""
        T, N = batch.num_steps, self.layout.n_agents
        dev = batch.terminated.device
        position = (torch.arange(T, device=dev) % self.cfg.seq_len).reshape(T, 1, 1)
        segment = episode_segments(batch.episode_start, self.cfg.seq_len)  # [T, E]
        sequence = segment[..., None] * N + torch.arange(N, device=dev)
        sequence = torch.unique(sequence, return_inverse=True)[1]  # compact ids
        return GroupKeys(
            type_id=self.type_of_agent.reshape(1, 1, N).to(dev),
            position=position,
            sequence_id=sequence,
        )

    def advantage_metrics(self, adv: MAPPOAdvantages) -> dict[str, float]:
        """``adv_raw/*`` and ``adv/*`` statistics (all agents and per type) and the clip and
        shaping figures; keeps the last advantages for the histogram plot."""
        metrics: dict[str, float] = {}
        for prefix, x in (("adv_raw", adv.raw), ("adv", adv.final)):
            for k, v in advantage_stats(x).items():
                metrics[f"{prefix}/{k}"] = v
            for t in self.layout.types:
                for k, v in advantage_stats(x[:, :, list(t.agent_ids)]).items():
                    metrics[f"{prefix}/{t.name}/{k}"] = v
        self.last_advantages = {
            t.name: (
                adv.raw[:, :, list(t.agent_ids)].detach().cpu().numpy().ravel(),
                adv.final[:, :, list(t.agent_ids)].detach().cpu().numpy().ravel(),
            )
            for t in self.layout.types
        }
        metrics["adv_clip_frac"] = adv.clip_frac
        if adv.penalty_beta is not None:
            metrics["penalty_beta"] = adv.penalty_beta
        return metrics

    # -- policy ----------------------------------------------------------------------------
    def policy_units(self, batch: RolloutBatch, advantages: Tensor) -> dict[str, Minibatch]:
        """Per agent type, the units of the policy epochs: single steps ``[T*E, 1, n_k, ...]``
        for feed-forward backbones; for recurrent ones windows: inputs (obs, resets)
        ``[W*E, burn_in + seq_len, ...]`` with the stored state before their first burn-in
        step and their burn-in lengths ``[W*E]``, loss fields ``[W*E, seq_len, n_k, ...]``
        (:func:`marl.algos.ppo.window_plan`)."""
        T, E = batch.num_steps, batch.num_envs
        units = {}
        if not self.policy.is_recurrent:
            steps = torch.ones(T * E, 1, dtype=torch.bool, device=batch.terminated.device)
            for t in self.layout.types:
                k, n = t.name, t.n_agents
                units[k] = Minibatch(
                    obs=batch.obs[k].reshape(T * E, 1, n, -1),
                    action_mask=batch.mask[k].reshape(T * E, 1, n, -1),
                    actions=batch.actions[k].reshape(T * E, 1, n),
                    old_logp=batch.logp[k].reshape(T * E, 1, n),
                    advantages=advantages[:, :, list(t.agent_ids)].reshape(T * E, 1, n),
                    loss_mask=steps,
                    agent_mask=None
                    if batch.active is None
                    else batch.active[:, :, list(t.agent_ids)].reshape(T * E, 1, n),
                )
            return units
        index, burn_in, starts = window_plan(T, self.cfg.seq_len, self.cfg.burn_in)
        W, P = index.shape[0], self.cfg.burn_in
        dev = batch.terminated.device
        loss_index = index[:, P:]  # [W, L] the loss steps
        stored = {int(s): i for i, s in enumerate(batch.window_state_steps)}
        missing = sorted(set(starts) - set(stored))
        if missing:
            raise ValueError(
                f"the rollout stored no actor state before steps {missing} (window starts of "
                f"seq_len={self.cfg.seq_len}, burn_in={self.cfg.burn_in}); collect with "
                "window_state_steps including them"
            )
        which = [stored[s] for s in starts]
        resets = stack_windows(batch.episode_start, index)
        loss_mask = torch.ones(W * E, loss_index.shape[1], dtype=torch.bool, device=dev)
        unit_burn_in = burn_in.to(dev).repeat_interleave(E) if P > 0 else None  # [W * E]
        for t in self.layout.types:
            k = t.name
            states = [batch.window_states[k][i] for i in which]  # W tuples of [E * n_k, ...]
            agents = list(t.agent_ids)
            units[k] = Minibatch(
                obs=stack_windows(batch.obs[k], index),
                action_mask=stack_windows(batch.mask[k], loss_index),
                actions=stack_windows(batch.actions[k], loss_index),
                old_logp=stack_windows(batch.logp[k], loss_index),
                advantages=stack_windows(advantages[:, :, agents], loss_index),
                loss_mask=loss_mask,
                resets=resets,
                state=tuple(torch.cat(parts, 0) for parts in zip(*states, strict=True)),
                burn_in=unit_burn_in,
                agent_mask=None
                if batch.active is None
                else stack_windows(batch.active[:, :, agents], loss_index),
            )
        return units

    # -- critic ----------------------------------------------------------------------------
    def value_targets(self, adv: MAPPOAdvantages) -> tuple[Tensor, Tensor]:
        """The ValueNorm update on the rollout's returns, then the returns normalised: the
        critic's targets ``[T, E, G * K]`` (team; one normaliser for every team head) and
        ``[T, E, N, K]`` (individual)."""
        if self.value_norm_team is not None:
            N = adv.returns_individual.shape[-2]
            self.value_norm_team.update(adv.returns_team.reshape(-1, 1))
            self.value_norm_ind.update(adv.returns_individual.transpose(-1, -2).reshape(-1, N))
        return self._normalize(adv.returns_team, adv.returns_individual)

    def _denormalize(self, team: Tensor, ind: Tensor) -> tuple[Tensor, Tensor]:
        if self.value_norm_team is None:
            return team, ind
        team = self.value_norm_team.denormalize(team)
        ind = self.value_norm_ind.denormalize(ind.transpose(-1, -2)).transpose(-1, -2)
        return team, ind

    def _normalize(self, team: Tensor, ind: Tensor) -> tuple[Tensor, Tensor]:
        if self.value_norm_team is None:
            return team, ind
        team = self.value_norm_team.normalize(team)
        ind = self.value_norm_ind.normalize(ind.transpose(-1, -2)).transpose(-1, -2)
        return team, ind

    # -- checkpoints -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        state = {
            "policy": self.policy.state_dict(),
            "critic": self.critic.state_dict(),
            "actor_opt": self.policy_update.optimizer.state_dict(),
            "critic_opt": self.critic_opt.state_dict(),
            "whitener": self.whitener.state_dict(),
            "collector": self.collector.state_dict(),
        }
        if self.offset is not None:
            state["offset"] = self.offset.state_dict()
        if self.value_norm_team is not None:
            state["value_norm_team"] = self.value_norm_team.state_dict()
            state["value_norm_ind"] = self.value_norm_ind.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.policy.load_state_dict(state["policy"])
        self.critic.load_state_dict(state["critic"])
        self.policy_update.optimizer.load_state_dict(state["actor_opt"])
        self.critic_opt.load_state_dict(state["critic_opt"])
        self.whitener.load_state_dict(state["whitener"])
        if self.offset is not None:
            self.offset.load_state_dict(state["offset"])
        if self.value_norm_team is not None:
            self.value_norm_team.load_state_dict(state["value_norm_team"])
            self.value_norm_ind.load_state_dict(state["value_norm_ind"])
        if self.distributed:
            broadcast_parameters(self.policy, self.ctx)
            broadcast_parameters(self.critic, self.ctx)
        collector_state = state["collector"]
        if self.ctx is not None and self.ctx.rank != 0:
            # the checkpoint holds rank 0's environments: other ranks restart their own
            collector_state = {**collector_state, "env": None}
        self.collector.load_state_dict(collector_state)
        self.vec = self.collector.vec


class SeedMAPPO(SeedBatch):
    """S MAPPO runs trained as one: one rollout and one update for every run (``cfgs[k]``:
    run k's config, equal but for ``seed`` and ``run_dir``; ``algorithm``: MAPPO or a
    subclass, e.g. one of docs/extending.md's). A plain run is the batch of one
    (:meth:`MAPPO.trainer`, :meth:`SeedBatch.of_run`): ``python -m marl.train --seed k`` and
    ``--seeds 0-15`` train through these lines.

    Each run ``k`` is a whole :class:`MAPPO` (``self.runs[k]``: its config, env, whitener,
    ValueNorm, penalty schedule, advantages and metrics are that run's own), and the expensive
    parts run for all runs together on stacked modules (a leading run axis,
    :mod:`marl.models.seed_policies`):

    - the rollout: :class:`marl.rollout.collect.RolloutCollector` steps every run's envs and
      runs every run's actor and critic in one batched call per step (a plain run: its own
      actor and critic);
    - the update (:meth:`update`, steps 2-5 of the module docstring): advantages per run
      (``runs[k].advantages``, one run's code), then the policy epochs
      (:class:`marl.algos.ppo.PolicyUpdate`: each run's loss, its gradients clipped by its
      own norm, one Adam with a param group per run) and the value epochs
      (:class:`marl.algos.value_update.ValueUpdate`), each run's permutations from its own
      generator.

    Independence, equality and stopping: :mod:`marl.algos.seeds`. Distributed training
    (torchrun) trains a plain run, a batch of one; ``--seeds`` refuses it.
    """

    def __init__(
        self,
        cfgs: Sequence[MAPPOConfig],
        device: torch.device | str = "cpu",
        algorithm: type[MAPPO] = MAPPO,
    ) -> None:
        super().__init__(algorithm, cfgs, device)
        #: the value update of every run at once (each run's critic is its slice)
        self.value_update = ValueUpdate.from_config([r.critic for r in self.runs], self.cfg)
        self.collector = RolloutCollector(
            [r.vec for r in self.runs],
            self.layout,
            self.policy,
            seeds=self.seeds,
            generators=self.generators,
            device=self.device,
        )
        #: the critic the rollout's values come from (``state [S, M, D_s]``)
        self.value_fn = self.value_update.stack
        self.parallel = bool(self.cfg.parallel_update)
        self._critic_parts()

    @classmethod
    def of_run(cls, run: MAPPO) -> SeedMAPPO:
        """``run`` as a batch of one (:meth:`SeedBatch.of_run`): its own value update,
        collector (one run's: its own actor) and critic (one run's values), its
        ``parallel`` setting (off when distributed)."""
        batch = super().of_run(run)
        batch.value_update = run.value_update
        batch.collector = run.collector
        batch.value_fn = run.values
        batch.parallel = run.parallel
        batch._critic_parts()
        return batch

    def _critic_parts(self) -> None:
        self.critic = self.value_update.stack
        self.critic_views = self.value_update.views
        self.critic_opt = self.value_update.optimizer

    # -- one iteration ---------------------------------------------------------------------
    def iteration(self, progress: float | Sequence[float]) -> list[dict[str, float]]:
        """One rollout of ``T x E`` env steps per run and the update on it (``progress[k]``:
        run k's budget progress); returns each run's metrics ({} for a run that no longer
        trains)."""
        progress = self.per_seed(progress)
        t0 = time.perf_counter()
        acting = self.runs[0].policy if self.own else self.policy
        acting.eval()
        try:
            batch = self.collector.collect(
                self.cfg.rollout_steps,
                value_fn=self.value_fn,
                window_state_steps=self.runs[0].window_starts,
                reuse_buffers=True,  # the batch is dropped before the next iteration's
            )
        finally:
            acting.train()
        if self.own:
            batch = SeedRolloutBatch.of_one(batch)
        t_collect = time.perf_counter() - t0
        metrics = self.update(batch, progress)
        t_update = time.perf_counter() - t0 - t_collect
        for row in metrics:
            if row:
                row["time/collect_s"] = t_collect
                row["time/update_s"] = t_update
                row["env_steps_delta"] = float(batch.num_steps * batch.num_envs)
        return metrics

    def update(self, batch: SeedRolloutBatch, progress: Sequence[float]) -> list[dict[str, float]]:
        """Advantages per run (``runs[k].advantages``: one run's code), then the policy
        epochs and the value epochs of every run, side by side with ``parallel_update``."""
        cfg = self.cfg
        advs: list[MAPPOAdvantages | None] = []
        metrics: list[dict[str, float]] = []
        for k, run in enumerate(self.runs):
            adv = None
            if self.training(k):
                try:
                    adv = run.advantages(batch.seed(k), progress[k])
                except NonFiniteError as exc:
                    self._stop(k, exc.quantity)
            advs.append(adv)
            metrics.append({} if adv is None else run.advantage_metrics(adv))
        rates = self.set_lr(self.policy_opt, cfg.lr, progress)
        self.set_lr(self.critic_opt, cfg.resolved_critic_lr, progress)
        coefs = [
            PPOLossConfig(cfg.clip_low, cfg.clip_high, cfg.dual_clip,
                          linear_schedule(cfg.ent_coef, cfg.ent_coef_final, p))
            for p in progress
        ]  # fmt: skip
        units = self.policy_units(batch, advs)
        # each run draws what a plain run draws, in its order: the critic's minibatch orders
        # (first, so that the results do not depend on whether the two run side by side),
        # then one permutation of the policy's units per epoch
        M, U = batch.num_steps * batch.num_envs, next(iter(units.values())).num_units
        value_orders, policy_orders = [], []
        for g in self.generators:
            value_orders.append([torch.randperm(M, generator=g) for _ in range(self.value_epochs)])
            policy_orders.append([torch.randperm(U, generator=g) for _ in range(cfg.epochs)])
        # per epoch, every run's permutation: [S, U] (policy) and [S, M] (critic)
        policy_orders = [torch.stack(epoch) for epoch in zip(*policy_orders, strict=True)]
        value_orders = [torch.stack(epoch) for epoch in zip(*value_orders, strict=True)]
        training = [self.training(k) for k in range(self.num_seeds)]
        (policy_metrics, policy_stops), (value_metrics, value_stops) = side_by_side(
            [
                lambda: self.policy_update.epochs_of_minibatches(
                    units, coefs, policy_orders, training
                ),
                lambda: self.value_epochs_run(batch, advs, value_orders),
            ],
            parallel=self.parallel,
        )
        for k, reason in sorted({**value_stops, **policy_stops}.items()):
            self._stop(k, reason)
        for k, row in enumerate(metrics):
            if not self.training(k):
                metrics[k] = {}
                continue
            # (a hook may report a plain run's metric as a scalar: reshape(-1))
            row.update({key: float(v.reshape(-1)[k]) for key, v in policy_metrics.items()})
            row.update({key: float(v[k]) for key, v in value_metrics.items()})
            row["lr"] = rates[k]
            row["ent_coef"] = float(coefs[k].ent_coef)
            if self.runs[k].offset is not None:
                row["optimism_offset"] = float(self.runs[k].offset.b.detach())
            episodes = batch.episodes[k]
            if episodes:
                for key in episodes[0]:
                    row[f"episode/{key}"] = float(np.mean([e[key] for e in episodes]))
            row["episodes"] = float(len(episodes))
        return metrics

    @property
    def value_epochs(self) -> int:
        return self.cfg.resolved_value_epochs

    # -- policy ----------------------------------------------------------------------------
    def policy_units(
        self, batch: SeedRolloutBatch, advs: Sequence[MAPPOAdvantages | None]
    ) -> dict[str, SeedMinibatch]:
        """Every run's units (:meth:`MAPPO.policy_units`), stacked per agent type; a run
        that no longer trains gets zero advantages (its steps are masked out of the update)."""
        per_seed = []
        for k, (run, adv) in enumerate(zip(self.runs, advs, strict=True)):
            one = batch.seed(k)
            final = adv.final if adv is not None else torch.zeros_like(one.reward_individual)
            per_seed.append(run.policy_units(one, final))
        return {
            name: SeedMinibatch.stack([units[name] for units in per_seed]) for name in per_seed[0]
        }

    # -- critic ----------------------------------------------------------------------------
    def value_epochs_run(
        self,
        batch: SeedRolloutBatch,
        advs: Sequence[MAPPOAdvantages | None],
        orders: list[Tensor],
    ) -> tuple[dict[str, Tensor], dict[int, str]]:
        """ValueNorm update per run, then one value epoch per ``orders[e] [S, T * E]`` on the
        stacked critic, minibatches as the policy's; metrics ``[S]`` and the runs that stopped
        (index -> why)."""
        S = self.num_seeds
        T, E, N = batch.num_steps, batch.num_envs, self.layout.n_agents
        M = T * E
        targets_team, targets_ind, ev = [], [], []
        for k, (run, adv) in enumerate(zip(self.runs, advs, strict=True)):
            if adv is None:  # a stopped run: targets equal to its old values (no loss)
                targets_team.append(batch.values_team[k].reshape(M, -1))
                targets_ind.append(batch.values_individual[k].reshape(M, N, -1))
                ev.append(float("nan"))
                continue
            ev.append(adv.explained_variance())
            team, ind = run.value_targets(adv)
            targets_team.append(team.reshape(M, -1))
            targets_ind.append(ind.reshape(M, N, -1))
        data = ValueTargets(
            batch.state.reshape(S, M, -1),
            batch.values_team.reshape(S, M, -1),
            batch.values_individual.reshape(S, M, N, -1),
            stack_runs(targets_team),
            stack_runs(targets_ind),
            None if batch.active is None else batch.active.reshape(S, M, N, 1),
        )
        training = [self.training(k) for k in range(S)]
        metrics, stops = self.value_update.epochs_of_minibatches(data, orders, training)
        metrics["explained_variance"] = torch.tensor(ev, dtype=torch.float64)
        return metrics, stops

    # -- the runs' own state ---------------------------------------------------------------
    def sync(self, k: int) -> MAPPO:
        """Run k brought up to date with the stack (policy, critic, optimisers)."""
        run = super().sync(k)  # its critic is run k's slice of the stack already
        if not self.own:
            run.critic_opt.load_state_dict(self.critic_views.seed_state_dict(self.critic_opt, k))
        return run

    def seed_state_dict(self, k: int) -> dict[str, Any]:
        state = super().seed_state_dict(k)
        if not self.own:
            state["collector"] = self.collector.seed_state_dict(k)
        return state

    def load_seed_state(self, k: int, state: dict[str, Any], torch_rng: Tensor) -> None:
        super().load_seed_state(k, state, torch_rng)
        if self.own:
            return
        run = self.runs[k]
        load_views_state(self.critic_opt, self.critic_views.per_seed[k], run.critic_opt)
        self.collector.load_seed_state_dict(k, state["collector"], vec=run.collector.vec)
