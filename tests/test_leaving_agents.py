"""Agents that leave an episode early (PettingZoo allows it): masked out of the losses and
statistics from the next step on, and their individual channel ends there."""

from __future__ import annotations

import torch

from marl.algos.grpo import GRPO
from marl.algos.mappo import MAPPO
from marl.run.config import TrainConfig

ENV = "test_adapters:relay_env"


def test_mappo_masks_an_agent_after_it_left():
    torch.manual_seed(0)
    cfg = TrainConfig(
        env_fn=ENV, env={"leave_at": 2, "horizon": 5}, num_envs=2, rollout_steps=10,
        progress=False,
    )  # fmt: skip
    algo = MAPPO(cfg, None)
    batch = algo.collect()
    assert batch.active is not None
    j = list(algo.layout.agents).index("runner_0")
    # runner_0 acts at the first 2 steps of every 5-step episode, then not
    steps = batch.active[:, 0, j].tolist()
    assert steps[:5] == [True, True, False, False, False] and steps[5:7] == [True, True]
    units = algo.policy_units(batch, algo.advantages(batch, 0.0).final)
    t = next(t for t in algo.layout.types if "runner_0" in t.agents)
    col = t.agents.index("runner_0")
    mask = units[t.name].sample_mask().reshape(10, 2, -1)[:, :, col]  # mlp: [T*E, 1, n]
    assert torch.equal(mask, batch.active[:, :, j])
    # the individual channel stops where the agent left: no bootstrap into its absent steps
    adv = algo.advantages(batch, 0.0)
    assert torch.isfinite(adv.final).all()
    metrics = algo.update(batch, 0.0)
    assert torch.isfinite(torch.tensor(metrics["loss/policy"]))


def test_grpo_masks_an_agent_after_it_left():
    torch.manual_seed(0)
    cfg = TrainConfig(
        algo="grpo", env_fn=ENV, env={"leave_at": 2, "horizon": 5}, num_envs=4, group_size=2,
        progress=False,
    )  # fmt: skip
    algo = GRPO(cfg, None)
    metrics = algo.iteration(0.0)
    assert torch.isfinite(torch.tensor(metrics["loss/policy"]))
