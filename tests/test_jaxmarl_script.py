"""benchmarks/jaxmarl_seeds.py (the outside reference of BENCHMARKS.md's "Many seeds at once")
on a machine without jax: --help explains, bad sizes are refused, and a missing jax / jaxmarl
stops with exit 2 and the install line, before any work."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "jaxmarl_seeds.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def test_help_names_the_command_and_the_seed_sizes():
    out = run("--help")
    assert out.returncode == 0
    assert "taskset -c 0" in out.stdout and "--seeds" in out.stdout


@pytest.mark.parametrize("args", [["--seeds", "0"], ["--updates", "0"], ["--repeats", "-1"]])
def test_sizes_below_one_are_refused(args):
    out = run(*args)
    assert out.returncode == 2
    assert "must be >= 1" in out.stderr


@pytest.mark.skipif(
    all(importlib.util.find_spec(m) is not None for m in ("jax", "jaxmarl", "distrax")),
    reason="jax, jaxmarl and distrax are installed here",
)
def test_without_jax_it_says_how_to_install():
    out = run("--seeds", "1", "--updates", "1", "--repeats", "1")
    assert out.returncode == 2
    assert "pip install jaxmarl distrax" in out.stderr
    assert out.stdout == ""  # no table row: nothing was measured
