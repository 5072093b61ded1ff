"""Rollouts: the one collector (:mod:`marl.rollout.collect`: ``T`` steps of ``E`` envs for MAPPO,
whole episode groups for GRPO, the evaluation loop) and its seed-stacked form for ``--seeds``
(:mod:`marl.rollout.seed_collect`). Depends on the env contract (:mod:`marl.adapters.envapi`)
and the models (:mod:`marl.models`), never on an algorithm."""
