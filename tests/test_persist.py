"""python -m marl.experiments.persist: a study kept compactly reports as the full one did.

A planted study (run directories with realistic metrics rows: ~100 keys per update at full
precision, periodic validation evaluations, per-agent-type advantage statistics, a torn last
line) is reported by ``marl.compare --report-only`` from its full logs and, after persisting,
from its compact logs; :func:`report_differences` holds the two summaries to the rule of issue
51: per-seed values, p-values and verdicts identical, every other figure within 1e-6
relative, curves that are only plotted within 1% of their plot panel's y range. A published
study (docs/results/memory_study/family_1, compact already) compacted again is unchanged.
"""

from __future__ import annotations

import gzip
import json
import lzma
import math
import os
import random
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from marl.experiments import compare, persist, report, stats

REPO = Path(__file__).resolve().parents[1]
COMMIT = "d" * 40
TYPES = ("scout", "rescuer")
SEEDS = 5
UPDATES = 120
STEPS_PER_UPDATE = 512
AT_ENV_STEPS = 40 * STEPS_PER_UPDATE + 100  # between two evaluations (every 10 updates)
VARIANTS = {"a": "--alpha=0.2", "b": "--alpha=0.6", "c": "--alpha=0.9"}
LEVEL = {"a": 0.3, "b": 0.5, "c": 0.35}

# the keys the report reads, written out by hand (an independent list, not persist.KEYS)
ADV = ("mean", "std", "pos_frac", "pos_mean", "neg_mean")
READ = {"update", "env_steps", "episode/success", "episode/return", "entropy", "adv_clip_frac"}
READ |= {f"{p}/{s}" for p in ("adv_raw", "adv") for s in ADV}
READ |= {f"{p}/{t}/{s}" for p in ("adv_raw", "adv") for t in TYPES for s in ADV}


# ------------------------------------------------------------------------------------------
# a planted study
# ------------------------------------------------------------------------------------------
def metrics_rows(variant: str, seed: int) -> list[dict[str, Any]]:
    """A run's metrics.jsonl rows, shaped like marl.train's (values at full precision)."""
    rng = random.Random(f"{variant}/{seed}")
    level = LEVEL[variant] + 0.02 * seed
    rows = []
    for u in range(1, UPDATES + 1):
        progress = u / UPDATES
        row: dict[str, Any] = {"update": u, "env_steps": STEPS_PER_UPDATE * u}
        row.update(time_s=0.37 * u + rng.random(), cpu_s=0.35 * u, sps=1384.2 + rng.random())
        for prefix in ("adv_raw", "adv"):
            for group in ("", *(f"{t}/" for t in TYPES)):
                std = rng.uniform(0.2, 0.4) if prefix == "adv_raw" else rng.uniform(0.9, 1.1)
                mean = rng.gauss(0.0, 0.03) if prefix == "adv_raw" else rng.gauss(0.0, 3e-11)
                pos = rng.randrange(200, 1800) / 2048
                row[f"{prefix}/{group}mean"] = mean
                row[f"{prefix}/{group}std"] = std
                row[f"{prefix}/{group}pos_frac"] = pos
                row[f"{prefix}/{group}pos_mean"] = std * rng.uniform(0.5, 1.5)
                row[f"{prefix}/{group}neg_frac"] = 1 - pos
                row[f"{prefix}/{group}neg_mean"] = -std * rng.uniform(0.5, 1.5)
                row[f"{prefix}/{group}max_abs"] = 4 * std + rng.random()
        row["adv_clip_frac"] = 0.0 if u % 3 else rng.uniform(1e-4, 0.02)
        row.update(approx_kl=rng.uniform(0, 0.01), grad_norm=rng.uniform(0.1, 1.0), lr=3e-4)
        row.update({"loss/policy": rng.gauss(0, 0.01), "loss/value": rng.uniform(0, 0.1)})
        row["entropy"] = 1.6 * math.exp(-3 * progress * (1 + seed / 4)) + rng.uniform(0, 0.02)
        row["explained_variance"] = float("nan") if u == 1 else rng.uniform(-1, 1)
        episodes = rng.randrange(0, 40)
        if episodes:  # no episode ended: marl.train logs no episode/* figures
            successes = sum(rng.random() < level * progress for _ in range(episodes))
            row["episode/success"] = successes / episodes
            row["episode/solved"] = successes / episodes
            row["episode/return"] = rng.gauss(level * progress, 0.4)
            row["episode/episode_length"] = rng.uniform(50, 200)
            row["episodes"] = float(episodes)
        if u % 10 == 0:
            found = sum(rng.random() < level * progress for _ in range(32))
            row["eval/success_rate"] = found / 32
            row["eval/solved_rate"] = found / 64
            row["eval/mean_return"] = rng.gauss(level * progress, 0.2)
            row["eval/search_diversity"] = rng.uniform(0.3, 0.9)
            row["eval/n_episodes"] = 32
        rows.append(row)
    return rows


