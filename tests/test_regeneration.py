"""``marl.compare --report-only --out DIR`` regenerates a study from what DIR holds (its
compare.json, or for a study reported before compare.json recorded the report, its
summary.json); ``runs.csv``; and benchmarks/check_regeneration.py, on a planted study and
(slow) on a published one."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from marl.experiments import compare

try:
    from _planted_study import COMMIT, SEEDS, VARIANTS, final_success, plant_study
except ImportError:  # pytest --import-mode=importlib does not put tests/ on sys.path
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _planted_study import COMMIT, SEEDS, VARIANTS, final_success, plant_study

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "check_regeneration.py"
#: the report settings of the planted study's first report, none of them a default
FIRST_REPORT = ["--bootstrap-reps", "20", "--bootstrap-seed", "3", "--confidence", "0.9"]
FIRST_REPORT += ["--entropy-threshold", "0.2", "--title", "Planted", "--at-env-steps", "300"]
FIRST_REPORT += ["--comparison", "c:b", "--reference", "b", "--jobs", "3"]


@pytest.fixture(scope="module")
def check():
    spec = importlib.util.spec_from_file_location("check_regeneration", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def reported_once(tmp_path_factory) -> Path:
    """A planted study (c's seed 5 never ran) reported once, with every setting given."""
    out = tmp_path_factory.mktemp("planted") / "study"
    argv = plant_study(out, missing=(("c", 5),))
    assert compare.main([*argv, *FIRST_REPORT, "--report-only", "--no-plots"]) == 1  # missing
    return out


@pytest.fixture
def reported(reported_once, tmp_path) -> Path:
    """A copy of the reported study for one test."""
    return Path(shutil.copytree(reported_once, tmp_path / "study"))


def read(path: Path) -> dict:
    return json.loads(path.read_text())


def regenerate(out: Path, *options: str) -> int:
    return compare.main(["--report-only", "--out", str(out), "--no-plots", *options])


def test_report_only_alone_regenerates_the_study(reported, check) -> None:
    first = read(reported / "summary.json")
    first_at = read(reported / "at_300_env_steps" / "summary.json")
    (reported / "at_300_env_steps" / "summary.json").unlink()
    assert regenerate(reported) == 1
    again = read(reported / "summary.json")
    assert again["bootstrap"] == {**first["bootstrap"], "reps": 20, "seed": 3, "confidence": 0.9}
    assert again["title"] == "Planted" and again["entropy_threshold"] == 0.2
    assert again["reference"] == "b" and again["jobs"] == 3
    assert [(e["variant"], e["baseline"]) for e in again["comparisons"]] == [
        ("a", "b"),
        ("c", "b"),
    ]
    assert check.compare_summaries(first, again).ok
    at = read(reported / "at_300_env_steps" / "summary.json")  # written again
    assert at["at_env_steps"] == 300 and check.compare_summaries(first_at, at).ok
    record = read(reported / "compare.json")["report"]
    assert record["at_env_steps"] == [300] and record["bootstrap_reps"] == 20


def test_options_given_replace_the_recorded_ones(reported) -> None:
    assert regenerate(reported, "--bootstrap-reps", "10", "--seeds", "4") == 0  # c/seed_5 not in
    s = read(reported / "summary.json")
    assert s["bootstrap"]["reps"] == 10 and s["seeds"] == [0, 1, 2, 3]
    assert s["title"] == "Planted"  # not given: as recorded
    assert read(reported / "compare.json")["report"]["bootstrap_reps"] == 10


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--total-steps", "800"], "total_steps=400, now 800"),
        (["--max-time", "60"], "total_steps=400, now None"),
        (["--algo", "grpo"], "algo='mappo', now 'grpo'"),
        (["--common=--backbone=gru"], "common=[], now ['--backbone=gru']"),
        (["--final-eval-episodes", "32"], "evaluated with final_eval_episodes=128"),
        (["--variant", "a:--alpha=0.3"], "variant 'a' was run with ['--alpha=0.2']"),
    ],
)
def test_options_that_contradict_the_runs_are_refused(
    reported_once, capsys, options, message
) -> None:
    with pytest.raises(SystemExit) as exc:  # refused before anything is written
        regenerate(reported_once, *options)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_given_variants_replace_the_recorded_ones(reported) -> None:
    assert regenerate(reported, "--variant", "a:--alpha=0.2", "--variant", "b:--alpha=0.6") == 0
    s = read(reported / "summary.json")
    assert list(s["variants"]) == ["a", "b"] and s["reference"] == "a"  # as for a run
    assert s["bootstrap"]["reps"] == 20 and s["budget"]["total_steps"] == 400  # recorded


