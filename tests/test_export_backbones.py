"""marl.export's step functions for every backbone (mlp, gru, mamba, mamba2), against
marl.load_policy: over two whole multisearch episodes (the state reset to zeros between them),
onnxruntime's and TorchScript's greedy actions equal the loaded policy's step by step, and
their log-probabilities and next states match it. Also the ONNX interface: input names with
``obs``, ``mask`` and the state, the logits first, the initial state's shapes recorded.

Each backbone trains two tiny runs, one with per-type actors and one with an actor shared by
every type (3 updates of 4 envs x 16 steps on an 8x8 grid, hidden size 16): the reference is
that run's policy as ``marl.load_policy`` runs it (mamba / mamba2 on their numba kernels, the
exported files on the pure-torch reference step)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import marl
from envs import multisearch_v0
from marl.export import STATE_NAMES
from marl.export import main as export_main
from marl.run.train import main as train_main

ENV = {"grid_size": 8, "max_cycles": 20, "n_targets": 1}
TINY = [
    "--num-envs", "4", "--rollout-steps", "16", "--hidden-dim", "16",
    "--critic-hidden-dim", "16", "--epochs", "1", "--num-minibatches", "1",
    "--eval-episodes", "1", "--eval-every", "0", "--total-steps", "192",
    "--progress", "false", "--baselines", "false", "--plots", "false", "--gif", "false",
    *[f"--env.{k}={v}" for k, v in ENV.items()],
]  # fmt: skip
BACKBONES = ["mlp", "gru", "mamba", "mamba2"]


@pytest.fixture(
    scope="module",
    params=[(b, share) for share in ("none", "all") for b in BACKBONES],
    ids=lambda p: p[0] if p[1] == "none" else f"{p[0]}-shared",
)
def run(request, tmp_path_factory):
    """A tiny run per backbone, with per-type actors and with one actor shared by every
    type (``--share-actor all``: each type's exported file is its view of the shared actor,
    its observation padded and identified, its logits cut to its own actions)."""
    backbone, share = request.param
    out = tmp_path_factory.mktemp(f"export_{backbone}_{share}") / "run"
    args = [*TINY, "--run-dir", str(out), "--backbone", backbone, "--share-actor", share]
    if backbone != "mlp":
        args += ["--seq-len", "8"]
    assert train_main(args) == 0
    return out, backbone


def _episodes(policy, seeds=(0, 1)):
    """Yield (obs, actions, state before the step, state after) of whole episodes, each
    started from ``policy.initial_state()``."""
    env = multisearch_v0.parallel_env(**ENV)
    for seed in seeds:
        obs, _ = env.reset(seed=seed)
        state = policy.initial_state()
        while env.agents:
            actions, new_state = policy.act(obs, state)
            yield obs, actions, state, new_state
            state = new_state
            obs, *_ = env.step(actions)
        yield None, None, None, None  # the episode's end: the exported state is reset


def _feed(t, obs):
    """Every agent of type ``t`` (absent ones: zeros, every action allowed, as load_policy)."""
    o = np.zeros((t.n_agents, t.obs_dim), np.float32)
    m = np.ones((t.n_agents, t.n_actions), np.int8)
    for j, agent in enumerate(t.agents):
        if agent in obs:
            o[j] = obs[agent]["observation"]
            m[j] = obs[agent]["action_mask"]
    return {"obs": o, "action_mask": m, "agent_index": np.arange(t.n_agents, dtype=np.int64)}


def _flat_state(backbone, state):
    """load_policy's state of one type as the exported state inputs (gru: h [B, H])."""
    if backbone == "gru":
        return [state[0][:, 0].numpy()]
    return [s.numpy() for s in state]


def _check_against_load_policy(policy, backbone, step_fns):
    """Run the exported step functions beside ``policy`` over two episodes; return the
    number of steps compared."""
    names = STATE_NAMES[backbone]
    zero = {
        t.name: _flat_state(backbone, policy.initial_state()[t.name]) for t in policy.layout.types
    }
    carried = dict(zero)
    steps = 0
    for obs, actions, state, new_state in _episodes(policy):
        if obs is None:
            carried = dict(zero)  # a new episode: the initial state, zeros
            continue
        steps += 1
        logp = policy.log_prob(obs, actions, state)
        for t in policy.layout.types:
            feed = _feed(t, obs)
            feed.update(zip(names, carried[t.name], strict=True))
            logits, *next_state = step_fns[t.name](feed)
            present = [(j, a) for j, a in enumerate(t.agents) if a in obs]
            greedy = logits.argmax(-1)
            assert [int(greedy[j]) for j, _ in present] == [actions[a] for _, a in present]
            log_softmax = torch.log_softmax(torch.from_numpy(logits), -1).numpy()
            np.testing.assert_allclose(
                [log_softmax[j, actions[a]] for j, a in present],
                [logp[a] for _, a in present],
                atol=1e-5,
            )
            expected = _flat_state(backbone, new_state[t.name])
            assert len(next_state) == len(expected) == len(names)
            for got, want in zip(next_state, expected, strict=True):
                np.testing.assert_allclose(got, want, atol=1e-5)
            carried[t.name] = next_state
    return steps


