"""Our MAPPO against BenchMARL's MAPPO (TorchRL) on mpe2 simple_spread_v3 (N=3, 25 steps).

Both train on the same env (``mpe2.simple_spread_v3.parallel_env(N=3, max_cycles=25,
continuous_actions=False)``, categorical actions) for the same env-step budget, 3+ seeds
each, one run at a time, each with its own defaults:

* **ours**: ``python -m marl.train --env-fn mpe2.simple_spread_v3:parallel_env --env.N 3
  --env.max_cycles 25 --total-steps B --seed S --torch-threads 1`` (default MAPPO config);
* **peer**: BenchMARL's ``Experiment`` with its own YAML defaults for ``MappoConfig``
  (``conf/algorithm/mappo.yaml``), ``ExperimentConfig`` (``conf/experiment/
  base_experiment.yaml``) and ``MlpConfig`` (``conf/model/layers/mlp.yaml``) for actor and
  critic, on its ``PettingZooTask.SIMPLE_SPREAD`` with ``max_cycles`` 25; the env is built
  through TorchRL's ``PettingZooWrapper`` (categorical actions, ``return_state``) exactly as
  BenchMARL's ``PettingZooClass.get_env_fun`` does, but over the mpe2 env (pettingzoo 1.27
  no longer ships ``pettingzoo.mpe``, which BenchMARL's env-by-name path needs). Changed from
  BenchMARL's experiment defaults only what does not change training: ``max_n_frames`` = B,
  ``prefer_continuous_actions`` False, evaluation, rendering, loggers and checkpoints off,
  torch threads 1. The peer runs in its own interpreter (``--peer-python``, a separate venv
  with torchrl/benchmarl), so this project's venv is untouched.

Both trained policies are then evaluated by one function (:func:`evaluate_spread`) on the
same 32 episodes (reset seeds 10000..10031): the episode sum of the mean over agents of their
rewards (``eval.json``'s ``mean_return``), averaged over the episodes, with actions sampled
from the policy (our trainer's default) and, as a second figure, the most likely action
(BenchMARL's evaluation default); a uniform random policy on the same seeds is the floor.
Training wall time and env steps per second are each run's own (ours: ``finished.json``
``time_s``, which includes its periodic evaluations; peer: around ``Experiment.run()``).

    python benchmarks/peer_mappo.py --peer-python PEER/bin/python   # all runs
    python benchmarks/peer_mappo.py --table-only                             # tables only

Runs whose result files exist are skipped (``eval.json`` for ours, ``peer_result.json`` for
the peer), so a stopped sweep resumes where it stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # marl, for the tables and our side (not imported by the peer side)
SPREAD = {"N": 3, "max_cycles": 25, "local_ratio": 0.5}
EVAL_SEEDS = tuple(range(10000, 10032))
OURS_ENV_FN = "mpe2.simple_spread_v3:parallel_env"

#: ``act(obs) -> actions`` for one parallel_env step; ``reset(seed)`` starts an episode
ActFn = Callable[[Mapping[str, np.ndarray]], dict[str, int]]


# ------------------------------------------------------------------------------------------
# evaluation shared by both sides (numpy + mpe2 only: runs in either venv)
def make_spread_env() -> Any:
    from mpe2 import simple_spread_v3

    return simple_spread_v3.parallel_env(**SPREAD, continuous_actions=False)


def evaluate_spread(
    act: ActFn, reset: Callable[[int], None], seeds: Sequence[int] = EVAL_SEEDS
) -> list[float]:
    """Per-episode returns: the episode sum of the mean over the step's agents of their
    rewards, one episode per reset seed (a fresh env reset with ``seed``)."""
    env = make_spread_env()
    returns = []
    for seed in seeds:
        obs, _ = env.reset(seed=int(seed))
        reset(int(seed))
        total = 0.0
        while env.agents:
            obs, rewards, _, _, _ = env.step(act(obs))
            if rewards:
                total += float(np.mean([rewards[a] for a in rewards]))
        returns.append(total)
    env.close()
    return returns


def random_returns(seeds: Sequence[int] = EVAL_SEEDS) -> list[float]:
    """Uniform random actions (numpy generator reseeded with each episode's seed)."""
    rng = [np.random.default_rng(0)]

    def reset(seed: int) -> None:
        rng[0] = np.random.default_rng(seed)

    def act(obs: Mapping[str, np.ndarray]) -> dict[str, int]:
        return {a: int(rng[0].integers(5)) for a in obs}

    return evaluate_spread(act, reset, seeds)


# ------------------------------------------------------------------------------------------
# the peer (run inside --peer-python)
try:  # the peer's packages: present only in --peer-python's venv
    from benchmarl.environments.pettingzoo.common import PettingZooClass
    from benchmarl.experiment.callback import Callback
except ImportError:
    PettingZooClass = Callback = None

if PettingZooClass is not None:  # module level: BenchMARL pickles the task and callbacks

    class Mpe2PettingZooClass(PettingZooClass):
        """BenchMARL's PettingZoo task class, with the env from mpe2 instead of by name."""

        def get_env_fun(self, num_envs, continuous_actions, seed, device):  # noqa: ANN001
            from torchrl.envs import PettingZooWrapper

            def make():  # as PettingZooClass.get_env_fun, over the mpe2 env
                return PettingZooWrapper(
                    env=make_spread_env(),
                    categorical_actions=True,
                    device=device,
                    seed=seed,
                    return_state=self.has_state(),
                )

            return make

    class CurveCallback(Callback):
        """Records (env steps, seconds, mean training episode return) per iteration."""

        def __init__(self) -> None:
            super().__init__()
            self.points: list[dict[str, float]] = []
            self.start = time.perf_counter()

        def on_batch_collected(self, batch):  # noqa: ANN001
            exp = self.experiment
            self.points.append(
                {
                    "env_steps": int(exp.total_frames),
                    "time_s": time.perf_counter() - self.start,
                    "train_episode_return": float(exp.mean_return),
                }
            )


def peer_train(seed: int, total_steps: int, out_dir: str, torch_threads: int) -> dict[str, Any]:
    """Train BenchMARL's MAPPO with its defaults; evaluate; return the result record."""
    import torch

    torch.set_num_threads(torch_threads)
    import benchmarl
    import tensordict
    import torchrl
    from benchmarl.algorithms import MappoConfig
    from benchmarl.environments import PettingZooTask
    from benchmarl.experiment import Experiment, ExperimentConfig
    from benchmarl.models.mlp import MlpConfig
    from tensordict import TensorDict
    from torchrl.envs.utils import ExplorationType, set_exploration_type

    yaml_task = PettingZooTask.SIMPLE_SPREAD.get_from_yaml()
    task = Mpe2PettingZooClass(name=yaml_task.name, config=dict(yaml_task.config))
    task.config.update(SPREAD)

    config = ExperimentConfig.get_from_yaml()
    config.max_n_frames = total_steps
    config.prefer_continuous_actions = False
    config.evaluation = False
    config.render = False
    config.loggers = []
    config.create_json = False
    config.checkpoint_at_end = False
    config.save_folder = out_dir
    algo = MappoConfig.get_from_yaml()
    model = MlpConfig.get_from_yaml()

    curve = CurveCallback()

    os.makedirs(out_dir, exist_ok=True)
    experiment = Experiment(
        task=task,
        algorithm_config=algo,
        model_config=model,
        critic_model_config=MlpConfig.get_from_yaml(),
        seed=seed,
        config=config,
        callbacks=[curve],
    )
    # torchrl sets torch's intra-op threads back to their count at its import when a batched
    # env closes (SerialEnv.close, batched_envs.py); 2 spinning OpenMP threads on a loaded
    # 2-core machine made each optimiser step ~60x slower, so pin the count again
    torchrl._THREAD_POOL_INIT = torch_threads
    torch.set_num_threads(torch_threads)
    curve.start = start = time.perf_counter()
    experiment.run()
    train_s = time.perf_counter() - start

    policy = experiment.policy
    groups = dict(experiment.group_map)
    mode = [ExplorationType.RANDOM]

    def reset(s: int) -> None:
        torch.manual_seed(s)

    def act(obs: Mapping[str, np.ndarray]) -> dict[str, int]:
        td = TensorDict(
            {
                g: TensorDict(
                    {"observation": torch.as_tensor(np.stack([obs[a] for a in names]))},
                    batch_size=[len(names)],
                )
                for g, names in groups.items()
            },
            batch_size=[],
        )
        with torch.no_grad(), set_exploration_type(mode[0]):
            out = policy(td)
        actions = {}
        for g, names in groups.items():
            chosen = out[g, "action"]
            if chosen.ndim == 2:  # one-hot
                chosen = chosen.argmax(-1)
            actions.update({a: int(chosen[i]) for i, a in enumerate(names) if a in obs})
        return actions

    sampled = evaluate_spread(act, reset)
    mode[0] = ExplorationType.DETERMINISTIC
    greedy = evaluate_spread(act, reset)
    import mpe2
    import pettingzoo

    return {
        "side": "peer",
        "seed": seed,
        "env_steps": int(experiment.total_frames),
        "train_s": train_s,
        "env_steps_per_s": experiment.total_frames / train_s,
        "torch_threads_after_run": torch.get_num_threads(),
        "eval_sampled": sampled,
        "eval_deterministic": greedy,
        "mean_return": float(np.mean(sampled)),
        "mean_return_deterministic": float(np.mean(greedy)),
        "curve": curve.points,
        "config": {
            "algorithm": dict(vars(algo)),
            "experiment": {k: repr(v) for k, v in vars(config).items()},
            "model": {k: repr(v) for k, v in vars(model).items()},
            "task": dict(task.config),
        },
        "versions": {
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "torchrl": torchrl.__version__,
            "tensordict": tensordict.__version__,
            "benchmarl": getattr(benchmarl, "__version__", "unknown"),
            "mpe2": getattr(mpe2, "__version__", "unknown"),
            "pettingzoo": pettingzoo.__version__,
        },
    }


# ------------------------------------------------------------------------------------------
# ours (run in this project's venv)
def ours_command(
    python: str, seed: int, total_steps: int, run_dir: str, torch_threads: int, nice: int
) -> list[str]:
    cmd = [
        python, "-m", "marl.train",
        "--env-fn", OURS_ENV_FN,
        "--env.N", str(SPREAD["N"]),
        "--env.max_cycles", str(SPREAD["max_cycles"]),
        "--total-steps", str(total_steps),
        "--seed", str(seed),
        "--torch-threads", str(torch_threads),
        "--progress", "false",
        "--plots", "false",
        "--gif", "false",
        "--run-dir", run_dir,
    ]  # fmt: skip
    return (["nice", "-n", str(nice)] if nice else []) + cmd


def peer_command(
    peer_python: str, seed: int, total_steps: int, out_json: str, torch_threads: int, nice: int
) -> list[str]:
    cmd = [
        peer_python, os.path.abspath(__file__), "--peer-train",
        "--seed", str(seed),
        "--total-steps", str(total_steps),
        "--torch-threads", str(torch_threads),
        "--peer-out", out_json,
    ]  # fmt: skip
    return (["nice", "-n", str(nice)] if nice else []) + cmd


def ours_result(run_dir: str, seed: int) -> dict[str, Any]:
    """Evaluate our trained policy with :func:`evaluate_spread` and read its run files."""
    import marl

    policy = marl.load_policy(run_dir)
    mask = np.ones(5, np.int8)
    state: list[Any] = [None]
    deterministic = [False]

    def reset(s: int) -> None:
        state[0] = policy.reset(seed=s)

    def act(obs: Mapping[str, np.ndarray]) -> dict[str, int]:
        wrapped = {a: {"observation": o, "action_mask": mask} for a, o in obs.items()}
        actions, state[0] = policy.act(wrapped, state[0], deterministic=deterministic[0])
        return actions

    sampled = evaluate_spread(act, reset)
    deterministic[0] = True
    greedy = evaluate_spread(act, reset)
    with open(os.path.join(run_dir, "finished.json")) as fh:
        fin = json.load(fh)
    with open(os.path.join(run_dir, "eval.json")) as fh:
        ev = json.load(fh)
    curve = []
    with open(os.path.join(run_dir, "metrics.jsonl")) as fh:
        for line in fh:
            row = json.loads(line)
            if "episode/return" in row or "eval/mean_return" in row:
                curve.append(
                    {
                        "env_steps": row["env_steps"],
                        "time_s": row["time_s"],
                        "train_episode_return": row.get("episode/return"),
                        "eval_mean_return": row.get("eval/mean_return"),
                    }
                )
    return {
        "side": "ours",
        "seed": seed,
        "env_steps": fin["env_steps"],
        "train_s": fin["time_s"],
        "env_steps_per_s": fin["env_steps"] / fin["time_s"],
        "eval_sampled": sampled,
        "eval_deterministic": greedy,
        "mean_return": float(np.mean(sampled)),
        "mean_return_deterministic": float(np.mean(greedy)),
        "eval_json_mean_return": ev["mean_return"],
        "curve": curve,
    }


# ------------------------------------------------------------------------------------------
# tables
def summarise(values: Sequence[float]) -> dict[str, Any]:
    from marl.experiments.stats import interval_estimates

    est = interval_estimates(list(values), seed=0)
    return {"n": est["n"], "mean": est["mean"], "mean_ci": est["mean_ci"]}


def fmt_ci(summary: Mapping[str, Any], digits: int = 2) -> str:
    if not summary or not summary.get("n"):
        return "-"
    text = f"{summary['mean']:.{digits}f}"
    if summary.get("mean_ci") is not None:
        lo, hi = summary["mean_ci"]
        text += f" [{lo:.{digits}f}, {hi:.{digits}f}]"
    return text


def markdown_tables(
    results: Mapping[str, Sequence[Mapping[str, Any]]], random_mean: float | None
) -> str:
    """Per seed and mean [95% CI] for each side: return (sampled, greedy), time, steps/s."""
    lines = [
        "| side | seed | mean_return (sampled) | mean_return (greedy) | env steps | train s "
        "| env steps/s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for side in ("ours", "peer"):
        rows = sorted(results.get(side, []), key=lambda r: r["seed"])
        for r in rows:
            lines.append(
                f"| {side} | {r['seed']} | {r['mean_return']:.2f} "
                f"| {r['mean_return_deterministic']:.2f} | {r['env_steps']:,} "
                f"| {r['train_s']:.0f} | {r['env_steps_per_s']:,.0f} |"
            )
        if rows:
            cells = [
                fmt_ci(summarise([r[k] for r in rows]), 2 if k.startswith("mean") else 0)
                for k in ("mean_return", "mean_return_deterministic", "train_s", "env_steps_per_s")
            ]
            steps = f"{int(np.mean([r['env_steps'] for r in rows])):,}"
            lines.append(
                f"| **{side}** | mean [95% CI] | {cells[0]} | {cells[1]} | {steps} "
                f"| {cells[2]} | {cells[3]} |"
            )
    if random_mean is not None:
        lines.append(f"| random | - | {random_mean:.2f} | - | - | - | - |")
    return "\n".join(lines) + "\n"


def curve_table(results: Mapping[str, Sequence[Mapping[str, Any]]], points: Sequence[int]) -> str:
    """Training episode return (mean over seeds) at the last record at or before each point."""
    lines = [
        "| env steps | " + " | ".join(f"{s} return | {s} time s" for s in ("ours", "peer")) + " |",
        "|---:|" + "---:|" * 4,
    ]
    for p in points:
        cells = []
        for side in ("ours", "peer"):
            vals, times = [], []
            for r in results.get(side, []):
                before = [
                    c for c in r["curve"]
                    if c["env_steps"] <= p and c.get("train_episode_return") is not None
                    and np.isfinite(c["train_episode_return"])
                ]  # fmt: skip
                if before:
                    vals.append(before[-1]["train_episode_return"])
                    times.append(before[-1]["time_s"])
            cells += [f"{np.mean(vals):.2f}", f"{np.mean(times):.0f}"] if vals else ["-", "-"]
        lines.append(f"| {p:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python benchmarks/peer_mappo.py",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--total-steps", type=int, default=300_000, help="env steps per run, both")
    p.add_argument("--out-dir", default="runs/peer_mappo", help="run dirs and results")
    p.add_argument("--sides", nargs="+", default=["ours", "peer"], choices=["ours", "peer"])
    p.add_argument("--python", default=sys.executable, help="interpreter for marl.train")
    p.add_argument(
        "--peer-python",
        default=os.environ.get("PEER_PYTHON"),
        help="interpreter with torchrl + benchmarl + mpe2, a separate venv (default: "
        "$PEER_PYTHON); e.g. python3.11 -m venv PEER && PEER/bin/pip install torch==2.13.0 "
        "benchmarl==1.5.2 torchrl==0.11.1 tensordict==0.11.0 mpe2",
    )
    p.add_argument("--torch-threads", type=int, default=1)
    p.add_argument("--nice", type=int, default=10, help="run each training under nice -n K")
    p.add_argument("--table-only", action="store_true", help="train nothing; write the tables")
    p.add_argument("--dry-run", action="store_true", help="print the pending commands only")
    p.add_argument("--peer-train", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--peer-out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.total_steps < 1:
        p.error(f"--total-steps must be >= 1, got {args.total_steps}")
    if args.torch_threads < 1:
        p.error(f"--torch-threads must be >= 1, got {args.torch_threads}")
    if args.peer_train and not args.peer_out:
        p.error("--peer-train needs --peer-out")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.peer_train:  # inside the peer's venv
        record = peer_train(args.seed, args.total_steps, args.peer_out + ".d", args.torch_threads)
        with open(args.peer_out, "w") as fh:
            json.dump(record, fh, indent=1)
        print(f"peer seed {args.seed}: mean_return {record['mean_return']:.2f}")
        return 0
    out = args.out_dir
    if not args.table_only:
        for seed in args.seeds:
            for side in args.sides:
                if side == "ours":
                    d = os.path.join(out, "ours", f"seed{seed}")
                    if os.path.isfile(os.path.join(d, "eval.json")):
                        continue
                    cmd = ours_command(
                        args.python, seed, args.total_steps, d, args.torch_threads, args.nice
                    )
                    if os.path.exists(d):
                        cmd.append("--overwrite")
                else:
                    path = os.path.join(out, "peer", f"seed{seed}.json")
                    if os.path.isfile(path):
                        continue
                    if not args.peer_python:
                        raise SystemExit(
                            "peer runs need --peer-python (or PEER_PYTHON): an interpreter "
                            "with benchmarl, torchrl and mpe2 (see --help); or --sides ours"
                        )
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    cmd = peer_command(
                        args.peer_python, seed, args.total_steps, path, args.torch_threads,
                        args.nice,
                    )  # fmt: skip
                print(shlex.join(cmd), flush=True)
                if args.dry_run:
                    continue
                start = time.perf_counter()
                rc = subprocess.run(cmd, cwd=ROOT).returncode
                print(f"  rc={rc} wall {time.perf_counter() - start:.1f} s", flush=True)
        if args.dry_run:
            return 0
    results: dict[str, list[dict[str, Any]]] = {"ours": [], "peer": []}
    for seed in args.seeds:
        d = os.path.join(out, "ours", f"seed{seed}")
        if os.path.isfile(os.path.join(d, "eval.json")):
            cached = os.path.join(d, "peer_eval.json")
            if not os.path.isfile(cached):
                with open(cached, "w") as fh:
                    json.dump(ours_result(d, seed), fh, indent=1)
            with open(cached) as fh:
                results["ours"].append(json.load(fh))
        path = os.path.join(out, "peer", f"seed{seed}.json")
        if os.path.isfile(path):
            with open(path) as fh:
                results["peer"].append(json.load(fh))
    rand = random_returns()
    random_mean = float(np.mean(rand))
    points = [p for p in (25_000, 50_000, 100_000, 200_000) if p < args.total_steps]
    points.append(args.total_steps)
    md = "### Final evaluation\n\n" + markdown_tables(results, random_mean)
    md += "\n### Training episode return against env steps (mean over seeds)\n\n"
    md += curve_table(results, points)
    summary = {
        side: {
            k: summarise([r[k] for r in rows])
            for k in ("mean_return", "mean_return_deterministic", "train_s", "env_steps_per_s")
        }
        for side, rows in results.items()
        if rows
    }
    record = {
        "env": {"fn": OURS_ENV_FN, **SPREAD, "continuous_actions": False},
        "total_steps": args.total_steps,
        "eval_seeds": list(EVAL_SEEDS),
        "metric": "mean over 32 episodes of the episode sum of the mean over agents of rewards",
        "ci": "95% stratified-bootstrap percentile CI of the mean over seeds (rliable)",
        "random": {"mean_return": random_mean, "episodes": rand},
        "summary": summary,
        "runs": results,
    }
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "peer_mappo.json"), "w") as fh:
        json.dump(record, fh, indent=1)
    with open(os.path.join(out, "peer_mappo.md"), "w") as fh:
        fh.write(md)
    print(md, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
