"""GRPO for multi-agent search: critic-free, group-relative, team and individual channels.

A *group* is ``G`` episodes started from the same reset seed (identical initial state);
they differ only by the policy's sampled actions. One update, top to bottom
(:meth:`GRPO.iteration`):

1. **Collect** whole episodes on ``vector_env(num_envs = P * G, autoreset=False)`` reset with
   ``[s_p for p in range(P) for _ in range(G)]``: P distinct seeds, each repeated G times
   (:func:`group_seeds`; seeds are disjoint across updates and ranks, so a group never
   spans two ranks). Step until every env has ended; steps after an env's end are masked
   (``valid [T, E]``). Per episode: the team return ``[E]`` and each agent's individual
   return ``[E, N]`` (the penalty channel is added to the individual one unless penalty
   shaping is on or ``penalty_channel='none'``, as in MAPPO). Returns are undiscounted.
2. **Advantages** (:mod:`marl.algos.grpo_advantages`; all normalisation maths in
   :mod:`marl.core.advantages` and :mod:`marl.core.whitening`):

   * ``outcome`` (default): team returns normalised within their group of G episodes;
     individual returns normalised within group x agent type (the ``G * n_k`` returns of the
     type's agents in the group; ``whiten_inner='batch'``: within the group over all agents);
     both broadcast to every valid step of the episode and mixed
     ``A = alpha * A_team + (1 - alpha) * A_individual``.
   * ``process``: step rewards normalised with the mean/std of all valid steps of the group
     (team) or of group x agent type (individual), summed from t to the episode's end, mixed
     by alpha.
   * ``grpo_scale_std=False``: centre only (Dr. GRPO); ``grpo_leave_one_out``: RLOO baseline
     (outcome only). A group whose channels all have zero variance gets zero advantage and
     is counted in ``frac_zero_std``; ``grpo_filter_zero_std`` drops such groups from the
     loss (DAPO's dynamic sampling without re-sampling: the batch shrinks).

   The team return is the same for every agent of an episode, so its statistics are taken
   over the group's G episodes (per agent type they would be identical), which keeps the
   leave-one-out factor G / (G - 1) exact.
3. **Optional second stage** (``whitening`` other than ``team_individual``, which *is* the
   group-relative normalisation above, and ``none``): the trainer's whitening scheme applied
   to the mixed advantage over the batch (``batch``, ``type``, ``position`` = step in the
   episode, ``chunk``, ``sequence`` = agent-episode, ``running``, ``running_ema``,
   ``center``), statistics reduced across ranks; then the symmetric clip ``adv_clip``.
4. **Penalty shaping** (seed 003, docs/seeds.md): ``A - beta(t) * normalised penalty`` where
   the penalty cost (``-reward_penalty``) is normalised like the individual channel (group x type;
   outcome: its episode sum, process: summed from t), ``beta(t)`` from the schedules of
   :mod:`marl.core.advantages`; then the optional optimism offset ``A + b``.
5. **Policy update**: the shared clipped objective (:class:`marl.algos.ppo.PolicyUpdate`,
   :class:`marl.algos.ppo.ClipPPOObjective`) over minibatches of whole episodes, masked to
   valid (and kept) steps, plus the extra term ``loss/kl = kl_beta * k3(pi || pi_ref)``
   (:func:`kl_to_reference`) against a frozen reference policy refreshed every
   ``ref_refresh`` updates (0: never; the reference is the initial policy).

No critic: options that configure value heads are rejected for ``--algo grpo``
(:class:`GRPOConfig` has no such fields).

Metrics (besides the shared ones: ``adv_raw/*`` = the mixed raw returns at valid steps,
``adv/*`` = final advantages at the steps that enter the loss, policy loss, entropy, clip
fractions, approx_kl, grad_norm, ``episode/*``): ``frac_zero_std`` (fraction of groups with no
signal in any mixed channel, over all ranks), ``frac_zero_std_team``,
``frac_zero_std_individual`` (per channel; individual: per group x type), ``groups``,
``groups_kept`` (after ``grpo_filter_zero_std``), ``kl_ref`` (k3 KL of the behaviour policy to
the reference, when ``kl_beta > 0``), ``penalty_beta`` (with penalty shaping).

Debugging distributed runs: with the environment variable ``MARL_GRPO_DEBUG_DIR=DIR`` every
rank writes ``DIR/rank{r}.pt`` after each update: the returns, group ids, masks and final
advantages of its batch, and its policy parameters (used by the 2-process CI test).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from functools import partial
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from marl.adapters.envapi import make_vector_env
from marl.algos.base import (
    ACTIVATIONS,
    Algorithm,
    BaseConfig,
    ConfigError,
    NoOp,
    config_field,
    penalty_schedule,
    whitener_from_config,
)
from marl.algos.base import _check as check_value

# step 2, GRPO's advantages (every name of marl.algos.grpo_advantages is importable from here
# too: the re-exports are the imports marked noqa F401)
from marl.algos.grpo_advantages import (
    _GRPO_INNER,
    _check_alpha,  # noqa: F401
    _check_ids,  # noqa: F401
    _type_key,  # noqa: F401
    episode_returns,
    grpo_advantages,
    outcome_advantages,
    process_step_advantages,
    zero_signal_groups,
)
from marl.algos.ppo import (
    ClipPPOObjective,
    Minibatch,
    PolicyUpdate,
    PPOLossConfig,
    per_run_sum,
)
from marl.algos.seeds import SeedBatch, SeedMinibatch
from marl.core.advantages import kl_k3, shape_with_penalty
from marl.core.losses import NonFiniteError, linear_schedule
from marl.core.whitening import (
    GROUPING_SCHEMES,
    SCHEMES,
    AdvantageWhitener,
    GroupKeys,
    advantage_stats,
    symmetric_clip,
)
from marl.models.policies import AgentLayout, MultiAgentPolicy, TypeActor
from marl.models.seed_policies import SeedMultiAgentPolicy
from marl.rollout.collect import OneRunPolicy, stack_runs
from marl.rollout.episodes import (
    GroupBatch,
    collect_group_episodes,
    collect_seed_group_episodes,
    group_ids_for,
    group_reset_seeds,
    limit_of,
)
from marl.run.distributed import DistContext, all_reduce_sum, broadcast_parameters, guard
from marl.run.rundir import atomic_write

GRPO_ADVANTAGES = ("outcome", "process")

__all__ = [
    "GRPO",
    "GroupBatch",
    "GRPO_SEED_BASE",
    "GRPOConfig",
    "SeedGRPO",
    "pad_episodes",
    "episode_units",
    "collect_group_episodes",
    "episode_returns",
    "group_ids_for",
    "group_reset_seeds",
    "group_seeds",
    "grpo_advantages",
    "kl_to_reference",
    "outcome_advantages",
    "process_step_advantages",
    "zero_signal_groups",
]

#: Training reset seeds start here (far from the validation seeds ``eval_seed + i``).
GRPO_SEED_BASE = 1_000_000_000

#: second-stage schemes whose statistics are grouped by ``whiten_inner`` (when several types)
_RUNNING = ("running", "running_ema")

_f = config_field


@dataclass
class GRPOConfig(BaseConfig):
    """GRPO's configuration: the shared fields plus groups and the KL term. No critic, no GAE,
    whole episodes: MAPPO's rollout, value and GAE fields do not apply."""

    algo_name: ClassVar[str] = "grpo"

    no_ops: ClassVar[tuple[NoOp, ...]] = (
        *BaseConfig.no_ops,
        # GRPO.advantages: an inner grouping other than type / batch is read as type, and
        # only the running schemes' second stage reads whiten_inner itself
        NoOp(
            "whiten_inner",
            "type",
            values=tuple(g for g in GROUPING_SCHEMES if g not in _GRPO_INNER),
            when=(("whitening", tuple(s for s in SCHEMES if s not in _RUNNING)),),
            why="GRPO groups the individual returns by group x type unless --whiten-inner is "
            "batch, and no second stage other than running / running_ema reads the inner "
            "grouping",
        ),
        NoOp(
            "whitening",
            "team_individual",
            values=("none",),
            why="GRPO's own advantage is already team and individual returns normalised "
            "within groups and mixed by --alpha, so neither scheme adds a second stage",
        ),
    )

    algo: str = _f("grpo", "Algorithm.")
    num_envs: int = _f(32, "Number of vectorised environments E (groups x group size).")
    activation: str = _f(
        "tanh",
        "Hidden activation of the mlp/gru actor backbones (the mamba/mamba2 blocks keep "
        "their own SiLU).",
        choices=ACTIVATIONS,
    )
    group_size: int = _f(8, "Episodes per group (same reset seed).")
    grpo_advantage: str = _f("outcome", "GRPO advantage variant.", choices=GRPO_ADVANTAGES)
    grpo_scale_std: bool = _f(True, "Divide by the group std (False: Dr. GRPO).")
    grpo_leave_one_out: bool = _f(
        False,
        "Leave-one-out baseline (RLOO, outcome variant). On the individual channel it leaves "
        "out one agent-episode: the same episode's teammates of the same type stay in its "
        "baseline.",
    )
    grpo_filter_zero_std: bool = _f(False, "Drop zero-variance groups from the loss.")
    kl_beta: float = _f(0.0, "KL(k3) coefficient to the reference policy.")
    ref_refresh: int = _f(0, "Refresh the reference policy every K updates (0: never).")

    def option_rules(self) -> list[tuple[str, bool, str]]:
        # GRPO always mixes team and individual returns by alpha within groups of its inner
        # grouping, so alpha and whiten_inner apply whatever the (second-stage) scheme
        return [r for r in super().option_rules() if r[0] not in ("alpha", "whiten_inner")]

    def validate(self) -> None:
        super().validate()
        check_value(
            self.group_size >= 2,
            "group_size",
            self.group_size,
            "an integer >= 2 (a group of one episode has no baseline)",
        )
        check_value(self.kl_beta >= 0, "kl_beta", self.kl_beta, "a number >= 0")
        check_value(self.ref_refresh >= 0, "ref_refresh", self.ref_refresh, "an integer >= 0")
        if self.num_envs % self.group_size != 0:
            raise ConfigError(
                f"--num-envs {self.num_envs} must be a multiple of --group-size "
                f"{self.group_size} for --algo grpo (num_envs = groups per rank x group size)"
            )
        if self.grpo_leave_one_out and self.grpo_advantage != "outcome":
            raise ConfigError(
                "--grpo-leave-one-out applies to --grpo-advantage outcome only (the process "
                "variant normalises step rewards, it has no per-episode baseline to leave out)"
            )
        if self.whitening == "team_individual" and self.whiten_inner not in _GRPO_INNER:
            raise ConfigError(
                f"--whiten-inner {self.whiten_inner!r} does not apply to --algo grpo: GRPO "
                f"normalises returns within group x agent type ('type') or within the group "
                f"('batch'); allowed: {', '.join(_GRPO_INNER)}"
            )
        if self.ref_refresh > 0 and self.kl_beta == 0:
            raise ConfigError(
                f"--ref-refresh {self.ref_refresh} has no effect with --kl-beta 0 (no KL term); "
                "set --kl-beta > 0 or drop --ref-refresh"
            )


