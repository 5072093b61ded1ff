"""MAPPO: decentralised actors per agent type, centralised critic on ``state()``.

One update reads top to bottom in :meth:`MAPPO.iteration`:

1. collect ``T`` steps from ``E`` envs (:class:`marl.collect.RolloutCollector`), with the
   critic's team values ``[T, E, K]`` and per-agent individual values ``[T, E, N, K]``
   (K = ensemble size) and the values of truncated episodes' final states;
2. GAE (:func:`marl.core.advantages.gae`) separately for the team channel (team reward) and the
   individual channel (individual reward, plus the penalty reward unless penalty shaping is
   on or ``penalty_channel='none'``), for every ensemble head; the K heads' advantages are
   averaged;
3. whitening (:class:`marl.core.whitening.AdvantageWhitener`): by default ``team_individual``
   (team and individual advantages whitened separately per agent type, mixed by alpha);
   any other scheme whitens ``team + individual``; then the symmetric clip ``adv_clip``;
4. optional penalty shaping (seed 003): ``A - beta(t) * whiten(penalty cost-to-go)``, the
   penalty cost-to-go being the discounted sum of ``-reward_penalty`` within the episode,
   whitened per agent type; then the optional optimism offset ``A + b``;
5. ``epochs`` of clipped policy updates over minibatches (windows of ``seq_len`` steps with
   stored initial states for recurrent backbones) and ``value_epochs`` of value updates, the
   two in separate threads with ``parallel_update`` (same results, see :class:`_Job`).

Value targets are normalised by :class:`marl.core.losses.ValueNorm` when ``value_norm``.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from marl.collect import RolloutBatch, RolloutCollector, make_vector_env
from marl.core.advantages import constant as constant_schedule
from marl.core.advantages import discounted_returns, gae, linear_decay, shape_with_penalty
from marl.core.losses import (
    NonFiniteError,
    OptimismOffset,
    ValueNorm,
    explained_variance,
    linear_schedule,
    ppo_stats,
    ppo_surrogate,
    value_loss,
)
from marl.core.whitening import GroupKeys, advantage_stats, whiten
from marl.policies import AgentLayout, CentralCritic, MultiAgentPolicy
from marl.run.config import TrainConfig, whitener_from_config

__all__ = ["MAPPO", "ActorUpdater", "window_plan"]


def window_plan(T: int, seq_len: int, burn_in: int) -> tuple[Tensor, Tensor, list[int]]:
    """Training windows over a rollout of T steps.

    Window w's loss covers steps ``[w*L, (w+1)*L)``; its input starts ``burn_in`` steps
    earlier (at 0 for the first windows) and has length ``burn_in + L``.

    Returns ``(time_index [W, burn_in+L], loss_mask [W, burn_in+L] bool, starts [W])``.
    """
    if T % seq_len:
        raise ValueError(f"seq_len={seq_len} must divide rollout_steps={T}")
    if burn_in + seq_len > T:
        raise ValueError(f"burn_in + seq_len = {burn_in + seq_len} exceeds rollout_steps={T}")
    W, Lw = T // seq_len, burn_in + seq_len
    starts = [max(0, w * seq_len - burn_in) for w in range(W)]
    index = torch.tensor(starts)[:, None] + torch.arange(Lw)[None, :]
    lo = (torch.arange(W) * seq_len)[:, None]
    loss_mask = (index >= lo) & (index < lo + seq_len)
    return index, loss_mask, starts


class ActorUpdater:
    """Clipped-surrogate updates of a :class:`MultiAgentPolicy` (shared by MAPPO and GRPO).

    ``update(batch, advantages, ...)`` takes per-type advantages ``[T, E, n_k]`` and runs
    ``epochs`` x ``num_minibatches`` steps over units (single steps for the mlp backbone,
    windows of ``seq_len`` (+ ``burn_in``) steps with stored initial states for recurrent
    ones). Optional extra loss terms come from ``extra_loss(type_name, idx, logp, dist)``.

    Each agent type's share of a minibatch is its own forward and backward
    (:meth:`_type_backward`); with ``parallel`` (``cfg.parallel_update`` and thread-safe
    backbones) the types run in threads, combined in a fixed order, so the results do not
    depend on the threading.
    """

    def __init__(
        self,
        policy: MultiAgentPolicy,
        cfg: TrainConfig,
        *,
        extra_params: list[nn.Parameter] | None = None,
        ctx: Any = None,
    ) -> None:
        self.policy, self.cfg, self.ctx = policy, cfg, ctx
        self.params = list(policy.parameters()) + list(extra_params or [])
        # fused Adam: the same update as the foreach one, in one kernel (about 2x faster on
        # CPU for these small networks)
        self.optimizer = torch.optim.Adam(self.params, lr=cfg.lr, eps=1e-5, fused=True)
        self.recurrent = policy.is_recurrent
        # agent types side by side only where their backbones may run in two threads at once
        self.parallel = bool(cfg.parallel_update) and all(
            bool(getattr(actor.backbone, "thread_safe", True)) for actor in policy.actors.values()
        )
        self.seq_len = cfg.seq_len if self.recurrent else 1
        self.burn_in = cfg.burn_in if self.recurrent else 0

    def window_state_steps(self, T: int) -> list[int]:
        """Steps whose actor state the rollout must store (window input starts)."""
        if not self.recurrent:
            return []
        return window_plan(T, self.seq_len, self.burn_in)[2]

    def _units(self, batch: RolloutBatch, advantages: dict[str, Tensor]) -> dict[str, Any]:
        T, E = batch.num_steps, batch.num_envs
        if not self.recurrent:
            data = {}
            for t in self.policy.layout.types:
                k = t.name
                actor = self.policy.actors[k]
                data[k] = {
                    "inputs": actor.inputs(batch.obs[k]).reshape(T * E, 1, t.n_agents, -1),
                    "mask": batch.mask[k].reshape(T * E, 1, t.n_agents, -1),
                    "actions": batch.actions[k].reshape(T * E, 1, t.n_agents),
                    "logp": batch.logp[k].reshape(T * E, 1, t.n_agents),
                    "adv": advantages[k].reshape(T * E, 1, t.n_agents),
                }
            return {"num_units": T * E, "types": data, "loss_mask": None, "resets": None}
        index, loss_mask, _ = window_plan(T, self.seq_len, self.burn_in)
        W, Lw = index.shape

        def gather(x: Tensor) -> Tensor:  # [T, E, ...] -> [W*E, Lw, ...]
            y = x[index.to(x.device)]  # [W, Lw, E, ...]
            y = y.transpose(1, 2)  # [W, E, Lw, ...]
            return y.reshape(W * E, Lw, *x.shape[2:])

        data = {}
        for t in self.policy.layout.types:
            k = t.name
            states = batch.window_states[k]  # W tuples of [E*n_k, ...]
            init = tuple(torch.cat([s[i] for s in states], 0) for i in range(len(states[0])))
            data[k] = {
                "obs": gather(batch.obs[k]),
                "mask": gather(batch.mask[k]),
                "actions": gather(batch.actions[k]),
                "logp": gather(batch.logp[k]),
                "adv": gather(advantages[k]),
                "state": init,
                "n_agents": t.n_agents,
            }
        lm = loss_mask[:, None, :].expand(W, E, Lw).reshape(W * E, Lw).to(batch.terminated.device)
        return {
            "num_units": W * E,
            "types": data,
            "loss_mask": lm,
            "resets": gather(batch.episode_start),
        }

    def update(
        self,
        batch: RolloutBatch,
        advantages: dict[str, Tensor],
        *,
        ent_coef: float,
        lr: float,
        extra_loss=None,
        offset: OptimismOffset | None = None,
    ) -> dict[str, float]:
        cfg = self.cfg
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        units = self._units(batch, advantages)
        U = units["num_units"]
        types = self.policy.layout.types
        agents_per_unit = sum(t.n_agents for t in types)
        mb_size = max(1, math.ceil(U / cfg.num_minibatches))
        sums: dict[str, float] = {}
        records: list[tuple[Tensor, Tensor, Tensor | None, Tensor | None]] = []
        n_steps = 0
        for _epoch in range(cfg.epochs):
            perm = torch.randperm(U)
            for start in range(0, U, mb_size):
                idx = perm[start : start + mb_size]
                # valid (step, agent) samples of the minibatch over all types: every type's
                # loss terms are sums divided by this count, so their sum is the joint mean
                if self.recurrent:
                    count = _take(units["loss_mask"], idx).sum() * agents_per_unit
                else:
                    count = torch.tensor(float(len(idx) * agents_per_unit))
                count = count.clamp_min(1.0)
                for p in self.params:  # zero_grad(set_to_none=True) without its hooks
                    p.grad = None
                # Each type's actor has its own parameters: its forward and backward can run
                # in its own thread; the parts are combined in a fixed order (same results).
                jobs = [
                    _Job(
                        self._type_backward,
                        t,
                        units,
                        idx,
                        count,
                        ent_coef,
                        extra_loss,
                        offset,
                        threaded=self.parallel and i > 0,
                    )
                    for i, t in enumerate(types)
                ]
                parts = _results(jobs)
                pg_loss = -sum(p["surr_sum"] for p in parts) / count
                entropy = sum(p["ent_sum"] for p in parts) / count
                for name, value in (("loss/policy", pg_loss), ("entropy", entropy)):
                    if not torch.isfinite(value):
                        raise NonFiniteError(name)
                masks = [p["mask"] for p in parts]
                mask = torch.cat(masks) if self.recurrent else None  # None: every sample counts
                if offset is not None:
                    offset.loss(torch.cat([p["adv"] for p in parts]), mask).backward()
                # the ratio statistics of every minibatch are computed after the epochs, in
                # one go (see _ppo_stats_mean)
                records.append(
                    (
                        torch.cat([p["logp"] for p in parts]),
                        torch.cat([p["old"] for p in parts]),
                        None if cfg.dual_clip is None else torch.cat([p["dual"] for p in parts]),
                        mask,
                    )
                )
                grad_norm = _step(self.optimizer, self.params, cfg.max_grad_norm, self.ctx)
                if not math.isfinite(grad_norm):
                    raise NonFiniteError("grad_norm (policy)")
                n_steps += 1
                for key, value in (
                    ("loss/policy", float(pg_loss)),
                    ("entropy", float(entropy)),
                    ("grad_norm", grad_norm),
                ):
                    sums[key] = sums.get(key, 0.0) + value
        out = {k: v / max(n_steps, 1) for k, v in sums.items()}
        out.update(_ppo_stats_mean(records, cfg.clip_low, cfg.clip_high))
        out["loss/entropy"] = -ent_coef * out.get("entropy", 0.0)
        return out

    def _type_backward(
        self,
        t: Any,
        units: dict[str, Any],
        idx: Tensor,
        count: Tensor,
        ent_coef: float,
        extra_loss,
        offset: OptimismOffset | None,
    ) -> dict[str, Tensor]:
        """Forward and backward of one agent type's share of the minibatch ``idx``.

        Its loss is ``-(sum of surrogates + ent_coef * sum of entropies) / count`` plus the
        optional extra term, so the types' losses add up to the joint minibatch loss. Returns
        the detached pieces the caller combines (sums, log-probs, advantages, masks).
        """
        cfg = self.cfg
        d = units["types"][t.name]
        actor = self.policy.actors[t.name]
        if self.recurrent:
            n = d["n_agents"]
            rows = (idx[:, None] * n + torch.arange(n)[None, :]).reshape(-1)
            state = tuple(_take(s, rows) for s in d["state"])
            dist = actor.sequence(
                _take(d["obs"], idx), _take(d["mask"], idx), state, _take(units["resets"], idx)
            )
            mask = _take(units["loss_mask"], idx)[..., None].expand(-1, -1, n).reshape(-1)
        else:
            # inputs (observation + agent one-hot) were built once per update
            dist = actor.sequence_from_inputs(_take(d["inputs"], idx), _take(d["mask"], idx))
            mask = None
        logp_seq = dist.log_prob(_take(d["actions"], idx))
        logp = logp_seq.reshape(-1)
        old = _take(d["logp"], idx).reshape(-1)
        adv = _take(d["adv"], idx).reshape(-1)
        surr, dual = ppo_surrogate(
            logp,
            old,
            adv if offset is None else offset(adv),
            clip_low=cfg.clip_low,
            clip_high=cfg.clip_high,
            dual_clip=cfg.dual_clip,
        )
        ent = dist.entropy().reshape(-1)
        if mask is not None:
            m = mask.to(surr.dtype)
            surr, ent = surr * m, ent * m
        surr_sum, ent_sum = surr.sum(), ent.sum()
        loss = -(surr_sum + ent_coef * ent_sum) / count
        if extra_loss is not None:
            loss = loss + extra_loss(t.name, idx, logp_seq, dist)
        loss.backward()
        return {
            "surr_sum": surr_sum.detach(),
            "ent_sum": ent_sum.detach(),
            "logp": logp.detach(),
            "old": old,
            "adv": adv,
            "dual": dual,
            "mask": mask,
        }


def _ppo_stats_mean(
    records: list[tuple[Tensor, Tensor, Tensor | None, Tensor | None]],
    clip_low: float,
    clip_high: float,
) -> dict[str, float]:
    """The mean over minibatches of :func:`ppo_stats` of each ``(logp, logp_old, dual_active,
    mask)`` record; the minibatches of each size are stacked and done in one call
    (``dim=-1``: one value per minibatch)."""
    sums: dict[str, float] = {}
    by_size: dict[tuple[int, ...], list] = {}
    for record in records:
        by_size.setdefault(tuple(record[0].shape), []).append(record)
    for group in by_size.values():
        stacked = [None if f[0] is None else torch.stack(f) for f in zip(*group, strict=True)]
        stats = ppo_stats(
            *stacked[:3], clip_low=clip_low, clip_high=clip_high, mask=stacked[3], dim=-1
        )
        for k, v in stats.items():
            sums[k] = sums.get(k, 0.0) + float(v.sum())
    return {k: v / len(records) for k, v in sums.items()}


def _results(jobs: list[_Job]) -> list[Any]:
    """Every job's result in order; all are joined even when one fails (then re-raised)."""
    out, error = [], None
    for job in jobs:
        try:
            out.append(job.result())
        except BaseException as exc:  # noqa: BLE001 - re-raised once every job is joined
            error = error or exc
    if error is not None:
        raise error
    return out


