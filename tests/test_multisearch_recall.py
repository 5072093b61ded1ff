"""multisearch_recall_v0 (issue 48 item 1): a multisearch task whose success requires memory.

The claims of the module doc at a small horizon: a policy that remembers the cue succeeds,
memoryless ones stay at chance (1 / n_zones), random collects the cued target at chance rate
among the episodes where it collects one; no observation or state after the first step
depends on the cue; only ``stay`` is allowed while frozen; PettingZoo's API tests; the vector
env equals the parallel env.
"""

from __future__ import annotations

import doctest
from collections import deque

import numpy as np
import pytest
from pettingzoo.test import api_test, parallel_api_test, parallel_seed_test

from envs import multisearch_recall_v0 as recall
from envs.errors import ArgumentTypeError

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # PettingZoo's style hints

H = 16  # the small horizon of the tests
ZONES = 4


def _binomial_band(p: float, n: int, sds: float = 4.0) -> float:
    return sds * np.sqrt(p * (1 - p) / n)


# ---- the success bounds at a small horizon -------------------------------------------------
def test_remembering_solves_and_memoryless_policies_stay_at_chance():
    seeds = range(512)
    chance = 1 / ZONES
    assert recall.make_config(memory_horizon=H).chance == chance
    remembering = recall.evaluate_policy(recall.RememberingPolicy(), seeds, memory_horizon=H)
    assert remembering["success_rate"] >= 0.9
    band = _binomial_band(chance, len(seeds))
    for zone in range(ZONES):  # every fixed zone: chance, within sampling noise
        fixed = recall.evaluate_policy(recall.FixedZonePolicy(zone), seeds, memory_horizon=H)
        assert fixed["collect_rate"] >= 0.95  # it does reach its target ...
        assert fixed["success_rate"] <= chance + 0.1  # ... and wins only when the cue says so
        assert abs(fixed["success_rate"] - chance) <= band


def test_two_zones_chance_is_one_half():
    seeds = range(256)
    kw = dict(memory_horizon=H, n_zones=2)
    assert recall.make_config(**kw).chance == 0.5
    assert recall.evaluate_policy(recall.RememberingPolicy(), seeds, **kw)["success_rate"] >= 0.9
    fixed = recall.evaluate_policy(recall.FixedZonePolicy(1), seeds, **kw)["success_rate"]
    assert abs(fixed - 0.5) <= _binomial_band(0.5, len(seeds))


def test_random_is_at_chance_among_episodes_that_collect():
    """Random collects some target in a fraction q of the episodes and the cued one in 1/4 of
    those (the cue cannot steer it): success = q / 4 <= chance."""
    vec = recall.vector_env(1024, autoreset=False, memory_horizon=H)
    policy = recall.RandomPolicy(7)
    obs, _ = vec.reset(seed=0)
    done = np.zeros(vec.num_envs, dtype=bool)
    success = np.zeros(vec.num_envs)
    while not done.all():
        obs, _, term, trunc, infos = vec.step(policy(obs, vec))
        ended = (term["scout_0"] | trunc["scout_0"]) & ~done
        success[ended] = infos["scout_0"]["success"][ended]
        done |= ended
    collected = vec._core.n_collected > 0
    assert success.mean() <= 0.25 + 0.1
    assert success[~collected].sum() == 0
    n = int(collected.sum())
    assert n >= 150
    assert abs(success[collected].mean() - 0.25) <= _binomial_band(0.25, n)


# ---- no later observation depends on the cue -----------------------------------------------
def _observations(obs: dict) -> dict:
    return {a: (p["observation"].copy(), p["action_mask"].copy()) for a, p in obs.items()}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_observations_and_state_after_the_cue_step_do_not_depend_on_the_cue(seed):
    """Same seed, every cue: replaying one action sequence (a fixed-zone policy's, so that
    the episode ends by a collection) gives equal observations, masks, states, ends and
    non-team rewards from t = 1 on; at t = 0 only the cue part differs; the team reward is
    paid exactly when the collected zone is the cue."""
    zone = seed % ZONES
    offset = -4 * ZONES  # the cue's place: the last 4 n_zones values are cue and routes
    runs = []
    actions_played: list[dict] = []
    for cue in range(ZONES):
        env = recall.parallel_env(memory_horizon=H)
        obs, _ = env.reset(seed=seed, options={"cue": cue})
        trace = [(_observations(obs), env.state().copy())]
        policy = recall.FixedZonePolicy(zone)
        ends, team, other = [], [], []
        step = 0
        while env.agents:
            if cue == 0:
                actions_played.append(policy(obs, env))
            obs, rewards, term, trunc, infos = env.step(actions_played[step])
            step += 1
            trace.append((_observations(obs), env.state().copy()))
            ends.append((term["scout_0"], trunc["scout_0"]))
            team.append([infos[a]["reward_team"] for a in env.possible_agents])
            other.append(
                [(infos[a]["reward_individual"], infos[a]["reward_penalty"]) for a in infos]
            )
        runs.append((trace, ends, team, other, infos["scout_0"]["success"]))
        for agent, (first, _) in trace[0][0].items():
            cue_part = first[offset : offset + ZONES]
            np.testing.assert_array_equal(cue_part, np.eye(ZONES)[cue], err_msg=agent)
    reference = runs[0]
    assert reference[1][-1] == (True, False)  # it ended by collecting zone `zone`'s target
    for cue, (trace, ends, team, other, success) in enumerate(runs):
        assert len(trace) == len(reference[0])
        for t, ((obs, state), (obs_ref, state_ref)) in enumerate(
            zip(trace, reference[0], strict=True)
        ):
            np.testing.assert_array_equal(state, state_ref)
            for agent in obs:
                observation, mask = obs[agent]
                observation_ref, mask_ref = obs_ref[agent]
                np.testing.assert_array_equal(mask, mask_ref)
                if t == 0:  # everything but the cue part
                    observation = np.delete(observation, range(offset, offset + ZONES))
                    observation_ref = np.delete(observation_ref, range(offset, offset + ZONES))
                else:
                    assert not observation[offset : offset + ZONES].any()
                np.testing.assert_array_equal(observation, observation_ref, err_msg=f"t={t}")
        assert ends == reference[1] and other == reference[3]
        won = cue == zone
        assert success == float(won)
        assert [sum(row) for row in team[:-1]] == [0.0] * (len(team) - 1)
        assert team[-1] == [1.0 if won else 0.0] * 4


