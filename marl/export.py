"""``python -m marl.export RUN_DIR --format onnx|torchscript --out FILE``: a run's actors as
standalone files, one per agent type.

Each file computes one agent type's actor for a batch of agents:

=============  =====================  =====================================================
name           shape                  meaning
=============  =====================  =====================================================
obs            float32 [B, obs_dim]   the agent's observation
action_mask    int8/bool [B, A]       1 where the action is allowed
agent_index    int64 [B]              the agent's index within its type (``scout_1`` -> 1)
h (gru)        float32 [B, H]         the GRU state (zeros at an episode's start)
-> logits      float32 [B, A]         masked logits (disallowed actions: -1e9)
-> h (gru)     float32 [B, H]         the new GRU state
=============  =====================  =====================================================

Greedy action: ``argmax(logits)``; log-probabilities: ``log_softmax(logits)``. With one agent
type the file is FILE itself, else ``STEM.<type>.onnx`` (``.pt`` for TorchScript) beside it.
Supported backbones: mlp and gru (mamba / mamba2 actors run their selective scan through
compiled kernels that neither exporter can trace: use ``marl.load_policy`` for them).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from marl.policies import MASK_LOGIT, TypeActor
from marl.policy_api import TrainedPolicy, load_policy

__all__ = ["ExportedActor", "export_policy", "export_paths", "main", "SUPPORTED_BACKBONES"]

SUPPORTED_BACKBONES = ("mlp", "gru")


class ExportedActor(nn.Module):
    """One agent type's actor as a plain function of tensors (see the module docstring):
    the same operations as :meth:`marl.policies.TypeActor.step`."""

    def __init__(self, actor: TypeActor, backbone: str) -> None:
        super().__init__()
        if backbone not in SUPPORTED_BACKBONES:
            raise ValueError(
                f"export supports the {' and '.join(SUPPORTED_BACKBONES)} backbones, got "
                f"{backbone!r} (mamba/mamba2 actors run compiled scan kernels that cannot be "
                "traced; use marl.load_policy to run them)"
            )
        self.actor, self.recurrent = actor, backbone == "gru"
        if self.recurrent and actor.backbone.num_layers != 1:
            raise ValueError("export supports single-layer GRU backbones only")

    def _inputs(self, obs: Tensor, agent_index: Tensor) -> Tensor:
        onehot = F.one_hot(agent_index, self.actor.n_agents).to(obs.dtype)
        return torch.cat([obs, onehot], dim=-1)

    def _logits(self, y: Tensor, action_mask: Tensor) -> Tensor:
        logits = self.actor.head(y)
        return logits.masked_fill(action_mask == 0, MASK_LOGIT)

    def forward(
        self, obs: Tensor, action_mask: Tensor, agent_index: Tensor, h: Tensor | None = None
    ) -> Tensor | tuple[Tensor, Tensor]:
        x = self._inputs(obs, agent_index)
        backbone = self.actor.backbone
        if not self.recurrent:
            return self._logits(backbone.net(x), action_mask)
        feats = backbone.proj(x)
        y, h_new = backbone.gru(feats.unsqueeze(1), h.unsqueeze(0))
        return self._logits(y[:, 0], action_mask), h_new[0]


def export_paths(out: str, type_names: list[str], fmt: str) -> dict[str, str]:
    """Agent type -> file: ``out`` itself for one type, else ``STEM.<type>.<ext>``."""
    if len(type_names) == 1:
        return {type_names[0]: out}
    stem, _ = os.path.splitext(out)
    ext = ".onnx" if fmt == "onnx" else ".pt"
    return {name: f"{stem}.{name}{ext}" for name in type_names}


def _example_inputs(policy: TrainedPolicy, name: str) -> tuple[Tensor, ...]:
    t = next(t for t in policy.layout.types if t.name == name)
    obs = torch.zeros(2, t.obs_dim)
    mask = torch.ones(2, t.n_actions, dtype=torch.int8)
    index = torch.zeros(2, dtype=torch.long)
    if policy.is_recurrent:
        hidden = policy.policy.actors[name].backbone.output_dim
        return obs, mask, index, torch.zeros(2, hidden)
    return obs, mask, index


def export_policy(policy: TrainedPolicy, out: str, fmt: str = "onnx") -> dict[str, str]:
    """Write each agent type's :class:`ExportedActor` as ``fmt`` (onnx | torchscript);
    returns agent type -> path."""
    if fmt not in ("onnx", "torchscript"):
        raise ValueError(f"format must be 'onnx' or 'torchscript', got {fmt!r}")
    backbone = policy.config.backbone if policy.config is not None else "mlp"
    paths = export_paths(out, list(policy.layout.type_names), fmt)
    for name, path in paths.items():
        module = ExportedActor(policy.policy.actors[name], backbone).eval()
        example = _example_inputs(policy, name)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        names = ["obs", "action_mask", "agent_index"] + (["h"] if len(example) == 4 else [])
        outputs = ["logits"] + (["h_out"] if len(example) == 4 else [])
        if fmt == "torchscript":
            with torch.no_grad():
                torch.jit.save(torch.jit.trace(module, example), path)
        else:
            torch.onnx.export(
                module,
                example,
                path,
                input_names=names,
                output_names=outputs,
                dynamic_axes={n: {0: "batch"} for n in names + outputs},
                dynamo=False,
            )
    return paths


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m marl.export",
        description="Export a run's actors (mlp, gru) as ONNX or TorchScript files, one per "
        "agent type: inputs obs [B, obs_dim], action_mask [B, A], agent_index int64 [B] (and "
        "h [B, H] for gru); outputs the masked logits [B, A] (and the new h).",
    )
    p.add_argument("run_dir")
    p.add_argument("--format", choices=("onnx", "torchscript"), default="onnx")
    p.add_argument("--out", required=True, help="FILE (one agent type) or the stem of the files")
    p.add_argument("--checkpoint", default=None, help="checkpoint file (default: the latest)")
    args = p.parse_args(argv)
    try:
        policy = load_policy(args.run_dir, checkpoint=args.checkpoint)
        paths = export_policy(policy, args.out, args.format)
    except (ValueError, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for name, path in paths.items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
