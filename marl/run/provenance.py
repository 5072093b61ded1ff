"""Where a result came from: the code's git commit, the software, the machine.

:func:`provenance` is recorded by every training run (``finished.json``, and each
invocation's in the checkpoints, so that a resumed run keeps the commits of all its parts) and
by ``marl.compare``'s report, so that "same code" is a recorded fact, not a sentence in a
README. ``marl.compare`` refuses to aggregate runs of different commits unless told
``--allow-mixed-code``.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import subprocess
import sys
from typing import Any

__all__ = ["git_state", "cpu_model", "package_versions", "provenance", "PACKAGES"]

#: Distributions whose versions a run records (None when not installed).
PACKAGES = ("coopsearch", "torch", "numpy", "numba", "pettingzoo", "gymnasium", "einops")

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args], cwd=_REPO, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_state() -> dict[str, Any]:
    """``{"commit": sha | None, "dirty": bool | None}`` of the checkout this package runs from.

    ``dirty``: tracked files differ from the commit (untracked files are not counted). Both are
    None when the package does not run from a git checkout (an installed wheel).
    """
    commit = _git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": None if status is None else bool(status)}


@functools.lru_cache(maxsize=1)
def cpu_model() -> str | None:
    """The CPU's model name (``/proc/cpuinfo``; elsewhere ``platform.processor()``)."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    """Installed versions of ``names`` (None when not installed)."""
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def provenance() -> dict[str, Any]:
    """This process's provenance: git commit and dirty flag, Python and package versions, CPU
    model and core count, and the torch and numba thread counts as set now."""
    threads: dict[str, Any] = {"torch": None, "numba": None}
    if "torch" in sys.modules:
        threads["torch"] = sys.modules["torch"].get_num_threads()
    if "numba" in sys.modules:
        try:
            threads["numba"] = int(sys.modules["numba"].get_num_threads())
        except Exception:  # noqa: BLE001 - an unusable numba still lets the run record the rest
            threads["numba"] = None
    return {
        **git_state(),
        "python": sys.version.split()[0],
        "versions": package_versions(),
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "threads": threads,
    }
