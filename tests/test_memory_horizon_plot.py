"""benchmarks/memory_horizon_plot.py (issue 48, item 3's cross-part answer): its table's
figures against numpy on synthetic summaries, the mlp-level rule, and the plot written."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location(
    "memory_horizon_plot", ROOT / "benchmarks" / "memory_horizon_plot.py"
)
plot_script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plot_script)


def _summary(levels: dict[str, float], rng: np.random.Generator, seeds: list[int]) -> dict:
    variants = {}
    for kind, level in levels.items():
        values = np.clip(level + rng.normal(0.0, 0.03, len(seeds)), 0.0, 1.0).tolist()
        mean = float(np.mean(values))
        metric = {
            "values": values,
            "seeds": seeds,
            "mean": mean,
            "mean_ci": [mean - 0.02, mean + 0.02],
        }
        variants[kind] = {"metrics": {"success_rate": metric}}
    gru = variants["gru"]["metrics"]["success_rate"]["mean"]
    comparisons = [
        {
            "variant": kind,
            "metric": "success_rate",
            "p_holm": 0.002,
            "shown": True,
            "mean_difference": {"value": variants[kind]["metrics"]["success_rate"]["mean"] - gru},
        }
        for kind in ("mlp", "mamba", "mamba2")
    ]
    return {"variants": variants, "comparisons": comparisons}


def test_the_table_and_the_plot(tmp_path) -> None:
    rng = np.random.default_rng(0)
    levels = {"mlp": 0.25, "gru": 0.95, "mamba": 0.25, "mamba2": 0.6}
    seeds = list(range(16))
    (tmp_path / "h64").mkdir()
    summary = _summary(levels, rng, seeds)
    # mamba at mlp's level: mlp's values +-0.01 by seed (mean difference 0), listed in
    # another seed order (the comparison with mlp pairs by seed, not by position)
    base = summary["variants"]["mlp"]["metrics"]["success_rate"]["values"]
    values = [v + (0.01 if s % 2 else -0.01) for s, v in zip(seeds, base, strict=True)]
    metric = summary["variants"]["mamba"]["metrics"]["success_rate"]
    metric["seeds"], metric["values"] = seeds[::-1], values[::-1]
    metric["mean"] = float(np.mean(values))
    metric["mean_ci"] = [metric["mean"] - 0.02, metric["mean"] + 0.02]
    (tmp_path / "h64" / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "h256").mkdir()  # not finished: no summary.json
    parts = plot_script.read_parts(str(tmp_path))
    assert list(parts) == [64]
    mlp = np.array(summary["variants"]["mlp"]["metrics"]["success_rate"]["values"])
    for kind in ("gru", "mamba", "mamba2"):
        x = dict(zip(*(summary["variants"][kind]["metrics"]["success_rate"][k]
                       for k in ("seeds", "values")), strict=True))  # fmt: skip
        diff = np.array([x[s] for s in seeds]) - mlp
        got = plot_script.against_mlp(summary, kind)
        assert got["n"] == 16 and abs(got["value"] - diff.mean()) < 1e-12
        low, high = got["ci"]
        assert low < diff.mean() < high
    text = plot_script.table(parts)
    rows = {line.split("|")[2].strip(): line for line in text.splitlines()[2:]}
    assert "(at the mlp level)" in rows["mamba"]
    assert "(at the mlp level)" not in rows["gru"] and "(at the mlp level)" not in rows["mamba2"]
    assert "mlp worse shown" in rows["mlp"] and "mamba2 worse shown" in rows["mamba2"]
    assert plot_script.main([str(tmp_path)]) == 0
    assert (tmp_path / "success_vs_horizon.png").stat().st_size > 1000
