"""The one vectorised core of ``websearch_v0``, ``websearch_v1`` and ``websearch_v2``:
configuration, presets, the corpus with its BM25 index, task generation and the dynamics.

Everything that decides what happens lives here, once:

* :class:`WebSearchConfig` -- validated arguments, presets and derived sizes;
* :func:`build_corpus` -- the procedurally generated corpus and its inverted index (a pure
  function of the corpus arguments and ``corpus_seed``, cached, shared read-only by all envs);
* :class:`WebSearchCore` -- ``num_envs`` episodes held as ``[num_envs, ...]`` arrays, reset and
  stepped by numba kernels (a loop over envs and the few agents of each env, compiled once,
  cached).

``parallel_env`` is the ``num_envs=1`` view of this core and ``vector_env`` the batched view, so
the two cannot drift apart. See ``envs/websearch_v0.py`` for the user documentation, and
``envs/websearch_v1.py``, ``envs/websearch_v2.py`` for what each later version changes.

Versions: ``WebSearchConfig.version`` (set by the env module, not a user argument) switches the
few rules that differ, inside these kernels (one copy of the dynamics): v1 adds the browsers'
description-match observations (``B_GLOBAL_V1``, ``B_RESULT_FEATURES_V1``), the individual
rewards for reading (``reward_read``: coverage of the description gained by an opened document)
and for the right answer (``reward_answer``, to the browser that marks the target), and charges
the step costs a failed episode skips (a wrong answer that ends it); v2 adds one browser
feature, "my open document covers the description" (``B_GLOBAL_V2``: 1.0 exactly when the
browser's open document is the target), before the per-result features.

Conventions: agents are ordered queriers first, then browsers. Querier actions: ``0`` stay,
``1`` issue the draft, ``2`` clear the draft, ``3 + j`` toggle candidate slot ``j`` (slots
``0..DESC_SLOTS-1``: the description's terms; the rest: terms harvested from the last opened
document). Browser actions: ``0`` stay, ``1 + k`` open result ``k`` of its page, ``6`` next
page, ``7`` previous page, ``8`` mark the open document as the answer.

Speed conventions (each measured to matter): the kernels and their helpers are compiled with
``_nrt=False`` (no reference counting: numba otherwise increments and decrements every array
passed to a helper, which cost more than the helpers' work) and allocate nothing (work arrays
come from the core); the episode arrays travel in a few bundles (``BUNDLES``) and the corpus
in two packed buffers, unpacked into named views by :func:`_state_views` /
:func:`_corpus_views` (numba wraps every array argument of a call from Python); per-result
word counts (``res_tcount``) make the observations' "fraction of results containing the
word" a lookup; task generation ranks a one-word query by the precomputed ``post_rank`` and
runs a search only when no single word will do.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from numba import njit

from envs._core import ArgumentTypeError, check_float_field, check_int_field

__all__ = [
    "ArgumentTypeError",
    "Corpus",
    "N_ACTIONS_BROWSER",
    "N_ACTIONS_QUERIER",
    "PRESETS",
    "WebSearchConfig",
    "WebSearchCore",
    "build_corpus",
    "make_config",
    "make_versioned_config",
]

PAGE_SIZE = 5
DESC_SLOTS = 10  # description terms (shuffled, -1 padded)
HARVEST_SLOTS = 6  # terms harvested from the last opened document
N_SLOTS = DESC_SLOTS + HARVEST_SLOTS
HASH_DIM = 16
BM25_K1 = 1.2
BM25_B = 0.75
VAGUE_POOL = 20  # vague words: drawn from the most frequent noise terms
NEVER = 1 << 30  # "fresh" before the first query
TASK_UNIFORMS = 64  # uniforms per episode start
UNIFORM_BLOCK = 16  # episode starts' uniforms drawn at a time
FORM_ATTEMPTS = 4  # draws of the description's word forms before the model-name fallback

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

# concept kinds and their number of word forms (form 0 canonical, the others synonyms)
KIND_CATEGORY, KIND_BRAND, KIND_MODEL, KIND_ATTRIBUTE, KIND_ASPECT, KIND_DETAIL, KIND_NOISE = range(
    7
)
KIND_NAMES = ("cat", "brand", "model", "attr", "aspect", "detail", "w")
KIND_FORMS = (3, 2, 1, 3, 3, 2, 1)
ASPECT_CONCEPTS = 2  # concepts per aspect ("review": review, rating)

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


# ============================================================================================
# Corpus and index
# ============================================================================================


@dataclasses.dataclass(frozen=True)
class Corpus:
    """The documents and their BM25 index (read-only arrays; CSR layouts ``*_ptr``).

    Concepts are laid out by kind (categories, brands, models = one per entity, attributes,
    aspect concepts, details, noise words); concept ``c`` has ``concept_nforms[c]`` word forms,
    terms ``concept_term0[c] + form`` (form 0 canonical). Document ``d`` is about entity
    ``doc_entity[d]``, aspect ``doc_aspect[d]``, variant ``doc_variant[d]`` with
    ``d = (entity * n_aspects + aspect) * n_variants + variant``.

    * ``doc_ptr``/``doc_terms``/``doc_tf``: each document's bag of words, terms ascending;
      ``doc_wterms``: the same terms by BM25 weight descending (ties: term ascending);
    * ``post_ptr``/``post_doc``/``post_w``: postings per term, documents ascending, with the
      term's BM25 weight in that document; ``post_rank``: the document's rank under the
      one-word query (weight descending, ties: document ascending);
    * ``dcon_ptr``/``dcon``: each document's content concepts (not noise), ascending;
      ``con_ptr``/``con_docs``: the documents containing each concept.
    """

    n_docs: int
    n_terms: int
    n_concepts: int
    concept_kind: np.ndarray
    concept_nforms: np.ndarray
    concept_term0: np.ndarray
    term_concept: np.ndarray
    term_hash: np.ndarray
    kind_start: np.ndarray  # first concept of each kind, [8] (the last: n_concepts)
    entity_category: np.ndarray
    entity_brand: np.ndarray
    entity_attributes: np.ndarray
    doc_entity: np.ndarray
    doc_aspect: np.ndarray
    doc_variant: np.ndarray
    doc_detail: np.ndarray
    doc_ptr: np.ndarray
    doc_terms: np.ndarray
    doc_tf: np.ndarray
    doc_wterms: np.ndarray
    doc_len: np.ndarray
    df: np.ndarray
    idf: np.ndarray
    idf_max: float
    avgdl: float
    post_ptr: np.ndarray
    post_doc: np.ndarray
    post_w: np.ndarray
    post_rank: np.ndarray
    dcon_ptr: np.ndarray
    dcon: np.ndarray
    con_ptr: np.ndarray
    con_docs: np.ndarray
    # the arrays the kernels read, packed (see _corpus_views)
    packed_int: np.ndarray
    packed_int_offsets: np.ndarray
    packed_float: np.ndarray
    packed_float_offsets: np.ndarray

    def doc_bag(self, d: int) -> dict[int, int]:
        """``{term: tf}`` of document ``d``."""
        lo, hi = self.doc_ptr[d], self.doc_ptr[d + 1]
        return dict(zip(self.doc_terms[lo:hi].tolist(), self.doc_tf[lo:hi].tolist(), strict=True))

    def term_name(self, t: int) -> str:
        """A readable name: kind, concept index within the kind, and ``'`` per synonym form."""
        c = int(self.term_concept[t])
        kind = int(self.concept_kind[c])
        form = int(t - self.concept_term0[c])
        return f"{KIND_NAMES[kind]}{c - int(self.kind_start[kind])}" + "'" * form

    def nbytes(self) -> int:
        """Bytes held (views of the packed buffers counted once)."""
        return sum(
            v.nbytes for v in vars(self).values() if isinstance(v, np.ndarray) and v.base is None
        )


def build_corpus(config: WebSearchConfig) -> Corpus:
    """The corpus of ``config`` (a pure function of its corpus arguments, ``CORPUS_FIELDS``;
    cached, so all envs with the same corpus arguments share one read-only copy)."""
    return _build_corpus_cached(config.corpus_key())


