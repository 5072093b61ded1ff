"""``marl.compare --tasks``: one comparison per preset and the table across tasks."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from marl.experiments import compare, stats

FAKE_TRAIN = [sys.executable, "-m", "marl.train"]


def test_performance_profile_hand_worked():
    # 2 runs x 2 tasks: scores 0.2, 0.6 / 0.8, 1.0 -> fraction above 0.5 is 3/4, above 0.9 1/4
    scores = {"a": np.array([[0.2, 0.6], [0.8, 1.0]])}
    prof = stats.performance_profiles(scores, [0.5, 0.9], reps=200)
    profile, band = prof["a"]
    np.testing.assert_allclose(profile, [0.75, 0.25])
    assert band.shape == (2, 2) and np.all(band[0] <= profile + 1e-12)
    assert np.all(band[1] >= profile - 1e-12)


@pytest.mark.slow
def test_tasks_runs_each_preset_and_writes_the_table(tmp_path, capsys):
    out = tmp_path / "bench"
    argv = [
        "--tasks", "small,sparse",
        "--variant", "base:--num-envs=8,--rollout-steps=16",
        "--seeds", "2", "--pilot", "--total-steps", "256", "--jobs", "2", "--out", str(out),
        "--common=--eval-episodes=4,--eval-every=0,--plots=false",
        "--no-progress", "--bootstrap-reps", "100",
    ]  # fmt: skip
    assert compare.main(argv) == 0
    table = json.loads((out / "tasks.json").read_text())
    assert set(table["tasks"]) == {"small", "sparse"}
    for task in ("small", "sparse"):
        cfg = (out / task / "runs" / "base" / "seed_0" / "config.yaml").read_text()
        assert f"preset: {task}" in cfg
        entry = table["tasks"][task]
        assert entry["variants"]["base"]["success_rate"]["n"] == 2
        assert set(entry["baselines"]) == {"heuristic", "random"}
        assert entry["baselines"]["heuristic"]["success_rate"] >= 0.9
    text = (out / "tasks.md").read_text()
    assert "| sparse | base |" in text and "*heuristic*" in text
    assert (out / "plots" / "performance_profile.png").exists()
    with pytest.raises(SystemExit):
        compare.main([*argv[:2], "--variant", "x:", "--out", str(out / "bad"),
                      "--common=--env.preset=small"])  # fmt: skip