class _Job:
    """``fn(*args)`` run now in a background thread (``threaded``) or at :meth:`result`.

    :meth:`result` returns the value, re-raising the function's exception in the caller.
    torch operations release the GIL, so a threaded job computes on a second core.
    """

    def __init__(self, fn, *args, threaded: bool) -> None:
        self._fn, self._args = fn, args
        self._value: Any = None
        self._error: BaseException | None = None
        self._thread = None
        self._done = False
        if threaded:
            self._thread = threading.Thread(target=self._run, name="mappo-critic", daemon=True)
            self._thread.start()

    @property
    def threaded(self) -> bool:
        return self._thread is not None

    def _run(self) -> None:
        try:
            self._value = self._fn(*self._args)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller in result()
            self._error = exc

    def wait(self) -> None:
        """Run or join the job without raising its error (:meth:`result` raises it)."""
        if self._thread is None:
            if not self._done:
                self._done = True
                self._run()
        else:
            self._thread.join()

    def result(self) -> Any:
        self.wait()
        if self._error is not None:
            raise self._error
        return self._value


def _take(x: Tensor, idx: Tensor) -> Tensor:
    """``x[idx]`` for a 1-D long ``idx`` along dim 0 (index_select: same values, about twice
    as fast as advanced indexing for the minibatch gathers on CPU)."""
    return x.index_select(0, idx)


