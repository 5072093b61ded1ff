"""runs.csv: one row per run with its endpoint metrics, taken from the summary."""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Mapping
from typing import Any

from marl.run.rundir import atomic_write_text

#: runs.csv's first columns; one per endpoint metric of the summary follows.
RUNS_CSV_COLUMNS = ("variant", "seed", "status", "commit", "env_steps")


def write_runs_csv(summary: Mapping[str, Any], out: str) -> str:
    """Write ``out/runs.csv``, one row per run of ``summary["runs"]``: variant, seed, status,
    commit (``;`` between several), env steps, then each endpoint metric of
    ``summary["metrics"]`` for that run, taken from the summary's per-seed values (empty where
    the run has none: not finished, or no such figure). Returns its path."""
    metrics = list(summary["metrics"])
    per_seed: dict[tuple[str, Any, str], float] = {}
    for name, variant in summary["variants"].items():
        for metric in metrics:
            entry = variant["metrics"].get(metric) or {}
            seeds, values = entry.get("seeds") or [], entry.get("values") or []
            for seed, value in zip(seeds, values, strict=False):
                per_seed[(name, seed, metric)] = value
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow([*RUNS_CSV_COLUMNS, *metrics])
    for row in summary["runs"]:
        key = (row["variant"], row["seed"])
        writer.writerow(
            [row["variant"], row["seed"], row["status"], ";".join(row.get("commits") or []),
             row.get("env_steps"), *(per_seed.get((*key, m)) for m in metrics)]
        )  # fmt: skip
    path = os.path.join(out, "runs.csv")
    atomic_write_text(path, buffer.getvalue())
    return path
