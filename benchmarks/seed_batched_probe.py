"""Probe: S seeds as S separate modules vs stacked along a seed axis (issue 37), one thread.

Workloads (the calls the many-seeds trainer will batch):

* ``update``: one PPO minibatch step of a feed-forward actor, 3 linear layers 64 wide
  (obs 32 -> 64 -> 64 -> 5 actions, tanh), 512 rows per seed: clipped surrogate + entropy,
  ``zero_grad``, ``backward``, per-seed gradient clipping (0.5), Adam.
* ``gru step``: one GRU step without autograd (a rollout step), 64 rows, input and hidden 64.
* ``mlp act``: the actor's forward without autograd for 64 rows (a rollout step).

Modes (seed k sees the same data in each):

* ``loop``: S separate torch modules one after another (``nn.Sequential`` / ``nn.GRU``,
  ``clip_grad_norm_`` and a fused ``torch.optim.Adam`` per seed): S single-seed runs.
* ``stacked``: :mod:`marl.core.seed_batched` (SeedMLP / SeedGRU, per-seed clipping), one
  fused Adam over the stacked parameters (exact per seed while every seed steps).
* ``views``: stacked, the fused Adam over :class:`SeedViews` (per-seed step counts, step
  mask: the exact form of the optimiser step).
* ``vmap``: ``torch.func.stack_module_state`` + ``vmap(functional_call)`` for the forward,
  then the same per-seed clipping and stacked fused Adam.

Every (workload, S, mode) is timed once per round, all of them interleaved in each round,
so a burst of load from other processes hits them alike. Time is the CPU time of the
calling thread (``time.thread_time``: with one torch thread every operation runs in it),
so time spent descheduled on a shared machine is not counted (cache and memory-bandwidth
contention still is); the figure is the median over rounds of the time per call divided by
S (time per seed). ``x S=1`` is the loop at S=1 (one seed, today's single-seed code)
divided by that figure: the speed-up per seed. ``--wall`` times wall-clock instead.

    python benchmarks/seed_batched_probe.py                 # S = 1, 4, 16, 64
    python benchmarks/seed_batched_probe.py --quick         # fewer rounds, S = 1, 4, 16
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from marl.core.losses import ppo_surrogate  # noqa: E402
from marl.core.seed_batched import (  # noqa: E402
    SeedViews,
    clip_grad_norm_per_seed_,
    stack_modules,
)

OBS, HIDDEN, ACTIONS = 32, 64, 5
UPDATE_ROWS, STEP_ROWS = 512, 64
MAX_NORM = 0.5


def actor() -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(OBS, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(),
        nn.Linear(HIDDEN, ACTIONS),
    )  # fmt: skip


def ppo_loss(logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Clipped surrogate + entropy, the mean over rows: ``[..., N, A]`` -> ``[...]``."""
    log_probs = torch.log_softmax(logits, dim=-1)
    logp = log_probs.gather(-1, batch["actions"].unsqueeze(-1)).squeeze(-1)
    surrogate, _ = ppo_surrogate(logp, batch["old_logp"], batch["advantages"])
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return -(surrogate + 0.01 * entropy).mean(dim=-1)


def update_batch(S: int) -> dict[str, torch.Tensor]:
    return {
        "obs": torch.randn(S, UPDATE_ROWS, OBS),
        "actions": torch.randint(0, ACTIONS, (S, UPDATE_ROWS)),
        "old_logp": torch.full((S, UPDATE_ROWS), -1.6) + 0.1 * torch.randn(S, UPDATE_ROWS),
        "advantages": torch.randn(S, UPDATE_ROWS),
    }


def adam(params) -> torch.optim.Adam:
    return torch.optim.Adam(params, lr=3e-4, eps=1e-5, fused=True)


def update_calls(S: int) -> dict[str, Callable[[], None]]:
    """One minibatch step of S seeds, per mode."""
    nets = [actor() for _ in range(S)]
    batch = update_batch(S)
    per_seed = [{key: value[k] for key, value in batch.items()} for k in range(S)]

    loop_nets = [actor() for _ in range(S)]
    for net, src in zip(loop_nets, nets, strict=True):
        net.load_state_dict(src.state_dict())
    loop_opts = [adam(net.parameters()) for net in loop_nets]

    def loop() -> None:
        for net, opt, data in zip(loop_nets, loop_opts, per_seed, strict=True):
            opt.zero_grad()
            ppo_loss(net(data["obs"]), data).backward()
            nn.utils.clip_grad_norm_(net.parameters(), MAX_NORM)
            opt.step()

    stacked = stack_modules(nets)
    stacked_opt = adam(stacked.parameters())

    def stacked_step() -> None:
        stacked_opt.zero_grad()
        ppo_loss(stacked(batch["obs"]), batch).sum().backward()
        clip_grad_norm_per_seed_(stacked.parameters(), MAX_NORM)
        stacked_opt.step()

    viewed = stack_modules(nets)
    views = SeedViews(viewed.parameters())
    views_opt = adam(views.parameters())
    active = torch.ones(S, dtype=torch.bool)

    def views_step() -> None:
        views.zero_grad()
        ppo_loss(viewed(batch["obs"]), batch).sum().backward()
        norms = clip_grad_norm_per_seed_(views.stacked, MAX_NORM)
        views.attach_grads(active & torch.isfinite(norms))
        views_opt.step()

    params, buffers = stack_module_state(nets)
    vmap_params = list(params.values())
    vmap_opt = adam(vmap_params)
    base = actor().to("meta")

    def one_seed(p, b, x):
        return functional_call(base, (p, b), (x,))

    forward = vmap(one_seed)

    def vmap_step() -> None:
        vmap_opt.zero_grad()
        ppo_loss(forward(params, buffers, batch["obs"]), batch).sum().backward()
        clip_grad_norm_per_seed_(vmap_params, MAX_NORM)
        vmap_opt.step()

    return {"loop": loop, "stacked": stacked_step, "views": views_step, "vmap": vmap_step}


