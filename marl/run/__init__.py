"""Run tooling: configuration and CLI, the training loop, evaluation, checkpoints, the run
log, plots and torch.distributed helpers."""
