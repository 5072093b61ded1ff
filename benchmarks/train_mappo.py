"""MAPPO benchmarks: end-to-end training throughput and learning runs, with peers.

Throughput (one process, same run): agent-steps per second of

- ``env``: the vector env stepped with uniformly random *allowed* actions (the ceiling),
- ``rollout``: :class:`marl.rollout.collect.RolloutCollector` with the MAPPO actors and critic,
- ``train``: full MAPPO iterations (rollout + advantages + policy and value updates),
- ``train-seq``: the same with ``--parallel-update false`` (the update's independent parts, the
  critic's epochs and each agent type's actor, one after another instead of in threads;
  identical results), alternating with ``train``,

printed with the ratios train/env, train/rollout and parallel/sequential::

    python benchmarks/train_mappo.py throughput [--updates 8] [--num-envs E] [--threads 1]

Backbones side by side (one process, interleaved, medians): end-to-end MAPPO iterations of
each backbone at its own defaults (``marl.algos.mappo.BACKBONE_DEFAULTS``) and, with
``--same-window``, at gru's window too, as agent-steps/s and ratios to the first backbone;
then the update phase alone (advantages, policy and value epochs on one stored rollout of
``--update-rollout`` steps) at each of ``--windows``::

    python benchmarks/train_mappo.py backbones [--backbones gru mamba mamba2] [--updates 4] \
        [--windows 16 64 256 1024] [--update-envs 16] -- --env.preset memory

Peak memory of one long-window update (a fresh process per rollout length T = seq_len,
``ru_maxrss`` before and after, optional ``--tbptt-chunk``)::

    python benchmarks/train_mappo.py memory [--lengths 512 1024 2048] [--backbone mamba] \
        [--num-envs 8] [-- extra train flags]

Many seeds at once (issue 37): training throughput of seeds 0..S-1 batched in one process,
:class:`marl.algos.mappo.SeedMAPPO`, or :class:`marl.algos.grpo.SeedGRPO` when the
train flags after ``--`` say ``--algo grpo``, for each S of ``--sizes`` (S=1 always), as
agent-steps/s summed over the seeds (each seed's ``env_steps_delta`` summed over the timed
iterations, times the agents, over the seconds: GRPO's env steps per iteration vary with its
episodes), per seed, the ratio to S=1, agent-steps per CPU-second and peak RSS; each run in a
fresh process (so a size's RSS is its own), one warm-up iteration and ``--updates`` timed ones,
``--rounds`` rounds with the sizes' order alternating, medians. Today's single-seed trainer
(:class:`marl.algos.mappo.MAPPO` or :class:`marl.algos.grpo.GRPO`, seed 0, same flags) runs
back to back with S=1 in every round: the ratio "S=1 new / single-seed" (target >= 0.9). Then
the phase profile (``time/collect_s``, ``time/update_s``) of the largest S <= 16::

    python benchmarks/train_mappo.py seeds [--backbone mlp] [--sizes 1 4 16 64] \
        [--updates 3] [--rounds 2] [--threads 1] [-- extra train flags, e.g. --env.preset memory]
    python benchmarks/train_mappo.py seeds --sizes 1 4 16 -- --algo grpo --env.preset small

numba's thread pool is sized to ``--threads`` (``NUMBA_NUM_THREADS``, unless already set in
the environment) before anything imports numba: with a pool larger than the threads torch
uses, every parallel kernel of a rollout step hands its work to a pool thread, and on a
loaded machine the wake-ups cost more than the kernels (10-30x slower Mamba iterations on the
shared 2-core box).

Learning: ``python -m marl.train`` runs (subprocesses, one after another) for several seeds,
then the scripted heuristic and the random policy on the same validation seeds; prints the
success rates and the ratios to the baselines, and writes the learning curves (validation
success against wall time) as a PNG::

    python benchmarks/train_mappo.py learn --max-time 900 --seeds 0 1 2 \
        [--out runs/bench] [--png docs/results/mappo_small.png] [-- extra train flags]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from marl.run.numba_pool import size_numba_pool  # noqa: E402  (imports neither numba nor torch)


def _random_allowed(obs, agents, rng):
    out = {}
    for a in agents:
        mask = obs[a]["action_mask"].astype(bool)
        scores = rng.random(mask.shape) * mask
        out[a] = scores.argmax(1)
    return out


def throughput(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    from marl.algos.mappo import MAPPO
    from marl.run.config import parse_cli
    from marl.run.train import configure_process

    sizes = [] if args.num_envs is None else ["--num-envs", str(args.num_envs)]
    if args.rollout_steps is not None:
        sizes += ["--rollout-steps", str(args.rollout_steps)]
    cfg = parse_cli(
        [
            *sizes,
            "--progress",
            "false",
            "--torch-threads",
            str(args.threads),
            *args.extra,
        ]
    )
    configure_process(cfg)  # as the trainer does: numba's layer, glibc's thresholds
    torch.manual_seed(0)
    algo = MAPPO(cfg, None)
    n_agents = algo.layout.n_agents
    vec = algo.vec
    # env ceiling
    rng = np.random.default_rng(0)
    obs = algo.collector.obs[0]  # the one run's observations
    steps = args.updates * cfg.rollout_steps
    t = time.perf_counter()
    for _ in range(steps):
        obs, *_ = vec.step(_random_allowed(obs, vec.possible_agents, rng))
    env_sps = steps * cfg.num_envs * n_agents / (time.perf_counter() - t)
    algo.collector.obs[0] = obs
    algo.iteration(0.0)  # warm-up
    t = time.perf_counter()
    for _ in range(args.updates):
        algo.collector.collect(cfg.rollout_steps, value_fn=algo.values)
    roll_sps = steps * cfg.num_envs * n_agents / (time.perf_counter() - t)
    # full iterations, alternating the parallel update (critic epochs and each agent type's
    # actor in threads, the default) with the sequential one (same maths) as the same-run peer,
    # in blocks of 1 unmeasured + 2 measured iterations
    modes = (True, False) if cfg.parallel_update else (False,)
    actor_parallel = algo.policy_update.parallel  # False for backbones that must not share
    elapsed = dict.fromkeys(modes, 0.0)
    measured = dict.fromkeys(modes, 0)
    parts = {"collect": 0.0, "update": 0.0}
    i, planned = 0, 3 * len(modes) * -(-args.updates // 2)  # iterations, for the schedules
    while min(measured.values()) < args.updates:
        for parallel in modes:
            algo.parallel = parallel
            algo.policy_update.parallel = parallel and actor_parallel
            for k in range(3):
                t = time.perf_counter()
                m = algo.iteration(min(i / planned, 1.0))
                i += 1
                if k == 0 or measured[parallel] >= args.updates:
                    continue
                elapsed[parallel] += time.perf_counter() - t
                measured[parallel] += 1
                if parallel == modes[0]:
                    parts["collect"] += m["time/collect_s"]
                    parts["update"] += m["time/update_s"]
    dt = elapsed[modes[0]]
    train_sps = steps * cfg.num_envs * n_agents / dt
    seq_sps = steps * cfg.num_envs * n_agents / elapsed[False]
    print(
        f"config: E={cfg.num_envs} T={cfg.rollout_steps} agents={n_agents} "
        f"backbone={cfg.backbone} epochs={cfg.epochs} minibatches={cfg.num_minibatches} "
        f"torch threads={args.threads} env={cfg.env or 'small preset'}"
    )
    print(f"{'measure':<10}{'agent-steps/s':>16}")
    print(f"{'env':<10}{env_sps:>16,.0f}")
    print(f"{'rollout':<10}{roll_sps:>16,.0f}")
    if cfg.parallel_update:
        print(f"{'train':<10}{train_sps:>16,.0f}   (parallel update, the default)")
        print(f"{'train-seq':<10}{seq_sps:>16,.0f}   (--parallel-update false)")
    else:
        print(f"{'train':<10}{train_sps:>16,.0f}")
    print(
        f"ratio train/env = {train_sps / env_sps:.3f}, train/rollout = "
        f"{train_sps / roll_sps:.3f}; time split collect {parts['collect'] / dt:.0%}, "
        f"update {parts['update'] / dt:.0%}"
        + (f"; parallel/sequential = {train_sps / seq_sps:.2f}x" if cfg.parallel_update else "")
    )


def _median(xs: list[float]) -> float:
    return float(np.median(xs)) if xs else float("nan")


def _train_config(backbone: str, extra: list[str], threads: int, *more: str):
    """The validated train config of ``--backbone backbone`` with ``more`` and then ``extra``
    (the flags after ``--``, which override) as ``python -m marl.train`` would build it."""
    from marl.run.config import parse_cli

    return parse_cli(
        ["--backbone", backbone, "--progress", "false", "--torch-threads", str(threads)]
        + list(more)
        + list(extra)
    )


def _make_algo(backbone: str, extra: list[str], threads: int, *more: str):
    from marl.algos.mappo import MAPPO
    from marl.run.train import configure_process

    cfg = _train_config(backbone, extra, threads, *more)
    configure_process(cfg)  # as the trainer does (the first call decides numba's layer)
    return MAPPO(cfg, None)


def backbones(args: argparse.Namespace) -> None:
    """Backbones side by side: end-to-end iterations, then the update phase per window."""
    import torch

    torch.set_num_threads(args.threads)
    names = list(args.backbones)
    base = names[0]
    # ---- end-to-end, each backbone at its own defaults (and at the first one's window)
    setups: list[tuple[str, str, list[str]]] = [(b, "own defaults", []) for b in names]
    if args.same_window:
        ref = _make_algo(base, args.extra, args.threads).cfg
        window = ["--rollout-steps", str(ref.rollout_steps), "--seq-len", str(ref.seq_len)]
        setups += [(b, f"T={ref.rollout_steps} L={ref.seq_len}", window) for b in names[1:]]
    torch.manual_seed(0)
    algos = [_make_algo(b, args.extra, args.threads, *more) for b, _, more in setups]
    rates: list[dict[str, list[float]]] = [
        {"train": [], "collect": [], "update": []} for _ in algos
    ]
    for round_ in range(args.updates + 1):  # round 0 warms up (numba compiles)
        for algo, rate in zip(algos, rates, strict=True):
            t = time.perf_counter()
            m = algo.iteration(min(round_ / (args.updates + 1), 1.0))
            dt = time.perf_counter() - t
            if round_ == 0:
                continue
            n = m["env_steps_delta"] * algo.layout.n_agents
            rate["train"].append(n / dt)
            rate["collect"].append(n / m["time/collect_s"])
            rate["update"].append(n / m["time/update_s"])
    cfg0 = algos[0].cfg
    print(
        f"end-to-end: {args.updates} iterations each, interleaved, medians; E={cfg0.num_envs} "
        f"agents={algos[0].layout.n_agents} torch threads={args.threads} "
        f"numba threads={os.environ.get('NUMBA_NUM_THREADS')} env={cfg0.env or 'small preset'}"
    )
    print(
        f"{'backbone':<9}{'window':>22}{'train/s':>11}{'x ' + base:>9}"
        f"{'rollout/s':>11}{'x ' + base:>9}{'update/s':>11}{'x ' + base:>9}"
    )
    med = [{k: _median(v) for k, v in r.items()} for r in rates]
    for (b, label, _), algo, m in zip(setups, algos, med, strict=True):
        c = algo.cfg
        win = f"T={c.rollout_steps} L={c.seq_len}" + (" (own)" if label == "own defaults" else "")
        print(
            f"{b:<9}{win:>22}{m['train']:>11,.0f}{m['train'] / med[0]['train']:>9.2f}"
            f"{m['collect']:>11,.0f}{m['collect'] / med[0]['collect']:>9.2f}"
            f"{m['update']:>11,.0f}{m['update'] / med[0]['update']:>9.2f}"
        )
    del algos
    # ---- the update phase alone, per window, on one stored rollout per backbone
    T = max(args.update_rollout, max(args.windows))
    step = min(args.windows)
    more = ["--rollout-steps", str(T), "--seq-len", str(step), "--num-envs", str(args.update_envs)]
    torch.manual_seed(0)
    upd = [_make_algo(b, args.extra, args.threads, *more) for b in names]
    batches = []
    for algo in upd:
        algo.policy.eval()
        with torch.no_grad():
            batches.append(
                algo.collector.collect(
                    T, value_fn=algo.values, window_state_steps=list(range(0, T, step))
                )
            )
        algo.policy.train()
    times: dict[tuple[int, int], list[float]] = {}
    for window in args.windows:
        for algo in upd:
            algo.cfg.seq_len = window
        for rep in range(args.repeats + 1):
            for i, (algo, batch) in enumerate(zip(upd, batches, strict=True)):
                t = time.perf_counter()
                algo.update(batch, 0.5)
                if rep > 0:  # the first pass of each window warms up
                    times.setdefault((window, i), []).append(time.perf_counter() - t)
    print(
        f"\nupdate phase: one rollout T={T} E={args.update_envs}, windows (seq_len) below, "
        f"{args.repeats} updates each, interleaved, medians (agent-steps per second of update)"
    )
    print(f"{'window':<8}" + "".join(f"{b:>12}{'x ' + base:>9}" for b in names))
    steps = T * args.update_envs * upd[0].layout.n_agents
    for window in args.windows:
        row = [steps / _median(times[(window, i)]) for i in range(len(names))]
        print(f"{window:<8}" + "".join(f"{r:>12,.0f}{r / row[0]:>9.2f}" for r in row))


def _memory_child(args: argparse.Namespace) -> None:
    """One long-window update in this process; prints the peak RSS before and after."""
    import resource

    import torch

    torch.set_num_threads(args.threads)
    T = args.lengths[0]
    more = ["--rollout-steps", str(T), "--seq-len", str(T), "--num-envs", str(args.num_envs)]
    torch.manual_seed(0)

    def peak() -> float:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # MiB (Linux: KiB)

    algo = _make_algo(args.backbone, args.extra, args.threads, *more)
    built = peak()
    algo.iteration(0.0)  # warm up at the same size: kernels compiled, buffers allocated once
    before = peak()
    batch = algo.collect()
    after_collect = peak()
    algo.update(batch, 0.5)
    out = {"T": T, "built": built, "before": before, "collect": after_collect, "update": peak()}
    print(json.dumps(out))


def memory(args: argparse.Namespace) -> None:
    """Peak RSS of one rollout + update per T (seq_len = T), each in a fresh process."""
    rows = []
    for T in args.lengths:
        cmd = [sys.executable, os.path.abspath(__file__), "memory", "--child", "--lengths",
               str(T), "--backbone", args.backbone, "--num-envs", str(args.num_envs),
               "--threads", str(args.threads), "--", *args.extra]  # fmt: skip
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(
        f"peak RSS (MiB), backbone={args.backbone} E={args.num_envs} seq_len=T, after a "
        f"warm-up iteration at the same size; extra flags {args.extra or 'none'}"
    )
    print(f"{'T':>6}{'built':>8}{'1st iteration':>15}{'collect':>9}{'update':>8}{'growth':>8}")
    for r in rows:
        print(
            f"{r['T']:>6}{r['built']:>8.0f}{r['before']:>15.0f}{r['collect']:>9.0f}"
            f"{r['update']:>8.0f}{r['update'] - r['built']:>8.0f}"
        )


# ---- seeds: multi-seed training throughput of SeedMAPPO / SeedGRPO ------------------------

#: the child that runs today's single-seed trainer (MAPPO or GRPO) as the reference
_REFERENCE = "single"


_SEEDS_HELP = """\
Training throughput of many seeds at once (python -m marl.train --seeds): seeds 0..S-1
trained together in one process, for each S of --sizes, by marl.algos.mappo.SeedMAPPO,
or by marl.algos.grpo.SeedGRPO when the train flags after -- hold --algo grpo.

