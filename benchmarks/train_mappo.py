"""MAPPO benchmarks: end-to-end training throughput and learning runs, with peers.

Throughput (one process, same run): agent-steps per second of

- ``env``: the vector env stepped with uniformly random *allowed* actions (the ceiling),
- ``rollout``: :class:`marl.collect.RolloutCollector` with the MAPPO actors and critic,
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
    obs = algo.collector.obs
    steps = args.updates * cfg.rollout_steps
    t = time.perf_counter()
    for _ in range(steps):
        obs, *_ = vec.step(_random_allowed(obs, vec.possible_agents, rng))
    env_sps = steps * cfg.num_envs * n_agents / (time.perf_counter() - t)
    algo.collector.obs = obs
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


def _make_algo(backbone: str, extra: list[str], threads: int, *more: str):
    from marl.algos.mappo import MAPPO
    from marl.run.config import parse_cli
    from marl.run.train import configure_process

    cfg = parse_cli(
        ["--backbone", backbone, "--progress", "false", "--torch-threads", str(threads)]
        + list(more)
        + list(extra)
    )
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
    if args.cmd == "memory":
        (_memory_child if args.child else memory)(args)
        return
    {"throughput": throughput, "backbones": backbones, "learn": learn}[args.cmd](args)


if __name__ == "__main__":
    main()
