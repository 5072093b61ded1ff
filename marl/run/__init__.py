"""Run tooling: configuration and CLI, the training loop, evaluation, checkpoints, the run
log, plots and torch.distributed helpers; a trained policy loaded (``marl.load_policy``,
:mod:`marl.run.policy_api`) and exported (``python -m marl.export``, :mod:`marl.run.export`)."""
