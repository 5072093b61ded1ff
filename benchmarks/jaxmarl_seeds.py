"""Outside reference for BENCHMARKS.md "Many seeds at once" (issue 37): JaxMARL's IPPO-FF on
its jitted MPE simple_spread, the whole training loop ``jax.vmap``-ed over S seeds, one CPU core.

What it measures: for each S in ``--seeds``, ``jax.jit(jax.vmap(train))`` over S PRNG keys,
where ``train`` is JaxMARL's IPPO-FF ``make_train(config)`` run for ``--updates`` PPO updates.
The function is compiled (timed apart), run once as a warm-up (not timed), then run
``--repeats`` times under ``block_until_ready``; the median run gives

    agent-steps/s (summed over seeds) = S * NUM_ENVS * NUM_STEPS * n_agents * updates / seconds

with n_agents = 3 (simple_spread), i.e. 6,144 agent-steps per update per seed, plus the ratio
to S=1 measured in the same process. The same count is also divided by the process's CPU
time (``time.process_time``, all threads): agent-steps per CPU-s, the steadier figure when
other jobs share the core, as in BENCHMARKS.md's "x S=1 wall / per CPU-s". One core:
``XLA_FLAGS`` is set to ``--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1``
before jax is imported, and the process should also be pinned with ``taskset -c 0``.

Command (jax lives in a separate venv, never in the project's .venv):

    python3 -m venv /tmp/jaxvenv && /tmp/jaxvenv/bin/pip install jaxmarl distrax
    taskset -c 0 /tmp/jaxvenv/bin/python benchmarks/jaxmarl_seeds.py --seeds 1 4 16

Upstream source: github.com/FLAIROx/JaxMARL, ``baselines/IPPO/ippo_ff_mpe.py`` (blob
15507c41, last changed in 014b4f0a) and ``baselines/IPPO/config/ippo_ff_mpe.yaml`` (blob
3ae66ce7), both as of commit c793d095618c6d3edfb5632802348f57b70a4b94. The pip package
(jaxmarl 0.2.0) ships the envs and wrappers (its ``jaxmarl/environments/mpe`` and
``jaxmarl/wrappers/baselines.py`` are identical to that commit's) but not ``baselines/``, so
``make_train`` is vendored below. Same network (actor and critic MLPs 64-64 tanh, orthogonal
init, distrax Categorical), ``MPELogWrapper``, rollout scan, GAE (``unroll=8``), PPO loss,
epoch/minibatch scans and optimizer (clip-by-global-norm + Adam, eps 1e-5, linear LR anneal),
and the yaml's values (NUM_ENVS 16, NUM_STEPS 128, UPDATE_EPOCHS 4, NUM_MINIBATCHES 4, LR
2.5e-4, GAMMA 0.99, GAE_LAMBDA 0.95, CLIP_EPS 0.2, ENT_COEF 0.01, VF_COEF 0.5,
MAX_GRAD_NORM 0.5, tanh, MPE_simple_spread_v3, ANNEAL_LR). Deviations, none of which changes
the per-update work:

* the outer scan runs ``--updates`` updates instead of TOTAL_TIMESTEPS // NUM_STEPS //
  NUM_ENVS = 4,882; the LR schedule still anneals over 4,882 (the timed window is the start
  of upstream's 1e7-step run);
* upstream's per-update ``io_callback`` to ``wandb.log`` (wandb disabled in the yaml) is left
  out by default; ``--callback`` puts it back with a no-op host function;
* ``batchify`` stacks the agents' observations directly (simple_spread's are all 18-dim, so
  upstream's padding branch, which is never taken here, is dropped);
* no hydra/wandb/plotting; upstream's ``jax.vmap(jax.jit(train))`` is written
  ``jax.jit(jax.vmap(train))`` (the same computation) and its NUM_SEEDS 10 is ``--seeds``.

Only the S-scaling ratio is comparable with our rows: JaxMARL's MPE simple_spread (3 agents,
18-dim observations, 5 discrete actions, whole loop in one XLA program) and IPPO with separate
64-64 actor/critic MLPs differ from our multisearch env and MAPPO, so the absolute
agent-steps/s are not. The script prints a markdown row per S.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

ONE_CORE_XLA_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
# Before any jax import (jax is only imported inside main()).
os.environ["XLA_FLAGS"] = f"{ONE_CORE_XLA_FLAGS} {os.environ.get('XLA_FLAGS', '')}".strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# baselines/IPPO/config/ippo_ff_mpe.yaml (wandb keys dropped).
UPSTREAM_CONFIG = {
    "LR": 2.5e-4,
    "NUM_ENVS": 16,
    "NUM_STEPS": 128,
    "TOTAL_TIMESTEPS": 1e7,
    "UPDATE_EPOCHS": 4,
    "NUM_MINIBATCHES": 4,
    "GAMMA": 0.99,
    "GAE_LAMBDA": 0.95,
    "CLIP_EPS": 0.2,
    "ENT_COEF": 0.01,
    "VF_COEF": 0.5,
    "MAX_GRAD_NORM": 0.5,
    "ACTIVATION": "tanh",
    "ENV_NAME": "MPE_simple_spread_v3",
    "ENV_KWARGS": {},
    "ANNEAL_LR": True,
    "SEED": 30,
    "NUM_SEEDS": 10,
}

INSTALL_HINT = (
    "needs jax (CPU), jaxmarl, distrax, flax and optax, kept out of the project's .venv:\n"
    "    python3 -m venv /tmp/jaxvenv && /tmp/jaxvenv/bin/pip install jaxmarl distrax\n"
    "then run this script with /tmp/jaxvenv/bin/python "
    "(taskset -c 0 /tmp/jaxvenv/bin/python benchmarks/jaxmarl_seeds.py --seeds 1 4 16)"
)


def make_train(config: dict, timed_updates: int, with_callback: bool = False):
    """Upstream ``make_train`` (baselines/IPPO/ippo_ff_mpe.py), with the outer scan run for
    ``timed_updates`` updates. Returns ``(train, env)``."""
    from typing import NamedTuple

    import distrax
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import jaxmarl
    import numpy as np
    import optax
    from flax.linen.initializers import constant, orthogonal
    from flax.training.train_state import TrainState
    from jaxmarl.wrappers.baselines import MPELogWrapper as LogWrapper

    class ActorCritic(nn.Module):
        action_dim: int
        activation: str = "tanh"

        @nn.compact
        def __call__(self, x):
            activation = nn.relu if self.activation == "relu" else nn.tanh
            actor_mean = nn.Dense(64, kernel_init=orthogonal(np.sqrt(2)), bias_init=constant(0.0))(
                x
            )
            actor_mean = activation(actor_mean)
            actor_mean = nn.Dense(64, kernel_init=orthogonal(np.sqrt(2)), bias_init=constant(0.0))(
                actor_mean
            )
            actor_mean = activation(actor_mean)
            actor_mean = nn.Dense(
                self.action_dim, kernel_init=orthogonal(0.01), bias_init=constant(0.0)
            )(actor_mean)
            pi = distrax.Categorical(logits=actor_mean)

            critic = nn.Dense(64, kernel_init=orthogonal(np.sqrt(2)), bias_init=constant(0.0))(x)
            critic = activation(critic)
            critic = nn.Dense(64, kernel_init=orthogonal(np.sqrt(2)), bias_init=constant(0.0))(
                critic
            )
            critic = activation(critic)
            critic = nn.Dense(1, kernel_init=orthogonal(1.0), bias_init=constant(0.0))(critic)
            return pi, jnp.squeeze(critic, axis=-1)

    class Transition(NamedTuple):
        done: jnp.ndarray
        action: jnp.ndarray
        value: jnp.ndarray
        reward: jnp.ndarray
        log_prob: jnp.ndarray
        obs: jnp.ndarray
        info: jnp.ndarray

    def batchify(x: dict, agent_list, num_actors):
        # Upstream pads shorter observations to the longest; simple_spread's are all equal.
        x = jnp.stack([x[a] for a in agent_list])
        return x.reshape((num_actors, -1))

    def unbatchify(x, agent_list, num_envs, num_actors):
        x = x.reshape((num_actors, num_envs, -1))
        return {a: x[i] for i, a in enumerate(agent_list)}

    config = dict(config)
    env = jaxmarl.make(config["ENV_NAME"], **config["ENV_KWARGS"])
    dims = {env.observation_space(a).shape for a in env.agents}
    assert len(dims) == 1, f"agents' observation shapes differ: {dims}"
    config["NUM_ACTORS"] = env.num_agents * config["NUM_ENVS"]
    config["NUM_UPDATES"] = int(
        config["TOTAL_TIMESTEPS"] // config["NUM_STEPS"] // config["NUM_ENVS"]
    )
    config["MINIBATCH_SIZE"] = (
        config["NUM_ACTORS"] * config["NUM_STEPS"] // config["NUM_MINIBATCHES"]
    )
    n_agents = env.num_agents

    env = LogWrapper(env)

    def linear_schedule(count):
        frac = (
            1.0
            - (count // (config["NUM_MINIBATCHES"] * config["UPDATE_EPOCHS"]))
            / config["NUM_UPDATES"]
        )
        return config["LR"] * frac

    def train(rng):
        # INIT NETWORK
        network = ActorCritic(env.action_space(env.agents[0]).n, activation=config["ACTIVATION"])
        rng, _rng = jax.random.split(rng)
        init_x = jnp.zeros(env.observation_space(env.agents[0]).shape)
        network_params = network.init(_rng, init_x)
        if config["ANNEAL_LR"]:
            tx = optax.chain(
                optax.clip_by_global_norm(config["MAX_GRAD_NORM"]),
                optax.adam(learning_rate=linear_schedule, eps=1e-5),
            )
        else:
            tx = optax.chain(
                optax.clip_by_global_norm(config["MAX_GRAD_NORM"]),
                optax.adam(config["LR"], eps=1e-5),
            )
        train_state = TrainState.create(apply_fn=network.apply, params=network_params, tx=tx)

        # INIT ENV
        rng, _rng = jax.random.split(rng)
        reset_rng = jax.random.split(_rng, config["NUM_ENVS"])
        obsv, env_state = jax.vmap(env.reset)(reset_rng)

        # TRAIN LOOP
        def _update_step(runner_state, unused):
            # COLLECT TRAJECTORIES
            def _env_step(runner_state, unused):
                train_state, env_state, last_obs, rng = runner_state

                obs_batch = batchify(last_obs, env.agents, config["NUM_ACTORS"])
                # SELECT ACTION
                rng, _rng = jax.random.split(rng)
                pi, value = network.apply(train_state.params, obs_batch)
                action = pi.sample(seed=_rng)
                log_prob = pi.log_prob(action)
                env_act = unbatchify(action, env.agents, config["NUM_ENVS"], env.num_agents)

                # STEP ENV
                rng, _rng = jax.random.split(rng)
                rng_step = jax.random.split(_rng, config["NUM_ENVS"])
                obsv, env_state, reward, done, info = jax.vmap(env.step)(
                    rng_step, env_state, env_act
                )
                info = jax.tree.map(lambda x: x.reshape(config["NUM_ACTORS"]), info)
                transition = Transition(
                    batchify(done, env.agents, config["NUM_ACTORS"]).squeeze(),
                    action,
                    value,
                    batchify(reward, env.agents, config["NUM_ACTORS"]).squeeze(),
                    log_prob,
                    obs_batch,
                    info,
                )
                runner_state = (train_state, env_state, obsv, rng)
                return runner_state, transition

            runner_state, traj_batch = jax.lax.scan(
                _env_step, runner_state, None, config["NUM_STEPS"]
            )

            # CALCULATE ADVANTAGE
            train_state, env_state, last_obs, rng = runner_state
            last_obs_batch = batchify(last_obs, env.agents, config["NUM_ACTORS"])
            _, last_val = network.apply(train_state.params, last_obs_batch)

            def _calculate_gae(traj_batch, last_val):
                def _get_advantages(gae_and_next_value, transition):
                    gae, next_value = gae_and_next_value
                    done, value, reward = transition.done, transition.value, transition.reward
                    delta = reward + config["GAMMA"] * next_value * (1 - done) - value
                    gae = delta + config["GAMMA"] * config["GAE_LAMBDA"] * (1 - done) * gae
                    return (gae, value), gae

                _, advantages = jax.lax.scan(
                    _get_advantages,
                    (jnp.zeros_like(last_val), last_val),
                    traj_batch,
                    reverse=True,
                    unroll=8,
                )
                return advantages, advantages + traj_batch.value

            advantages, targets = _calculate_gae(traj_batch, last_val)

            # UPDATE NETWORK
            def _update_epoch(update_state, unused):
                def _update_minbatch(train_state, batch_info):
                    traj_batch, advantages, targets = batch_info

                    def _loss_fn(params, traj_batch, gae, targets):
                        # RERUN NETWORK
                        pi, value = network.apply(params, traj_batch.obs)
                        log_prob = pi.log_prob(traj_batch.action)

                        # CALCULATE VALUE LOSS
                        value_pred_clipped = traj_batch.value + (value - traj_batch.value).clip(
                            -config["CLIP_EPS"], config["CLIP_EPS"]
                        )
                        value_losses = jnp.square(value - targets)
                        value_losses_clipped = jnp.square(value_pred_clipped - targets)
                        value_loss = 0.5 * jnp.maximum(value_losses, value_losses_clipped).mean()

                        # CALCULATE ACTOR LOSS
                        ratio = jnp.exp(log_prob - traj_batch.log_prob)
                        gae = (gae - gae.mean()) / (gae.std() + 1e-8)
                        loss_actor1 = ratio * gae
                        loss_actor2 = (
                            jnp.clip(ratio, 1.0 - config["CLIP_EPS"], 1.0 + config["CLIP_EPS"])
                            * gae
                        )
                        loss_actor = -jnp.minimum(loss_actor1, loss_actor2)
                        loss_actor = loss_actor.mean()
                        entropy = pi.entropy().mean()

                        total_loss = (
                            loss_actor
                            + config["VF_COEF"] * value_loss
                            - config["ENT_COEF"] * entropy
                        )
                        return total_loss, (value_loss, loss_actor, entropy, ratio)

                    grad_fn = jax.value_and_grad(_loss_fn, has_aux=True)
                    total_loss, grads = grad_fn(train_state.params, traj_batch, advantages, targets)
                    train_state = train_state.apply_gradients(grads=grads)
                    loss_info = {
                        "total_loss": total_loss[0],
                        "actor_loss": total_loss[1][1],
                        "critic_loss": total_loss[1][0],
                        "entropy": total_loss[1][2],
                        "ratio": total_loss[1][3],
                    }
                    return train_state, loss_info

                train_state, traj_batch, advantages, targets, rng = update_state
                rng, _rng = jax.random.split(rng)
                batch_size = config["MINIBATCH_SIZE"] * config["NUM_MINIBATCHES"]
                assert batch_size == config["NUM_STEPS"] * config["NUM_ACTORS"], (
                    "batch size must be equal to number of steps * number of actors"
                )
                permutation = jax.random.permutation(_rng, batch_size)
                batch = (traj_batch, advantages, targets)
                batch = jax.tree.map(lambda x: x.reshape((batch_size,) + x.shape[2:]), batch)
                shuffled_batch = jax.tree.map(lambda x: jnp.take(x, permutation, axis=0), batch)
                minibatches = jax.tree.map(
                    lambda x: jnp.reshape(x, [config["NUM_MINIBATCHES"], -1] + list(x.shape[1:])),
                    shuffled_batch,
                )
                train_state, loss_info = jax.lax.scan(_update_minbatch, train_state, minibatches)
                update_state = (train_state, traj_batch, advantages, targets, rng)
                return update_state, loss_info

            update_state = (train_state, traj_batch, advantages, targets, rng)
            update_state, loss_info = jax.lax.scan(
                _update_epoch, update_state, None, config["UPDATE_EPOCHS"]
            )
            train_state = update_state[0]
            metric = traj_batch.info
            rng = update_state[-1]

            r0 = {"ratio0": loss_info["ratio"][0, 0].mean()}
            loss_info = jax.tree.map(lambda x: x.mean(), loss_info)
            metric = jax.tree.map(lambda x: x.mean(), metric)
            metric = {**metric, **loss_info, **r0}
            if with_callback:  # upstream: io_callback(wandb.log, ...) with wandb disabled
                jax.experimental.io_callback(lambda m: None, None, metric)
            runner_state = (train_state, env_state, last_obs, rng)
            return runner_state, metric

        rng, _rng = jax.random.split(rng)
        runner_state = (train_state, env_state, obsv, _rng)
        runner_state, metric = jax.lax.scan(_update_step, runner_state, None, timed_updates)
        return {"runner_state": runner_state, "metrics": metric}

    return train, config, n_agents


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(
            "Throughput of JaxMARL's IPPO-FF (baselines/IPPO/ippo_ff_mpe.py, vendored, config "
            "ippo_ff_mpe.yaml) on its jitted MPE simple_spread, the training jax.vmap-ed over S "
            "seeds, on one CPU core. Prints agent-steps/s summed over seeds and the ratio to "
            "S=1 as markdown rows. Run from a separate venv with jax + jaxmarl, pinned: "
            "taskset -c 0 /tmp/jaxvenv/bin/python benchmarks/jaxmarl_seeds.py --seeds 1 4 16"
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=[1, 4, 16],
        help="seed-batch sizes S to measure (S=1 is added first if missing: ratios are to it)",
    )
    parser.add_argument(
        "--updates",
        type=int,
        default=250,
        help="PPO updates per timed run (each = 16 envs x 128 steps x 3 agents = 6,144 "
        "agent-steps per seed, then 4 epochs x 4 minibatches)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="timed runs per S after the warm-up run; the median is reported",
    )
    parser.add_argument(
        "--seed", type=int, default=UPSTREAM_CONFIG["SEED"], help="base PRNG seed (yaml: 30)"
    )
    parser.add_argument(
        "--callback",
        action="store_true",
        help="keep upstream's per-update io_callback (a no-op host function here; upstream "
        "calls wandb.log, disabled in its yaml)",
    )
    args = parser.parse_args(argv)
    if any(s < 1 for s in args.seeds) or args.updates < 1 or args.repeats < 1:
        parser.error("--seeds, --updates and --repeats must be >= 1")
    sizes = sorted(set(args.seeds))
    if sizes[0] != 1:
        sizes.insert(0, 1)
    args.seeds = sizes
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        import distrax
        import flax
        import jax
        import jaxmarl
        import optax
    except ImportError as exc:
        print(f"jaxmarl_seeds.py: missing {exc.name!r}; {INSTALL_HINT}", file=sys.stderr)
        return 2

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(
        f"# jax {jax.__version__}, jaxlib {jax.lib.__version__}, jaxmarl {jaxmarl.__version__}, "
        f"flax {flax.__version__}, optax {optax.__version__}, distrax {distrax.__version__}, "
        f"python {platform.python_version()}; devices {jax.devices()}"
    )
    print(f"# XLA_FLAGS={os.environ['XLA_FLAGS']!r}; cores in affinity mask: {cores}")
    if cores != 1:
        print("# warning: not pinned to one core (use taskset -c 0)", file=sys.stderr)

    train, config, n_agents = make_train(UPSTREAM_CONFIG, args.updates, args.callback)
    per_update = config["NUM_ENVS"] * config["NUM_STEPS"] * n_agents
    print(
        f"# IPPO-FF {config['ENV_NAME']}: {n_agents} agents, NUM_ENVS {config['NUM_ENVS']}, "
        f"NUM_STEPS {config['NUM_STEPS']}, UPDATE_EPOCHS {config['UPDATE_EPOCHS']}, "
        f"NUM_MINIBATCHES {config['NUM_MINIBATCHES']}; {per_update} agent-steps/update/seed; "
        f"{args.updates} updates x {args.repeats} repeats per S; callback {args.callback}"
    )
    vtrain = jax.jit(jax.vmap(train))

    rows = []
    base = None
    t_total = time.perf_counter()
    for size in args.seeds:
        keys = jax.random.split(jax.random.PRNGKey(args.seed), size)
        t0 = time.perf_counter()
        compiled = vtrain.lower(keys).compile()
        compile_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        out = jax.block_until_ready(compiled(keys))  # warm-up, not timed
        warm_s = time.perf_counter() - t0
        walls, cpus = [], []
        for _ in range(args.repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            out = jax.block_until_ready(compiled(keys))
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
        wall, cpu = statistics.median(walls), statistics.median(cpus)
        steps = size * per_update * args.updates
        rate, cpu_rate = steps / wall, steps / cpu
        base = base or (rate, cpu_rate)
        ret = out["metrics"]["returned_episode_returns"]  # (S, updates)
        ret0, ret1 = float(ret[:, 0].mean()), float(ret[:, -1].mean())
        rows.append((size, wall, cpu, rate, cpu_rate, compile_s, ret0, ret1))
        print(
            f"# S={size}: compile {compile_s:.1f} s, warm-up {warm_s:.1f} s, runs wall "
            + ", ".join(f"{t:.2f}" for t in walls)
            + " s, CPU "
            + ", ".join(f"{t:.2f}" for t in cpus)
            + f" s -> {rate:,.0f} agent-steps/s, {cpu_rate:,.0f} per CPU-s "
            f"({rate / base[0]:.2f} / {cpu_rate / base[1]:.2f} x S=1)",
            flush=True,
        )

    print()
    print(
        "| S | wall s / run | CPU s / run | agent-steps/s summed over seeds (wall) | per seed "
        "| agent-steps per CPU-s | x S=1 (wall / per CPU-s) | compile s "
        "| mean return, update 1 -> last |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for size, wall, cpu, rate, cpu_rate, compile_s, ret0, ret1 in rows:
        print(
            f"| {size} | {wall:.2f} | {cpu:.2f} | {rate:,.0f} | {rate / size:,.0f} "
            f"| {cpu_rate:,.0f} | {rate / base[0]:.2f} / {cpu_rate / base[1]:.2f} "
            f"| {compile_s:.1f} | {ret0:.1f} -> {ret1:.1f} |"
        )
    print(f"\n# total wall {time.perf_counter() - t_total:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