# ----------------------------------------------------------------------------- seeds


def group_seeds(
    base_seed: int, update: int, num_groups: int, *, rank: int = 0, world_size: int = 1
) -> list[int]:
    """The P reset seeds of one update on one rank.

    ``GRPO_SEED_BASE * (base_seed + 1) + (update * world_size + rank) * P + p``: distinct for
    every (update, rank, p), so groups never repeat across updates and never span ranks, and
    a resumed run continues with the seeds it would have used.
    """
    for name, value in (("base_seed", base_seed), ("update", update), ("rank", rank)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    if isinstance(num_groups, bool) or not isinstance(num_groups, (int, np.integer)):
        raise ValueError(f"num_groups must be an int >= 1, got {num_groups!r}")
    if num_groups < 1 or world_size < 1 or rank >= world_size:
        raise ValueError(
            f"need num_groups >= 1 and 0 <= rank < world_size, got num_groups={num_groups}, "
            f"rank={rank}, world_size={world_size}"
        )
    start = GRPO_SEED_BASE * (int(base_seed) + 1) + (int(update) * world_size + rank) * num_groups
    return [start + p for p in range(num_groups)]


# ------------------------------------------------------------------------ the algorithm


def episode_units(
    batch: GroupBatch,
    advantages: Tensor,
    layout: AgentLayout,
    policy: MultiAgentPolicy,
    ref_logp: dict[str, Tensor] | None,
) -> dict[str, Minibatch]:
    """Per agent type, the E whole episodes as policy-update units ``[E, T, n_k, ...]``: reset
    at t = 0 from a zero state, the loss on valid (and kept) steps only, so the padding after
    an episode's end never enters the loss."""
    E, T = batch.num_envs, batch.num_steps
    resets = torch.zeros(E, T, dtype=torch.bool, device=batch.valid.device)
    resets[:, 0] = True
    units = {}
    for t in layout.types:
        k = t.name
        units[k] = Minibatch(
            obs=batch.obs[k].transpose(0, 1),
            action_mask=batch.mask[k].transpose(0, 1),
            actions=batch.actions[k].transpose(0, 1),
            old_logp=batch.logp[k].transpose(0, 1),
            advantages=advantages[:, :, list(t.agent_ids)].transpose(0, 1),
            loss_mask=batch.loss_mask.transpose(0, 1),
            resets=resets,
            state=policy.actors[k].initial_state(E),
            ref_logp=None if ref_logp is None else ref_logp[k],
            agent_mask=None
            if batch.active is None
            else batch.active[:, :, list(t.agent_ids)].transpose(0, 1),
        )
    return units


def kl_to_reference(
    actor: TypeActor,
    mb: Minibatch,
    terms: dict[str, Tensor],
    mask: Tensor,
    *,
    kl_coef: float,
) -> dict[str, Tensor]:
    """GRPO's extra term of the shared objective (an :data:`marl.algos.ppo.ExtraTerm` hook):
    ``loss/kl = kl_coef * sum(k3(logp, ref_logp)) / count`` over the samples of ``mask``,
    with k3 the estimator of KL(pi || pi_ref) (:func:`marl.core.advantages.kl_k3`) and
    ``mb.ref_logp [B, L, n]`` the reference policy's log-probs of the taken actions."""
    k3 = kl_k3(terms["logp"], mb.ref_logp)  # [B, L, n]
    count = terms["count"]  # [S]: one per run (per_run_sum)
    return {"loss/kl": kl_coef * per_run_sum(k3 * mask, count) / count}


class GRPO(Algorithm):
    """The GRPO algorithm object driven by :func:`marl.run.train.train`."""

    name: ClassVar[str] = "grpo"
    config_class: ClassVar[type[BaseConfig]] = GRPOConfig
    #: the policy loss (subclass it to change a term: docs/extending.md)
    objective_class: ClassVar[type[ClipPPOObjective]] = ClipPPOObjective

    def __init__(
        self, cfg: GRPOConfig, ctx: DistContext | None, device: torch.device | str = "cpu"
    ) -> None:
        cfg.validate()
        self.cfg, self.ctx = cfg, ctx
        self.device = torch.device(device)
        self.distributed = ctx is not None and ctx.enabled
        self.rank = ctx.rank if self.distributed else 0
        self.world_size = ctx.world_size if self.distributed else 1
        self.num_groups = cfg.num_envs // cfg.group_size
        self.vec = make_vector_env(cfg.env_fn, cfg.num_envs, cfg.env, autoreset=False)
        self.layout = AgentLayout.from_env(self.vec)
        self.policy = MultiAgentPolicy.from_config(self.layout, cfg).to(self.device)
        if self.distributed:
            broadcast_parameters(self.policy, ctx)
        self.policy_update = PolicyUpdate.from_config(
            self.policy,
            cfg,
            parallel=cfg.parallel_update,
            ctx=ctx,
            objective_class=self.objective_class,
        )
        self.offset = self.policy_update.offset
        self.reference: MultiAgentPolicy | None = None
        if cfg.kl_beta > 0:
            self.reference = copy.deepcopy(self.policy).eval()
            for p in self.reference.parameters():
                p.requires_grad_(False)
            self.policy_update.objective.extra_terms.append(
                partial(kl_to_reference, kl_coef=cfg.kl_beta)
            )
        self.second_stage: AdvantageWhitener | None = None
        if cfg.whitening not in ("team_individual", "none"):
            self.second_stage = whitener_from_config(
                cfg, num_groups=len(self.layout.types), distributed=self.distributed
            )
        self.penalty_schedule = penalty_schedule(cfg)
        N = self.layout.n_agents
        type_ids = torch.zeros(N, dtype=torch.long)
        for i, tp in enumerate(self.layout.types):
            type_ids[list(tp.agent_ids)] = i
        self.type_ids = type_ids.to(self.device)
        self.updates = 0
        self.last_advantages: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.debug_dir = os.environ.get("MARL_GRPO_DEBUG_DIR") or None

    # -- one update ------------------------------------------------------------------------
    @classmethod
    def batch_class(cls) -> type[SeedGRPO]:
        return SeedGRPO

    @functools.cached_property
    def trainer(self) -> SeedGRPO:
        """This run as a batch of one (:meth:`SeedGRPO.of_run`): what it trains with."""
        return SeedGRPO.of_run(self)

    def iteration(self, progress: float) -> dict[str, float]:
        """Collect P groups of G whole episodes, compute advantages, update the policy
        (:meth:`SeedGRPO.iteration` of this run alone). Raises
        :class:`~marl.core.losses.NonFiniteError` naming what turned NaN or inf."""
        return self.trainer.plain_row(self.trainer.iteration([progress]))

    def advantages(self, batch: GroupBatch, progress: float) -> tuple[Tensor, dict[str, Any]]:
        """Final advantages ``[T, E, N]`` and diagnostics; sets ``batch.loss_mask [T, E]``."""
        cfg = self.cfg
        beta = None
        if self.penalty_schedule is not None:
            beta = float(self.penalty_schedule(progress))
        adv, info = grpo_advantages(
            batch,
            self.type_ids,
            variant=cfg.grpo_advantage,
            alpha=cfg.alpha,
            scale_std=cfg.grpo_scale_std,
            leave_one_out=cfg.grpo_leave_one_out,
            inner=cfg.whiten_inner if cfg.whiten_inner in _GRPO_INNER else "type",
            penalty_channel=cfg.penalty_channel,
            penalty_shaping=beta is not None,
        )
        T, E, N = adv.shape
        keep_env = torch.ones(E, dtype=torch.bool, device=adv.device)
        if cfg.grpo_filter_zero_std:
            keep_env = ~info["zero_groups"].to(adv.device)[batch.group_ids]
        batch.loss_mask = batch.valid & keep_env[None, :]
        mask3 = batch.loss_mask[:, :, None].expand(T, E, N)
        info["adv_clip_frac"] = 0.0
        if self.second_stage is not None:
            keys = GroupKeys(
                type_id=self.type_ids.reshape(1, 1, N),
                position=torch.arange(T, device=adv.device).reshape(T, 1, 1),
                sequence_id=(
                    torch.arange(E, device=adv.device)[:, None] * N
                    + torch.arange(N, device=adv.device)[None, :]
                )[None],
            )
            with self.distributed_guard("second-stage whitening"):
                adv = self.second_stage(adv.clone(), None, mask=mask3, keys=keys)
            info["adv_clip_frac"] = float(self.second_stage.last_clip_frac)
        elif cfg.adv_clip is not None:
            adv, info["adv_clip_frac"] = symmetric_clip(adv, cfg.adv_clip, mask3)
        if beta is not None:
            adv = shape_with_penalty(adv.clone(), info["penalty"], beta)
            info["penalty_beta"] = beta
        adv = torch.where(mask3, adv, torch.zeros((), dtype=adv.dtype))
        if not torch.isfinite(adv).all():
            raise NonFiniteError("advantages (GRPO)")
        return adv, info

    @torch.no_grad()
    def reference_logp(self, batch: GroupBatch) -> dict[str, Tensor]:
        """Log-probs of the taken actions under the reference policy, ``[E, T, n_k]``."""
        assert self.reference is not None
        E, T = batch.num_envs, batch.num_steps
        resets = torch.zeros(E, T, dtype=torch.bool, device=self.device)
        resets[:, 0] = True
        out = {}
        for tp in self.layout.types:
            actor = self.reference.actors[tp.name]
            dist = actor.sequence(
                batch.obs[tp.name].transpose(0, 1),
                batch.mask[tp.name].transpose(0, 1),
                actor.initial_state(E),
                resets,
            )
            out[tp.name] = dist.log_prob(batch.actions[tp.name].transpose(0, 1))
        return out

    def update(self, batch: GroupBatch, progress: float) -> dict[str, float]:
        """Advantages, statistics and the policy update for one collected batch
        (:meth:`SeedGRPO.update` of this run alone). Raises
        :class:`~marl.core.losses.NonFiniteError` naming what turned NaN or inf."""
        return self.trainer.plain_row(self.trainer.update([batch], [progress]))

    def reference_step(
        self, batch: GroupBatch, metrics: dict[str, float]
    ) -> dict[str, Tensor] | None:
        """With a KL term (``kl_beta > 0``): the reference policy refreshed when due (every
        ``ref_refresh`` updates), its log-probs of the taken actions ``[E, T, n_k]`` per type,
        and ``metrics["kl_ref"]``; None without."""
        if self.reference is None:
            return None
        cfg = self.cfg
        if cfg.ref_refresh and self.updates > 0 and self.updates % cfg.ref_refresh == 0:
            self.reference.load_state_dict(self.policy.state_dict())
        ref_logp = self.reference_logp(batch)
        lm = batch.loss_mask.transpose(0, 1)  # [E, T]
        kl_sum, count = 0.0, 0.0
        for tp in self.layout.types:
            k3 = kl_k3(batch.logp[tp.name].transpose(0, 1), ref_logp[tp.name])
            m = lm[..., None].expand_as(k3)
            kl_sum += float((k3 * m).sum())
            count += float(m.sum())
        metrics["kl_ref"] = kl_sum / max(count, 1.0)
        return ref_logp

    def advantage_metrics(
        self, batch: GroupBatch, adv: Tensor, info: dict[str, Any]
    ) -> dict[str, float]:
        """``adv_raw/*``, ``adv/*`` statistics and the group figures (reduced over ranks);
        sets ``env_steps_delta``."""
        cfg = self.cfg
        T, E, N = adv.shape
        mask3 = batch.loss_mask[:, :, None].expand(T, E, N)
        vmask3 = batch.valid[:, :, None].expand(T, E, N)
        metrics: dict[str, float] = {}
        raw = info["raw"]
        for prefix, x, m in (("adv_raw", raw, vmask3), ("adv", adv, mask3)):
            for k, v in advantage_stats(x, m).items():
                metrics[f"{prefix}/{k}"] = v
            for tp in self.layout.types:
                ids = list(tp.agent_ids)
                for k, v in advantage_stats(x[:, :, ids], m[:, :, ids]).items():
                    metrics[f"{prefix}/{tp.name}/{k}"] = v
        self.last_advantages = {
            tp.name: (
                raw[:, :, list(tp.agent_ids)][vmask3[:, :, list(tp.agent_ids)]].cpu().numpy(),
                adv[:, :, list(tp.agent_ids)][mask3[:, :, list(tp.agent_ids)]].cpu().numpy(),
            )
            for tp in self.layout.types
        }
        zero = info["zero_groups"]
        counts = torch.tensor(
            [
                float(zero.sum()),
                float(zero.numel()),
                float(batch.env_steps),
                info["frac_zero_std_team"] * zero.numel(),
                info["frac_zero_std_individual"],
            ],
            dtype=torch.float64,
            device=self.device,
        )
        if self.distributed:
            all_reduce_sum(counts, self.ctx)
        counts = counts.cpu()
        metrics["frac_zero_std"] = float(counts[0] / counts[1])
        metrics["frac_zero_std_team"] = float(counts[3] / counts[1])
        metrics["frac_zero_std_individual"] = float(counts[4] / self.world_size)
        metrics["groups"] = float(counts[1])
        metrics["groups_kept"] = (
            float(counts[1] - counts[0]) if cfg.grpo_filter_zero_std else float(counts[1])
        )
        metrics["adv_clip_frac"] = info["adv_clip_frac"]
        if "penalty_beta" in info:
            metrics["penalty_beta"] = info["penalty_beta"]
        # the same value on every rank (train multiplies by world_size): global steps / world
        metrics["env_steps_delta"] = float(counts[2]) / self.world_size
        return metrics

    def distributed_guard(self, what: str) -> contextlib.AbstractContextManager:
        """:func:`marl.run.distributed.guard` when distributed, else a null context."""
        return guard(self.ctx, what) if self.distributed else contextlib.nullcontext()

    # -- debugging ---------------------------------------------------------------------------
    def debug_dump(self, batch: GroupBatch, info: dict[str, Any], adv: Tensor) -> None:
        os.makedirs(self.debug_dir, exist_ok=True)
        team, ind, pen = episode_returns(batch)
        params = {k: v.detach().cpu().clone() for k, v in self.policy.state_dict().items()}
        digest = hashlib.sha256()
        for k in sorted(params):
            digest.update(k.encode())
            digest.update(params[k].numpy().tobytes())
        payload = {
            "rank": self.rank,
            "world_size": self.world_size,
            "update": self.updates,
            "seeds": list(batch.seeds),
            "group_ids": batch.group_ids.cpu(),
            "type_ids": self.type_ids.cpu(),
            "valid": batch.valid.cpu(),
            "loss_mask": batch.loss_mask.cpu(),
            "reward_team": batch.reward_team.cpu(),
            "reward_individual": batch.reward_individual.cpu(),
            "reward_penalty": batch.reward_penalty.cpu(),
            "team_return": team.cpu(),
            "individual_return": ind.cpu(),
            "penalty_return": pen.cpu(),
            "advantages": adv.detach().cpu(),
            "params": params,
            "param_sha256": digest.hexdigest(),
        }
        if self.second_stage is not None and self.second_stage.running is not None:
            payload["running"] = self.second_stage.state_dict()
        path = os.path.join(self.debug_dir, f"rank{self.rank}.pt")
        atomic_write(path, lambda tmp: torch.save(payload, tmp))

    # -- checkpoints -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "policy": self.policy.state_dict(),
            "actor_opt": self.policy_update.optimizer.state_dict(),
            "updates": self.updates,
        }
        if self.reference is not None:
            d["reference"] = self.reference.state_dict()
        if self.second_stage is not None:
            d["whitener"] = self.second_stage.state_dict()
        if self.offset is not None:
            d["offset"] = self.offset.state_dict()
        return d

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.policy.load_state_dict(d["policy"])
        self.policy_update.optimizer.load_state_dict(d["actor_opt"])
        self.updates = int(d["updates"])
        if self.reference is not None:
            self.reference.load_state_dict(d.get("reference", d["policy"]))
        if self.second_stage is not None:
            self.second_stage.load_state_dict(d.get("whitener", {}))
        if self.offset is not None:
            self.offset.load_state_dict(d["offset"])
        if self.distributed:
            broadcast_parameters(self.policy, self.ctx)
            if self.reference is not None:
                broadcast_parameters(self.reference, self.ctx)