# ---- the frozen phase --------------------------------------------------------------------
def test_only_stay_while_frozen_and_a_move_is_a_penalised_no_op():
    env = recall.parallel_env(memory_horizon=5, rescuer_reward_scale=10.0)
    twin = recall.parallel_env(memory_horizon=5, rescuer_reward_scale=10.0)
    obs, _ = env.reset(seed=3)
    twin.reset(seed=3)
    state0 = env.state().copy()
    for t in range(5):
        for agent, parts in obs.items():
            expected = np.zeros(env.action_space(agent).n, dtype=np.int8)
            expected[0] = 1
            np.testing.assert_array_equal(parts["action_mask"], expected, err_msg=f"t={t}")
        moves = {a: (5 if a.startswith("rescuer") else 1 + t % 4) for a in env.agents}
        obs, rewards, _, _, infos = env.step(moves)
        twin_obs, *_ = twin.step({a: 0 for a in twin.agents})
        for agent in env.possible_agents:
            assert infos[agent]["invalid_action"] == 1.0
            scale = 10.0 if agent.startswith("rescuer") else 1.0
            assert infos[agent]["reward_penalty"] == pytest.approx(-0.05 * scale)
            np.testing.assert_array_equal(obs[agent]["observation"], twin_obs[agent]["observation"])
    positions = slice(-2 * len(env.possible_agents) - 2, -2)
    np.testing.assert_array_equal(env.state()[positions], state0[positions])  # nobody moved
    assert any(parts["action_mask"][1:].any() for parts in obs.values())  # t = H: free
    strict = recall.parallel_env(memory_horizon=5, strict_actions=True)
    strict.reset(seed=3)
    with pytest.raises(ValueError, match="masked"):
        strict.step({a: (1 if a == "scout_0" else 0) for a in strict.agents})
    vec = recall.vector_env(2, memory_horizon=5, strict_actions=True)
    vec.reset(seed=3)
    with pytest.raises(ValueError, match="masked"):
        vec.step({a: np.array([0, 2 if a == "rescuer_1" else 0]) for a in vec.possible_agents})


def test_staying_team_is_truncated_at_horizon_plus_decision_steps():
    env = recall.parallel_env(memory_horizon=7, decision_steps=9)
    assert env.max_cycles == 16
    env.reset(seed=0)
    steps = 0
    while env.agents:
        _, _, term, trunc, infos = env.step({a: 0 for a in env.agents})
        steps += 1
    assert steps == 16 and trunc["scout_0"] and not term["scout_0"]
    assert infos["scout_0"]["success"] == 0.0 and infos["scout_0"]["episode_length"] == 16


# ---- layout and zone routes against an independent reference -----------------------------
def _bfs_distances(blocked: np.ndarray, target: tuple[int, int]) -> np.ndarray:
    g = blocked.shape[0]
    dist = np.full((g, g), -1)
    dist[target] = 0
    queue = deque([target])
    while queue:
        r, c = queue.popleft()
        for dr, dc in ((-1, 0), (1, 0), (0, -1), (0, 1)):
            nr, nc = r + dr, c + dc
            if 0 <= nr < g and 0 <= nc < g and not blocked[nr, nc] and dist[nr, nc] < 0:
                dist[nr, nc] = dist[r, c] + 1
                queue.append((nr, nc))
    return dist


