"""benchmarks/update_path.py, the profiler count of the update path (issue 46, item 3): the path
runs from the train loop to the function that calls the policy's ``optimizer.step()``, holds
the update's parts a reader must pass (the algorithm's update, the loss, the backward's
clipping), and leaves out the rollout and the entry points above the train loop."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def update_path():
    script = REPO / "benchmarks" / "update_path.py"
    spec = importlib.util.spec_from_file_location("update_path", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _train_args(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "--total-steps", "1024", "--num-envs", "4", "--rollout-steps", "32",
        "--run-dir", str(tmp_path / "run"), "--eval-every", "0", "--progress", "false",
        "--plots", "false", *extra,
    ]  # fmt: skip


def test_the_path_runs_from_the_train_loop_to_the_optimizer_step(update_path, tmp_path) -> None:
    path = update_path.trace_update_path(_train_args(tmp_path))
    names = [q for _, q in path]
    assert sys.getprofile() is None  # the profiler is removed
    assert names[0] == "_train_loop" and path[0][0] == os.path.join("marl", "run", "train.py")
    for needed in ("SeedMAPPO.update", "PolicyUpdate.minibatch_step", "ppo_surrogate"):
        assert needed in names, needed
    # the function that calls optimizer.step() is on the spine, before the policy phase's calls
    assert names.index("PolicyUpdate.minibatch_step") < names.index("ppo_surrogate")
    # not on the path: the entry points, the rollout, comprehensions
    assert "main" not in names and "train" not in names
    assert not any("collect" in q.lower() for q in names)
    assert not any(q.rsplit(".", 1)[-1].startswith("<") for q in names)
    assert len(set(path)) == len(path)


def test_a_frame_name_that_is_not_on_the_stack_keeps_the_whole_spine(update_path, tmp_path):
    path = update_path.trace_update_path(_train_args(tmp_path), origins=("no_such_function",))
    assert [q for _, q in path][:2] == ["main", "main"]  # marl/train.py, then marl/run/train.py
