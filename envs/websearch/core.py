"""The one vectorised core of ``websearch_v0``, ``websearch_v1`` and ``websearch_v2``:
:class:`WebSearchCore`, ``num_envs`` episodes held as ``[num_envs, ...]`` arrays over one
shared read-only corpus, reset and stepped by the kernels of ``envs.websearch.kernels``.

``parallel_env`` is the ``num_envs=1`` view of this core and ``vector_env`` the batched view, so
the two cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from envs.errors import ArgumentTypeError
from envs.websearch.config import (
    DESC_SLOTS,
    HARVEST_SLOTS,
    N_ACTIONS_BROWSER,
    N_ACTIONS_QUERIER,
    N_SLOTS,
    WebSearchConfig,
)
from envs.websearch.corpus import build_corpus
from envs.websearch.kernels import (
    BUNDLES,
    NEVER,
    STANDALONE_FIELDS,
    _legal,
    _legal_matrix,
    _observe_kernel,
    _reset_kernel,
    _state_kernel,
    _step_kernel,
)
from envs.websearch.metrics import METRIC_NAMES, _metrics_kernel
from envs.websearch.tasks import TASK_UNIFORMS

UNIFORM_BLOCK = 16  # episode starts' uniforms drawn at a time


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
