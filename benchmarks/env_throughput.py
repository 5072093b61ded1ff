"""Throughput of multisearch_v0 against PettingZoo's MPE simple_spread, measured in one run.

Prints agent-steps per second (env steps x agents, auto-resets included) of

* a ``parallel_env`` loop (one env, dict actions),
* ``vector_env`` at num_envs 1, 64, 256, 1024 (and the large preset at 256),
* websearch_v0 ``parallel_env`` and ``vector_env`` at num_envs 256 and 1024 (default preset),
* mpe2 ``simple_spread_v3`` parallel env (3 agents, 25-step episodes),

all under uniformly random in-range actions drawn ahead of time (so the policy costs nothing),
the ratios to simple_spread, and the memory of ``vector_env(4096, preset="large")`` (peak of
Python/NumPy allocations by tracemalloc over construction, reset, steps, state(), final_obs).

Targets (issue 2 item 8): vector_env(1024) >= 200x simple_spread, parallel_env >= 1x,
vector_env(4096, large) <= 2 GB. websearch_v0 (issue 20 item 4): vector_env(256) of the
default preset >= 100x simple_spread.

    python benchmarks/env_throughput.py            # ~1 minute
    python benchmarks/env_throughput.py --quick    # ~15 seconds
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import tracemalloc
from collections.abc import Callable
from types import ModuleType

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from envs import multisearch_v0, websearch_v0  # noqa: E402

POOL = 64  # pre-drawn action batches, cycled


def _timed(step: Callable[[int], int], seconds: float, warmup: int = 3) -> tuple[float, float]:
    """Runs ``step(i) -> agent_steps`` repeatedly for ``seconds`` of wall time.

    Returns agent-steps per wall second and per CPU second of this process (the latter is
    less sensitive to other processes competing for the cores)."""
    for i in range(warmup):
        step(i)
    done = 0
    i = 0
    start = time.perf_counter()
    start_cpu = time.process_time()
    while True:
        done += step(i)
        i += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            cpu = max(time.process_time() - start_cpu, 1e-9)
            return done / elapsed, done / cpu


def bench_parallel(
    seconds: float, module: ModuleType = multisearch_v0, **kwargs
) -> tuple[float, float]:
    env = module.parallel_env(**kwargs)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    n_actions = [env.action_space(a).n for a in env.possible_agents]
    pool = [
        {a: int(rng.integers(n)) for a, n in zip(env.possible_agents, n_actions, strict=True)}
        for _ in range(POOL)
    ]

    def step(i: int) -> int:
        if not env.agents:
            env.reset()
        env.step(pool[i % POOL])
        return len(env.possible_agents)

    return _timed(step, seconds)


def bench_vector(
    num_envs: int, seconds: float, module: ModuleType = multisearch_v0, **kwargs
) -> tuple[float, float]:
    vec = module.vector_env(num_envs, **kwargs)
    vec.reset(seed=0)
    rng = np.random.default_rng(0)
    pool = [
        {a: rng.integers(0, vec.action_space(a).n, num_envs) for a in vec.possible_agents}
        for _ in range(POOL)
    ]
    per_step = num_envs * len(vec.possible_agents)

    def step(i: int) -> int:
        vec.step(pool[i % POOL])
        return per_step

    return _timed(step, seconds)


def bench_simple_spread(seconds: float) -> tuple[float, float]:
    from mpe2 import simple_spread_v3

    env = simple_spread_v3.parallel_env()
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    agents = list(env.possible_agents)
    pool = [{a: int(rng.integers(env.action_space(a).n)) for a in agents} for _ in range(POOL)]

    def step(i: int) -> int:
        if not env.agents:
            env.reset()
        env.step(pool[i % POOL])
        return len(agents)

    return _timed(step, seconds)


def memory_large(num_envs: int, steps: int) -> tuple[float, float]:
    """(peak MB traced, MB held by the world arrays) of vector_env(num_envs, preset='large')."""
    tracemalloc.start()
    vec = multisearch_v0.vector_env(num_envs, preset="large")
    vec.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(steps):
        actions = {a: rng.integers(0, vec.action_space(a).n, num_envs) for a in vec.possible_agents}
        vec.step(actions)
    vec.state()
    _ = vec.final_obs, vec.final_state
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak / 2**20, vec._core.nbytes() / 2**20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="agent-steps/s of multisearch_v0 (parallel_env, vector_env) vs mpe2 "
        "simple_spread_v3 under random actions, with ratios; memory of vector_env(4096, large)."
    )
    parser.add_argument("--quick", action="store_true", help="short timings (about 15 s)")
    parser.add_argument("--seconds", type=float, default=None, help="seconds per measurement")
    parser.add_argument("--no-memory", action="store_true", help="skip the 4096-env memory run")
    args = parser.parse_args(argv)
    seconds = args.seconds if args.seconds is not None else (0.7 if args.quick else 4.0)

    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, "
        f"python {platform.python_version()}, numpy {np.__version__}"
    )
    print(f"each row: random in-range actions for {seconds:.1f} s (auto-resets included)\n")
    multisearch_v0.vector_env(2).reset(seed=0)  # compile / load the numba cache first

    rows: list[tuple[str, tuple[float, float]]] = []
    reference = bench_simple_spread(seconds)
    rows.append(("mpe2 simple_spread_v3 parallel (3 agents)", reference))
    rows.append(("multisearch_v0 parallel_env (small, 4 agents)", bench_parallel(seconds)))
    for n in (1, 64, 256, 1024):
        rows.append((f"multisearch_v0 vector_env({n}) small", bench_vector(n, seconds)))
    rows.append(
        (
            "multisearch_v0 vector_env(256) large (8 agents)",
            bench_vector(256, seconds, preset="large"),
        )
    )
    warm = websearch_v0.vector_env(2, max_cycles=1)  # compile / load the numba cache first
    warm.reset(seed=0)
    warm.step({a: np.zeros(2, dtype=np.int64) for a in warm.possible_agents})  # an autoreset
    rows.append(
        (
            "websearch_v0 parallel_env (default, 3 agents)",
            bench_parallel(seconds, module=websearch_v0),
        )
    )
    for n in (256, 1024):
        rows.append(
            (
                f"websearch_v0 vector_env({n}) default (3 agents)",
                bench_vector(n, seconds, module=websearch_v0),
            )
        )

    print(f"{'environment':<50}{'agent-steps/s':>15}{'ratio':>9}{'per CPU-s':>14}{'ratio':>9}")
    print(f"{'':<50}{'(wall)':>15}{'':>9}{'(process)':>14}{'':>9}")
    print("-" * 97)
    for name, (wall, cpu) in rows:
        print(
            f"{name:<50}{wall:>15,.0f}{wall / reference[0]:>8.1f}x"
            f"{cpu:>14,.0f}{cpu / reference[1]:>8.1f}x"
        )
    by_name = dict(rows)
    vec = by_name["multisearch_v0 vector_env(1024) small"]
    par = by_name["multisearch_v0 parallel_env (small, 4 agents)"]
    vec_ratio, par_ratio = vec[0] / reference[0], par[0] / reference[0]
    print()
    print(
        f"target vector_env(1024) >= 200x simple_spread (wall): {vec_ratio:.0f}x "
        f"{'MET' if vec_ratio >= 200 else 'MISSED'}; about 1,000,000 agent-steps/s: "
        f"{vec[0]:,.0f} wall, {vec[1]:,.0f} per CPU-second"
    )
    print(
        f"target parallel_env >= 1x simple_spread (wall): {par_ratio:.1f}x "
        f"{'MET' if par_ratio >= 1 else 'MISSED'}"
    )
    web = by_name["websearch_v0 vector_env(256) default (3 agents)"]
    web_ratio = web[0] / reference[0]
    print(
        f"target websearch_v0 vector_env(256) >= 100x simple_spread (wall): {web_ratio:.0f}x "
        f"{'MET' if web_ratio >= 100 else 'MISSED'} ({web[1] / reference[1]:.0f}x per CPU-second)"
    )
    if not args.no_memory:
        peak, arrays = memory_large(4096, steps=2 if args.quick else 5)
        print(
            f"vector_env(4096, preset='large'): peak traced allocations {peak:,.0f} MB "
            f"(world arrays {arrays:,.0f} MB); target <= 2048 MB: "
            f"{'MET' if peak <= 2048 else 'MISSED'}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
