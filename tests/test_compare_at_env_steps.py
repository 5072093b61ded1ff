"""Scoring time-budgeted runs at equal env steps (``marl.compare --at-env-steps N``).

The expected figures are worked out by hand from what the fake train command logs: every
run logs a validation evaluation every ``EVERY`` updates of 100 env steps, with a success
rate that is a known function of the variant, the seed and the env-step count.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from marl.experiments import compare, stats
from marl.experiments.stats import RunData

FAKE_TRAIN = r"""
import json, os, sys
opts = dict(arg[2:].split("=", 1) for arg in sys.argv[1:])
run_dir, seed, alpha = opts["run-dir"], int(opts["seed"]), float(opts["alpha"])
updates = int(round(alpha * 10))  # alpha 0.4: 400 env steps, alpha 0.8: 800
os.makedirs(run_dir, exist_ok=True)
with open(os.path.join(run_dir, "config.yaml"), "w") as fh:
    fh.write(f"seed: {seed}\nalpha: {alpha}\n")
with open(os.path.join(run_dir, "metrics.jsonl"), "w") as fh:
    for u in range(1, updates + 1):
        steps = 100 * u
        row = {"update": u, "env_steps": steps, "episode/success": 0.1 * u}
        if u % 2 == 0:  # a validation evaluation every 2 updates
            value = round(alpha * steps / 1000 + 0.01 * seed, 6)
            row.update({"eval/success_rate": value, "eval/solved_rate": value / 2,
                        "eval/mean_return": 10 * value})
        fh.write(json.dumps(row) + "\n")
with open(os.path.join(run_dir, "eval.json"), "w") as fh:
    json.dump({"success_rate": 0.99, "solved_rate": 0.99, "mean_return": 9.9}, fh)
with open(os.path.join(run_dir, "finished.json"), "w") as fh:
    json.dump({}, fh)
