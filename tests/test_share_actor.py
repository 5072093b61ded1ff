"""Issue 47, item 1: one actor shared by every agent of every type (``--share-actor all``).

References: the shared actor's logits for each type equal its backbone and head run by hand on
the observation zero-padded to the largest type's size, followed by the type's one-hot and the
agent's one-hot over all agents (numpy-built inputs), cut to the type's actions; a type never
takes an action it lacks even when the shared head prefers it; a training window equals the
step-by-step rollout (every backbone); seed k of a ``--seeds`` batch equals seed k alone bit
for bit (MAPPO and GRPO); a saved shared policy loads and acts as the training one; the
PettingZoo adapter trains one. (Export of a shared actor, per backbone:
tests/test_export_backbones.py.)
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import marl
from envs import multisearch_v0
from marl.algos.grpo import SeedGRPO
from marl.algos.mappo import MAPPO, SeedMAPPO
from marl.models.policies import AgentLayout, MultiAgentPolicy
from marl.run.artifact import write_policy_artifact
from marl.run.config import ConfigError, TrainConfig, validate_config
from marl.train import main as train_main

ENV = {"grid_size": 8, "max_cycles": 20, "n_targets": 1}
BACKBONES = ["mlp", "gru", "mamba", "mamba2"]


def _layout() -> AgentLayout:
    return AgentLayout.from_env(multisearch_v0.vector_env(1, **ENV))


def _identity_rows(layout: AgentLayout, k: int) -> np.ndarray:
    """Type k's identity features, built by hand: its one-hot over the types, then each
    agent's one-hot over every agent (possible_agents order)."""
    t, K, N = layout.types[k], len(layout.types), layout.n_agents
    rows = np.zeros((t.n_agents, K + N))
    for i, agent in enumerate(t.agents):
        rows[i, k] = 1.0
        rows[i, K + layout.agents.index(agent)] = 1.0
    return rows


def test_one_actor_for_every_type_on_padded_identified_inputs() -> None:
    torch.manual_seed(0)
    layout = _layout()
    policy = MultiAgentPolicy(layout, "mlp", 16, share_actor="all")
    D = max(t.obs_dim for t in layout.types)
    A = max(t.n_actions for t in layout.types)
    assert {t.obs_dim for t in layout.types} != {D}  # the types' sizes differ: padding is used
    # one set of parameters, the shared actor's; the types' views own none
    assert all(name.startswith("shared.") for name, _ in policy.named_parameters())
    assert set(policy.state_dict()) == {f"shared.{k}" for k in policy.shared.state_dict()}
    assert policy.shared.head.out_features == A
    E = 3
    for k, t in enumerate(layout.types):
        obs = np.random.default_rng(k).normal(size=(E, t.n_agents, t.obs_dim))
        x = np.concatenate(
            [obs, np.zeros((E, t.n_agents, D - t.obs_dim)),
             np.broadcast_to(_identity_rows(layout, k), (E, t.n_agents, len(layout.types)
                                                        + layout.n_agents))], axis=-1,
        )  # fmt: skip
        with torch.no_grad():
            y, _ = policy.shared.backbone.step(
                torch.tensor(x.reshape(E * t.n_agents, -1), dtype=torch.float32), (), None
            )
            want = policy.shared.head(y).reshape(E, t.n_agents, A)[..., : t.n_actions]
        mask = torch.ones(E, t.n_agents, t.n_actions, dtype=torch.bool)
        actor = policy.actors[t.name]
        dist, _ = actor.step(torch.tensor(obs, dtype=torch.float32), mask, (), None)
        assert dist.logits.shape == (E, t.n_agents, t.n_actions)
        torch.testing.assert_close(dist.logits, want, rtol=1e-6, atol=1e-6)


