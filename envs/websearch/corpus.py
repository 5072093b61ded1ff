"""The web of websearch: the procedurally generated corpus with its BM25 index
(:func:`build_corpus`, a pure function of the corpus arguments and ``corpus_seed``, cached and
shared read-only by all envs) and the search kernels on it (:func:`_search`: the BM25 top-k
of a query; binary searches in the sorted index arrays).

The kernels read the corpus as two packed buffers (int64 and float64, ``CORPUS_KERNEL_FIELDS``)
unpacked into named views by :func:`_corpus_views`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np
from numba import njit

from envs.websearch.config import CORPUS_FIELDS, HASH_DIM, WebSearchConfig

BM25_K1 = 1.2
BM25_B = 0.75

# concept kinds and their number of word forms (form 0 canonical, the others synonyms)
KIND_CATEGORY, KIND_BRAND, KIND_MODEL, KIND_ATTRIBUTE, KIND_ASPECT, KIND_DETAIL, KIND_NOISE = range(
    7
)
KIND_NAMES = ("cat", "brand", "model", "attr", "aspect", "detail", "w")
KIND_FORMS = (3, 2, 1, 3, 3, 2, 1)
ASPECT_CONCEPTS = 2  # concepts per aspect ("review": review, rating)

#: the corpus arrays the kernels read, in the order :func:`_corpus_views` returns them
CORPUS_KERNEL_FIELDS = (
    "kind_start", "concept_kind", "concept_nforms", "concept_term0", "term_concept", "term_hash",
    "idf", "df", "entity_category", "entity_brand", "doc_entity", "doc_aspect", "doc_detail",
    "doc_ptr", "doc_terms", "doc_wterms", "post_ptr", "post_doc", "post_w", "post_rank",
    "dcon_ptr", "dcon", "con_ptr", "con_docs",
)  # fmt: skip
#: the int64 ones, packed in one buffer (the rest, float64, in another)
CORPUS_INT_FIELDS = tuple(f for f in CORPUS_KERNEL_FIELDS if f not in ("idf", "post_w"))


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
    """The corpus of the corpus arguments ``key`` (``CORPUS_FIELDS`` order): the vocabulary,
    the documents and their bags of words, the BM25 and concept indexes, then the kernels'
    packed buffers. The helpers draw from ``corpus_seed``'s generator in this order."""
    p = dict(zip(CORPUS_FIELDS, key, strict=True))
    rng = np.random.default_rng(p["corpus_seed"])
    vocab = _vocabulary(p)
    n_concepts = int(vocab["kind_start"][-1])
    n_terms = int(vocab["concept_nforms"].sum())
    docs = _documents(p, rng)
    n_docs = docs["doc_entity"].size
    bags = _bags_of_words(p, rng, vocab, docs, n_terms)
    avgdl, idf_max, bm25 = _bm25_index(n_docs, n_terms, bags)
    concepts = _concept_index(
        n_docs, n_concepts, vocab["term_concept"], vocab["concept_kind"], bags
    )
    arrays = dict(
        **vocab,
        entity_category=docs["entity_category"].astype(np.int64),
        entity_brand=docs["entity_brand"].astype(np.int64),
        entity_attributes=docs["entity_attributes"].astype(np.int64),
        doc_entity=docs["doc_entity"].astype(np.int64),
        doc_aspect=docs["doc_aspect"].astype(np.int64),
        doc_variant=docs["doc_variant"].astype(np.int64),
        doc_detail=docs["doc_detail"].astype(np.int64),
        doc_ptr=bags["doc_ptr"].astype(np.int64),
        doc_terms=bags["doc_terms"].astype(np.int64),
        doc_tf=bags["doc_tf"],
        doc_wterms=bm25["doc_wterms"].astype(np.int64),
        doc_len=bags["doc_len"],
        df=bm25["df"],
        idf=bm25["idf"],
        post_ptr=bm25["post_ptr"].astype(np.int64),
        post_doc=bm25["post_doc"].astype(np.int64),
        post_w=bm25["post_w"],
        post_rank=bm25["post_rank"].astype(np.int64),
        **{name: value.astype(np.int64) for name, value in concepts.items()},
    )
    _pack_kernel_arrays(arrays)
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


