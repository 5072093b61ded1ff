"""The policy artifact a run writes apart from its resume state (issue 39 item 1): its layout
and description, checked against the env's own spaces, config.yaml, eval.json, finished.json
and the pickled checkpoints (loaded here, by the test, as the reference); an interrupted run's
artifact; and that marl.load_policy, marl.evaluate and marl.export never unpickle a run's
files: a planted checkpoint whose unpickling creates a file is neither run nor a traceback,
and a run with pickled checkpoints only is loaded with trust=True / --trust-checkpoint
alone."""

from __future__ import annotations

import importlib.metadata
import json
import shutil

import pytest
import torch
import yaml

import marl
import marl.run.train as train_module
from envs import multisearch_v0
from marl.export import main as export_main
from marl.run.evaluate import main as eval_main
from marl.run.train import EXIT_INTERRUPTED
from marl.run.train import main as train_main

ENV = {"grid_size": 8, "max_cycles": 20, "n_targets": 1}
#: 3 updates of 4 envs x 16 steps (64, 128, 192 env steps), a checkpoint after each, 2 kept
TINY = [
    "--num-envs", "4", "--rollout-steps", "16", "--hidden-dim", "16",
    "--critic-hidden-dim", "16", "--epochs", "1", "--num-minibatches", "1",
    "--eval-episodes", "1", "--eval-every", "0", "--checkpoint-every", "1",
    "--keep-checkpoints", "2", "--total-steps", "192", "--progress", "false",
    "--baselines", "false", "--plots", "false", "--gif", "false",
    *[f"--env.{k}={v}" for k, v in ENV.items()],
]  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run = tmp_path_factory.mktemp("artifact") / "run"
    assert train_main([*TINY, "--run-dir", str(run)]) == 0
    return run


@pytest.fixture
def run(trained, tmp_path):
    """A copy of the trained run that a test may change (hard links become copies)."""
    copy = tmp_path / "run"
    shutil.copytree(trained, copy)
    return copy


def _pickled_policy(path) -> dict:
    """The policy state of a resume checkpoint (the test trusts its own run's files)."""
    return torch.load(path, weights_only=False)["algo"]["policy"]


def _assert_same_tensors(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_a_run_writes_its_policy_artifact(trained):
    folder = trained / "policy"
    assert sorted(p.name for p in folder.iterdir()) == [
        "policy.json",
        "weights.pt",
        "weights_2.pt",
        "weights_3.pt",
    ]
    ckpts = trained / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["ckpt_2.pt", "ckpt_3.pt", "latest.pt"]
    # tensors only, readable with weights_only=True; the weights of the matching checkpoints
    weights = {p.name: torch.load(p, weights_only=True) for p in folder.glob("*.pt")}
    for state in weights.values():
        assert all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items())
    _assert_same_tensors(weights["weights.pt"], _pickled_policy(ckpts / "ckpt_3.pt"))
    _assert_same_tensors(weights["weights_3.pt"], _pickled_policy(ckpts / "ckpt_3.pt"))
    _assert_same_tensors(weights["weights_2.pt"], _pickled_policy(ckpts / "ckpt_2.pt"))

    desc = json.loads((folder / "policy.json").read_text())
    config = yaml.safe_load((trained / "config.yaml").read_text())
    finished = json.loads((trained / "finished.json").read_text())
    assert desc["format"] == "coopsearch-policy" and desc["format_version"] == 1
    assert desc["algo"] == "mappo" == config["algo"]
    assert desc["backbone"]["kind"] == "mlp" and desc["backbone"]["hidden_dim"] == 16
    assert desc["backbone"]["activation"] == config["activation"]
    assert desc["env"] == {"env_fn": config["env_fn"], "kwargs": config["env"]}
    assert desc["config"] == config
    env = multisearch_v0.parallel_env(**ENV)
    assert desc["agents"] == list(env.possible_agents)
    assert [t["name"] for t in desc["agent_types"]] == ["scout", "rescuer"]
    for entry in desc["agent_types"]:
        for agent in entry["agents"]:
            assert agent.startswith(entry["name"] + "_")
            space = env.observation_space(agent)
            obs = entry["observation_space"]
            assert obs["observation"]["shape"] == list(space["observation"].shape)
            assert obs["action_mask"]["shape"] == list(space["action_mask"].shape)
            assert entry["action_space"] == {"type": "Discrete", "n": env.action_space(agent).n}
        assert entry["state_shapes"] == []  # mlp: no recurrent state
    assert desc["version"] == importlib.metadata.version("coopsearch")
    assert desc["commit"] == finished["commit"] and desc["dirty"] == finished["dirty"]
    assert (desc["update"], desc["env_steps"]) == (3, 192)
    assert desc["checkpoint"] == "checkpoints/ckpt_3.pt" == finished["checkpoint"]
    assert desc["weights"] == "weights.pt"
    assert desc["checkpoint_weights"] == [
        {"update": u, "env_steps": 64 * u, "checkpoint": f"checkpoints/ckpt_{u}.pt",
         "weights": f"weights_{u}.pt"}
        for u in (3, 2)
    ]  # fmt: skip
    assert desc["evaluation"] == json.loads((trained / "eval.json").read_text())
    assert marl.load_policy(str(trained)).description == desc


