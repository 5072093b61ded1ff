"""Checkpoints: atomic writes (temporary file + ``os.replace``) and RNG state capture.

A checkpoint is a dict saved with ``torch.save``; :func:`save_checkpoint` never leaves a
partially written file at ``path`` (a crash mid-write keeps the previous checkpoint).
"""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import torch

__all__ = ["save_checkpoint", "load_checkpoint", "rng_state", "set_rng_state", "latest_path"]


def latest_path(run_dir: str) -> str:
    """``RUN_DIR/checkpoints/latest.pt``."""
    return os.path.join(run_dir, "checkpoints", "latest.pt")


def save_checkpoint(path: str, payload: dict[str, Any]) -> None:
    """Write ``payload`` to ``path`` atomically (tmp file in the same folder, fsync, replace)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{os.path.basename(path)}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            torch.save(payload, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def load_checkpoint(path: str, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint` (trusted: our own run files)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no checkpoint at {path!r}")
    return torch.load(path, map_location=map_location, weights_only=False)


def rng_state() -> dict[str, Any]:
    """The global RNG states of torch (CPU and CUDA), numpy and Python's ``random``."""
    state = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore :func:`rng_state` output."""
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
