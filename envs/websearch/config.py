"""websearch's arguments: the layout constants every part shares (slots, actions, the
observation and state layout), the reward weights, the presets, and :class:`WebSearchConfig`
with :func:`make_config` / :func:`make_versioned_config` (validated arguments, derived sizes).

Conventions: agents are ordered queriers first, then browsers. Querier actions: ``0`` stay,
``1`` issue the draft, ``2`` clear the draft, ``3 + j`` toggle candidate slot ``j`` (slots
``0..DESC_SLOTS-1``: the description's terms; the rest: terms harvested from the last opened
document). Browser actions: ``0`` stay, ``1 + k`` open result ``k`` of its page, ``6`` next
page, ``7`` previous page, ``8`` mark the open document as the answer.

Versions: ``WebSearchConfig.version`` (set by the env module, not a user argument) switches the
few rules that differ, inside the kernels (one copy of the dynamics): v1 adds the browsers'
description-match observations (``B_GLOBAL_V1``, ``B_RESULT_FEATURES_V1``), the individual
rewards for reading (``reward_read``: coverage of the description gained by an opened document)
and for the right answer (``reward_answer``, to the browser that marks the target), and charges
the step costs a failed episode skips (a wrong answer that ends it); v2 adds one browser
feature, "my open document covers the description" (``B_GLOBAL_V2``: 1.0 exactly when the
browser's open document is the target), before the per-result features.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
from numba import njit

from envs.errors import ArgumentTypeError, check_float_field, check_int_field

PAGE_SIZE = 5
DESC_SLOTS = 10  # description terms (shuffled, -1 padded)
HARVEST_SLOTS = 6  # terms harvested from the last opened document
N_SLOTS = DESC_SLOTS + HARVEST_SLOTS
HASH_DIM = 16
VAGUE_POOL = 20  # vague words: drawn from the most frequent noise terms

# querier actions
Q_STAY, Q_ISSUE, Q_CLEAR, Q_TOGGLE0 = 0, 1, 2, 3
N_ACTIONS_QUERIER = Q_TOGGLE0 + N_SLOTS
# browser actions
B_STAY, B_OPEN0, B_NEXT, B_PREV, B_MARK = 0, 1, 1 + PAGE_SIZE, 2 + PAGE_SIZE, 3 + PAGE_SIZE
N_ACTIONS_BROWSER = B_MARK + 1
QUERIER_ACTION_NAMES = ("stay", "issue", "clear") + tuple(f"toggle_{j}" for j in range(N_SLOTS))
BROWSER_ACTION_NAMES = (
    ("stay",) + tuple(f"open_{k}" for k in range(PAGE_SIZE)) + ("next", "prev", "mark")
)

# observation layout (sizes; see the module doc of websearch_v0)
Q_GLOBAL = 16
Q_SLOT_FEATURES = 9
B_GLOBAL = 16
B_RESULT_FEATURES = 8
# v1: + best description match among unopened results on earlier / later pages; + per result,
# the fraction of the description's words it contains
B_GLOBAL_V1 = B_GLOBAL + 2
B_RESULT_FEATURES_V1 = B_RESULT_FEATURES + 1
# v2: + my open document covers the description (binary: it is the target)
B_GLOBAL_V2 = B_GLOBAL_V1 + 1
VERSIONS = (0, 1, 2)
S_GLOBAL = 11
S_RESULT_FEATURES = 6
S_BROWSER_FEATURES = 5
S_QUERIER_GLOBAL = 3
S_SLOT_FEATURES = 4

# reward weights, in the order of the ``weights`` vector passed to the kernels
REWARD_WEIGHT_NAMES = (
    "reward_found",
    "reward_early",
    "reward_surface",
    "penalty_step",
    "penalty_repeat",
    "penalty_reopen",
    "penalty_wrong",
    "penalty_invalid",
    "reward_read",
    "reward_answer",
)
(W_FOUND, W_EARLY, W_SURFACE, W_STEP, W_REPEAT, W_REOPEN, W_WRONG, W_INVALID, W_READ,
 W_ANSWER) = range(10)  # fmt: skip
#: the arguments each version introduces, with their defaults: version -> {name: value}; a
#: version has its own and every earlier version's, and none of a later one's
VERSION_ARGS: dict[int, dict[str, Any]] = {
    0: {},
    1: {"reward_read": 0.0, "reward_answer": 0.5},
    2: {},
}

CORPUS_FIELDS = (
    "n_entities",
    "n_brands",
    "n_categories",
    "n_attributes",
    "attributes_per_entity",
    "n_aspects",
    "n_variants",
    "n_details",
    "n_noise_terms",
    "doc_noise",
    "p_canonical",
    "corpus_seed",
)

PRESETS: dict[str, dict[str, Any]] = {
    "easy": dict(
        n_queriers=1,
        n_browsers=1,
        n_entities=40,
        n_brands=6,
        n_categories=4,
        n_attributes=16,
        n_aspects=6,
        n_variants=1,
        n_details=12,
        n_noise_terms=300,
        p_synonym=0.3,
        p_model=0.5,
        p_detail=0.3,
        top_k=20,
        max_cycles=30,
    ),
    "default": dict(
        n_queriers=1,
        n_browsers=2,
        n_entities=150,
        n_brands=12,
        n_categories=6,
        n_attributes=30,
        n_aspects=8,
        n_variants=2,
        n_details=20,
        n_noise_terms=600,
        p_synonym=0.6,
        p_model=0.25,
        p_detail=0.5,
        top_k=20,
        max_cycles=40,
    ),
    "hard": dict(
        n_queriers=2,
        n_browsers=2,
        n_entities=300,
        n_brands=20,
        n_categories=8,
        n_attributes=40,
        n_aspects=8,
        n_variants=3,
        n_details=30,
        n_noise_terms=1000,
        p_synonym=0.9,
        p_model=0.0,
        p_detail=0.6,
        top_k=30,
        max_cycles=30,
    ),
}


@njit(cache=True, error_model="numpy", _nrt=False)
def _browser_global(version: int) -> int:
    """The number of global browser features before the per-result ones, in ``version``."""
    if version == 0:
        return B_GLOBAL
    return B_GLOBAL_V1 if version == 1 else B_GLOBAL_V2


@njit(cache=True, error_model="numpy", _nrt=False)
def _browser_result_features(version: int) -> int:
    """The number of browser features per result, in ``version``."""
    return B_RESULT_FEATURES if version == 0 else B_RESULT_FEATURES_V1


@dataclasses.dataclass
class WebSearchConfig:
    """All arguments of ``websearch_v0`` / ``v1`` / ``v2`` (defaults: the ``default`` preset).

    ``version`` is the env module's version (not a user argument; set by
    ``make_versioned_config``); ``reward_read`` and ``reward_answer`` exist from v1 on (0 and
    unused in v0).
    Derived sizes (``n_agents``, ``n_docs``, ``obs_dim_querier``, ``obs_dim_browser``,
    ``state_dim``) are properties. ``validate()`` raises ``ValueError`` (``ArgumentTypeError``,
    also a ``TypeError``, for a wrong type) naming the bad argument.
    """

    n_queriers: int = 1
    n_browsers: int = 2
    # corpus
    n_entities: int = 150
    n_brands: int = 12
    n_categories: int = 6
    n_attributes: int = 30
    attributes_per_entity: int = 3
    n_aspects: int = 8
    n_variants: int = 2
    n_details: int = 20
    n_noise_terms: int = 600
    doc_noise: int = 24
    p_canonical: float = 0.85
    corpus_seed: int = 0
    # tasks
    p_synonym: float = 0.6
    p_model: float = 0.25
    p_detail: float = 0.5
    n_vague: int = 1
    # engine and episode
    top_k: int = 20
    max_query_terms: int = 4
    max_cycles: int = 40
    max_answers: int = 1
    # rewards
    reward_found: float = 1.0
    reward_early: float = 0.5
    reward_surface: float = 0.1
    penalty_step: float = 0.01
    penalty_repeat: float = 0.05
    penalty_reopen: float = 0.02
    penalty_wrong: float = 0.2
    penalty_invalid: float = 0.05
    reward_read: float = 0.0
    reward_answer: float = 0.0
    strict_actions: bool = False
    version: int = 0

    # ---- derived -------------------------------------------------------------------------
    @property
    def n_agents(self) -> int:
        return self.n_queriers + self.n_browsers

    @property
    def agent_names(self) -> list[str]:
        return [f"querier_{i}" for i in range(self.n_queriers)] + [
            f"browser_{i}" for i in range(self.n_browsers)
        ]

    @property
    def n_docs(self) -> int:
        return self.n_entities * self.n_aspects * self.n_variants

    @property
    def docs_per_entity(self) -> int:
        return self.n_aspects * self.n_variants

    @property
    def obs_dim_querier(self) -> int:
        return Q_GLOBAL + N_SLOTS * Q_SLOT_FEATURES + 2 * HASH_DIM

    @property
    def browser_global(self) -> int:
        """Global browser features before the per-result ones (version dependent)."""
        return _browser_global(self.version)

    @property
    def browser_result_features(self) -> int:
        """Browser features per result (version dependent)."""
        return _browser_result_features(self.version)

    @property
    def obs_dim_browser(self) -> int:
        return self.browser_global + PAGE_SIZE * self.browser_result_features

    @property
    def state_dim(self) -> int:
        return (
            S_GLOBAL
            + S_RESULT_FEATURES * self.top_k
            + S_BROWSER_FEATURES * self.n_browsers
            + self.n_queriers * (S_QUERIER_GLOBAL + S_SLOT_FEATURES * N_SLOTS)
            + 2 * HASH_DIM
        )

    def weights(self) -> np.ndarray:
        return np.array([getattr(self, k) for k in REWARD_WEIGHT_NAMES], dtype=np.float64)

    def corpus_key(self) -> tuple:
        return tuple(getattr(self, k) for k in CORPUS_FIELDS)

    # ---- validation ----------------------------------------------------------------------
    def validate(self) -> WebSearchConfig:
        def _int(name: str, lo: int, hi: int | None = None) -> None:
            check_int_field(self, name, lo, hi)

        def _float(name: str, lo: float, hi: float | None = None) -> None:
            check_float_field(self, name, lo, hi)

        _int("n_queriers", 1, 16)
        _int("n_browsers", 1, 16)
        _int("n_entities", 2, 20000)
        _int("n_brands", 1, 10000)
        _int("n_categories", 1, 10000)
        _int("n_attributes", 1, 10000)
        _int("attributes_per_entity", 0, DESC_SLOTS - 7)
        _int("n_aspects", 1, 64)
        _int("n_variants", 1, 16)
        _int("n_details", 1, 10000)
        _int("n_noise_terms", VAGUE_POOL, 100000)
        _int("doc_noise", 0, 1000)
        _int("corpus_seed", 0)
        _int("n_vague", 0, 1)
        _int("top_k", PAGE_SIZE, 1000)
        _int("max_query_terms", 1, DESC_SLOTS)
        _int("max_cycles", 1)
        _int("max_answers", 1, 64)
        _float("p_canonical", 0.0, 1.0)
        _float("p_synonym", 0.0, 1.0)
        _float("p_model", 0.0, 1.0)
        _float("p_detail", 0.0, 1.0)
        for name in REWARD_WEIGHT_NAMES:
            _float(name, 0.0 if name.startswith("penalty_") else -math.inf)
        if not isinstance(self.strict_actions, (bool, np.bool_)):
            raise ArgumentTypeError(
                f"strict_actions must be a bool, got {type(self.strict_actions).__name__} "
                f"{self.strict_actions!r}"
            )
        self.strict_actions = bool(self.strict_actions)
        if self.version not in VERSIONS:
            raise ValueError(f"version must be one of {VERSIONS}, got {self.version!r}")
        if self.attributes_per_entity > self.n_attributes:
            raise ValueError(
                f"attributes_per_entity={self.attributes_per_entity} must be <= "
                f"n_attributes={self.n_attributes}"
            )
        if self.n_variants > self.n_details:
            raise ValueError(
                f"n_variants={self.n_variants} must be <= n_details={self.n_details} (the "
                "variants of a document differ by their detail)"
            )
        if self.n_docs > 200_000:
            raise ValueError(
                f"n_entities * n_aspects * n_variants = {self.n_docs} documents: at most "
                "200000 are allowed"
            )
        if self.top_k < self.docs_per_entity:
            raise ValueError(
                f"top_k={self.top_k} must be >= n_aspects * n_variants = "
                f"{self.docs_per_entity} (the documents of one entity), so that every task "
                "can be solved (see 'Tasks' in the module doc)"
            )
        return self


def make_config(preset: str = "default", **kwargs: Any) -> WebSearchConfig:
    """Preset values overridden by explicit keyword arguments, validated (``websearch_v0``'s
    arguments; :func:`make_versioned_config` for a later version).

    Raises ``ValueError`` for an unknown preset and ``ArgumentTypeError`` (a ``TypeError`` and
    a ``ValueError``) for an unknown argument.
    """
    return make_versioned_config(0, preset, kwargs)


def make_versioned_config(
    version: int, preset: str = "default", kwargs: dict[str, Any] | None = None
) -> WebSearchConfig:
    """:func:`make_config` for env version ``version``: the arguments of later versions are
    unknown to earlier ones, and a version's own arguments default to ``VERSION_ARGS``."""
    if version not in VERSION_ARGS:
        raise ValueError(f"version must be one of {sorted(VERSION_ARGS)}, got {version!r}")
    kwargs = {} if kwargs is None else kwargs
    if not isinstance(preset, str) or preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; allowed: {sorted(PRESETS)}")
    later = {name for v, args in VERSION_ARGS.items() if v > version for name in args}
    fields = {f.name for f in dataclasses.fields(WebSearchConfig)} - later - {"version"}
    unknown = sorted(set(kwargs) - fields)
    if unknown:
        raise ArgumentTypeError(
            f"unknown argument(s) {unknown} for websearch_v{version}; allowed: {sorted(fields)}"
        )
    values = dict(PRESETS[preset])
    for v in range(version + 1):
        values.update(VERSION_ARGS[v])
    values.update(kwargs)
    return WebSearchConfig(**values, version=version).validate()
