"""Rollouts: the one collector (:mod:`marl.rollout.collect`: ``T`` steps of ``E`` envs of one
run or of S runs at once, and the rollout buffers it fills), whole episodes
(:mod:`marl.rollout.episodes`: GRPO's episode groups, one run or S, and the evaluation loop),
and the per-episode records and reward channels (:mod:`marl.rollout.episode_records`). Depends
on the env contract (:mod:`marl.adapters.envapi`) and the models (:mod:`marl.models`), never
on an algorithm."""
