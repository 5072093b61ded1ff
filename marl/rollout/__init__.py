"""Rollouts: the one collector (:mod:`marl.rollout.collect`: ``T`` steps of ``E`` envs for MAPPO,
whole episode groups for GRPO, the evaluation loop, and the rollout buffers both collectors
fill) and its seed-stacked form for ``--seeds`` (:mod:`marl.rollout.seed_collect`); the
per-episode records and reward channels (:mod:`marl.rollout.episode_records`). Depends on the
env contract (:mod:`marl.adapters.envapi`) and the models (:mod:`marl.models`), never on an
algorithm."""
