"""benchmarks/diversity_websearch.py: the entropy-matching temperature (bisection on log T)
and its refusal of a directory without the arms."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "diversity_websearch.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("diversity_websearch", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_matching_temperature_finds_the_target(script) -> None:
    def entropy_at(t: float) -> float:  # grows with T, as a policy's entropy does
        return 1.0 - math.exp(-t)

    target = 1.0 - math.exp(-2.0)  # reached at T = 2
    t = script.matching_temperature(entropy_at, target, tolerance=1e-4, steps=30)
    assert abs(entropy_at(t) - target) <= 1e-4 and t == pytest.approx(2.0, rel=1e-3)
    # outside the range: the nearer end
    assert script.matching_temperature(entropy_at, 0.0) == pytest.approx(0.25)
    assert script.matching_temperature(entropy_at, 2.0) == pytest.approx(8.0)


def test_missing_arm_is_an_error(script, tmp_path, capsys) -> None:
    (tmp_path / "runs" / "calibrated").mkdir(parents=True)
    assert script.main([str(tmp_path)]) == 2
    assert "no runs of 'baseline'" in capsys.readouterr().err


def test_the_script_runs_as_documented() -> None:
    """``python benchmarks/diversity_websearch.py``: its folder leads sys.path there, and the
    benchmark seqmodels.py must not shadow the seqmodels package."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(PATH), "--help"], capture_output=True, text=True,
                         cwd=PATH.parents[1], timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "--variant" in out.stdout and "--baseline" in out.stdout
