"""websearch_v0: cooperating agents search a simulated web for a vaguely described page
(PettingZoo Parallel + AEC + vector).

A team of **queriers** and **browsers** looks for one web page that the task describes only
vaguely, in a procedurally generated corpus searched by BM25. Queriers draft queries from the
description's words and from words harvested off the pages the team opens, and issue them;
the results appear on a shared result list that browsers page through, open, and mark as the
answer. The description paraphrases the target with synonyms, so the obvious query often
misses it and varied queries find it: the setting of the first seed text (a search agent that
collapses onto one "safe" query), with a query as the action and query collapse as the
failure mode, at grid-world speed and without a language model.

=====================  ===================================================================
Import                 ``from envs import websearch_v0``
Constructors           ``parallel_env(**kw)``, ``env(**kw)`` (AEC, ``parallel_to_aec``),
                       ``raw_env(**kw)`` (AEC without the order-enforcing wrapper),
                       ``vector_env(num_envs, autoreset=True, **kw)``
Agents                 ``querier_0..querier_{n_queriers-1}``,
                       ``browser_0..browser_{n_browsers-1}`` (queriers first; that order
                       breaks ties); agent type = the name before the last ``_``
Action spaces          queriers ``Discrete(19)``, browsers ``Discrete(9)``
Observation spaces     ``Dict(observation=Box(0, 1, (obs_dim,), float32),
                       action_mask=Box(0, 1, (n_actions,), int8))``; obs_dim: queriers 192,
                       browsers 56 (every preset)
State space            ``Box(0, 1, (state_dim,), float32)``, state_dim = 43 + 6 top_k +
                       5 n_browsers + 67 n_queriers (default preset: 240)
metadata               ``name="websearch_v0"``, ``is_parallelizable=True``,
                       ``render_modes=["human", "rgb_array", "ansi"]``, ``render_fps=4``
Baselines              ``BASELINES = "envs.websearch_baselines"`` (heuristic, random, oracle)
=====================  ===================================================================

The web
-------
The corpus is a pure function of the corpus arguments and ``corpus_seed`` (built once per
process and shared read-only by every env); tasks vary per episode. ``n_entities`` products
each have a category, a brand, a model name and ``attributes_per_entity`` attributes; there
are ``n_aspects`` aspects (review, price, specs, ...; two concepts each) and ``n_details``
details (a year, a source). Document ``(entity, aspect, variant)`` exists for every entity,
aspect and ``n_variants`` variants (which differ by their detail): ``n_entities * n_aspects *
n_variants`` documents. A document's bag of words: its category (tf 1-2), brand (1-3), model
(1-3), each attribute with probability 0.8 (1-2), both aspect concepts (1-3 each), its detail
(1-2) and about ``doc_noise`` noise words (Zipf over ``n_noise_terms``). Concepts have word
forms: form 0 is canonical, the others synonyms (categories, attributes and aspect concepts
3 forms, brands and details 2, models and noise words 1); a document writes each occurrence
in the canonical form with probability ``p_canonical``, else in a uniform synonym.

The engine is Okapi BM25 (k1 1.2, b 0.75, idf ``ln(1 + (N - df + 0.5) / (df + 0.5))``): a
query is a set of at most ``max_query_terms`` distinct words; a document's score is the sum,
over the query's words in ascending id order, of ``idf tf (k1 + 1) / (tf + k1 (1 - b + b
dl / avgdl))``; the results are the documents sharing a word with the query, by score
descending (ties: document id ascending), at most ``top_k``, shown in pages of 5.

Tasks
-----
Each episode draws a target document uniformly. Its description names concepts of the
target: the category and the brand (each with probability 0.8), the model name
(``p_model``), each attribute the target has (0.5), each aspect concept (0.8, at least one),
the detail (``p_detail``); if another document contains every named concept, the detail and
then the model name are added, so that the target is the only document that *covers* the
description. Each named concept is written as a synonym with probability ``p_synonym``, and
``n_vague`` vague words (frequent noise words) are added; the words are shuffled into the
description slots. The task is solvable from the description: some description word alone
ranks the target within ``top_k``, or the (at most ``max_query_terms``) description words the
target contains with the largest BM25 weight do together; otherwise the word forms are drawn
again (up to 4 times) and finally the model name is added (its query returns exactly the
entity's ``n_aspects * n_variants <= top_k`` documents). That word or query is the task's
*solution* (privileged: the state and the oracle use it). A document's *title match* is the
fraction of the description's entity-naming concepts (category, brand, model) it contains (0
when the description names none); its *coverage* is the fraction of all the description's
concepts it contains. The target's coverage is 1 and no other document's is. *Relevant*
documents share the target's entity and aspect (the target and its variants).

Actions
-------
Querier: ``0`` stay, ``1`` issue the draft, ``2`` clear the draft, ``3 + j`` toggle candidate
slot ``j`` (add its word to the draft, or drop it). Slots ``0..9``: the description's words
(empty slots after its length); slots ``10..15``: the six words with the largest BM25 weight
in the document the team opened last (the description's own words left out), refreshed at
every open. Each querier has its own draft; issuing puts its results on the shared screen
(the draft stays). Browser: ``0`` stay, ``1 + k`` open result ``k`` (0-4) of its page, ``6``
next page, ``7`` previous page, ``8`` mark its open document as the answer. Each browser has
its own page (reset to the first on every new result list) and open document.

Masked (``action_mask`` 0): issue / clear with an empty draft; toggling an empty slot, or
adding a word to a full draft (``max_query_terms`` words); opening a result that is not on
the page; next on the last page, previous on the first; marking with no open document or one
already marked wrong. Actions may be Python ints or NumPy integers (0-d arrays included).

* An action outside the agent's action space (out of range, or not an integer: float, bool,
  str, ...), a missing or an unknown agent in the action dict: ``ValueError`` naming the agent,
  the action and what is allowed; nothing changes.
* A masked, in-range action: by default a no-op ("stay") that costs ``penalty_invalid`` and
  sets ``infos[agent]["invalid_action"] = 1.0`` (PettingZoo's own tests step with unmasked
  random actions). With ``strict_actions=True`` it raises ``ValueError``; nothing changes.

Step order: masked actions become stay (judged on the state the agents observed) -> queriers
edit their drafts (slots as observed) -> browsers act in order on the list as observed (open,
page, mark; a correct mark ends the step's processing, and so does a wrong one that uses up
``max_answers``) -> queriers that chose issue run their queries in order (the last one's
results stay on screen, every browser back on the first page) -> the last document opened
this step refreshes the harvested slots -> step cost, time, team reward, end.

Observations (``observation``, float32, in [0, 1])
--------------------------------------------------
Querier (192 = 16 + 16 x 9 + 2 x 16), in this order:

==========  =================================================================================
index       meaning
==========  =================================================================================
0           time left, ``max(max_cycles - t, 0) / max_cycles``
1           draft length / ``max_query_terms``
2, 3        the draft equals a query issued before in the episode; its largest Jaccard
            similarity to one (0 before any): repetition is visible *before* issuing
4, 5        queries issued / 10 (at most 1); distinct / issued (0 before any)
6, 7        results on screen / ``top_k``; fraction of them opened by the team
8, 9        best title match on screen; best among the unopened results
10          best coverage of the documents opened so far
11          steps since the result list changed / 10 (at most 1; 1 before the first query)
12, 13      the query on screen is mine; my draft equals it
14          a browser's open document covers the description (the answer is open)
15          answers left / ``max_answers``
16 + 9 j    slot ``j``: filled, in my draft, in the query on screen, names a description
            concept (description slots: all but vague words; harvested slots: the page's word
            for a concept the description paraphrases), harvested, idf / max idf, occurs in
            the corpus, issued queries containing it / 3 (at most 1), fraction of the
            results on screen containing it
160, 176    hashed bag of words (16 buckets) of the description (1/10 per word) and of my
            draft (1 / ``max_query_terms`` per word)
==========  =================================================================================

Browser (56 = 16 + 5 x 8): time left; page / (pages - 1) (0 with one page); has next; has
previous; results / ``top_k``; steps since the list changed / 10; queries issued / 10; answers
left; an open document; its coverage; its title match; it was marked wrong; the best title
match among unopened results on earlier pages; on later pages; fraction of the other
browsers on my page; best coverage opened so far; then per result ``k`` of the page: present,
rank / ``top_k``, score / the top score, fraction of the query's words it contains, title
match, opened by the team, my open document, another browser's open document.

State (``state()``, float32, in [0, 1]): time left, answers left, success, steps since the
list changed / 10, queries issued / 10, distinct fraction, results / ``top_k``, the target
is on screen, its rank / ``top_k`` (1 if not), the target was opened, best coverage opened;
per result slot (``top_k`` x 6): present, score / top, title match, coverage (privileged:
also of unopened results), opened, is the target; per browser (x 5): page, an open document,
its coverage, it is the target, the target is on its page; per querier (x 67): draft length,
draft repeats a query, its largest similarity, per slot: filled, in the draft, the target
contains the word, the word is in the task's solution; hashed description and screen query.

Rewards
-------
Three channels every step for every agent; ``rewards[agent]`` is their sum and
``infos[agent]`` holds them under ``reward_team``, ``reward_individual``, ``reward_penalty``.

===========  ==========================================================  ==================
channel      term                                                        argument (default)
===========  ==========================================================  ==================
team         the target is marked (every agent)                          reward_found 1.0
team         finishing early: times (max_cycles - t) / max_cycles        reward_early 0.5
individual   per relevant document shown for the first time (to the      reward_surface 0.1
             querier whose query put it on the first page, or the
             browser who turned to its page)
penalty      every step                                                  -penalty_step 0.01
penalty      issuing a query identical to one issued before this episode -penalty_repeat
                                                                         0.05
penalty      opening a document the team opened before                   -penalty_reopen
                                                                         0.02
penalty      marking a wrong document                                    -penalty_wrong 0.2
penalty      a masked action (replaced by stay)                          -penalty_invalid
                                                                         0.05
===========  ==========================================================  ==================

Infos (every agent, every step, from reset on; numbers only)
------------------------------------------------------------
``reward_team``, ``reward_individual``, ``reward_penalty``, ``invalid_action``, and the
team's episode metrics so far: ``success`` (1.0 once the target is marked; eval.json's
``success_rate`` is its mean), ``solved`` (the same: one target), ``steps_to_success`` (the
step of success, ``max_cycles`` while not solved), ``queries_issued``, ``query_diversity``
(distinct / issued, 0 before any), ``query_jaccard_diversity`` (mean pairwise Jaccard
distance between the episode's issued queries, repeats included, 0 for fewer than two:
:func:`envs.diversity.mean_pairwise_jaccard`, kept incrementally by the core and tested
equal), ``pages_opened`` (documents opened, reopenings included), ``episode_length``. At the
step where an episode ends they are its final values. ``vector_env.search_sets()`` gives
each env's set of issued queries, for the trainers' search diversity across episodes of one
seed. parallel_env gives Python floats; vector_env float64 arrays ``[num_envs]``.

Episode end: terminated when the target is marked or ``max_answers`` wrong answers are used
up (default 1: marking is answering); truncated when ``t == max_cycles`` (a writable
attribute, read at every step). All agents end together. ``reset(seed=s)`` makes episodes
reproducible; ``reset(seed=None)`` continues the env's random stream; ``options`` are ignored.

Arguments
---------
``preset`` ("easy" | "default" | "hard"; explicit arguments override it), ``n_queriers``,
``n_browsers`` (>= 1), the corpus (``n_entities``, ``n_brands``, ``n_categories``,
``n_attributes``, ``attributes_per_entity``, ``n_aspects``, ``n_variants``, ``n_details``,
``n_noise_terms``, ``doc_noise``, ``p_canonical``, ``corpus_seed``), the tasks
(``p_synonym``, ``p_model``, ``p_detail``, ``n_vague``), ``top_k`` (>= ``n_aspects *
n_variants``), ``max_query_terms``, ``max_cycles``, ``max_answers``, the reward weights above
(penalties are magnitudes >= 0), ``strict_actions``, ``render_mode`` (None | "human" |
"rgb_array" | "ansi"). Impossible values raise ``ValueError``; a wrong type or an unknown
argument raises ``ArgumentTypeError``, both a ``TypeError`` and a ``ValueError``.

=======  =====  ======  =====  ==========  =====  =========  ====================  ===========
preset   docs   agents  top_k  max_cycles  p_syn  p_model    corpus                first query
=======  =====  ======  =====  ==========  =====  =========  ====================  ===========
easy     240    1 + 1   20     30          0.3    0.5        40 entities x 6 x 1   0.95
default  2400   1 + 2   20     40          0.6    0.25       150 x 8 x 2           0.64
hard     7200   2 + 2   30     30          0.9    0 (only    300 x 8 x 3           0.46
                                                  to solve)
=======  =====  ======  =====  ==========  =====  =========  ====================  ===========

"first query": the fraction of tasks whose target is among the results of the heuristic's first
query (the description's rarest words), i.e. how often the obvious query works.

Baselines (``envs.websearch_baselines``; one episode per seed 0..255,
``evaluate_websearch_baseline``; success = target marked; steps = steps to success,
``max_cycles`` when not solved):

=======  =========  =======  =====  =======  =========  ==========  ======  ======
preset   policy     success  steps  queries  diversity  jaccard     opened  return
=======  =========  =======  =====  =======  =========  ==========  ======  ======
easy     random     0.035    29.5   1.6      0.86       0.22        4.9     -0.22
easy     heuristic  0.957    9.6    1.3      1.00       0.03        2.3     1.25
easy     oracle     1.000    4.5    1.0      1.00       0.00        1.0     1.43
default  random     0.027    39.4   1.4      0.92       0.14        6.5     -0.21
default  heuristic  0.801    17.9   3.0      1.00       0.18        5.8     0.94
default  oracle     1.000    5.6    1.0      1.00       0.00        1.0     1.41
hard     random     0.008    29.9   1.7      0.91       0.26        6.3     -0.16
hard     heuristic  0.656    19.7   3.2      1.00       0.24        8.1     0.66
hard     oracle     1.000    6.1    1.0      1.00       0.00        1.0     1.37
=======  =========  =======  =====  =======  =========  ==========  ======  ======

Each preset leaves headroom: the masked random policy stays below 0.04, the scripted
heuristic (it reads only what the agents observe) is far above it and below the perfect-
knowledge oracle, which solves every task (the headroom check: every task is solvable within
the time limit). A heuristic browser with random queriers reaches 0.43 on ``default``, a
heuristic querier with random browsers 0.07: reading the results is learnt first, varying
the queries is what separates a good team from it. ``p_model=0`` in ``hard``: the model name
appears only where a task would otherwise be ill-posed or unsolvable (28% of the tasks).

vector_env
----------
``vector_env(num_envs, autoreset=True, **kw)`` steps ``num_envs`` episodes in one compiled
loop (the same core that ``parallel_env`` uses with one env). ``reset(seed=s)`` seeds env i
with ``s + i`` (a sequence seeds each env; ``None`` continues each env's stream), so env i
behaves exactly like ``parallel_env(**kw)`` reset with seed ``s + i`` under the same actions
until its episode ends. ``step(actions)`` takes ``{agent: int array [N]}`` and returns dicts
keyed by agent: ``obs[a] = {"observation": float32 [N, obs_dim], "action_mask": int8 [N,
n]}``, ``rewards[a]`` float32 [N], ``terminations[a]``/``truncations[a]`` bool [N],
``infos[a]`` dict of float64 [N]. Arrays are fresh each step (safe to keep).

Autoreset timing (``autoreset=True``, "same step"): when env i's episode ends at a step, that
step's rewards, flags and infos (final metrics) belong to the ending transition, while the
returned observation and ``state()`` already belong to the next episode, reset from env i's own
random stream. The final observation / state are in ``vec.final_obs`` / ``vec.final_state``
(rows of envs that did not end hold the current ones). With ``autoreset=False`` an ended env is
frozen until ``reset()``: later steps leave it unchanged, give zero rewards and zero infos, and
keep its termination/truncation flags True.

Speed
-----
``python benchmarks/env_throughput.py`` measures it next to mpe2's ``simple_spread_v3`` in one
run; the current figures are in BENCHMARKS.md (environment throughput).
Episode arrays: about 37 KB per env on ``hard`` (the corpus, 4-11 MB, is shared).

Rendering: ``ansi`` (the description, drafts, the query on screen, the pages the browsers
view with title match / coverage / opened / target marks, open documents), ``rgb_array``
(uint8 ``[(top_k + 2) * 10, 200, 3]``: time and queries, one row per result, see
:func:`render_rgb`), ``human`` (prints the ansi frame; returns None).

Example
-------
>>> from envs import websearch_v0
>>> env = websearch_v0.parallel_env()
>>> obs, infos = env.reset(seed=0)
>>> sorted(obs)
['browser_0', 'browser_1', 'querier_0']
>>> obs["querier_0"]["observation"].shape, obs["browser_0"]["action_mask"].dtype
((192,), dtype('int8'))
>>> actions = {"querier_0": 3, "browser_0": 0, "browser_1": 0}  # draft the first word
>>> obs, rewards, terminations, truncations, infos = env.step(actions)
>>> round(rewards["querier_0"], 4) == round(sum(
...     infos["querier_0"][k] for k in ("reward_team", "reward_individual", "reward_penalty")), 4)
True

Version History
---------------
A change that alters observations, rewards, tasks or dynamics bumps the module version
(``websearch_v0`` -> ``websearch_v1``, ``metadata["name"]`` with it) and adds a line here.

* v0: Initial release: the corpus, BM25 engine, tasks, two agent types, observations, rewards
  and metrics described above.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium
import numpy as np

from envs._pettingzoo import CoreParallelEnv, CoreVectorEnv, constructors, two_type_spaces
from envs.errors import ArgumentTypeError
from envs.websearch import (
    BROWSER_ACTION_NAMES,
    METRIC_NAMES,
    N_ACTIONS_BROWSER,
    N_ACTIONS_QUERIER,
    PAGE_SIZE,
    PRESETS,
    QUERIER_ACTION_NAMES,
    WebSearchConfig,
    WebSearchCore,
    make_versioned_config,
)

__all__ = [
    "BASELINES",
    "PRESETS",
    "ArgumentTypeError",
    "WebSearchConfig",
    "WebSearchParallelEnv",
    "WebSearchVectorEnv",
    "env",
    "parallel_env",
    "raw_env",
    "vector_env",
]

#: the module with this env's baselines (``HeuristicPolicy``, ``RandomPolicy``, ...)
BASELINES = "envs.websearch_baselines"

METADATA: dict[str, Any] = {
    "name": "websearch_v0",
    "render_modes": ["human", "rgb_array", "ansi"],
    "is_parallelizable": True,
    "render_fps": 4,
}
REWARD_KEYS = ("reward_team", "reward_individual", "reward_penalty")
METRIC_KEYS = METRIC_NAMES  # the episode metrics in infos (envs.websearch.metrics)
INFO_KEYS = REWARD_KEYS + ("invalid_action",) + METRIC_KEYS


def _make_spaces(
    config: WebSearchConfig,
) -> tuple[dict[str, gymnasium.spaces.Dict], dict[str, gymnasium.spaces.Discrete], Any]:
    return two_type_spaces(
        config.agent_names,
        "querier_",
        0.0,
        (config.obs_dim_querier, config.obs_dim_browser),
        (N_ACTIONS_QUERIER, N_ACTIONS_BROWSER),
        config.state_dim,
    )


def _action_names(config: WebSearchConfig, index: int) -> tuple[str, ...]:
    return QUERIER_ACTION_NAMES if index < config.n_queriers else BROWSER_ACTION_NAMES


# ---- rendering ---------------------------------------------------------------------------
def render_ansi(core: WebSearchCore, env: int = 0) -> str:
    """Text frame of env ``env``: the task (the target is shown; agents never see it), the
    drafts, the query on screen and its results, each browser's page and open document."""
    cfg, c = core.config, core.corpus
    n = env

    def words(terms: np.ndarray) -> str:
        return " ".join(c.term_name(int(x)) for x in terms if x >= 0) or "-"

    target = int(core.target[n])
    metrics = {k: float(v[n]) for k, v in core.metrics().items()}
    lines = [
        f"websearch_v{cfg.version}  t={int(core.t[n])}/{cfg.max_cycles}  "
        f"success={int(core.success[n])}  "
        f"answers_left={int(core.answers_left[n])}  queries={int(core.n_issued[n])} "
        f"(diversity {metrics['query_diversity']:.2f}, jaccard "
        f"{metrics['query_jaccard_diversity']:.2f})  opened={int(core.pages_opened[n])}",
        f"description: {words(core.desc_terms[n])}",
        f"target:      doc {target} = entity {int(c.doc_entity[target])}, aspect "
        f"{int(c.doc_aspect[target])}, variant {int(c.doc_variant[target])} (hidden)",
    ]
    for q in range(cfg.n_queriers):
        lines.append(f"querier_{q} draft: {{{words(core.draft[n, q])}}}")
    lines.append(f"harvested:   {words(core.harvest[n])}")
    owner = int(core.query_owner[n])
    shown = f"querier_{owner}" if owner >= 0 else "nobody"
    nr = int(core.n_results[n])
    lines.append(f"on screen:   {{{words(core.query[n])}}} by {shown}: {nr} results")
    pages = {int(p) for p in core.page[n]}
    for r in range(nr):
        d = int(core.results[n, r])
        flags = ("T" if d == target else " ") + ("o" if core.opened[n, d] else " ")
        viewers = [f"b{b}" for b in range(cfg.n_browsers) if core.page[n, b] == r // PAGE_SIZE]
        if r // PAGE_SIZE in pages:
            lines.append(
                f"  {r + 1:>3} {flags} doc {d:<6} score {core.res_score[n, r]:6.2f}  title "
                f"{core.res_title[n, r]:.2f}  cover {core.res_cover[n, r]:.2f}  "
                f"{' '.join(viewers)}"
            )
    for b in range(cfg.n_browsers):
        d = int(core.open_doc[n, b])
        opened = f"doc {d}" if d >= 0 else "nothing"
        lines.append(f"browser_{b}: page {int(core.page[n, b]) + 1}, open: {opened}")
    return "\n".join(lines)


_BACKGROUND = np.array([245, 245, 240], dtype=np.uint8)


def render_rgb(core: WebSearchCore, env: int = 0, cell_px: int = 10) -> np.ndarray:
    """Image of env ``env``: uint8 ``[(top_k + 2) * cell_px, 20 * cell_px, 3]``.

    Top row: time left (grey bar), queries issued (blue ticks). One row per result: a grey
    bar of its BM25 score (relative to the top), then title match (green), coverage of the
    description (blue), opened (dark), the target (red), and which browsers view its page
    (orange, one cell per browser); rows beyond the results stay empty. Bottom row: success
    (green) or answers used (red).
    """
    if cell_px < 3:
        raise ValueError(f"cell_px must be >= 3, got {cell_px}")
    cfg = core.config
    n = env
    rows, cols = cfg.top_k + 2, 20
    cells = np.empty((rows, cols, 3), dtype=np.uint8)
    cells[:] = _BACKGROUND
    left = max(cfg.max_cycles - int(core.t[n]), 0) / cfg.max_cycles
    cells[0, : int(round(left * 10))] = (150, 150, 150)
    cells[0, 10 : 10 + min(int(core.n_issued[n]), 10)] = (40, 90, 220)
    top = core.res_score[n, 0] if core.n_results[n] > 0 else 1.0
    target = int(core.target[n])
    for r in range(int(core.n_results[n])):
        d = int(core.results[n, r])
        row = r + 1
        cells[row, : max(1, int(round(10 * core.res_score[n, r] / top)))] = (120, 120, 120)
        cells[row, 11] = (
            255 - int(200 * core.res_title[n, r]),
            230,
            255 - int(200 * core.res_title[n, r]),
        )
        cells[row, 12] = (
            255 - int(200 * core.res_cover[n, r]),
            255 - int(150 * core.res_cover[n, r]),
            250,
        )
        if core.opened[n, d]:
            cells[row, 13] = (50, 50, 55)
        if d == target:
            cells[row, 14] = (215, 30, 30)
        for b in range(min(cfg.n_browsers, 5)):
            if int(core.page[n, b]) == r // PAGE_SIZE:
                cells[row, 15 + b] = (240, 150, 30)
    if core.success[n]:
        cells[-1, :] = (20, 150, 60)
    else:
        used = cfg.max_answers - int(core.answers_left[n])
        cells[-1, : used * cols // cfg.max_answers] = (215, 30, 30)
    img = np.repeat(np.repeat(cells, cell_px, axis=0), cell_px, axis=1)
    img[::cell_px, :, :] = (img[::cell_px, :, :] * 0.9).astype(np.uint8)
    return img


class _HumanRenderer:
    """Prints the ansi frame (a text environment has no better window)."""

    def show(self, core: WebSearchCore, env: int) -> None:
        print(render_ansi(core, env), flush=True)

    def close(self) -> None:
        """Nothing to close: the frames went to stdout."""


class _WebSearchFace:
    """What both faces of websearch put into the shared ones (:mod:`envs._pettingzoo`)."""

    metadata = METADATA
    #: the env version (``websearch_v1`` subclasses with 1; the core switches on it)
    version = 0
    _core_class = WebSearchCore
    _make_spaces = staticmethod(_make_spaces)
    _render_rgb = staticmethod(render_rgb)
    _render_ansi = staticmethod(render_ansi)

    def _human_renderer(self) -> _HumanRenderer:
        return _HumanRenderer()

    def _action_label(self, index: int, action: int) -> str:
        return f"{action} ({_action_names(self.config, index)[action]})"


class WebSearchParallelEnv(_WebSearchFace, CoreParallelEnv):
    """The PettingZoo Parallel env (one episode of the vectorised core). See the module doc."""

    def __init__(self, preset: str = "default", render_mode: str | None = None, **kwargs: Any):
        super().__init__(make_versioned_config(self.version, preset, kwargs), render_mode)

    def queries(self) -> list[frozenset[int]]:
        """The queries issued so far in this episode, in order (sets of term ids)."""
        return self._core.queries(0)

    @staticmethod
    def _check_seed(seed: Any) -> None:
        """Unchecked: ``reset`` hands the seed to ``np.random.default_rng`` (as released)."""


class WebSearchVectorEnv(_WebSearchFace, CoreVectorEnv):
    """``num_envs`` websearch episodes stepped together (see the module doc, "vector_env").

    Spaces are the single-env spaces; arrays carry a leading ``num_envs`` axis.
    """

    _check_each_action_dtype = False  # as released: see CoreVectorEnv

    def __init__(
        self,
        num_envs: int,
        autoreset: bool = True,
        preset: str = "default",
        render_mode: str | None = None,
        **kwargs: Any,
    ) -> None:
        config = make_versioned_config(self.version, preset, kwargs)
        super().__init__(num_envs, autoreset, config, render_mode)

    def search_sets(self) -> list[frozenset[frozenset[int]]]:
        """Per env, the set of queries (each a frozenset of term ids) issued in the current
        episode (with ``autoreset=False``, the finished one): the sets whose mean pairwise
        Jaccard distance over episodes from the same reset seed is the search-diversity
        metric of the trainers' evaluation (:mod:`envs.diversity`)."""
        return [frozenset(self._core.queries(i)) for i in range(self.num_envs)]

    def queries(self, index: int) -> list[frozenset[int]]:
        """The queries issued so far in env ``index``'s episode, in order (sets of term ids)."""
        self._check_index(index)
        return self._core.queries(index)

    def _env_seeds(self, seed: int | Sequence[int]) -> list[int]:
        """As released: its own messages (a non-sequence seed is numpy's TypeError)."""
        n = self.num_envs
        if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
            if seed < 0:
                raise ValueError(f"seed must be >= 0, got {seed}")
            return [int(seed) + i for i in range(n)]
        seeds = list(seed)
        if len(seeds) != n or not all(
            isinstance(s, (int, np.integer)) and not isinstance(s, bool) and s >= 0 for s in seeds
        ):
            raise ValueError(
                f"seed must be None, an int >= 0 or a sequence of {n} ints >= 0, got {seed!r}"
            )
        return [int(s) for s in seeds]


# ---- PettingZoo-style constructors: parallel_env(**kw), env(**kw) (``parallel_to_aec`` of
# parallel_env), raw_env(**kw) (without the order-enforcing wrapper),
# vector_env(num_envs, autoreset=True, **kw)
parallel_env, env, raw_env, vector_env = constructors(WebSearchParallelEnv, WebSearchVectorEnv)
