"""Long training windows for recurrent actors: burn-in, truncated BPTT, per-backbone defaults
and the position / chunk whitening keys, against step-by-step references (float64)."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from test_train_fakeenv import vector_env

from marl.algos.mappo import BACKBONE_DEFAULTS, MAPPO, MAPPOConfig
from marl.algos.ppo import (
    ClipPPOObjective,
    Minibatch,
    PPOLossConfig,
    chunked_loss_and_backward,
    window_plan,
)
from marl.core.whitening import AdvantageWhitener
from marl.models.policies import AgentLayout, MultiAgentPolicy
from marl.run.config import ConfigError, build_parser, config_to_dict, parse_cli

FAKE = "test_train_fakeenv:vector_env"


def _actor(backbone: str, seed: int = 0):
    torch.manual_seed(seed)
    layout = AgentLayout.from_env(vector_env(2))
    actor = MultiAgentPolicy(layout, backbone, hidden_dim=16).actors["caller"].double()
    torch.nn.init.normal_(actor.head.weight, std=0.5)  # logits that depend on the state
    return actor


def _reference_backend(actor):
    """A copy of ``actor`` whose Mamba blocks run seqmodels' sequential reference."""
    ref = copy.deepcopy(actor)
    if hasattr(ref.backbone, "backend"):
        ref.backbone.backend = "reference"
    return ref


def _stepwise(actor, obs, state, resets, detach_every=None):
    """The step-by-step reference: logits ``[E, T, n, A]`` and the state before every step
    (``T + 1`` tuples); with ``detach_every`` k the state is detached before steps k, 2k..."""
    states, logits = [state], []
    for t in range(obs.shape[1]):
        if detach_every is not None and t > 0 and t % detach_every == 0:
            state = tuple(s.detach() for s in state)
        y, state = actor._step_logits(obs[:, t], state, resets[:, t])
        logits.append(y)
        states.append(state)
    return torch.stack(logits, 1), states


def _rollout(actor, E=3, T=12, seed=1):
    g = torch.Generator().manual_seed(seed)
    n = actor.n_agents
    obs = torch.randn(E, T, n, actor.obs_dim, generator=g, dtype=torch.float64)
    resets = torch.rand(E, T, generator=g) < 0.08
    resets[1, 5] = True
    state = tuple(
        torch.randn(s.shape, generator=g, dtype=torch.float64) * 0.5 for s in actor.initial_state(E)
    )
    return obs, resets, state


def _windows(obs, resets, states, seq_len, burn_in):
    """The trainer's windows (window_plan) over a rollout ``[E, T, ...]``: inputs, the stored
    states at the window starts, per-unit burn-in and the loss steps."""
    E, T = obs.shape[:2]
    index, steps, starts = window_plan(T, seq_len, burn_in)
    W = index.shape[0]
    x = obs[:, index].transpose(0, 1).reshape(W * E, *index.shape[1:], *obs.shape[2:])
    r = resets[:, index].transpose(0, 1).reshape(W * E, index.shape[1])
    state = tuple(torch.cat([states[s][i] for s in starts], 0) for i in range(len(states[0])))
    return x, r, state, steps.repeat_interleave(E), index[:, burn_in:]


