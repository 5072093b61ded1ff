"""Models: the per-agent-type actors, the masked categorical and the centralised critic
(:mod:`marl.models.policies`), and their seed-stacked forms, S single-seed modules as one with a
leading seed axis (:mod:`marl.models.seed_policies`, its backbones in
:mod:`marl.models.seed_backbones`). Algorithm-agnostic: MAPPO and GRPO both build them; the
backbones come from ``seqmodels.backbones``."""