For each S a fresh process (this script, hidden option --child S) builds the batch with one
config per seed (the train flags after --, seed k for seed k), runs one untimed warm-up
iteration (numba kernels, buffers) and then --updates timed iterations (MAPPO: one rollout of
T x E env steps per seed and the update on it; GRPO: every seed's groups of whole episodes
and the update on them). Today's single-seed trainer, marl.algos.mappo.MAPPO or
marl.algos.grpo.GRPO with the same flags and seed 0, runs the same way in its own process,
back to back with S=1. --rounds rounds go over all runs, the order of the sizes alternating
(small to large, then large to small), and the figures are medians over the rounds.

Agent-steps: each seed's env steps of its timed iterations (the metrics' env_steps_delta,
summed over the seeds and iterations; GRPO's vary with its episodes) times the agents.

Printed (stdout; progress per run on stderr):
  table, one row per S:
    agent-steps/s   summed over the seeds: agent-steps / wall seconds
    per seed/s      the same divided by S
    x S=1           agent-steps/s relative to S=1 (what batching S seeds buys)
    per cpu-s       agent-steps per CPU second of the process (all its threads): less
                    sensitive than wall time to other jobs on a shared machine
    peak RSS MiB    ru_maxrss of the run's process at its end (that S alone)
  the single-seed reference (MAPPO or GRPO), and the ratio S=1 new / single-seed (median of
  the rounds' back-to-back pairs, wall and cpu; target >= 0.9);
  phase profile: seconds per iteration in the rollout (time/collect_s), the update
  (time/update_s) and the rest, mean over the timed iterations, for the single-seed
  reference, S=1 and the largest S <= 16;
  with --profile, what bounds it: one more iteration of the reference and of that S under
  torch.profiler, split into env steps, rollout forwards, update GEMMs, optimizer and the rest
  (Python and small operators), the GEMMs against their compute floor (their FLOPs at this
  process's measured GEMM rate).

Refused up front (argparse errors): --seed/--seeds/--resume after --, and the options the
batch cannot train (marl.algos.seeds.unsupported_with_seeds).

torch runs --threads intra-op threads; numba's pool is sized to --threads unless
NUMBA_NUM_THREADS is set (see the module docstring: python benchmarks/train_mappo.py -h).

examples:
  python benchmarks/train_mappo.py seeds --sizes 1 4 16 --updates 3 --rounds 2
  python benchmarks/train_mappo.py seeds --backbone gru --sizes 1 4 16 --updates 2 \\
      --rounds 1 -- --env.preset memory
  python benchmarks/train_mappo.py seeds --backbone mamba2 --sizes 1 4 16 --updates 1 \\
      --rounds 1 -- --env.preset memory
  python benchmarks/train_mappo.py seeds --sizes 1 4 16 --updates 2 -- --algo grpo \\
      --env.preset small
"""


def _positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"invalid value {value}: must be an integer >= 1")
    return value


def _seeds_config(args: argparse.Namespace):
    """The train config of the ``seeds`` subcommand (seed 0), from its flags."""
    return _train_config(args.backbone, args.extra, args.threads)


def _seeds_classes(cfg) -> tuple[type, type]:
    """(the single-seed trainer, the batch over seeds) of ``cfg.algo``, as ``marl.train
    --seeds`` picks them: SeedGRPO for GRPO and its subclasses, SeedMAPPO otherwise."""
    from marl.algos.base import resolve_algorithm

    algorithm = resolve_algorithm(cfg.algo)
    return algorithm, algorithm.batch_class()


def _check_seeds_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse, as argparse errors, what the children would fail on only after minutes."""
    for flag in args.extra:
        if flag.split("=", 1)[0] in ("--seed", "--seeds", "--resume"):
            parser.error(f"{flag.split('=', 1)[0]} after --: the seeds are 0..S-1 for each S")
    from marl.algos.seeds import unsupported_with_seeds
    from marl.run.config import ConfigError

    try:
        cfg = _seeds_config(args)
    except ConfigError as exc:
        parser.error(f"extra train flags after --: {exc}")
    problems = unsupported_with_seeds(cfg)
    if problems:
        parser.error("; ".join(problems))


def _seeds_child(args: argparse.Namespace) -> None:
    """One run in this (fresh) process: ``--child S`` trains seeds 0..S-1 with the batch
    (SeedMAPPO or SeedGRPO), ``--child single`` seed 0 with the single-seed trainer; one
    warm-up iteration, then ``--updates`` timed ones; prints one JSON line with the figures."""
    import copy
    import resource

    import torch

    torch.set_num_threads(args.threads)
    from marl.run.train import _seed_everything, configure_process

    cfg = _seeds_config(args)
    cfg.seed = 0
    configure_process(cfg)  # as the trainer does: numba's layer, glibc's thresholds
    algorithm, batched = _seeds_classes(cfg)
    if args.child == _REFERENCE:
        S = 1
        _seed_everything(cfg.seed)  # as marl.run.train seeds a single-seed run
        algo = algorithm(cfg, None)

        def iteration(progress: float) -> list[dict[str, float]]:
            return [algo.iteration(progress)]
    else:
        S = int(args.child)
        cfgs = []
        for k in range(S):
            one = copy.copy(cfg)  # as marl.run.train_seeds builds seed k's config
            one.seed = k
            cfgs.append(one)
        algo = batched(cfgs, "cpu", algorithm=algorithm)
        iteration = algo.iteration
    built = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # MiB (Linux: KiB)
    planned = args.updates + 1
    iteration(0.0)  # warm-up: numba kernels loaded, buffers allocated
    wall = cpu = collect = update = env_steps = 0.0
    for i in range(1, planned):
        t, c = time.perf_counter(), time.process_time()
        rows = iteration(i / planned)
        wall += time.perf_counter() - t
        cpu += time.process_time() - c
        env_steps += sum(r.get("env_steps_delta", 0.0) for r in rows)  # {}: a stopped seed
        row = next((r for r in rows if r), {})
        collect += row.get("time/collect_s", float("nan"))
        update += row.get("time/update_s", float("nan"))
    n_agents = algo.layout.n_agents
    steps = env_steps * n_agents
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # before any profile
    profiled = None
    if args.profile:
        vecs = [algo.vec] if args.child == _REFERENCE else [r.vec for r in algo.runs]
        # the object whose update the iteration calls: a plain run's trainer (a batch of one)
        trainer = algo.trainer if args.child == _REFERENCE else algo
        profiled = _profile_iteration(trainer, iteration, vecs, args.updates / planned)
    out = {
        "profile": profiled,
        "run": args.child,
        "S": S,
        "algo": algorithm.__name__,
        "batch": batched.__name__,
        "sps": steps / wall,
        "cpu_sps": steps / cpu,
        "env_steps_per_seed_iteration": env_steps / (S * args.updates),
        "iteration_s": wall / args.updates,
        "collect_s": collect / args.updates,
        "update_s": update / args.updates,
        "rss_built_mib": built,
        "rss_mib": rss,
        "E": cfg.num_envs,
        "T": getattr(cfg, "rollout_steps", None),
        "group_size": getattr(cfg, "group_size", None),
        "n_agents": n_agents,
        "backbone": cfg.backbone,
        "env": cfg.env or "small preset",
        "parallel_update": bool(cfg.parallel_update),
        "numba_threads": os.environ.get("NUMBA_NUM_THREADS"),
    }
    print(json.dumps(out), flush=True)


#: the GEMM operators (forward and backward) whose time and FLOPs the profile counts
_GEMMS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


def _gemm_rate(size: int = 256, repeats: int = 200) -> float:
    """This process's measured float32 GEMM rate (FLOP/s) on ``size``-square matrices."""
    import torch

    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b  # warm-up
    t = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return 2 * size**3 * repeats / (time.perf_counter() - t)


def _profile_iteration(algo, iteration, vecs, progress: float) -> dict:
    """One more iteration under ``torch.profiler`` (which adds overhead: read the shares;
    ``algo``: the batch whose ``update`` the iteration calls):
    seconds in the envs' ``step`` (timed around each vec), the rollout's forwards (the rest
    of the collection), and in the update its GEMMs, its optimizer steps and the rest
    (Python and the other small operators); each GEMM phase's compute floor is its FLOPs at
    this process's measured GEMM rate (:func:`_gemm_rate`)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    env = [0.0]

    def timed(step):
        def run(*a, **k):
            t = time.perf_counter()
            try:
                return step(*a, **k)
            finally:
                env[0] += time.perf_counter() - t

        return run

    for vec in vecs:
        vec.step = timed(vec.step)
    update = algo.update

    def marked(*a, **k):
        with record_function("bench:update"):
            return update(*a, **k)

    algo.update = marked
    with profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
        t = time.perf_counter()
        iteration(progress)
        wall = time.perf_counter() - t
    algo.update = update
    for vec in vecs:
        del vec.step  # the class's method again
    events = list(prof.events())
    mark = next(e for e in events if e.name == "bench:update")
    lo, hi = mark.time_range.start, mark.time_range.end

    def inside(e) -> bool:
        return lo <= e.time_range.start and e.time_range.end <= hi

    gemms = [e for e in events if e.name in _GEMMS]
    rate = _gemm_rate()
    update_s = (hi - lo) / 1e6
    gemm_s = sum(e.self_cpu_time_total for e in gemms if inside(e)) / 1e6
    optimizer_s = (
        sum(e.cpu_time_total for e in events if e.name.startswith("Optimizer.step") and inside(e))
        / 1e6
    )
    collect_s = wall - update_s
    return {
        "wall_s": wall,
        "env_s": env[0],
        "rollout_forward_s": collect_s - env[0],
        "rollout_gemm_floor_s": sum(e.flops or 0 for e in gemms if not inside(e)) / rate,
        "update_s": update_s,
        "update_gemm_s": gemm_s,
        "update_gemm_floor_s": sum(e.flops or 0 for e in gemms if inside(e)) / rate,
        "optimizer_s": optimizer_s,
        "update_other_s": update_s - gemm_s - optimizer_s,
        "gemm_gflops": rate / 1e9,
    }


def _run_seeds_child(args: argparse.Namespace, run: str, profile: bool = False) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "seeds", "--child", run,
           "--backbone", args.backbone, "--updates", str(args.updates),
           "--threads", str(args.threads), *(["--profile"] if profile else []),
           "--", *args.extra]  # fmt: skip
    t = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        tail = "\n".join(out.stderr.strip().splitlines()[-20:])
        raise SystemExit(f"seeds: the run {run!r} failed (exit {out.returncode}):\n{tail}")
    row = json.loads(out.stdout.strip().splitlines()[-1])
    print(
        f"  {'S=' + run if run != _REFERENCE else 'single-seed ' + row['algo']:<18}"
        f"{row['sps']:>12,.0f} agent-steps/s  {row['rss_mib']:>7.0f} MiB  "
        f"({time.perf_counter() - t:.0f}s with start-up)",
        file=sys.stderr,
        flush=True,
    )
    return row


def seeds(args: argparse.Namespace) -> None:
    """Multi-seed throughput of SeedMAPPO or SeedGRPO per S, each run in a fresh process (peak
    RSS of that S alone), rounds alternating the order of the sizes, medians over the rounds;
    today's single-seed trainer back to back with S=1 in every round."""
    sizes = sorted(set(args.sizes) | {1})  # S=1 is the reference of the ratios
    runs = [_REFERENCE, *(str(s) for s in sizes)]
    profiled = max(s for s in sizes if s <= 16)
    rows: dict[str, list[dict]] = {run: [] for run in runs}
    for round_ in range(args.rounds):
        # even rounds small to large, odd rounds large to small: the reference and S=1
        # stay back to back, and a drift of the machine's load hits every size alike
        order = runs if round_ % 2 == 0 else runs[::-1]
        print(f"round {round_ + 1}/{args.rounds}:", file=sys.stderr, flush=True)
        for run in order:
            profile = args.profile and round_ == 0 and run in (_REFERENCE, str(profiled))
            rows[run].append(_run_seeds_child(args, run, profile))

    def med(run: str, key: str) -> float:
        return _median([r[key] for r in rows[run]])

    first = rows["1"][0]
    single = f"single-seed {first['algo']}"
    if first["T"] is not None:
        shape = f"E={first['E']} T={first['T']}"
    else:  # GRPO: whole episodes, their length varies
        shape = (
            f"E={first['E']} group_size={first['group_size']} (whole episodes: env steps per "
            f"seed and iteration {med('1', 'env_steps_per_seed_iteration'):,.0f} at S=1)"
        )
    print(
        f"seeds: {first['batch']}, seeds 0..S-1 in one process; backbone={first['backbone']} "
        f"{shape} agents={first['n_agents']} env={first['env']} "
        f"parallel_update={first['parallel_update']}; torch threads={args.threads} numba "
        f"threads={first['numba_threads']}; {args.updates} timed iterations after 1 warm-up, "
        f"a fresh process per run, {args.rounds} round(s), medians; extra flags "
        f"{' '.join(args.extra) or 'none'}"
    )
    print(
        f"{'S':>5}{'agent-steps/s':>15}{'per seed/s':>12}{'x S=1':>8}"
        f"{'per cpu-s':>12}{'peak RSS MiB':>14}"
    )
    base = med("1", "sps")
    for s in sizes:
        sps = med(str(s), "sps")
        print(
            f"{s:>5}{sps:>15,.0f}{sps / s:>12,.0f}{sps / base:>8.2f}"
            f"{med(str(s), 'cpu_sps'):>12,.0f}{med(str(s), 'rss_mib'):>14.0f}"
        )
    paired = [n["sps"] / r["sps"] for n, r in zip(rows["1"], rows[_REFERENCE], strict=True)]
    paired_cpu = [
        n["cpu_sps"] / r["cpu_sps"] for n, r in zip(rows["1"], rows[_REFERENCE], strict=True)
    ]
    module = "mappo" if first["algo"] == "MAPPO" else "grpo" if first["algo"] == "GRPO" else None
    where = f"marl.algos.{module}.{first['algo']}, " if module else ""
    print(
        f"{single} ({where}seed 0): {med(_REFERENCE, 'sps'):,.0f} "
        f"agent-steps/s, {med(_REFERENCE, 'cpu_sps'):,.0f} per cpu-s, peak RSS "
        f"{med(_REFERENCE, 'rss_mib'):.0f} MiB"
    )
    print(
        f"ratio S=1 new / {single}: {_median(paired):.3f} wall, "
        f"{_median(paired_cpu):.3f} cpu (median of the rounds' back-to-back pairs; "
        f"target >= 0.9)"
    )
    print(
        f"\nphase profile: seconds per iteration (time/collect_s, time/update_s of the "
        f"metrics), mean over the timed iterations, median over the rounds; S={profiled} is "
        f"the largest S <= 16"
    )
    print(
        f"{'run':<18}{'iteration':>10}{'collect':>9}{'update':>9}{'other':>8}"
        f"{'collect%':>10}{'update%':>9}{'collect/seed':>14}{'update/seed':>13}"
    )
    for run in dict.fromkeys([_REFERENCE, "1", str(profiled)]):
        it, co, up = med(run, "iteration_s"), med(run, "collect_s"), med(run, "update_s")
        S = rows[run][0]["S"]
        label = single if run == _REFERENCE else f"S={run}"
        print(
            f"{label:<18}{it:>10.3f}{co:>9.3f}{up:>9.3f}{it - co - up:>8.3f}"
            f"{co / it:>10.0%}{up / it:>9.0%}{co / S:>14.4f}{up / S:>13.4f}"
        )
    if args.profile:
        _print_bounds(rows, profiled, single)


def _print_bounds(rows: dict[str, list[dict]], profiled: int, single: str) -> None:
    """What bounds the profiled runs: each phase's share of one profiled iteration, and the
    GEMM phases against their compute floor."""
    first = rows[str(profiled)][0]["profile"]
    print(
        f"\nwhat bounds it (--profile: one more iteration under torch.profiler, round 1; "
        f"shares of that iteration; floor = the phase's GEMM FLOPs at the measured "
        f"{first['gemm_gflops']:.1f} GFLOP/s of a 256^3 float32 GEMM)"
    )
    print(
        f"{'run':<18}{'env':>7}{'rollout fwd':>13}{'upd GEMM':>10}{'optimizer':>11}"
        f"{'upd other':>11}{'upd GEMM / floor':>18}{'rollout floor%':>16}"
    )
    for run in dict.fromkeys([_REFERENCE, str(profiled)]):
        p = rows[run][0]["profile"]
        w = p["wall_s"]
        label = single if run == _REFERENCE else f"S={run}"
        floor = p["update_gemm_floor_s"]
        print(
            f"{label:<18}{p['env_s'] / w:>7.0%}{p['rollout_forward_s'] / w:>13.0%}"
            f"{p['update_gemm_s'] / w:>10.0%}{p['optimizer_s'] / w:>11.0%}"
            f"{p['update_other_s'] / w:>11.0%}"
            f"{(p['update_gemm_s'] / floor if floor else float('nan')):>17.1f}x"
            f"{p['rollout_gemm_floor_s'] / w:>16.1%}"
        )


def learn(args: argparse.Namespace) -> None:
    from envs.baselines import evaluate_baseline
    from marl.run.runlog import read_metrics

    os.makedirs(args.out, exist_ok=True)
    results = {}
    curves = {}
    env_kw: dict = {}
    procs = {}
    t0 = time.time()
    for seed in args.seeds:
        run = os.path.join(args.out, f"seed{seed}")
        cmd = [
            sys.executable,
            "-m",
            "marl.train",
            "--algo",
            "mappo",
            "--max-time",
            str(args.max_time),
            "--seed",
            str(seed),
            "--run-dir",
            run,
            "--progress",
            "false",
            "--baselines",
            "false",
            *args.extra,
        ]
        print("$", " ".join(cmd[1:]), flush=True)
        procs[seed] = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            stdout=subprocess.DEVNULL,
        )
        if args.jobs == 1:
            procs[seed].wait()
    for seed, proc in procs.items():
        if proc.wait() != 0:
            raise SystemExit(f"seed {seed}: training failed (exit {proc.returncode})")
    print(f"all runs done in {time.time() - t0:.0f}s wall ({args.jobs} at a time)")
    import yaml

    for seed in args.seeds:
        run = os.path.join(args.out, f"seed{seed}")
        with open(os.path.join(run, "eval.json")) as fh:
            results[seed] = json.load(fh)
        with open(os.path.join(run, "config.yaml")) as fh:
            env_kw = yaml.safe_load(fh)["env"]
        seeds_eval = results[seed]["seeds"]
        rows = read_metrics(os.path.join(run, "metrics.jsonl"))
        curves[seed] = [
            (r["time_s"], r["eval/success_rate"])
            for r in rows
            if r.get("eval/success_rate") is not None
        ]
        print(
            f"seed {seed}: success {results[seed]['success_rate']:.3f} solved "
            f"{results[seed]['solved_rate']:.3f} after {rows[-1]['env_steps']} env steps, "
            f"{rows[-1]['time_s']:.0f}s training",
            flush=True,
        )
    base = {p: evaluate_baseline(p, seeds=seeds_eval, **env_kw) for p in ("heuristic", "random")}
    print(f"\nvalidation seeds {seeds_eval[0]}..{seeds_eval[-1]}, env {env_kw or 'small preset'}")
    print(f"{'policy':<14}{'success':>9}{'solved':>9}{'x heuristic':>13}{'x random':>10}")
    h, r = base["heuristic"]["success_rate"], base["random"]["success_rate"]
    for seed, res in results.items():
        s = res["success_rate"]
        print(
            f"{'mappo s' + str(seed):<14}{s:>9.3f}{res['solved_rate']:>9.3f}"
            f"{s / h:>13.3f}{s / r:>10.2f}"
        )
    for name, res in base.items():
        print(f"{name:<14}{res['success_rate']:>9.3f}{res['solved_rate']:>9.3f}")
    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for seed, pts in curves.items():
            if pts:
                x, y = zip(*pts, strict=True)
                ax.plot(x, y, marker="o", ms=3, label=f"MAPPO seed {seed}")
        ax.axhline(h, color="g", ls="--", label="heuristic")
        ax.axhline(r, color="r", ls=":", label="random")
        ax.set_xlabel("training wall time (s)")
        ax.set_ylabel("validation success rate")
        ax.set_ylim(0, 1.05)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        os.makedirs(os.path.dirname(os.path.abspath(args.png)), exist_ok=True)
        fig.savefig(args.png, dpi=90)
        print(f"curves: {args.png}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("throughput")
    t.add_argument("--updates", type=int, default=8)
    t.add_argument("--num-envs", type=int, default=None, help="E (default: the trainer's)")
    t.add_argument("--rollout-steps", type=int, default=None, help="T (default: the trainer's)")
    t.add_argument("--threads", type=int, default=1)
    t.add_argument("extra", nargs="*", help="extra train flags after --")
    bp = sub.add_parser("backbones")
    bp.add_argument("--backbones", nargs="+", default=["gru", "mamba", "mamba2"])
    bp.add_argument("--updates", type=int, default=4, help="measured iterations per backbone")
    bp.add_argument("--same-window", action="store_true", help="also at the first's window")
    bp.add_argument("--windows", type=int, nargs="+", default=[16, 64, 256, 1024])
    bp.add_argument("--update-rollout", type=int, default=1024, help="T of the update phase")
    bp.add_argument("--update-envs", type=int, default=16, help="E of the update phase")
    bp.add_argument("--repeats", type=int, default=2, help="measured updates per window")
    bp.add_argument("--threads", type=int, default=1)
    bp.add_argument("extra", nargs="*", help="extra train flags after --")
    mp = sub.add_parser("memory")
    mp.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048])
    mp.add_argument("--backbone", default="mamba")
    mp.add_argument("--num-envs", type=int, default=8)
    mp.add_argument("--threads", type=int, default=1)
    mp.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    mp.add_argument("extra", nargs="*", help="extra train flags after --")
    sp = sub.add_parser(
        "seeds",
        help="multi-seed training throughput of SeedMAPPO / SeedGRPO (issue 37)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=_SEEDS_HELP,
    )
    sp.add_argument("--backbone", default="mlp", help="actor backbone (default: mlp)")
    sp.add_argument(
        "--sizes",
        type=_positive_int,
        nargs="+",
        default=[1, 4, 16, 64],
        metavar="S",
        help="numbers of seeds trained together, each >= 1; S=1 is always measured (the "
        "ratios' reference) (default: 1 4 16 64)",
    )
    sp.add_argument(
        "--updates",
        type=_positive_int,
        default=3,
        help="timed iterations (rollout + update) per run, after one untimed warm-up (default: 3)",
    )
    sp.add_argument(
        "--rounds",
        type=_positive_int,
        default=2,
        help="rounds over all sizes and the single-seed reference, a fresh process per run; "
        "the table gives medians over the rounds (default: 2)",
    )
    sp.add_argument(
        "--threads",
        type=_positive_int,
        default=1,
        help="torch intra-op threads and numba's pool size (default: 1)",
    )
    sp.add_argument(
        "--profile",
        action="store_true",
        help="also profile one more iteration of the single-seed reference and of the largest "
        "S <= 16 (round 1) under torch.profiler: the shares of env, rollout forwards, update "
        "GEMMs, optimizer and the rest, and the GEMMs against their compute floor",
    )
    sp.add_argument("--child", default=None, help=argparse.SUPPRESS)
    sp.add_argument(
        "extra",
        nargs="*",
        help="train flags of python -m marl.train after --, e.g. -- --env.preset memory "
        "--num-envs 32, or -- --algo grpo for GRPO (not --seed/--seeds: the seeds are "
        "0..S-1)",
    )
    lp = sub.add_parser("learn")
    lp.add_argument("--max-time", type=float, default=900)
    lp.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    lp.add_argument("--out", default="runs/bench_mappo")
    lp.add_argument("--png", default=None)
    lp.add_argument(
        "--jobs",
        type=int,
        choices=(1, 0),
        default=1,
        help="1: seeds one after another; 0: all seeds at once",
    )
    lp.add_argument("extra", nargs="*", help="extra train flags after --")
    args = p.parse_args()
    # numba's pool sized before anything imports numba (see the module docstring)
    size_numba_pool([f"--torch-threads={getattr(args, 'threads', 1)}"])
    if args.cmd == "seeds":
        if args.child is not None:
            _seeds_child(args)
            return
        _check_seeds_args(sp, args)
    if args.cmd == "memory":
        (_memory_child if args.child else memory)(args)
        return
    commands = {"throughput": throughput, "backbones": backbones, "seeds": seeds, "learn": learn}
    commands[args.cmd](args)


if __name__ == "__main__":
    main()