@pytest.mark.parametrize(
    "backbone, seq_len, burn_in",
    [("gru", 4, 3), ("gru", 12, 0), ("mamba", 4, 6), ("mamba", 12, 0), ("mamba2", 6, 4)],
)
def test_windows_with_burn_in_equal_the_sequential_rollout(backbone, seq_len, burn_in):
    actor = _actor(backbone)
    obs, resets, state0 = _rollout(actor)
    with torch.no_grad():
        ref_logits, states = _stepwise(_reference_backend(actor), obs, state0, resets)
        x, r, state, steps, loss_index = _windows(obs, resets, states, seq_len, burn_in)
        W, L = loss_index.shape
        mask = torch.ones(x.shape[0], L, actor.n_agents, actor.n_actions, dtype=torch.bool)
        for chunk in (None, 2):
            logits = actor.sequence(x, mask, state, r, burn_in=steps, tbptt_chunk=chunk).logits
            E = obs.shape[0]
            want = ref_logits[:, loss_index].transpose(0, 1).reshape(W * E, L, *logits.shape[2:])
            torch.testing.assert_close(logits, want, atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize("backbone", ["gru", "mamba", "mamba2"])
@pytest.mark.parametrize("chunk", [None, 3, 5])
def test_window_gradients_equal_stepwise_reference_with_truncation(backbone, chunk):
    """One long window (the whole rollout, T = 10) from a stored state: the gradient of a
    loss on its logits equals that of the step-by-step loop, the state detached by hand every
    ``chunk`` steps (truncated BPTT) or never."""
    actor = _actor(backbone, seed=2)
    ref = _reference_backend(actor)
    obs, resets, state0 = _rollout(actor, E=2, T=10, seed=3)
    weights = torch.randn(2, 10, actor.n_agents, actor.n_actions, dtype=torch.float64)
    ref_logits, _ = _stepwise(ref, obs, state0, resets, detach_every=chunk)
    (ref_logits * weights).sum().backward()
    mask = torch.ones(2, 10, actor.n_agents, actor.n_actions, dtype=torch.bool)
    logits = actor.sequence(obs, mask, state0, resets, tbptt_chunk=chunk).logits
    (logits * weights).sum().backward()
    torch.testing.assert_close(logits, ref_logits, atol=1e-9, rtol=1e-9)
    for (name, p), q in zip(actor.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-8, rtol=1e-7, msg=name)
    if chunk is not None:  # the truncation changes the gradient (else the test proves nothing)
        full = _reference_backend(actor)
        full_logits, _ = _stepwise(full, obs, state0, resets)
        (full_logits * weights).sum().backward()
        diff = max(
            float((p.grad - q.grad).abs().max())
            for p, q in zip(full.parameters(), ref.parameters(), strict=True)
        )
        assert diff > 1e-6


def test_burn_in_carries_no_gradient():
    """Burn-in steps refresh the state without autograd: the loss window's gradient equals
    that of a window started from the refreshed state given as a constant."""
    actor = _actor("gru", seed=4)
    obs, resets, state0 = _rollout(actor, E=2, T=8, seed=5)
    steps = torch.tensor([4, 4])
    mask = torch.ones(2, 4, actor.n_agents, actor.n_actions, dtype=torch.bool)
    w = torch.randn(2, 4, actor.n_agents, actor.n_actions, dtype=torch.float64)
    (actor.sequence(obs, mask, state0, resets, burn_in=steps).logits * w).sum().backward()
    grads = [p.grad.clone() for p in actor.parameters()]
    actor.zero_grad()
    with torch.no_grad():
        _, warm = _stepwise(actor, obs[:, :4], state0, resets[:, :4])
    state = tuple(s.detach() for s in warm[-1])
    (actor.sequence(obs[:, 4:], mask, state, resets[:, 4:]).logits * w).sum().backward()
    for g, p in zip(grads, actor.parameters(), strict=True):
        torch.testing.assert_close(g, p.grad, atol=1e-10, rtol=1e-10)


def _minibatch(actor, seed=6, E=4, T=8):
    obs, resets, state0 = _rollout(actor, E=E, T=T, seed=seed)
    g = torch.Generator().manual_seed(seed)
    n, A = actor.n_agents, actor.n_actions
    mask = torch.rand(E, T, n, A, generator=g) < 0.8
    mask[..., 0] = True
    return Minibatch(
        obs=obs,
        action_mask=mask,
        actions=torch.zeros(E, T, n, dtype=torch.long),
        old_logp=torch.full((E, T, n), -1.2, dtype=torch.float64),
        advantages=torch.randn(E, T, n, generator=g, dtype=torch.float64),
        loss_mask=torch.rand(E, T, generator=g) < 0.9,
        resets=resets,
        state=state0,
    )


def test_chunked_backward_equals_the_whole_window_backward():
    """The update's per-chunk backward (activations of one chunk at a time) gives the
    gradient and the metrics of one backward over the window's summed chunk losses."""
    actor = _actor("mamba", seed=7)
    mb = _minibatch(actor)
    coef = PPOLossConfig(ent_coef=0.05)
    count = mb.sample_mask().sum().double()
    objective = ClipPPOObjective(tbptt_chunk=3)
    terms = objective(actor, mb, coef, count=count)
    (terms["loss/policy"] + terms["loss/entropy"]).backward()
    want = [p.grad.clone() for p in actor.parameters()]
    actor.zero_grad()
    parts = chunked_loss_and_backward(objective, {"caller": actor}, {"caller": mb}, coef, count)
    for w, p in zip(want, actor.parameters(), strict=True):
        torch.testing.assert_close(p.grad, w, atol=1e-10, rtol=1e-9)
    for key in ("loss/policy", "loss/entropy", "entropy", "approx_kl", "clip_frac_low"):
        torch.testing.assert_close(parts["caller"][key], terms[key].detach())


# ------------------------------------------------------------------ configuration


def test_sequence_backbone_defaults_resolve_in_one_place_and_mlp_keeps_its_own():
    for backbone in ("mlp", "gru", "mamba", "mamba2"):
        cfg = MAPPOConfig(backbone=backbone)
        for name, value in BACKBONE_DEFAULTS[backbone].items():
            assert getattr(cfg, name) == value, (backbone, name)
        saved = config_to_dict(cfg)  # what config.yaml holds: the resolved values
        assert saved["rollout_steps"] == cfg.rollout_steps and saved["seq_len"] == cfg.seq_len
    assert BACKBONE_DEFAULTS["mlp"] == {"rollout_steps": 32, "seq_len": 16, "burn_in": 0}
    cfg = parse_cli(["--backbone", "mamba", "--seq-len", "32", "--progress", "false"])
    assert cfg.seq_len == 32 and cfg.rollout_steps == BACKBONE_DEFAULTS["mamba"]["rollout_steps"]
    text = build_parser().format_help()
    assert "mamba/mamba2 128" in " ".join(text.split())


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--tbptt-chunk", "4"], r"--tbptt-chunk.*none for the mlp backbone"),
        (["--backbone", "gru", "--tbptt-chunk", "65"], r"--tbptt-chunk.*\[1, seq_len = 64\]"),
        (["--backbone", "gru", "--tbptt-chunk", "0"], r"--tbptt-chunk.*\[1, seq_len = 64\]"),
        (["--backbone", "mamba", "--seq-len", "48"], r"--seq-len.*divisor of rollout_steps=128"),
        (["--backbone", "gru", "--burn-in", "-1"], r"--burn-in.*>= 0"),
    ],
)
def test_bad_window_settings_name_the_field(flags, message):
    with pytest.raises(ConfigError, match=message):
        parse_cli([*flags, "--progress", "false"])


