"""Shared test setup: numba runs on the threading layer the trainer chooses by default.

``python -m marl.train`` sets numba's threading layer (``--numba-threading-layer``, default
auto: omp for a one-thread pool, workqueue for more) before its first kernel; numba fixes the
layer for the whole process at the first parallel kernel. Tests run many things in one
process (seqmodels kernels, then in-process ``marl.train.main`` calls), so the layer is set
here once, as the trainer would, and every in-process run finds the layer it asks for instead
of warning about a different one.

numba's compiled kernels are cached on disk where numba puts them by default, beside each
kernel's source (``<package>/__pycache__``): the pytest process and every process a test
starts (``python -m marl.train``, torchrun ranks, compare workers) share that one cache, so a
kernel compiles once per checkout and source edit, not once per process
(tests/test_numba_cache.py checks it). No ``NUMBA_CACHE_DIR`` is set here: the packages'
stale-cache checks (``drop_stale_kernel_cache``, as in ``envs.websearch``) clear their own
``__pycache__`` only, so a cache elsewhere would keep kernels compiled against an older
sibling module.
"""

from __future__ import annotations

import pytest
import torch

from seqmodels.kernels import auto_threading_layer, numba_available, set_numba_threading_layer

if numba_available():
    set_numba_threading_layer(auto_threading_layer())


@pytest.fixture
def one_thread():
    """torch on one thread for the test (bit-for-bit checks of batched and single-seed code
    hold per thread count), restored after it."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
