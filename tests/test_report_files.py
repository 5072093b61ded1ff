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
from marl.experiments.report.summary import PLOTTED_DIGITS, summary_text

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
        assert (where / "summary.json").read_text() == summary_text(summary)
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
        (["--redraw", "DIR", "DIR2"], "--redraw goes with --reports DIR"),
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


def _curvy_summary(rng: np.random.Generator) -> dict:
    """A summary whose plotted-only sections hold full-precision floats, beside numbers that
    must stay exact (per-seed values, p-values)."""
    curve = {"env_steps": [100, 200, 300], "n": 3, "mean": rng.random(3).tolist()}
    curve["ci_low"] = [m - 1e-3 / 3 for m in curve["mean"]]
    return {
        "variants": {
            name: {
                "metrics": {"success_rate": {"values": rng.random(3).tolist(), "mean": 1 / 3}},
                "curves": {"episode/success": curve},
                "advantages": {"all": {"adv": {"std": {**curve, "mean": [1e-9 / 7, 0.0, -2 / 3]}}}},
                "stability_per_run": [{"final_entropy": 2 / 7}],
            }
            for name in ("a", "b")
        },
        "probability_of_improvement": {"b": {"success_rate": {"p_value": 1 / 3}}},
    }


def _numbers(tree, path=()):
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _numbers(v, (*path, k))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            yield from _numbers(v, (*path, i))
    elif isinstance(tree, float):
        yield path, tree


@pytest.mark.parametrize("indent", [1, 2])
def test_plotted_curves_are_rounded_and_nothing_else(tmp_path: Path, indent: int) -> None:
    """``--reports`` (and every report written now) keeps the plotted-only curves at
    PLOTTED_DIGITS (5) significant digits, within 5e-5 relative; every other number and the
    key order stay as they were, in the layout reports write now whatever the old indent; a
    second pass changes nothing."""
    summary = _curvy_summary(np.random.default_rng(0))
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(summary, indent=indent) + "\n")
    persist.compact_reports(str(tmp_path))
    text = path.read_text()
    rounded = json.loads(text)
    assert text == summary_text(rounded)
    assert list(_numbers(rounded)) != list(_numbers(summary))
    for (where, old), (where_new, new) in zip(_numbers(summary), _numbers(rounded), strict=True):
        assert where == where_new
        if where[2] in ("curves", "advantages"):
            assert abs(new - old) <= 0.5 * 10.0 ** (1 - PLOTTED_DIGITS) * abs(old), (where, old)
            assert new == float(f"{old:.{PLOTTED_DIGITS}g}")
        else:
            assert new == old, where
    persist.compact_reports(str(tmp_path))
    assert path.read_text() == text


def test_write_all_rounds_the_file_not_the_summary(tmp_path: Path, monkeypatch) -> None:
    """summary.json gets the rounded curves; the summary in memory (what the report's plots
    and tables read) keeps every digit."""
    summary = _curvy_summary(np.random.default_rng(1))
    kept = json.loads(json.dumps(summary))
    monkeypatch.setattr(report, "write_report", lambda summary, out: None)
    monkeypatch.setattr(report, "write_runs_csv", lambda summary, out: None)
    report.write_all(summary, str(tmp_path), plots=False)
    written = json.loads((tmp_path / "summary.json").read_text())
    for name, entry in written["variants"].items():
        old = kept["variants"][name]
        assert entry["metrics"] == old["metrics"]
        assert entry["stability_per_run"] == old["stability_per_run"]
        mean = entry["curves"]["episode/success"]["mean"]
        digits = PLOTTED_DIGITS
        assert mean == [float(f"{v:.{digits}g}") for v in old["curves"]["episode/success"]["mean"]]
        assert mean != old["curves"]["episode/success"]["mean"]
    assert summary["variants"] == kept["variants"]


