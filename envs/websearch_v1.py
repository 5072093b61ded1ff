"""websearch_v1: cooperating agents search a simulated web for a vaguely described page
(PettingZoo Parallel + AEC + vector).

The environment of :mod:`envs.websearch_v0` (which documents everything this page does not),
with the answer's rewards and costs changed and two browser observation features added.
Corpus, engine, tasks, actions, masks, querier observations, state, infos, metrics, rendering
and ``vector_env`` are v0's. This page lists what differs, then the baselines, speed and
learning figures of v1.

=====================  ===================================================================
Import                 ``from envs import websearch_v1``
Constructors           ``parallel_env(**kw)``, ``env(**kw)`` (AEC, ``parallel_to_aec``),
                       ``raw_env(**kw)`` (AEC without the order-enforcing wrapper),
                       ``vector_env(num_envs, autoreset=True, **kw)``
Agents                 ``querier_0..``, ``browser_0..`` (as v0)
Action spaces          queriers ``Discrete(19)``, browsers ``Discrete(9)`` (as v0)
Observation spaces     ``Dict(observation=Box(0, 1, (obs_dim,), float32),
                       action_mask=Box(0, 1, (n_actions,), int8))``; obs_dim: queriers 192
                       (as v0), browsers **63** (v0: 56; every preset)
State space            as v0: state_dim = 43 + 6 top_k + 5 n_browsers + 67 n_queriers
                       (default preset: 240)
metadata               ``name="websearch_v1"``, otherwise as v0
Arguments              v0's, and ``reward_read``, ``reward_answer`` (below)
Baselines              ``BASELINES = "envs.websearch_baselines"`` (heuristic, random, oracle)
=====================  ===================================================================

What v1 changes
---------------
Rewards: v0's terms (see v0's "Rewards") and these:

===========  ==========================================================  ==================
channel      term                                                        argument (default)
===========  ==========================================================  ==================
individual   reading (opt-in): to the browser that opens a document,     reward_read 0.0
             times the coverage it adds to the best coverage opened so
             far (``max(0, coverage - best)``; at most ``reward_read``
             per episode, reached by opening the target)
individual   the right answer: to the browser that marks the target      reward_answer 0.5
penalty      a wrong answer that ends the episode: the steps it skips,   -penalty_step
             ``max_cycles - t``, to every agent (failing early costs     per step
             what running out of time costs)
===========  ==========================================================  ==================

Observations (browser, 63 = 18 + 5 x 9): time left; page / (pages - 1) (0 with one page); has
next; has previous; results / ``top_k``; steps since the list changed / 10; queries issued /
10; answers left; an open document; its coverage; its title match; it was marked wrong; the
best title match among unopened results on earlier pages; on later pages; fraction of the
other browsers on my page; best coverage opened so far; (v1) the best description match among
unopened results on earlier pages; on later pages; then per result ``k`` of the page: present,
rank / ``top_k``, score / the top score, fraction of the query's words it contains, title
match, opened by the team, my open document, another browser's open document, (v1) its
*description match*: the fraction of the description's words (as written, vague words
included) that the document contains -- the words a result's snippet would highlight, which
browsers compare to choose what to open (the target contains every description concept, but
a paraphrased one in another word form, so the match is a clue, not the answer).

Baselines
---------
v0's presets (see v0's "Arguments"); one episode per seed 0..255,
``envs.websearch_baselines.evaluate_websearch_baseline(..., version=1)``; success = target
marked; steps = steps to success, ``max_cycles`` when not solved; return = mean per-agent
return, all three channels (success figures as v0's, returns differ):

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

Speed: v0's "Speed" table (measured on v0, whose core v1 shares): v1 computes each result's
description match once per query (its speed against v0: BENCHMARKS.md, environment
throughput).

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

from envs import websearch_v0
from envs._pettingzoo import constructors
from envs.errors import ArgumentTypeError
from envs.websearch import PRESETS, WebSearchConfig
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
BASELINES = websearch_v0.BASELINES

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


parallel_env, env, raw_env, vector_env = constructors(WebSearchParallelEnv, WebSearchVectorEnv)