# ------------------------------------------------------------------ whitening keys


def test_position_and_chunk_keys_count_within_the_loss_window_hand_example():
    """T = 8, seq_len = 4, burn_in = 2, chunk_size = 2: loss windows [0, 4) and [4, 8) (the
    second burns in on steps 2, 3, which stay positions 2, 3 of the first window), so
    position = 0 1 2 3 0 1 2 3 and chunk = 0 0 1 1 0 0 1 1. With x = 1..8 (one env, one agent):
    per position the groups {1,5} {2,6} {3,7} {4,8} -> -1 -1 -1 -1 1 1 1 1; per chunk the
    groups {1,2,5,6} (mean 3.5) and {3,4,7,8} (mean 5.5), population std sqrt(4.25)."""
    T = 8
    stub = SimpleNamespace(
        cfg=SimpleNamespace(seq_len=4, burn_in=2),
        layout=SimpleNamespace(n_agents=1),
        type_of_agent=torch.zeros(1, dtype=torch.long),
    )
    batch = SimpleNamespace(
        num_steps=T,
        terminated=torch.zeros(T, 1, dtype=torch.bool),
        episode_start=torch.zeros(T, 1, dtype=torch.bool),
    )
    keys = MAPPO.group_keys(stub, batch)
    assert keys.position.flatten().tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    x = torch.arange(1.0, 9.0, dtype=torch.float64).reshape(T, 1, 1)
    by_position = AdvantageWhitener("position")(x, keys=keys)
    np.testing.assert_allclose(by_position.flatten().numpy(), [-1] * 4 + [1] * 4, atol=1e-7)
    by_chunk = AdvantageWhitener("chunk", chunk_size=2)(x, keys=keys)
    std = np.sqrt(4.25)
    mean = np.array([3.5, 3.5, 5.5, 5.5, 3.5, 3.5, 5.5, 5.5])
    want = (np.arange(1, 9) - mean) / (std + 1e-8)
    np.testing.assert_allclose(by_chunk.flatten().numpy(), want, rtol=1e-7)


@pytest.mark.parametrize(
    ("backbone", "channel"),
    [("mlp", "individual"), ("gru", "none"), ("mamba", "none"), ("mamba2", "none")],
)
def test_penalty_channel_default_follows_the_backbone(backbone: str, channel: str) -> None:
    from marl.run.config import parse_cli

    assert parse_cli([f"--backbone={backbone}"]).penalty_channel == channel
    assert parse_cli(["--algo=grpo", f"--backbone={backbone}"]).penalty_channel == channel
    explicit = parse_cli([f"--backbone={backbone}", "--penalty-channel=individual"])
    assert explicit.penalty_channel == "individual"  # a set value is kept