"""


def at_steps(alpha: float, seed: int, n: int) -> float:
    """The fake run's validation success at the last evaluation at or before n env steps."""
    last_eval = (min(n, 100 * round(alpha * 10)) // 200) * 200
    return round(alpha * last_eval / 1000 + 0.01 * seed, 6)


# ------------------------------------------------------------------------------------------
# stats.run_at_env_steps on hand-built runs
# ------------------------------------------------------------------------------------------
def _run(rows: list[dict]) -> RunData:
    return RunData(run_dir="r", eval={"success_rate": 1.0}, records=rows, config={"seed": 0})


def test_picks_the_last_evaluation_at_or_before_n() -> None:
    rows = [
        {"env_steps": 100},
        {"env_steps": 200, "eval/success_rate": 0.2, "eval/solved_rate": 0.1},
        {"env_steps": 300},
        {"env_steps": 400, "eval/success_rate": 0.4, "eval/solved_rate": 0.3},
        {"env_steps": 500},
    ]
    run, reason = stats.run_at_env_steps(_run(rows), 350)
    assert reason is None and run is not None
    assert run.eval == {"success_rate": 0.2, "solved_rate": 0.1, "env_steps": 200}
    assert [r["env_steps"] for r in run.records] == [100, 200, 300]
    run, _ = stats.run_at_env_steps(_run(rows), 400)
    assert run.eval["success_rate"] == 0.4 and run.eval["env_steps"] == 400


def test_a_resumed_log_takes_the_last_of_equal_counts() -> None:
    rows = [
        {"env_steps": 200, "eval/success_rate": 0.2},
        {"env_steps": 200, "eval/success_rate": 0.25},  # re-logged after a resume
        {"env_steps": 300},
    ]
    run, _ = stats.run_at_env_steps(_run(rows), 300)
    assert run.eval["success_rate"] == 0.25


def test_runs_that_stopped_early_or_never_evaluated_are_refused() -> None:
    rows = [{"env_steps": 100}, {"env_steps": 200, "eval/success_rate": 0.2}]
    run, reason = stats.run_at_env_steps(_run(rows), 300)
    assert run is None and "trained 200 env steps, fewer than 300" in reason
    run, reason = stats.run_at_env_steps(_run(rows), 150)
    assert run is None and "no validation evaluation" in reason
    run, reason = stats.run_at_env_steps(_run([]), 10)
    assert run is None and "trained no env steps" in reason


# ------------------------------------------------------------------------------------------
# marl.compare --at-env-steps end to end (fake train, report only)
# ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def compared(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("atsteps")
    script = tmp / "fake_train.py"
    script.write_text(FAKE_TRAIN)
    out = tmp / "out"
    argv = ["--variant", "short:--alpha=0.4", "--variant", "long:--alpha=0.8"]
    argv += ["--seeds", "3", "--pilot", "--total-steps", "800", "--jobs", "1", "--out", str(out)]
    argv += ["--train-command", f"{sys.executable} {script}", "--no-validate"]
    argv += ["--bootstrap-reps", "200", "--no-progress", "--no-plots", "--reference", "short"]
    code = compare.main([*argv, "--at-env-steps", "400", "--at-env-steps", "600"])
    read = lambda p: json.loads(p.read_text())  # noqa: E731
    return {
        "code": code,
        "out": out,
        "final": read(out / "summary.json"),
        "at400": read(out / "at_400_env_steps" / "summary.json"),
        "at600": read(out / "at_600_env_steps" / "summary.json"),
        "report400": (out / "at_400_env_steps" / "report.md").read_text(),
    }


def test_own_report_keeps_the_final_evaluation(compared) -> None:
    assert compared["code"] == 0
    values = compared["final"]["variants"]["long"]["metrics"]["success_rate"]["values"]
    assert values == [0.99, 0.99, 0.99]
    assert compared["final"]["at_env_steps"] is None


def test_scores_at_n_are_the_evaluations_logged_by_then(compared) -> None:
    s = compared["at400"]
    assert s["at_env_steps"] == 400
    for name, alpha in (("short", 0.4), ("long", 0.8)):
        m = s["variants"][name]["metrics"]
        expected = [at_steps(alpha, seed, 400) for seed in range(3)]
        np.testing.assert_allclose(m["success_rate"]["values"], expected, atol=1e-12)
        np.testing.assert_allclose(
            m["solved_rate"]["values"], [x / 2 for x in expected], atol=1e-12
        )
    rows = [r for r in s["runs"] if r["status"] == "finished"]
    assert len(rows) == 6 and {r["eval_env_steps"] for r in rows} == {400}
    assert {r["env_steps"] for r in rows} == {400}  # curves stop at N
    assert "at 400 env steps" in s["metrics"]["success_rate"]["label"]
    assert "final" not in s["metrics"]["success_rate"]["label"]
    assert "Scored at 400 env steps" in compared["report400"]


def test_runs_that_stopped_before_n_are_excluded_and_named(compared) -> None:
    s = compared["at600"]
    assert s["variants"]["short"]["n_finished"] == 0
    assert s["variants"]["short"]["n_short"] == 3
    long_values = s["variants"]["long"]["metrics"]["success_rate"]["values"]
    np.testing.assert_allclose(long_values, [at_steps(0.8, k, 600) for k in range(3)])
    short_rows = [r for r in s["runs"] if r["status"] == "short"]
    assert len(short_rows) == 3
    assert all("fewer than 600" in r["error"] for r in short_rows)
    assert sum("excluded at 600 env steps" in w for w in s["warnings"]) == 3


def test_budget_bound_schedules_are_warned(tmp_path) -> None:
    from marl.experiments.compare import CompareSpec, Variant
    from marl.experiments.report import build_summary

    run_dir = tmp_path / "runs" / "a" / "seed_0"
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text("seed: 0\nlr_schedule: linear\n")
    rows = [{"env_steps": 100, "eval/success_rate": 0.5}, {"env_steps": 200}]
    (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (run_dir / "eval.json").write_text(json.dumps({"success_rate": 1.0}))
    spec = CompareSpec(
        algo="mappo", config=None, variants=[Variant("a", [])], seeds=[0], out=str(tmp_path),
        reference="a",
    )  # fmt: skip
    record = {"variant": "a", "seed": 0, "status": "finished", "run_dir": str(run_dir)}
    record.update(log="logs/a/seed_0.log", command="train", attempts=1)
    s = build_summary(spec, [record], reps=20, at_env_steps=150)
    assert s["variants"]["a"]["metrics"]["success_rate"]["values"] == [0.5]
    assert any("lr_schedule" in w and "depends on its total budget" in w for w in s["warnings"])
    with pytest.raises(ValueError, match="positive number of env steps"):
        build_summary(spec, [record], reps=20, at_env_steps=0)


def test_cli_refuses_a_non_positive_count(tmp_path, capsys) -> None:
    argv = ["--variant", "a:--alpha=0.5", "--out", str(tmp_path / "o"), "--dry-run"]
    with pytest.raises(SystemExit) as exc:
        compare.main([*argv, "--at-env-steps", "0"])
    assert exc.value.code == 2
    assert "--at-env-steps must be a positive number of env steps, got 0" in capsys.readouterr().err


def test_help_names_the_option() -> None:
    assert "--at-env-steps" in compare.build_parser().format_help()


def test_output_directory_name() -> None:
    assert compare.at_env_steps_dir("out", 2_000_000) == str(Path("out") / "at_2000000_env_steps")


def test_report_says_the_comparison_is_per_env_step(compared) -> None:
    text = compared["report400"]
    assert "the comparison is per env step" in text
    assert "per unit of compute" not in text and "per time, not per step" not in text
    assert "`eval/success_rate` of the evaluation at 400 env steps" in text
    assert "`success_rate` of eval.json" not in text