def test_the_policy_folder_alone_is_enough(trained, tmp_path):
    shipped = tmp_path / "shipped"
    shutil.copytree(trained / "policy", shipped)
    policy = marl.load_policy(str(shipped))  # no config.yaml, no checkpoints, no env built
    reference = marl.load_policy(str(trained))
    env = multisearch_v0.parallel_env(**ENV)
    obs, _ = env.reset(seed=3)
    while env.agents:
        actions, _ = policy.act(obs)
        assert actions == reference.act(obs)[0]
        obs, *_ = env.step(actions)


def test_an_interrupted_run_has_an_artifact_and_a_resume_rewrites_it(tmp_path, monkeypatch):
    run = tmp_path / "run"

    def interrupted(*args, **kwargs):  # stopped during the final evaluation
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(train_module, "_finish", interrupted)
        assert train_main([*TINY, "--run-dir", str(run)]) == EXIT_INTERRUPTED
    assert not (run / "finished.json").exists()
    desc = json.loads((run / "policy" / "policy.json").read_text())
    assert (desc["update"], desc["env_steps"], desc["evaluation"]) == (3, 192, None)
    _assert_same_tensors(
        torch.load(run / "policy" / "weights.pt", weights_only=True),
        _pickled_policy(run / "checkpoints" / "ckpt_3.pt"),
    )
    assert eval_main([str(run), "--episodes", "1", "--out", str(tmp_path / "e.json")]) == 0
    assert train_main(["--resume", str(run), "--total-steps", "256", "--progress", "false"]) == 0
    desc = json.loads((run / "policy" / "policy.json").read_text())
    assert (desc["update"], desc["env_steps"]) == (4, 256)
    assert desc["evaluation"] == json.loads((run / "eval.json").read_text())
    assert [e["update"] for e in desc["checkpoint_weights"]] == [4, 3]  # 2 kept, as the run's
    assert sorted(p.name for p in (run / "policy").glob("weights_*.pt")) == [
        "weights_3.pt",
        "weights_4.pt",
    ]


