"""websearch's episode metrics: their names (``METRIC_NAMES``, the one list: the env's
infos, ``METRIC_KEYS`` of the env modules and the baselines' evaluation read it) and the one
kernel that computes them (:func:`_metrics_kernel`, rows in that order).
"""

from __future__ import annotations

from numba import njit

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
