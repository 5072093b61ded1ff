"""websearch_v2: cooperating agents search a simulated web for a vaguely described page
(PettingZoo Parallel + AEC + vector).

The environment of :mod:`envs.websearch_v1` (whose rules are :mod:`envs.websearch_v0`'s plus
the v1 rewards and browser features; both modules document everything this page does not),
with one browser observation feature added. Corpus, engine, tasks, actions, masks, rewards,
state, infos, metrics, rendering, ``vector_env`` and speed are v1's: under the same actions
v2 gives the same rewards, flags, infos and state, and the same observations apart from the
new feature. This page lists what differs, then the presets and their baselines.

=====================  ===================================================================
Import                 ``from envs import websearch_v2``
Constructors           ``parallel_env(**kw)``, ``env(**kw)`` (AEC, ``parallel_to_aec``),
                       ``raw_env(**kw)`` (AEC without the order-enforcing wrapper),
                       ``vector_env(num_envs, autoreset=True, **kw)``
Agents                 ``querier_0..``, ``browser_0..`` (as v1)
Action spaces          queriers ``Discrete(19)``, browsers ``Discrete(9)`` (as v1)
Observation spaces     ``Dict(observation=Box(0, 1, (obs_dim,), float32),
                       action_mask=Box(0, 1, (n_actions,), int8))``; obs_dim: queriers 192
                       (as v1), browsers **64** (v1: 63; every preset)
State space            as v1: state_dim = 43 + 6 top_k + 5 n_browsers + 67 n_queriers
                       (default preset: 240)
metadata               ``name="websearch_v2"``, otherwise as v1
Arguments              as v1 (``reward_read``, ``reward_answer`` included, same defaults)
Baselines              ``BASELINES = "envs.websearch_baselines"`` (heuristic, random, oracle)
=====================  ===================================================================

What v2 changes
---------------
Browser observation index **18**: *my open document covers the description*, 1.0 when the
browser has a document open that contains every concept the description names, else 0. Only
the target covers the description (see v0's "Tasks"), so the feature is 1 exactly while the
browser holds the answer. The per-result features move up by one: result ``k``'s 9 features
(v1's, in v1's order) start at ``19 + 9 k`` (v1: ``18 + 9 k``). Indices 0-17 are v1's.

Why: v1 already shows the open document's coverage (index 9), so "mark iff coverage is 1"
was observable, but only as a step of a continuous input between the best wrong documents
(coverage up to 0.89 in the rollouts of default MAPPO on ``default``) and the target (1.0).
A policy network has to build that step out of steep weights, and the mark logit on
answer-holding states was fragile: default MAPPO on v1 had 6-10 updates per seed with
approx_kl > 0.05 (max 0.15-0.36; v2 seeds 0-2: none, max 0.010), and after some of them
the browsers never answered (training success 0, every episode 40 steps: seed 0 at updates
307 and 1493, seed 1 at 422, seed 2 at 605 and 1519). Seed 0's update 307, replayed: P(mark
| the target is open) went from 0.55 to below 1e-4 within 6 of its 16 minibatch steps while
the other actions barely moved (KL 13.5 on those states, 0.03 on the other browser states);
the gradient of each of the first 8 steps pointed towards *more* marking, the Adam steps
(per-parameter scaled, with momentum, mostly in the first layer) took the steep mark logit
the other way at every step. The team then settled into doing nothing (final success
0.00). With the decision on a binary input the answer is one weight away, as it already is
for queriers (their index 14: "a browser's open document covers the description").

Observations (browser, 64 = 19 + 5 x 9): time left; page / (pages - 1); has next; has
previous; results / ``top_k``; steps since the list changed / 10; queries issued / 10; answers
left; an open document; its coverage; its title match; it was marked wrong; the best title
match among unopened results on earlier pages; on later pages; fraction of the other browsers
on my page; best coverage opened so far; the best description match among unopened results
on earlier pages; on later pages; (v2) my open document covers the description; then per
result ``k`` of the page: present, rank / ``top_k``, score / the top score, fraction of the
query's words it contains, title match, opened by the team, my open document, another
browser's open document, its description match.

Presets and baselines
---------------------
=======  =====  ======  =====  ==========  =====  =========  ====================  ===========
preset   docs   agents  top_k  max_cycles  p_syn  p_model    corpus                first query
=======  =====  ======  =====  ==========  =====  =========  ====================  ===========
easy     240    1 + 1   20     30          0.3    0.5        40 entities x 6 x 1   0.95
default  2400   1 + 2   20     40          0.6    0.25       150 x 8 x 2           0.64
hard     7200   2 + 2   30     30          0.9    0 (only    300 x 8 x 3           0.46
                                                  to solve)
=======  =====  ======  =====  ==========  =====  =========  ====================  ===========

"first query": the fraction of tasks whose target is among the results of the heuristic's
first query. Baselines: one episode per seed 0..255 (the loop of
``envs.websearch_baselines.evaluate_websearch_baseline`` on this module; the scripted
policies read the core's arrays, not the observations, so they play v2 exactly as v1, and the
figures are v1's); success = target marked; steps = steps to success, ``max_cycles`` when not
solved; return = mean per-agent return, all three channels:

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

Learning
--------
Default MAPPO, ``python -m marl.train --env-fn envs.websearch_v2:vector_env --total-steps
3567616 --seed S --torch-threads 1`` (mlp, 64 envs; 3.57M env steps: the 4-minute budget at
the 14,900 env steps per CPU-second of default MAPPO on websearch), eval.json success_rate on
the 32 validation seeds 10000..10031 (random 0.00, heuristic 0.81 there):

====  =======  =====  =======  =========  =======  ======  ===========  =====  =======
seed  success  steps  queries  diversity  jaccard  opened  eval at 1M   at 2M  max KL
====  =======  =====  =======  =========  =======  ======  ===========  =====  =======
0     0.81     19.1   2.3      1.00       0.26     12.9    0.75         0.84   0.009
1     0.84     16.5   2.4      1.00       0.26     9.0     0.75         0.84   0.010
2     0.78     20.5   2.6      1.00       0.42     12.4    0.72         0.81   0.009
====  =======  =====  =======  =========  =======  ======  ===========  =====  =======

Target (issue 20: uniform random + 0.2 = 0.227 on every seed): met on all three (v1 under the
same command: 0.00, 0.38, 0.50). "eval at 1M / 2M": the periodic validation success at that
many env steps; "max KL": the largest approx_kl of the run's 1742 updates (v1: 0.36, 0.36,
0.15, with 6-10 updates above 0.05 per seed; v2: none).

Example
-------
>>> from envs import websearch_v2
>>> env = websearch_v2.parallel_env()
>>> obs, infos = env.reset(seed=0)
>>> obs["querier_0"]["observation"].shape, obs["browser_0"]["observation"].shape
((192,), (64,))
>>> float(obs["browser_0"]["observation"][18])  # nothing open yet: not holding the answer
0.0

Version History
---------------
A change that alters observations, rewards, tasks or dynamics bumps the module version
(``metadata["name"]`` with it) and adds a line here.

* v0: Initial release: the corpus, BM25 engine, tasks, two agent types, observations, rewards
  and metrics (``envs.websearch_v0``, still importable and unchanged).
* v1: A wrong answer that ends the episode costs the step costs it skips; the browser that
  marks the target gets ``reward_answer``; browsers see each result's description match;
  opt-in ``reward_read`` (``envs.websearch_v1``, still importable and unchanged).
* v2: Browsers observe "my open document covers the description" (63 -> 64 features), so
  that answering is a binary input instead of a step of the coverage feature: default MAPPO
  on v1 lost answering in one update on seed 0 (success 0.00 at the 4-minute budget).
  Everything else, including the baselines' play and figures, is v1's.
"""

from __future__ import annotations

from typing import Any

from envs import websearch_v0
from envs._pettingzoo import constructors
from envs.errors import ArgumentTypeError
from envs.websearch import PRESETS, WebSearchConfig
from envs.websearch_v1 import (
    BASELINES,
    INFO_KEYS,
    METRIC_KEYS,
    REWARD_KEYS,
    render_ansi,
    render_rgb,
)

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

METADATA: dict[str, Any] = {**websearch_v0.METADATA, "name": "websearch_v2"}


# The env classes are v0's with ``version = 2``: the core switches the v1 and v2 rules on the
# config's version (one copy of the dynamics), and the spaces follow the config's sizes.
class WebSearchParallelEnv(websearch_v0.WebSearchParallelEnv):
    """The PettingZoo Parallel env, version 2 (see the module doc)."""

    metadata = METADATA
    version = 2


class WebSearchVectorEnv(websearch_v0.WebSearchVectorEnv):
    """``num_envs`` websearch_v2 episodes stepped together (see the module doc)."""

    metadata = METADATA
    version = 2


parallel_env, env, raw_env, vector_env = constructors(WebSearchParallelEnv, WebSearchVectorEnv)