def write_run(run: Path, variant: str, seed: int, *, torn: bool = False) -> None:
    run.mkdir(parents=True)
    rows = metrics_rows(variant, seed)
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if torn:  # a run killed while writing its last line
        text += json.dumps(rows[-1])[:57]
    (run / "metrics.jsonl").write_text(text)
    config = f"seed: {seed}\nenv_fn: envs.multisearch_v0:vector_env\nenv:\n  preset: sparse\n"
    (run / "config.yaml").write_text(config)
    last = rows[-1]
    final = {"success_rate": last["eval/success_rate"], "solved_rate": last["eval/solved_rate"]}
    final.update(mean_return=last["eval/mean_return"], search_diversity=0.5 + 0.01 * seed)
    (run / "eval.json").write_text(json.dumps(final))
    marker = {"update": UPDATES, "env_steps": last["env_steps"], "time_s": 44.1, "cpu_s": 42.0}
    marker.update(commit=COMMIT, commits=[COMMIT], dirty=False)
    (run / "finished.json").write_text(json.dumps(marker))


def plant_study(out: Path) -> list[str]:
    """Every run of the planted study under ``out``; returns its marl.compare options."""
    argv = []
    for variant, options in VARIANTS.items():
        argv += ["--variant", f"{variant}:{options}"]
        for seed in range(SEEDS):
            write_run(out / "runs" / variant / f"seed_{seed}", variant, seed, torn=seed == 1)
    return [*argv, "--seeds", str(SEEDS), "--total-steps", str(UPDATES * STEPS_PER_UPDATE)]


def regenerate(study: Path, argv: list[str]) -> dict[str, dict]:
    """``marl.compare --report-only`` on ``study``: its summary.json and those of its
    at_<N>_env_steps reports, by report name."""
    argv = [*argv, "--out", str(study), "--report-only", "--no-plots", "--no-progress"]
    code = compare.main([*argv, "--bootstrap-reps", "50"])
    assert code == 0
    found = {"": json.loads((study / "summary.json").read_text())}
    for at in sorted(study.glob("at_*_env_steps/summary.json")):
        found[at.parent.name] = json.loads(at.read_text())
    return found


