"""No study whose two arms are one configuration (issue 51 item 4).

* ``marl.compare`` refuses, before any run and under ``--dry-run`` too, variants whose
  effective training configurations are equal (:func:`marl.run.config.one_configuration`),
  naming both variants and the option that makes them one;
* the built-in studies have no such pair (GRPO's whitening studies leave out ``ti_a0.5``);
* the report flags arms whose results are identical on every seed as one configuration and
  leaves the A/A comparisons, and the comparisons that repeat another, out of the Holm family
  (planted per-seed values, Holm worked out by hand in the comments).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from test_compare import FAKE_TRAIN, invocations

from marl.experiments import compare, report, significance
from marl.experiments.spec import CompareSpec, Variant, validate_spec
from marl.experiments.studies import STUDIES, get_study
from marl.run.config import ConfigError, parse_cli


@pytest.fixture(scope="module")
def fake_train(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("fake") / "fake_train.py"
    path.write_text(FAKE_TRAIN)
    return f"{sys.executable} {path}"


# ------------------------------------------------------------------------------------------
# compare refuses variants that are one configuration
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dry_run", [False, True])
def test_compare_refuses_one_configuration_before_any_run(
    tmp_path, fake_train, monkeypatch, capsys, dry_run
) -> None:
    out = tmp_path / "o"
    argv = ["--algo", "grpo", "--variant", "none:--whitening=none", "--variant", "b:--alpha=0.3"]
    argv += ["--variant", "ti:--whitening=team_individual,--alpha=0.5,--whiten-inner=type"]
    argv += ["--seeds", "8", "--total-steps", "800", "--out", str(out)]
    argv += ["--train-command", fake_train, "--no-progress", "--no-plots"]
    argv += ["--dry-run"] if dry_run else []
    monkeypatch.setenv("FAKE_TRAIN_LOG", str(tmp_path / "calls.log"))
    with pytest.raises(SystemExit) as exc:
        compare.main(argv)
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert "variants 'none' and 'ti' are one configuration" in captured.err
    assert "--whitening none trains as --whitening team_individual" in captured.err
    assert "'b'" not in captured.err  # alpha 0.3 is another configuration
    assert "[new]" not in captured.out  # no plan printed
    assert not out.exists() and invocations(tmp_path / "calls.log") == []


def test_mappo_no_op_and_identical_options_are_refused(tmp_path, capsys) -> None:
    def refused(*variants: str) -> str:
        argv = [arg for v in variants for arg in ("--variant", v)]
        argv += ["--seeds", "8", "--out", str(tmp_path / "o"), "--dry-run"]
        with pytest.raises(SystemExit) as exc:
            compare.main(argv)
        assert exc.value.code == 2
        return capsys.readouterr().err

    err = refused("a:--epochs=3,--value-epochs=3", "b:--epochs=3,--value-epochs=none")
    assert "variants 'a' and 'b' are one configuration: under --algo mappo, --value-epochs 3" in err
    assert "--value-epochs 3 trains as --value-epochs none" in err
    err = refused("a:--alpha=0.5", "b:", "c:--alpha=0.2")
    assert "variants 'a' and 'b' are one configuration: they set the same" in err
    assert "'c'" not in err
    # options that change no result are no difference either
    err = refused("a:--checkpoint-every=3", "b:")
    assert "--checkpoint-every changes no result" in err


def test_report_only_may_keep_one_configuration() -> None:
    spec = CompareSpec(
        algo="grpo",
        config=None,
        variants=[Variant("none", ["--whitening=none"]), Variant("ti", [])],
        seeds=[0, 1],
        out="unused",
        reference="none",
    )
    with pytest.raises(compare.CompareError, match="'none' and 'ti' are one configuration"):
        validate_spec(spec)
    validate_spec(spec, allow_one_configuration=True)  # the runs exist: the report flags them


@pytest.mark.parametrize("algo", ["mappo", "grpo"])
@pytest.mark.parametrize("backbone", ["mlp", "gru"])
def test_no_built_in_study_has_two_arms_of_one_configuration(algo, backbone) -> None:
    checked = 0
    for name in STUDIES:
        try:
            study = get_study(name, backbone=backbone, algo=algo)
        except ValueError:
            continue  # grouping needs a sequence backbone
        variants = [Variant(n, list(a)) for n, a in study.variants.items()]
        spec = CompareSpec(
            algo=algo,
            config=None,
            variants=variants,
            seeds=[0],
            out="unused",
            reference=study.reference,
            common=[f"--backbone={backbone}"],
        )
        try:
            for v in variants:  # studies written for the other algorithm do not parse
                parse_cli([f"--algo={algo}", f"--backbone={backbone}", *v.args])
        except ConfigError:
            continue
        validate_spec(spec)
        checked += 1
    assert checked >= 5


def test_grpo_whitening_studies_leave_out_the_repeat_of_none() -> None:
    for name in ("whitening", "whitening_scales"):
        grpo, mappo = get_study(name, algo="grpo"), get_study(name, algo="mappo")
        assert "ti_a0.5" in mappo.variants and "ti_a0.5" not in grpo.variants
        assert set(grpo.variants) == set(mappo.variants) - {"ti_a0.5"}
        assert "none" in grpo.variants and "ti_a0.25" in grpo.variants
        assert "left out" in grpo.description


# ------------------------------------------------------------------------------------------
# the report: identical arms and the Holm family
# ------------------------------------------------------------------------------------------
def test_identical_arms_hand_examples() -> None:
    a = {"success_rate": {0: 0.5, 1: 0.6}, "mean_return": {0: 1.0, 1: 2.0}}
    same = {"success_rate": {0: 0.5, 1: 0.6, 2: 0.9}, "mean_return": {0: 1.0, 1: 2.0}}
    other_return = {"success_rate": {0: 0.5, 1: 0.6}, "mean_return": {0: 1.0, 1: 2.5}}
    disjoint = {"success_rate": {5: 0.5}}
    per_seed = {"a": a, "b": other_return, "c": same, "d": disjoint, "e": dict(a)}
    # b differs on one secondary figure; d shares no seed; c agrees on every common seed
    assert significance.identical_arms(per_seed, "success_rate") == [["a", "c", "e"]]
    assert significance.identical_arms({"a": a, "b": other_return}, "success_rate") == []
    # only the figures named count (the report names the evaluation figures)
    pair = {"a": a, "b": other_return}
    assert significance.identical_arms(pair, "success_rate", ["solved_rate"]) == [["a", "b"]]
    assert significance.identical_arms(pair, "success_rate", ["mean_return"]) == []


def test_family_repeats_hand_examples() -> None:
    groups = [["x", "x2"]]
    pairs = [("x", "r"), ("x2", "r"), ("y", "r"), ("x2", "x"), ("r", "x2"), ("y", "x2")]
    assert significance.family_repeats(pairs, groups) == [
        None,
        {"reason": "repeat", "repeats": 0, "reversed": False},
        None,
        {"reason": "a/a", "repeats": None},
        {"reason": "repeat", "repeats": 0, "reversed": True},
        None,
    ]
    # without identical arms only the reversed pair repeats (the same two-sided test)
    assert significance.family_repeats(pairs, []) == [
        None, None, None, None, {"reason": "repeat", "repeats": 1, "reversed": True}, None
    ]  # fmt: skip


def _write_run(path: Path, seed: int, success: float, mean_return: float) -> None:
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump({"algo": "mappo", "seed": seed}))
    evaluation = {"success_rate": success, "mean_return": mean_return}
    (path / "eval.json").write_text(json.dumps(evaluation))
    rows = [{"update": u, "env_steps": 100 * u, "episode/success": success * u / 4} for u in (1, 2)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "finished.json").write_text(json.dumps({"update": 2, "env_steps": 200}))


def _planted_summary(tmp_path: Path, *, x2_return_shift: float = 0.0) -> dict:
    """Seven seeds. base = 0.5 + 0.01 s; x = base + 0.2; x2 = x on every figure (unless
    shifted on seed 3's return); y = base + 0.1, but base - 0.1 on seed 6."""
    seeds = list(range(7))
    success = {
        "base": [0.5 + 0.01 * s for s in seeds],
        "x": [0.7 + 0.01 * s for s in seeds],
        "x2": [0.7 + 0.01 * s for s in seeds],
        "y": [0.6 + 0.01 * s if s < 6 else 0.4 + 0.01 * s for s in seeds],
    }
    records = []
    for name, values in success.items():
        for s, value in zip(seeds, values, strict=True):
            ret = 10 * value + (x2_return_shift if (name, s) == ("x2", 3) else 0.0)
            run_dir = tmp_path / "runs" / name / f"seed_{s}"
            _write_run(run_dir, s, value, ret)
            records.append(
                {"variant": name, "seed": s, "run_dir": str(run_dir), "log": "log",
                 "status": "finished", "error": None, "command": "train"}
            )  # fmt: skip
    spec = CompareSpec(
        algo="mappo",
        config=None,
        variants=[Variant(n, [f"--alpha=0.{i + 1}"]) for i, n in enumerate(success)],
        seeds=seeds,
        out=str(tmp_path),
        reference="base",
        comparisons=[("x2", "x"), ("y", "x"), ("y", "x2")],
    )
    return report.build_summary(spec, records, reps=200)


def test_report_leaves_one_configuration_out_of_the_holm_family(tmp_path) -> None:
    s = _planted_summary(tmp_path)
    assert s["one_configuration"] == [["x", "x2"]]
    family = {(e["variant"], e["baseline"]): e for e in s["comparisons"]}
    assert list(family) == [
        ("x", "base"), ("x2", "base"), ("y", "base"), ("x2", "x"), ("y", "x"), ("y", "x2")
    ]  # fmt: skip
    # paired sign-flip tests over 7 seeds (128 arrangements):
    # x - base = +0.2 on every seed: only the two all-same-sign flips reach it, p = 2/128;
    # y - x = -0.1 (six seeds), -0.3 (seed 6): every flip shrinks it, p = 2/128;
    # y - base = +0.1 on six seeds, -0.1 on one: |sum| >= 0.5 needs 0, 1, 6 or 7 plus signs,
    # 1 + 7 + 7 + 1 = 16 arrangements, p = 16/128; x2 - x = 0 everywhere: p = 1.
    p = {key: e["p_value"] for key, e in family.items()}
    assert p[("x", "base")] == pytest.approx(2 / 128) == p[("y", "x")]
    assert p[("y", "base")] == pytest.approx(16 / 128) and p[("x2", "x")] == 1.0
    # Holm over the three that stay (x vs base, y vs base, y vs x): sorted 2/128, 2/128,
    # 16/128 -> 3 x 2/128 = 0.046875, max(0.046875, 2 x 2/128) = 0.046875,
    # max(0.046875, 1 x 16/128) = 0.125
    assert family[("x", "base")]["p_holm"] == pytest.approx(0.046875)
    assert family[("y", "x")]["p_holm"] == pytest.approx(0.046875)
    assert family[("y", "base")]["p_holm"] == pytest.approx(0.125)
    for key in [("x", "base"), ("y", "base"), ("y", "x")]:
        assert family[key]["left_out"] is None
    assert family[("x", "base")]["shown"] is True and family[("x", "base")]["direction"] == "better"
    assert family[("y", "x")]["shown"] is True and family[("y", "x")]["direction"] == "worse"
    assert family[("y", "base")]["shown"] is False
    # the A/A: no p_holm, no verdict
    aa = family[("x2", "x")]
    assert aa["left_out"]["reason"] == "a/a" and aa["left_out"]["repeats"] is None
    assert aa["p_holm"] is None and aa["shown"] is None and aa["direction"] is None
    assert "x2 and x gave identical results on every seed" in aa["left_out"]["why"]
    # the repeats carry the verdict of what they repeat
    rep = family[("x2", "base")]
    assert rep["left_out"]["reason"] == "repeat"
    assert rep["left_out"]["repeats"] == {"variant": "x", "baseline": "base"}
    assert (rep["p_holm"], rep["shown"], rep["direction"]) == (
        family[("x", "base")]["p_holm"], True, "better"
    )  # fmt: skip
    rep = family[("y", "x2")]
    assert rep["left_out"]["repeats"] == {"variant": "y", "baseline": "x"}
    assert (rep["shown"], rep["direction"]) == (True, "worse")
    assert "x2 and x gave identical results" in rep["left_out"]["why"]
    assert s["probability_of_improvement"]["x2"]["success_rate"]["left_out"]["reason"] == "repeat"
    outcome = s["decision_rule"]["outcome"]
    assert outcome == {"comparisons": 3, "shown": 2, "better": 1, "worse": 1, "left_out": 3}
    text = Path(report.write_report(s, str(tmp_path))).read_text()
    assert "**One configuration**: x = x2 gave identical results on every seed" in text
    assert "3 left out of the Holm family" in text
    assert "| x2 | x |" in text and "left out: A/A (one configuration)" in text
    assert "left out: repeats x vs base (**shown better**)" in text
    assert any(v.startswith("left out of the Holm family: x2 vs x") for v in s["verdicts"])


def test_a_difference_in_any_figure_keeps_the_arms_apart(tmp_path) -> None:
    # x2's return differs from x's on one seed: two configurations, six comparisons in Holm
    s = _planted_summary(tmp_path, x2_return_shift=0.5)
    assert s["one_configuration"] == []
    assert all(e["left_out"] is None for e in s["comparisons"])
    assert s["decision_rule"]["outcome"]["comparisons"] == 6
    # p-values 2/128 (x, x2 vs base; y vs x, x2), 16/128, 1: Holm's smallest is 6 x 2/128
    assert min(e["p_holm"] for e in s["comparisons"]) == pytest.approx(6 * 2 / 128)
    assert "One configuration" not in Path(report.write_report(s, str(tmp_path))).read_text()


def test_published_families_without_their_aa_comparisons() -> None:
    """benchmarks/aa_families.py on the published summaries: the identical arms it finds, and
    the decisions it recomputes without them (reading summary.json only)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "aa_families.py"
    spec = importlib.util.spec_from_file_location("aa_families", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    found = {}
    for summary in script.DEFAULT:
        study = script.families(str(path.parents[1] / summary))
        found[summary.split("/", 2)[2].removesuffix("/summary.json")] = study
    ladder = [["value_stab+adv_clip+ent+offset", "calibrated"]]
    assert {k: s["groups"] for k, s in found.items()} == {
        "whitening_scales/grpo_x10": [["none", "ti_a0.5"]],
        "whitening_scales/grpo_x100": [["none", "ti_a0.5"]],
        "calibration_ladder/sparse": ladder,
        "calibration_ladder/websearch_v2": ladder,
        "whitening_sparse_grpo": [["none", "ti_a0.5"]],
    }
    for study in found.values():
        for row in study["rows"]:
            # leaving the A/A comparisons out lowers p_holm (or keeps it) and changes no verdict
            if row["p_holm_without"] is not None:
                assert row["p_holm_without"] <= row["p_holm_all"] + 1e-12
            assert row["after"].startswith("left out") or row["after"] == row["before"]
    rows = {r["comparison"]: r for r in found["calibration_ladder/sparse"]["rows"]}
    # 11 published comparisons, 9 stay: Holm's first factor 11 becomes 9 (p = 6.1e-05 x 9)
    assert rows["default vs baseline"]["p_holm_published"] == pytest.approx(11 * 6.103515625e-05)
    assert rows["default vs baseline"]["p_holm_without"] == pytest.approx(9 * 6.103515625e-05)
    assert rows["calibrated vs value_stab+adv_clip+ent+offset"]["after"].startswith("left out: A/A")
