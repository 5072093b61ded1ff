"""``marl.compare --seeds-per-process S``: a variant's seeds trained as one ``marl.train
--seeds`` batch per process, with the same bookkeeping (status, finished detection, report)
as one process per run; designs the batch cannot train are refused up front."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from marl.experiments import compare
from marl.experiments.compare import process_groups
from marl.experiments.spec import RunSpec

REPO = Path(__file__).resolve().parents[1]
TINY = {"num_envs": 4, "rollout_steps": 16, "epochs": 1, "num_minibatches": 1, "hidden_dim": 16,
        "critic_hidden_dim": 16, "eval_every": 0, "eval_episodes": 2, "checkpoint_every": 1,
        "plots": False, "env": {"grid_size": 8, "max_cycles": 20, "n_targets": 1}}  # fmt: skip


def run(variant: str, seed: int) -> RunSpec:
    return RunSpec(variant, seed, f"out/runs/{variant}/seed_{seed}", "log", [f"--seed={seed}"])


def test_process_groups_batch_new_runs_per_variant_interleaved() -> None:
    spec = compare.CompareSpec(algo="mappo", config=None, variants=[], seeds=[0, 1, 2], out="o",
                               reference="a", seeds_per_process=2)  # fmt: skip
    runs = [run(v, s) for s in (0, 1, 2) for v in ("a", "b")]
    states = ["new"] * 5 + ["resumable"]  # b/seed_2 resumes alone
    groups = process_groups(spec, runs, states)
    keys = [[r.key for r in g] for g in groups]
    assert keys == [["b/seed_2"], ["a/seed_0", "a/seed_1"], ["b/seed_0", "b/seed_1"],
                    ["a/seed_2"]]  # fmt: skip
    spec.seeds_per_process = 1
    assert [len(g) for g in process_groups(spec, runs, states)] == [1] * 6


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--max-time", "60"], "env-step budget"),
        (["--total-steps", "64", "--algo", "marl.algos.grpo:GRPO"], "batches mappo and grpo"),
        (["--total-steps", "64", "--variant", "c:--tbptt-chunk=2"], "tbptt-chunk"),
        (["--total-steps", "64", "--seeds-per-process", "0"], "must be >= 1"),
    ],
)
def test_unbatchable_designs_are_refused_before_anything_runs(tmp_path, capsys, extra, match):
    out = tmp_path / "out"
    argv = ["--variant", "a:--alpha=0.5", "--seeds", "2", "--pilot", "--out", str(out),
            "--seeds-per-process", "2", *extra]  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        compare.main(argv)
    assert exit_info.value.code == 2
    assert match in capsys.readouterr().err
    assert not (out / "runs").exists()


def test_real_train_two_seeds_per_process(tmp_path) -> None:
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump(TINY))
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "marl.compare", "--algo", "mappo", "--config", str(cfg),
            "--variant", "batch:--whitening=batch", "--variant", "ti:--whitening=team_individual",
            "--seeds", "2", "--pilot", "--total-steps", "64", "--jobs", "2", "--out", str(out),
            "--seeds-per-process", "2", "--bootstrap-reps", "100", "--no-progress",
            "--no-plots"]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    res = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=280)
    assert res.returncode == 0, res.stderr[-3000:]
    status = json.loads((out / "status.json").read_text())
    for name in ("batch", "ti"):
        assert (out / "logs" / name / "seeds_0-1.log").is_file()
        for seed in (0, 1):
            entry = status[f"{name}/seed_{seed}"]
            assert entry["state"] == "finished" and "--seeds=0,1" in entry["command"]
            run_dir = out / "runs" / name / f"seed_{seed}"
            assert yaml.safe_load((run_dir / "config.yaml").read_text())["seed"] == seed
            assert (run_dir / "finished.json").is_file()
    s = json.loads((out / "summary.json").read_text())
    assert all(s["variants"][n]["n_finished"] == 2 for n in ("batch", "ti"))