def test_a_shared_policy_never_takes_an_action_its_type_lacks() -> None:
    torch.manual_seed(0)
    layout = _layout()
    policy = MultiAgentPolicy(layout, "mlp", 16, share_actor="all")
    counts = {t.name: t.n_actions for t in layout.types}
    A = max(counts.values())
    small = min(counts, key=counts.get)
    assert counts[small] < A  # scouts have no "collect"
    with torch.no_grad():  # the shared head strongly prefers the actions beyond the scouts'
        policy.shared.head.bias[counts[small] :] = 50.0
    E = 256
    obs = {t.name: torch.randn(E, t.n_agents, t.obs_dim) for t in layout.types}
    mask = {t.name: torch.ones(E, t.n_agents, t.n_actions, dtype=torch.bool)
            for t in layout.types}  # fmt: skip
    mask[small][..., 0] = False  # and a masked action stays masked
    generator = torch.Generator().manual_seed(1)
    actions, logps, _ = policy.act(obs, mask, policy.initial_state(E), generator=generator)
    assert int(actions[small].max()) < counts[small] and not (actions[small] == 0).any()
    assert torch.isfinite(logps[small]).all()
    big = max(counts, key=counts.get)  # the other type takes the preferred action
    assert (actions[big] >= counts[small]).float().mean() > 0.9


def test_agent_ids_switch_off_the_identity_inputs() -> None:
    layout = _layout()
    D = max(t.obs_dim for t in layout.types)
    K, N = len(layout.types), layout.n_agents
    width = {
        (share, ids): MultiAgentPolicy(layout, "mlp", 8, share_actor=share, agent_ids=ids)
        for share in ("type", "all")
        for ids in (True, False)
    }
    assert width["all", True].shared.backbone.net[0].in_features == D + K + N
    assert width["all", False].shared.backbone.net[0].in_features == D
    scout = layout.types[0]
    actor = width["type", True].actors[scout.name]
    assert actor.backbone.net[0].in_features == scout.obs_dim + scout.n_agents
    actor = width["type", False].actors[scout.name]
    assert actor.backbone.net[0].in_features == scout.obs_dim


@pytest.mark.parametrize("backbone", BACKBONES)
def test_a_shared_actors_window_equals_its_steps(backbone: str) -> None:
    """Each type's training window over the shared actor (``sequence``, with a reset in the
    middle) equals its step-by-step rollout."""
    torch.manual_seed(0)
    layout = _layout()
    policy = MultiAgentPolicy(layout, backbone, 16, share_actor="all")
    B, L = 2, 6
    resets = torch.zeros(B, L, dtype=torch.bool)
    resets[:, 0] = True
    resets[1, 3] = True
    for t in layout.types:
        actor = policy.actors[t.name]
        obs = torch.randn(B, L, t.n_agents, t.obs_dim)
        mask = torch.ones(B, L, t.n_agents, t.n_actions, dtype=torch.bool)
        with torch.no_grad():
            window = actor.sequence(obs, mask, actor.initial_state(B), resets).logits
            state, steps = actor.initial_state(B), []
            for s in range(L):
                dist, state = actor.step(obs[:, s], mask[:, s], state, resets[:, s])
                steps.append(dist.logits)
        torch.testing.assert_close(window, torch.stack(steps, 1), rtol=1e-4, atol=1e-5)


def _cfg(algo: str, backbone: str, seed: int) -> TrainConfig:
    extra = (
        {"group_size": 4, "kl_beta": 0.1, "ref_refresh": 2}
        if algo == "grpo"
        else {"rollout_steps": 16, "seq_len": 8, "critic_hidden_dim": 16}
    )
    cfg = TrainConfig(algo=algo, num_envs=8, hidden_dim=16, epochs=2, num_minibatches=2,
                      env=dict(ENV), seed=seed, backbone=backbone, share_actor="all",
                      parallel_update=False, progress=False, **extra)  # fmt: skip
    validate_config(cfg)
    return cfg


