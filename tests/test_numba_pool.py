"""The training entry point sizes numba's thread pool before numba is imported."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from marl.run import numba_pool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROBE = (
    "import sys\n"
    "from marl.train import main\n"
    "main(sys.argv[1:])\n"
    "import numba\n"
    "print('POOL', numba.config.NUMBA_NUM_THREADS)\n"
)


def _pool(args: list[str], **env: str) -> int:
    environ = {k: v for k, v in os.environ.items() if k != "NUMBA_NUM_THREADS"}
    environ.update(env, PYTHONPATH=ROOT)
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *args, "--help"],
        capture_output=True,
        text=True,
        env=environ,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("POOL ")][-1]
    return int(line.split()[1])


def test_pool_follows_torch_threads_and_respects_the_users_setting() -> None:
    assert _pool(["--torch-threads", "1"]) == 1
    assert _pool(["--torch-threads=3"]) == 3
    assert _pool([]) == min(2, os.cpu_count() or 1)
    assert _pool(["--torch-threads", "1"], NUMBA_NUM_THREADS="2") == 2  # the user's stands


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--torch-threads", "4"], 4),
        (["--seed", "1", "--torch-threads=2"], 2),
        (["--torch-threads", "none"], None),
        (["--torch-threads", "0"], None),
        (["--torch-threads"], None),
        ([], None),
    ],
)
def test_threads_from_argv(argv: list[str], expected: int | None) -> None:
    assert numba_pool._threads_from_argv(argv) == expected


def test_default_threads_share_the_cores_among_local_ranks(monkeypatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert numba_pool.default_threads() == 2
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "16")
    assert numba_pool.default_threads() == 1


def test_too_late_once_numba_is_imported(monkeypatch) -> None:
    import numba  # noqa: F401

    monkeypatch.delenv("NUMBA_NUM_THREADS", raising=False)
    assert numba_pool.size_numba_pool(["--torch-threads", "1"]) is None
    assert "NUMBA_NUM_THREADS" not in os.environ
