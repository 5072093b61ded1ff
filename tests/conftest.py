"""Shared test setup: numba runs on the threading layer the trainer chooses by default.

``python -m marl.train`` sets numba's threading layer (``--numba-threading-layer``, default
auto: omp for a one-thread pool, workqueue for more) before its first kernel; numba fixes the
layer for the whole process at the first parallel kernel. Tests run many things in one
process (seqmodels kernels, then in-process ``marl.train.main`` calls), so the layer is set
here once, as the trainer would, and every in-process run finds the layer it asks for instead
of warning about a different one.
"""

from __future__ import annotations

from seqmodels.kernels import auto_threading_layer, numba_available, set_numba_threading_layer

if numba_available():
    set_numba_threading_layer(auto_threading_layer())
