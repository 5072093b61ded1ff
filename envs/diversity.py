"""Search-diversity metrics over sets (visited cells, issued queries, opened pages).

The seeds' failure mode is a policy that repeats one safe pattern. For episodes started from
the same reset seed (identical initial state) the behaviour can differ only by the policy's
own choices, so the mean pairwise Jaccard distance between what the episodes searched
(the team's visited cells in ``multisearch``, the queries in ``websearch``) measures how
varied the search is: 0 when every episode searched the same set, 1 when no two share an
element. One helper, numpy-free, shared by every environment and by the trainers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import combinations

__all__ = ["jaccard_distance", "mean_pairwise_jaccard", "grouped_pairwise_jaccard"]


def jaccard_distance(a: Iterable, b: Iterable) -> float:
    """``1 - |a & b| / |a | b|``; 0.0 when both are empty."""
    a, b = set(a), set(b)
    union = len(a | b)
    if union == 0:
        return 0.0
    return 1.0 - len(a & b) / union


def mean_pairwise_jaccard(sets: Sequence[Iterable]) -> float:
    """The mean Jaccard distance over the unordered pairs ``i < j`` of ``sets``; 0.0 for
    fewer than two sets."""
    sets = [set(s) for s in sets]
    pairs = list(combinations(range(len(sets)), 2))
    if not pairs:
        return 0.0
    return sum(jaccard_distance(sets[i], sets[j]) for i, j in pairs) / len(pairs)


def grouped_pairwise_jaccard(sets: Sequence[Iterable], keys: Sequence[object]) -> float | None:
    """The mean over groups (episodes with equal ``keys``, e.g. reset seeds) of
    :func:`mean_pairwise_jaccard`, over the groups with at least two episodes; None when
    there is none."""
    if len(sets) != len(keys):
        raise ValueError(f"{len(sets)} sets but {len(keys)} keys")
    groups: dict[object, list] = {}
    for s, k in zip(sets, keys, strict=True):
        groups.setdefault(k, []).append(s)
    values = [mean_pairwise_jaccard(g) for g in groups.values() if len(g) >= 2]
    if not values:
        return None
    return sum(values) / len(values)
