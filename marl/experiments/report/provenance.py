"""Provenance: the environment the summary was made in (Python, platform, packages, git) and the
code commits the runs came from."""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from marl.experiments import stats
from marl.run.provenance import cpu_model, git_state, package_versions

if TYPE_CHECKING:
    from marl.experiments.spec import CompareSpec


class MixedCodeError(ValueError):
    """The runs of a study come from different code commits (``--allow-mixed-code`` accepts)."""


PACKAGES = (
    "torch",
    "numpy",
    "scipy",
    "rliable",
    "arch",
    "pandas",
    "matplotlib",
    "pettingzoo",
    "gymnasium",
    "einops",
    "numba",
    "pyyaml",
    "tqdm",
    "mamba-ssm",
)


def environment_info() -> dict[str, Any]:
    """Python, platform, CPU count, package versions and the git commit of the code."""
    versions = package_versions(PACKAGES)
    git = git_state()
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model(),
        "packages": versions,
        "git": git,
    }


def _check_commits(
    spec: CompareSpec, loaded: Mapping[str, Sequence[stats.RunData]], warnings: list[str]
) -> list[str]:
    """The distinct git commits of the finished runs (finished.json), sorted.

    Runs of different commits (or one run resumed under another commit) raise
    :class:`MixedCodeError` unless ``spec.allow_mixed_code``; then, as runs from a tree with
    uncommitted changes or with no recorded commit, they produce a warning.
    """
    seen: dict[str, list[str]] = {}
    unknown: list[str] = []
    dirty: list[str] = []
    for name, runs in loaded.items():
        for run in runs:
            label = f"{name}/{os.path.basename(run.run_dir)}"
            marker = run.marker or {}
            run_commits = marker.get("commits") or (
                [marker["commit"]] if marker.get("commit") else []
            )
            if not run_commits:
                unknown.append(label)
            for commit in run_commits:
                seen.setdefault(str(commit), []).append(label)
            if marker.get("dirty"):
                dirty.append(label)
    commits = sorted(seen)
    if len(commits) > 1:
        detail = "; ".join(f"{c[:12]}: {len(v)} run(s), e.g. {v[0]}" for c, v in seen.items())
        if not getattr(spec, "allow_mixed_code", False):
            raise MixedCodeError(
                f"the runs come from {len(commits)} code commits ({detail}): their differences "
                "may be the code's, not the variants'. Rerun them at one commit, or pass "
                "--allow-mixed-code to aggregate anyway (the report then says so)"
            )
        warnings.append(
            f"mixed code (--allow-mixed-code): the runs come from {len(commits)} commits "
            f"({detail}); differences between variants may be the code's"
        )
    if unknown:
        warnings.append(
            f"{len(unknown)} run(s) record no git commit (trained outside a git checkout or "
            f"before runs recorded it), e.g. {unknown[0]}: same code is not established"
        )
    if dirty:
        warnings.append(
            f"{len(dirty)} run(s) ran from a tree with uncommitted changes, e.g. {dirty[0]}: "
            "their commit does not identify their code"
        )
    return commits
