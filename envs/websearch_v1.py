"""websearch_v1: cooperating agents search a simulated web for a vaguely described page
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
Import                 ``from envs import websearch_v1``
Constructors           ``parallel_env(**kw)``, ``env(**kw)`` (AEC, ``parallel_to_aec``),
                       ``raw_env(**kw)`` (AEC without the order-enforcing wrapper),
                       ``vector_env(num_envs, autoreset=True, **kw)``
Agents                 ``querier_0..querier_{n_queriers-1}``,
                       ``browser_0..browser_{n_browsers-1}`` (queriers first; that order
                       breaks ties); agent type = the name before the last ``_``
Action spaces          queriers ``Discrete(19)``, browsers ``Discrete(9)``
Observation spaces     ``Dict(observation=Box(0, 1, (obs_dim,), float32),
                       action_mask=Box(0, 1, (n_actions,), int8))``; obs_dim: queriers 192,
                       browsers 63 (every preset)
State space            ``Box(0, 1, (state_dim,), float32)``, state_dim = 43 + 6 top_k +
                       5 n_browsers + 67 n_queriers (default preset: 240)
metadata               ``name="websearch_v1"``, ``is_parallelizable=True``,
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

Browser (63 = 18 + 5 x 9): time left; page / (pages - 1) (0 with one page); has next; has
previous; results / ``top_k``; steps since the list changed / 10; queries issued / 10; answers
left; an open document; its coverage; its title match; it was marked wrong; the best title
match among unopened results on earlier pages; on later pages; fraction of the other
browsers on my page; best coverage opened so far; (v1) the best description match among
unopened results on earlier pages; on later pages; then per result ``k`` of the page: present,
rank / ``top_k``, score / the top score, fraction of the query's words it contains, title
match, opened by the team, my open document, another browser's open document, (v1) its
*description match*: the fraction of the description's words (as written, vague words
included) that the document contains -- the words a result's snippet would highlight, which
browsers compare to choose what to open (the target contains every description concept, but
a paraphrased one in another word form, so the match is a clue, not the answer).

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
individual   reading (v1, opt-in): to the browser that opens a document,  reward_read 0.0
             times the coverage it adds to the best coverage opened so
             far (``max(0, coverage - best)``; at most ``reward_read``
             per episode, reached by opening the target)
individual   the right answer (v1): to the browser that marks the        reward_answer 0.5
             target
penalty      every step                                                  -penalty_step 0.01
penalty      a wrong answer that ends the episode (v1): the steps it     -penalty_step
             skips, ``max_cycles - t``, to every agent (failing early    per step
             costs what running out of time costs)
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
(penalties are magnitudes >= 0; ``reward_read``, ``reward_answer`` are new in v1),
``strict_actions``,
``render_mode`` (None | "human" | "rgb_array" | "ansi"). Impossible values raise
``ValueError``; a wrong type or an unknown argument raises ``ArgumentTypeError``, both a
``TypeError`` and a ``ValueError``.

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
``evaluate_policy(..., version=1)``; success = target marked; steps = steps to success,
``max_cycles`` when not solved; return = mean per-agent return, all three channels):

=======  =========  =======  =====  =======  =========  ==========  ======  ======
preset   policy     success  steps  queries  diversity  jaccard     opened  return
=======  =========  =======  =====  =======  =========  ==========  ======  ======
easy     random     0.035    29.5   1.6      0.86       0.22        4.9     -0.32
easy     heuristic  0.957    9.6    1.3      1.00       0.03        2.3     1.49
easy     oracle     1.000    4.5    1.0      1.00       0.00        1.0     1.68
default  random     0.027    39.4   1.4      0.92       0.14        6.5     -0.42
default  heuristic  0.801    17.9   3.0      1.00       0.18        5.8     1.07
default  oracle     1.000    5.6    1.0      1.00       0.00        1.0     1.58
hard     random     0.008    29.9   1.7      0.91       0.26        6.3     -0.34
hard     heuristic  0.656    19.7   3.2      1.00       0.24        8.1     0.74
hard     oracle     1.000    6.1    1.0      1.00       0.00        1.0     1.50
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
``python benchmarks/env_throughput.py`` (random in-range actions, auto-resets included,
measured in one run next to mpe2's ``simple_spread_v3``; 2 shared vCPUs under load, load
average 17; measured on v0, whose core v1 shares: v1 computes each result's description match
once per query, and runs at about 0.9x v0's env steps per CPU-second, vector_env(256) default,
random legal actions):

==============================================  =============  ===============  ==========
environment                                     agent-steps/s  x simple_spread  per CPU-s
==============================================  =============  ===============  ==========
mpe2 simple_spread_v3 parallel (3 agents)       5,397          1.0x             13,251
websearch_v0 parallel_env (default, 3 agents)   52,133         9.7x             104,343
websearch_v0 vector_env(256) default            922,036        171x             1,859,672
websearch_v0 vector_env(1024) default           1,011,372      187x             2,035,701
==============================================  =============  ===============  ==========

Target (issue 20): vector_env(256) >= 100x simple_spread: met (171x wall, 140x per CPU-second).
Episode arrays: about 37 KB per env on ``hard`` (the corpus, 4-11 MB, is shared).

Rendering: ``ansi`` (the description, drafts, the query on screen, the pages the browsers
view with title match / coverage / opened / target marks, open documents), ``rgb_array``
(uint8 ``[(top_k + 2) * 10, 200, 3]``: time and queries, one row per result, see
:func:`render_rgb`), ``human`` (prints the ansi frame; returns None).

Learning
--------
Default MAPPO, ``python -m marl.train --env-fn envs.websearch_v1:vector_env --total-steps
3567616 --seed S --torch-threads 1`` (mlp, 64 envs; 3.57M env steps = 240 s of one idle core
at the 14,900 env steps per CPU-second that default MAPPO runs on websearch_v0 ``default``),
eval.json success_rate on the 32 validation seeds 10000..10031 (random 0.00, heuristic 0.81
there): seed 0 0.00, seed 1 0.38, seed 2 0.50; the periodic evaluations peak at 0.88, 0.81,
0.91. websearch_v0 under the same command: 0.16 at 0.5M steps (open
the top result and mark it). Known weakness: after a single update with approx_kl > 0.1 the
browsers may switch to opening a document every step, so that none is ever answered, and
the team does not recover (seed 0 at 3.06M steps; seed 1's last update, KL 0.016, took its
final evaluation from 0.78 to 0.38).

Example
-------
>>> from envs import websearch_v1
>>> env = websearch_v1.parallel_env()
>>> obs, infos = env.reset(seed=0)
>>> sorted(obs)
['browser_0', 'browser_1', 'querier_0']
>>> obs["querier_0"]["observation"].shape, obs["browser_0"]["observation"].shape
((192,), (63,))
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
  and metrics (``envs.websearch_v0``, still importable and unchanged).
* v1: Default MAPPO learns it (v0 stalled at "open the top result and mark", 0.16): a wrong
  answer that ends the episode costs the step costs it skips (in v0 failing early was cheaper
  than searching on, so the individual channel taught browsers to mark anything); the browser
  that marks the target gets the individual ``reward_answer``, as multisearch's rescuers do
  for a collection (in v0 the wrong answers' costs were the browsers' own while the right
  answer's reward was only the shared team one); browser observations add each result's
  description match and the best one on earlier / later pages (56 -> 63). An opt-in reading
  reward ``reward_read`` (coverage gained by opened documents; default 0) speeds early
  learning, but runs with it at 0.3 collapsed after ~1.5M steps into "open every step, never
  answer". Tasks, corpus, actions, querier observations, state and metrics are unchanged: the
  baselines' success figures are v0's, their returns differ.
"""

