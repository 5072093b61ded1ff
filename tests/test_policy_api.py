"""marl.load_policy on PettingZoo observation dicts, and marl.export's ONNX / TorchScript
actors against it (same greedy actions and log-probabilities; every backbone over whole
episodes: tests/test_export_backbones.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import marl
from envs import multisearch_v0
from marl.export import ExportedActor, export_policy
from marl.models.policies import AgentLayout, MultiAgentPolicy
from marl.run.train import main as train_main

TINY = ["--num-envs", "8", "--rollout-steps", "8", "--total-steps", "128", "--progress", "false",
        "--eval-episodes", "2", "--plots", "false", "--gif", "false",
        "--baselines", "false"]  # fmt: skip


@pytest.fixture(scope="module", params=["mlp", "gru"])
def run(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"run_{request.param}")
    args = [*TINY, "--run-dir", str(out), "--backbone", request.param]
    if request.param == "gru":
        args += ["--seq-len", "8"]
    assert train_main(args) == 0
    return out, request.param


def _episode(policy, seed=0, steps=30, deterministic=True):
    env = multisearch_v0.parallel_env()
    obs, _ = env.reset(seed=seed)
    state = policy.initial_state()
    trace = []
    for _ in range(steps):
        if not env.agents:
            break
        actions, new_state = policy.act(obs, state, deterministic=deterministic)
        trace.append((obs, state, actions))
        state = new_state
        obs, *_ = env.step(actions)
    return trace


def test_load_policy_acts_on_parallel_env_and_carries_state(run):
    run_dir, backbone = run
    policy = marl.load_policy(str(run_dir))
    trace = _episode(policy)
    assert len(trace) == 30
    for obs, _, actions in trace:
        assert set(actions) == set(obs)
        for agent, a in actions.items():
            assert obs[agent]["action_mask"][a] == 1  # greedy picks allowed actions
    if backbone == "gru":  # the state moves; a reset state gives the first step again
        assert not torch.equal(trace[5][1]["scout"][0], trace[0][1]["scout"][0])
    assert policy.act(trace[0][0], None)[0] == trace[0][2]
    with pytest.raises(ValueError, match="not trained for"):
        policy.act({"nobody_0": trace[0][0]["scout_0"]})


def test_load_policy_rejects_a_directory_that_is_not_a_run(tmp_path):
    with pytest.raises(ValueError, match="not a run directory"):
        marl.load_policy(str(tmp_path))


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_exported_actors_match_load_policy(run, fmt, tmp_path):
    run_dir, backbone = run
    policy = marl.load_policy(str(run_dir))
    paths = export_policy(policy, str(tmp_path / ("actor.onnx" if fmt == "onnx" else "a.pt")), fmt)
    assert set(paths) == {"scout", "rescuer"}
    runners = {}
    for name, path in paths.items():
        if fmt == "onnx":
            ort = pytest.importorskip("onnxruntime")
            sess = ort.InferenceSession(path)
            runners[name] = lambda feed, s=sess: s.run(None, feed)
        else:
            module = torch.jit.load(path)
            runners[name] = lambda feed, m=module: _run_script(m, feed)
    hidden = {t.name: None for t in policy.layout.types}
    for obs, _, actions in _episode(policy, steps=15):
        logp = policy.log_prob(obs, actions) if backbone == "mlp" else None
        for t in policy.layout.types:
            rows = [(j, a) for j, a in enumerate(t.agents) if a in obs]
            feed = {
                "obs": np.stack([obs[a]["observation"] for _, a in rows]).astype(np.float32),
                "action_mask": np.stack([obs[a]["action_mask"] for _, a in rows]).astype(np.int8),
                "agent_index": np.array([j for j, _ in rows], dtype=np.int64),
            }
            if backbone == "gru":
                h = hidden[t.name]
                feed["state_h"] = np.zeros((len(rows), 64), np.float32) if h is None else h
            out = runners[t.name](feed)
            logits = out[0]
            if backbone == "gru":
                hidden[t.name] = out[1]
            greedy = logits.argmax(-1)
            assert [actions[a] for _, a in rows] == greedy.tolist()
            if backbone == "mlp":  # one-step log-probs (no state to feed log_prob)
                ref = torch.log_softmax(torch.from_numpy(logits), -1).numpy()
                got = [ref[k, actions[a]] for k, (_, a) in enumerate(rows)]
                np.testing.assert_allclose(got, [logp[a] for _, a in rows], atol=1e-5)


@torch.no_grad()
def _run_script(module, feed):
    out = module(*[torch.from_numpy(v) for v in feed.values()])
    return [x.numpy() for x in (out if isinstance(out, tuple) else (out,))]


def test_export_refuses_an_unknown_backbone():
    vec = multisearch_v0.vector_env(1)
    layout = AgentLayout.from_env(vec)
    actor = MultiAgentPolicy(layout, "mlp", 16).actors["scout"]
    with pytest.raises(ValueError, match="mlp, gru, mamba, mamba2"):
        ExportedActor(actor, "transformer")
