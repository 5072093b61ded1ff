"""python -m marl.compare: variant parsing, validation, orchestration, resumption, report.

Most tests inject a fake, fast train command (``--train-command``) that validates its options
with ``marl.run.config.parse_cli`` like ``marl.train`` and writes a run directory with known
numbers;
the figures in summary.json are checked against values computed here by hand / with numpy.
``test_end_to_end_real_train`` runs the real ``python -m marl.train`` (2 variants x 2 seeds).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from marl.experiments import compare
from marl.experiments.studies import STUDIES, get_study
from marl.run.config import parse_cli

REPO = Path(__file__).resolve().parents[1]

FAKE_TRAIN = r"""
# Fake marl.run.train: reads the options compare passes, writes known numbers, fast (no torch;
# compare itself validated every variant's options with marl.run.config.parse_cli).
import json, os, sys, time

opts = {}
for arg in sys.argv[1:]:
    assert arg.startswith("--") and "=" in arg, arg  # compare passes --flag=value only
    key, value = arg[2:].split("=", 1)
    opts[key] = value
run_dir = opts["run-dir"]
resume = opts.get("resume")
assert resume is None or resume == run_dir
alpha, seed = float(opts.get("alpha", 0.5)), int(opts["seed"])
key = f"{os.path.basename(os.path.dirname(run_dir))}/{os.path.basename(run_dir)}"
with open(os.environ["FAKE_TRAIN_LOG"], "a") as fh:
    fh.write(f"{key} {'resume' if resume else 'start'}\n")
print(f"fake train {key} alpha={alpha} seed={seed}", flush=True)
if float(os.environ.get("FAKE_TRAIN_CRASH_ALPHA", "-1")) == alpha:
    print("RuntimeError: simulated crash", file=sys.stderr, flush=True)
    sys.exit(3)
os.makedirs(os.path.join(run_dir, "checkpoints"), exist_ok=True)
with open(os.path.join(run_dir, "config.yaml"), "w") as fh:
    fh.write(f"algo: {opts['algo']}\nseed: {seed}\nalpha: {alpha}\n")
n = 8
success = round(0.5 * alpha + 0.05 * seed + (0.1 if opts.get("recipe") == "calibrated" else 0), 6)
with open(os.path.join(run_dir, "metrics.jsonl"), "w") as fh:
    for u in range(n):
        row = {"update": u + 1, "env_steps": 100 * (u + 1),
               "episode/success": success * (u + 1) / n, "episode/return": success,
               "entropy": 1.5 - 0.2 * u, "adv_clip_frac": 0.1 if u % 4 == 0 else 0.0,
               "adv_raw/pos_frac": 0.25 if u < 4 else 0.75, "adv/pos_frac": 0.5}
        for t in ("scout", "rescuer"):
            for p in ("adv_raw", "adv"):
                for s, v in (("mean", 0.1), ("std", 1.0), ("pos_frac", 0.4),
                             ("pos_mean", 0.7), ("neg_mean", -0.6)):
                    row[f"{p}/{t}/{s}"] = v
        fh.write(json.dumps(row) + "\n")
with open(os.path.join(run_dir, "checkpoints", "latest.pt"), "w") as fh:
    fh.write("checkpoint")
if os.environ.get("FAKE_TRAIN_BLOCK") == key and not resume:
    time.sleep(60)  # killed by the test (parent-death signal) long before
with open(os.path.join(run_dir, "eval.json"), "w") as fh:
    json.dump({"success_rate": success, "solved_rate": success / 2,
               "mean_return": 10 * success, "coverage": 0.5, "episode_length": 100.0,
               "n_episodes": 4, "seeds": [1, 2],
               "search_diversity": 0.4 + (0.1 if opts.get("recipe") == "calibrated" else 0)}, fh)