@pytest.mark.parametrize("n_zones", [2, 4])
def test_targets_one_per_zone_and_routes_are_shortest(n_zones):
    vec = recall.vector_env(8, memory_horizon=2, n_zones=n_zones, obstacle_density=0.3)
    obs, _ = vec.reset(seed=11)
    core = vec._core
    g = vec.config.grid_size
    for n in range(vec.num_envs):
        blocked = core.obstacle[n].astype(bool)
        for k in range(n_zones):
            row, col = core.target_pos[n, k]
            assert recall.zone_of(row, col, g, n_zones) == k
            assert not blocked[row, col]
            dist = _bfs_distances(blocked, (row, col))
            for i, agent in enumerate(vec.possible_agents):
                r, c = core.agent_pos[n, i]
                route = obs[agent]["observation"][n, -3 * n_zones :].reshape(n_zones, 3)[k]
                assert route[2] == 1.0  # uncollected and reachable
                if dist[r, c] == 0:
                    assert (route[0], route[1]) == (0.0, 0.0)
                else:
                    nr, nc = r + int(route[0]), c + int(route[1])
                    assert abs(route[0]) + abs(route[1]) == 1
                    assert dist[nr, nc] == dist[r, c] - 1


# ---- API ---------------------------------------------------------------------------------
def test_pettingzoo_api_tests():
    parallel_api_test(recall.parallel_env(memory_horizon=8), num_cycles=200)
    api_test(recall.env(memory_horizon=8), num_cycles=200)
    parallel_seed_test(lambda: recall.parallel_env(memory_horizon=4), num_cycles=50)


def test_metadata_spaces_infos_and_doctest():
    env = recall.parallel_env()
    assert env.metadata["name"] == "multisearch_recall_v0" == recall.__name__.rsplit(".")[-1]
    _, infos = env.reset(seed=0)
    keys = {
        "reward_team",
        "reward_individual",
        "reward_penalty",
        "invalid_action",
        "success",
        "solved",
        "coverage",
        "revisit_rate",
        "episode_length",
    }
    assert all(set(info) == keys for info in infos.values())
    assert env.observation_space("scout_0")["observation"].shape == (251,)
    assert env.observation_space("rescuer_0")["observation"].shape == (91,)
    assert env.state().shape == env.state_space.shape
    failures, tests = doctest.testmod(recall, verbose=False)
    assert tests > 0 and failures == 0


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        (dict(n_targets=4), ArgumentTypeError),
        (dict(max_cycles=100), ArgumentTypeError),
        (dict(preset="small"), ArgumentTypeError),
        (dict(memory_horizon=0), ValueError),
        (dict(memory_horizon=1.5), ArgumentTypeError),
        (dict(n_zones=3), ValueError),
        (dict(decision_steps=0), ValueError),
    ],
)
def test_bad_arguments(kwargs, error):
    with pytest.raises(error):
        recall.parallel_env(**kwargs)


def test_bad_cue_option():
    env = recall.parallel_env()
    for cue in (4, -1, 1.0, [0, 1]):
        with pytest.raises(ValueError, match="cue"):
            env.reset(seed=0, options={"cue": cue})
    env.reset(seed=0, options={"unknown": 1})  # other options are ignored, as in v0


# ---- vector env == parallel env ----------------------------------------------------------
def test_vector_env_equals_parallel_envs_across_autoresets():
    n, seed = 3, 20
    kw = dict(memory_horizon=6, decision_steps=20)
    vec = recall.vector_env(n, **kw)
    singles = [recall.parallel_env(**kw) for _ in range(n)]
    obs, _ = vec.reset(seed=seed)
    single_obs = [env.reset(seed=seed + i)[0] for i, env in enumerate(singles)]
    policy = recall.RandomPolicy(5)
    remembering = recall.RememberingPolicy()  # half the steps: collections happen
    endings = 0
    for step in range(150):
        actions = (policy if step % 2 else remembering)(obs, vec)
        obs, rewards, term, trunc, infos = vec.step(actions)
        final = vec.final_obs
        for i, env in enumerate(singles):
            o, r, te, tr, inf = env.step({a: int(actions[a][i]) for a in env.agents})
            for a in env.possible_agents:
                np.testing.assert_array_equal(final[a]["observation"][i], o[a]["observation"])
                np.testing.assert_array_equal(final[a]["action_mask"][i], o[a]["action_mask"])
                assert rewards[a][i] == pytest.approx(r[a], abs=1e-6)
                assert (term[a][i], trunc[a][i]) == (te[a], tr[a])
                for key, value in inf[a].items():
                    assert infos[a][key][i] == pytest.approx(value), key
            np.testing.assert_array_equal(vec.final_state[i], env.state())
            if not env.agents:  # the vector env reset env i from its own stream: so do we
                endings += 1
                single_obs[i] = env.reset()[0]
                for a in env.possible_agents:
                    np.testing.assert_array_equal(
                        obs[a]["observation"][i], single_obs[i][a]["observation"]
                    )
                np.testing.assert_array_equal(vec.state()[i], env.state())
    assert endings >= n
