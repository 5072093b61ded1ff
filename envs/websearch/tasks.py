"""websearch's tasks: each episode's target, its vague description and the privileged
solution query, drawn by :func:`_new_task` from a block of uniforms (see "Tasks" in the module
doc of ``envs.websearch_v0``), and the description-coverage count the dynamics and
observations share (:func:`_cover_counts`). Numba kernels, called by the reset kernel (and
``_cover_counts`` by the step, observation and state kernels).
"""

from __future__ import annotations

from numba import njit

from envs.websearch.config import VAGUE_POOL
from envs.websearch.corpus import (
    ASPECT_CONCEPTS,
    KIND_ASPECT,
    KIND_ATTRIBUTE,
    KIND_BRAND,
    KIND_CATEGORY,
    KIND_DETAIL,
    KIND_MODEL,
    KIND_NOISE,
    _isort,
    _posting_of,
    _search,
    _sorted_has,
)

TASK_UNIFORMS = 64  # uniforms per episode start
FORM_ATTEMPTS = 4  # draws of the description's word forms before the model-name fallback


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