@pytest.mark.parametrize("algo,backbone", [("mappo", "mlp"), ("mappo", "gru"), ("grpo", "mlp")])
def test_seed_in_a_batch_equals_the_seed_alone_with_a_shared_actor(one_thread, algo, backbone):
    trainer = {"mappo": SeedMAPPO, "grpo": SeedGRPO}[algo]
    big = trainer([_cfg(algo, backbone, s) for s in (0, 1)])
    alone = trainer([_cfg(algo, backbone, 1)])
    before = [p[1].clone() for p in big.policy.parameters()]
    for i in range(2):
        big.iteration([i / 2] * 2)
        alone.iteration([i / 2])
    names = [name for name, _ in big.policy.named_parameters()]
    assert names and all(name.startswith("shared.") for name in names)
    for a, b in zip(big.policy.parameters(), alone.policy.parameters(), strict=True):
        assert torch.equal(a[1], b[0])
    trained = zip(big.policy.parameters(), before, strict=True)
    assert any(not torch.equal(a[1], p0) for a, p0 in trained)


@pytest.mark.parametrize("backbone", BACKBONES)
def test_a_saved_shared_policy_loads_and_acts_as_in_training(tmp_path, backbone) -> None:
    torch.manual_seed(3)
    cfg = _cfg("mappo", backbone, 3)
    algo = MAPPO(cfg, None)
    algo.iteration(0.0)
    write_policy_artifact(str(tmp_path), algo.policy, cfg, update=1, env_steps=128)
    loaded = marl.load_policy(str(tmp_path))
    assert loaded.policy.share_actor == "all"
    for (name, p), (name_l, q) in zip(algo.policy.state_dict().items(),
                                      loaded.policy.state_dict().items(), strict=True):  # fmt: skip
        assert name == name_l and torch.equal(p, q)
    E = 4
    for t in algo.layout.types:
        obs = torch.randn(2, E, t.n_agents, t.obs_dim)
        mask = torch.ones(E, t.n_agents, t.n_actions, dtype=torch.bool)
        ours, theirs = algo.policy.actors[t.name], loaded.policy.actors[t.name]
        s1, s2 = ours.initial_state(E), theirs.initial_state(E)
        for step in range(2):
            d1, s1 = ours.step(obs[step], mask, s1, None)
            d2, s2 = theirs.step(obs[step], mask, s2, None)
            assert torch.equal(d1.logits, d2.logits)


def test_the_cli_trains_a_shared_actor_on_a_pettingzoo_env(tmp_path) -> None:
    """Through the PettingZoo adapter (the env's parallel_env, types from the agent names)."""
    out = tmp_path / "run"
    args = ["--env-fn", "envs.multisearch_v0:parallel_env", "--share-actor", "all",
            "--num-envs", "2", "--rollout-steps", "16", "--hidden-dim", "8",
            "--critic-hidden-dim", "8", "--epochs", "1", "--num-minibatches", "1",
            "--total-steps", "64", "--eval-episodes", "1", "--eval-every", "0",
            "--progress", "false", "--baselines", "false", "--plots", "false", "--gif", "false",
            "--run-dir", str(out), *[f"--env.{k}={v}" for k, v in ENV.items()]]  # fmt: skip
    assert train_main(args) == 0
    loaded = marl.load_policy(str(out))
    assert loaded.policy.share_actor == "all"
    assert [n for n, _ in loaded.policy.named_parameters()][0].startswith("shared.")