# ------------------------------------------------------------------------------------------
# the rule between the two reports
# ------------------------------------------------------------------------------------------
#: When and where a report was made, and the runs' status.json fields (a persisted study
#: keeps no status.json): not compared.
NOT_COMPARED = ("created", "wall_s", "environment", "commands", "plots")
RUN_STATUS = ("command", "attempts", "wall_s", "returncode")
#: Identical wherever they are: the per-seed values and what is decided from them.
IDENTICAL = ("values", "seeds", "p_value", "p_holm", "shown", "direction", "verdicts")


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def report_differences(full: Any, compact: Any) -> tuple[list[str], float]:
    """Every break of the rule, one line each, and the largest deviation of a plotted curve
    as a fraction of its panel's y range."""
    problems: list[str] = []
    worst = 0.0

    def walk(a: Any, b: Any, path: tuple[str, ...], identical: bool) -> None:
        nonlocal worst
        where = "/".join(path)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            skip = NOT_COMPARED if not path else RUN_STATUS if path[0] == "runs" else ()
            for key in sorted((set(a) | set(b)) - set(skip)):
                if key not in a or key not in b:
                    problems.append(f"{where}/{key}: in one report only")
                else:
                    walk(a[key], b[key], (*path, key), identical or key in IDENTICAL)
        elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            for i, (x, y) in enumerate(zip(a, b, strict=True)):
                walk(x, y, (*path, str(i)), identical)
        elif _number(a) and _number(b) and not identical and a != b:
            span = persist.plot_panel_range(path, full)
            if span is not None:
                worst = max(worst, abs(a - b) / span)
                if abs(a - b) > persist.PLOT_TOLERANCE * span:
                    problems.append(f"{where}: {a!r} vs {b!r} (plotted; panel range {span:.3g})")
            elif abs(a - b) > 1e-6 * max(abs(a), abs(b)):
                relative = abs(a - b) / max(abs(a), abs(b))
                problems.append(f"{where}: {a!r} vs {b!r} (relative {relative:.2g})")
        elif a != b or type(a) is not type(b):
            problems.append(f"{where}: {a!r} vs {b!r}")

    walk(full, compact, (), False)
    return problems, worst


def test_the_rule_catches_what_it_should() -> None:
    """The comparison itself, on hand-made summaries."""
    base = {
        "created": "x",
        "variants": {
            "a": {
                "metrics": {"success_rate": {"values": [0.5, 0.25], "mean": 0.375}},
                "curves": {"entropy": {"env_steps": [1, 2], "mean": [1.0, 0.5], "n": 2}},
            }
        },
        "comparisons": [{"p_value": 0.03, "p_holm": 0.06}],
    }
    assert report_differences(base, json.loads(json.dumps(base))) == ([], 0.0)

    def changed(path: list, value: Any) -> dict:
        other = json.loads(json.dumps(base))
        node = other
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        return other

    per_seed = ["variants", "a", "metrics", "success_rate", "values", 0]
    assert report_differences(base, changed(per_seed, 0.5 + 1e-15))[0]
    assert report_differences(base, changed(["comparisons", 0, "p_holm"], 0.06 + 1e-16))[0]
    mean = ["variants", "a", "metrics", "success_rate", "mean"]
    assert not report_differences(base, changed(mean, 0.375 * (1 + 5e-7)))[0]
    assert report_differences(base, changed(mean, 0.375 * (1 + 2e-6)))[0]
    curve = ["variants", "a", "curves", "entropy", "mean", 1]
    assert report_differences(base, changed(curve, 0.5025))[1] == pytest.approx(0.005)
    assert report_differences(base, changed(curve, 0.52))[0]
    assert not report_differences(base, changed(["created"], "y"))[0]


# ------------------------------------------------------------------------------------------
# the key table and each precision, against references computed here
# ------------------------------------------------------------------------------------------
def test_dropped_keys_are_exactly_those_the_report_does_not_read() -> None:
    rows = metrics_rows("a", 0)
    logged = set().union(*rows)
    eval_keys = {k for k in logged if k.startswith("eval/")}
    kept = set().union(*persist.compact_rows(rows))
    assert kept == (READ | eval_keys) & logged
    assert {k for k in logged if persist.rule_for(k) is None} == logged - READ - eval_keys
    assert "adv/scout/neg_frac" not in kept and "episode/solved" not in kept


def test_the_table_covers_every_key_the_report_names() -> None:
    named = set(report.CURVE_KEYS) | {"update", "env_steps", "entropy", "adv_clip_frac"}
    named |= {key for source, key, _ in report.METRICS.values() if source != "eval"}
    named |= {f"{p}/{s}" for p in ("adv_raw", "adv") for s in report.ADV_STATS}
    named |= {f"{p}/any_type/{s}" for p in ("adv_raw", "adv") for s in report.ADV_STATS}
    assert [k for k in sorted(named) if persist.rule_for(k) is None] == []
    exact = {"update", "env_steps", "episode/success", "eval/success_rate", "eval/n_episodes"}
    assert {k for k in exact if persist.rule_for(k).precision != persist.EXACT} == set()