#: the value each field of a padded step takes (the loss mask keeps it out of the loss)
_PAD = {"action_mask": True, "loss_mask": False, "resets": False, "agent_mask": False}


def pad_episodes(mb: Minibatch, length: int) -> Minibatch:
    """Whole-episode units ``[E, T, ...]`` padded to ``length`` steps along dim 1: padded
    steps allow every action, enter no loss (``loss_mask`` False) and reset nothing."""
    T = mb.obs.shape[1]
    if length < T:
        raise ValueError(f"episodes of {T} steps exceed the padding length {length}")
    if length == T:
        return mb
    pad = _padding(mb, length - T)
    return replace(mb, **{name: torch.cat([getattr(mb, name), value], dim=1)
                          for name, value in pad.items()})  # fmt: skip


def _padding(mb: Minibatch, steps: int) -> dict[str, Tensor]:
    """``steps`` padding steps of each per-step field of ``mb`` (the initial state and the
    burn-in lengths are per unit, not per step)."""
    out = {}
    for f in fields(mb):
        value = getattr(mb, f.name)
        if value is None or f.name in ("state", "burn_in"):
            continue
        shape = (value.shape[0], steps, *value.shape[2:])
        out[f.name] = torch.full(shape, _PAD.get(f.name, 0), dtype=value.dtype,
                                 device=value.device)  # fmt: skip
    return out


