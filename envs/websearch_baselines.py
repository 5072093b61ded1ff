"""Reference policies for ``websearch_v0``, ``websearch_v1`` and ``websearch_v2`` and their
evaluation on fixed seeds (the policies read the core's arrays, which every version shares).

* :class:`HeuristicPolicy` -- a scripted team that reads only what the agents observe (the
  description, idf, the result list's titles and coverage of opened documents, the harvested
  words and their "same concept as a description word" flag). Queriers work through a plan of
  queries, never repeating one: the description's words (the ``max_query_terms`` rarest that
  occur in the index), then with the harvested words that name a description concept
  (relevance feedback: the page's own word for what the description paraphrases) in place of
  the rarest description words, then drop-one, swap and pairs variations. The querier on duty issues
  the next query when the result list has nothing promising left (no unopened result whose
  title matches the description fully); the others prepare the following ones (drafting takes
  one step per word). Browsers open the unopened results with a full title match on their
  page (browser b starts on page b), page on when there are more elsewhere, and mark an open
  document that covers the whole description.
* :class:`RandomPolicy` -- uniform over each agent's legal (unmasked) actions.
* :class:`OraclePolicy` -- perfect knowledge (the target and the task's solution query, see
  "Tasks" in the env's doc): drafts and issues the solution, pages to the target, opens it and
  marks it. Succeeds in every episode: the headroom check.
* :func:`evaluate_websearch_baseline` -- one episode per seed in a ``vector_env``
  (``autoreset=False``), reading the metrics the env reports in ``infos`` at each episode's end.

All work with ``vector_env`` (arrays ``[num_envs]``) and ``parallel_env`` (ints); call them as
``actions = policy(obs, env)``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from envs import websearch_v0, websearch_v1, websearch_v2
from envs._baselines import Policy, RandomPolicy, run_episodes, to_env_format
from envs.websearch import (
    B_MARK,
    B_NEXT,
    B_OPEN0,
    B_PREV,
    B_STAY,
    METRIC_NAMES,
    PAGE_SIZE,
    Q_CLEAR,
    Q_ISSUE,
    Q_STAY,
    Q_TOGGLE0,
    WebSearchCore,
)
from envs.websearch_v0 import WebSearchParallelEnv, WebSearchVectorEnv

__all__ = ["HeuristicPolicy", "OraclePolicy", "RandomPolicy", "evaluate_websearch_baseline"]

FULL = 1.0 - 1e-9  # a "full" title match / coverage


def _core_of(env: Any) -> WebSearchCore:
    inner = getattr(env, "unwrapped", env)
    if isinstance(inner, (WebSearchParallelEnv, WebSearchVectorEnv)):
        return inner._core
    raise TypeError(
        "expected a websearch_v0/v1 parallel_env or vector_env, got " + type(env).__name__
    )


def _slot_terms(core: WebSearchCore, n: int) -> list[int]:
    return core.desc_terms[n].tolist() + core.harvest[n].tolist()


def _draft_step(core: WebSearchCore, n: int, q: int, goal: frozenset[int]) -> int:
    """The querier action that brings its draft one step closer to ``goal`` (stay if there)."""
    draft = set(core.draft[n, q, : core.draft_len[n, q]].tolist())
    slots = _slot_terms(core, n)
    extra = draft - goal
    if extra:
        for term in sorted(extra):
            if term in slots:
                return Q_TOGGLE0 + slots.index(term)
        return Q_CLEAR  # a word that left the candidates: start over
    for term in sorted(goal - draft):
        if term in slots:
            return Q_TOGGLE0 + slots.index(term)
    return Q_STAY


def _browse(core: WebSearchCore, n: int, b: int, claimed: set[int]) -> int:
    """A heuristic browser's action (see the module doc); ``claimed``: documents a teammate
    opens this step."""
    nr = int(core.n_results[n])
    d_open = int(core.open_doc[n, b])
    if d_open >= 0 and d_open not in core.wrong[n, : core.n_wrong[n]]:
        concepts = set(core.desc_cons[n, : core.desc_ncons[n]].tolist())
        c = core.corpus
        doc_concepts = set(c.dcon[c.dcon_ptr[d_open] : c.dcon_ptr[d_open + 1]].tolist())
        if concepts <= doc_concepts:
            return B_MARK
    if nr == 0:
        return B_STAY
    page = int(core.page[n, b])
    promising = [
        r
        for r in range(nr)
        if core.res_title[n, r] >= FULL
        and not core.opened[n, core.results[n, r]]
        and int(core.results[n, r]) not in claimed
    ]
    on_page = [r for r in promising if r // PAGE_SIZE == page]
    if on_page:
        claimed.add(int(core.results[n, on_page[0]]))
        return B_OPEN0 + on_page[0] - page * PAGE_SIZE
    later = [r for r in promising if r // PAGE_SIZE > page]
    if later and (page + 1) * PAGE_SIZE < nr:
        return B_NEXT
    if [r for r in promising if r // PAGE_SIZE < page] and page > 0:
        return B_PREV
    return B_STAY


class HeuristicPolicy:
    """Scripted team policy on observable information (see the module doc).
    ``policy(obs, env) -> actions``."""

    def __call__(self, obs: Mapping[str, Any], env: Any) -> dict[str, Any]:
        core = _core_of(env)
        cfg = core.config
        actions = np.zeros((core.num_envs, cfg.n_agents), dtype=np.int64)
        for n in range(core.num_envs):
            self._act(core, n, actions[n])
        return to_env_format(env, actions)

    @staticmethod
    def plan(core: WebSearchCore, n: int) -> list[frozenset[int]]:
        """The queries the heuristic would issue next in env n, in order (issued ones left
        out)."""
        c, qm = core.corpus, core.config.max_query_terms
        desc = [int(t) for t in core.desc_terms[n, : core.desc_len[n]] if c.df[t] > 0]
        desc.sort(key=lambda t: (-c.idf[t], t))  # rarest first
        concepts = set(core.desc_cons[n, : core.desc_ncons[n]].tolist())
        feedback = [
            int(t)
            for t in core.harvest[n, : core.harvest_len[n]]
            if int(c.term_concept[t]) in concepts
        ]
        base = desc[:qm]
        plans = [frozenset(base)]
        if feedback:
            keep = [t for t in desc if t not in feedback][: max(qm - len(feedback), 0)]
            plans.append(frozenset((feedback + keep)[:qm]))
            plans.append(frozenset((feedback + desc[len(base) :])[:qm]))
        for t in base:  # drop one word
            if len(base) > 1:
                plans.append(frozenset(x for x in base if x != t))
        for t in base:  # swap one word for the next description word
            for extra in desc[len(base) :]:
                plans.append(frozenset([x for x in base if x != t] + [extra]))
        for i in range(len(desc)):  # pairs of description words
            for j in range(i + 1, len(desc)):
                plans.append(frozenset((desc[i], desc[j])))
        issued = set(core.queries(n))
        out: list[frozenset[int]] = []
        for p in plans:
            if p and p not in issued and p not in out:
                out.append(p)
        return out

    def _act(self, core: WebSearchCore, n: int, out: np.ndarray) -> None:
        cfg = core.config
        nq = cfg.n_queriers
        claimed: set[int] = set()
        for b in range(cfg.n_browsers):
            page = int(core.page[n, b])
            if core.fresh[n] < b and page < b and (page + 1) * PAGE_SIZE < core.n_results[n]:
                out[nq + b] = B_NEXT  # spread out over a fresh list: browser b to page b
                continue
            out[nq + b] = _browse(core, n, b, claimed)
        spread = any(out[nq + b] == B_NEXT for b in range(cfg.n_browsers))
        promising = any(
            core.res_title[n, r] >= FULL and not core.opened[n, core.results[n, r]]
            for r in range(int(core.n_results[n]))
        )
        busy = promising or spread or any(out[nq + b] == B_MARK for b in range(cfg.n_browsers))
        plan = self.plan(core, n)
        duty = int(core.n_issued[n]) % nq
        for q in range(nq):
            rank = (q - duty) % nq
            if rank >= len(plan):
                out[q] = Q_STAY
                continue
            goal = plan[rank]
            draft = frozenset(core.draft[n, q, : core.draft_len[n, q]].tolist())
            if draft == goal:
                out[q] = Q_ISSUE if (rank == 0 and not busy) else Q_STAY
            else:
                out[q] = _draft_step(core, n, q, goal)


class OraclePolicy:
    """Perfect knowledge (see the module doc): succeeds in every episode."""

    def __call__(self, obs: Mapping[str, Any], env: Any) -> dict[str, Any]:
        core = _core_of(env)
        cfg = core.config
        actions = np.zeros((core.num_envs, cfg.n_agents), dtype=np.int64)
        nq = cfg.n_queriers
        for n in range(core.num_envs):
            target = int(core.target[n])
            nr = int(core.n_results[n])
            rank = [r for r in range(nr) if core.results[n, r] == target]
            if not rank:
                goal = frozenset(core.solution[n, : core.solution_len[n]].tolist())
                draft = frozenset(core.draft[n, 0, : core.draft_len[n, 0]].tolist())
                actions[n, 0] = Q_ISSUE if draft == goal else _draft_step(core, n, 0, goal)
                continue
            page = int(core.page[n, 0])
            if core.open_doc[n, 0] == target:
                actions[n, nq] = B_MARK
            elif rank[0] // PAGE_SIZE > page:
                actions[n, nq] = B_NEXT
            elif rank[0] // PAGE_SIZE < page:
                actions[n, nq] = B_PREV
            else:
                actions[n, nq] = B_OPEN0 + rank[0] - page * PAGE_SIZE
        return to_env_format(env, actions)


def evaluate_websearch_baseline(
    policy: str | Policy,
    seeds: Sequence[int] = tuple(range(64)),
    *,
    policy_seed: int = 0,
    version: int = 0,
    **env_kwargs: Any,
) -> dict[str, float]:
    """Run one episode per seed (env i reset with ``seeds[i]``) in ``websearch_v{version}``
    and average the metrics the env reports at each episode's end.

    ``policy``: "heuristic", "random", "oracle" or a callable ``policy(obs, vec_env) ->
    actions``. Returns, as ``envs.baselines.evaluate_baseline``, ``success_rate`` (mean of
    ``success``), ``solved_rate``, ``steps`` (mean episode length), ``return`` (mean per-agent
    return), ``n_episodes``, and this env's ``steps_to_success``, ``queries_issued``,
    ``query_diversity``, ``query_jaccard_diversity``, ``pages_opened`` (means over episodes).
    """
    if isinstance(policy, str):
        makers = {"heuristic": HeuristicPolicy, "oracle": OraclePolicy}
        if policy == "random":
            policy = RandomPolicy(policy_seed)
        elif policy in makers:
            policy = makers[policy]()
        else:
            raise ValueError(
                f"unknown policy {policy!r}; allowed: 'heuristic', 'random', 'oracle', callable"
            )
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise ValueError("seeds must not be empty")
    modules = {0: websearch_v0, 1: websearch_v1, 2: websearch_v2}
    if version not in modules:
        raise ValueError(f"version must be one of {sorted(modules)}, got {version!r}")
    vec = modules[version].vector_env(len(seeds), autoreset=False, **env_kwargs)
    final, returns = run_episodes(vec, policy, seeds, METRIC_NAMES)
    out = {
        "success_rate": float(final["success"].mean()),
        "solved_rate": float(final["solved"].mean()),
        "steps": float(final["episode_length"].mean()),
        "return": float(returns.mean()),
        "n_episodes": float(len(seeds)),
    }
    for k in METRIC_NAMES:
        if k not in ("success", "solved", "episode_length"):
            out[k] = float(final[k].mean())
    return out