def gru_calls(S: int) -> dict[str, Callable[[], None]]:
    grus = [nn.GRU(HIDDEN, HIDDEN, batch_first=True) for _ in range(S)]
    stacked = stack_modules(grus)
    x = torch.randn(S, STEP_ROWS, HIDDEN)
    h = torch.randn(S, STEP_ROWS, 1, HIDDEN)
    x_loop = [x[k].unsqueeze(1) for k in range(S)]  # [B, 1, H]
    h_loop = [h[k].transpose(0, 1).contiguous() for k in range(S)]  # [1, B, H]

    @torch.no_grad()
    def loop() -> None:
        for gru, xk, hk in zip(grus, x_loop, h_loop, strict=True):
            gru(xk, hk)

    @torch.no_grad()
    def stacked_step() -> None:
        stacked.step(x, h)

    return {"loop": loop, "stacked": stacked_step}


def act_calls(S: int) -> dict[str, Callable[[], None]]:
    nets = [actor() for _ in range(S)]
    stacked = stack_modules(nets)
    obs = torch.randn(S, STEP_ROWS, OBS)
    obs_loop = [obs[k] for k in range(S)]

    @torch.no_grad()
    def loop() -> None:
        for net, o in zip(nets, obs_loop, strict=True):
            net(o)

    @torch.no_grad()
    def stacked_step() -> None:
        stacked(obs)

    return {"loop": loop, "stacked": stacked_step}


WORKLOADS = {"update": update_calls, "gru step": gru_calls, "mlp act": act_calls}


def calibrate(fn: Callable[[], None], seconds: float, clock: Callable[[], float]) -> int:
    """Calls per measurement so that one takes about ``seconds`` (after two warm-up calls)."""
    fn()
    fn()
    start = clock()
    fn()
    once = max(clock() - start, 1e-6)
    return max(1, int(seconds / once))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--seconds", type=float, default=0.03, help="per measurement")
    parser.add_argument("--quick", action="store_true", help="S = 1, 4, 16; 5 rounds")
    parser.add_argument("--wall", action="store_true", help="wall-clock time, not CPU time")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.rounds = [1, 4, 16], 5
    torch.set_num_threads(1)
    torch.manual_seed(0)
    clock = time.perf_counter if args.wall else time.thread_time

    calls: dict[tuple[str, int, str], tuple[Callable[[], None], int]] = {}
    for workload, build in WORKLOADS.items():
        for S in args.sizes:
            for mode, fn in build(S).items():
                calls[(workload, S, mode)] = (fn, calibrate(fn, args.seconds, clock))
    times: dict[tuple[str, int, str], list[float]] = {key: [] for key in calls}
    for round_index in range(args.rounds):
        order = list(calls) if round_index % 2 == 0 else list(reversed(calls))
        for key in order:
            fn, n = calls[key]
            start = clock()
            for _ in range(n):
                fn()
            times[key].append((clock() - start) / n)

    print(
        f"# seed-batched probe: torch {torch.__version__}, 1 thread, "
        f"{platform.processor() or platform.machine()}, "
        f"{'wall' if args.wall else 'thread CPU'} time, median of {args.rounds} rounds"
    )
    print("# per-seed time (ms) per mode; 'x S=1' = loop at S=1 / this (speed-up per seed)")
    modes = ["loop", "stacked", "views", "vmap"]
    header = f"{'workload':9s} {'S':>3s}"
    for mode in modes:
        header += f" | {mode:>7s} {'x S=1':>6s}"
    print(header)
    for workload in WORKLOADS:
        reference = statistics.median(times[(workload, 1, "loop")]) if 1 in args.sizes else None
        for S in args.sizes:
            line = f"{workload:9s} {S:3d}"
            for mode in modes:
                if (workload, S, mode) not in times:
                    line += f" | {'':7s} {'':6s}"
                    continue
                per_seed = statistics.median(times[(workload, S, mode)]) / S
                ratio = f"{reference / per_seed:5.2f}x" if reference else "     -"
                line += f" | {per_seed * 1e3:7.3f} {ratio:>6s}"
            print(line)


if __name__ == "__main__":
    main()