@pytest.mark.parametrize(
    ("largest", "fraction", "step", "decimals"),
    [(0.98, 0.02, 0.01, 2), (0.45, 0.02, 0.005, 3), (1.0, 0.01, 0.01, 2), (0.31, 0.01, 0.002, 3),
     (1234.0, 0.002, 2.0, 1), (5e-11, 0.01, 5e-13, 13)],
)  # fmt: skip
def test_grid_steps(largest: float, fraction: float, step: float, decimals: int) -> None:
    assert persist.grid(largest, fraction) == (pytest.approx(step), decimals)
    assert persist.grid(0.0, 0.01) is None


def series(rows: list[dict], key: str) -> np.ndarray:
    return np.array([r[key] for r in rows if _number(r.get(key))])


def test_each_precision_holds_its_bound() -> None:
    rows = metrics_rows("b", 3)
    compact = persist.compact_rows(rows, at_env_steps=[AT_ENV_STEPS])
    assert len(compact) == len(rows)
    for key in sorted(set().union(*compact)):
        rule = persist.rule_for(key)
        full, kept = series(rows, key), series(compact, key)
        assert full.shape == kept.shape, key
        if rule.precision == persist.EXACT:
            assert full.tolist() == kept.tolist(), key
        elif rule.precision == persist.SIGNIFICANT:
            np.testing.assert_allclose(kept, full, rtol=0.5 * 10.0 ** (1 - rule.digits), atol=0)
        else:
            step = persist.grid(np.abs(full).max(), rule.step)[0]
            assert rule.step / 2.5 < step / np.abs(full).max() <= rule.step  # 1, 2 or 5 x 10^k
            bound = step / 2 if rule.precision == persist.PLOT else step
            assert np.abs(kept - full).max() <= bound * (1 + 1e-9), key
    # sums: each stability phase mean of the whole run and of its rows up to AT_ENV_STEPS
    cut = len(stats.rows_at_env_steps(rows, AT_ENV_STEPS))
    for key in ("adv_raw/mean", "adv_raw/pos_frac", "adv/mean", "adv/std"):
        for n in (UPDATES, cut):
            full, kept = series(rows[:n], key), series(compact[:n], key)
            q = max(1, n // 4)
            for lo, hi in ((0, n), (0, q), (n - q, n)):
                assert kept[lo:hi].mean() == pytest.approx(full[lo:hi].mean(), rel=1e-9), key


def test_unordered_env_steps_keep_the_sums_exact() -> None:
    """A resumed run may log updates again: its rows up to N are no prefix of the log, so
    no grid keeps the phase sums at N: the compact log keeps those keys exact."""
    rows = metrics_rows("a", 0)
    rows = rows[:50] + [dict(r) for r in rows[30:35]] + rows[50:]
    compact = persist.compact_rows(rows, at_env_steps=[AT_ENV_STEPS])
    assert series(compact, "adv_raw/mean").tolist() == series(rows, "adv_raw/mean").tolist()
    assert (
        series(compact, "adv_raw/scout/mean").tolist()
        != series(rows, "adv_raw/scout/mean").tolist()
    )


def test_compact_lines_read_back_as_the_compact_rows() -> None:
    rows = metrics_rows("c", 2)
    lines = persist.compact_lines(rows)
    assert [json.loads(line) for line in lines] == persist.compact_rows(rows)
    assert any(re.search(r'"adv_raw/scout/pos_frac":0\.[0-9]*0[,}]', line) for line in lines)


def test_load_run_reads_plain_xz_and_gz_logs(tmp_path: Path) -> None:
    rows = [{"update": 1, "env_steps": 8, "entropy": 1.5}, {"update": 2, "env_steps": 16}]
    text = "".join(json.dumps(r) + "\n" for r in rows) + '{"update": 3, "env_'
    writers = {"metrics.jsonl": open, "metrics.jsonl.gz": gzip.open, "metrics.jsonl.xz": lzma.open}
    for name, opener in writers.items():
        run = tmp_path / name.replace(".", "_")
        run.mkdir()
        with opener(run / name, "wt") as fh:
            fh.write(text)
        loaded = stats.load_run(run)
        assert (loaded.records, loaded.bad_lines) == (rows, 1)
    restored = tmp_path / "metrics_jsonl_xz"  # a restored run: its plain log comes first
    (restored / "metrics.jsonl").write_text(json.dumps(rows[0]) + "\n")
    assert stats.load_run(restored).records == rows[:1]
    assert stats.metrics_file(tmp_path) is None


# ------------------------------------------------------------------------------------------
# a planted study, reported from full and from compact runs
# ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("persist")
    full, kept = tmp / "full", tmp / "kept"
    argv = plant_study(full)
    argv += ["--pilot", "--at-env-steps", str(AT_ENV_STEPS)]
    (full / "runs" / "c" / "seed_9").mkdir(parents=True)  # an unfinished run: left out
    (full / "runs" / "c" / "seed_9" / "metrics.jsonl").write_text("{}\n")
    reports = regenerate(full, argv)
    done = persist.persist_study(str(full), str(kept))
    return {"full": full, "kept": kept, "argv": argv, "reports": reports, "done": done}


def test_persisted_runs_are_compact(planted) -> None:
    full, kept, done = planted["full"], planted["kept"], planted["done"]
    assert (done.runs, done.left_out, done.policies) == (len(VARIANTS) * SEEDS, 1, 0)
    files = sorted(p.relative_to(kept).as_posix() for p in kept.rglob("*") if p.is_file())
    runs = [f"runs/{v}/seed_{k}" for v in VARIANTS for k in range(SEEDS)]
    names = ("config.yaml", "eval.json", "finished.json", "metrics.jsonl.xz")
    assert files == ["compare.json", *sorted(f"{r}/{n}" for r in runs for n in names)]
    full_bytes = sum((full / r / "metrics.jsonl").stat().st_size for r in runs)
    assert done.log_bytes < full_bytes / 15


def test_report_from_compact_runs_equals_the_full_report(planted) -> None:
    compact = regenerate(planted["kept"], planted["argv"])
    assert set(compact) == set(planted["reports"]) == {"", f"at_{AT_ENV_STEPS}_env_steps"}
    for name, full in planted["reports"].items():
        problems, worst = report_differences(full, compact[name])
        assert problems == [], name
        assert 0.0 < worst <= persist.PLOT_TOLERANCE
        assert full["verdicts"] and full["warnings"] == compact[name]["warnings"]
    main = planted["reports"][""]
    assert sum("1 unparsable metrics.jsonl line" in w for w in main["warnings"]) == len(VARIANTS)
    stability = main["variants"]["a"]["stability"]
    assert stability["collapsed_runs"] > 0 and stability["adv_clip_active_frac"] > 0


def test_persisting_again_and_restoring_change_nothing(planted, tmp_path: Path) -> None:
    kept = planted["kept"]
    log = kept / "runs" / "b" / "seed_2" / persist.COMPACT_LOG
    first = log.read_bytes()
    persist.persist_study(str(planted["full"]), str(kept))
    assert log.read_bytes() == first  # byte-identical: git sees no change
    out = tmp_path / "resumed"
    assert persist.restore_study(str(kept), str(out)) == len(VARIANTS) * SEEDS
    restored = out / "runs" / "b" / "seed_2"
    rows, bad = stats.read_metrics_file(restored / "metrics.jsonl")
    assert (rows, bad) == stats.read_metrics_file(log)
    assert compare.run_finished(str(restored))
    again = tmp_path / "again"
    persist.persist_study(str(out), str(again))  # the compact log is copied, not re-rounded
    assert (again / "runs" / "b" / "seed_2" / persist.COMPACT_LOG).read_bytes() == first


def test_policies_of_the_named_variants_only(tmp_path: Path) -> None:
    src = tmp_path / "src"
    plant_study(src)
    (src / "compare.json").write_text(json.dumps({"variants": {v: [] for v in VARIANTS}}))
    for run in src.glob("runs/*/seed_*"):
        (run / "metrics.jsonl").write_text('{"update": 1}\n')  # (logs are not the point here)
        (run / "policy").mkdir()
        (run / "policy" / "policy.json").write_text("{}")
        (run / "policy" / "weights.pt").write_bytes(b"w")
    dest = tmp_path / "dest"
    stale = dest / "runs" / "a" / "seed_0" / "metrics.jsonl.gz"  # persisted by the old script
    stale.parent.mkdir(parents=True)
    stale.write_bytes(gzip.compress(b"{}\n"))
    assert persist.persist_study(str(src), str(dest), policies=["a", "c"]).policies == 2 * SEEDS
    assert not stale.exists()
    assert {p.parts[-4] for p in dest.glob("runs/*/seed_*/policy/weights.pt")} == {"a", "c"}
    assert persist.persist_study(str(src), str(dest)).policies == 0  # none asked: removed
    assert not list(dest.glob("runs/*/seed_*/policy"))
    assert persist.persist_study(str(src), str(dest), policies=[]).policies == 3 * SEEDS


def test_in_place_compacts_gzipped_logs_and_drops_policies(tmp_path: Path) -> None:
    study = tmp_path / "study"
    plant_study(study)
    (study / "compare.json").write_text(json.dumps({"variants": {v: [] for v in VARIANTS}}))
    for log in study.glob("runs/*/seed_*/metrics.jsonl"):
        log.with_suffix(".jsonl.gz").write_bytes(gzip.compress(log.read_bytes()))
        log.unlink()
    for variant in ("a", "b"):
        policy = study / "runs" / variant / "seed_0" / "policy"
        policy.mkdir()
        (policy / "policy.json").write_text("{}")
        (policy / "weights.pt").write_bytes(b"w")
    run = study / "runs" / "a" / "seed_0"
    before = stats.read_metrics_file(run / "metrics.jsonl.gz")
    done = persist.compact_in_place(str(study), policies=["b"])
    assert (done.runs, done.left_out, done.policies) == (len(VARIANTS) * SEEDS, 0, 1)
    assert sorted(p.name for p in run.iterdir()) == [
        "config.yaml", "eval.json", "finished.json", "metrics.jsonl.xz"
    ]  # fmt: skip
    rows, bad = stats.read_metrics_file(run / "metrics.jsonl.xz")
    assert rows == persist.compact_rows(before[0]) and bad == before[1]
    assert (study / "runs" / "b" / "seed_0" / "policy" / "weights.pt").is_file()
    assert persist.compact_in_place(str(study)).left_out == len(VARIANTS) * SEEDS


# ------------------------------------------------------------------------------------------
# the command line, and benchmarks/persist_runs.sh which calls it
# ------------------------------------------------------------------------------------------
def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "marl.experiments.persist", *args],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip


def test_cli_help() -> None:
    res = cli("--help")
    assert res.returncode == 0
    for word in ("SRC DEST", "--in-place DIR", "--restore DIR OUT", "--policies", "KEYS"):
        assert word in res.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "expected SRC DEST, got 0 path(s)"),
        (["{tmp}"], "expected SRC DEST, got 1 path(s)"),
        (["{tmp}", "{tmp}/dest"], "has no compare.json: not a marl.compare --out directory"),
        (["{tmp}/nowhere", "{tmp}/dest"], "is not a directory"),
        (["{study}", "{study}"], "use --in-place DIR"),
        (["{study}", "{tmp}/dest", "--policies=a,zz"], "'zz': not a variant of"),
        (["{study}", "{tmp}/dest", "--policies=a,"], "expected VARIANT[,VARIANT...]"),
        (["--in-place", "{tmp}"], "has no compare.json"),
        (["--in-place", "{study}", "{tmp}"], "unexpected argument(s)"),
        (["--restore", "{study}", "{tmp}/out", "--policies"], "apply to persisting"),
        (["{study}", "{tmp}/dest", "--at-env-steps", "0"], "positive env-step counts"),
        (["--in-place", "{study}", "--restore", "{study}", "{tmp}"], "not allowed with"),
    ],
)
def test_cli_errors(tmp_path: Path, args: list[str], message: str) -> None:
    study = tmp_path / "study"
    study.mkdir()
    (study / "compare.json").write_text(json.dumps({"variants": {"a": []}}))
    args = [a.format(tmp=tmp_path, study=study) for a in args]
    res = cli(*args)
    assert res.returncode == 2, res.stdout
    assert message in res.stderr
    assert not (tmp_path / "dest").exists()