from __future__ import annotations

from typing import Any

from pettingzoo.utils.conversions import parallel_to_aec, parallel_to_aec_wrapper

from envs import websearch_v0
from envs._websearch_core import PRESETS, ArgumentTypeError, WebSearchConfig
from envs.websearch_v0 import INFO_KEYS, METRIC_KEYS, REWARD_KEYS, render_ansi, render_rgb

__all__ = [
    "BASELINES",
    "INFO_KEYS",
    "METRIC_KEYS",
    "PRESETS",
    "REWARD_KEYS",
    "ArgumentTypeError",
    "WebSearchConfig",
    "WebSearchParallelEnv",
    "WebSearchVectorEnv",
    "env",
    "render_ansi",
    "render_rgb",
    "parallel_env",
    "raw_env",
    "vector_env",
]

#: the module with this env's baselines (``HeuristicPolicy``, ``RandomPolicy``, ...)
BASELINES = "envs.websearch_baselines"

METADATA: dict[str, Any] = {**websearch_v0.METADATA, "name": "websearch_v1"}


# The env classes are v0's with ``version = 1``: the core switches the few v1 rules on the
# config's version (one copy of the dynamics), and the spaces follow the config's sizes.
class WebSearchParallelEnv(websearch_v0.WebSearchParallelEnv):
    """The PettingZoo Parallel env, version 1 (see the module doc)."""

    metadata = METADATA
    version = 1


class WebSearchVectorEnv(websearch_v0.WebSearchVectorEnv):
    """``num_envs`` websearch_v1 episodes stepped together (see the module doc)."""

    metadata = METADATA
    version = 1


def parallel_env(**kwargs: Any) -> WebSearchParallelEnv:
    """The Parallel env (see the module doc for the arguments)."""
    return WebSearchParallelEnv(**kwargs)


def raw_env(**kwargs: Any) -> parallel_to_aec_wrapper:
    """The AEC env without PettingZoo's order-enforcing wrapper."""
    return parallel_to_aec_wrapper(WebSearchParallelEnv(**kwargs))


def env(**kwargs: Any) -> Any:
    """The AEC env (``parallel_to_aec`` of :func:`parallel_env`)."""
    return parallel_to_aec(WebSearchParallelEnv(**kwargs))


def vector_env(num_envs: int, autoreset: bool = True, **kwargs: Any) -> WebSearchVectorEnv:
    """``num_envs`` episodes stepped together (see the module doc, "vector_env")."""
    return WebSearchVectorEnv(num_envs, autoreset=autoreset, **kwargs)