class SeedGRPO(SeedBatch):
    """S GRPO runs trained as one: one collection and one update for every run (``cfgs[k]``:
    run k's config, equal but for ``seed`` and ``run_dir``). A plain run is the batch of one
    (:meth:`GRPO.trainer`, :meth:`SeedBatch.of_run`): ``python -m marl.train --algo grpo
    --seed k`` and ``--seeds 0-15`` train through these lines.

    Each run k is a whole :class:`GRPO` (``runs[k]``: its group seeds, advantages,
    second-stage whitener, reference policy and metrics are that run's own); the collection
    and the policy update run for every run at once (:mod:`marl.algos.seeds`)::

        collect: every run's P groups x G episodes stepped together
                 (marl.rollout.episodes.collect_seed_group_episodes; run k stops when its
                 episodes end)
        advantages, reference log-probs, metrics     per run (runs[k]: one run's code)
        units: each run's whole episodes, padded to the env's episode cap (max_cycles)
        epochs of minibatches (PolicyUpdate.epochs_of_minibatches): loss per run,
                 backward, per-run clipping, optimizer.step()

    Padding: run k's episodes last T_k steps; in a batch of several runs they are padded
    (loss mask off) to the env's ``max_cycles``, a length that does not depend on the other
    runs, so that run k's update has the same shapes in any batch and equals ``--seeds k``
    bit for bit. An env without ``max_cycles`` pads to the longest episode of the batch:
    then a batch agrees with ``--seeds k`` to float32 rounding only. A plain run is not
    padded.

    Each run's env steps per update vary (episodes end when they end), so each run spends
    its budget at its own update; a run that has spent it steps no more (``done``). Not
    batched: the reference policy's log-probs (each run's own module, one after another).
    """

    def __init__(
        self,
        cfgs: Sequence[GRPOConfig],
        device: torch.device | str = "cpu",
        algorithm: type[GRPO] = GRPO,
    ) -> None:
        super().__init__(algorithm, cfgs, device)  # the objective has the runs' KL hook
        vec = self.runs[0].vec
        #: the episodes' padded length (None: the longest episode of each collection)
        self.pad_to = limit_of(vec) if hasattr(vec, "max_cycles") else None
        self.acting: SeedMultiAgentPolicy | OneRunPolicy = self.policy

    @classmethod
    def of_run(cls, run: GRPO) -> SeedGRPO:
        """``run`` as a batch of one (:meth:`SeedBatch.of_run`): its own actor collects, its
        episodes are not padded."""
        batch = super().of_run(run)
        batch.pad_to = None
        batch.acting = OneRunPolicy(run.policy)
        return batch

    def iteration(self, progress: float | Sequence[float]) -> list[dict[str, float]]:
        """Collect each training run's P groups of G whole episodes, compute its advantages
        and update every run's policy; returns each run's metrics ({} for a run that no
        longer trains)."""
        progress = self.per_seed(progress)
        t0 = time.perf_counter()
        seeds = [
            group_seeds(run.cfg.seed, run.updates, run.num_groups, rank=run.rank,
                        world_size=run.world_size) if self.training(k) else None
            for k, run in enumerate(self.runs)
        ]  # fmt: skip
        acting = self.runs[0].policy if self.own else self.policy
        acting.eval()
        try:
            batches = collect_seed_group_episodes(
                [r.vec for r in self.runs],
                self.layout,
                self.acting,
                seeds,
                self.cfg.group_size,
                self.generators,
                device=self.device,
            )
        finally:
            acting.train()
        t_collect = time.perf_counter() - t0
        metrics = self.update(batches, progress)
        for row in metrics:
            if row:
                row["time/collect_s"] = t_collect
                row["time/update_s"] = time.perf_counter() - t0 - t_collect
        return metrics

    def update(
        self, batches: list[GroupBatch | None], progress: Sequence[float]
    ) -> list[dict[str, float]]:
        """Advantages, reference log-probs and metrics per run (one run's code), then the
        policy epochs of every run."""
        cfg, S = self.cfg, self.num_seeds
        metrics: list[dict[str, float]] = [{} for _ in range(S)]
        units: list[dict[str, Minibatch] | None] = [None] * S
        advs: list[tuple[Tensor, dict[str, Any]] | None] = [None] * S
        for k, (run, batch) in enumerate(zip(self.runs, batches, strict=True)):
            if batch is None or not self.training(k):
                continue
            try:
                adv, info = advs[k] = run.advantages(batch, progress[k])
            except NonFiniteError as exc:
                self._stop(k, exc.quantity)
                continue
            metrics[k] = run.advantage_metrics(batch, adv, info)
            refresh = cfg.ref_refresh and run.updates > 0 and run.updates % cfg.ref_refresh == 0
            if run.reference is not None and refresh:
                self.sync(k)  # the reference takes the stack's current policy
            ref_logp = run.reference_step(batch, metrics[k])
            units[k] = episode_units(batch, adv, self.layout, run.policy, ref_logp)
        if all(u is None for u in units):  # no run trains (all stopped here)
            return [{} for _ in range(S)]
        rates = self.set_lr(self.policy_opt, cfg.lr, progress)
        coefs = [
            PPOLossConfig(cfg.clip_low, cfg.clip_high, cfg.dual_clip,
                          linear_schedule(cfg.ent_coef, cfg.ent_coef_final, p))
            for p in progress
        ]  # fmt: skip
        stacked = self.stack_units(units)
        E = next(iter(stacked.values())).num_units
        # a run draws its epochs' permutations epoch by epoch, as a plain run always did
        orders = [
            stack_runs([
                torch.randperm(E, generator=g) if self.training(k) else torch.arange(E)
                for k, g in enumerate(self.generators)
            ])
            for _ in range(cfg.epochs)
        ]  # fmt: skip
        training = [self.training(k) for k in range(S)]
        with self.runs[0].distributed_guard(
            "GRPO policy update"
        ):  # distributed: a plain run's ranks
            policy_metrics, stops = self.policy_update.epochs_of_minibatches(
                stacked, coefs, orders, training
            )
        for k, reason in sorted(stops.items()):
            self._stop(k, reason)
        for k, (run, batch) in enumerate(zip(self.runs, batches, strict=True)):
            if not self.training(k) or not metrics[k]:
                metrics[k] = {}
                continue
            row = metrics[k]
            # (a hook may report a plain run's metric as a scalar: reshape(-1))
            row.update({key: float(v.reshape(-1)[k]) for key, v in policy_metrics.items()})
            row["lr"] = rates[k]
            row["ent_coef"] = float(coefs[k].ent_coef)
            if run.offset is not None:
                row["optimism_offset"] = float(run.offset.b.detach())
            if batch.episodes:
                for key in batch.episodes[0]:
                    row[f"episode/{key}"] = float(np.mean([e[key] for e in batch.episodes]))
            row["episodes"] = float(len(batch.episodes))
            run.updates += 1
            if run.debug_dir:
                run.debug_dump(batch, advs[k][1], advs[k][0])
        return metrics

    def stack_units(self, units: list[dict[str, Minibatch] | None]) -> dict[str, SeedMinibatch]:
        """Every run's episode units, padded to :attr:`pad_to` (or the longest) and stacked;
        a run without units (it no longer trains) gets padding only."""
        present = [u for u in units if u is not None]
        if not present:
            raise RuntimeError("no run of the batch trains any more")
        length = self.pad_to or max(next(iter(u.values())).obs.shape[1] for u in present)
        template = present[0]
        out = {}
        for name in template:
            per_seed = []
            for u in units:
                mb = u[name] if u is not None else _empty_like(template[name])
                per_seed.append(pad_episodes(mb, length))
            out[name] = SeedMinibatch.stack(per_seed)
        return out


def _empty_like(mb: Minibatch) -> Minibatch:
    """Units of ``mb``'s shape that enter no loss: one padding step (padded further later)."""
    return replace(mb, **_padding(mb, 1))
