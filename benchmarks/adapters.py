"""Throughput through the adapter (marl.adapters) against its peers, measured in one run.

Agent-steps per second (env steps x agents, autoresets included) under uniformly random
in-range actions drawn ahead of time (the policy costs nothing), for E copies:

* **multisearch** (small preset): the native ``vector_env(E)`` (the fast path) against the
  adapter over ``parallel_env`` (``make_vector_env("envs.multisearch_v0:parallel_env")``),
  in process and with 2 worker processes;
* **mpe2 simple_spread_v3** (N=3, 25 steps): a plain Python loop over E ``parallel_env``\\ s
  (dict actions, manual resets: the least any batching can cost) against the adapter, in
  process and with 2 worker processes;
* **CartPole-v1** (Gymnasium): a plain loop over E envs against the adapter.

Each figure is the median of 3 timed windows of 2 s (one of 0.7 s with ``--quick``); the
ratios are to the peer measured in the same run. Wall rates and rates per CPU second of this
process are both printed: on a loaded machine the CPU ratio is the steadier one; the workers'
CPU is not this process's, so compare wall rates for them (and only on free cores).

    python benchmarks/adapters.py            # ~1.5 minutes
    python benchmarks/adapters.py --quick    # ~20 seconds
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import gymnasium  # noqa: E402
from mpe2 import simple_spread_v3  # noqa: E402

from envs import multisearch_v0  # noqa: E402
from marl.adapters.envapi import make_vector_env  # noqa: E402

POOL = 32  # pre-drawn action batches, cycled
SPREAD = {"N": 3, "max_cycles": 25}


def timed(step: Callable[[int], int], seconds: float, repeats: int) -> tuple[float, float]:
    """Median over ``repeats`` windows of ``seconds`` of (agent-steps / wall s, / CPU s)."""
    for i in range(3):
        step(i)
    wall, cpu = [], []
    i = 0
    for _ in range(repeats):
        done = 0
        start, start_cpu = time.perf_counter(), time.process_time()
        while time.perf_counter() - start < seconds:
            done += step(i)
            i += 1
        wall.append(done / (time.perf_counter() - start))
        cpu.append(done / max(time.process_time() - start_cpu, 1e-9))
    return float(np.median(wall)), float(np.median(cpu))


def vector_stepper(vec) -> Callable[[int], int]:
    """A step function over any contract vector env with pre-drawn random actions."""
    vec.reset(seed=0)
    rng = np.random.default_rng(0)
    pool = [
        {a: rng.integers(0, vec.action_space(a).n, vec.num_envs) for a in vec.possible_agents}
        for _ in range(POOL)
    ]
    per_step = vec.num_envs * len(vec.possible_agents)

    def step(i: int) -> int:
        vec.step(pool[i % POOL])
        return per_step

    return step


def parallel_loop_stepper(make: Callable[[], object], num_envs: int) -> Callable[[int], int]:
    """A plain loop over ``num_envs`` PettingZoo parallel envs (manual resets)."""
    envs = [make() for _ in range(num_envs)]
    for i, env in enumerate(envs):
        env.reset(seed=i)
    agents = list(envs[0].possible_agents)
    rng = np.random.default_rng(0)
    n_actions = [envs[0].action_space(a).n for a in agents]
    pool = [
        [{a: int(rng.integers(n)) for a, n in zip(agents, n_actions, strict=True)}]
        for _ in range(POOL)
    ]

    def step(i: int) -> int:
        actions = pool[i % POOL][0]
        for env in envs:
            if not env.agents:
                env.reset()
            env.step({a: actions[a] for a in env.agents})
        return num_envs * len(agents)

    return step


def gym_loop_stepper(env_id: str, num_envs: int) -> Callable[[int], int]:
    """A plain loop over ``num_envs`` Gymnasium envs (manual resets)."""
    envs = [gymnasium.make(env_id) for _ in range(num_envs)]
    for i, env in enumerate(envs):
        env.reset(seed=i)
    rng = np.random.default_rng(0)
    pool = rng.integers(0, 2, (POOL, num_envs))

    def step(i: int) -> int:
        for k, env in enumerate(envs):
            _, _, te, tr, _ = env.step(int(pool[i % POOL, k]))
            if te or tr:
                env.reset()
        return num_envs

    return step


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="short windows (~20 s in all)")
    p.add_argument("--num-envs", type=int, default=64, help="copies E (default 64)")
    p.add_argument("--workers", type=int, default=2, help="worker processes to try (default 2)")
    args = p.parse_args(argv)
    seconds, repeats = (0.7, 1) if args.quick else (2.0, 3)
    E, W = args.num_envs, args.workers
    print(
        f"adapter throughput, E={E} copies, random actions; {platform.processor() or '?'} "
        f"({os.cpu_count()} cores), python {platform.python_version()}, numpy {np.__version__}"
    )

    def measure(
        group: str,
        name: str,
        make_step: Callable[[], Callable[[int], int]],
        peer: tuple[float, float] | None,
    ) -> tuple[float, float]:
        wall, cpu = timed(make_step(), seconds, repeats)
        wall_ratio = f"{wall / peer[0]:.3f}x" if peer else "1.000x"
        # the CPU of worker processes is not this process's: no CPU ratio for them
        cpu_ratio = "n/a" if "workers" in name else (f"{cpu / peer[1]:.3f}x" if peer else "1.000x")
        print(
            f"  {group:<12} {name:<34} {wall:>11,.0f} {cpu:>11,.0f} {wall_ratio:>8} {cpu_ratio:>8}",
            flush=True,
        )
        return wall, cpu

    print(
        f"  {'env':<12} {'path':<34} {'wall a-s/s':>11} {'cpu a-s/s':>11} {'wall/peer':>8} "
        f"{'cpu/peer':>8}"
    )
    closers = []

    def adapted(env_fn: str, kwargs: dict) -> Callable[[int], int]:
        vec = make_vector_env(env_fn, E, kwargs)
        closers.append(vec)
        return vector_stepper(vec)

    peer = measure(
        "multisearch",
        "native vector_env (peer)",
        lambda: vector_stepper(multisearch_v0.vector_env(E)),
        None,
    )
    measure(
        "multisearch",
        "adapter(parallel_env)",
        lambda: adapted("envs.multisearch_v0:parallel_env", {}),
        peer,
    )
    measure(
        "multisearch",
        f"adapter(parallel_env), {W} workers",
        lambda: adapted("envs.multisearch_v0:parallel_env", {"adapter_workers": W}),
        peer,
    )
    peer = measure(
        "spread",
        "loop over parallel_env (peer)",
        lambda: parallel_loop_stepper(lambda: simple_spread_v3.parallel_env(**SPREAD), E),
        None,
    )
    fn = "mpe2.simple_spread_v3:parallel_env"
    measure("spread", "adapter(parallel_env)", lambda: adapted(fn, SPREAD), peer)
    measure(
        "spread",
        f"adapter(parallel_env), {W} workers",
        lambda: adapted(fn, {**SPREAD, "adapter_workers": W}),
        peer,
    )
    peer = measure(
        "cartpole",
        "loop over gymnasium envs (peer)",
        lambda: gym_loop_stepper("CartPole-v1", E),
        None,
    )
    measure(
        "cartpole",
        "adapter(gymnasium:make)",
        lambda: adapted("gymnasium:make", {"id": "CartPole-v1"}),
        peer,
    )
    for vec in closers:
        vec.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