def _vocabulary(p: dict[str, Any]) -> dict[str, np.ndarray]:
    """The concepts laid out by kind and their word forms (terms), no draws: ``kind_start``
    [8], ``concept_kind``/``concept_nforms``/``concept_term0`` [n_concepts], ``term_concept``
    and ``term_hash`` (the term's feature-hash bucket) [n_terms]."""
    counts = [
        p["n_categories"],
        p["n_brands"],
        p["n_entities"],
        p["n_attributes"],
        p["n_aspects"] * ASPECT_CONCEPTS,
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
    return dict(
        concept_kind=concept_kind,
        concept_nforms=concept_nforms,
        concept_term0=concept_term0,
        term_concept=term_concept,
        term_hash=term_hash,
        kind_start=kind_start,
    )


def _documents(p: dict[str, Any], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The entities (drawn ``entity_category``/``entity_brand`` [n_entities], and
    ``entity_attributes`` [n_entities, attributes_per_entity]) and the documents' ``doc_entity``,
    ``doc_aspect``, ``doc_variant`` and drawn ``doc_detail`` [n_docs] (distinct among the
    variants of an entity's aspect), ``d = (entity * n_aspects + aspect) * n_variants +
    variant``."""
    n_ent, n_asp, n_var = p["n_entities"], p["n_aspects"], p["n_variants"]
    entity_category = rng.integers(0, p["n_categories"], n_ent)
    entity_brand = rng.integers(0, p["n_brands"], n_ent)
    entity_attributes = np.argsort(rng.random((n_ent, p["n_attributes"])), axis=1)[
        :, : p["attributes_per_entity"]
    ]
    doc_ids = np.arange(n_ent * n_asp * n_var)
    details = np.argsort(rng.random((n_ent * n_asp, p["n_details"])), axis=1)[:, :n_var]
    return dict(
        entity_category=entity_category,
        entity_brand=entity_brand,
        entity_attributes=entity_attributes,
        doc_entity=doc_ids // (n_asp * n_var),
        doc_aspect=(doc_ids // n_var) % n_asp,
        doc_variant=doc_ids % n_var,
        doc_detail=details.reshape(-1),
    )


def _content_slots(
    p: dict[str, Any], rng: np.random.Generator, kind_start: np.ndarray, docs: dict[str, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """Each document's content concepts and their drawn term frequencies, both [n_docs,
    slots]: category, brand, model, the entity's attributes (each present with probability
    0.8), the aspect's concepts, the detail."""
    ape = p["attributes_per_entity"]
    doc_entity, n_docs = docs["doc_entity"], docs["doc_entity"].size
    slots = 3 + ape + ASPECT_CONCEPTS + 1
    concepts = np.empty((n_docs, slots), dtype=np.int64)
    concepts[:, 0] = kind_start[KIND_CATEGORY] + docs["entity_category"][doc_entity]
    concepts[:, 1] = kind_start[KIND_BRAND] + docs["entity_brand"][doc_entity]
    concepts[:, 2] = kind_start[KIND_MODEL] + doc_entity
    concepts[:, 3 : 3 + ape] = kind_start[KIND_ATTRIBUTE] + docs["entity_attributes"][doc_entity]
    for j in range(ASPECT_CONCEPTS):
        concepts[:, 3 + ape + j] = (
            kind_start[KIND_ASPECT] + docs["doc_aspect"] * ASPECT_CONCEPTS + j
        )
    concepts[:, -1] = kind_start[KIND_DETAIL] + docs["doc_detail"]
    tf = np.empty((n_docs, slots), dtype=np.int64)
    tf[:, 0] = 1 + (rng.random(n_docs) < 0.4)
    tf[:, 1] = rng.integers(1, 4, n_docs)
    tf[:, 2] = rng.integers(1, 4, n_docs)
    present = rng.random((n_docs, ape)) < 0.8
    tf[:, 3 : 3 + ape] = present * (1 + (rng.random((n_docs, ape)) < 0.3))
    tf[:, 3 + ape : 3 + ape + ASPECT_CONCEPTS] = rng.integers(1, 4, (n_docs, ASPECT_CONCEPTS))
    tf[:, -1] = rng.integers(1, 3, n_docs)
    return concepts, tf


def _bags_of_words(
    p: dict[str, Any],
    rng: np.random.Generator,
    vocab: dict[str, np.ndarray],
    docs: dict[str, np.ndarray],
    n_terms: int,
) -> dict[str, np.ndarray]:
    """Each document's bag of words: its content concepts' occurrences (:func:`_content_slots`),
    each under a drawn word form (canonical with probability ``p_canonical``, else a uniform
    synonym), and drawn noise words (Zipf(1) over the noise vocabulary). Returns, one entry
    per (document, term) with documents then terms ascending, ``bag_doc``, ``doc_terms`` and
    ``doc_tf``, with ``doc_ptr`` [n_docs + 1] and ``doc_len`` [n_docs]."""
    kind_start, concept_term0 = vocab["kind_start"], vocab["concept_term0"]
    concepts, tf = _content_slots(p, rng, kind_start, docs)
    n_docs, slots = concepts.shape
    doc_ids = np.arange(n_docs)
    occ_concept = np.repeat(concepts.ravel(), tf.ravel())
    occ_doc = np.repeat(np.repeat(doc_ids, slots), tf.ravel())
    u_form = rng.random(occ_concept.size)
    u_syn = rng.random(occ_concept.size)
    nforms = vocab["concept_nforms"][occ_concept]
    form = np.where(
        (u_form < p["p_canonical"]) | (nforms == 1),
        0,
        1 + np.minimum((u_syn * (nforms - 1)).astype(np.int64), nforms - 2),
    )
    occ_term = concept_term0[occ_concept] + form
    lo = p["doc_noise"] // 2
    n_noise_tok = rng.integers(lo, p["doc_noise"] + lo + 1, n_docs)
    zipf = 1.0 / np.arange(1, p["n_noise_terms"] + 1)
    noise = rng.choice(p["n_noise_terms"], size=int(n_noise_tok.sum()), p=zipf / zipf.sum())
    noise_term = concept_term0[kind_start[KIND_NOISE] + noise]
    all_doc = np.concatenate([occ_doc, np.repeat(doc_ids, n_noise_tok)])
    all_term = np.concatenate([occ_term, noise_term])
    keys, doc_tf = np.unique(all_doc * n_terms + all_term, return_counts=True)
    bag_doc = keys // n_terms
    doc_tf = doc_tf.astype(np.int64)
    return dict(
        bag_doc=bag_doc,
        doc_terms=keys % n_terms,
        doc_tf=doc_tf,
        doc_ptr=np.concatenate([[0], np.cumsum(np.bincount(bag_doc, minlength=n_docs))]),
        doc_len=np.bincount(bag_doc, weights=doc_tf, minlength=n_docs).astype(np.int64),
    )


def _bm25_index(
    n_docs: int, n_terms: int, bags: dict[str, np.ndarray]
) -> tuple[float, float, dict[str, np.ndarray]]:
    """The BM25 index of the bags of words (Okapi, Lucene's idf): ``w(t, d) = idf(t) tf (k1 +
    1) / (tf + k1 (1 - b + b dl/avgdl))``. Returns ``avgdl``, ``idf_max`` and the arrays ``df``,
    ``idf`` [n_terms], the postings ``post_ptr``/``post_doc``/``post_w``/``post_rank`` (see
    :class:`Corpus`) and ``doc_wterms``."""
    bag_doc, doc_terms, doc_len = bags["bag_doc"], bags["doc_terms"], bags["doc_len"]
    avgdl = float(doc_len.sum()) / n_docs
    df = np.bincount(doc_terms, minlength=n_terms).astype(np.int64)
    idf = np.log(1.0 + (n_docs - df + 0.5) / (df + 0.5))
    idf_max = float(np.log(1.0 + (n_docs + 0.5) / 0.5))
    tf_f = bags["doc_tf"].astype(np.float64)
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
    arrays = dict(
        df=df,
        idf=idf,
        post_ptr=post_ptr,
        post_doc=post_doc,
        post_w=post_w,
        post_rank=post_rank,
        doc_wterms=doc_terms[worder],
    )
    return avgdl, idf_max, arrays


def _concept_index(
    n_docs: int,
    n_concepts: int,
    term_concept: np.ndarray,
    concept_kind: np.ndarray,
    bags: dict[str, np.ndarray],
) -> dict[str, np.ndarray]:
    """Each document's content concepts (not noise), ascending (``dcon_ptr``/``dcon``), and
    the documents containing each concept (``con_ptr``/``con_docs``)."""
    bag_doc = bags["bag_doc"]
    con = term_concept[bags["doc_terms"]]
    content = concept_kind[con] != KIND_NOISE
    ckeys = np.unique(bag_doc[content] * n_concepts + con[content])
    dcon_doc = ckeys // n_concepts
    dcon = ckeys % n_concepts
    corder = np.argsort(dcon, kind="stable")
    return dict(
        dcon_ptr=np.concatenate([[0], np.cumsum(np.bincount(dcon_doc, minlength=n_docs))]),
        dcon=dcon,
        con_ptr=np.concatenate([[0], np.cumsum(np.bincount(dcon, minlength=n_concepts))]),
        con_docs=dcon_doc[corder],
    )


def _pack_kernel_arrays(arrays: dict[str, np.ndarray]) -> None:
    """Add the kernels' packed buffers to ``arrays`` (``packed_int`` with the
    ``CORPUS_INT_FIELDS``, ``packed_float`` with ``idf`` and ``post_w``, each with its
    offsets; see :func:`_corpus_views`) and make those named arrays views of them (one copy
    in memory)."""
    ints = [arrays[f] for f in CORPUS_INT_FIELDS]
    floats = [arrays[f] for f in CORPUS_KERNEL_FIELDS if f not in CORPUS_INT_FIELDS]
    arrays["packed_int"] = np.concatenate(ints).astype(np.int64)
    arrays["packed_int_offsets"] = np.cumsum([0] + [a.size for a in ints]).astype(np.int64)
    arrays["packed_float"] = np.concatenate(floats).astype(np.float64)
    arrays["packed_float_offsets"] = np.cumsum([0] + [a.size for a in floats]).astype(np.int64)
    for packed, offsets, names in (
        ("packed_int", "packed_int_offsets", CORPUS_INT_FIELDS),
        ("packed_float", "packed_float_offsets", ("idf", "post_w")),
    ):
        for i, name in enumerate(names):
            lo, hi = arrays[offsets][i], arrays[offsets][i + 1]
            arrays[name] = arrays[packed][lo:hi]


# ---- search kernels (numba) ---------------------------------------------------------------


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
