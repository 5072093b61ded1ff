"""Clear errors at the call that makes the mistake (issue 19, item 7): the AEC env checks each
action when it is passed (state unchanged, the env keeps working), vector_env refuses a bool
action array among integer ones and bool / float seeds, and ``whiten``'s overflow message
says that finite values overflowed, not that x holds NaN."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from envs import multisearch_v0
from marl.whitening import whiten

SMALL = {"grid_size": 8, "n_scouts": 1, "n_rescuers": 1, "n_targets": 2, "max_cycles": 20}


@pytest.mark.parametrize("agent_index", [0, 1])  # the first agent, and the last (the step)
@pytest.mark.parametrize("bad", [99, -1, 2.5, "up", True])
def test_aec_rejects_an_out_of_range_action_at_the_call(agent_index, bad):
    env = multisearch_v0.env(**SMALL)
    env.reset(seed=3)
    for _ in range(agent_index):
        env.step(0)
    agent = env.agent_selection
    state = env.state().copy()
    with pytest.raises(ValueError, match=agent):
        env.step(bad)
    assert env.agent_selection == agent  # nothing advanced
    np.testing.assert_array_equal(env.state(), state)
    # ... and it keeps working: a whole episode of valid actions, then a reset
    reference = multisearch_v0.env(**SMALL)
    reference.reset(seed=3)
    for _ in range(agent_index):
        reference.step(0)
    for a, b in zip(env.agent_iter(max_iter=60), reference.agent_iter(max_iter=60), strict=True):
        assert a == b
        obs, reward, term, trunc, _ = env.last()
        ref_obs, ref_reward, *_ = reference.last()
        np.testing.assert_array_equal(obs["observation"], ref_obs["observation"])
        assert reward == ref_reward
        action = None if term or trunc else int(np.flatnonzero(obs["action_mask"])[-1])
        env.step(action)
        reference.step(action)
    env.reset(seed=4)
    env.step(0)


def test_aec_strict_actions_rejects_a_masked_action_at_the_call():
    env = multisearch_v0.env(**SMALL, strict_actions=True)
    env.reset(seed=0)
    obs, *_ = env.last()
    masked = np.flatnonzero(obs["action_mask"] == 0)
    assert masked.size  # at the start some move is blocked (edge or obstacle) or collect
    agent = env.agent_selection
    with pytest.raises(ValueError, match="masked"):
        env.step(int(masked[0]))
    assert env.agent_selection == agent
    env.step(int(np.flatnonzero(obs["action_mask"])[0]))  # a legal one is fine


def test_vector_env_refuses_a_bool_action_array_among_integer_ones():
    vec = multisearch_v0.vector_env(4, **SMALL)
    vec.reset(seed=0)
    actions = {a: np.zeros(4, dtype=np.int64) for a in vec.possible_agents}
    actions[vec.possible_agents[1]] = np.zeros(4, dtype=bool)
    with pytest.raises(ValueError, match=rf"{vec.possible_agents[1]}.*dtype bool"):
        vec.step(actions)
    actions[vec.possible_agents[1]] = np.zeros(4, dtype=np.int64)
    vec.step(actions)  # still fine


@pytest.mark.parametrize("seed", [True, False, 1.5, "7", [1, 2, 3, True], np.float64(2.0)])
def test_vector_env_reset_refuses_non_integer_seeds_clearly(seed):
    vec = multisearch_v0.vector_env(4, **SMALL)
    with pytest.raises(ValueError, match="seed must be None, an int >= 0 or a sequence of 4"):
        vec.reset(seed=seed)


@pytest.mark.parametrize("seed", [True, 1.5, "3", -2])
def test_parallel_env_reset_refuses_non_integer_seeds(seed):
    env = multisearch_v0.parallel_env(**SMALL)
    with pytest.raises(ValueError, match="seed must be None or an int >= 0"):
        env.reset(seed=seed)
    env.reset(seed=np.int64(3))  # numpy integers are seeds


@pytest.mark.parametrize(
    "values,what",
    [([1e308, 1e308, 0.0], "sum"), ([1e200, -1e200], "sum of squared deviations")],
)
def test_whiten_overflow_message_names_the_overflow(values, what):
    x = torch.tensor(values, dtype=torch.float64)
    assert torch.isfinite(x).all()
    with pytest.raises(ValueError, match="too large to whiten") as info:
        whiten(x)
    message = str(info.value)
    assert what in message and "overflowed" in message and "NaN" not in message
    with pytest.raises(ValueError, match="NaN or inf"):  # a real NaN is still named so
        whiten(torch.tensor([1.0, float("nan"), 2.0], dtype=torch.float64))
