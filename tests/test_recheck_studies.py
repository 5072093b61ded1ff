"""benchmarks/recheck_studies.py: published studies re-decided under the protocol, checked
against a hand-built summary.json whose exact paired p-values are counted here by brute force
over every sign arrangement, and Holm applied by hand."""

from __future__ import annotations

import importlib.util
import itertools
import json
from pathlib import Path

import numpy as np
import pytest

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "recheck_studies.py"

SEEDS = [0, 1, 2, 3, 4, 5]
VALUES = {
    "base": [0.50, 0.40, 0.60, 0.55, 0.45, 0.50],
    "up": [0.70, 0.65, 0.80, 0.75, 0.70, 0.72],  # every seed better
    "same": [0.52, 0.38, 0.61, 0.54, 0.47, 0.49],  # mixed signs
}


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("recheck_studies", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def exact_paired_p(x: list[float], y: list[float]) -> float:
    """Two-sided sign-flip p-value over all 2^n arrangements, numpy float64."""
    d = np.asarray(x, dtype=np.float64) - np.asarray(y, dtype=np.float64)
    observed = abs(d.mean())
    hits = sum(
        abs((d * np.array(signs)).mean()) >= observed - 1e-12
        for signs in itertools.product([1.0, -1.0], repeat=len(d))
    )
    return hits / 2 ** len(d)


def summary(tmp_path: Path) -> Path:
    poi = {
        "up": {"value": 1.0, "ci": [1.0, 1.0],
               "mean_difference": {"value": 0.22, "ci": [0.19, 0.25]}},
        "same": {"value": 0.5, "ci": [0.2, 0.8],
                 "mean_difference": {"value": 0.0, "ci": [-0.02, 0.02]}},
    }  # fmt: skip
    s = {
        "title": "hand-built",
        "reference": "base",
        "variants": {
            name: {"metrics": {"success_rate": {"values": v, "seeds": SEEDS}}}
            for name, v in VALUES.items()
        },
        "probability_of_improvement": {k: {"success_rate": v} for k, v in poi.items()},
    }
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(s))
    return path


def test_p_values_holm_and_verdicts_match_a_hand_count(script, tmp_path) -> None:
    title, rows = script.recheck(str(summary(tmp_path)), "success_rate")
    assert title == "hand-built"
    by = {r["variant"]: r for r in rows}
    p_up = exact_paired_p(VALUES["up"], VALUES["base"])  # 2 / 64: all differences positive
    p_same = exact_paired_p(VALUES["same"], VALUES["base"])
    assert p_up == pytest.approx(2 / 64)
    assert by["up"]["p"] == pytest.approx(p_up) and by["same"]["p"] == pytest.approx(p_same)
    # Holm over two: the smaller times 2, the larger max(itself, that), capped at 1
    assert by["up"]["p_holm"] == pytest.approx(min(1.0, 2 * p_up))
    assert by["same"]["p_holm"] == pytest.approx(min(1.0, max(p_same, 2 * p_up)))
    assert by["up"]["shown"] is False  # 0.0625 after correction: nothing shown at 6 seeds
    assert by["up"]["diff_ci"] == [0.19, 0.25]


def test_the_table_prints_each_difference_with_its_interval(script, tmp_path, capsys) -> None:
    assert script.main([str(summary(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert "| up | base | 6 vs 6 | 1.00 [1.00, 1.00] | +0.220 [+0.190, +0.250] |" in out
    assert "nothing shown" in out


def test_a_missing_file_is_an_error(script, tmp_path, capsys) -> None:
    assert script.main([str(tmp_path / "absent.json")]) == 2
    assert "no such file" in capsys.readouterr().err
