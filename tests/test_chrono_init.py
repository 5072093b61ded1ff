"""Chrono initialisation of the gru backbone's update gate (``--chrono-init T``, issue 48
item 5: a training recipe for long horizons).

References: the gate biases against their definition (``log U[1, T - 1]`` on the update gate,
its hidden-side bias 0, every other parameter untouched); what it is for, measured with
autograd on the backbone itself: the gradient of the output 64 steps later with respect to
the first input, relative to that with respect to the last, at a constant input, is below
1e-8 with torch's initialisation and above 1e-2 with chrono 128 (measured: 1e-12 to 2e-10
against 0.06 to 0.14, seeds 0-2); the option reaches the actors through the config, leaves
the default build bit for bit as it was, and is refused for other backbones.
"""

from __future__ import annotations

import math

import pytest
import torch

from marl.models.policies import AgentLayout, MultiAgentPolicy
from marl.run.config import ConfigError, TrainConfig, validate_config
from seqmodels.backbones import GRUBackbone, chrono_init_, make_backbone


@pytest.mark.parametrize("num_layers", [1, 2])
def test_the_update_gate_bias_is_log_uniform_and_nothing_else_changes(num_layers) -> None:
    torch.manual_seed(0)
    gru = torch.nn.GRU(32, 32, num_layers=num_layers)
    before = {name: p.detach().clone() for name, p in gru.named_parameters()}
    chrono_init_(gru, 100)
    H = 32
    for name, p in gru.named_parameters():
        z = slice(H, 2 * H)
        if name.startswith("bias_ih"):
            u = p.detach()[z].exp()
            assert float(u.min()) >= 1.0 - 1e-5 and float(u.max()) <= 99.0 + 1e-3
            assert float(u.std()) > 10  # spread over the range, not one value
            keep = torch.ones(3 * H, dtype=torch.bool)
            keep[z] = False
            assert torch.equal(p.detach()[keep], before[name][keep])  # r and n untouched
        elif name.startswith("bias_hh"):
            assert not p.detach()[z].any()
            keep = torch.ones(3 * H, dtype=torch.bool)
            keep[z] = False
            assert torch.equal(p.detach()[keep], before[name][keep])
        else:
            assert torch.equal(p.detach(), before[name])
    with pytest.raises(ValueError, match="chrono must be an int >= 3"):
        chrono_init_(gru, 2)


def _relative_gradient(chrono: int | None, seed: int, steps: int = 65) -> float:
    """|d y_last / d x_0| / |d y_last / d x_last| at a constant input (autograd)."""
    torch.manual_seed(seed)
    backbone = GRUBackbone(81, 64, chrono=chrono)
    x = torch.randn(1, 1, 81).expand(1, steps, 81).clone().requires_grad_(True)
    y, _ = backbone(x, None, None)
    (grad,) = torch.autograd.grad(y[0, -1].sum(), x)
    return float(grad[0, 0].norm() / grad[0, -1].norm())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_chrono_keeps_a_gradient_path_over_64_steps(seed) -> None:
    assert _relative_gradient(None, seed) < 1e-8
    assert _relative_gradient(128, seed) > 1e-2


def test_the_option_reaches_the_actors_and_the_default_is_unchanged() -> None:
    from envs import multisearch_recall_v1

    layout = AgentLayout.from_env(multisearch_recall_v1.vector_env(1, memory_horizon=8))
    cfg = TrainConfig(backbone="gru", hidden_dim=16, chrono_init=50)
    validate_config(cfg)
    torch.manual_seed(0)
    policy = MultiAgentPolicy.from_config(layout, cfg)
    for actor in policy.actors.values():
        bias = actor.backbone.gru.bias_ih_l0.detach()[16:32]
        assert float(bias.min()) >= 0.0 and float(bias.max()) <= math.log(49) + 1e-6
        assert not actor.backbone.gru.bias_hh_l0.detach()[16:32].any()
    torch.manual_seed(0)
    plain = MultiAgentPolicy.from_config(layout, TrainConfig(backbone="gru", hidden_dim=16))
    torch.manual_seed(0)
    direct = MultiAgentPolicy(layout, "gru", 16, "relu")
    for a, b in zip(plain.parameters(), direct.parameters(), strict=True):
        assert torch.equal(a, b)
    assert isinstance(make_backbone("gru", 4, 8, chrono=10), GRUBackbone)
    with pytest.raises(TypeError, match="unknown argument"):
        make_backbone("mlp", 4, 8, chrono=10)


def test_other_backbones_refuse_it() -> None:
    for backbone in ("mlp", "mamba", "mamba2"):
        with pytest.raises(ConfigError, match="--chrono-init: initialises the gru"):
            validate_config(TrainConfig(backbone=backbone, chrono_init=64))
    with pytest.raises(ConfigError, match="an integer >= 3"):
        validate_config(TrainConfig(backbone="gru", chrono_init=1))


@pytest.mark.parametrize("horizon", [64, 256, 1024, 4096])
def test_memory_horizon_arms_differ_in_the_backbone_only(horizon) -> None:
    """Issue 48's study: within a part the arms' resolved configs differ in the backbone
    (and the gru arm's chrono init, 2H) alone; windows hold whole episodes."""
    from dataclasses import asdict

    from marl.experiments.studies import get_study
    from marl.run.config import parse_cli

    study = get_study(f"memory_horizon_{horizon}")
    arms = {name: asdict(parse_cli(args)) for name, args in study.variants.items()}
    assert study.reference == "gru" and set(arms) == {"mlp", "gru", "mamba", "mamba2"}
    expected = {"mlp": set(), "gru": {"backbone", "chrono_init"}, "mamba": {"backbone"},
                "mamba2": {"backbone"}}  # fmt: skip
    for name, cfg in arms.items():
        assert {k for k in cfg if cfg[k] != arms["mlp"][k]} == expected[name], name
    gru = arms["gru"]
    assert gru["chrono_init"] == 2 * horizon and gru["env"]["memory_horizon"] == horizon
    assert gru["seq_len"] == gru["rollout_steps"] and gru["seq_len"] % (horizon + 1) == 0