def test_summary_text_layout_by_hand() -> None:
    """One space per level, keys in order, lists of plain values on one line, lists holding
    mappings or lists one item per line; read back to the last digit."""
    summary = {
        "b": {"values": [0.1, 1 / 3, None, True, "x"], "empty": {}, "none": []},
        "a": [{"n": 1}, [2, 3]],
        "p": 2 / 3,
    }
    expected = (
        "{\n"
        ' "b": {\n'
        '  "values": [0.1,0.3333333333333333,null,true,"x"],\n'
        '  "empty": {},\n'
        '  "none": []\n'
        " },\n"
        ' "a": [\n'
        "  {\n"
        '   "n": 1\n'
        "  },\n"
        "  [2,3]\n"
        " ],\n"
        ' "p": 0.6666666666666666\n'
        "}\n"
    )
    assert summary_text(summary) == expected
    assert json.loads(expected) == summary
    with pytest.raises(ValueError):
        summary_text({"x": [float("nan")]})
    assert summary_text({"x": [float("nan")]}, allow_nan=True) == '{\n "x": [NaN]\n}\n'


def test_summary_text_is_smaller_than_indent_one(tmp_path: Path) -> None:
    """The layout's point (issue 51's budget): on a summary of curves, at least a fifth fewer
    bytes than ``json.dumps(indent=1)``, and the same values."""
    summary = _curvy_summary(np.random.default_rng(2))
    for entry in summary["variants"].values():
        entry["curves"]["episode/success"]["mean"] *= 50
    text = summary_text(summary)
    assert json.loads(text) == summary
    assert len(text) <= 0.8 * len(json.dumps(summary, indent=1))


# ------------------------------------------------------------------------------------------
# --redraw: a published study's report plots drawn again from its summary.json
# ------------------------------------------------------------------------------------------
SMALL_STUDY = REPO / "docs" / "results" / "whitening_position" / "mappo"


@pytest.mark.skipif(not (SMALL_STUDY / "summary.json").is_file(), reason="needs the study")
def test_redraw_draws_the_report_plots_again_from_the_summary(tmp_path: Path) -> None:
    """``--reports DIR --redraw`` replaces each plot the report draws with the report's
    drawing of the (rewritten) summary.json, byte for byte what ``make_plots`` writes from
    it; a study's own figure is only re-encoded, no plot is added, runs/ is left alone, and a
    second pass changes nothing."""
    study = tmp_path / "study"
    (study / "plots").mkdir(parents=True)
    (study / "summary.json").write_text((SMALL_STUDY / "summary.json").read_text())
    for name in ("learning_curves.png", "advantages_batch.png", "own_figure.png"):
        fig = _figure()  # stale drawings, RGBA as matplotlib writes them
        fig.savefig(study / "plots" / name, dpi=60)
        plt.close(fig)
    own = _rgb(study / "plots" / "own_figure.png")
    run_png = study / "runs" / "a" / "seed_0" / "curve.png"
    run_png.parent.mkdir(parents=True)
    run_png.write_bytes((study / "plots" / "own_figure.png").read_bytes())
    kept = run_png.read_bytes()

    persist.compact_reports(str(study), redraw=True)

    expected = tmp_path / "expected"
    report.make_plots(json.loads((study / "summary.json").read_text()), str(expected))
    names = sorted(p.name for p in (study / "plots").iterdir())
    assert names == ["advantages_batch.png", "learning_curves.png", "own_figure.png"]
    for name in ("learning_curves.png", "advantages_batch.png"):
        assert (study / "plots" / name).read_bytes() == (expected / "plots" / name).read_bytes()
    with Image.open(study / "plots" / "learning_curves.png") as image:
        assert image.mode == "P"
        width = image.size[0]
    assert width == round(18 * report.plots.PLOT_DPI)  # three 6-inch panels
    with Image.open(study / "plots" / "own_figure.png") as image:
        assert image.mode == "P" and image.size == (own.shape[1], own.shape[0])
    assert np.abs(_rgb(study / "plots" / "own_figure.png") - own).max() <= 64
    assert run_png.read_bytes() == kept
    snapshot = {p: p.read_bytes() for p in study.rglob("*") if p.is_file()}
    persist.compact_reports(str(study), redraw=True)
    assert {p: p.read_bytes() for p in study.rglob("*") if p.is_file()} == snapshot


def test_redraw_refuses_a_summary_the_report_cannot_draw(tmp_path: Path) -> None:
    """A summary.json without what the plots read gets a clear error naming the study."""
    study = tmp_path / "study"
    _old_study(study)
    with pytest.raises(persist.PersistError, match="cannot be drawn by this report"):
        persist.compact_reports(str(study), redraw=True)