def _step(
    optimizer: torch.optim.Optimizer, params: list[nn.Parameter], max_norm: float | None, ctx
) -> float:
    """Average gradients across ranks, clip, step; returns the pre-clip grad norm."""
    if ctx is not None and getattr(ctx, "enabled", False):
        from marl.run.distributed import average_gradients

        average_gradients(params, ctx)
    norm = clip_grad_norm([p.grad for p in params if p.grad is not None], max_norm)
    adam_step(optimizer)
    return float(norm)


def adam_step(optimizer: torch.optim.Optimizer) -> None:
    """``optimizer.step()``; for a fused single-group Adam (no amsgrad, not maximising) whose
    parameters all have a gradient and a state, the same kernel with the same arguments as
    ``Optimizer.step`` passes it (``torch._fused_adam_`` after the step counts' increment;
    tested equal), without its per-call Python, about half the cost of a step for these
    small networks. Anything else goes to ``optimizer.step()``."""
    groups = optimizer.param_groups
    g = groups[0]
    odd = ("amsgrad", "maximize", "decoupled_weight_decay", "capturable", "differentiable")
    if len(groups) != 1 or not g.get("fused") or any(g.get(k) for k in odd):
        optimizer.step()
        return
    params = g["params"]
    states = [optimizer.state.get(p) for p in params]
    if any(p.grad is None or not st for p, st in zip(params, states, strict=True)) or (
        len({(p.device, p.dtype) for p in params}) > 1
    ):
        # the first step (creates the state), a parameter without gradient, or parameters
        # that Optimizer.step would group by device and dtype
        optimizer.step()
        return
    steps = [st["step"] for st in states]
    torch._foreach_add_(steps, 1)
    beta1, beta2 = g["betas"]
    torch._fused_adam_(
        params,
        [p.grad for p in params],
        [st["exp_avg"] for st in states],
        [st["exp_avg_sq"] for st in states],
        [],
        steps,
        amsgrad=False,
        lr=g["lr"],
        beta1=beta1,
        beta2=beta2,
        weight_decay=g["weight_decay"],
        eps=g["eps"],
        maximize=False,
        grad_scale=None,
        found_inf=None,
    )


