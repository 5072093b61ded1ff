"""Probe: a rollout step's policy forward for S seeds, stacked vs a loop over S policies (issue 37).

The workload is what the collector runs once per env step: ``act`` of the whole
``MultiAgentPolicy`` on 64 envs of the small preset (``envs.multisearch_v0``: 2 scouts with
235 inputs, 2 rescuers with 75; hidden 64), without autograd, the sampling noise drawn in
advance as ``RolloutCollector`` draws it, the recurrent state carried from call to call; and
MAPPO's critic on the 64 global states (1034 inputs, hidden 64).

Modes (seed k sees the same inputs in each):

* ``loop``: S single-seed ``MultiAgentPolicy`` / ``CentralCritic`` called one after another
  (S single-seed runs);
* ``stacked``: one :class:`marl.models.seed_policies.SeedMultiAgentPolicy` /
  :class:`~marl.models.seed_policies.SeedCentralCritic` call for all seeds (mamba and mamba2: the
  unbatched path, which loops over the seeds inside the module).

Every (workload, S, mode) is timed once per round, all of them interleaved, the order
reversed every other round; the time is the calling thread's CPU time (one torch thread,
numba's pool, threading layer and glibc's allocator thresholds set as the trainer
sets them: ``time.thread_time``), the figure the median over rounds of the
time per call divided by S. ``x loop`` is loop / stacked at the same S; ``x S=1`` is the
loop at S=1 (one seed, today's code) / stacked, the speed-up per seed.

    python benchmarks/seed_policies_probe.py                 # S = 1, 4, 16
    python benchmarks/seed_policies_probe.py --quick         # 5 rounds
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# numba's pool sized to the one torch thread, as the trainer sizes it (marl.run.numba_pool)
os.environ.setdefault("NUMBA_NUM_THREADS", "1")

from marl.models.policies import AgentLayout, TypeSpec  # noqa: E402
from marl.models.seed_policies import build_seed_policies, seed_neg_gumbel_noise  # noqa: E402
from seqmodels.kernels.allocator import set_malloc_thresholds  # noqa: E402
from seqmodels.kernels.numba_runtime import (  # noqa: E402
    auto_threading_layer,
    numba_available,
    set_numba_threading_layer,
)

NUM_ENVS, HIDDEN = 64, 64
#: the small preset's layout (``AgentLayout.from_env`` of ``envs.multisearch_v0``)
LAYOUT = AgentLayout(
    agents=("scout_0", "scout_1", "rescuer_0", "rescuer_1"),
    types=(
        TypeSpec("scout", ("scout_0", "scout_1"), (0, 1), 235, 5),
        TypeSpec("rescuer", ("rescuer_0", "rescuer_1"), (2, 3), 75, 6),
    ),
    state_dim=1034,
)
BACKBONES = ("mlp", "gru", "mamba", "mamba2")


def _config(backbone: str) -> SimpleNamespace:
    return SimpleNamespace(
        backbone=backbone, hidden_dim=HIDDEN, activation="tanh", critic_hidden_dim=HIDDEN,
        value_ensemble=1,
    )  # fmt: skip


def _inputs(S: int) -> tuple[dict, dict, dict]:
    """obs, mask ``[S, E, n, ...]`` and noise ``[S, E, n, A]`` per type."""
    obs = {t.name: torch.randn(S, NUM_ENVS, t.n_agents, t.obs_dim) for t in LAYOUT.types}
    mask = {t.name: torch.rand(S, NUM_ENVS, t.n_agents, t.n_actions) < 0.8 for t in LAYOUT.types}
    gens = [torch.Generator().manual_seed(k) for k in range(S)]
    noise = {t.name: seed_neg_gumbel_noise((NUM_ENVS, t.n_agents, t.n_actions), gens)
             for t in LAYOUT.types}  # fmt: skip
    return obs, mask, noise


def act_calls(backbone: str, S: int) -> dict[str, Callable[[], None]]:
    stacked = build_seed_policies(_config(backbone), range(S), LAYOUT, critic=False).policy
    policies = stacked.unstack()
    obs, mask, noise = _inputs(S)
    per_seed = [
        ({n: o[k] for n, o in obs.items()}, {n: m[k] for n, m in mask.items()},
         {n: z[k] for n, z in noise.items()})
        for k in range(S)
    ]  # fmt: skip
    loop_state = [p.initial_state(NUM_ENVS) for p in policies]
    stacked_state = [stacked.initial_state(NUM_ENVS)]

    @torch.no_grad()
    def loop() -> None:
        for k, (policy, (o, m, z)) in enumerate(zip(policies, per_seed, strict=True)):
            _, _, loop_state[k] = policy.act(o, m, loop_state[k], None, neg_gumbel=z)

    @torch.no_grad()
    def stacked_step() -> None:
        _, _, stacked_state[0] = stacked.act(obs, mask, stacked_state[0], None, neg_gumbel=noise)

    return {"loop": loop, "stacked": stacked_step}


def critic_calls(S: int) -> dict[str, Callable[[], None]]:
    stacked = build_seed_policies(_config("mlp"), range(S), LAYOUT, critic=True).critic
    assert stacked is not None
    critics = stacked.unstack()
    state = torch.randn(S, NUM_ENVS, LAYOUT.state_dim)

    @torch.no_grad()
    def loop() -> None:
        for k, critic in enumerate(critics):
            critic(state[k])

    @torch.no_grad()
    def stacked_step() -> None:
        stacked(state)

    return {"loop": loop, "stacked": stacked_step}


def calibrate(fn: Callable[[], None], seconds: float, clock: Callable[[], float]) -> int:
    """Calls per measurement so that one takes about ``seconds`` (after two warm-up calls)."""
    fn()
    fn()
    start = clock()
    fn()
    return max(1, int(seconds / max(clock() - start, 1e-6)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--backbones", nargs="+", default=list(BACKBONES), choices=BACKBONES)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--seconds", type=float, default=0.05, help="per measurement")
    parser.add_argument("--quick", action="store_true", help="5 rounds")
    parser.add_argument("--wall", action="store_true", help="wall-clock time, not CPU time")
    args = parser.parse_args()
    if args.quick:
        args.rounds = 5
    torch.set_num_threads(1)
    torch.manual_seed(0)
    # the process settings of a training run (marl.run.train.configure_process)
    if numba_available():
        set_numba_threading_layer(auto_threading_layer())
    set_malloc_thresholds()
    clock = time.perf_counter if args.wall else time.thread_time
    workloads: dict[str, Callable[[int], dict[str, Callable[[], None]]]] = {
        f"act {b}": (lambda S, b=b: act_calls(b, S)) for b in args.backbones
    }
    workloads["critic"] = critic_calls

    calls: dict[tuple[str, int, str], tuple[Callable[[], None], int]] = {}
    for workload, build in workloads.items():
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
        f"# seed-policies probe: torch {torch.__version__}, 1 thread, "
        f"{platform.processor() or platform.machine()}, {NUM_ENVS} envs, hidden {HIDDEN}, "
        f"{'wall' if args.wall else 'thread CPU'} time, median of {args.rounds} rounds"
    )
    print("# per-seed time (ms) per env step; x loop = loop / stacked at this S; "
          "x S=1 = loop at S=1 / stacked")  # fmt: skip
    print(
        f"{'workload':12s} {'S':>3s} | {'loop':>7s} | {'stacked':>7s} {'x loop':>7s} {'x S=1':>6s}"
    )
    for workload in workloads:
        one = statistics.median(times[(workload, 1, "loop")]) if 1 in args.sizes else None
        for S in args.sizes:
            loop = statistics.median(times[(workload, S, "loop")]) / S
            stacked = statistics.median(times[(workload, S, "stacked")]) / S
            ratio_one = f"{one / stacked:5.2f}x" if one else "     -"
            print(
                f"{workload:12s} {S:3d} | {loop * 1e3:7.3f} | {stacked * 1e3:7.3f} "
                f"{loop / stacked:6.2f}x {ratio_one:>6s}"
            )


if __name__ == "__main__":
    main()
