"""seqmodels.kernels.numba: the package's table names every kernel and each module's HOT_PATH
its hot ones; numba's disk cache is dropped exactly when one of the package's sources changed
(numba keys a cached kernel on its own file only, and the kernels inline helpers from sibling
modules). That a second process loads the kernels from the cache: tests/test_numba_cache.py."""

from __future__ import annotations

import importlib

import pytest

numba = pytest.importorskip("numba")

from seqmodels.kernels import numba as kernels  # noqa: E402

KERNEL_MODULES = ("conv", "norm", "scan", "ssd", "block_step")


def kernels_of(module) -> dict[str, object]:
    """The module's own kernels: numba dispatchers defined there, inline helpers excluded."""
    return {
        name: obj
        for name, obj in vars(module).items()
        if isinstance(obj, numba.core.registry.CPUDispatcher)
        and obj.py_func.__module__ == module.__name__
        and obj.targetoptions.get("inline", "never") != "always"
    }


def test_the_table_names_every_kernel_and_hot_path_names_kernels() -> None:
    for family in KERNEL_MODULES:
        module = importlib.import_module(f"seqmodels.kernels.numba.{family}")
        own = kernels_of(module)
        assert own, family
        for name in own:  # a row of the package's table: the kernel, then its module
            assert f"``{name}``" in kernels.__doc__ and f"``{name}``" in module.__doc__, name
        assert module.HOT_PATH and set(module.HOT_PATH) <= set(own), family
        for name in own:  # the module's table marks the kernels of HOT_PATH, and only them
            row = module.__doc__.split(f"``{name}``", 1)[1].split("\n``")[0]
            assert ("(hot)" in row) == (name in module.HOT_PATH), name


def test_cache_dropped_exactly_when_a_source_changes(tmp_path) -> None:
    (tmp_path / "scan.py").write_text("A = 1\n")
    (tmp_path / "numerics.py").write_text("B = 2\n")
    cache = tmp_path / "__pycache__"
    cache.mkdir()
    (cache / "scan.scan_step-1.py311.nbi").write_text("old")
    (cache / "scan.scan_step-1.py311.1.nbc").write_text("old")
    (cache / "scan.cpython-311.pyc").write_text("bytecode")
    assert kernels.drop_stale_kernel_cache(str(tmp_path)) is True  # no digest yet
    assert sorted(p.name for p in cache.iterdir()) == [
        "numba_sources.sha256",
        "scan.cpython-311.pyc",
    ]
    (cache / "scan.scan_step-1.py311.nbi").write_text("fresh")
    assert kernels.drop_stale_kernel_cache(str(tmp_path)) is False  # nothing changed: kept
    assert (cache / "scan.scan_step-1.py311.nbi").exists()
    (tmp_path / "numerics.py").write_text("B = 3\n")  # a helper module the kernels inline
    assert kernels.drop_stale_kernel_cache(str(tmp_path)) is True
    assert not (cache / "scan.scan_step-1.py311.nbi").exists()


def test_cache_dropped_when_a_helper_from_elsewhere_changes(tmp_path) -> None:
    """``also``: a file outside the package whose helpers its kernels inline (the GRU kernel of
    marl/core/kernels inlines seqmodels' exp) invalidates the package's cache too."""
    package, helper = tmp_path / "pkg", tmp_path / "numerics.py"
    package.mkdir()
    (package / "gru.py").write_text("A = 1\n")
    helper.write_text("B = 2\n")
    cache = package / "__pycache__"
    cache.mkdir()
    kernel = cache / "gru._sigmoid-1.py311.nbi"
    kernel.write_text("old")
    assert kernels.drop_stale_kernel_cache(str(package), (str(helper),)) is True
    kernel.write_text("fresh")
    assert kernels.drop_stale_kernel_cache(str(package), (str(helper),)) is False
    assert kernel.exists()
    helper.write_text("B = 3\n")
    assert kernels.drop_stale_kernel_cache(str(package), (str(helper),)) is True
    assert not kernel.exists()