def test_onnx_step_functions_match_load_policy(run, tmp_path, capsys):
    ort = pytest.importorskip("onnxruntime")
    run_dir, backbone = run
    capsys.readouterr()
    assert export_main([str(run_dir), "--format", "onnx", "--out", str(tmp_path / "p.onnx")]) == 0
    printed = capsys.readouterr().out.splitlines()
    files = {"scout": tmp_path / "p.scout.onnx", "rescuer": tmp_path / "p.rescuer.onnx"}
    assert printed == [f"{t}: {p}" for t, p in files.items()]
    policy = marl.load_policy(str(run_dir))
    step_fns = {}
    for name, path in files.items():
        sess = ort.InferenceSession(str(path))
        inputs = [i.name for i in sess.get_inputs()]
        outputs = [o.name for o in sess.get_outputs()]
        assert inputs[:3] == ["obs", "action_mask", "agent_index"]
        assert outputs[0] == "logits"
        state_inputs = inputs[3:]
        assert state_inputs == list(STATE_NAMES[backbone])
        assert all("state" in n for n in state_inputs)
        assert outputs[1:] == [f"next_{n}" for n in state_inputs]
        # the initial state's shapes, per agent, as the description records them
        meta = sess.get_modelmeta().custom_metadata_map
        shapes = json.loads(meta["coopsearch.state_shapes"])
        entry = next(t for t in policy.description["agent_types"] if t["name"] == name)
        recorded = entry["state_shapes"]
        if backbone == "gru":
            recorded = [s[1:] for s in recorded]  # the exported h drops the layer axis
        assert shapes == recorded
        step_fns[name] = lambda feed, s=sess: s.run(None, feed)
    assert _check_against_load_policy(policy, backbone, step_fns) >= 20


def test_torchscript_step_functions_match_load_policy(run, tmp_path):
    run_dir, backbone = run
    assert export_main([str(run_dir), "--format", "torchscript", "--out", f"{tmp_path}/"]) == 0
    policy = marl.load_policy(str(run_dir))

    def runner(module):
        @torch.no_grad()
        def step(feed):
            out = module(*[torch.from_numpy(v) for v in feed.values()])
            return [x.numpy() for x in (out if isinstance(out, tuple) else (out,))]

        return step

    step_fns = {t: runner(torch.jit.load(str(tmp_path / f"{t}.pt"))) for t in ("scout", "rescuer")}
    assert _check_against_load_policy(policy, backbone, step_fns) >= 20


@pytest.mark.parametrize("backbone", ["mamba", "mamba2"])
def test_mamba_export_traces_the_reference_step_of_a_copy(backbone):
    from marl.export import ExportedActor
    from marl.models.policies import AgentLayout, MultiAgentPolicy

    layout = AgentLayout.from_env(multisearch_v0.vector_env(1, **ENV))
    actor = MultiAgentPolicy(layout, backbone, 16).actors["scout"]
    exported = ExportedActor(actor, backbone)
    assert exported.actor.backbone.backend == "reference"  # pure torch, no numba kernel
    assert actor.backbone.backend == "auto"  # the policy itself is left as it was
    block = actor.backbone.blocks[0]
    # the initial state: zeros of the block's per-agent state shapes
    assert exported.state_shapes() == [list(s.shape[1:]) for s in block.initial_state(1)]
    assert all(not s.any() for s in exported.initial_state(3))


def test_a_backbone_registered_after_import_exports():
    """export reads the backbone registry when it is called: a backbone registered after
    marl.export was imported exports (its step equals the actor's), and one that declares no
    export_state_names is refused with the exportable ones named."""
    from marl.export import ExportedActor
    from marl.models.policies import AgentLayout, MultiAgentPolicy
    from seqmodels.backbones import BACKBONES, BackboneSpec, MLPBackbone, register_backbone

    def build(input_dim, hidden_dim, **kw):
        return MLPBackbone(input_dim, hidden_dim, num_layers=3, **kw)

    layout = AgentLayout.from_env(multisearch_v0.vector_env(1, **ENV))
    try:
        register_backbone(BackboneSpec("test_deep_mlp", build, recurrent=False,
                                       export_state_names=()))  # fmt: skip
        register_backbone(BackboneSpec("test_private_mlp", build, recurrent=False))
        actor = MultiAgentPolicy(layout, "test_deep_mlp", 16).actors["scout"]
        exported = ExportedActor(actor, "test_deep_mlp")
        n = actor.n_agents
        obs = torch.randn(1, n, actor.obs_dim)
        mask = torch.ones(1, n, actor.n_actions, dtype=torch.int8)
        with torch.no_grad():
            expected, _ = actor._step_logits(obs, (), None)
            got = exported(obs[0], mask[0], torch.arange(n))
        torch.testing.assert_close(got, expected[0])
        private = MultiAgentPolicy(layout, "test_private_mlp", 16).actors["scout"]
        with pytest.raises(ValueError, match="test_deep_mlp") as err:
            ExportedActor(private, "test_private_mlp")
        assert "test_private_mlp" in str(err.value)
    finally:
        BACKBONES.pop("test_deep_mlp", None)
        BACKBONES.pop("test_private_mlp", None)