def test_persist_runs_script_delegates(tmp_path: Path) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    write_run(src / "runs" / "a" / "seed_0", "a", 0)
    (src / "compare.json").write_text(json.dumps({"variants": {"a": []}}))
    script = REPO / "benchmarks" / "persist_runs.sh"
    env = dict(os.environ, PYTHON=sys.executable)
    res = subprocess.run(
        ["bash", str(script), "src", "dest", "--policies=a"],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "1 finished run(s) of" in res.stdout
    assert (dest / "runs" / "a" / "seed_0" / "metrics.jsonl.xz").is_file()
    res = subprocess.run(["bash", str(script), "--help"], capture_output=True, text=True)
    assert res.returncode == 0 and "metrics.jsonl.xz" in res.stdout


# ------------------------------------------------------------------------------------------
# a published study
# ------------------------------------------------------------------------------------------
PUBLISHED = REPO / "docs" / "results" / "memory_study" / "family_1"


def test_a_published_study_compacted_again_is_left_as_it_is(tmp_path: Path) -> None:
    """Every published study is compact now (each was checked against its full logs when it
    was compacted: benchmarks/check_regeneration.py, the CHANGELOG gives the results);
    compacting one again changes no byte, and reports as published (the slow
    tests/test_regeneration.py regenerates it in full)."""
    kept = tmp_path / "kept"
    shutil.copytree(PUBLISHED, kept, ignore=shutil.ignore_patterns("plots"))
    before = {p.relative_to(kept): p.read_bytes() for p in kept.rglob("*") if p.is_file()}
    runs = len(list(kept.glob("runs/*/seed_*")))
    done = persist.compact_in_place(str(kept))
    assert (done.runs, done.left_out) == (0, runs) and runs > 0
    assert {p.relative_to(kept): p.read_bytes() for p in kept.rglob("*") if p.is_file()} == before


def test_study_script_restores_a_compact_study(tmp_path: Path) -> None:
    """benchmarks/study.sh on a new checkout: the persisted runs come back into runs/ with a
    plain metrics.jsonl each (the pinned code reads it), and marl.compare skips them."""
    src, docs = tmp_path / "src", tmp_path / "mystudy"
    write_run(src / "runs" / "a" / "seed_0", "a", 0)
    (src / "compare.json").write_text(json.dumps({"variants": {"a": []}}))
    persist.persist_study(str(src), str(docs))
    head = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    keys = {"code_commit": head, "study": "whitening_scales", "seeds": "2", "total_steps": "4096"}
    (docs / "STUDY").write_text("".join(f"{k}={v}\n" for k, v in keys.items()))
    env = dict(os.environ, PYTHON=sys.executable, STUDY_TREE=str(REPO))
    env["STUDY_RUNS"] = str(tmp_path / "runs")
    res = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "study.sh"), str(docs), "--dry-run"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    run = tmp_path / "runs" / "mystudy" / "runs" / "a" / "seed_0"
    rows, _ = stats.read_metrics_file(run / "metrics.jsonl")
    assert rows == stats.read_metrics_file(docs / "runs" / "a" / "seed_0" / "metrics.jsonl.xz")[0]
    assert len(rows) == UPDATES and compare.run_finished(str(run))
