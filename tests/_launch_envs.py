"""Outside-env factories for tests/test_adapters_launch.py (imported by ``--env-fn`` in the
trainer processes and the adapter's spawned workers, with ``tests/`` on PYTHONPATH).

- :func:`seed_logged_spread`: mpe2's simple_spread (a PettingZoo ParallelEnv) that appends
  every ``reset`` seed to ``$SEED_LOG_DIR/rank<RANK>.jsonl``, so a test sees which env seeds
  each torchrun rank used without reading the trainer's internals.
- :func:`slow_step_env`: a Gymnasium env whose ``step`` sleeps ``step_s`` seconds (a worker
  busy inside an env step).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import gymnasium
import numpy as np
from pettingzoo.utils import BaseParallelWrapper


class SeedLog(BaseParallelWrapper):
    """Records ``reset(seed=...)`` of the wrapped env: one JSON line per call."""

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        log_dir = os.environ.get("SEED_LOG_DIR")
        if log_dir:
            path = os.path.join(log_dir, f"rank{os.environ.get('RANK', '0')}.jsonl")
            with open(path, "a") as fh:
                fh.write(json.dumps({"seed": seed, "pid": os.getpid()}) + "\n")
        return self.env.reset(seed=seed, options=options)


def seed_logged_spread(**kwargs: Any) -> SeedLog:
    from mpe2 import simple_spread_v3

    return SeedLog(simple_spread_v3.parallel_env(**kwargs))


class SlowStepEnv(gymnasium.Env):
    """One observation, two actions; ``step`` sleeps ``step_s`` seconds; 5 steps an episode."""

    def __init__(self, step_s: float = 0.0) -> None:
        self.step_s = float(step_s)
        self.observation_space = gymnasium.spaces.Box(0.0, 1.0, (1,), np.float32)
        self.action_space = gymnasium.spaces.Discrete(2)
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action: int):
        time.sleep(self.step_s)
        self.t += 1
        return np.zeros(1, np.float32), 0.0, False, self.t >= 5, {}


def slow_step_env(step_s: float = 0.0) -> SlowStepEnv:
    return SlowStepEnv(step_s)
