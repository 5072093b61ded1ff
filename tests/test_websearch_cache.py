"""envs.websearch drops numba's cached kernels when any of its sources changed (numba keys a
cached kernel on its own file only, and the package's kernels call across files)."""

from __future__ import annotations

from envs.websearch import drop_stale_kernel_cache


def test_cache_dropped_exactly_when_a_source_changes(tmp_path) -> None:
    (tmp_path / "kernels.py").write_text("A = 1\n")
    (tmp_path / "corpus.py").write_text("B = 2\n")
    cache = tmp_path / "__pycache__"
    cache.mkdir()
    (cache / "kernels._step-1.py311.nbi").write_text("old")
    (cache / "kernels._step-1.py311.1.nbc").write_text("old")
    (cache / "kernels.cpython-311.pyc").write_text("bytecode")
    assert drop_stale_kernel_cache(str(tmp_path)) is True  # no digest yet: unknown sources
    assert sorted(p.name for p in cache.iterdir()) == [
        "kernels.cpython-311.pyc",
        "numba_sources.sha256",
    ]
    (cache / "kernels._step-1.py311.nbi").write_text("fresh")
    assert drop_stale_kernel_cache(str(tmp_path)) is False  # nothing changed: kept
    assert (cache / "kernels._step-1.py311.nbi").exists()
    (tmp_path / "corpus.py").write_text("B = 3\n")  # a sibling module the kernels read
    assert drop_stale_kernel_cache(str(tmp_path)) is True
    assert not (cache / "kernels._step-1.py311.nbi").exists()