def test_a_study_reported_before_compare_json_recorded_it(reported, check) -> None:
    """compare.json without "report" (as published before): summary.json says the rest."""
    first = read(reported / "summary.json")
    record = read(reported / "compare.json")
    for key in ("report", "jobs"):
        del record[key]
    record["reference"] = "a"  # stale: summary.json's reference wins
    (reported / "compare.json").write_text(json.dumps(record))
    shutil.rmtree(reported / "at_300_env_steps")
    first["commands"]["compare"] += " --at-env-steps 300"  # found in the command
    (reported / "summary.json").write_text(json.dumps(first))
    assert regenerate(reported) == 1
    assert check.compare_summaries(first, read(reported / "summary.json")).ok
    assert read(reported / "at_300_env_steps" / "summary.json")["at_env_steps"] == 300


def test_runs_csv_has_one_row_per_run_with_its_endpoints(reported_once) -> None:
    reported = reported_once  # read only
    with open(reported / "runs.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == len(VARIANTS) * len(SEEDS)
    assert list(rows[0])[:5] == ["variant", "seed", "status", "commit", "env_steps"]
    summary = read(reported / "summary.json")
    assert list(rows[0])[5:] == list(summary["metrics"])
    for row in rows:
        variant, seed = row["variant"], int(row["seed"])
        if (variant, seed) == ("c", 5):
            assert row["status"] == "missing" and row["success_rate"] == row["commit"] == ""
            continue
        success = final_success(variant, seed)
        assert row["status"] == "finished" and row["commit"] == COMMIT
        assert int(row["env_steps"]) == 100 * VARIANTS[variant][2]
        assert float(row["success_rate"]) == pytest.approx(success, abs=1e-15)
        assert float(row["solved_rate"]) == pytest.approx(success / 2, abs=1e-15)
        assert float(row["mean_return"]) == pytest.approx(10 * success, rel=1e-15)
        # the mean of the last 5 evaluations (all of them): success * mean((u+1)/n)
        n = VARIANTS[variant][2]
        assert float(row["success_rate_last5"]) == pytest.approx(success * (n + 1) / (2 * n))
    with open(reported / "at_300_env_steps" / "runs.csv", newline="") as fh:
        at = list(csv.DictReader(fh))
    a0 = next(r for r in at if (r["variant"], r["seed"]) == ("a", "0"))
    assert int(a0["env_steps"]) == 300 and float(a0["success_rate"]) == pytest.approx(0.375)


def test_check_passes_a_regenerated_study_and_flags_changed_figures(reported, check) -> None:
    (reported / "at_300_env_steps" / "summary.json").unlink()
    assert regenerate(reported) == 1  # published here: from the recorded settings
    [(main, ok), (at, ok_at)] = check.check_study(str(reported))
    assert (main, at) == (".", "at_300_env_steps") and ok.ok and ok_at.ok, ok.failures
    assert ok.exact["per-seed values"] > 0 and ok.exact["p-values"] > 0 and ok.numbers > 0
    published = read(reported / "summary.json")
    regenerated = json.loads(json.dumps(published))
    regenerated["variants"]["a"]["metrics"]["success_rate"]["values"][0] += 1e-12
    regenerated["variants"]["a"]["metrics"]["success_rate"]["mean"] *= 1 + 1e-7
    result = check.compare_summaries(published, regenerated)
    assert [f.split(":")[0] for f in result.failures] == [
        "variants/a/metrics/success_rate/values/0"
    ]
    regenerated["variants"]["a"]["metrics"]["success_rate"]["mean"] *= 1 + 1e-5
    regenerated["comparisons"][0]["p_holm"] = 0.5
    regenerated["new_field"] = 1
    result = check.compare_summaries(published, regenerated)
    assert len(result.failures) == 3 and result.added == {"new_field": 1}


@pytest.mark.slow
def test_a_published_study_regenerates(check) -> None:
    """The check of the issue on the smallest published study (30 s to 2 min on two cores)."""
    [(rel, result)] = check.check_study(str(REPO / "docs/results/memory_study/family_1"))
    assert rel == "." and result.ok, result.failures
    # 354: the per-seed values of the summary as regenerated when the study was compacted
    assert result.exact["per-seed values"] == 354 and result.largest[0] <= 1e-6


def test_a_holm_family_changed_by_newer_code_is_explained(reported_once, check) -> None:
    """Newer code leaves c vs b out of the family: a vs b, alone, keeps its p-value as p_holm
    (a family of one), 2/64 < 0.05 with every seed worse: shown worse."""
    published = read(reported_once / "summary.json")
    family = [
        (e["variant"], e["baseline"], e["p_value"], e["p_holm"]) for e in published["comparisons"]
    ]
    assert family == [("a", "b", 2 / 64, 4 / 64), ("c", "b", 2 / 32, 4 / 64)]  # 6 and 5 pairs
    regenerated = json.loads(json.dumps(published))
    kept, left = regenerated["comparisons"]
    kept.update(p_holm=2 / 64, shown=True, direction="worse")
    left.update(p_holm=None, shown=None, direction=None)
    left["left_out"] = {"reason": "a/a", "why": "one configuration", "repeats": None}
    regenerated["probability_of_improvement"]["a"]["success_rate"].update(p_holm=2 / 64)
    regenerated["verdicts"][0] = "**shown**: a is worse than b ..."
    result = check.compare_summaries(published, regenerated)
    assert result.ok, result.failures
    assert "leaves 1 of 2 primary comparisons out" in result.cause
    assert {f.split(":")[0] for f in result.explained} == {
        "verdicts",
        "comparisons/0/p_holm",
        "comparisons/0/shown",
        "comparisons/0/direction",
        "comparisons/1/p_holm",
        "comparisons/1/shown",
        "comparisons/1/left_out",
        "probability_of_improvement/a/success_rate/p_holm",
    }
    kept["p_holm"] = 0.04  # not what the family of one gives: unexplained
    result = check.compare_summaries(published, regenerated)
    assert result.cause is None and "comparisons/0/p_holm" in " ".join(result.failures)


def test_explicit_options_are_those_given_even_at_their_defaults() -> None:
    parser = compare.build_parser()
    argv = ["--out", "o", "--seeds", "5", "--at-env-steps", "7", "--variant", "a:", "--no-plots"]
    given = compare.explicit_options(parser, argv)
    assert given == {"out", "seeds", "at_env_steps", "variant", "no_plots"}
    assert compare.explicit_options(parser, ["--out=o"]) == {"out"}


def test_plotted_curves_agree_within_a_hundredth_of_their_panel(reported_once, check) -> None:
    published = read(reported_once / "summary.json")
    regenerated = json.loads(json.dumps(published))
    panel = published["variants"]["a"]["curves"]["episode/success"]
    ys = [k for k in panel if k not in ("env_steps", "n")]  # mean, iqm and their CI bands
    band = np.hstack([np.asarray(panel[k], dtype=float).ravel() for k in ys])
    scale = np.nanmax(band) - np.nanmin(band)  # the panel's y range, by hand
    curve = regenerated["variants"]["a"]["curves"]["episode/success"]["mean"]
    curve[0] += 0.005 * scale  # half a percent of the panel's y range: a pixel
    result = check.compare_summaries(published, regenerated)
    assert result.ok and result.plotted > 0
    assert result.plot_deviation == (
        pytest.approx(0.005),
        "variants/a/curves/episode/success/mean/0",
    )
    curve[0] += 0.01 * scale
    result = check.compare_summaries(published, regenerated)
    assert [f.split(":")[0] for f in result.failures] == [
        "variants/a/curves/episode/success/mean/0"
    ]
    assert "plotted curves" in check.format_comparison("planted", result)