"""


def fake_success(alpha: float, seed: int) -> float:
    return round(0.5 * alpha + 0.05 * seed, 6)


@pytest.fixture(scope="module")
def fake_train(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("fake") / "fake_train.py"
    path.write_text(FAKE_TRAIN)
    return f"{sys.executable} {path}"


def invocations(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def run_main(argv: list[str], monkeypatch, log: Path, **env: str) -> int:
    monkeypatch.setenv("FAKE_TRAIN_LOG", str(log))
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return compare.main(argv)


# ------------------------------------------------------------------------------------------
# parsing and validation
# ------------------------------------------------------------------------------------------


def test_parse_variant() -> None:
    v = compare.parse_variant("ti:--whitening=team_individual,--alpha=0.5")
    assert v.name == "ti" and v.args == ["--whitening=team_individual", "--alpha=0.5"]
    v = compare.parse_variant("spaced: --alpha 0.25 , --env.grid_size=8")
    assert v.args == ["--alpha", "0.25", "--env.grid_size=8"]
    assert compare.parse_variant("default:").args == []
    with pytest.raises(ValueError, match="expected NAME:ARGS"):
        compare.parse_variant("no-colon")
    with pytest.raises(ValueError, match="invalid variant name"):
        compare.parse_variant("bad/name:--alpha=0.5")


def test_variants_file(tmp_path: Path) -> None:
    path = tmp_path / "variants.yaml"
    path.write_text(
        yaml.safe_dump(
            {"low": ["--alpha=0.25"], "high": "--alpha=0.75,--whitening=type"}, sort_keys=False
        )
    )
    variants = compare.load_variants_file(str(path))
    assert [(v.name, v.args) for v in variants] == [
        ("low", ["--alpha=0.25"]),
        ("high", ["--alpha=0.75", "--whitening=type"]),
    ]
    path.write_text(yaml.safe_dump({"x": {"alpha": 0.5}}))
    with pytest.raises(ValueError, match="expected a list of option strings"):
        compare.load_variants_file(str(path))


@pytest.mark.parametrize(
    ("variant", "message"),
    [
        ("bad:--no-such-option=1", "--no-such-option"),
        ("bad:--alpha=2.0", "--alpha"),
        ("bad:--whitening=zca", "--whitening"),
        ("bad:--seed=3", "--seed is not allowed"),
        ("bad:--total-steps=10", "same for every run"),
        ("bad:--max-cpu-time=10", "use compare's --max-cpu-time"),
    ],
)
def test_bad_variant_rejected_before_any_run(
    variant: str, message: str, tmp_path: Path, fake_train: str, monkeypatch, capsys
) -> None:
    log = tmp_path / "calls.log"
    out = tmp_path / "out"
    argv = ["--variant", "ok:--alpha=0.5", "--variant", variant, "--seeds", "2", "--pilot"]
    argv += ["--total-steps", "64", "--out", str(out), "--train-command", fake_train]
    with pytest.raises(SystemExit) as exc:
        run_main(argv, monkeypatch, log)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "bad" in err and message in err
    assert invocations(log) == []  # no run started, not even the valid variant's
    assert not (out / "runs").exists()


def test_cli_input_errors(tmp_path: Path, monkeypatch, capsys) -> None:
    base = ["--out", str(tmp_path / "o")]
    cases = [
        (["--variant", "a:", "--max-cpu-time", "0"], "--max-cpu-time must be > 0"),
        (["--variant", "a:", "--max-cpu-time", "5", "--max-time", "5"], "not allowed with"),
    ]
    for extra, message in cases:
        with pytest.raises(SystemExit) as exc:
            compare.main(base + extra)
        assert exc.value.code == 2
        assert message in capsys.readouterr().err
    base += ["--total-steps", "64"]
    cases = [
        (["--variant", "a:", "--variant", "a:--alpha=0.1"], "given twice"),
        (["--variant", "a:", "--reference", "zz"], "--reference 'zz' is not a variant"),
        (["--variant", "a:", "--seeds", "0"], "--seeds must be >= 1"),
        ([], "no variants"),
        (["--variant", "a:", "--config", str(tmp_path / "missing.yaml")], "file not found"),
    ]
    for extra, message in cases:
        with pytest.raises(SystemExit) as exc:
            compare.main(base + extra)
        assert exc.value.code == 2
        assert message in capsys.readouterr().err


@pytest.mark.parametrize("backbone", ["mlp", "gru"])
def test_studies_validate_with_parse_cli(backbone: str) -> None:
    for name in STUDIES:
        if name == "grouping" and backbone == "mlp":
            with pytest.raises(ValueError, match="needs a sequence backbone"):
                get_study(name, backbone=backbone)
            continue
        study = get_study(name, backbone=backbone)
        assert study.reference in study.variants
        for variant, args in study.variants.items():
            cfg = parse_cli(["--algo=mappo", f"--backbone={backbone}", *args])
            assert cfg is not None, variant
    whitening = get_study("whitening", backbone=backbone).variants
    assert ("position" in whitening) == (backbone != "mlp")
    assert ("chunk" in whitening) == (backbone != "mlp")
    assert {"none", "batch", "type", "running"} <= set(whitening)
    alphas = sorted(parse_cli(args).alpha for n, args in whitening.items() if n.startswith("ti_"))
    assert alphas == [0.25, 0.5, 0.75]
    cal = get_study("calibration").variants
    assert parse_cli(cal["calibrated"]).value_clip == 0.1
    assert parse_cli(cal["baseline"]).value_clip is None
    staged = parse_cli(cal["value_stab+whiten_clip+ent_asym"])
    assert (staged.adv_clip, staged.ent_coef, staged.clip_low) == (5.0, 0.01, 0.1)
    grpo = get_study("calibration", algo="grpo").variants
    assert "value_stab" not in grpo and {"baseline", "calibrated"} <= set(grpo)
    for args in grpo.values():
        parse_cli(["--algo=grpo", *args])
    mem = get_study("memory").variants
    assert {parse_cli(a).backbone for a in mem.values()} == {"mlp", "gru", "mamba", "mamba2"}
    assert all(parse_cli(a).env.get("preset") == "memory" for a in mem.values())
    if backbone != "mlp":
        grouping = get_study("grouping", backbone=backbone).variants
        configs = {n: parse_cli([f"--backbone={backbone}", *a]) for n, a in grouping.items()}
        assert {c.whitening for c in configs.values()} == {"team_individual"}
        assert {n: c.whiten_inner for n, c in configs.items()} == {
            "type": "type",
            "position": "position",
            "chunk": "chunk",
        }
        assert configs["chunk"].chunk_size == 8
        # the reference is the default configuration (its runs are the memory study's)
        default = parse_cli([f"--backbone={backbone}"])
        assert (default.whitening, default.alpha, default.whiten_inner) == (
            configs["type"].whitening,
            configs["type"].alpha,
            configs["type"].whiten_inner,
        )
    with pytest.raises(ValueError, match="unknown study"):
        get_study("nope")


def test_whitening_none_variant_parses() -> None:
    args = get_study("whitening").variants["none"]
    assert parse_cli(args).whitening == "none"


@pytest.mark.parametrize("budget", ["--max-time", "--max-cpu-time"])
def test_study_cli_dry_run(tmp_path: Path, capsys, budget: str) -> None:
    code = compare.main(
        ["--study", "calibration", "--seeds", "2", "--pilot", budget, "30", "--jobs", "2"]
        + ["--out", str(tmp_path / "o"), "--dry-run"]
    )
    assert code == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 6 * 2
    assert all(f"{budget}=30 " in line and "--torch-threads=" in line for line in lines)
    assert any("calibrated/seed_1 [new]" in line for line in lines)
    assert not (tmp_path / "o").exists()


def test_cpu_time_budget_reaches_runs_report_and_spec(
    tmp_path: Path, fake_train: str, monkeypatch, capsys
) -> None:
    out, log = tmp_path / "out", tmp_path / "calls.log"
    argv = ["--variant", "a:--alpha=0.2", "--variant", "b:--alpha=0.6", "--seeds", "2", "--pilot"]
    argv += ["--out", str(out), "--train-command", fake_train, "--no-progress", "--no-plots"]
    argv += ["--bootstrap-reps", "50"]
    assert run_main([*argv, "--max-cpu-time", "5"], monkeypatch, log) == 0
    assert json.loads((out / "compare.json").read_text())["max_cpu_time"] == 5
    report = (out / "report.md").read_text()
    assert "budget: 5 CPU s per run" in report and "The budget is CPU time" in report
    # a rerun with another budget would mix incomparable runs: refused, nothing run
    n_calls = len(invocations(log))
    with pytest.raises(SystemExit) as exc:
        run_main([*argv, "--max-time", "5"], monkeypatch, log)
    assert exc.value.code == 2 and "holds runs with max_time=None" in capsys.readouterr().err
    assert len(invocations(log)) == n_calls


# ------------------------------------------------------------------------------------------
# a full compare with the fake train: figures, failures, report, rerun
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fake_compare(tmp_path_factory, fake_train: str):
    tmp = tmp_path_factory.mktemp("cmp")
    out, log = tmp / "out", tmp / "calls.log"
    argv = ["--variant", "a:--alpha=0.2", "--variant", "b:--alpha=0.6"]
    argv += ["--variant", "c:--alpha=0.9", "--seeds", "3", "--pilot", "--total-steps", "800"]
    argv += ["--jobs", "2", "--out", str(out), "--train-command", fake_train]
    argv += ["--bootstrap-reps", "100", "--entropy-threshold", "0.35", "--no-progress"]
    mp = pytest.MonkeyPatch()
    mp.setenv("FAKE_TRAIN_LOG", str(log))
    mp.setenv("FAKE_TRAIN_CRASH_ALPHA", "0.9")
    try:
        code = compare.main(argv)
        calls_first = invocations(log)
        summary = json.loads((out / "summary.json").read_text())
        rerun_code = compare.main([*argv, "--no-plots"])
    finally:
        mp.undo()
    return {
        "out": out,
        "code": code,
        "summary": summary,
        "calls_first": calls_first,
        "calls_all": invocations(log),
        "rerun_code": rerun_code,
    }


def test_fake_compare_figures(fake_compare) -> None:
    s = fake_compare["summary"]
    assert fake_compare["code"] == 1  # some runs failed
    assert s["reference"] == "a" and s["seeds"] == [0, 1, 2]
    for name, alpha in (("a", 0.2), ("b", 0.6)):
        expected = np.array([fake_success(alpha, seed) for seed in range(3)])
        m = s["variants"][name]["metrics"]
        assert m["success_rate"]["values"] == pytest.approx(expected.tolist())
        assert m["success_rate"]["seeds"] == [0, 1, 2]
        assert m["success_rate"]["mean"] == pytest.approx(expected.mean())
        assert m["success_rate"]["iqm"] == pytest.approx(np.mean(expected))  # n=3: no trim
        lo, hi = m["success_rate"]["mean_ci"]
        assert expected.min() - 1e-12 <= lo <= expected.mean() <= hi <= expected.max() + 1e-12
        assert m["solved_rate"]["mean"] == pytest.approx(expected.mean() / 2)
        assert m["mean_return"]["mean"] == pytest.approx(10 * expected.mean())
        # success ramps linearly from s/8 (100 steps) to s (800 steps): mean height 9s/16
        assert m["auc_success"]["values"] == pytest.approx((9 * expected / 16).tolist())
        st = s["variants"][name]["stability"]
        # entropy 1.5 - 0.2u first below 0.35 at u=6: update 7, env step 700
        assert st["collapsed_runs"] == 3 and st["collapse_update_median"] == 7
        assert st["collapse_env_steps_median"] == 700
        assert st["adv_clip_active_frac"] == pytest.approx(0.25)
        raw = st["advantage"]["adv_raw"]["pos_frac"]
        assert (raw["first_quarter"], raw["last_quarter"]) == (0.25, 0.75)
        assert s["variants"][name]["agent_types"] == ["rescuer", "scout"]
        curve = s["variants"][name]["curves"]["episode/success"]
        assert curve["env_steps"][0] == 100 and curve["env_steps"][-1] == 800
        assert curve["mean"][-1] == pytest.approx(expected.mean())
    poi = s["probability_of_improvement"]["b"]["success_rate"]
    assert poi["value"] == 1.0 and poi["ci"] == [1.0, 1.0]  # every b run beats every a run
    # mean success b - a = 0.5 * (0.6 - 0.2) = 0.2; relative 0.35 / 0.15 - 1
    assert poi["mean_difference"]["value"] == pytest.approx(0.2)
    assert poi["mean_difference"]["relative"] == pytest.approx(0.35 / 0.15 - 1)
    # paired by seed, every difference is +0.2: of the 2**3 sign patterns only all-plus and
    # all-minus reach |mean| 0.2, so p = 2/8; c has no runs, so Holm has one p-value to adjust
    assert s["primary_metric"] == "success_rate"
    assert poi["p_value"] == pytest.approx(0.25) and poi["test"]["paired"] is True
    assert poi["p_holm"] == pytest.approx(0.25) and poi["shown"] is False
    assert s["probability_of_improvement"]["c"]["success_rate"]["p_value"] is None
    assert s["probability_of_improvement"]["b"]["mean_return"]["exploratory"] is True
    assert [(e["variant"], e["baseline"], e["shown"]) for e in s["comparisons"]] == [
        ("b", "a", False),
        ("c", "a", False),
    ]
    assert any(
        v.startswith("nothing shown: b vs a on final success rate: P(improvement) = 1.00")
        for v in s["verdicts"]
    )
    # the second endpoint: mean of the last 5 periodic evaluations (the fake logs none)
    assert "success_rate_last5" not in s["metrics"]


def test_fake_compare_crashed_runs_reported_and_excluded(fake_compare) -> None:
    s = fake_compare["summary"]
    c = s["variants"]["c"]
    assert (c["n_finished"], c["n_failed"], c["metrics"]["success_rate"]["n"]) == (0, 3, 0)
    failed = [r for r in s["runs"] if r["status"] == "failed"]
    assert sorted((r["variant"], r["seed"]) for r in failed) == [("c", 0), ("c", 1), ("c", 2)]
    assert all("exit code 3" in r["error"] and "simulated crash" in r["error"] for r in failed)
    assert sum("c/seed_1 failed" in w for w in s["warnings"]) == 1
    assert any("only 3 seeds" in w for w in s["warnings"])
    report = (fake_compare["out"] / "report.md").read_text()
    assert "## Failed runs (excluded from the statistics)" in report
    assert "simulated crash" in report
    assert "nothing shown: b vs a on final success rate" not in report  # a table, not sentences
    assert "| b | a | 1.00 [1.00, 1.00] |" in report and "nothing shown |" in report
    assert "## Primary comparisons" in report
    assert "python -m marl.compare --variant a:--alpha=0.2" in report
    assert "rliable" in report and "numpy" in report  # package versions


def test_fake_compare_plots(fake_compare) -> None:
    plots = fake_compare["summary"]["plots"]
    assert set(plots) >= {
        "plots/learning_curves.png",
        "plots/aggregate_intervals.png",
        "plots/probability_of_improvement.png",
        "plots/advantages_a.png",
        "plots/advantages_b.png",
    }
    for rel in plots:
        data = (fake_compare["out"] / rel).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_rerun_skips_finished_and_retries_crashed(fake_compare) -> None:
    first, total = fake_compare["calls_first"], fake_compare["calls_all"]
    assert sorted(first) == sorted(f"{v}/seed_{s} start" for v in "abc" for s in range(3))
    second = total[len(first) :]
    # finished runs untouched, crashed runs retried (and crash again)
    assert sorted(second) == [f"c/seed_{s} start" for s in range(3)]
    assert fake_compare["rerun_code"] == 1


def test_changed_variant_options_refused(fake_compare, fake_train, monkeypatch, capsys) -> None:
    argv = ["--variant", "a:--alpha=0.3", "--seeds", "3", "--pilot", "--total-steps", "800"]
    argv += ["--out", str(fake_compare["out"]), "--train-command", fake_train]
    with pytest.raises(SystemExit) as exc:
        compare.main(argv)
    assert exc.value.code == 2
    assert "variant 'a' was run with ['--alpha=0.2']" in capsys.readouterr().err


def test_single_seed_warns_and_gives_no_ci(tmp_path, fake_train, monkeypatch, capsys) -> None:
    argv = ["--variant", "a:--alpha=0.2", "--variant", "b:--alpha=0.4", "--seeds", "1", "--pilot"]
    argv += ["--total-steps", "800", "--out", str(tmp_path / "o"), "--no-plots"]
    argv += ["--train-command", fake_train, "--bootstrap-reps", "50", "--no-progress"]
    assert run_main(argv, monkeypatch, tmp_path / "calls.log") == 0
    err = capsys.readouterr().err
    assert "fewer than 2 seeds" in err
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    m = s["variants"]["b"]["metrics"]["success_rate"]
    assert m["mean"] == pytest.approx(0.2) and m["mean_ci"] is None and m["iqm_ci"] is None
    poi = s["probability_of_improvement"]["b"]["success_rate"]
    assert (poi["value"], poi["ci"], poi["n_x"], poi["n_y"]) == (1.0, None, 1, 1)
    assert poi["mean_difference"]["value"] == pytest.approx(0.1)
    assert poi["mean_difference"]["ci"] is None
    assert any("without confidence intervals" in w for w in s["warnings"])
    assert poi["p_value"] is None and poi["shown"] is False  # one pair: no test
    assert "| b | a | 1.00 (no CI) |" in (tmp_path / "o" / "report.md").read_text()


def test_calibration_study_reports_the_seed_claim(tmp_path, fake_train, monkeypatch) -> None:
    out = tmp_path / "o"
    argv = [
        "--study",
        "calibration",
        "--seeds",
        "2",
        "--pilot",
        "--total-steps",
        "800",
        "--out",
        str(out),
    ]
    argv += ["--train-command", fake_train, "--bootstrap-reps", "50", "--no-plots"]
    assert run_main(argv + ["--no-progress"], monkeypatch, tmp_path / "calls.log") == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["reference"] == "baseline" and len(s["variants"]) == 6
    # fake: success = 0.25 + 0.05 * seed, + 0.1 with --recipe=calibrated
    diff = s["probability_of_improvement"]["calibrated"]["success_rate"]["mean_difference"]
    assert diff["value"] == pytest.approx(0.1)
    assert diff["relative"] == pytest.approx(0.375 / 0.275 - 1)
    report = (out / "report.md").read_text()
    assert "## The seed's claim" in report
    assert "calibrated − baseline = +10.0 percentage points" in report
    assert "+36% relative to the baseline's mean" in report
    # a descriptive figure the runs report: aggregated and compared, no verdict; figures no run
    # reports (websearch's query diversity) are left out without a note
    assert s["metrics"]["search_diversity"]["descriptive"] is True
    assert s["metrics"]["success_rate"]["descriptive"] is False
    div = s["probability_of_improvement"]["calibrated"]["search_diversity"]
    assert div["mean_difference"]["value"] == pytest.approx(0.1) and div["value"] == 1.0
    assert not any("diversity" in v for v in s["verdicts"])
    assert "query_diversity" not in s["metrics"]
    assert not any("query_diversity" in w for w in s["warnings"])
    assert "P(higher than baseline)" in report and "Descriptive: no verdict" in report


# ------------------------------------------------------------------------------------------
# resumption after a killed compare
# ------------------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_killed_compare_resumes_without_redoing_finished_runs(tmp_path, fake_train) -> None:
    out, log = tmp_path / "out", tmp_path / "calls.log"
    argv = [sys.executable, "-m", "marl.compare", "--variant", "a:--alpha=0.2"]
    argv += ["--variant", "b:--alpha=0.6", "--seeds", "2", "--pilot", "--total-steps", "800"]
    argv += ["--jobs", "1", "--out", str(out), "--train-command", fake_train]
    argv += ["--bootstrap-reps", "50", "--no-plots", "--no-progress"]
    env = dict(os.environ, FAKE_TRAIN_LOG=str(log), FAKE_TRAIN_BLOCK="b/seed_0")
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
    blocked_ckpt = out / "runs" / "b" / "seed_0" / "checkpoints" / "latest.pt"
    deadline = time.monotonic() + 90
    while not blocked_ckpt.exists():
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "the blocking fake run never started"
        time.sleep(0.1)
    # a/seed_0 finished, b/seed_0 is mid-run with a checkpoint: kill compare hard
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (out / "runs" / "a" / "seed_0" / "eval.json").exists()
    assert not (out / "runs" / "b" / "seed_0" / "eval.json").exists()
    time.sleep(0.5)  # the orphaned run got SIGTERM (parent-death signal) and exits
    assert invocations(log) == ["a/seed_0 start", "b/seed_0 start"]

    env.pop("FAKE_TRAIN_BLOCK")
    rerun = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=90)
    assert rerun.returncode == 0, rerun.stderr
    assert invocations(log)[2:] == ["b/seed_0 resume", "a/seed_1 start", "b/seed_1 start"]
    s = json.loads((out / "summary.json").read_text())
    assert [s["variants"][v]["n_finished"] for v in ("a", "b")] == [2, 2]
    status = json.loads((out / "status.json").read_text())
    assert status["b/seed_0"]["mode"] == "resume" and status["b/seed_0"]["state"] == "finished"


# ------------------------------------------------------------------------------------------
# end to end with the real trainer
# ------------------------------------------------------------------------------------------

TINY_CONFIG = {
    "num_envs": 4,
    "rollout_steps": 16,
    "epochs": 1,
    "num_minibatches": 1,
    "hidden_dim": 16,
    "critic_hidden_dim": 16,
    "eval_every": 0,
    "eval_episodes": 2,
    "checkpoint_every": 1,
    "plots": False,
    "env": {"grid_size": 8, "max_cycles": 20, "n_targets": 1},
}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_end_to_end_real_train(tmp_path) -> None:
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump(TINY_CONFIG))
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "marl.compare", "--algo", "mappo", "--config", str(cfg)]
    argv += ["--variant", "batch:--whitening=batch", "--variant", "ti:--whitening=team_individual"]
    argv += ["--seeds", "2", "--pilot", "--total-steps", "128", "--jobs", "2", "--out", str(out)]
    argv += ["--bootstrap-reps", "100", "--no-progress", "--no-plots"]  # plots: fake tests
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    res = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=280)
    assert res.returncode == 0, res.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    for name in ("batch", "ti"):
        v = s["variants"][name]
        assert v["n_finished"] == 2 and v["n_failed"] == 0
        for seed in (0, 1):
            run_dir = out / "runs" / name / f"seed_{seed}"
            ev = json.loads((run_dir / "eval.json").read_text())
            assert v["metrics"]["success_rate"]["values"][seed] == pytest.approx(ev["success_rate"])
            assert yaml.safe_load((run_dir / "config.yaml").read_text())["seed"] == seed
        assert v["metrics"]["success_rate"]["mean_ci"] is not None
        assert "episode/return" in v["curves"] or "episode/success" in v["curves"]
        assert v["stability"]["runs_with_entropy"] == 2
    assert len(s["verdicts"]) == 4 and all(" ti " in f" {x}" for x in s["verdicts"])
    assert "ti" in (out / "report.md").read_text()
    cfgs = [
        yaml.safe_load((out / "runs" / n / "seed_0" / "config.yaml").read_text())
        for n in ("batch", "ti")
    ]
    assert [c["whitening"] for c in cfgs] == ["batch", "team_individual"]
    assert all(c["total_steps"] == 128 for c in cfgs)

    # an interrupted run (checkpoint, no eval.json) is resumed with the real --resume; the
    # finished runs are not rerun
    (out / "runs" / "ti" / "seed_1" / "eval.json").unlink()
    (out / "runs" / "ti" / "seed_1" / "finished.json").unlink()
    res = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=280)
    assert res.returncode == 0, res.stderr[-3000:]
    status = json.loads((out / "status.json").read_text())
    assert status["ti/seed_1"]["mode"] == "resume" and status["ti/seed_1"]["attempts"] == 2
    assert [status[f"{n}/seed_{k}"]["attempts"] for n in ("batch", "ti") for k in (0, 1)] == [
        1,
        1,
        1,
        2,
    ]
    assert (out / "runs" / "ti" / "seed_1" / "eval.json").is_file()


def test_second_compare_on_same_out_refused(tmp_path, fake_train, monkeypatch, capsys) -> None:
    import fcntl

    out = tmp_path / "o"
    out.mkdir()
    argv = ["--variant", "a:--alpha=0.2", "--seeds", "1", "--pilot", "--total-steps", "800"]
    argv += ["--out", str(out), "--train-command", fake_train, "--no-plots"]
    with open(out / "compare.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a running compare holds it
        with pytest.raises(SystemExit) as exc:
            run_main(argv, monkeypatch, tmp_path / "calls.log")
    assert exc.value.code == 2
    assert "another marl.compare is running" in capsys.readouterr().err
    assert invocations(tmp_path / "calls.log") == []