@functools.lru_cache(maxsize=8)
def _build_corpus_cached(key: tuple) -> Corpus:
    p = dict(zip(CORPUS_FIELDS, key, strict=True))
    rng = np.random.default_rng(p["corpus_seed"])
    n_ent, n_asp, n_var = p["n_entities"], p["n_aspects"], p["n_variants"]
    ape = p["attributes_per_entity"]
    counts = [
        p["n_categories"],
        p["n_brands"],
        n_ent,
        p["n_attributes"],
        n_asp * ASPECT_CONCEPTS,
        p["n_details"],
        p["n_noise_terms"],
    ]
    kind_start = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    n_concepts = int(kind_start[-1])
    concept_kind = np.repeat(np.arange(7), counts).astype(np.int64)
    concept_nforms = np.asarray(KIND_FORMS, dtype=np.int64)[concept_kind]
    concept_term0 = np.concatenate([[0], np.cumsum(concept_nforms)[:-1]]).astype(np.int64)
    n_terms = int(concept_nforms.sum())
    term_concept = np.repeat(np.arange(n_concepts), concept_nforms).astype(np.int64)
    term_hash = (np.arange(n_terms, dtype=np.uint64) * np.uint64(2654435761)) % np.uint64(2**32)
    term_hash = (term_hash % np.uint64(HASH_DIM)).astype(np.int64)

    entity_category = rng.integers(0, p["n_categories"], n_ent)
    entity_brand = rng.integers(0, p["n_brands"], n_ent)
    entity_attributes = np.argsort(rng.random((n_ent, p["n_attributes"])), axis=1)[:, :ape]
    n_docs = n_ent * n_asp * n_var
    doc_ids = np.arange(n_docs)
    doc_entity = doc_ids // (n_asp * n_var)
    doc_aspect = (doc_ids // n_var) % n_asp
    doc_variant = doc_ids % n_var
    details = np.argsort(rng.random((n_ent * n_asp, p["n_details"])), axis=1)[:, :n_var]
    doc_detail = details.reshape(-1)

    # content concepts of each document slot, and their term frequencies
    slots = 3 + ape + ASPECT_CONCEPTS + 1
    concepts = np.empty((n_docs, slots), dtype=np.int64)
    concepts[:, 0] = kind_start[KIND_CATEGORY] + entity_category[doc_entity]
    concepts[:, 1] = kind_start[KIND_BRAND] + entity_brand[doc_entity]
    concepts[:, 2] = kind_start[KIND_MODEL] + doc_entity
    concepts[:, 3 : 3 + ape] = kind_start[KIND_ATTRIBUTE] + entity_attributes[doc_entity]
    for j in range(ASPECT_CONCEPTS):
        concepts[:, 3 + ape + j] = kind_start[KIND_ASPECT] + doc_aspect * ASPECT_CONCEPTS + j
    concepts[:, -1] = kind_start[KIND_DETAIL] + doc_detail
    tf = np.empty((n_docs, slots), dtype=np.int64)
    tf[:, 0] = 1 + (rng.random(n_docs) < 0.4)
    tf[:, 1] = rng.integers(1, 4, n_docs)
    tf[:, 2] = rng.integers(1, 4, n_docs)
    present = rng.random((n_docs, ape)) < 0.8
    tf[:, 3 : 3 + ape] = present * (1 + (rng.random((n_docs, ape)) < 0.3))
    tf[:, 3 + ape : 3 + ape + ASPECT_CONCEPTS] = rng.integers(1, 4, (n_docs, ASPECT_CONCEPTS))
    tf[:, -1] = rng.integers(1, 3, n_docs)
    occ_concept = np.repeat(concepts.ravel(), tf.ravel())
    occ_doc = np.repeat(np.repeat(doc_ids, slots), tf.ravel())
    u_form = rng.random(occ_concept.size)
    u_syn = rng.random(occ_concept.size)
    nforms = concept_nforms[occ_concept]
    form = np.where(
        (u_form < p["p_canonical"]) | (nforms == 1),
        0,
        1 + np.minimum((u_syn * (nforms - 1)).astype(np.int64), nforms - 2),
    )
    occ_term = concept_term0[occ_concept] + form
    # noise words: Zipf(1) over the noise vocabulary
    lo = p["doc_noise"] // 2
    n_noise_tok = rng.integers(lo, p["doc_noise"] + lo + 1, n_docs)
    zipf = 1.0 / np.arange(1, p["n_noise_terms"] + 1)
    noise = rng.choice(p["n_noise_terms"], size=int(n_noise_tok.sum()), p=zipf / zipf.sum())
    noise_term = concept_term0[kind_start[KIND_NOISE] + noise]
    all_doc = np.concatenate([occ_doc, np.repeat(doc_ids, n_noise_tok)])
    all_term = np.concatenate([occ_term, noise_term])
    keys, doc_tf = np.unique(all_doc * n_terms + all_term, return_counts=True)
    bag_doc = keys // n_terms
    doc_terms = keys % n_terms
    doc_tf = doc_tf.astype(np.int64)
    doc_ptr = np.concatenate([[0], np.cumsum(np.bincount(bag_doc, minlength=n_docs))])
    doc_len = np.bincount(bag_doc, weights=doc_tf, minlength=n_docs).astype(np.int64)

    # BM25 (Okapi, Lucene's idf): w(t, d) = idf(t) tf (k1 + 1) / (tf + k1 (1 - b + b dl/avgdl))
    avgdl = float(doc_len.sum()) / n_docs
    df = np.bincount(doc_terms, minlength=n_terms).astype(np.int64)
    idf = np.log(1.0 + (n_docs - df + 0.5) / (df + 0.5))
    idf_max = float(np.log(1.0 + (n_docs + 0.5) / 0.5))
    tf_f = doc_tf.astype(np.float64)
    norm = BM25_K1 * (1.0 - BM25_B + BM25_B * doc_len[bag_doc] / avgdl)
    weight = idf[doc_terms] * (tf_f * (BM25_K1 + 1.0)) / (tf_f + norm)
    order = np.argsort(doc_terms, kind="stable")
    post_doc = bag_doc[order]
    post_w = weight[order]
    post_ptr = np.concatenate([[0], np.cumsum(df)])
    # rank of each posting within its term's list by weight (ties: document ascending), i.e.
    # the document's rank under the one-word query
    by_weight = np.lexsort((post_doc, -post_w, doc_terms[order]))
    post_rank = np.empty_like(post_doc)
    post_rank[by_weight] = np.arange(post_doc.size) - np.repeat(post_ptr[:-1], df)
    worder = np.lexsort((doc_terms, -weight, bag_doc))
    doc_wterms = doc_terms[worder]

    # content concepts per document and documents per concept
    con = term_concept[doc_terms]
    content = concept_kind[con] != KIND_NOISE
    ckeys = np.unique(bag_doc[content] * n_concepts + con[content])
    dcon_doc = ckeys // n_concepts
    dcon = ckeys % n_concepts
    dcon_ptr = np.concatenate([[0], np.cumsum(np.bincount(dcon_doc, minlength=n_docs))])
    corder = np.argsort(dcon, kind="stable")
    con_docs = dcon_doc[corder]
    con_ptr = np.concatenate([[0], np.cumsum(np.bincount(dcon, minlength=n_concepts))])

    arrays = dict(
        concept_kind=concept_kind,
        concept_nforms=concept_nforms,
        concept_term0=concept_term0,
        term_concept=term_concept,
        term_hash=term_hash,
        kind_start=kind_start,
        entity_category=entity_category.astype(np.int64),
        entity_brand=entity_brand.astype(np.int64),
        entity_attributes=entity_attributes.astype(np.int64),
        doc_entity=doc_entity.astype(np.int64),
        doc_aspect=doc_aspect.astype(np.int64),
        doc_variant=doc_variant.astype(np.int64),
        doc_detail=doc_detail.astype(np.int64),
        doc_ptr=doc_ptr.astype(np.int64),
        doc_terms=doc_terms.astype(np.int64),
        doc_tf=doc_tf,
        doc_wterms=doc_wterms.astype(np.int64),
        doc_len=doc_len,
        df=df,
        idf=idf,
        post_ptr=post_ptr.astype(np.int64),
        post_doc=post_doc.astype(np.int64),
        post_w=post_w,
        post_rank=post_rank.astype(np.int64),
        dcon_ptr=dcon_ptr.astype(np.int64),
        dcon=dcon.astype(np.int64),
        con_ptr=con_ptr.astype(np.int64),
        con_docs=con_docs.astype(np.int64),
    )
    ints = [arrays[f] for f in CORPUS_INT_FIELDS]
    floats = [arrays[f] for f in CORPUS_KERNEL_FIELDS if f not in CORPUS_INT_FIELDS]
    arrays["packed_int"] = np.concatenate(ints).astype(np.int64)
    arrays["packed_int_offsets"] = np.cumsum([0] + [a.size for a in ints]).astype(np.int64)
    arrays["packed_float"] = np.concatenate(floats).astype(np.float64)
    arrays["packed_float_offsets"] = np.cumsum([0] + [a.size for a in floats]).astype(np.int64)
    for packed, offsets, names in (
        ("packed_int", "packed_int_offsets", CORPUS_INT_FIELDS),
        ("packed_float", "packed_float_offsets", ("idf", "post_w")),
    ):  # the named arrays become views of the packed buffers (one copy in memory)
        for i, name in enumerate(names):
            lo, hi = arrays[offsets][i], arrays[offsets][i + 1]
            arrays[name] = arrays[packed][lo:hi]
    for value in arrays.values():
        value.setflags(write=False)
    return Corpus(
        n_docs=n_docs,
        n_terms=n_terms,
        n_concepts=n_concepts,
        idf_max=idf_max,
        avgdl=avgdl,
        **arrays,
    )


# ============================================================================================
# Kernels (numba). N envs, Q queriers, B browsers, K = top_k, QM = max_query_terms.
# ============================================================================================


@njit(cache=True, error_model="numpy", _nrt=False)
def _sorted_has(values, lo, hi, x):
    """Whether ``x`` is in the ascending ``values[lo:hi]`` (binary search)."""
    while lo < hi:
        mid = (lo + hi) >> 1
        v = values[mid]
        if v == x:
            return True
        if v < x:
            lo = mid + 1
        else:
            hi = mid
    return False


@njit(cache=True, error_model="numpy", _nrt=False)
def _isort(a, length):
    """Sort ``a[:length]`` ascending in place (insertion sort: a handful of values)."""
    for i in range(1, length):
        x = a[i]
        j = i
        while j > 0 and a[j - 1] > x:
            a[j] = a[j - 1]
            j -= 1
        a[j] = x


@njit(cache=True, error_model="numpy", _nrt=False)
def _posting_of(t, d, post_ptr, post_doc):
    """Index of document d's posting in term t's list (documents ascending), or -1."""
    lo, hi = post_ptr[t], post_ptr[t + 1]
    while lo < hi:
        mid = (lo + hi) >> 1
        v = post_doc[mid]
        if v == d:
            return mid
        if v < d:
            lo = mid + 1
        else:
            hi = mid
    return -1


@njit(cache=True, error_model="numpy", _nrt=False)
def _search(
    q_terms, q_len, post_ptr, post_doc, post_w, scratch, hits, touched, top_k, out_docs, out_s,
    out_hits,
):  # fmt: skip
    """BM25 top-k of the query ``q_terms[:q_len]`` (distinct terms, ascending): a document's
    score is the sum, in that term order, of its postings' weights; ranked by score descending,
    ties by document ascending. Writes ``out_docs``/``out_s`` and ``out_hits`` (how many query
    terms each contains) and returns how many (documents sharing at least one term, at most
    ``top_k``). ``scratch`` and ``hits`` [n_docs] must be zero; they are left zero."""
    n_touched = 0
    for i in range(q_len):
        t = q_terms[i]
        for p in range(post_ptr[t], post_ptr[t + 1]):
            d = post_doc[p]
            if scratch[d] == 0.0:
                touched[n_touched] = d
                n_touched += 1
            scratch[d] += post_w[p]
            hits[d] += 1
    n_out = 0
    for j in range(n_touched):
        d = touched[j]
        s = scratch[d]
        if n_out < top_k:
            pos = n_out
            n_out += 1
        elif s > out_s[top_k - 1] or (s == out_s[top_k - 1] and d < out_docs[top_k - 1]):
            pos = top_k - 1
        else:
            continue
        while pos > 0 and (s > out_s[pos - 1] or (s == out_s[pos - 1] and d < out_docs[pos - 1])):
            out_s[pos] = out_s[pos - 1]
            out_docs[pos] = out_docs[pos - 1]
            pos -= 1
        out_s[pos] = s
        out_docs[pos] = d
    for r in range(n_out):
        out_hits[r] = hits[out_docs[r]]
    for j in range(n_touched):
        scratch[touched[j]] = 0.0
        hits[touched[j]] = 0
    return n_out


@njit(cache=True, error_model="numpy", _nrt=False)
def _cover_counts(d, n, desc_cons, desc_ncons, concept_kind, dcon_ptr, dcon):
    """(description concepts in document d, the same for its title concepts = those naming
    the entity: category, brand, model; number of title concepts)."""
    hit = 0
    title_hit = 0
    title_n = 0
    lo, hi = dcon_ptr[d], dcon_ptr[d + 1]
    for i in range(desc_ncons[n]):
        c = desc_cons[n, i]
        title = concept_kind[c] <= KIND_MODEL
        title_n += title
        if _sorted_has(dcon, lo, hi, c):
            hit += 1
            title_hit += title
    return hit, title_hit, title_n


@njit(cache=True, error_model="numpy", _nrt=False)
def _unique_target(target, cons, n_cons, con_ptr, con_docs, dcon_ptr, dcon):
    """Whether ``target`` is the only document containing every concept of ``cons``: the
    documents of the two rarest concepts are intersected (a merge of sorted lists), each
    common one checked for the rest."""
    best, second = -1, -1
    best_n, second_n = 1 << 62, 1 << 62
    for i in range(n_cons):
        c = cons[i]
        size = con_ptr[c + 1] - con_ptr[c]
        if size < best_n:
            second, second_n = best, best_n
            best, best_n = c, size
        elif size < second_n:
            second, second_n = c, size
    if second < 0:
        second = best
    a, a_end = con_ptr[best], con_ptr[best + 1]
    b, b_end = con_ptr[second], con_ptr[second + 1]
    while a < a_end and b < b_end:
        d = con_docs[a]
        e = con_docs[b]
        if d < e:
            a += 1
        elif e < d:
            b += 1
        else:
            a += 1
            b += 1
            if d == target:
                continue
            all_in = True
            for i in range(n_cons):
                if not _sorted_has(dcon, dcon_ptr[d], dcon_ptr[d + 1], cons[i]):
                    all_in = False
                    break
            if all_in:
                return False
    return True


@njit(cache=True, error_model="numpy", _nrt=False)
def _new_task(
    n, u, p_synonym, p_model, p_detail, n_vague, top_k, qm, scratch, hits, touched, res_docs,
    res_s, res_hits, cons, terms, q,
    kind_start, concept_kind, concept_nforms, concept_term0, entity_category, entity_brand,
    doc_entity, doc_aspect, doc_detail, doc_ptr, doc_wterms, post_ptr, post_doc, post_w,
    post_rank, dcon_ptr, dcon, con_ptr, con_docs,
    target_out, desc_terms, desc_len, desc_cons, desc_ncons, solution, solution_len,
):  # fmt: skip
    """Draw env n's task from the uniforms ``u`` (see 'Tasks' in the module doc of
    websearch_v0). Uniform i is ``u[i % len(u)]`` in order of use."""
    n_u = u.shape[0]
    k = 0
    n_docs = doc_entity.shape[0]
    target = min(int(u[k] * n_docs), n_docs - 1)
    k += 1
    e = doc_entity[target]
    a = doc_aspect[target]
    nc = 0
    # entity concepts, then the aspect's, then the detail (in this order before shuffling)
    if u[k % n_u] < 0.8:
        cons[nc] = kind_start[KIND_CATEGORY] + entity_category[e]
        nc += 1
    k += 1
    if u[k % n_u] < 0.8:
        cons[nc] = kind_start[KIND_BRAND] + entity_brand[e]
        nc += 1
    k += 1
    model = kind_start[KIND_MODEL] + e
    with_model = u[k % n_u] < p_model
    k += 1
    if with_model:
        cons[nc] = model
        nc += 1
    lo, hi = dcon_ptr[target], dcon_ptr[target + 1]
    for i in range(lo, hi):  # attributes present in the target, each with probability 1/2
        c = dcon[i]
        if concept_kind[c] == KIND_ATTRIBUTE:
            if u[k % n_u] < 0.5:
                cons[nc] = c
                nc += 1
            k += 1
    n_aspect_cons = 0
    first_aspect = kind_start[KIND_ASPECT] + a * ASPECT_CONCEPTS
    for j in range(ASPECT_CONCEPTS):
        if u[k % n_u] < 0.8:
            cons[nc] = first_aspect + j
            nc += 1
            n_aspect_cons += 1
        k += 1
    if n_aspect_cons == 0:
        cons[nc] = first_aspect
        nc += 1
    detail = kind_start[KIND_DETAIL] + doc_detail[target]
    with_detail = u[k % n_u] < p_detail
    k += 1
    if with_detail:
        cons[nc] = detail
        nc += 1
    # well posed: the target is the only document that covers the description
    if not _unique_target(target, cons, nc, con_ptr, con_docs, dcon_ptr, dcon):
        if not with_detail:
            cons[nc] = detail
            nc += 1
            with_detail = True
        if not with_model and not _unique_target(
            target, cons, nc, con_ptr, con_docs, dcon_ptr, dcon
        ):
            cons[nc] = model
            nc += 1
            with_model = True
    # word forms, and a solution: the description word under which, as a query on its own,
    # the target ranks best (it must rank within top_k; see the module doc)
    q[:] = -1
    nq = 0
    for attempt in range(FORM_ATTEMPTS + 1):
        if attempt < FORM_ATTEMPTS:
            for i in range(nc):
                c = cons[i]
                nf = concept_nforms[c]
                form = 0
                x = u[k % n_u]
                k += 1
                if nf > 1 and x < p_synonym:  # which synonym: the same uniform, rescaled
                    form = 1 + min(int(x / p_synonym * (nf - 1)), nf - 2)
                terms[i] = concept_term0[c] + form
        elif not with_model:
            # last resort: the last forms, and the model's name (every document of the
            # entity, and only those, contains it, and there are at most top_k of them)
            cons[nc] = model
            terms[nc] = concept_term0[model]
            nc += 1
            with_model = True
        # one word under which the target ranks within top_k (the best), else the <= qm
        # description words in the target with the largest weight, as one query
        nq = 0
        best_rank = top_k
        for i in range(nc):
            t = terms[i]
            p = _posting_of(t, target, post_ptr, post_doc)
            if p >= 0 and (post_rank[p] < best_rank or (post_rank[p] == best_rank and t < q[0])):
                best_rank = post_rank[p]
                q[0] = t
                nq = 1
        if nq == 1:
            break
        for i in range(doc_ptr[target], doc_ptr[target + 1]):
            t = doc_wterms[i]
            for j in range(nc):
                if terms[j] == t:
                    if nq < qm:
                        q[nq] = t
                        nq += 1
                    break
        if nq > 1:
            _isort(q, nq)
            got = _search(
                q,
                nq,
                post_ptr,
                post_doc,
                post_w,
                scratch,
                hits,
                touched,
                top_k,
                res_docs,
                res_s,
                res_hits,
            )
            for r in range(got):
                if res_docs[r] == target:
                    break
            else:
                nq = 0
            if nq > 1:
                break
        nq = 0
    if nq == 0:  # the model's name (in the description by now) always finds the target
        q[0] = concept_term0[model]
        nq = 1
    for i in range(n_vague):  # vague words: frequent noise terms ("good", "new", ...)
        word = min(int(u[k % n_u] * VAGUE_POOL), VAGUE_POOL - 1)
        terms[nc + i] = concept_term0[kind_start[KIND_NOISE] + word]
        k += 1
    total = nc + n_vague
    # shuffle the description (Fisher-Yates)
    for i in range(total - 1, 0, -1):
        j = min(int(u[k % n_u] * (i + 1)), i)
        k += 1
        terms[i], terms[j] = terms[j], terms[i]
    target_out[n] = target
    desc_terms[n, :] = -1
    for i in range(total):
        desc_terms[n, i] = terms[i]
    desc_len[n] = total
    desc_cons[n, :] = -1
    for i in range(nc):  # ascending (insertion sort: a handful of concepts)
        c = cons[i]
        j = i
        while j > 0 and desc_cons[n, j - 1] > c:
            desc_cons[n, j] = desc_cons[n, j - 1]
            j -= 1
        desc_cons[n, j] = c
    desc_ncons[n] = nc
    solution[n, :] = -1
    for i in range(nq):
        solution[n, i] = q[i]
    solution_len[n] = nq


@njit(cache=True, error_model="numpy", _nrt=False)
def _slot_term(n, j, desc_terms, harvest):
    if j < DESC_SLOTS:
        return desc_terms[n, j]
    return harvest[n, j - DESC_SLOTS]


@njit(cache=True, error_model="numpy", _nrt=False)
def _row_has(rows, n, length, x):
    """Whether ``x`` is in the ascending ``rows[n, :length]`` (no array view: hot loops)."""
    lo, hi = 0, length
    while lo < hi:
        mid = (lo + hi) >> 1
        v = rows[n, mid]
        if v == x:
            return True
        if v < x:
            lo = mid + 1
        else:
            hi = mid
    return False


@njit(cache=True, error_model="numpy", _nrt=False)
def _draft_has(draft, n, q, length, x):
    """Whether ``x`` is in querier q's ascending draft ``draft[n, q, :length]``."""
    for i in range(length):
        if draft[n, q, i] == x:
            return True
        if draft[n, q, i] > x:
            return False
    return False


@njit(cache=True, error_model="numpy", _nrt=False)
def _intersect(draft, n, q, length, log, i, li):
    """Size of the intersection of the ascending ``draft[n, q, :length]`` and
    ``log[n, i, :li]``."""
    a = 0
    b = 0
    c = 0
    while a < length and b < li:
        x = draft[n, q, a]
        y = log[n, i, b]
        if x == y:
            c += 1
            a += 1
            b += 1
        elif x < y:
            a += 1
        else:
            b += 1
    return c


@njit(cache=True, error_model="numpy", _nrt=False)
def _toggle(row, length, t):
    """Add term t to the ascending ``row[:length]`` or remove it; returns the new length."""
    for i in range(length):
        if row[i] == t:
            for j in range(i, length - 1):
                row[j] = row[j + 1]
            row[length - 1] = -1
            return length - 1
    pos = length
    while pos > 0 and row[pos - 1] > t:
        row[pos] = row[pos - 1]
        pos -= 1
    row[pos] = t
    return length + 1


@njit(cache=True, error_model="numpy", _nrt=False)
def _legal(n, a, act, nq, qm, desc_terms, harvest, draft, draft_len, n_results, page, open_doc,
           n_wrong, wrong):  # fmt: skip
    """Whether action ``act`` (in range) of agent ``a`` is legal (unmasked) in env n now."""
    if act == 0:
        return True
    if a < nq:
        length = draft_len[n, a]
        if act == Q_ISSUE or act == Q_CLEAR:  # noqa: SIM109 (numba)
            return length > 0
        t = _slot_term(n, act - Q_TOGGLE0, desc_terms, harvest)
        if t < 0:
            return False
        if length < qm:
            return True
        for i in range(length):  # noqa: SIM110 (numba)
            if draft[n, a, i] == t:
                return True
        return False
    b = a - nq
    if act < B_NEXT:  # open result act - 1 of the page
        return page[n, b] * PAGE_SIZE + act - B_OPEN0 < n_results[n]
    if act == B_NEXT:
        return (page[n, b] + 1) * PAGE_SIZE < n_results[n]
    if act == B_PREV:
        return page[n, b] > 0
    d = open_doc[n, b]  # mark
    if d < 0:
        return False
    for i in range(n_wrong[n]):  # noqa: SIM110 (numba)
        if wrong[n, i] == d:
            return False
    return True


@njit(cache=True, error_model="numpy", _nrt=False)
def _legal_matrix(actions, active, nq, qm, desc_terms, harvest, draft, draft_len, n_results,
                  page, open_doc, n_wrong, wrong, out):  # fmt: skip
    for n in range(actions.shape[0]):
        for a in range(actions.shape[1]):
            out[n, a] = (not active[n]) or _legal(
                n, a, actions[n, a], nq, qm, desc_terms, harvest, draft, draft_len, n_results,
                page, open_doc, n_wrong, wrong,
            )  # fmt: skip


@njit(cache=True, error_model="numpy", _nrt=False)
def _usage_of(n, t, log, log_len, n_issued):
    """Number of queries issued in env n's episode that contain term t."""
    count = 0
    for i in range(n_issued[n]):
        for j in range(log_len[n, i]):
            if log[n, i, j] == t:
                count += 1
                break
    return count


@njit(cache=True, error_model="numpy", _nrt=False)
def _draft_cache(n, q, draft, draft_len, log, log_len, n_issued, draft_rep, draft_sim):
    """Whether querier q's draft equals an issued query, and its largest Jaccard similarity
    to one."""
    length = draft_len[n, q]
    rep = 0
    best = 0.0
    for i in range(n_issued[n]):
        li = log_len[n, i]
        c = _intersect(draft, n, q, length, log, i, li)
        sim = c / (length + li - c)
        if sim > best:
            best = sim
        if c == length and c == li:
            rep = 1
    draft_rep[n, q] = rep
    draft_sim[n, q] = best


@njit(cache=True, error_model="numpy", _nrt=False)
def _surface(n, p, agent, results, n_results, target, n_variants, surfaced, rewards, w_surface):
    """Credit ``agent`` for the relevant documents (the target's entity and aspect) shown for
    the first time on page p."""
    group = target[n] // n_variants
    for r in range(p * PAGE_SIZE, min(p * PAGE_SIZE + PAGE_SIZE, n_results[n])):
        d = results[n, r]
        if d // n_variants == group:
            v = d - group * n_variants
            if surfaced[n, v] == 0:
                surfaced[n, v] = 1
                rewards[1, agent, n] += w_surface


@njit(cache=True, error_model="numpy", inline="always")
def _corpus_views(CI, COFF, CF, CFOFF):
    """The corpus arrays (``CORPUS_KERNEL_FIELDS``) as views of the packed buffers: one
    int64 and one float64 buffer with offsets (few arguments: numba wraps every array
    argument of a call from Python, which costs more than the kernels' work)."""
    return (
        CI[COFF[0] : COFF[1]],  # kind_start
        CI[COFF[1] : COFF[2]],  # concept_kind
        CI[COFF[2] : COFF[3]],  # concept_nforms
        CI[COFF[3] : COFF[4]],  # concept_term0
        CI[COFF[4] : COFF[5]],  # term_concept
        CI[COFF[5] : COFF[6]],  # term_hash
        CF[CFOFF[0] : CFOFF[1]],  # idf
        CI[COFF[6] : COFF[7]],  # df
        CI[COFF[7] : COFF[8]],  # entity_category
        CI[COFF[8] : COFF[9]],  # entity_brand
        CI[COFF[9] : COFF[10]],  # doc_entity
        CI[COFF[10] : COFF[11]],  # doc_aspect
        CI[COFF[11] : COFF[12]],  # doc_detail
        CI[COFF[12] : COFF[13]],  # doc_ptr
        CI[COFF[13] : COFF[14]],  # doc_terms
        CI[COFF[14] : COFF[15]],  # doc_wterms
        CI[COFF[15] : COFF[16]],  # post_ptr
        CI[COFF[16] : COFF[17]],  # post_doc
        CF[CFOFF[1] : CFOFF[2]],  # post_w
        CI[COFF[17] : COFF[18]],  # post_rank
        CI[COFF[18] : COFF[19]],  # dcon_ptr
        CI[COFF[19] : COFF[20]],  # dcon
        CI[COFF[20] : COFF[21]],  # con_ptr
        CI[COFF[21] : COFF[22]],  # con_docs
    )


@njit(cache=True, error_model="numpy", inline="always")
def _state_views(E, EF, DESC, QRY, DQ, RF, BR):
    """The episode arrays packed in bundles (``BUNDLES``), as named views."""
    return (
        E[0],  # target
        E[1],  # desc_len
        E[2],  # desc_ncons
        E[3],  # solution_len
        E[4],  # t
        E[5],  # success
        E[6],  # success_step
        E[7],  # answers_left
        E[8],  # n_wrong
        E[9],  # harvest_len
        E[10],  # query_len
        E[11],  # query_owner
        E[12],  # n_results
        E[13],  # n_issued
        E[14],  # n_distinct
        E[15],  # n_opened
        E[16],  # pages_opened
        E[17],  # fresh
        EF[0],  # jac_sum
        EF[1],  # best_cover
        DESC[0],  # desc_terms
        DESC[1],  # desc_cons
        QRY[0],  # solution
        QRY[1],  # query
        DQ[0],  # draft_len
        DQ[1],  # draft_rep
        RF[0],  # res_score
        RF[1],  # res_title
        RF[2],  # res_cover
        RF[3],  # res_overlap
        RF[4],  # res_dmatch
        BR[0],  # page
        BR[1],  # open_doc
    )


@njit(cache=True, error_model="numpy", _nrt=False)
def _reset_kernel(
    envs, uniforms, p_synonym, p_model, p_detail, n_vague, top_k, qm, max_answers, scratch,
    hits, touched, work_i, work_f,
    CI, COFF, CF, CFOFF, E, EF, DESC, QRY, DQ, RF, BR, draft, draft_sim, harvest, slot_usage,
    results, log, log_len, opened, res_tcount, surfaced, wrong,
):  # fmt: skip
    """Start a new episode in env ``envs[j]`` with the task drawn from ``uniforms[j]``."""
    corpus = _corpus_views(CI, COFF, CF, CFOFF)
    (kind_start, concept_kind, concept_nforms, concept_term0, term_concept, term_hash, idf,
     df, entity_category, entity_brand, doc_entity, doc_aspect, doc_detail, doc_ptr,
     doc_terms, doc_wterms, post_ptr, post_doc, post_w, post_rank, dcon_ptr, dcon, con_ptr,
     con_docs) = corpus  # fmt: skip
    views = _state_views(E, EF, DESC, QRY, DQ, RF, BR)
    (target, desc_len, desc_ncons, solution_len, t, success, success_step, answers_left,
     n_wrong, harvest_len, query_len, query_owner, n_results, n_issued, n_distinct, n_opened,
     pages_opened, fresh, jac_sum, best_cover, desc_terms, desc_cons, solution, query,
     draft_len, draft_rep, res_score, res_title, res_cover, res_overlap, res_dmatch, page,
     open_doc) = views  # fmt: skip
    res_docs = work_i[:top_k]  # work arrays of _new_task
    res_hits = work_i[top_k : 2 * top_k]
    cons = work_i[2 * top_k : 2 * top_k + DESC_SLOTS]
    terms = work_i[2 * top_k + DESC_SLOTS : 2 * top_k + 2 * DESC_SLOTS]
    q = work_i[2 * top_k + 2 * DESC_SLOTS : 2 * top_k + 2 * DESC_SLOTS + qm]
    res_s = work_f[:top_k]
    for j in range(envs.shape[0]):
        n = envs[j]
        _new_task(
            n, uniforms[j], p_synonym, p_model, p_detail, n_vague, top_k, qm, scratch, hits,
            touched, res_docs, res_s, res_hits, cons, terms, q,
            kind_start, concept_kind, concept_nforms, concept_term0, entity_category,
            entity_brand, doc_entity, doc_aspect, doc_detail, doc_ptr, doc_wterms, post_ptr,
            post_doc, post_w, post_rank, dcon_ptr, dcon, con_ptr, con_docs,
            target, desc_terms, desc_len, desc_cons, desc_ncons, solution, solution_len,
        )  # fmt: skip
        t[n] = 0
        success[n] = 0
        success_step[n] = 0
        answers_left[n] = max_answers
        n_wrong[n] = 0
        wrong[n, :] = -1
        draft[n, :, :] = -1
        draft_len[n, :] = 0
        draft_rep[n, :] = 0
        draft_sim[n, :] = 0.0
        harvest[n, :] = -1
        harvest_len[n] = 0
        slot_usage[n, :] = 0
        res_tcount[n, :] = 0
        query[n, :] = -1
        query_len[n] = 0
        query_owner[n] = -1
        results[n, :] = -1
        n_results[n] = 0
        res_score[n, :] = 0.0
        res_title[n, :] = 0.0
        res_cover[n, :] = 0.0
        res_overlap[n, :] = 0.0
        res_dmatch[n, :] = 0.0
        log_len[n, :] = 0
        n_issued[n] = 0
        n_distinct[n] = 0
        jac_sum[n] = 0.0
        opened[n, :] = 0
        n_opened[n] = 0
        pages_opened[n] = 0
        best_cover[n] = 0.0
        page[n, :] = 0
        open_doc[n, :] = -1
        surfaced[n, :] = 0
        fresh[n] = NEVER


@njit(cache=True, error_model="numpy", _nrt=False)
def _issue(
    n, q, rewards, weights, version, top_k, n_variants, scratch, hits, touched, res_hits,
    post_ptr, post_doc, post_w, concept_kind, dcon_ptr, dcon, doc_ptr, doc_terms,
    target, desc_terms, desc_len, harvest, desc_cons, desc_ncons, draft, draft_len, log,
    log_len, n_issued, n_distinct, jac_sum, slot_usage, results, n_results, res_score,
    res_title, res_cover, res_overlap, res_dmatch, query, query_len, query_owner, page,
    surfaced, res_tcount,
):  # fmt: skip
    """Querier q issues its draft in env n: logged (repeat penalty, diversity), searched, shown
    on every browser's first page (v1: with each result's description match)."""
    length = draft_len[n, q]
    row = draft[n, q]
    repeat = False
    added = 0.0
    for i in range(n_issued[n]):
        li = log_len[n, i]
        c = _intersect(draft, n, q, length, log, i, li)
        added += 1.0 - c / (length + li - c)
        if c == length and c == li:
            repeat = True
    if repeat:
        rewards[2, q, n] -= weights[W_REPEAT]
    else:
        n_distinct[n] += 1
    m = n_issued[n]
    log[n, m, :] = -1
    for i in range(length):
        log[n, m, i] = row[i]
    log_len[n, m] = length
    n_issued[n] = m + 1
    jac_sum[n] += added
    for i in range(length):
        for j in range(N_SLOTS):
            if _slot_term(n, j, desc_terms, harvest) == row[i]:
                slot_usage[n, j] += 1
    for r in range(n_results[n]):  # per-term counts over the results: the old list out
        d = results[n, r]
        for i in range(doc_ptr[d], doc_ptr[d + 1]):
            res_tcount[n, doc_terms[i]] -= 1
    nr = _search(row, length, post_ptr, post_doc, post_w, scratch, hits, touched, top_k,
                 results[n], res_score[n], res_hits)  # fmt: skip
    n_results[n] = nr
    for r in range(nr):
        d = results[n, r]
        for i in range(doc_ptr[d], doc_ptr[d + 1]):
            res_tcount[n, doc_terms[i]] += 1
    for r in range(nr, top_k):
        results[n, r] = -1
        res_score[n, r] = 0.0
        res_title[n, r] = 0.0
        res_cover[n, r] = 0.0
        res_overlap[n, r] = 0.0
        res_dmatch[n, r] = 0.0
    for r in range(nr):
        d = results[n, r]
        hit, title_hit, title_n = _cover_counts(
            d, n, desc_cons, desc_ncons, concept_kind, dcon_ptr, dcon
        )
        res_cover[n, r] = hit / desc_ncons[n]
        res_title[n, r] = title_hit / title_n if title_n > 0 else 0.0
        res_overlap[n, r] = res_hits[r] / length
        if version >= 1:  # the description's words (as written) in the document
            words = 0
            for i in range(desc_len[n]):
                words += _sorted_has(doc_terms, doc_ptr[d], doc_ptr[d + 1], desc_terms[n, i])
            res_dmatch[n, r] = words / desc_len[n]
    query[n, :] = -1
    for i in range(length):
        query[n, i] = row[i]
    query_len[n] = length
    query_owner[n] = q
    page[n, :] = 0
    _surface(n, 0, q, results, n_results, target, n_variants, surfaced, rewards,
             weights[W_SURFACE])  # fmt: skip


@njit(cache=True, error_model="numpy", _nrt=False)
def _harvest(
    n, d, doc_ptr, doc_wterms, desc_terms, desc_len, harvest, harvest_len, slot_usage, log,
    log_len, n_issued,
):  # fmt: skip
    """The words of document d with the largest BM25 weight, the description's excluded,
    become env n's harvested candidates (with their usage counts)."""
    hl = 0
    for i in range(doc_ptr[d], doc_ptr[d + 1]):
        term = doc_wterms[i]
        in_desc = False
        for j in range(desc_len[n]):
            if desc_terms[n, j] == term:
                in_desc = True
                break
        if in_desc:
            continue
        harvest[n, hl] = term
        slot_usage[n, DESC_SLOTS + hl] = _usage_of(n, term, log, log_len, n_issued)
        hl += 1
        if hl == HARVEST_SLOTS:
            break
    for j in range(hl, HARVEST_SLOTS):
        harvest[n, j] = -1
        slot_usage[n, DESC_SLOTS + j] = 0
    harvest_len[n] = hl


@njit(cache=True, error_model="numpy", _nrt=False)
def _step_kernel(
    actions, active, weights, version, nq, qm, top_k, n_variants, max_cycles, scratch, hits,
    touched, rewards, invalid, terminated, truncated, work_i, work_f,
    CI, COFF, CF, CFOFF, E, EF, DESC, QRY, DQ, RF, BR, draft, draft_sim, harvest, slot_usage,
    results, log, log_len, opened, res_tcount, surfaced, wrong,
):  # fmt: skip
    """One step of every active env (see 'Step order' in the module doc of websearch_v1;
    ``version`` >= 1: the reading reward and the skipped step costs of a failed episode)."""
    corpus = _corpus_views(CI, COFF, CF, CFOFF)
    (kind_start, concept_kind, concept_nforms, concept_term0, term_concept, term_hash, idf,
     df, entity_category, entity_brand, doc_entity, doc_aspect, doc_detail, doc_ptr,
     doc_terms, doc_wterms, post_ptr, post_doc, post_w, post_rank, dcon_ptr, dcon, con_ptr,
     con_docs) = corpus  # fmt: skip
    views = _state_views(E, EF, DESC, QRY, DQ, RF, BR)
    (target, desc_len, desc_ncons, solution_len, t, success, success_step, answers_left,
     n_wrong, harvest_len, query_len, query_owner, n_results, n_issued, n_distinct, n_opened,
     pages_opened, fresh, jac_sum, best_cover, desc_terms, desc_cons, solution, query,
     draft_len, draft_rep, res_score, res_title, res_cover, res_overlap, res_dmatch, page,
     open_doc) = views  # fmt: skip
    n_envs, n_agents = actions.shape
    nb = n_agents - nq
    acts = work_i[:n_agents]
    res_hits = work_i[n_agents : n_agents + top_k]
    changed = work_i[n_agents + top_k : n_agents + top_k + nq]
    for n in range(n_envs):
        for a in range(n_agents):
            rewards[0, a, n] = 0.0
            rewards[1, a, n] = 0.0
            rewards[2, a, n] = 0.0
            invalid[a, n] = 0.0
        if not active[n]:
            continue
        # 1. masked actions become stay (judged on the state at the start of the step)
        for a in range(n_agents):
            act = actions[n, a]
            if not _legal(n, a, act, nq, qm, desc_terms, harvest, draft, draft_len, n_results,
                          page, open_doc, n_wrong, wrong):  # fmt: skip
                act = 0
                invalid[a, n] = 1.0
                rewards[2, a, n] -= weights[W_INVALID]
            acts[a] = act
        # 2. queriers edit their drafts (slots as observed)
        for q in range(nq):
            act = acts[q]
            changed[q] = 0
            if act == Q_CLEAR:
                draft[n, q, :] = -1
                draft_len[n, q] = 0
                changed[q] = 1
            elif act >= Q_TOGGLE0:
                term = _slot_term(n, act - Q_TOGGLE0, desc_terms, harvest)
                draft_len[n, q] = _toggle(draft[n, q], draft_len[n, q], term)
                changed[q] = 1
        # 3. browsers act on the result list as observed
        ended = False
        opener_doc = -1
        for b in range(nb):
            a = nq + b
            act = acts[a]
            if act == B_STAY:
                continue
            if act < B_NEXT:  # open
                d = results[n, page[n, b] * PAGE_SIZE + act - B_OPEN0]
                open_doc[n, b] = d
                pages_opened[n] += 1
                opener_doc = d
                if opened[n, d]:
                    rewards[2, a, n] -= weights[W_REOPEN]
                else:
                    opened[n, d] = 1
                    n_opened[n] += 1
                    hit, _, _ = _cover_counts(
                        d, n, desc_cons, desc_ncons, concept_kind, dcon_ptr, dcon
                    )
                    cover = hit / desc_ncons[n]
                    if version >= 1 and cover > best_cover[n]:  # reading: coverage gained
                        rewards[1, a, n] += weights[W_READ] * (cover - best_cover[n])
                    best_cover[n] = max(best_cover[n], cover)
            elif act == B_NEXT or act == B_PREV:  # noqa: SIM109 (numba)
                page[n, b] += 1 if act == B_NEXT else -1
                _surface(n, page[n, b], a, results, n_results, target, n_variants, surfaced,
                         rewards, weights[W_SURFACE])  # fmt: skip
            else:  # mark the open document as the answer
                d = open_doc[n, b]
                if d == target[n]:
                    success[n] = 1
                    success_step[n] = t[n] + 1
                    if version >= 1:  # the browser that answers right
                        rewards[1, a, n] += weights[W_ANSWER]
                    ended = True
                    break
                wrong[n, n_wrong[n]] = d
                n_wrong[n] += 1
                answers_left[n] -= 1
                rewards[2, a, n] -= weights[W_WRONG]
                if answers_left[n] == 0:
                    ended = True
                    break
        # 4. queriers issue their drafts, in order (the last one's results stay on screen)
        issued = False
        if not ended:
            for q in range(nq):
                if acts[q] == Q_ISSUE:
                    issued = True
                    _issue(
                        n, q, rewards, weights, version, top_k, n_variants, scratch, hits,
                        touched, res_hits, post_ptr, post_doc, post_w, concept_kind, dcon_ptr,
                        dcon, doc_ptr, doc_terms,
                        target, desc_terms, desc_len, harvest, desc_cons, desc_ncons, draft,
                        draft_len, log, log_len, n_issued, n_distinct, jac_sum, slot_usage,
                        results, n_results, res_score, res_title, res_cover, res_overlap,
                        res_dmatch, query, query_len, query_owner, page, surfaced, res_tcount,
                    )  # fmt: skip
        # 5. the last opened document's words become the harvested candidates; caches
        if opener_doc >= 0:
            _harvest(
                n, opener_doc, doc_ptr, doc_wterms, desc_terms, desc_len, harvest, harvest_len,
                slot_usage, log, log_len, n_issued,
            )  # fmt: skip
        for q in range(nq):
            if changed[q] or issued:
                _draft_cache(n, q, draft, draft_len, log, log_len, n_issued, draft_rep, draft_sim)
        # 6. time, step cost, team reward, end
        t[n] += 1
        fresh[n] = 0 if issued else min(fresh[n] + 1, NEVER)
        team = 0.0
        if success[n] == 1 and success_step[n] == t[n]:
            team = weights[W_FOUND] + weights[W_EARLY] * max(max_cycles - t[n], 0) / max_cycles
        for a in range(n_agents):
            rewards[0, a, n] = team
            rewards[2, a, n] -= weights[W_STEP]
        terminated[n] = success[n] == 1 or answers_left[n] == 0
        truncated[n] = (not terminated[n]) and t[n] >= max_cycles
        if version >= 1 and success[n] == 0 and answers_left[n] == 0:
            # a failure that ends the episode costs the steps it skips (as running out of time)
            skipped = max(max_cycles - t[n], 0)
            for a in range(n_agents):
                rewards[2, a, n] -= weights[W_STEP] * skipped


@njit(cache=True, error_model="numpy", _nrt=False)
def _observe_kernel(
    envs, version, nq, qm, top_k, max_cycles, max_answers, idf_max, obs_q, obs_b, mask_q, mask_b,
    work_i, work_f,
    CI, COFF, CF, CFOFF, E, EF, DESC, QRY, DQ, RF, BR, draft, draft_sim, harvest, slot_usage,
    results, log, log_len, opened, res_tcount, surfaced, wrong,
):  # fmt: skip
    """Observations and action masks of envs ``envs`` into rows ``envs`` of the buffers
    (``version`` >= 1: the browsers' description-match features; >= 2: the browser's "my open
    document covers the description")."""
    corpus = _corpus_views(CI, COFF, CF, CFOFF)
    (kind_start, concept_kind, concept_nforms, concept_term0, term_concept, term_hash, idf,
     df, entity_category, entity_brand, doc_entity, doc_aspect, doc_detail, doc_ptr,
     doc_terms, doc_wterms, post_ptr, post_doc, post_w, post_rank, dcon_ptr, dcon, con_ptr,
     con_docs) = corpus  # fmt: skip
    views = _state_views(E, EF, DESC, QRY, DQ, RF, BR)
    (target, desc_len, desc_ncons, solution_len, t, success, success_step, answers_left,
     n_wrong, harvest_len, query_len, query_owner, n_results, n_issued, n_distinct, n_opened,
     pages_opened, fresh, jac_sum, best_cover, desc_terms, desc_cons, solution, query,
     draft_len, draft_rep, res_score, res_title, res_cover, res_overlap, res_dmatch, page,
     open_doc) = views  # fmt: skip
    nb = obs_b.shape[0]
    open_cover = work_f[:nb]
    open_title = work_f[nb : 2 * nb]
    b_global = _browser_global(version)
    b_features = _browser_result_features(version)
    for j in range(envs.shape[0]):
        n = envs[j]
        nr = n_results[n]
        time_left = max(max_cycles - t[n], 0) / max_cycles
        issued_f = min(n_issued[n] / 10.0, 1.0)
        diversity = n_distinct[n] / n_issued[n] if n_issued[n] > 0 else 0.0
        fresh_f = min(fresh[n], 10) / 10.0
        answers_f = answers_left[n] / max_answers
        n_open_res = 0
        best_title = 0.0
        best_title_new = 0.0
        for r in range(nr):
            best_title = max(best_title, res_title[n, r])
            if opened[n, results[n, r]]:
                n_open_res += 1
            else:
                best_title_new = max(best_title_new, res_title[n, r])
        found = 0.0
        for b in range(nb):
            d = open_doc[n, b]
            open_cover[b] = 0.0
            open_title[b] = 0.0
            if d >= 0:
                hit, title_hit, title_n = _cover_counts(
                    d, n, desc_cons, desc_ncons, concept_kind, dcon_ptr, dcon
                )
                open_cover[b] = hit / desc_ncons[n]
                open_title[b] = title_hit / title_n if title_n > 0 else 0.0
                if hit == desc_ncons[n]:
                    found = 1.0
        # ---- queriers
        for q in range(nq):
            out = obs_q[q, n]
            out[:] = 0.0
            length = draft_len[n, q]
            out[0] = time_left
            out[1] = length / qm
            out[2] = draft_rep[n, q]
            out[3] = draft_sim[n, q]
            out[4] = issued_f
            out[5] = diversity
            out[6] = nr / top_k
            out[7] = n_open_res / nr if nr > 0 else 0.0
            out[8] = best_title
            out[9] = best_title_new
            out[10] = best_cover[n]
            out[11] = fresh_f
            out[12] = 1.0 if query_owner[n] == q else 0.0
            same = query_len[n] == length and length > 0
            if same:
                for i in range(length):
                    if query[n, i] != draft[n, q, i]:
                        same = False
                        break
            out[13] = 1.0 if same else 0.0
            out[14] = found
            out[15] = answers_f
            for s in range(N_SLOTS):
                term = _slot_term(n, s, desc_terms, harvest)
                if term < 0:
                    continue
                base = Q_GLOBAL + s * Q_SLOT_FEATURES
                out[base] = 1.0
                out[base + 1] = 1.0 if _draft_has(draft, n, q, length, term) else 0.0
                out[base + 2] = 1.0 if _row_has(query, n, query_len[n], term) else 0.0
                c = term_concept[term]
                if s < DESC_SLOTS:
                    out[base + 3] = 1.0 if concept_kind[c] != KIND_NOISE else 0.0
                else:
                    out[base + 4] = 1.0
                    for i in range(desc_ncons[n]):
                        if desc_cons[n, i] == c:
                            out[base + 3] = 1.0
                out[base + 5] = idf[term] / idf_max
                out[base + 6] = 1.0 if df[term] > 0 else 0.0
                out[base + 7] = min(slot_usage[n, s], 3) / 3.0
                out[base + 8] = res_tcount[n, term] / nr if nr > 0 else 0.0
            hbase = Q_GLOBAL + N_SLOTS * Q_SLOT_FEATURES
            for i in range(desc_len[n]):
                out[hbase + term_hash[desc_terms[n, i]]] += 1.0 / DESC_SLOTS
            for i in range(length):
                out[hbase + HASH_DIM + term_hash[draft[n, q, i]]] += 1.0 / qm
            # action mask (the same rules as _legal, written out for speed; tests compare)
            mask = mask_q[q, n]
            mask[Q_STAY] = 1
            mask[Q_ISSUE] = 1 if length > 0 else 0
            mask[Q_CLEAR] = 1 if length > 0 else 0
            for s in range(N_SLOTS):
                base = Q_GLOBAL + s * Q_SLOT_FEATURES
                legal = out[base] == 1.0 and (length < qm or out[base + 1] == 1.0)
                mask[Q_TOGGLE0 + s] = 1 if legal else 0
        # ---- browsers
        n_pages = (nr + PAGE_SIZE - 1) // PAGE_SIZE
        top = res_score[n, 0] if nr > 0 else 1.0
        for b in range(nb):
            out = obs_b[b, n]
            out[:] = 0.0
            p = page[n, b]
            d_open = open_doc[n, b]
            out[0] = time_left
            out[1] = p / (n_pages - 1) if n_pages > 1 else 0.0
            out[2] = 1.0 if (p + 1) * PAGE_SIZE < nr else 0.0
            out[3] = 1.0 if p > 0 else 0.0
            out[4] = nr / top_k
            out[5] = fresh_f
            out[6] = issued_f
            out[7] = answers_f
            if d_open >= 0:
                out[8] = 1.0
                out[9] = open_cover[b]
                out[10] = open_title[b]
                for i in range(n_wrong[n]):
                    if wrong[n, i] == d_open:
                        out[11] = 1.0
            for r in range(nr):
                if opened[n, results[n, r]]:
                    continue
                if r < p * PAGE_SIZE:
                    out[12] = max(out[12], res_title[n, r])
                elif r >= (p + 1) * PAGE_SIZE:
                    out[13] = max(out[13], res_title[n, r])
            if nb > 1:
                same_page = 0
                for other in range(nb):
                    if other != b and page[n, other] == p:
                        same_page += 1
                out[14] = same_page / (nb - 1)
            out[15] = best_cover[n]
            if version >= 1:
                for r in range(nr):
                    if opened[n, results[n, r]]:
                        continue
                    if r < p * PAGE_SIZE:
                        out[16] = max(out[16], res_dmatch[n, r])
                    elif r >= (p + 1) * PAGE_SIZE:
                        out[17] = max(out[17], res_dmatch[n, r])
            if version >= 2 and d_open >= 0 and open_cover[b] == 1.0:
                out[18] = 1.0  # my open document covers the description: it is the target
            for k in range(PAGE_SIZE):
                r = p * PAGE_SIZE + k
                if r >= nr:
                    break
                d = results[n, r]
                base = b_global + k * b_features
                out[base] = 1.0
                out[base + 1] = r / top_k
                out[base + 2] = res_score[n, r] / top
                out[base + 3] = res_overlap[n, r]
                out[base + 4] = res_title[n, r]
                out[base + 5] = 1.0 if opened[n, d] else 0.0
                out[base + 6] = 1.0 if d == d_open else 0.0
                for other in range(nb):
                    if other != b and open_doc[n, other] == d:
                        out[base + 7] = 1.0
                if version >= 1:
                    out[base + 8] = res_dmatch[n, r]
            mask = mask_b[b, n]
            mask[B_STAY] = 1
            for k in range(PAGE_SIZE):
                mask[B_OPEN0 + k] = 1 if p * PAGE_SIZE + k < nr else 0
            mask[B_NEXT] = 1 if (p + 1) * PAGE_SIZE < nr else 0
            mask[B_PREV] = 1 if p > 0 else 0
            mask[B_MARK] = 1 if d_open >= 0 and out[11] == 0.0 else 0


@njit(cache=True, error_model="numpy", _nrt=False)
def _state_kernel(
    envs, nq, qm, top_k, max_cycles, max_answers, out,
    CI, COFF, CF, CFOFF, E, EF, DESC, QRY, DQ, RF, BR, draft, draft_sim, harvest, slot_usage,
    results, log, log_len, opened, res_tcount, surfaced, wrong,
):  # fmt: skip
    """Global state rows ``out[j]`` for envs ``envs[j]`` (see the module doc)."""
    corpus = _corpus_views(CI, COFF, CF, CFOFF)
    (kind_start, concept_kind, concept_nforms, concept_term0, term_concept, term_hash, idf,
     df, entity_category, entity_brand, doc_entity, doc_aspect, doc_detail, doc_ptr,
     doc_terms, doc_wterms, post_ptr, post_doc, post_w, post_rank, dcon_ptr, dcon, con_ptr,
     con_docs) = corpus  # fmt: skip
    views = _state_views(E, EF, DESC, QRY, DQ, RF, BR)
    (target, desc_len, desc_ncons, solution_len, t, success, success_step, answers_left,
     n_wrong, harvest_len, query_len, query_owner, n_results, n_issued, n_distinct, n_opened,
     pages_opened, fresh, jac_sum, best_cover, desc_terms, desc_cons, solution, query,
     draft_len, draft_rep, res_score, res_title, res_cover, res_overlap, res_dmatch, page,
     open_doc) = views  # fmt: skip
    nb = page.shape[1]
    per_querier = S_QUERIER_GLOBAL + S_SLOT_FEATURES * N_SLOTS
    for j in range(envs.shape[0]):
        n = envs[j]
        row = out[j]
        row[:] = 0.0
        nr = n_results[n]
        tgt = target[n]
        rank = -1
        for r in range(nr):
            if results[n, r] == tgt:
                rank = r
        row[0] = max(max_cycles - t[n], 0) / max_cycles
        row[1] = answers_left[n] / max_answers
        row[2] = success[n]
        row[3] = min(fresh[n], 10) / 10.0
        row[4] = min(n_issued[n] / 10.0, 1.0)
        row[5] = n_distinct[n] / n_issued[n] if n_issued[n] > 0 else 0.0
        row[6] = nr / top_k
        row[7] = 1.0 if rank >= 0 else 0.0
        row[8] = rank / top_k if rank >= 0 else 1.0
        row[9] = 1.0 if opened[n, tgt] else 0.0
        row[10] = best_cover[n]
        base = S_GLOBAL
        top = res_score[n, 0] if nr > 0 else 1.0
        for r in range(nr):
            d = results[n, r]
            o = base + r * S_RESULT_FEATURES
            row[o] = 1.0
            row[o + 1] = res_score[n, r] / top
            row[o + 2] = res_title[n, r]
            row[o + 3] = res_cover[n, r]
            row[o + 4] = 1.0 if opened[n, d] else 0.0
            row[o + 5] = 1.0 if d == tgt else 0.0
        base += top_k * S_RESULT_FEATURES
        n_pages = (nr + PAGE_SIZE - 1) // PAGE_SIZE
        for b in range(nb):
            o = base + b * S_BROWSER_FEATURES
            p = page[n, b]
            d = open_doc[n, b]
            row[o] = p / (n_pages - 1) if n_pages > 1 else 0.0
            if d >= 0:
                hit, _, _ = _cover_counts(d, n, desc_cons, desc_ncons, concept_kind, dcon_ptr, dcon)
                row[o + 1] = 1.0
                row[o + 2] = hit / desc_ncons[n]
                row[o + 3] = 1.0 if d == tgt else 0.0
            if rank >= 0 and rank // PAGE_SIZE == p:
                row[o + 4] = 1.0
        base += nb * S_BROWSER_FEATURES
        lo, hi = doc_ptr[tgt], doc_ptr[tgt + 1]
        for q in range(nq):
            o = base + q * per_querier
            length = draft_len[n, q]
            row[o] = length / qm
            row[o + 1] = draft_rep[n, q]
            row[o + 2] = draft_sim[n, q]
            for s in range(N_SLOTS):
                term = _slot_term(n, s, desc_terms, harvest)
                if term < 0:
                    continue
                so = o + S_QUERIER_GLOBAL + s * S_SLOT_FEATURES
                row[so] = 1.0
                row[so + 1] = 1.0 if _draft_has(draft, n, q, length, term) else 0.0
                row[so + 2] = 1.0 if _sorted_has(doc_terms, lo, hi, term) else 0.0
                row[so + 3] = 1.0 if _row_has(solution, n, solution_len[n], term) else 0.0
        base += nq * per_querier
        for i in range(desc_len[n]):
            row[base + term_hash[desc_terms[n, i]]] += 1.0 / DESC_SLOTS
        for i in range(query_len[n]):
            row[base + HASH_DIM + term_hash[query[n, i]]] += 1.0 / qm


METRIC_NAMES = (
    "success",
    "solved",
    "steps_to_success",
    "queries_issued",
    "query_diversity",
    "query_jaccard_diversity",
    "pages_opened",
    "episode_length",
)


@njit(cache=True, error_model="numpy", _nrt=False)
def _metrics_kernel(max_cycles, success, success_step, n_issued, n_distinct, jac_sum,
                    pages_opened, t, out):  # fmt: skip
    """The episode metrics of every env, rows in ``METRIC_NAMES`` order: success (and solved,
    the same: one target), steps to success (``max_cycles`` while not solved), queries issued,
    distinct / issued (0 before any), the mean pairwise Jaccard distance between the issued
    queries (0 for fewer than two), documents opened, steps so far."""
    for n in range(out.shape[1]):
        issued = n_issued[n]
        out[0, n] = success[n]
        out[1, n] = success[n]
        out[2, n] = success_step[n] if success[n] == 1 else max_cycles
        out[3, n] = issued
        out[4, n] = n_distinct[n] / issued if issued > 0 else 0.0
        out[5, n] = jac_sum[n] / (issued * (issued - 1) / 2) if issued > 1 else 0.0
        out[6, n] = pages_opened[n]
        out[7, n] = t[n]


# ============================================================================================
# The batched episodes
# ============================================================================================

#: the corpus arrays the kernels read, in the order :func:`_corpus_views` returns them
CORPUS_KERNEL_FIELDS = (
    "kind_start", "concept_kind", "concept_nforms", "concept_term0", "term_concept", "term_hash",
    "idf", "df", "entity_category", "entity_brand", "doc_entity", "doc_aspect", "doc_detail",
    "doc_ptr", "doc_terms", "doc_wterms", "post_ptr", "post_doc", "post_w", "post_rank",
    "dcon_ptr", "dcon", "con_ptr", "con_docs",
)  # fmt: skip
#: the int64 ones, packed in one buffer (the rest, float64, in another)
CORPUS_INT_FIELDS = tuple(f for f in CORPUS_KERNEL_FIELDS if f not in ("idf", "post_w"))
#: the episode arrays packed in bundles: bundle -> (dtype, fields); each field is a view
BUNDLES: dict[str, tuple[type, tuple[str, ...]]] = {
    "E": (
        np.int64,
        (
            "target",
            "desc_len",
            "desc_ncons",
            "solution_len",
            "t",
            "success",
            "success_step",
            "answers_left",
            "n_wrong",
            "harvest_len",
            "query_len",
            "query_owner",
            "n_results",
            "n_issued",
            "n_distinct",
            "n_opened",
            "pages_opened",
            "fresh",
        ),
    ),
    "EF": (np.float64, ("jac_sum", "best_cover")),
    "DESC": (np.int64, ("desc_terms", "desc_cons")),
    "QRY": (np.int64, ("solution", "query")),
    "DQ": (np.int64, ("draft_len", "draft_rep")),
    "RF": (np.float64, ("res_score", "res_title", "res_cover", "res_overlap", "res_dmatch")),
    "BR": (np.int64, ("page", "open_doc")),
}
#: the episode arrays passed to the kernels on their own, after the bundles
STANDALONE_FIELDS = (
    "draft", "draft_sim", "harvest", "slot_usage", "results", "log", "log_len", "opened",
    "res_tcount", "surfaced", "wrong",
)  # fmt: skip


class WebSearchCore:
    """``num_envs`` websearch episodes as arrays with a leading env axis, over one shared
    read-only :class:`Corpus`.

    Per env n (Q queriers, B browsers, K = top_k, QM = max_query_terms, L = log capacity):
    the task ``target`` [N], ``desc_terms`` [N, DESC_SLOTS] (-1 padded) with ``desc_len``,
    the description's content concepts ``desc_cons`` (ascending) with ``desc_ncons``, the
    privileged ``solution`` query [N, QM] with ``solution_len``; the drafts ``draft``
    [N, Q, QM] (ascending, -1 padded) with ``draft_len``, ``draft_rep``, ``draft_sim``; the
    harvested terms ``harvest`` [N, HARVEST_SLOTS]; per candidate slot ``slot_usage`` (issued
    queries containing its term); per term ``res_tcount`` (results containing it);
    the query on screen ``query`` with ``query_len``, ``query_owner`` and its ``results``
    [N, K] (``n_results``, ``res_score``, ``res_title``, ``res_cover``, ``res_overlap``,
    ``res_dmatch``: v1's description match, 0 in v0); the
    issued queries ``log`` [N, L, QM] with ``log_len``, ``n_issued``, ``n_distinct``,
    ``jac_sum`` (sum of pairwise Jaccard distances); ``opened`` [N, n_docs] with ``n_opened``,
    ``pages_opened``, ``best_cover``; per browser ``page``, ``open_doc``; ``surfaced``
    [N, n_variants] (relevant documents shown); ``t``, ``success``, ``success_step``,
    ``answers_left``, ``wrong`` (documents marked wrongly) with ``n_wrong``, ``fresh`` (steps
    since the result list changed).
    """

    def __init__(self, config: WebSearchConfig, num_envs: int) -> None:
        if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)):
            raise ArgumentTypeError(f"num_envs must be an int, got {type(num_envs).__name__}")
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.config = config
        self.corpus = build_corpus(config)
        self.num_envs = n = int(num_envs)
        nq, nb, k, qm = config.n_queriers, config.n_browsers, config.top_k, config.max_query_terms
        i64, f64 = np.int64, np.float64
        self.target = np.zeros(n, dtype=i64)
        self.desc_terms = np.full((n, DESC_SLOTS), -1, dtype=i64)
        self.desc_len = np.zeros(n, dtype=i64)
        self.desc_cons = np.full((n, DESC_SLOTS), -1, dtype=i64)
        self.desc_ncons = np.ones(n, dtype=i64)
        self.solution = np.full((n, qm), -1, dtype=i64)
        self.solution_len = np.zeros(n, dtype=i64)
        self.t = np.zeros(n, dtype=i64)
        self.success = np.zeros(n, dtype=i64)
        self.success_step = np.zeros(n, dtype=i64)
        self.answers_left = np.full(n, config.max_answers, dtype=i64)
        self.n_wrong = np.zeros(n, dtype=i64)
        self.wrong = np.full((n, config.max_answers), -1, dtype=i64)
        self.draft = np.full((n, nq, qm), -1, dtype=i64)
        self.draft_len = np.zeros((n, nq), dtype=i64)
        self.draft_rep = np.zeros((n, nq), dtype=i64)
        self.draft_sim = np.zeros((n, nq), dtype=f64)
        self.harvest = np.full((n, HARVEST_SLOTS), -1, dtype=i64)
        self.harvest_len = np.zeros(n, dtype=i64)
        self.slot_usage = np.zeros((n, N_SLOTS), dtype=i64)
        self.res_tcount = np.zeros((n, self.corpus.n_terms), dtype=np.int32)
        self.query = np.full((n, qm), -1, dtype=i64)
        self.query_len = np.zeros(n, dtype=i64)
        self.query_owner = np.full(n, -1, dtype=i64)
        self.results = np.full((n, k), -1, dtype=i64)
        self.n_results = np.zeros(n, dtype=i64)
        self.res_score = np.zeros((n, k), dtype=f64)
        self.res_title = np.zeros((n, k), dtype=f64)
        self.res_cover = np.zeros((n, k), dtype=f64)
        self.res_overlap = np.zeros((n, k), dtype=f64)
        self.res_dmatch = np.zeros((n, k), dtype=f64)
        cap = max(config.max_cycles * nq, 8)
        self.log = np.full((n, cap, qm), -1, dtype=i64)
        self.log_len = np.zeros((n, cap), dtype=i64)
        self.n_issued = np.zeros(n, dtype=i64)
        self.n_distinct = np.zeros(n, dtype=i64)
        self.jac_sum = np.zeros(n, dtype=f64)
        self.opened = np.zeros((n, self.corpus.n_docs), dtype=np.uint8)
        self.n_opened = np.zeros(n, dtype=i64)
        self.pages_opened = np.zeros(n, dtype=i64)
        self.best_cover = np.zeros(n, dtype=f64)
        self.page = np.zeros((n, nb), dtype=i64)
        self.open_doc = np.full((n, nb), -1, dtype=i64)
        self.surfaced = np.zeros((n, config.n_variants), dtype=np.uint8)
        self.fresh = np.full(n, NEVER, dtype=i64)
        self.all_envs = np.arange(n, dtype=i64)
        self._weights = config.weights()
        self._scratch = np.zeros(self.corpus.n_docs, dtype=f64)
        self._hits = np.zeros(self.corpus.n_docs, dtype=i64)
        # work arrays of the kernels (they run without numba's allocator and refcounts)
        self._work_i = np.zeros(3 * k + 2 * DESC_SLOTS + qm + config.n_agents + nq, dtype=i64)
        self._work_f = np.zeros(k + 2 * nb, dtype=f64)
        # per env: uniforms drawn ahead from its generator (see reset_envs)
        self._ubuf = np.zeros((n, UNIFORM_BLOCK, TASK_UNIFORMS), dtype=f64)
        self._upos = np.zeros(n, dtype=i64)
        self._urng: list[np.random.Generator | None] = [None] * n
        self._touched = np.zeros(self.corpus.n_docs, dtype=i64)
        # pack the bundles; the attributes above become views of them
        self._bundles = {}
        for bundle, (dtype, fields) in BUNDLES.items():
            packed = np.stack([getattr(self, f) for f in fields]).astype(dtype)
            self._bundles[bundle] = packed
            for i, f in enumerate(fields):
                setattr(self, f, packed[i])

    @property
    def _args(self) -> tuple[np.ndarray, ...]:
        """The arrays every kernel takes last: the packed corpus, the bundles, the rest."""
        c = self.corpus
        return (
            (c.packed_int, c.packed_int_offsets, c.packed_float, c.packed_float_offsets)
            + tuple(self._bundles.values())
            + tuple(getattr(self, f) for f in STANDALONE_FIELDS)
        )

    # ---- episode start -------------------------------------------------------------------
    def reset_envs(self, envs: np.ndarray, rngs: Sequence[np.random.Generator]) -> None:
        """Start a new episode in each env ``envs[j]``, its task drawn from ``rngs[j]``: the
        next ``TASK_UNIFORMS`` uniforms of its stream (drawn ``UNIFORM_BLOCK`` episodes at a
        time, the same numbers as one ``rng.random(TASK_UNIFORMS)`` per episode; a new
        generator for an env discards what was drawn from the old one)."""
        cfg = self.config
        envs = np.asarray(envs, dtype=np.int64)
        for j, n in enumerate(envs.tolist()):
            if self._urng[n] is not rngs[j] or self._upos[n] == UNIFORM_BLOCK:
                self._ubuf[n] = rngs[j].random((UNIFORM_BLOCK, TASK_UNIFORMS))
                self._urng[n] = rngs[j]
                self._upos[n] = 0
        uniforms = self._ubuf[envs, self._upos[envs]]
        self._upos[envs] += 1
        _reset_kernel(
            envs, uniforms, cfg.p_synonym, cfg.p_model, cfg.p_detail, cfg.n_vague, cfg.top_k,
            cfg.max_query_terms, cfg.max_answers, self._scratch, self._hits, self._touched,
            self._work_i, self._work_f, *self._args,
        )  # fmt: skip

    # ---- dynamics ------------------------------------------------------------------------
    def _ensure_log_capacity(self) -> None:
        need = int(self.n_issued.max(initial=0)) + self.config.n_queriers
        cap = self.log.shape[1]
        if need > cap:
            new = max(2 * cap, need)
            log = np.full((self.num_envs, new, self.config.max_query_terms), -1, dtype=np.int64)
            log[:, :cap] = self.log
            log_len = np.zeros((self.num_envs, new), dtype=np.int64)
            log_len[:, :cap] = self.log_len
            self.log, self.log_len = log, log_len

    def step(
        self, actions: np.ndarray, active: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Advance the envs where ``active`` [N] is true by ``actions`` [N, A] (int64, in
        range for each agent's action space).

        Returns ``rewards`` float64 [3, A, N] (team, individual, penalty; zero where not
        active), ``invalid`` float64 [A, N], ``terminated`` bool [N], ``truncated`` bool [N]
        (False where not active).
        """
        cfg = self.config
        n, a = self.num_envs, cfg.n_agents
        self._ensure_log_capacity()
        rewards = np.empty((3, a, n), dtype=np.float64)
        invalid = np.empty((a, n), dtype=np.float64)
        terminated = np.zeros(n, dtype=np.bool_)
        truncated = np.zeros(n, dtype=np.bool_)
        _step_kernel(
            actions, active, self._weights, cfg.version, cfg.n_queriers, cfg.max_query_terms,
            cfg.top_k, cfg.n_variants, cfg.max_cycles, self._scratch, self._hits, self._touched,
            rewards, invalid, terminated, truncated, self._work_i, self._work_f, *self._args,
        )  # fmt: skip
        return rewards, invalid, terminated, truncated

    def _legal_args(self) -> tuple:
        cfg = self.config
        return (
            cfg.n_queriers, cfg.max_query_terms, self.desc_terms, self.harvest, self.draft,
            self.draft_len, self.n_results, self.page, self.open_doc, self.n_wrong, self.wrong,
        )  # fmt: skip

    def legal_action(self, env: int, agent: int, action: int) -> bool:
        """Whether ``action`` (in range) is legal (unmasked) for ``agent`` in env ``env``."""
        return bool(_legal(int(env), int(agent), int(action), *self._legal_args()))

    def legal_actions(self, actions: np.ndarray, active: np.ndarray) -> np.ndarray:
        """bool [N, A]: whether each of ``actions`` [N, A] is legal now (True where not
        ``active``)."""
        out = np.empty(actions.shape, dtype=np.bool_)
        _legal_matrix(actions, active, *self._legal_args(), out)
        return out

    # ---- views ---------------------------------------------------------------------------
    def new_obs_buffers(self, rows: int | None = None) -> tuple[np.ndarray, ...]:
        """Empty ``(obs_querier [Q, R, Dq], obs_browser [B, R, Db], mask_querier [Q, R, Aq],
        mask_browser [B, R, Ab])`` for ``rows`` envs (default: all)."""
        cfg = self.config
        rows = self.num_envs if rows is None else rows
        return (
            np.empty((cfg.n_queriers, rows, cfg.obs_dim_querier), dtype=np.float32),
            np.empty((cfg.n_browsers, rows, cfg.obs_dim_browser), dtype=np.float32),
            np.empty((cfg.n_queriers, rows, N_ACTIONS_QUERIER), dtype=np.int8),
            np.empty((cfg.n_browsers, rows, N_ACTIONS_BROWSER), dtype=np.int8),
        )

    def observe_into(self, envs: np.ndarray, buffers: tuple[np.ndarray, ...]) -> None:
        """Write observations/masks of ``envs`` into rows ``envs`` of ``buffers``."""
        cfg = self.config
        _observe_kernel(
            np.asarray(envs, dtype=np.int64), cfg.version, cfg.n_queriers, cfg.max_query_terms,
            cfg.top_k, cfg.max_cycles, cfg.max_answers, self.corpus.idf_max, *buffers,
            self._work_i, self._work_f, *self._args,
        )  # fmt: skip

    def state(self, envs: np.ndarray | None = None) -> np.ndarray:
        """Global state float32 [len(envs), state_dim] (default: all envs)."""
        cfg = self.config
        envs = self.all_envs if envs is None else np.asarray(envs, dtype=np.int64)
        out = np.empty((envs.shape[0], cfg.state_dim), dtype=np.float32)
        _state_kernel(
            envs, cfg.n_queriers, cfg.max_query_terms, cfg.top_k, cfg.max_cycles,
            cfg.max_answers, out, *self._args,
        )  # fmt: skip
        return out

    def metrics(self) -> dict[str, np.ndarray]:
        """Episode metrics so far, float64 [N] each (the one place they are computed; see
        :func:`_metrics_kernel`), keyed by ``METRIC_NAMES``; fresh arrays each call."""
        out = np.empty((len(METRIC_NAMES), self.num_envs), dtype=np.float64)
        _metrics_kernel(
            self.config.max_cycles, self.success, self.success_step, self.n_issued,
            self.n_distinct, self.jac_sum, self.pages_opened, self.t, out,
        )  # fmt: skip
        return dict(zip(METRIC_NAMES, out, strict=True))

    def queries(self, env: int) -> list[frozenset[int]]:
        """The queries issued in env ``env``'s episode so far, in order (term-id sets)."""
        return [
            frozenset(self.log[env, i, : self.log_len[env, i]].tolist())
            for i in range(int(self.n_issued[env]))
        ]

    def nbytes(self) -> int:
        """Bytes held by the episode arrays (the shared corpus not included)."""
        return sum(v.nbytes for v in vars(self).values() if isinstance(v, np.ndarray))
