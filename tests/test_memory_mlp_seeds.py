"""benchmarks/memory_mlp_seeds.py (issue 48, item 1's trained-mlp column): its table against
numpy on synthetic run directories (this script's batches and the study's runs pooled by seed,
unfinished runs left out), the bound, the command it trains with, and seeds per process."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location(
    "memory_mlp_seeds", ROOT / "benchmarks" / "memory_mlp_seeds.py"
)
script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(script)


def _run(where: Path, success: float, finished: bool = True) -> None:
    where.mkdir(parents=True)
    (where / "eval.json").write_text(json.dumps({"success_rate": success}))
    if finished:
        (where / "finished.json").write_text("{}")


def test_the_table_pools_both_sources_by_seed(tmp_path: Path) -> None:
    ours, study = tmp_path / "ours", tmp_path / "study"
    rng = np.random.default_rng(0)
    values = {k: float(v) for k, v in enumerate(rng.uniform(0.2, 0.3, 8))}
    for k in range(4):
        _run(study / "h64" / "runs" / "mlp" / f"seed_{k}", values[k])
    for k in range(4, 8):
        _run(ours / "h64" / "seeds_4-7" / f"seed_{k}", values[k])
    _run(ours / "h64" / "seeds_8-8" / "seed_8", 0.9, finished=False)  # not counted
    _run(ours / "h256" / "seeds_4-7" / "seed_4", 0.5)
    rows = script.table([64, 256, 1024], str(ours), str(study))
    assert [r["H"] for r in rows] == [64, 256]  # 1024: no runs, no row
    row = rows[0]
    assert row["seeds"] == list(range(8)) and row["n"] == 8
    expected = np.mean([values[k] for k in range(8)])
    assert abs(row["mean"] - expected) < 1e-12
    assert row["chance"] == 0.25 and abs(row["margin"] - (expected - 0.25)) < 1e-12
    lo, hi = row["ci"]
    assert lo < expected < hi and hi - lo < 0.1
    assert row["within"] is True and rows[1]["within"] is False  # 0.5 > 0.25 + 0.1
    text = script.markdown(rows)
    assert f"| 64 | 8 | 0.250 | {expected:.3f} [" in text and "| no |" in text


def test_the_command_is_the_study_arm_and_resumes(tmp_path: Path) -> None:
    from marl.experiments.studies import memory_horizon_settings

    cmd = script.command(256, 16, 31, str(tmp_path))
    assert all(a in cmd for a in memory_horizon_settings(256))
    assert "--backbone=mlp" in cmd and "--total-steps=1000000" in cmd and "--seeds=16-31" in cmd
    batch = tmp_path / "h256" / "seeds_16-31"
    (batch / "seed_16" / "checkpoints").mkdir(parents=True)
    # stopped before its first checkpoint: nothing to resume, a fresh start
    assert script.command(256, 16, 31, str(tmp_path)) == cmd
    (batch / "seed_16" / "checkpoints" / "latest.pt").write_bytes(b"")
    again = script.command(256, 16, 31, str(tmp_path))
    assert f"--resume={batch}" in again
    assert [script.seeds_per_process(h) for h in (64, 256, 1024, 4096)] == [16, 16, 4, 1]


def test_main_starts_a_batch_stopped_before_its_first_checkpoint_afresh(
    tmp_path: Path, monkeypatch
) -> None:
    """A batch directory without a checkpoint (stopped in its first update) is removed and
    trained from the start; one with a checkpoint is resumed and kept."""
    stale = tmp_path / "h4096" / "seeds_16-16" / "seed_16"
    stale.mkdir(parents=True)
    (stale / "metrics.jsonl").write_text("")
    kept = tmp_path / "h4096" / "seeds_17-17" / "seed_17" / "checkpoints"
    kept.mkdir(parents=True)
    (kept / "latest.pt").write_bytes(b"")
    calls: list[list[str]] = []

    def run(cmd, **_):
        calls.append(cmd)
        assert not stale.parent.exists() or "--resume" in " ".join(cmd)

    monkeypatch.setattr(script.subprocess, "run", run)
    monkeypatch.setattr(script, "table", lambda *a: [])
    script.main(["--horizons", "4096", "--seeds", "16-17", "--runs", str(tmp_path)])
    assert len(calls) == 2
    assert f"--run-dir={stale.parent}" in calls[0] and not any("--resume" in a for a in calls[0])
    assert f"--resume={kept.parents[1]}" in calls[1]
    assert kept.is_dir()
