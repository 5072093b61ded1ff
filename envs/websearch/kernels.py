"""websearch's dynamics: the numba kernels that reset, step, observe and describe
``num_envs`` episodes held as ``[num_envs, ...]`` arrays (a loop over envs and the few agents
of each env, compiled once, cached), and the legality of actions. N envs, Q queriers, B
browsers, K = top_k, QM = max_query_terms.

Hot path (every env step): :func:`_step_kernel` (with :func:`_legal`, :func:`_issue`,
:func:`_harvest`, :func:`_surface`, :func:`_draft_cache` and the search kernel
``envs.websearch.corpus._search``) and :func:`_observe_kernel`; per episode start:
:func:`_reset_kernel` (task generation, ``envs.websearch.tasks``); on request:
:func:`_state_kernel`, :func:`_legal_matrix` (``strict_actions``) and the metrics
(``envs.websearch.metrics``).

Speed conventions (each measured to matter): the kernels and their helpers are compiled with
``_nrt=False`` (no reference counting: numba otherwise increments and decrements every array
passed to a helper, which cost more than the helpers' work) and allocate nothing (work arrays
come from the core); the episode arrays travel in a few bundles (``BUNDLES``) and the corpus
in two packed buffers, unpacked into named views by :func:`_state_views` /
:func:`_corpus_views` (numba wraps every array argument of a call from Python); per-result
word counts (``res_tcount``) make the observations' "fraction of results containing the
word" a lookup; task generation ranks a one-word query by the precomputed ``post_rank`` and
runs a search only when no single word will do.

The kernels call kernels of the sibling modules (imported here: numba resolves a kernel's
globals in its own module when it compiles it) and read their constants as compile-time
constants. numba's on-disk cache (``cache=True``) is keyed on each kernel's own file only, so
importing :mod:`envs.websearch` drops the package's cached kernels whenever any of its files
changed (:func:`envs.websearch.drop_stale_kernel_cache`).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from envs.websearch.config import (
    B_MARK,
    B_NEXT,
    B_OPEN0,
    B_PREV,
    B_STAY,
    DESC_SLOTS,
    HARVEST_SLOTS,
    HASH_DIM,
    N_SLOTS,
    PAGE_SIZE,
    Q_CLEAR,
    Q_GLOBAL,
    Q_ISSUE,
    Q_SLOT_FEATURES,
    Q_STAY,
    Q_TOGGLE0,
    S_BROWSER_FEATURES,
    S_GLOBAL,
    S_QUERIER_GLOBAL,
    S_RESULT_FEATURES,
    S_SLOT_FEATURES,
    W_ANSWER,
    W_EARLY,
    W_FOUND,
    W_INVALID,
    W_READ,
    W_REOPEN,
    W_REPEAT,
    W_STEP,
    W_SURFACE,
    W_WRONG,
    _browser_global,
    _browser_result_features,
)
from envs.websearch.corpus import KIND_NOISE, _corpus_views, _search, _sorted_has
from envs.websearch.tasks import _cover_counts, _new_task

NEVER = 1 << 30  # "fresh" before the first query

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


# ---- helpers and legality -----------------------------------------------------------------


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


# ---- episode start ------------------------------------------------------------------------


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


# ---- the step (hot path) ------------------------------------------------------------------


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


# ---- observations (hot path) and state ----------------------------------------------------


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