@pytest.mark.parametrize("env_fn", ["simple_spread_v3", "simple_speaker_listener_v4"])
def test_a_shared_actor_on_mpe(tmp_path, env_fn) -> None:
    """mpe2's spread (one type: sharing within it) and speaker-listener (two types of other
    observation and action sizes: padded, the head cut per type) train with one actor."""
    pytest.importorskip("mpe2", reason="install mpe2 (pip install mpe2)")
    out = tmp_path / "run"
    args = ["--env-fn", f"mpe2.{env_fn}:parallel_env", "--share-actor", "all",
            "--env.max_cycles", "8", "--num-envs", "2", "--rollout-steps", "8",
            "--hidden-dim", "8", "--critic-hidden-dim", "8", "--epochs", "1",
            "--num-minibatches", "1", "--total-steps", "32", "--eval-episodes", "1",
            "--eval-every", "0", "--progress", "false", "--baselines", "false",
            "--plots", "false", "--gif", "false", "--run-dir", str(out)]  # fmt: skip
    assert train_main(args) == 0
    policy = marl.load_policy(str(out)).policy
    types = policy.layout.types
    assert len(types) == (1 if env_fn == "simple_spread_v3" else 2)
    width = max(t.obs_dim for t in types) + len(types) + policy.layout.n_agents
    assert policy.shared.backbone.net[0].in_features == width
    assert policy.shared.head.out_features == max(t.n_actions for t in types)


def test_an_unknown_sharing_mode_is_refused() -> None:
    cfg = TrainConfig(share_actor="agents")
    with pytest.raises(ConfigError, match="--share-actor.*allowed: none, type, all"):
        validate_config(cfg)
    with pytest.raises(ValueError, match="share_actor must be one of"):
        MultiAgentPolicy(_layout(), share_actor="agents")


@pytest.mark.parametrize("algo", ["mappo", "grpo"])
def test_the_sharing_studies_arms_differ_in_the_one_thing_compared(algo) -> None:
    """Issue 47's studies: the sharing arms differ in ``share_actor`` alone; every
    whitening_shared arm shares the actor; GRPO's Dr. GRPO arms drop the std only."""
    from dataclasses import asdict

    from marl.experiments.studies import get_study
    from marl.run.config import parse_cli

    def cfg(args):
        return asdict(parse_cli([f"--algo={algo}", *args, "--env.rescuer_reward_scale=10"]))

    sharing = get_study("sharing", algo=algo)
    arms = {name: cfg(args) for name, args in sharing.variants.items()}
    assert sharing.reference == "type" and set(arms) == {"type", "all"}
    assert {k for k in arms["type"] if arms["type"][k] != arms["all"][k]} == {"share_actor"}
    shared = get_study("whitening_shared", algo=algo)
    arms = {name: cfg(args) for name, args in shared.variants.items()}
    assert all(a["share_actor"] == "all" and a["env"]["preset"] == "hard" for a in arms.values())
    if algo == "grpo":
        assert "ti_a0.5" not in arms and ("drgrpo_type", "drgrpo_batch") in shared.comparisons
        for scheme in ("batch", "type"):
            diff = {k for k in arms[scheme] if arms[scheme][k] != arms[f"drgrpo_{scheme}"][k]}
            assert diff == {"grpo_scale_std"}


def test_the_position_study_differs_in_the_whitening_only() -> None:
    """Issue 47, item 4: whitening_position's arms differ in the whitening scheme (and the
    chunk arm's chunk size) alone; all share one actor over a scout and a rescuer on the
    recall task at H = 64, with whole-episode windows."""
    from dataclasses import asdict

    from marl.experiments.studies import get_study
    from marl.run.config import parse_cli

    study = get_study("whitening_position")
    arms = {name: asdict(parse_cli(args)) for name, args in study.variants.items()}
    assert study.reference == "batch" and set(arms) == {"batch", "position", "chunk"}
    expected = {"batch": set(), "position": {"whitening"}, "chunk": {"whitening", "chunk_size"}}
    for name, cfg in arms.items():
        assert {k for k in cfg if cfg[k] != arms["batch"][k]} == expected[name], name
        assert cfg["whitening"] == name
    batch = arms["batch"]
    assert batch["share_actor"] == "all" and batch["backbone"] == "gru"
    assert batch["env"]["n_scouts"] == 1 and batch["env"]["n_rescuers"] == 1
    assert batch["env"]["memory_horizon"] == 64 and batch["chrono_init"] == 128
    assert batch["seq_len"] == batch["rollout_steps"] == 260 and arms["chunk"]["chunk_size"] == 16
