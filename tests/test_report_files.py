"""The report's plots at the weight the results budget allows (issue 51): PNGs with a palette
of at most 256 colours that look like matplotlib's own render, and ``python -m
marl.experiments.persist --reports DIR``, which brings the plots of a study published before
to that form without touching anything else.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import matplotlib
import numpy as np
import pytest
from PIL import Image

from marl.experiments import persist, report

matplotlib.use("Agg", force=True)
import matplotlib.pyplot as plt  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def _figure() -> plt.Figure:
    """A figure like the report's: several coloured curves with translucent bands."""
    fig, ax = plt.subplots(figsize=(5, 3))
    x = np.linspace(0, 1, 60)
    for k in range(6):
        y = np.sin(6 * x + k) * 0.3 + k * 0.2
        ax.plot(x, y, label=f"v{k}")
        ax.fill_between(x, y - 0.1, y + 0.1, alpha=0.2)
    ax.legend(fontsize=7)
    ax.set_title("episode/success: mean over seeds, 95% CI")
    return fig


def _rgb(source) -> np.ndarray:
    with Image.open(source) as image:
        return np.asarray(image.convert("RGB"), dtype=np.int16)


def test_save_png_is_a_palette_that_looks_like_matplotlibs_render(tmp_path: Path) -> None:
    fig = _figure()
    reference = io.BytesIO()
    fig.savefig(reference, format="png", dpi=100)
    path = tmp_path / "plot.png"
    report.save_png(fig, str(path), dpi=100)
    plt.close(fig)
    with Image.open(path) as image:
        assert image.format == "PNG" and image.mode == "P"
        assert len(image.getcolors(maxcolors=257) or ()) <= 256
    ours, theirs = _rgb(path), _rgb(io.BytesIO(reference.getvalue()))
    assert ours.shape == theirs.shape
    distance = np.abs(ours - theirs).max(axis=-1)
    # every pixel near the original (of 255 levels), on average within a level or two
    assert distance.max() <= 64, distance.max()
    assert distance.mean() <= 2.0, distance.mean()
    assert np.mean(distance <= 16) >= 0.99, np.mean(distance <= 16)
    assert path.stat().st_size < 0.6 * len(reference.getvalue())


def test_compact_png_leaves_a_palette_png_as_it_is(tmp_path: Path) -> None:
    fig = _figure()
    first = tmp_path / "a.png"
    report.save_png(fig, str(first), dpi=80)
    plt.close(fig)
    second = tmp_path / "b.png"
    report.compact_png(str(first), str(second))
    assert second.read_bytes() == first.read_bytes()


def _old_study(root: Path) -> dict:
    """A study as published before: RGBA PNGs, a summary.json, an at_N report, runs."""
    summary = {"variants": {"a": {"final": [0.25, 0.5]}}, "p_value": 0.03125, "plots": []}
    for where in (root, root / "at_100_env_steps"):
        (where / "plots").mkdir(parents=True)
        (where / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
        fig = _figure()
        fig.savefig(where / "plots" / "learning_curves.png", dpi=60)
        plt.close(fig)
    run = root / "runs" / "a" / "seed_0"
    run.mkdir(parents=True)
    fig = _figure()
    fig.savefig(run / "curve.png", dpi=60)
    plt.close(fig)
    (run / "eval.json").write_text('{"success_rate": 0.5}\n')
    return summary


def test_compact_reports_rewrites_the_plots_only(tmp_path: Path) -> None:
    study = tmp_path / "study"
    summary = _old_study(study)
    run_png = (study / "runs" / "a" / "seed_0" / "curve.png").read_bytes()
    pixels = _rgb(study / "plots" / "learning_curves.png")
    before, after = persist.compact_reports(str(study))
    assert 0 < after < before
    for where in (study, study / "at_100_env_steps"):
        assert (where / "summary.json").read_text() == json.dumps(summary, indent=1) + "\n"
        with Image.open(where / "plots" / "learning_curves.png") as image:
            assert image.mode == "P"
    assert np.abs(_rgb(study / "plots" / "learning_curves.png") - pixels).max() <= 64
    assert (study / "runs" / "a" / "seed_0" / "curve.png").read_bytes() == run_png
    # a second pass changes nothing
    snapshot = {p: p.read_bytes() for p in study.rglob("*") if p.is_file()}
    persist.compact_reports(str(study))
    assert {p: p.read_bytes() for p in study.rglob("*") if p.is_file()} == snapshot


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "marl.experiments.persist", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
    )


def test_cli_reports(tmp_path: Path) -> None:
    study = tmp_path / "study"
    _old_study(study)
    done = _cli("--reports", str(study))
    assert done.returncode == 0, done.stderr
    assert "MB ->" in done.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--reports", "MISSING"], "is not a directory"),
        (["--reports", "DIR", "--policies"], "--reports takes DIR alone"),
        (["--reports", "DIR", "--in-place", "DIR"], "not allowed with argument"),
    ],
)
def test_cli_reports_errors(tmp_path: Path, args: list[str], message: str) -> None:
    study = tmp_path / "study"
    summary = _old_study(study)
    args = [str(study) if a == "DIR" else str(tmp_path / a) if a == "MISSING" else a for a in args]
    done = _cli(*args)
    assert done.returncode == 2
    assert message in done.stderr
    # nothing was changed
    assert (study / "summary.json").read_text() == json.dumps(summary, indent=1) + "\n"
