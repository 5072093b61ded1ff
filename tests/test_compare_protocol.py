"""marl.compare's study protocol: primary metric, pre-registered comparisons with permutation
p-values and Holm, designs that cannot conclude, provenance and mixed code, the endpoints.

Runs are a fake train command (tests/test_compare.py's) or run directories written here with
known numbers; the expected p-values are worked out by hand in the comments.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_compare import FAKE_TRAIN, invocations  # noqa: F401 - the shared fake trainer

from marl.experiments import compare, report, stats
from marl.run.provenance import git_state, provenance

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def fake_train(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("fake") / "fake_train.py"
    path.write_text(FAKE_TRAIN)
    return f"{sys.executable} {path}"


def test_comparisons_are_holm_adjusted_together(tmp_path, fake_train, monkeypatch) -> None:
    out = tmp_path / "o"
    argv = ["--variant", "a:--alpha=0.2", "--variant", "b:--alpha=0.6"]
    argv += ["--variant", "c:--alpha=0.9", "--comparison", "c:b", "--seeds", "7"]
    argv += ["--total-steps", "800", "--out", str(out), "--train-command", fake_train]
    argv += ["--bootstrap-reps", "200", "--no-progress", "--no-plots", "--jobs", "2"]
    monkeypatch.setenv("FAKE_TRAIN_LOG", str(tmp_path / "calls.log"))
    assert compare.main(argv) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["primary_metric"] == "success_rate"
    pairs = [(e["variant"], e["baseline"]) for e in s["comparisons"]]
    assert pairs == [("b", "a"), ("c", "a"), ("c", "b")]
    # the fake's success is 0.5 alpha + 0.05 seed: within a seed every difference is the
    # same, so the paired test's p is 2 / 2**7 for each; Holm over three: 3 x, 2 x, 1 x the
    # sorted p-values, then the running maximum: 3/64 for all three
    for e in s["comparisons"]:
        assert e["p_value"] == pytest.approx(2 / 128)
        assert e["p_holm"] == pytest.approx(3 * 2 / 128)
        assert e["test"]["paired"] and e["test"]["n_pairs"] == 7 and e["test"]["exact"]
        assert e["shown"] == (e["ci"][0] > 0.5)  # p_holm < 0.05: the CI decides
    poi_b = s["probability_of_improvement"]["b"]["success_rate"]
    assert poi_b["p_holm"] == pytest.approx(3 * 2 / 128) and poi_b["shown"] is True
    assert poi_b["direction"] == "better"
    # secondary metrics: an unadjusted p-value, labelled exploratory, no p_holm
    ret = s["probability_of_improvement"]["b"]["mean_return"]
    assert ret["exploratory"] is True and "p_holm" not in ret and ret["p_value"] is not None
    assert s["decision_rule"]["outcome"]["comparisons"] == 3
    text = (out / "report.md").read_text()
    assert "## Primary comparisons" in text and "| c | b |" in text
    assert "## Exploratory comparisons (secondary metrics)" in text


def test_primary_metric_option(tmp_path, fake_train, monkeypatch, capsys) -> None:
    out = tmp_path / "o"
    argv = ["--variant", "a:--alpha=0.2", "--variant", "b:--alpha=0.6", "--seeds", "6"]
    argv += ["--total-steps", "800", "--out", str(out), "--train-command", fake_train]
    argv += ["--bootstrap-reps", "50", "--no-progress", "--no-plots", "--primary-metric"]
    monkeypatch.setenv("FAKE_TRAIN_LOG", str(tmp_path / "calls.log"))
    assert compare.main([*argv, "mean_return"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["primary_metric"] == "mean_return"
    assert s["comparisons"][0]["metric"] == "mean_return"
    assert s["probability_of_improvement"]["b"]["success_rate"]["exploratory"] is True
    with pytest.raises(SystemExit) as exc:
        compare.main([*argv, "nonsense"])
    assert exc.value.code == 2
    assert "--primary-metric 'nonsense': allowed: success_rate" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("seeds", "variants", "needed"),
    [(3, 2, 6), (5, 2, 6), (8, 8, 9)],  # 2/2**n < 0.05/m: m = 1 -> n >= 6; m = 7 -> n >= 9
)
def test_designs_that_cannot_conclude_are_refused(
    tmp_path, fake_train, monkeypatch, capsys, seeds, variants, needed
) -> None:
    out = tmp_path / "o"
    argv = [arg for k in range(variants) for arg in ("--variant", f"v{k}:--alpha=0.{k + 1}")]
    argv += ["--seeds", str(seeds), "--total-steps", "800", "--out", str(out)]
    argv += ["--train-command", fake_train, "--no-progress", "--no-plots"]
    monkeypatch.setenv("FAKE_TRAIN_LOG", str(tmp_path / "calls.log"))
    with pytest.raises(SystemExit) as exc:
        compare.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "cannot show anything" in err and f"--seeds {needed} or more" in err
    assert "--pilot" in err
    assert not (out / "runs").exists() and invocations(tmp_path / "calls.log") == []
    # one more seed than needed minus one still refused; the needed count runs
    if needed - 1 > seeds:
        with pytest.raises(SystemExit):
            compare.main([*argv[: argv.index("--seeds")], "--seeds", str(needed - 1)])
    spec_argv = [*argv, "--pilot", "--bootstrap-reps", "20"]
    assert compare.main(spec_argv) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["pilot"] is True and s["warnings"][0].startswith("pilot: ")


def test_runs_get_the_final_evaluation_endpoint(tmp_path, fake_train, capsys) -> None:
    argv = ["--variant", "a:--alpha=0.2", "--seeds", "1", "--total-steps", "800"]
    argv += ["--out", str(tmp_path / "o"), "--train-command", fake_train, "--dry-run"]
    assert compare.main(argv) == 0
    assert "--final-eval-episodes=128" in capsys.readouterr().out
    assert compare.main([*argv, "--final-eval-episodes", "0"]) == 0
    assert "--final-eval-episodes" not in capsys.readouterr().out
    with pytest.raises(SystemExit):
        compare.main(["--variant", "a:--final-eval-episodes=4", *argv[2:]])
    assert "use compare's --final-eval-episodes" in capsys.readouterr().err


def write_run(path: Path, *, seed: int, success: float, commit: str | None, evals=()) -> None:
    """A finished run directory as marl.train writes it (the files compare reads)."""
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump({"algo": "mappo", "seed": seed}))
    (path / "eval.json").write_text(json.dumps({"success_rate": success, "mean_return": 1.0}))
    rows = [
        {"update": u + 1, "env_steps": 100 * (u + 1), "eval/success_rate": e}
        for u, e in enumerate(evals)
    ] or [{"update": 1, "env_steps": 100}]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    marker = {"update": len(rows), "env_steps": 100 * len(rows), "time_s": 2.0, "cpu_s": 1.5}
    if commit is not None:
        marker.update(commit=commit, commits=[commit], dirty=False)
    (path / "finished.json").write_text(json.dumps(marker))


def plant_study(out: Path, commits: dict[tuple[str, int], str | None], evals=()) -> list[str]:
    for (variant, seed), commit in commits.items():
        success = 0.5 + 0.01 * seed + (0.2 if variant == "b" else 0.0)
        write_run(
            out / "runs" / variant / f"seed_{seed}",
            seed=seed,
            success=success,
            commit=commit,
            evals=evals,
        )
    return ["--variant", "a:--alpha=0.2", "--variant", "b:--alpha=0.6"]


def test_mixed_code_is_refused_unless_allowed(tmp_path, capsys) -> None:
    out = tmp_path / "o"
    commits = {(v, k): "1" * 40 for v in ("a", "b") for k in range(6)}
    commits[("b", 5)] = "2" * 40
    argv = plant_study(out, commits)
    argv += ["--seeds", "6", "--total-steps", "800", "--out", str(out), "--report-only"]
    argv += ["--no-plots", "--no-progress", "--bootstrap-reps", "50"]
    with pytest.raises(SystemExit) as exc:
        compare.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "2 code commits" in err and "--allow-mixed-code" in err and "are kept" in err
    assert (out / "runs" / "b" / "seed_5" / "finished.json").is_file()
    assert compare.main([*argv, "--allow-mixed-code"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["commits"] == ["1" * 40, "2" * 40]
    assert any(w.startswith("mixed code (--allow-mixed-code)") for w in s["warnings"])


def test_new_runs_under_other_code_are_refused(tmp_path, fake_train, monkeypatch, capsys) -> None:
    if git_state()["commit"] is None:
        pytest.skip("not a git checkout: no commit to compare with")
    out = tmp_path / "o"
    plant_study(out, {("a", 0): "f" * 40})
    argv = ["--variant", "a:--alpha=0.2", "--seeds", "2", "--pilot", "--total-steps", "800"]
    argv += ["--out", str(out), "--train-command", fake_train, "--no-progress", "--no-plots"]
    monkeypatch.setenv("FAKE_TRAIN_LOG", str(tmp_path / "calls.log"))
    with pytest.raises(SystemExit) as exc:
        compare.main(argv)
    assert exc.value.code == 2
    assert "new runs would mix code" in capsys.readouterr().err
    assert invocations(tmp_path / "calls.log") == []


def test_commits_and_work_in_the_summary(tmp_path) -> None:
    out = tmp_path / "o"
    argv = plant_study(out, {(v, k): "a" * 40 for v in ("a", "b") for k in range(6)})
    argv += ["--seeds", "6", "--total-steps", "800", "--out", str(out), "--report-only"]
    assert compare.main([*argv, "--no-plots", "--bootstrap-reps", "50"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["commits"] == ["a" * 40]
    work = s["variants"]["a"]["work"]
    assert work["env_steps"]["mean"] == 100 and work["env_steps_per_s"]["mean"] == 50
    assert work["cpu_s"]["mean"] == 1.5
    # b = a + 0.2 on every seed: p = 2/64 (paired, 6 seeds), one comparison: p_holm = p
    e = s["comparisons"][0]
    assert e["p_value"] == pytest.approx(2 / 64) and e["p_holm"] == pytest.approx(2 / 64)
    assert e["shown"] is True and e["direction"] == "better"


def test_second_endpoint_is_the_mean_of_the_last_five_evaluations(tmp_path) -> None:
    out = tmp_path / "o"
    evals = [0.1, 0.2, 0.9, 0.5, 0.6, 0.7, 0.8]
    argv = plant_study(out, {(v, k): "c" * 40 for v in ("a", "b") for k in range(6)}, evals)
    argv += ["--seeds", "6", "--total-steps", "800", "--out", str(out), "--report-only"]
    assert compare.main([*argv, "--no-plots", "--bootstrap-reps", "50"]) == 0
    s = json.loads((out / "summary.json").read_text())
    last5 = s["variants"]["a"]["metrics"]["success_rate_last5"]
    assert last5["values"] == pytest.approx([0.7] * 6)  # mean(0.9, 0.5, 0.6, 0.7, 0.8)
    assert s["probability_of_improvement"]["b"]["success_rate_last5"]["exploratory"] is True
    assert s["primary_metric"] == "success_rate"
    # at N env steps the last five evaluations up to N: 0.1, 0.2, 0.9, 0.5 -> 0.425
    run = stats.load_run(out / "runs" / "a" / "seed_0")
    cut, _ = stats.run_at_env_steps(run, 400)
    assert stats.last_evaluations_mean(cut.records, "eval/success_rate") == pytest.approx(0.425)
    assert report.METRICS["success_rate_last5"][0] == "last"


def test_provenance_record() -> None:
    rec = provenance()
    state = git_state()
    assert rec["commit"] == state["commit"] and rec["dirty"] == state["dirty"]
    assert rec["python"] == sys.version.split()[0]
    for name in ("torch", "numpy", "numba", "coopsearch"):
        assert name in rec["versions"]
    assert "torch" in rec["threads"] and "numba" in rec["threads"]
    if state["commit"] is not None:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
        assert state["commit"] == head and len(head) == 40


def test_a_trained_run_records_its_provenance_and_budget(tmp_path) -> None:
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "marl.train", "--total-steps=256", "--num-envs=4"]
    cmd += ["--rollout-steps=32", "--eval-episodes=2", "--final-eval-episodes=3"]
    cmd += ["--eval-every=0", "--plots=false", "--gif=false", "--baselines=false"]
    cmd += ["--progress=false", f"--run-dir={run_dir}", "--torch-threads=1"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    marker = json.loads((run_dir / "finished.json").read_text())
    assert marker["commit"] == git_state()["commit"]
    assert marker["commits"] == ([marker["commit"]] if marker["commit"] else [])
    assert marker["env_steps"] >= 256 and marker["time_s"] > 0 and marker["cpu_s"] > 0
    assert marker["budget"]["total_steps"] == 256
    assert marker["provenance"]["threads"]["torch"] == 1
    assert marker["provenance"]["versions"]["torch"] is not None
    assert marker["provenance"]["cpu_model"] is None or marker["provenance"]["cpu_model"]
    assert len(json.loads((run_dir / "eval.json").read_text())["seeds"]) == 3
    assert math.isfinite(marker["cpu_s"])


def test_memory_factorial_study_definition(tmp_path, capsys) -> None:
    from marl.experiments.studies import get_study
    from marl.run.config import parse_cli

    study = get_study("memory_factorial")
    assert len(study.variants) == 8 and study.reference == "gru_t32"
    for name, args in study.variants.items():
        cfg = parse_cli([*args, "--seed=0"])  # every cell is a valid train configuration
        backbone, setting = name.split("_")
        assert cfg.backbone == backbone and cfg.env["preset"] == "memory"
        expected = (32, 16, "individual") if setting == "t32" else (128, 64, "none")
        assert (cfg.rollout_steps, cfg.seq_len, cfg.penalty_channel) == expected
        # both settings evaluate every 65,536 env steps with the default 64 envs
        assert cfg.rollout_steps * cfg.num_envs * cfg.eval_every == 65_536
    for a, b in study.comparisons:
        assert a in study.variants and b in study.variants
        # each pre-registered pair changes exactly one factor
        (ba, sa), (bb, sb) = a.split("_"), b.split("_")
        assert (ba == bb) != (sa == sb)
    argv = ["--study", "memory_factorial", "--total-steps", "655360", "--out", str(tmp_path)]
    spec = compare.build_spec(compare.build_parser().parse_args([*argv, "--seeds", "16"]))
    assert len(spec.primary_comparisons()) == 13
    assert compare.check_design(spec) is None
    # 0.05 / 13 = 0.00385: 2/2**9 = 0.0039 is not below it, 2/2**10 is
    spec9 = compare.build_spec(compare.build_parser().parse_args([*argv, "--seeds", "9"]))
    assert "--seeds 10 or more" in compare.check_design(spec9)


@pytest.mark.parametrize("algo", ["mappo", "grpo"])
def test_calibration_ladder_reaches_the_calibrated_recipe(algo: str) -> None:
    from marl.experiments.studies import get_study
    from marl.run.config import config_to_dict, parse_cli

    study = get_study("calibration_ladder", algo=algo)

    def resolved(args: list[str]) -> dict:
        cfg = config_to_dict(parse_cli([f"--algo={algo}", *args, "--seed=0"]))
        cfg.pop("recipe")
        return cfg

    names = list(study.variants)
    assert names[0] == "baseline" and names[-2:] == ["calibrated", "default"]
    configs = [resolved(study.variants[n]) for n in names[:-1]]
    # each rung changes a strict superset of what the one before changed, one ingredient more
    for before, after in zip(configs, configs[1:], strict=False):
        assert {k for k in after if after[k] != before[k]}
    base, last_rung, calibrated = configs[0], configs[-2], configs[-1]
    # the last rung and --recipe=calibrated differ in gradient clipping only
    assert {k for k in calibrated if calibrated[k] != last_rung[k]} == {"max_grad_norm"}
    assert last_rung["max_grad_norm"] == base["max_grad_norm"] is None
    assert calibrated["max_grad_norm"] == resolved([])["max_grad_norm"]
    for a, b in study.comparisons:
        assert a in study.variants and b in study.variants
    assert ("calibrated", "default") in study.comparisons


def test_whitening_scales_study_runs_on_a_scaled_task() -> None:
    from marl.experiments.studies import get_study
    from marl.run.config import parse_cli

    study = get_study("whitening_scales")
    assert study.reference == "batch" and set(study.variants) == {
        "none",
        "batch",
        "type",
        "ti_a0.5",
        "ti_a0.25",
    }
    for args in study.variants.values():
        cfg = parse_cli([*args, "--env.rescuer_reward_scale=100", "--seed=0"])
        assert cfg.env["preset"] == "hard" and cfg.env["rescuer_reward_scale"] == 100


def test_missing_statistics_stack_is_reported_before_training(
    tmp_path, fake_train, monkeypatch, capsys
) -> None:
    import builtins

    real_import = builtins.__import__

    def no_rliable(name, *args, **kwargs):
        if name == "rliable" or name.startswith("rliable."):
            raise ImportError("No module named 'rliable'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_rliable)
    monkeypatch.setenv("FAKE_TRAIN_LOG", str(tmp_path / "calls.log"))
    argv = ["--variant", "a:--alpha=0.2", "--seeds", "1", "--total-steps", "800"]
    argv += ["--out", str(tmp_path / "o"), "--train-command", fake_train, "--no-progress"]
    with pytest.raises(SystemExit) as exc:
        compare.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "pip install 'coopsearch[compare]'" in err and "Traceback" not in err
    assert invocations(tmp_path / "calls.log") == []  # nothing trained


def test_arms_run_interleaved_seed_major(tmp_path, fake_train, monkeypatch) -> None:
    # seed k of every arm starts before seed k + 1 of any arm (drift hits the arms alike)
    argv = ["--variant", "a:--alpha=0.2", "--variant", "b:--alpha=0.4"]
    argv += ["--variant", "c:--alpha=0.6", "--seeds", "3", "--pilot", "--total-steps", "800"]
    argv += ["--out", str(tmp_path / "o"), "--train-command", fake_train, "--jobs", "1"]
    argv += ["--no-progress", "--no-plots", "--bootstrap-reps", "20"]
    monkeypatch.setenv("FAKE_TRAIN_LOG", str(tmp_path / "calls.log"))
    assert compare.main(argv) == 0
    started = [line.split()[0] for line in invocations(tmp_path / "calls.log")]
    assert started == [f"{v}/seed_{k}" for k in range(3) for v in ("a", "b", "c")]
