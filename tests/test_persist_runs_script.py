"""benchmarks/persist_runs.sh: keeps exactly the finished runs' small files, restorable."""

from __future__ import annotations

import lzma
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "persist_runs.sh"


def persist(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def make_run(root: Path, arm: str, seed: int, finished: bool) -> Path:
    run = root / "runs" / arm / f"seed_{seed}"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(f"seed: {seed}\n")
    (run / "metrics.jsonl").write_text('{"update": 1, "loss/value": 0.5}\n{"update": 2}\n')
    (run / "checkpoint.pt").write_bytes(b"\0" * 64)  # large files stay behind
    if finished:
        (run / "eval.json").write_text('{"solved_rate": 0.5}')
        (run / "finished.json").write_text("{}")
    return run


def test_copies_finished_runs_only(tmp_path: Path) -> None:
    src, dest = tmp_path / "study", tmp_path / "kept"
    src.mkdir()
    (src / "compare.json").write_text('{"arms": []}')
    make_run(src, "gru", 0, finished=True)
    make_run(src, "gru", 1, finished=False)
    make_run(src, "mamba", 0, finished=True)
    res = persist(str(src), str(dest))
    assert res.returncode == 0, res.stderr
    assert "2 finished run(s)" in res.stdout
    kept = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert kept == [
        "compare.json",
        *(f"runs/{a}/seed_0/{f}" for a in ("gru", "mamba")
          for f in ("config.yaml", "eval.json", "finished.json", "metrics.jsonl.xz")),
    ]  # fmt: skip
    text = lzma.decompress((dest / "runs/gru/seed_0/metrics.jsonl.xz").read_bytes()).decode()
    assert text == '{"update":1}\n{"update":2}\n'  # the compact form: keys the report reads


def test_a_second_copy_is_byte_identical(tmp_path: Path) -> None:
    """Rerunning it (a loop every few minutes) leaves the kept files unchanged, so git sees no
    change in the runs already committed (xz holds no name or timestamp)."""
    import os

    src, dest = tmp_path / "study", tmp_path / "kept"
    src.mkdir()
    (src / "compare.json").write_text("{}")
    run = make_run(src, "gru", 0, finished=True)
    assert persist(str(src), str(dest)).returncode == 0
    first = (dest / "runs/gru/seed_0/metrics.jsonl.xz").read_bytes()
    stat = (run / "metrics.jsonl").stat()
    os.utime(run / "metrics.jsonl", (stat.st_atime + 5, stat.st_mtime + 5))
    assert persist(str(src), str(dest)).returncode == 0
    assert (dest / "runs/gru/seed_0/metrics.jsonl.xz").read_bytes() == first


def test_rejects_a_directory_that_is_not_a_comparison(tmp_path: Path) -> None:
    res = persist(str(tmp_path), str(tmp_path / "kept"))
    assert res.returncode == 2
    assert "no compare.json" in res.stderr
    assert not (tmp_path / "kept").exists()
    assert persist().returncode == 2


def test_results_runs_are_not_gitignored() -> None:
    """docs/results/**/runs/ must be committable (a bare ``runs/`` rule once dropped them)."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    res = subprocess.run(
        ["git", "check-ignore", "-q", "docs/results/memory_study/memory/runs/gru/seed_0/eval.json"],
        cwd=REPO, capture_output=True, timeout=30,
    )  # fmt: skip
    assert res.returncode == 1  # 1 = not ignored
