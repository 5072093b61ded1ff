"""benchmarks/gpu.sh on any machine: --help, --dry-run, bad options and the no-CUDA refusal
(CUDA hidden with CUDA_VISIBLE_DEVICES, so this also holds on a GPU machine); and the pieces of
benchmarks/gpu_bench.py that need no GPU."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu.sh"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def gpu_sh(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def _load_gpu_bench():
    spec = importlib.util.spec_from_file_location("gpu_bench", ROOT / "benchmarks" / "gpu_bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_help_lists_every_option():
    proc = gpu_sh("--help")
    assert proc.returncode == 0, proc.stderr
    for option in ("--skip-install", "--python PATH", "--quick", "--out DIR", "--dry-run"):
        assert option in proc.stdout
    assert proc.stderr == ""


def test_dry_run_prints_the_steps_and_runs_nothing(tmp_path):
    out = tmp_path / "gpu out"
    proc = gpu_sh("--dry-run", "--quick", "--python", sys.executable, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("$ ")]
    commands = "\n".join(lines)
    assert "gpu_bench.py check" in lines[0]  # the CUDA check comes first
    assert "pip install --no-build-isolation -e .\\[cuda\\]" in commands
    assert "-m pytest -m gpu" in commands
    assert "gpu_bench.py kernels --quick --out" in commands
    assert "gpu_bench.py train --quick --out" in commands
    assert all(line.split()[1] == sys.executable for line in lines if "gpu_bench" in line)
    assert not out.exists()  # nothing ran, nothing was written

    skipped = gpu_sh("--dry-run", "--skip-install")
    assert skipped.returncode == 0
    assert "pip install" not in skipped.stdout and "install: skipped" in skipped.stdout
    assert "--quick" not in skipped.stdout and "--out runs/gpu" in skipped.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bogus"], "unknown option '--bogus'"),
        (["--out"], "--out needs a DIR"),
        (["--python"], "--python needs a PATH"),
        (["--python", "/nonexistent/python"], "is not an executable"),
    ],
)
def test_bad_options_exit_2_with_a_message(args, message):
    proc = gpu_sh(*args)
    assert proc.returncode == 2
    assert message in proc.stderr and "--help" in proc.stderr
    assert "==" not in proc.stdout  # no step started


def test_no_cuda_device_exits_2_before_installing_anything(tmp_path):
    out = tmp_path / "out"
    proc = gpu_sh("--out", str(out), "--python", sys.executable, CUDA_VISIBLE_DEVICES="")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no CUDA device" in proc.stderr and "--dry-run" in proc.stderr
    assert "pip install" not in proc.stdout  # stopped at step 0
    assert not out.exists()


def test_gpu_bench_train_summary_and_device_check(tmp_path, capsys):
    gpu_bench = _load_gpu_bench()
    run = tmp_path / "run"
    run.mkdir()
    rows = [
        {"update": 1, "env_steps": 100, "sps": 10.0, "time/collect_s": 9.0, "time/update_s": 9.0},
        {"update": 2, "env_steps": 200, "sps": 50.0, "time/collect_s": 1.0, "time/update_s": 2.0},
        {"update": 3, "env_steps": 300, "sps": 70.0, "time/collect_s": 3.0, "time/update_s": 4.0},
        {"eval/mean_return": 1.0, "env_steps": 300},
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = gpu_bench.summarise_run(run)  # medians over the updates after the first
    assert summary == {
        "updates": 3,
        "env_steps": 300,
        "sps": 60.0,
        "collect_s": 2.0,
        "update_s": 3.0,
    }
    assert gpu_bench.main(["train", "--devices", "tpu", "--out", str(tmp_path)]) == 2
    assert "--devices takes cpu and/or cuda" in capsys.readouterr().err
    command = gpu_bench.train_command("cuda", tmp_path / "r", True, ["--env.preset", "hard"])
    assert "--backbone=mamba" in command and "--device=cuda" in command
    assert command[-2:] == ["--env.preset", "hard"]
