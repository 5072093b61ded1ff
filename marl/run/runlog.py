"""Run logging: ``metrics.jsonl`` (one flat JSON object per update) and TensorBoard events.

Keys are documented in ``docs/metrics.md``. Only the main process (rank 0) writes; other
ranks get a logger with ``enabled=False`` whose methods do nothing.

A resumed run continues both logs from its checkpoint: the rows of metrics.jsonl and the
TensorBoard events written after it (by the run that was killed) are dropped first, so both
hold each update once, as an uninterrupted run would (:func:`trim_tensorboard`).
"""

from __future__ import annotations

import glob
import json
import math
import os
import struct
from typing import Any

__all__ = ["RunLogger", "read_metrics", "read_tensorboard_events", "trim_tensorboard"]


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN/inf; None marks "not available"
    return value


class RunLogger:
    """Appends metrics to ``RUN_DIR/metrics.jsonl`` and ``RUN_DIR/tb``.

    ``resume_update``: when continuing a run, lines with ``update`` greater than this (written
    after the checkpoint the run resumes from) are dropped first, and so are the TensorBoard
    events whose step (``env_steps``) is past ``resume_env_steps`` (default: the last kept
    row's), so both match an uninterrupted run. Write failures raise ``OSError`` naming the file.
    """

    def __init__(
        self,
        run_dir: str,
        *,
        enabled: bool = True,
        tensorboard: bool = True,
        resume_update: int | None = None,
        resume_env_steps: int | None = None,
    ) -> None:
        self.enabled = enabled
        self.path = os.path.join(run_dir, "metrics.jsonl")
        self.writer = None
        self.closed = not enabled
        if not enabled:
            return
        os.makedirs(run_dir, exist_ok=True)
        if resume_update is not None:
            kept = []
            if os.path.exists(self.path):
                kept = [r for r in read_metrics(self.path) if r.get("update", 0) <= resume_update]
                with open(self.path + ".tmp", "w") as fh:
                    for r in kept:
                        fh.write(json.dumps(r) + "\n")
                os.replace(self.path + ".tmp", self.path)
            last_step = resume_env_steps
            if last_step is None:
                last_step = max((int(r.get("env_steps", 0)) for r in kept), default=0)
            trim_tensorboard(os.path.join(run_dir, "tb"), last_step)
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
        try:
            self._fh.write(json.dumps(row) + "\n")
            self._fh.flush()
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror or str(exc), self.path) from exc
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

    def flush(self) -> None:
        """Make everything logged so far durable (TensorBoard's queue written out): called
        before each checkpoint, so that a run killed after it lost no logged update."""
        if self.enabled and self.writer is not None:
            self.writer.flush()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self._fh.close()
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror or str(exc), self.path) from exc
        finally:
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


# ------------------------------------------------------------------------------------------
# TensorBoard event files (TFRecord framing: u64 length, u32 crc, data, u32 crc)
# ------------------------------------------------------------------------------------------
def _records(path: str) -> tuple[list[bytes], bool]:
    """The complete raw records of an event file (framing included) and whether the file
    ended cleanly (False: a truncated last record, e.g. a run killed mid-write)."""
    with open(path, "rb") as fh:
        data = fh.read()
    out, pos = [], 0
    while pos < len(data):
        if pos + 12 > len(data):
            return out, False
        (length,) = struct.unpack("<Q", data[pos : pos + 8])
        end = pos + 12 + length + 4
        if end > len(data):
            return out, False
        out.append(data[pos:end])
        pos = end
    return out, True


def _event(record: bytes) -> Any:
    from tensorboard.compat.proto.event_pb2 import Event

    (length,) = struct.unpack("<Q", record[:8])
    return Event.FromString(record[12 : 12 + length])


def read_tensorboard_events(tb_dir: str) -> list[tuple[int, str, float]]:
    """``(step, tag, value)`` of every scalar in the event files of ``tb_dir`` (file order)."""
    out = []
    for path in sorted(glob.glob(os.path.join(tb_dir, "events.out.tfevents.*"))):
        for record in _records(path)[0]:
            event = _event(record)
            if event.HasField("summary"):
                step = int(event.step)
                out.extend((step, v.tag, float(v.simple_value)) for v in event.summary.value)
    return out


def trim_tensorboard(tb_dir: str, last_step: int) -> None:
    """Drop the summary events with ``step > last_step`` (and a truncated last record) from the
    event files of ``tb_dir``; each changed file is rewritten atomically in place."""
    for path in sorted(glob.glob(os.path.join(tb_dir, "events.out.tfevents.*"))):
        records, clean = _records(path)
        kept = []
        for record in records:
            try:
                event = _event(record)
            except Exception:  # noqa: BLE001 - a damaged record: it and the rest are dropped
                clean = False
                break
            if not (event.HasField("summary") and event.step > last_step):
                kept.append(record)
        if clean and len(kept) == len(records):
            continue
        with open(path + ".tmp", "wb") as fh:
            fh.write(b"".join(kept))
        os.replace(path + ".tmp", path)
