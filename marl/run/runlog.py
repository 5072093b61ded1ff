"""Run logging: ``metrics.jsonl`` (one flat JSON object per update) and TensorBoard events.

Keys are documented in ``docs/metrics.md``. Only the main process (rank 0) writes; other
ranks get a logger with ``enabled=False`` whose methods do nothing.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

__all__ = ["RunLogger", "read_metrics"]


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN/inf; None marks "not available"
    return value


class RunLogger:
    """Appends metrics to ``RUN_DIR/metrics.jsonl`` and ``RUN_DIR/tb``.

    ``resume_update``: when continuing a run, lines with ``update`` greater than this (written
    after the checkpoint the run resumes from) are dropped first, so the file matches an
    uninterrupted run.
    """

    def __init__(
        self,
        run_dir: str,
        *,
        enabled: bool = True,
        tensorboard: bool = True,
        resume_update: int | None = None,
    ) -> None:
        self.enabled = enabled
        self.path = os.path.join(run_dir, "metrics.jsonl")
        self.writer = None
        if not enabled:
            return
        os.makedirs(run_dir, exist_ok=True)
        if resume_update is not None and os.path.exists(self.path):
            kept = [r for r in read_metrics(self.path) if r.get("update", 0) <= resume_update]
            with open(self.path + ".tmp", "w") as fh:
                for r in kept:
                    fh.write(json.dumps(r) + "\n")
            os.replace(self.path + ".tmp", self.path)
        elif resume_update is None and os.path.exists(self.path):
            os.remove(self.path)
        self._fh = open(self.path, "a")  # noqa: SIM115 - kept open for the run
        if tensorboard:
            from torch.utils.tensorboard.writer import FileWriter

            self.writer = FileWriter(os.path.join(run_dir, "tb"))

    def log(self, metrics: dict[str, Any]) -> None:
        """Write one update's metrics (flat dict; ``update`` and ``env_steps`` expected)."""
        if not self.enabled:
            return
        row = {k: _clean(v) for k, v in metrics.items()}
        self._fh.write(json.dumps(row) + "\n")
        self._fh.flush()
        if self.writer is not None:
            from tensorboard.compat.proto.summary_pb2 import Summary

            step = int(metrics.get("env_steps", metrics.get("update", 0)))
            # every scalar of the update in one event (one per scalar, as add_scalar writes
            # them, costs ~0.1 ms each in queue hand-offs to the writer thread)
            values = [
                Summary.Value(tag=key, simple_value=float(value))
                for key, value in metrics.items()
                if isinstance(value, (int, float)) and math.isfinite(value) and key != "update"
            ]
            self.writer.add_summary(Summary(value=values), step)

    def close(self) -> None:
        if not self.enabled:
            return
        self._fh.close()
        if self.writer is not None:
            self.writer.flush()
            self.writer.close()


def read_metrics(path: str) -> list[dict[str, Any]]:
    """All rows of a metrics.jsonl (a truncated last line from a crash is skipped)."""
    rows = []
    with open(path) as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows
