"""websearch_v0, v1 and v2 against a slow, obviously-correct reference written from the module
docs: a BM25 engine on plain dicts and the episode rules on sets and lists (float64), matched
step by step over full episodes (observations, masks, rewards, flags, metrics, state). The
reference takes the corpus's documents (bags of words) and each episode's task from the env
after ``reset``; corpus and task generation are checked by their documented properties. v1's
additions (the browsers' description match, the reading and answer rewards, the skipped step
costs of a failed episode) are written in the reference from v1's doc; v2's browser feature
(my open document is the target) from v2's."""

from __future__ import annotations

import math

import numpy as np
import pytest

from envs import websearch_v0, websearch_v1, websearch_v2
from envs.diversity import jaccard_distance, mean_pairwise_jaccard
from envs.websearch import (
    BM25_B,
    BM25_K1,
    DESC_SLOTS,
    HARVEST_SLOTS,
    HASH_DIM,
    KIND_BRAND,
    KIND_CATEGORY,
    KIND_MODEL,
    KIND_NOISE,
    PAGE_SIZE,
    build_corpus,
    make_config,
)
from envs.websearch.corpus import _search

EPISODES = 25
# small corpora and short episodes, so that random play issues, opens, pages and marks a lot
CONFIGS = [
    dict(preset="easy", max_cycles=25),
    dict(preset="default", max_cycles=30, max_answers=2),
    dict(
        preset="hard", max_cycles=20, n_queriers=2, n_browsers=3, max_query_terms=3, max_answers=3
    ),
    dict(
        preset="easy",
        n_entities=12,
        n_aspects=3,
        n_variants=2,
        n_details=4,
        top_k=10,
        n_vague=0,
        max_answers=3,
        max_cycles=30,
        n_queriers=2,
    ),
]


class ReferenceEngine:
    """Okapi BM25 on dicts, from the module doc."""

    def __init__(self, corpus) -> None:
        self.bags = [corpus.doc_bag(d) for d in range(corpus.n_docs)]
        self.n = len(self.bags)
        self.dl = [sum(bag.values()) for bag in self.bags]
        self.avgdl = sum(self.dl) / self.n
        self.index: dict[int, dict[int, int]] = {}
        for d, bag in enumerate(self.bags):
            for t, tf in bag.items():
                self.index.setdefault(t, {})[d] = tf
        self.n_terms = corpus.n_terms

    def df(self, t: int) -> int:
        return len(self.index.get(t, {}))

    def idf(self, t: int) -> float:
        df = self.df(t)
        return math.log(1.0 + (self.n - df + 0.5) / (df + 0.5))

    def weight(self, t: int, d: int) -> float:
        tf = self.bags[d].get(t, 0)
        norm = BM25_K1 * (1.0 - BM25_B + BM25_B * self.dl[d] / self.avgdl)
        return self.idf(t) * (tf * (BM25_K1 + 1.0)) / (tf + norm)

    def search(self, query: set[int], top_k: int) -> list[tuple[int, float]]:
        scores: dict[int, float] = {}
        for t in sorted(query):
            for d in self.index.get(t, {}):
                scores[d] = scores.get(d, 0.0) + self.weight(t, d)
        ranked = sorted(scores.items(), key=lambda x: (-x[1], x[0]))
        return ranked[:top_k]

    def top_words(self, d: int, exclude: set[int], k: int) -> list[int]:
        words = sorted(self.bags[d], key=lambda t: (-self.weight(t, d), t))
        return [t for t in words if t not in exclude][:k]


class ReferenceEpisode:
    """One episode's rules (module doc: Actions, Step order, Observations, Rewards, Infos)."""

    def __init__(self, env, engine: ReferenceEngine) -> None:
        core = env.unwrapped._core
        cfg = core.config
        c = core.corpus
        self.cfg, self.c, self.eng = cfg, c, engine
        self.version = cfg.version
        self.nq, self.nb = cfg.n_queriers, cfg.n_browsers
        self.target = int(core.target[0])
        self.desc = [int(t) for t in core.desc_terms[0, : core.desc_len[0]]]
        self.concepts = {
            int(c.term_concept[t]) for t in self.desc if c.concept_kind[c.term_concept[t]] != 6
        }
        self.solution = {int(t) for t in core.solution[0, : core.solution_len[0]]}
        self.doc_concepts = [
            {int(c.term_concept[t]) for t in bag if c.concept_kind[c.term_concept[t]] != 6}
            for bag in engine.bags
        ]
        self.t = 0
        self.drafts: list[set[int]] = [set() for _ in range(self.nq)]
        self.harvest: list[int] = []
        self.query: set[int] = set()
        self.owner = -1
        self.results: list[tuple[int, float]] = []
        self.log: list[set[int]] = []
        self.opened: set[int] = set()
        self.pages_opened = 0
        self.best_cover = 0.0
        self.page = [0] * self.nb
        self.open_doc = [-1] * self.nb
        self.surfaced: set[int] = set()
        self.wrong: list[int] = []
        self.answers_left = cfg.max_answers
        self.success = 0
        self.success_step = 0
        self.fresh = 10**9
        self.n_read = 0  # v1 rules applied (the test checks that they were exercised)
        self.n_skipped = 0

    # ---- helpers -------------------------------------------------------------------------
    def slots(self) -> list[int]:
        desc = self.desc + [-1] * (DESC_SLOTS - len(self.desc))
        return desc + self.harvest + [-1] * (HARVEST_SLOTS - len(self.harvest))

    def coverage(self, d: int) -> float:
        return len(self.concepts & self.doc_concepts[d]) / len(self.concepts)

    def title(self, d: int) -> float:
        kinds = (KIND_CATEGORY, KIND_BRAND, KIND_MODEL)
        named = {x for x in self.concepts if self.c.concept_kind[x] in kinds}
        return len(named & self.doc_concepts[d]) / len(named) if named else 0.0

    def desc_match(self, d: int) -> float:
        """v1: the fraction of the description's words (as written) that document d contains."""
        return sum(t in self.eng.bags[d] for t in self.desc) / len(self.desc)

    def relevant(self, d: int) -> bool:
        v = self.cfg.n_variants
        return d // v == self.target // v

    def docs(self) -> list[int]:
        return [d for d, _ in self.results]

    def legal(self, a: int, act: int) -> bool:
        if act == 0:
            return True
        if a < self.nq:
            draft = self.drafts[a]
            if act in (1, 2):
                return len(draft) > 0
            term = self.slots()[act - 3]
            return term >= 0 and (term in draft or len(draft) < self.cfg.max_query_terms)
        b = a - self.nq
        if 1 <= act <= 5:
            return self.page[b] * PAGE_SIZE + act - 1 < len(self.results)
        if act == 6:
            return (self.page[b] + 1) * PAGE_SIZE < len(self.results)
        if act == 7:
            return self.page[b] > 0
        return self.open_doc[b] >= 0 and self.open_doc[b] not in self.wrong

    def show(self, page: int, agent: int, rewards: np.ndarray) -> None:
        for d in self.docs()[page * PAGE_SIZE : (page + 1) * PAGE_SIZE]:
            if self.relevant(d) and d not in self.surfaced:
                self.surfaced.add(d)
                rewards[1, agent] += self.cfg.reward_surface

    # ---- dynamics ------------------------------------------------------------------------
    def step(self, actions: list[int]):
        cfg = self.cfg
        n_agents = self.nq + self.nb
        rewards = np.zeros((3, n_agents))
        invalid = np.zeros(n_agents)
        acts = []
        for a, act in enumerate(actions):
            if not self.legal(a, act):
                act = 0
                invalid[a] = 1.0
                rewards[2, a] -= cfg.penalty_invalid
            acts.append(act)
        slots = self.slots()
        for q in range(self.nq):
            if acts[q] == 2:
                self.drafts[q] = set()
            elif acts[q] >= 3:
                self.drafts[q] ^= {slots[acts[q] - 3]}
        ended = False
        last_open = -1
        for b in range(self.nb):
            a, act = self.nq + b, acts[self.nq + b]
            if 1 <= act <= 5:
                d = self.docs()[self.page[b] * PAGE_SIZE + act - 1]
                self.open_doc[b] = d
                self.pages_opened += 1
                last_open = d
                if d in self.opened:
                    rewards[2, a] -= cfg.penalty_reopen
                else:
                    self.opened.add(d)
                    gained = self.coverage(d) - self.best_cover
                    if self.version >= 1 and gained > 0:  # v1: reading
                        rewards[1, a] += cfg.reward_read * gained
                        self.n_read += 1
                    self.best_cover = max(self.best_cover, self.coverage(d))
            elif act in (6, 7):
                self.page[b] += 1 if act == 6 else -1
                self.show(self.page[b], a, rewards)
            elif act == 8:
                d = self.open_doc[b]
                if d == self.target:
                    self.success, self.success_step, ended = 1, self.t + 1, True
                    if self.version >= 1:  # v1: the right answer
                        rewards[1, a] += cfg.reward_answer
                    break
                self.wrong.append(d)
                self.answers_left -= 1
                rewards[2, a] -= cfg.penalty_wrong
                if self.answers_left == 0:
                    ended = True
                    break
        issued = False
        if not ended:
            for q in range(self.nq):
                if acts[q] != 1:
                    continue
                issued = True
                query = set(self.drafts[q])
                if query in self.log:
                    rewards[2, q] -= cfg.penalty_repeat
                self.log.append(query)
                self.results = self.eng.search(query, cfg.top_k)
                self.query, self.owner = query, q
                self.page = [0] * self.nb
                self.show(0, q, rewards)
        if last_open >= 0:
            self.harvest = self.eng.top_words(last_open, set(self.desc), HARVEST_SLOTS)
        self.t += 1
        self.fresh = 0 if issued else self.fresh + 1
        if self.success and self.success_step == self.t:
            rewards[0, :] = cfg.reward_found + cfg.reward_early * max(
                cfg.max_cycles - self.t, 0
            ) / (cfg.max_cycles)
        rewards[2, :] -= cfg.penalty_step
        terminated = bool(self.success) or self.answers_left == 0
        truncated = not terminated and self.t >= cfg.max_cycles
        if self.version >= 1 and terminated and not self.success:  # v1: the skipped steps
            rewards[2, :] -= cfg.penalty_step * max(cfg.max_cycles - self.t, 0)
            self.n_skipped += self.t < cfg.max_cycles
        return rewards, invalid, terminated, truncated

    # ---- views ---------------------------------------------------------------------------
    def metrics(self) -> dict[str, float]:
        issued = len(self.log)
        distinct = len({frozenset(x) for x in self.log})
        return {
            "success": float(self.success),
            "solved": float(self.success),
            "steps_to_success": float(self.success_step if self.success else self.cfg.max_cycles),
            "queries_issued": float(issued),
            "query_diversity": distinct / issued if issued else 0.0,
            "query_jaccard_diversity": mean_pairwise_jaccard(self.log),
            "pages_opened": float(self.pages_opened),
            "episode_length": float(self.t),
        }

    def _common(self) -> dict[str, float]:
        cfg, docs = self.cfg, self.docs()
        issued = len(self.log)
        unopened = [self.title(d) for d in docs if d not in self.opened]
        return dict(
            time_left=max(cfg.max_cycles - self.t, 0) / cfg.max_cycles,
            issued=min(issued / 10, 1.0),
            diversity=len({frozenset(x) for x in self.log}) / issued if issued else 0.0,
            fresh=min(self.fresh, 10) / 10,
            answers=self.answers_left / cfg.max_answers,
            n_res=len(docs) / cfg.top_k,
            opened_frac=sum(d in self.opened for d in docs) / len(docs) if docs else 0.0,
            best_title=max([self.title(d) for d in docs], default=0.0),
            best_title_new=max(unopened, default=0.0),
        )

    def observe_querier(self, q: int) -> tuple[np.ndarray, np.ndarray]:
        cfg, c, eng = self.cfg, self.c, self.eng
        g = self._common()
        draft = self.drafts[q]
        sims = [len(draft & x) / len(draft | x) for x in self.log]
        found = any(d >= 0 and self.coverage(d) == 1.0 for d in self.open_doc)
        out = [
            g["time_left"],
            len(draft) / cfg.max_query_terms,
            float(draft in self.log),
            max(sims, default=0.0),
            g["issued"],
            g["diversity"],
            g["n_res"],
            g["opened_frac"],
            g["best_title"],
            g["best_title_new"],
            self.best_cover,
            g["fresh"],
            float(self.owner == q),
            float(bool(draft) and draft == self.query),
            float(found),
            g["answers"],
        ]
        docs = self.docs()
        mask = [1, int(bool(draft)), int(bool(draft))]
        for j, term in enumerate(self.slots()):
            if term < 0:
                out += [0.0] * 9
                mask.append(0)
                continue
            concept = int(c.term_concept[term])
            names = (
                c.concept_kind[concept] != KIND_NOISE
                if j < DESC_SLOTS
                else concept in self.concepts
            )
            out += [
                1.0,
                float(term in draft),
                float(term in self.query),
                float(names),
                float(j >= DESC_SLOTS),
                eng.idf(term) / math.log(1.0 + (eng.n + 0.5) / 0.5),
                float(eng.df(term) > 0),
                min(sum(term in x for x in self.log), 3) / 3,
                sum(term in eng.bags[d] for d in docs) / len(docs) if docs else 0.0,
            ]
            mask.append(int(term in draft or len(draft) < cfg.max_query_terms))
        for words, weight in (
            (self.desc, 1 / DESC_SLOTS),
            (sorted(draft), 1 / cfg.max_query_terms),
        ):
            bag = [0.0] * HASH_DIM
            for t in words:
                bag[(t * 2654435761) % 2**32 % HASH_DIM] += weight
            out += bag
        return np.array(out), np.array(mask, dtype=np.int8)

    def observe_browser(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        cfg = self.cfg
        g = self._common()
        docs = self.docs()
        pages = (len(docs) + PAGE_SIZE - 1) // PAGE_SIZE
        p = self.page[b]
        d_open = self.open_doc[b]
        unopened = [
            (r, self.title(d)) for r, d in enumerate(docs) if d not in self.opened
        ]  # fmt: skip
        others = [x for x in range(self.nb) if x != b]
        out = [
            g["time_left"],
            p / (pages - 1) if pages > 1 else 0.0,
            float((p + 1) * PAGE_SIZE < len(docs)),
            float(p > 0),
            g["n_res"],
            g["fresh"],
            g["issued"],
            g["answers"],
            float(d_open >= 0),
            self.coverage(d_open) if d_open >= 0 else 0.0,
            self.title(d_open) if d_open >= 0 else 0.0,
            float(d_open >= 0 and d_open in self.wrong),
            max([x for r, x in unopened if r < p * PAGE_SIZE], default=0.0),
            max([x for r, x in unopened if r >= (p + 1) * PAGE_SIZE], default=0.0),
            sum(self.page[x] == p for x in others) / len(others) if others else 0.0,
            self.best_cover,
        ]
        v1 = self.version >= 1
        if v1:  # the best description match of the unopened results on earlier / later pages
            unopened_match = [
                (r, self.desc_match(d)) for r, d in enumerate(docs) if d not in self.opened
            ]
            out += [
                max([x for r, x in unopened_match if r < p * PAGE_SIZE], default=0.0),
                max([x for r, x in unopened_match if r >= (p + 1) * PAGE_SIZE], default=0.0),
            ]
        if self.version >= 2:  # v2: my open document is the answer (the target)
            out.append(float(d_open == self.target))
        query_len = len(self.query)
        for k in range(PAGE_SIZE):
            r = p * PAGE_SIZE + k
            if r >= len(docs):
                out += [0.0] * (9 if v1 else 8)
                continue
            d, score = self.results[r]
            out += [
                1.0,
                r / cfg.top_k,
                score / self.results[0][1],
                sum(t in self.eng.bags[d] for t in self.query) / query_len,
                self.title(d),
                float(d in self.opened),
                float(d == d_open),
                float(any(self.open_doc[x] == d for x in others)),
            ]
            if v1:
                out.append(self.desc_match(d))
        mask = [1] + [int(p * PAGE_SIZE + k < len(docs)) for k in range(PAGE_SIZE)]
        mask += [int((p + 1) * PAGE_SIZE < len(docs)), int(p > 0)]
        mask.append(int(d_open >= 0 and d_open not in self.wrong))
        return np.array(out), np.array(mask, dtype=np.int8)

    def state(self) -> np.ndarray:
        cfg = self.cfg
        g = self._common()
        docs = self.docs()
        rank = docs.index(self.target) if self.target in docs else -1
        out = [
            g["time_left"],
            g["answers"],
            float(self.success),
            g["fresh"],
            g["issued"],
            g["diversity"],
            g["n_res"],
            float(rank >= 0),
            rank / cfg.top_k if rank >= 0 else 1.0,
            float(self.target in self.opened),
            self.best_cover,
        ]
        for r in range(cfg.top_k):
            if r >= len(docs):
                out += [0.0] * 6
                continue
            d, score = self.results[r]
            out += [
                1.0,
                score / self.results[0][1],
                self.title(d),
                self.coverage(d),
                float(d in self.opened),
                float(d == self.target),
            ]
        pages = (len(docs) + PAGE_SIZE - 1) // PAGE_SIZE
        for b in range(self.nb):
            d = self.open_doc[b]
            out += [
                self.page[b] / (pages - 1) if pages > 1 else 0.0,
                float(d >= 0),
                self.coverage(d) if d >= 0 else 0.0,
                float(d == self.target),
                float(rank >= 0 and rank // PAGE_SIZE == self.page[b]),
            ]
        target_bag = self.eng.bags[self.target]
        for q in range(self.nq):
            draft = self.drafts[q]
            sims = [len(draft & x) / len(draft | x) for x in self.log]
            out += [
                len(draft) / cfg.max_query_terms,
                float(draft in self.log),
                max(sims, default=0.0),
            ]
            for term in self.slots():
                if term < 0:
                    out += [0.0] * 4
                else:
                    out += [
                        1.0,
                        float(term in draft),
                        float(term in target_bag),
                        float(term in self.solution),
                    ]
        for words, weight in (
            (self.desc, 1 / DESC_SLOTS),
            (sorted(self.query), 1 / cfg.max_query_terms),
        ):
            bag = [0.0] * HASH_DIM
            for t in words:
                bag[(t * 2654435761) % 2**32 % HASH_DIM] += weight
            out += bag
        return np.array(out)


def _random_actions(rng, env, obs) -> dict[str, int]:
    """Mostly legal actions, issuing and marking often; sometimes anything in range."""
    actions = {}
    for agent in env.agents:
        mask = obs[agent]["action_mask"]
        legal = np.flatnonzero(mask)
        if rng.random() < 0.1:
            actions[agent] = int(rng.integers(len(mask)))
        elif agent.startswith("querier") and mask[1] and rng.random() < 0.3:
            actions[agent] = 1
        elif agent.startswith("browser") and mask[8] and rng.random() < 0.2:
            actions[agent] = 8
        elif agent.startswith("browser") and mask[8] and obs[agent]["observation"][9] == 1.0:
            actions[agent] = 8  # the open document covers the description: answer
        else:
            actions[agent] = int(rng.choice(legal))
    return actions


def _check_same(env, ref: ReferenceEpisode, obs) -> None:
    core = env.unwrapped._core
    for i, agent in enumerate(env.possible_agents):
        if i < ref.nq:
            want, mask = ref.observe_querier(i)
        else:
            want, mask = ref.observe_browser(i - ref.nq)
        np.testing.assert_array_equal(obs[agent]["action_mask"], mask, err_msg=agent)
        np.testing.assert_allclose(obs[agent]["observation"], want, atol=2e-6, err_msg=agent)
        for act in range(len(mask)):  # the kernel's mask == the rule the step applies
            assert core.legal_action(0, i, act) == bool(mask[act])
    np.testing.assert_allclose(env.state(), ref.state(), atol=2e-6)
    nr = int(core.n_results[0])
    assert core.results[0, :nr].tolist() == ref.docs()
    np.testing.assert_allclose(core.res_score[0, :nr], [s for _, s in ref.results], rtol=1e-12)
    assert core.harvest[0, : core.harvest_len[0]].tolist() == ref.harvest


@pytest.mark.slow
@pytest.mark.parametrize(
    "module", [websearch_v0, websearch_v1, websearch_v2], ids=["v0", "v1", "v2"]
)
@pytest.mark.parametrize("kwargs", CONFIGS)
def test_dynamics_match_reference_over_full_episodes(module, kwargs):
    if module is not websearch_v0:
        kwargs = {**kwargs, "reward_read": 0.3}  # opt-in shaping (off by default): exercised
    env = module.parallel_env(**kwargs)
    engine = ReferenceEngine(env._core.corpus)
    rng = np.random.default_rng(7)
    counts = dict(issue=0, open=0, page=0, mark=0, success=0, invalid=0, repeat=0, surface=0)
    for episode in range(EPISODES):
        obs, infos = env.reset(seed=100 + episode)
        ref = ReferenceEpisode(env, engine)
        assert infos[env.possible_agents[0]] == {
            **dict.fromkeys(("reward_team", "reward_individual", "reward_penalty"), 0.0),
            "invalid_action": 0.0,
            **ref.metrics(),
        }
        _check_same(env, ref, obs)
        while env.agents:
            actions = _random_actions(rng, env, obs)
            row = [actions[a] for a in env.possible_agents]
            obs, rewards, terms, truncs, infos = env.step(actions)
            want, invalid, term, trunc = ref.step(row)
            for i, agent in enumerate(env.possible_agents):
                info = infos[agent]
                got = [info["reward_team"], info["reward_individual"], info["reward_penalty"]]
                np.testing.assert_allclose(got, want[:, i], atol=1e-12, err_msg=agent)
                assert rewards[agent] == pytest.approx(want[:, i].sum(), abs=1e-12)
                assert info["invalid_action"] == invalid[i]
                assert terms[agent] is term and truncs[agent] is trunc
                metrics = {k: info[k] for k in ref.metrics()}
                assert metrics == pytest.approx(ref.metrics(), abs=1e-12)
            _check_same(env, ref, obs)
            counts["issue"] += row[: ref.nq].count(1)
            counts["open"] += sum(1 <= x <= 5 for x in row[ref.nq :])
            counts["page"] += sum(x in (6, 7) for x in row[ref.nq :])
            counts["mark"] += row[ref.nq :].count(8)
            counts["invalid"] += int(invalid.sum())
            counts["repeat"] += int(
                any(
                    want[2, q] <= -ref.cfg.penalty_repeat - ref.cfg.penalty_step
                    for q in range(ref.nq)
                )
            )
            counts["surface"] += int((want[1] > 0).sum())
        counts["success"] += ref.success
        if module is not websearch_v0:
            counts["read"] = counts.get("read", 0) + ref.n_read
            counts["skipped"] = counts.get("skipped", 0) + ref.n_skipped
    assert all(v > 0 for v in counts.values()), counts  # every rule was exercised
    assert module is websearch_v0 or {"read", "skipped"} <= set(counts)


def test_bm25_engine_matches_reference_on_many_queries():
    cfg = make_config("default")
    corpus = build_corpus(cfg)
    engine = ReferenceEngine(corpus)
    vec = websearch_v0.vector_env(1)
    core = vec._core
    rng = np.random.default_rng(0)
    docs = np.empty(cfg.top_k, np.int64)
    scores = np.empty(cfg.top_k)
    hits = np.empty(cfg.top_k, np.int64)
    for _ in range(200):
        size = int(rng.integers(1, cfg.max_query_terms + 1))
        query = np.sort(rng.choice(corpus.n_terms, size=size, replace=False)).astype(np.int64)
        got = _search(
            query, size, corpus.post_ptr, corpus.post_doc, corpus.post_w, core._scratch,
            core._hits, core._touched, cfg.top_k, docs, scores, hits,
        )  # fmt: skip
        want = engine.search(set(query.tolist()), cfg.top_k)
        assert docs[:got].tolist() == [d for d, _ in want]
        np.testing.assert_allclose(scores[:got], [s for _, s in want], rtol=1e-12)
        assert hits[:got].tolist() == [sum(t in engine.bags[d] for t in query) for d, _ in want]
    assert not core._scratch.any() and not core._hits.any()  # left clean


def test_corpus_properties_and_one_word_ranks():
    cfg = make_config("default")
    c = build_corpus(cfg)
    engine = ReferenceEngine(c)
    assert c.n_docs == cfg.n_entities * cfg.n_aspects * cfg.n_variants
    for d in range(0, c.n_docs, 97):
        concepts = engine.bags[d]
        model = c.concept_term0[c.kind_start[KIND_MODEL] + c.doc_entity[d]]
        assert concepts.get(int(model), 0) >= 1  # every document names its model
        e, a, v = c.doc_entity[d], c.doc_aspect[d], c.doc_variant[d]
        assert d == (e * cfg.n_aspects + a) * cfg.n_variants + v
    # the model's word is in exactly the entity's documents
    for e in range(0, cfg.n_entities, 13):
        model = int(c.concept_term0[c.kind_start[KIND_MODEL] + e])
        assert sorted(engine.index[model]) == list(
            range(e * cfg.docs_per_entity, (e + 1) * cfg.docs_per_entity)
        )
    # post_rank is the rank under the one-word query
    for t in range(0, c.n_terms, 37):
        ranked = [d for d, _ in engine.search({t}, c.n_docs)]
        for p in range(c.post_ptr[t], c.post_ptr[t + 1]):
            assert ranked.index(int(c.post_doc[p])) == c.post_rank[p]
    # a pure function of the corpus arguments
    again = build_corpus(make_config("default", corpus_seed=0, max_cycles=7))
    assert again is c
    other = build_corpus(make_config("default", corpus_seed=1))
    assert not np.array_equal(other.doc_terms[:200], c.doc_terms[:200])


@pytest.mark.parametrize("preset", ["easy", "default", "hard"])
def test_tasks_are_well_posed_and_solvable(preset):
    vec = websearch_v0.vector_env(64, preset=preset)
    vec.reset(seed=3)
    core, c, cfg = vec._core, vec._core.corpus, vec.config
    engine = ReferenceEngine(c) if preset != "hard" else None
    doc_concepts = [
        set(c.dcon[c.dcon_ptr[d] : c.dcon_ptr[d + 1]].tolist()) for d in range(c.n_docs)
    ]
    for n in range(64):
        target = int(core.target[n])
        desc = core.desc_terms[n, : core.desc_len[n]].tolist()
        assert len(set(desc)) == len(desc) and (core.desc_terms[n, core.desc_len[n] :] == -1).all()
        named = {int(c.term_concept[t]) for t in desc if c.concept_kind[c.term_concept[t]] != 6}
        assert named == set(core.desc_cons[n, : core.desc_ncons[n]].tolist())
        vague = [t for t in desc if c.concept_kind[c.term_concept[t]] == KIND_NOISE]
        assert len(vague) == cfg.n_vague
        covering = [d for d in range(c.n_docs) if named <= doc_concepts[d]]
        assert covering == [target]  # unique: only the target covers the description
        solution = set(core.solution[n, : core.solution_len[n]].tolist())
        assert solution <= set(desc) and solution
        if engine is not None:
            ranked = [d for d, _ in engine.search(solution, cfg.top_k)]
        else:
            ranked = core_search(core, sorted(solution))
        assert target in ranked  # solvable: the solution query shows the target


def core_search(core, query: list[int]) -> list[int]:
    c, k = core.corpus, core.config.top_k
    docs, scores, hits = np.empty(k, np.int64), np.empty(k), np.empty(k, np.int64)
    q = np.array(query, dtype=np.int64)
    got = _search(q, len(q), c.post_ptr, c.post_doc, c.post_w, core._scratch, core._hits,
                  core._touched, k, docs, scores, hits)  # fmt: skip
    return docs[:got].tolist()


def test_jaccard_metric_is_the_shared_helper():
    vec = websearch_v0.vector_env(8, preset="easy", max_cycles=60)
    obs, _ = vec.reset(seed=11)
    rng = np.random.default_rng(1)
    for _ in range(59):
        actions = {}
        for agent in vec.possible_agents:
            mask = obs[agent]["action_mask"].astype(bool)
            pick = np.argmax(rng.random(mask.shape) * mask, axis=1)
            if agent.startswith("querier"):
                pick = np.where(mask[:, 1] & (rng.random(8) < 0.4), 1, pick)
            else:
                pick = np.where(pick == 8, 0, pick)  # never answer: long episodes
            actions[agent] = pick
        obs, _, _, _, infos = vec.step(actions)
    info = infos["querier_0"]
    assert (info["queries_issued"] >= 5).all()
    for i in range(8):
        queries = vec.queries(i)
        assert info["query_jaccard_diversity"][i] == pytest.approx(
            mean_pairwise_jaccard(queries), abs=1e-12
        )
        distinct = len(set(queries)) / len(queries)
        assert info["query_diversity"][i] == pytest.approx(distinct)
    assert jaccard_distance(set(), set()) == 0.0
    sets = vec.search_sets()
    assert all(isinstance(s, frozenset) for s in sets) and sets[0] == frozenset(vec.queries(0))


def test_reward_rules_by_hand():
    env = websearch_v0.parallel_env(preset="easy", max_answers=2)
    cfg = env.config
    obs, _ = env.reset(seed=4)
    step = cfg.penalty_step

    def act(q=0, b=0):
        return env.step({"querier_0": q, "browser_0": b})

    act(q=3)  # draft the first description word
    _, _, _, _, infos = act(q=1)
    assert infos["querier_0"]["reward_penalty"] == pytest.approx(-step)
    assert infos["querier_0"]["queries_issued"] == 1.0
    _, _, _, _, infos = act(q=1)  # the same query again
    assert infos["querier_0"]["reward_penalty"] == pytest.approx(-step - cfg.penalty_repeat)
    assert infos["querier_0"]["query_diversity"] == 0.5
    assert infos["querier_0"]["query_jaccard_diversity"] == 0.0
    assert infos["browser_0"]["reward_penalty"] == pytest.approx(-step)
    _, _, _, _, infos = act(b=1)  # open the first result
    assert infos["browser_0"]["reward_penalty"] == pytest.approx(-step)
    assert infos["browser_0"]["pages_opened"] == 1.0
    obs, _, _, _, infos = act(b=1)  # and again
    assert infos["browser_0"]["reward_penalty"] == pytest.approx(-step - cfg.penalty_reopen)
    assert infos["browser_0"]["pages_opened"] == 2.0
    core = env._core
    if core.open_doc[0, 0] != core.target[0]:
        _, _, terms, _, infos = act(b=8)  # a wrong answer: one of two used
        assert infos["browser_0"]["reward_penalty"] == pytest.approx(-step - cfg.penalty_wrong)
        assert not terms["browser_0"] and core.answers_left[0] == 1
        obs = env._observe()
        assert obs["browser_0"]["action_mask"][8] == 0  # not the same wrong answer twice
        assert obs["browser_0"]["observation"][11] == 1.0


def test_success_rewards_and_metrics():
    from envs.websearch_baselines import OraclePolicy

    env = websearch_v0.parallel_env(preset="default")
    cfg = env.config
    obs, _ = env.reset(seed=12)
    policy = OraclePolicy()
    steps = 0
    while env.agents:
        obs, rewards, terms, truncs, infos = env.step(policy(obs, env))
        steps += 1
    info = infos["browser_1"]
    assert all(terms.values()) and not any(truncs.values())
    assert info["success"] == 1.0 and info["solved"] == 1.0
    assert info["steps_to_success"] == steps == info["episode_length"]
    early = cfg.reward_early * (cfg.max_cycles - steps) / cfg.max_cycles
    assert info["reward_team"] == pytest.approx(cfg.reward_found + early)
    assert infos["querier_0"]["reward_team"] == info["reward_team"]  # shared
