"""Algorithms: the :class:`~marl.algos.base.Algorithm` interface, the shared PPO-style policy
update (:mod:`marl.algos.ppo`), and MAPPO / GRPO, each with its own configuration class."""
