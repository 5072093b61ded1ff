"""``marl.compare --export-marl-eval``: a study in marl-eval's JSON layout, read by marl-eval's
own ``data_process_pipeline`` and ``create_matrices_for_rliable`` (tests/run.sh installs
``id-marl-eval`` without its dependencies: that module needs only numpy and colorama)."""

from __future__ import annotations

import gzip
import json
import lzma
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from marl.experiments import compare, marl_eval

try:
    from _planted_study import SEEDS, evaluations, final_success, plant_study
except ImportError:  # pytest --import-mode=importlib does not put tests/ on sys.path
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _planted_study import SEEDS, evaluations, final_success, plant_study

processing = pytest.importorskip(
    "marl_eval.utils.data_processing_utils",
    reason="marl-eval is not installed: pip install --no-deps id-marl-eval colorama "
    "(tests/run.sh does)",
)
REPO = Path(__file__).resolve().parents[1]


def evaluation_rows(run_dir: Path) -> list[dict]:
    """The periodic validation evaluations of a run's metrics log (plain, .xz or .gz)."""
    openers = {"metrics.jsonl": open, "metrics.jsonl.xz": lzma.open, "metrics.jsonl.gz": gzip.open}
    name = next(name for name in openers if (run_dir / name).is_file())
    with openers[name](run_dir / name, "rt") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return [r for r in rows if "eval/success_rate" in r]


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict:
    """A planted study (c's seed 5 never ran) reported with --export-marl-eval."""
    tmp = tmp_path_factory.mktemp("marl_eval")
    out, path = tmp / "study", tmp / "export" / "study.json"
    argv = plant_study(out, missing=(("c", 5),))
    argv += ["--report-only", "--no-plots", "--bootstrap-reps", "20", "--pilot"]
    assert compare.main([*argv, "--export-marl-eval", str(path)]) == 1  # c/seed_5 missing
    return {"data": json.loads(path.read_text()), "out": out}


def test_layout(exported) -> None:
    data = exported["data"]
    assert list(data) == ["multisearch_v0"] and list(data["multisearch_v0"]) == ["sparse"]
    algorithms = data["multisearch_v0"]["sparse"]
    assert list(algorithms) == ["a", "b", "c"]
    # seed 5 is left out of every variant: marl-eval needs the same runs under each
    assert list(algorithms["a"]) == [f"run_{k}" for k in range(5)]
    run = algorithms["b"]["run_2"]
    # c logged 3 evaluations, a and b 4: the first 3 of each
    assert list(run) == ["step_0", "step_1", "step_2", "absolute_metrics"]
    success = final_success("b", 2)
    assert run["absolute_metrics"] == {
        "success_rate": [success],
        "solved_rate": [success / 2],
        "return": [10 * success],
    }
    steps, value = evaluations("b", 2)[1]
    assert run["step_1"] == {
        "step_count": steps,
        "success_rate": [value],
        "solved_rate": [value / 2],
        "return": [10 * value],
    }


def test_marl_eval_reads_the_export(exported) -> None:
    summary = json.loads((exported["out"] / "summary.json").read_text())
    data = processing.data_process_pipeline(exported["data"], metrics_to_normalize=["return"])
    assert data["extra"]["algorithm_list"] == ["a", "b", "c"]
    assert data["extra"]["number_of_runs"] == 5 and data["extra"]["number_of_steps"] == 3
    final, over_training = processing.create_matrices_for_rliable(
        data, "multisearch_v0", ["return"]
    )
    for name in ("a", "b", "c"):
        per_seed = summary["variants"][name]["metrics"]
        seeds = per_seed["success_rate"]["seeds"]
        for metric, key in (("success_rate", "mean_success_rate"), ("solved_rate", None)):
            key = key or f"mean_{metric}"
            by_seed = dict(zip(seeds, per_seed[metric]["values"], strict=True))
            expected = [[by_seed[k]] for k in range(5)]  # runs x tasks
            np.testing.assert_array_equal(final[key][name], expected)
        returns = dict(zip(seeds, per_seed["mean_return"]["values"], strict=True))
        raw = data["multisearch_v0"]["sparse"][name]["run_0"]["absolute_metrics"]
        assert raw["mean_return"] == returns[0]  # marl-eval's mean_return is ours
        assert over_training["mean_success_rate"][name].shape == (5, 1, 3)  # runs x tasks x steps
        for k in range(5):
            expected = [e for _, e in evaluations(name, k)[:3]]
            np.testing.assert_allclose(
                over_training["mean_success_rate"][name][k, 0], expected, rtol=1e-15
            )
    assert final["mean_success_rate"]["a"][0, 0] == final_success("a", 0)
    assert len(SEEDS) == 6  # the planted seeds; 5 exported


def test_a_published_study_exports(tmp_path) -> None:
    """memory_study/family_1, from its summary.json: marl-eval gets its per-seed values, and
    the periodic evaluations of its metrics logs (read here)."""
    study = REPO / "docs" / "results" / "memory_study" / "family_1"
    summary = json.loads((study / "summary.json").read_text())
    path = tmp_path / "family_1.json"
    notes = marl_eval.write_export(str(path), summary, str(study))
    rows = {run: evaluation_rows(run) for run in sorted(study.glob("runs/*/seed_*"))}
    fewest, most = min(map(len, rows.values())), max(map(len, rows.values()))
    assert notes == [f"runs logged {fewest} to {most} evaluations: the first {fewest} of each"]
    data = processing.data_process_pipeline(json.loads(path.read_text()), [])
    [task] = data["multisearch_v0"]
    assert task.startswith("memory-grid_size=18")
    final, over_training = processing.create_matrices_for_rliable(data, "multisearch_v0", [])
    for name in ("gru", "mamba"):
        per_seed = summary["variants"][name]["metrics"]["success_rate"]
        assert per_seed["seeds"] == [0, 1, 2]
        np.testing.assert_array_equal(final["mean_success_rate"][name][:, 0], per_seed["values"])
    mamba_1 = rows[study / "runs" / "mamba" / "seed_1"]
    np.testing.assert_array_equal(
        over_training["mean_success_rate"]["mamba"][1, 0],
        [r["eval/success_rate"] for r in mamba_1[:fewest]],
    )


def test_runs_of_different_environments_are_refused(tmp_path) -> None:
    configs = [{"env_fn": "envs.multisearch_v0:vector_env"}, {"env_fn": "envs.websearch_v2:f"}]
    with pytest.raises(ValueError, match="different environments"):
        marl_eval._environment_and_task(configs)
    shared = [
        {"env_fn": "envs.multisearch_v0:vector_env", "env": {"preset": "hard", "x": 1, "y": 2}},
        {"env_fn": "envs.multisearch_v0:vector_env", "env": {"preset": "hard", "x": 1, "y": 3}},
    ]
    assert marl_eval._environment_and_task(shared) == ("multisearch_v0", "hard-x=1")


def test_help_says_the_lists_hold_means() -> None:
    text = " ".join(compare.build_parser().format_help().split())
    assert "--export-marl-eval FILE" in text and "every metric's list holds that one mean" in text
