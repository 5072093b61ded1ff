"""``python -m marl.export RUN_DIR --format onnx|torchscript --out STEM|FILE|DIR/``: a run's
actors as standalone files, one per agent type.

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

Greedy action: ``argmax(logits)``; log-probabilities: ``log_softmax(logits)``.

Files (:func:`export_paths`), for every agent type (multisearch: ``scout``, ``rescuer``):
``--out policy`` or ``--out policy.onnx`` -> ``policy.scout.onnx``, ``policy.rescuer.onnx``;
``--out exported/`` (a trailing slash, or an existing directory) -> ``exported/scout.onnx``,
``exported/rescuer.onnx``. TorchScript files end in ``.pt`` instead. Each path written is
printed. ONNX export needs the ``export`` extra (``pip install 'coopsearch[export]'``).

Supported backbones: mlp and gru (mamba / mamba2 actors run their selective scan through
compiled kernels that neither exporter can trace: use ``marl.load_policy`` for them).
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from marl.policies import MASK_LOGIT, TypeActor
from marl.policy_api import TrainedPolicy, load_policy
from marl.run.cli import StrictArgumentParser

__all__ = ["ExportedActor", "export_policy", "export_paths", "main", "SUPPORTED_BACKBONES"]

SUPPORTED_BACKBONES = ("mlp", "gru")

#: file extension of each format
EXTENSIONS = {"onnx": ".onnx", "torchscript": ".pt"}

#: the packages of the ``export`` extra (``pip install 'coopsearch[export]'``)
EXPORT_EXTRA = ("onnx", "onnxscript", "onnxruntime")


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
    """Agent type -> file, one per type, ``ext`` the format's extension (.onnx, .pt):
    ``DIR/<type><ext>`` when ``out`` is a directory (it exists, or ends in a slash), else
    ``STEM.<type><ext>``, ``out`` being the stem or a file name with the extension
    (``policy`` or ``policy.onnx`` -> ``policy.scout.onnx``). A file name with the other
    format's extension is refused (ValueError)."""
    if fmt not in EXTENSIONS:
        raise ValueError(f"format must be 'onnx' or 'torchscript', got {fmt!r}")
    ext = EXTENSIONS[fmt]
    if out.endswith(("/", os.sep)) or os.path.isdir(out):
        return {name: os.path.join(out, name + ext) for name in type_names}
    stem, given = os.path.splitext(out)
    if given == ext:
        out = stem
    elif given in EXTENSIONS.values():
        raise ValueError(
            f"--out {out!r} ends in {given}, the extension of the other format; --format {fmt} "
            f"writes {ext} files (give a stem, a name ending in {ext}, or a directory)"
        )
    return {name: f"{out}.{name}{ext}" for name in type_names}


def require_export_extra() -> None:
    """Raise ImportError (one line: what is missing, how to install it) unless the packages
    of the ``export`` extra import."""
    missing = []
    for name in EXPORT_EXTRA:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise ImportError(
            f"ONNX export needs {', '.join(missing)} (the 'export' extra): pip install "
            "'coopsearch[export]'"
        )


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
    paths = export_paths(out, list(policy.layout.type_names), fmt)
    if fmt == "onnx":
        require_export_extra()
    backbone = policy.config.backbone if policy.config is not None else "mlp"
    for name, path in paths.items():
        module = ExportedActor(policy.policy.actors[name], backbone).eval()
        example = _example_inputs(policy, name)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        names = ["obs", "action_mask", "agent_index"] + (["h"] if len(example) == 4 else [])
        outputs = ["logits"] + (["h_out"] if len(example) == 4 else [])
        with warnings.catch_warnings():
            # torch's notices that torch.jit and its TorchScript-based ONNX exporter
            # (dynamo=False) are deprecated: nothing a user of this command can act on
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", FutureWarning)
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
    """``python -m marl.export``; returns the exit status: 0 written, 2 bad input or the
    ``export`` extra missing (an ``error:`` line)."""
    p = StrictArgumentParser(
        prog="python -m marl.export",
        allow_abbrev=False,
        description="Export a run's actors (mlp, gru) as ONNX or TorchScript files, one per "
        "agent type: inputs obs [B, obs_dim], action_mask [B, A], agent_index int64 [B] (and "
        "h [B, H] for gru); outputs the masked logits [B, A] (and the new h). Prints each "
        "file written. ONNX needs pip install 'coopsearch[export]'.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--format", choices=("onnx", "torchscript"), default="onnx")
    p.add_argument(
        "--out",
        required=True,
        metavar="STEM|FILE|DIR/",
        help="where the files go, one per agent type: STEM or STEM.onnx -> STEM.<type>.onnx; "
        "DIR/ (a trailing slash or an existing directory) -> DIR/<type>.onnx (.pt instead of "
        ".onnx for --format torchscript)",
    )
    p.add_argument("--checkpoint", default=None, help="checkpoint file (default: the latest)")
    args = p.parse_args(argv)
    try:
        export_paths(args.out, ["type"], args.format)  # a bad --out before any work
        if args.format == "onnx":
            require_export_extra()
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
