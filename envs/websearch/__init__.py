"""The one implementation of ``websearch_v0``, ``websearch_v1`` and ``websearch_v2`` (the env
modules are its PettingZoo faces and its documentation: ``envs/websearch_v0.py``, and
``envs/websearch_v1.py``, ``envs/websearch_v2.py`` for what each later version changes).

Everything that decides what happens lives here, once, one seam per module:

=========================  ====================================================================
module                     what it holds
=========================  ====================================================================
``config``                 the layout constants (slots, actions, observation and state
                           sizes), reward weights, presets, :class:`WebSearchConfig`,
                           :func:`make_config`, :func:`make_versioned_config`
``corpus``                 :class:`Corpus` and :func:`build_corpus` (the generated documents
                           and their BM25 index, cached, shared read-only) and the search
                           kernels
``tasks``                  each episode's target, description and solution (numba)
``kernels``                the dynamics: reset, step, observation, state and legality
                           kernels (numba; the step and observation kernels are the hot path)
``metrics``                ``METRIC_NAMES`` and the kernel that computes them
``core``                   :class:`WebSearchCore`: ``num_envs`` episodes as arrays, reset and
                           stepped by the kernels
=========================  ====================================================================

``parallel_env`` is the ``num_envs=1`` view of the core and ``vector_env`` the batched view, so
the two cannot drift apart. The kernels call across these modules, and numba keys each cached
kernel on its own file only: importing the package therefore drops the package's cached
kernels whenever any of its source files changed (:func:`drop_stale_kernel_cache`), so that an
edit to a callee or a constant in one module never leaves a caller in another one stale.
"""

from __future__ import annotations

# first, before any kernel is compiled or loaded: drops numba's cache when a source changed
from envs.websearch._cache import drop_stale_kernel_cache
from envs.websearch.config import (
    B_MARK,
    B_NEXT,
    B_OPEN0,
    B_PREV,
    B_STAY,
    BROWSER_ACTION_NAMES,
    DESC_SLOTS,
    HARVEST_SLOTS,
    HASH_DIM,
    N_ACTIONS_BROWSER,
    N_ACTIONS_QUERIER,
    N_SLOTS,
    PAGE_SIZE,
    PRESETS,
    Q_CLEAR,
    Q_ISSUE,
    Q_STAY,
    Q_TOGGLE0,
    QUERIER_ACTION_NAMES,
    VERSIONS,
    WebSearchConfig,
    make_config,
    make_versioned_config,
)
from envs.websearch.core import WebSearchCore
from envs.websearch.corpus import (
    BM25_B,
    BM25_K1,
    KIND_ASPECT,
    KIND_ATTRIBUTE,
    KIND_BRAND,
    KIND_CATEGORY,
    KIND_DETAIL,
    KIND_MODEL,
    KIND_NOISE,
    Corpus,
    build_corpus,
)
from envs.websearch.metrics import METRIC_NAMES

__all__ = [
    "drop_stale_kernel_cache",
    "BM25_B",
    "BM25_K1",
    "BROWSER_ACTION_NAMES",
    "B_MARK",
    "B_NEXT",
    "B_OPEN0",
    "B_PREV",
    "B_STAY",
    "Corpus",
    "DESC_SLOTS",
    "HARVEST_SLOTS",
    "HASH_DIM",
    "KIND_ASPECT",
    "KIND_ATTRIBUTE",
    "KIND_BRAND",
    "KIND_CATEGORY",
    "KIND_DETAIL",
    "KIND_MODEL",
    "KIND_NOISE",
    "METRIC_NAMES",
    "N_ACTIONS_BROWSER",
    "N_ACTIONS_QUERIER",
    "N_SLOTS",
    "PAGE_SIZE",
    "PRESETS",
    "QUERIER_ACTION_NAMES",
    "Q_CLEAR",
    "Q_ISSUE",
    "Q_STAY",
    "Q_TOGGLE0",
    "VERSIONS",
    "WebSearchConfig",
    "WebSearchCore",
    "build_corpus",
    "make_config",
    "make_versioned_config",
]