# ------------------------------------------------------------------------------------------
# nothing is unpickled
# ------------------------------------------------------------------------------------------
class _CreatesFile:
    """Unpickling this calls ``open(path, "w")``: the file appears."""

    def __init__(self, path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _plant(path, sentinel) -> None:
    torch.save(_CreatesFile(sentinel), path)


def _one_error_line(err: str, *needles: str) -> None:
    """One ``error:`` line, the last (after any notes of files skipped), and no traceback."""
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and err.splitlines()[-1] == errors[0], err
    for needle in needles:
        assert needle in errors[0], (needle, err)


def test_planted_pickles_are_never_unpickled(run, tmp_path, capsys):
    sentinel = tmp_path / "unpickled"
    for path in (run / "checkpoints").iterdir():
        _plant(path, sentinel)
    out = tmp_path / "out"
    # the policy artifact is what is read: everything works, with --checkpoint too
    marl.load_policy(str(run))
    marl.load_policy(str(run), checkpoint="ckpt_2.pt")
    marl.load_policy(str(run), checkpoint=str(run / "checkpoints" / "latest.pt"))
    assert eval_main([str(run), "--episodes", "1", "--out", str(out / "a.json")]) == 0
    assert eval_main([str(run), "--checkpoint", "ckpt_2.pt", "--out", str(out / "b.json")]) == 0
    assert export_main([str(run), "--format", "torchscript", "--out", str(out / "p")]) == 0
    assert export_main([str(run), "--format", "torchscript", "--out", str(out / "q"),
                        "--checkpoint", "latest.pt"]) == 0  # fmt: skip
    assert not sentinel.exists()
    capsys.readouterr()

    # planted policy weights: refused by torch.load(weights_only=True), one error line
    for path in (run / "policy").glob("*.pt"):
        _plant(path, sentinel)
    with pytest.raises(ValueError, match="not a policy weights file"):
        marl.load_policy(str(run))
    with pytest.raises(ValueError, match="weights_2.pt"):
        marl.load_policy(str(run), checkpoint="ckpt_2.pt")
    capsys.readouterr()
    assert eval_main([str(run), "--episodes", "1"]) == 2
    _one_error_line(capsys.readouterr().err, "weights.pt", "weights_3.pt", "weights_2.pt")
    assert export_main([str(run), "--format", "torchscript", "--out", str(out / "r")]) == 2
    _one_error_line(capsys.readouterr().err, "not a policy weights file")
    assert not sentinel.exists()

    # a run with pickled checkpoints only (written before policy artifacts): refused unless
    # trusted, saying why
    shutil.rmtree(run / "policy")
    with pytest.raises(ValueError, match="trust=True"):
        marl.load_policy(str(run))
    assert eval_main([str(run), "--episodes", "1"]) == 2
    _one_error_line(capsys.readouterr().err, "no policy artifact", "--trust-checkpoint")
    assert export_main([str(run), "--format", "torchscript", "--out", str(out / "s")]) == 2
    _one_error_line(capsys.readouterr().err, "no policy artifact", "--trust-checkpoint")
    assert not sentinel.exists()
    assert not list(out.glob("r*")) and not list(out.glob("s*"))

    # the plant is live: trusting the run unpickles it (and still fails in one line)
    with pytest.raises(ValueError, match="could be loaded"):
        marl.load_policy(str(run), trust=True)
    assert sentinel.exists()


def test_a_run_with_pickled_checkpoints_only_loads_when_trusted(run, tmp_path, capsys):
    reference = marl.load_policy(str(run))
    shutil.rmtree(run / "policy")
    with pytest.raises(ValueError, match="no policy artifact"):
        marl.load_policy(str(run), checkpoint="ckpt_2.pt")
    policy = marl.load_policy(str(run), trust=True)
    assert policy.description is None
    for name, value in reference.policy.state_dict().items():
        assert torch.equal(policy.policy.state_dict()[name], value), name
    out = tmp_path / "e.json"
    assert eval_main([str(run), "--episodes", "1", "--trust-checkpoint", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["checkpoint"] == "checkpoints/ckpt_3.pt"
    assert export_main([str(run), "--format", "torchscript", "--out", f"{tmp_path}/x/",
                        "--trust-checkpoint"]) == 0  # fmt: skip
    assert sorted(p.name for p in (tmp_path / "x").iterdir()) == ["rescuer.pt", "scout.pt"]
