"""Compiled kernels behind seqmodels' fast backends: the only place in seqmodels that imports
numba or mamba-ssm, or uses private torch APIs.

- :mod:`seqmodels.kernels.numba`: the numba loops, one module per op family (conv, norm,
  scan, ssd, block_step; forward and backward of each fused CPU op, the step kernels; imported
  on first use). Its docstring tells which kernels are the hot path (training forward and
  backward, the rollout step) and which only the tests reach.
- :mod:`seqmodels.kernels.numba_ops`: those loops as torch ops (autograd Functions for the
  sequence ops, plain functions for the single steps), each with the signature of a readable
  twin in :mod:`seqmodels.scan` / :mod:`seqmodels.ops` and an equivalence test against it
  (table in its docstring).
- :mod:`seqmodels.kernels.cuda_ops`: mamba-ssm's CUDA kernels (optional, ``[cuda]`` extra).
- :mod:`seqmodels.kernels.numba_runtime`: numba's threading layer and thread count.
- :mod:`seqmodels.kernels.allocator`: glibc's allocator thresholds (a program's choice: large
  tensors from the heap, freed memory kept, no page faults per training step).

Importing seqmodels (or this package) imports neither numba nor mamba-ssm and changes no
process-wide setting. A program that wants the threading layer that suits its thread pool
(the trainer: omp for a one-thread pool, where each kernel runs in the calling thread;
workqueue for more, where idle workers sleep instead of busy-waiting between the small kernels
of a rollout step) calls, once, before the first kernel runs::

    from seqmodels.kernels import auto_threading_layer, set_numba_threading_layer

    set_numba_threading_layer(auto_threading_layer())
"""

from __future__ import annotations

from seqmodels.kernels.allocator import malloc_tuning_available, set_malloc_thresholds
from seqmodels.kernels.cuda_ops import mamba_ssm_available
from seqmodels.kernels.numba_runtime import (
    THREADING_LAYERS,
    auto_threading_layer,
    numba_available,
    numba_thread_safe,
    numba_threading_layer,
    set_numba_threading_layer,
)

__all__ = [
    "THREADING_LAYERS",
    "auto_threading_layer",
    "malloc_tuning_available",
    "mamba_ssm_available",
    "numba_available",
    "numba_thread_safe",
    "numba_threading_layer",
    "set_malloc_thresholds",
    "set_numba_threading_layer",
]