def clip_grad_norm(grads: list[Tensor], max_norm: float | None) -> Tensor:
    """``torch.nn.utils.clip_grad_norm_`` on the gradients themselves, the same operations
    (the 2-norm of the per-tensor 2-norms; ``grads *= min(max_norm / (norm + 1e-6), 1)``) without
    its per-call grouping by device and dtype, which costs more than the arithmetic for a few
    small tensors (~0.2 ms per call). ``max_norm=None``: the norm only. Returns the norm before
    clipping (a 0-dim tensor)."""
    if not grads:
        return torch.tensor(0.0)
    if len({(g.device, g.dtype) for g in grads}) > 1:  # mixed: torch's grouping
        bound = float("inf") if max_norm is None else max_norm
        params = [nn.Parameter(torch.empty_like(g)) for g in grads]
        for p, g in zip(params, grads, strict=True):
            p.grad = g  # the gradient tensors themselves: clipped in place
        return torch.nn.utils.clip_grad_norm_(params, bound)
    norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0)
    if max_norm is not None:
        torch._foreach_mul_(grads, torch.clamp(max_norm / (norm + 1e-6), max=1.0))
    return norm


class MAPPO:
    """The MAPPO algorithm object driven by :mod:`marl.run.train` (``iteration(progress)``)."""

    name = "mappo"

    def __init__(self, cfg: TrainConfig, ctx: Any, device: torch.device | str = "cpu") -> None:
        self.cfg, self.ctx = cfg, ctx
        self.device = torch.device(device)
        self.parallel = bool(cfg.parallel_update)
        self.vec = make_vector_env(cfg.env_fn, cfg.num_envs, cfg.env)
        self.layout = AgentLayout.from_env(self.vec)
        self.policy = MultiAgentPolicy(
            self.layout, cfg.backbone, cfg.hidden_dim, cfg.activation
        ).to(self.device)
        N = self.layout.n_agents
        self.critic = CentralCritic(
            self.layout.state_dim, N, cfg.critic_hidden_dim, cfg.value_ensemble, cfg.activation
        ).to(self.device)
        self.offset = (
            OptimismOffset(cfg.optimism_offset).to(self.device)
            if cfg.optimism_offset is not None
            else None
        )
        distributed = bool(getattr(ctx, "enabled", False))
        if distributed:
            from marl.run.distributed import broadcast_parameters

            broadcast_parameters(self.policy, ctx)
            broadcast_parameters(self.critic, ctx)
        self.actor = ActorUpdater(
            self.policy,
            cfg,
            extra_params=list(self.offset.parameters()) if self.offset is not None else None,
            ctx=ctx,
        )
        self.critic_opt = torch.optim.Adam(
            self.critic.parameters(), lr=cfg.resolved_critic_lr, eps=1e-5, fused=True
        )
        self.value_norm_team = self.value_norm_ind = None
        if cfg.value_norm:
            self.value_norm_team = ValueNorm(1, cfg.value_norm_beta, distributed=distributed).to(
                self.device
            )
            self.value_norm_ind = ValueNorm(N, cfg.value_norm_beta, distributed=distributed).to(
                self.device
            )
        self.whitener = whitener_from_config(
            cfg, num_groups=len(self.layout.types), distributed=distributed
        )
        self.penalty_schedule = None
        if cfg.penalty_beta_schedule == "constant":
            self.penalty_schedule = constant_schedule(cfg.penalty_beta)
        elif cfg.penalty_beta_schedule == "linear":
            self.penalty_schedule = linear_decay(cfg.penalty_beta, cfg.penalty_beta_floor, 1.0)
        seed = ctx.seed_offset(cfg.seed) if ctx is not None else cfg.seed
        self.collector = RolloutCollector(
            self.vec, self.layout, self.policy, seed=seed, device=self.device
        )
        type_of_agent = torch.zeros(N, dtype=torch.long)
        for i, t in enumerate(self.layout.types):
            type_of_agent[list(t.agent_ids)] = i
        self.type_of_agent = type_of_agent
        self.last_advantages: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        # the next rollout, collected ahead by iteration() (see there), and whether to do so
        self._ahead: RolloutBatch | None = None
        self.collect_ahead = True

    # -- values ---------------------------------------------------------------------------
    @torch.no_grad()
    def _values(self, state: Tensor) -> tuple[Tensor, Tensor]:
        """Critic outputs for the rollout's states (normalised space when value_norm):
        ``state [M, S]`` -> ``[M, K]``, ``[M, N, K]``. With ``parallel`` the two halves of a
        large batch run side by side (the rollout leaves the second core idle)."""
        if not self.parallel or state.shape[0] < 1024:
            return self.critic(state)
        half = state.shape[0] // 2
        job = _Job(self._values_no_grad, state[half:], threaded=True)
        try:
            head = self.critic(state[:half])
        finally:
            tail = job.result()
        return torch.cat([head[0], tail[0]]), torch.cat([head[1], tail[1]])

    def _values_no_grad(self, state: Tensor) -> tuple[Tensor, Tensor]:
        with torch.no_grad():  # grad mode is per thread
            return self.critic(state)

    def _denorm(self, team: Tensor, ind: Tensor) -> tuple[Tensor, Tensor]:
        if self.value_norm_team is None:
            return team, ind
        team = self.value_norm_team.denormalize(team)
        ind = self.value_norm_ind.denormalize(ind.transpose(-1, -2)).transpose(-1, -2)
        return team, ind

    def _norm(self, team: Tensor, ind: Tensor) -> tuple[Tensor, Tensor]:
        if self.value_norm_team is None:
            return team, ind
        team = self.value_norm_team.normalize(team)
        ind = self.value_norm_ind.normalize(ind.transpose(-1, -2)).transpose(-1, -2)
        return team, ind

    # -- one update ------------------------------------------------------------------------
    def _collect(self, before_values=None) -> RolloutBatch:
        self.policy.eval()
        try:
            return self.collector.collect(
                self.cfg.rollout_steps,
                value_fn=self._values,
                window_state_steps=self.actor.window_state_steps(self.cfg.rollout_steps),
                before_values=before_values,
            )
        finally:
            self.policy.train()

    def iteration(self, progress: float) -> dict[str, float]:
        """One update on one rollout of ``T x E`` env steps; returns its metrics.

        With the parallel update and ``collect_ahead``, the policy epochs run first, then the
        value epochs in a thread alongside the env steps of the *next* rollout, which need only
        the updated policy (the rollout alone leaves the second core idle); that rollout's
        values wait for the value epochs, and the rollout is kept for the next call. The
        results are those of collect-then-update: a rollout does not touch the critic, and the
        random draws (the value epochs' minibatch orders, the policy's, then the next rollout's
        noise) come in the same order. The training loop sets ``collect_ahead`` False before a
        checkpoint, so that checkpoints need not hold a rollout (one that does is resumed from
        exactly).
        """
        t0 = time.perf_counter()
        batch, self._ahead = self._ahead, None
        if batch is None:
            batch = self._collect()
        t_collect = time.perf_counter() - t0
        ahead = self.collect_ahead and self.parallel and not getattr(self.ctx, "enabled", False)
        metrics, critic_job = self._update(batch, progress, critic_after_policy=ahead)
        if ahead:
            t1 = time.perf_counter()
            try:
                self._ahead = self._collect(before_values=critic_job.result)
            finally:
                critic_job.wait()  # joined even when the rollout failed
            t_collect += time.perf_counter() - t1
        metrics.update(critic_job.result())
        metrics["time/collect_s"] = t_collect
        metrics["time/update_s"] = time.perf_counter() - t0 - t_collect
        metrics["env_steps_delta"] = float(batch.num_steps * batch.num_envs)
        return metrics

    def advantages(
        self, batch: RolloutBatch, progress: float
    ) -> tuple[dict[str, Tensor], dict[str, Any]]:
        """Per-type final advantages ``[T, E, n_k]`` and the pieces needed for value training."""
        cfg = self.cfg
        T, E, N = batch.num_steps, batch.num_envs, self.layout.n_agents
        K = batch.values_team.shape[-1]
        v_team, v_ind = self._denorm(batch.values_team, batch.values_individual)
        nv_team, nv_ind = self._denorm(batch.next_values_team, batch.next_values_individual)
        shaping = self.penalty_schedule is not None
        r_ind = batch.reward_individual
        if not shaping and cfg.penalty_channel == "individual":
            r_ind = r_ind + batch.reward_penalty
        term, trunc = batch.terminated, batch.truncated
        try:
            a_team, ret_team = gae(
                batch.reward_team[..., None].expand(T, E, K),
                v_team,
                nv_team,
                term[..., None].expand(T, E, K),
                trunc[..., None].expand(T, E, K),
                gamma=cfg.gamma,
                lam=cfg.gae_lambda,
            )
            a_ind, ret_ind = gae(
                r_ind[..., None].expand(T, E, N, K),
                v_ind,
                nv_ind,
                term[..., None, None].expand(T, E, N, K),
                trunc[..., None, None].expand(T, E, N, K),
                gamma=cfg.gamma,
                lam=cfg.gae_lambda,
            )
        except ValueError as exc:
            if "finite" in str(exc).lower() or "nan" in str(exc).lower():
                raise NonFiniteError(f"advantages (GAE input: {exc})") from exc
            raise
        team_adv = a_team.mean(-1)[..., None].expand(T, E, N).contiguous()  # [T, E, N]
        ind_adv = a_ind.mean(-1)  # [T, E, N]
        for name, x in (("advantages/team", team_adv), ("advantages/individual", ind_adv)):
            if not torch.isfinite(x).all():
                raise NonFiniteError(name)
        position = (torch.arange(T) % cfg.seq_len).reshape(T, 1, 1)
        window_id = torch.arange(T) // cfg.seq_len
        seq_id = (window_id[:, None, None] * E + torch.arange(E)[None, :, None]) * N + torch.arange(
            N
        )[None, None, :]
        keys = GroupKeys(
            type_id=self.type_of_agent.reshape(1, 1, N).to(team_adv.device),
            position=position.to(team_adv.device),
            sequence_id=seq_id.to(team_adv.device),
        )
        if self.whitener.scheme == "team_individual":
            raw = cfg.alpha * team_adv + (1 - cfg.alpha) * ind_adv
        else:
            raw = team_adv + ind_adv
        adv = self.whitener(team_adv, ind_adv, keys=keys)
        info: dict[str, Any] = {"adv_clip_frac": float(self.whitener.last_clip_frac)}
        if shaping:
            cost = -batch.reward_penalty
            cost_to_go = discounted_returns(
                cost, (term | trunc)[..., None].expand(T, E, N), cfg.gamma
            )
            beta = float(self.penalty_schedule(progress))
            norm_cost = whiten(cost_to_go, group=keys.type_id.expand(T, E, N))
            adv = shape_with_penalty(adv.clone(), norm_cost, beta)
            info["penalty_beta"] = beta
        if not torch.isfinite(adv).all():
            raise NonFiniteError("advantages (after whitening)")
        info["raw"], info["adv"] = raw, adv
        info["returns"] = (ret_team, ret_ind)
        info["values"] = (v_team, v_ind)
        per_type = {t.name: adv[:, :, list(t.agent_ids)] for t in self.layout.types}
        return per_type, info

    def update(self, batch: RolloutBatch, progress: float) -> dict[str, float]:
        """Policy and value epochs on ``batch`` (the value epochs alongside the policy's with
        the parallel update); returns the update's metrics."""
        metrics, critic_job = self._update(batch, progress)
        metrics.update(critic_job.result())
        return metrics

    def _update(
        self, batch: RolloutBatch, progress: float, *, critic_after_policy: bool = False
    ) -> tuple[dict[str, float], _Job]:
        """The policy epochs; the value epochs are the returned job: with the parallel update a
        thread started alongside the policy epochs (or after them, ``critic_after_policy``, to
        run alongside what the caller does next), else run by the job's ``result()``."""
        cfg = self.cfg
        per_type, info = self.advantages(batch, progress)
        metrics: dict[str, float] = {}
        raw, adv = info["raw"], info["adv"]
        for prefix, x in (("adv_raw", raw), ("adv", adv)):
            for k, v in advantage_stats(x).items():
                metrics[f"{prefix}/{k}"] = v
            for t in self.layout.types:
                for k, v in advantage_stats(x[:, :, list(t.agent_ids)]).items():
                    metrics[f"{prefix}/{t.name}/{k}"] = v
        self.last_advantages = {
            t.name: (
                raw[:, :, list(t.agent_ids)].detach().cpu().numpy().ravel(),
                adv[:, :, list(t.agent_ids)].detach().cpu().numpy().ravel(),
            )
            for t in self.layout.types
        }
        metrics["adv_clip_frac"] = info["adv_clip_frac"]
        if "penalty_beta" in info:
            metrics["penalty_beta"] = info["penalty_beta"]
        ent_coef = linear_schedule(cfg.ent_coef, cfg.ent_coef_final, progress)
        lr_scale = 1.0 - progress if cfg.lr_schedule == "linear" else 1.0
        lr = cfg.lr * max(lr_scale, 0.0)
        # The policy and the critic share nothing during their epochs (separate parameters,
        # optimisers and inputs), so the critic's can run on a second core. Its minibatch order
        # is drawn here, before either starts, so the results do not depend on the threading.
        perms = [
            torch.randperm(batch.num_steps * batch.num_envs)
            for _ in range(cfg.resolved_value_epochs)
        ]
        parallel = self.parallel and not getattr(self.ctx, "enabled", False)

        def critic_job() -> _Job:
            return _Job(self.update_critic, batch, info, lr_scale, perms, threaded=parallel)

        late = parallel and critic_after_policy
        job = None if late else critic_job()
        try:
            metrics.update(
                self.actor.update(batch, per_type, ent_coef=ent_coef, lr=lr, offset=self.offset)
            )
        except BaseException:
            if job is not None:
                job.wait()  # the thread is joined before the error goes up
            raise
        if late:
            job = critic_job()
        metrics["lr"] = lr
        metrics["ent_coef"] = ent_coef
        if self.offset is not None:
            metrics["optimism_offset"] = self.offset.b.item()
        # episode statistics
        if batch.episodes:
            for key in batch.episodes[0]:
                metrics[f"episode/{key}"] = float(np.mean([e[key] for e in batch.episodes]))
        metrics["episodes"] = float(len(batch.episodes))
        return metrics, job

    def update_critic(
        self, batch: RolloutBatch, info: dict, lr_scale: float, perms: list[Tensor]
    ) -> dict[str, float]:
        """ValueNorm update, then one value epoch per permutation in ``perms`` (each a
        permutation of the ``T * E`` states)."""
        cfg = self.cfg
        T, E, N = batch.num_steps, batch.num_envs, self.layout.n_agents
        ret_team, ret_ind = info["returns"]
        v_team, v_ind = info["values"]
        ev = explained_variance(
            torch.cat([v_team.mean(-1).reshape(-1), v_ind.mean(-1).reshape(-1)]),
            torch.cat([ret_team.mean(-1).reshape(-1), ret_ind.mean(-1).reshape(-1)]),
        )
        if self.value_norm_team is not None:
            self.value_norm_team.update(ret_team.reshape(-1, 1))
            self.value_norm_ind.update(ret_ind.transpose(-1, -2).reshape(-1, N))
        tgt_team, tgt_ind = self._norm(ret_team, ret_ind)
        K = tgt_team.shape[-1]
        states = batch.state.reshape(T * E, -1)
        tgt_team, tgt_ind = tgt_team.reshape(T * E, K), tgt_ind.reshape(T * E, N, K)
        old_team = batch.values_team.reshape(T * E, K)
        old_ind = batch.values_individual.reshape(T * E, N, K)
        for g in self.critic_opt.param_groups:
            g["lr"] = cfg.resolved_critic_lr * max(lr_scale, 0.0)
        n = T * E
        mb = max(1, math.ceil(n / cfg.num_minibatches))
        total, gnorm, steps = 0.0, 0.0, 0
        params = list(self.critic.parameters())
        for perm in perms:
            for start in range(0, n, mb):
                idx = perm[start : start + mb]
                p_team, p_ind = self.critic(_take(states, idx))
                loss = value_loss(
                    p_team, _take(old_team, idx), _take(tgt_team, idx), value_clip=cfg.value_clip
                ) + value_loss(
                    p_ind, _take(old_ind, idx), _take(tgt_ind, idx), value_clip=cfg.value_clip
                )
                if not torch.isfinite(loss):
                    raise NonFiniteError("loss/value")
                for p in params:  # zero_grad(set_to_none=True) without its hooks
                    p.grad = None
                loss.backward()
                g = _step(self.critic_opt, params, cfg.max_grad_norm, self.ctx)
                if not math.isfinite(g):
                    raise NonFiniteError("grad_norm (value)")
                total += loss.item()
                gnorm += g
                steps += 1
        return {
            "loss/value": total / max(steps, 1),
            "value_grad_norm": gnorm / max(steps, 1),
            "explained_variance": ev,
        }

    # -- checkpoints -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        d = {
            "policy": self.policy.state_dict(),
            "critic": self.critic.state_dict(),
            "actor_opt": self.actor.optimizer.state_dict(),
            "critic_opt": self.critic_opt.state_dict(),
            "whitener": self.whitener.state_dict(),
            "collector": self.collector.state_dict(),
        }
        if self.offset is not None:
            d["offset"] = self.offset.state_dict()
        if self.value_norm_team is not None:
            d["value_norm_team"] = self.value_norm_team.state_dict()
            d["value_norm_ind"] = self.value_norm_ind.state_dict()
        if self._ahead is not None:  # the env state is after it: resume must train on it
            d["ahead"] = self._ahead
        return d

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.policy.load_state_dict(d["policy"])
        self.critic.load_state_dict(d["critic"])
        self.actor.optimizer.load_state_dict(d["actor_opt"])
        self.critic_opt.load_state_dict(d["critic_opt"])
        self.whitener.load_state_dict(d["whitener"])
        if self.offset is not None:
            self.offset.load_state_dict(d["offset"])
        if self.value_norm_team is not None:
            self.value_norm_team.load_state_dict(d["value_norm_team"])
            self.value_norm_ind.load_state_dict(d["value_norm_ind"])
        if getattr(self.ctx, "enabled", False):
            from marl.run.distributed import broadcast_parameters

            broadcast_parameters(self.policy, self.ctx)
            broadcast_parameters(self.critic, self.ctx)
        collector_state = d["collector"]
        if getattr(self.ctx, "rank", 0) != 0:
            # the checkpoint holds rank 0's environments: other ranks restart their own
            collector_state = {**collector_state, "env": None}
        seed = self.ctx.seed_offset(self.cfg.seed) if self.ctx is not None else self.cfg.seed
        restored = self.collector.load_state_dict(collector_state, seed=seed)
        self.vec = self.collector.vec
        # a rollout collected ahead belongs with the env state it left (else it is dropped)
        self._ahead = d.get("ahead") if restored else None
