"""``python -m marl.export RUN_DIR --format onnx|torchscript --out STEM|FILE|DIR/``: a run's
actors as standalone step functions, one file per agent type, for every backbone (mlp, gru,
mamba, mamba2).

Each file computes one step of one agent type's actor for a batch of agents:

==================  =========================  ================================================
name                shape                      meaning
==================  =========================  ================================================
obs                 float32 [B, obs_dim]       the agent's observation
action_mask         int8 [B, A]                1 where the action is allowed
agent_index         int64 [B]                  the agent's index within its type (``scout_1``
                                               -> 1)
state_h (gru)       float32 [B, H]             the GRU state
state_conv (mamba,  float32 [B, C, d_conv]     the Mamba block's conv window (mamba:
mamba2)                                        C = d_inner; mamba2: C = d_inner + 2 * ngroups
                                               * d_state)
state_ssm (mamba,   float32 [B, d_inner,       the Mamba block's SSM state (mamba2:
mamba2)             d_state]                   [B, nheads, headdim, d_state])
-> logits           float32 [B, A]             masked logits (disallowed actions: -1e9)
-> next_state_*     as the state inputs        the state after this step, one output per state
                                               input, in the same order
==================  =========================  ================================================

Greedy action: ``argmax(logits)``; log-probabilities: ``log_softmax(logits)``. The initial
state, at an episode's start, is zeros (an agent's row reset to zeros starts its new episode;
nothing else carries over): :meth:`ExportedActor.initial_state`, and the per-agent shapes are
in the run's ``policy/policy.json`` (``agent_types[k].state_shapes``) and in each ONNX file's
metadata (``coopsearch.state_shapes``).

The step is :meth:`marl.models.policies.TypeActor.step` without its reset flag: the backbone's own
``step`` traced, on the pure-torch ``reference`` backend for mamba / mamba2 (the readable
twins of the numba kernels, :mod:`seqmodels.ops`; no compiled kernel is traced).

Files (:func:`export_paths`), for every agent type (multisearch: ``scout``, ``rescuer``):
``--out policy`` or ``--out policy.onnx`` -> ``policy.scout.onnx``, ``policy.rescuer.onnx``;
``--out exported/`` (a trailing slash, or an existing directory) -> ``exported/scout.onnx``,
``exported/rescuer.onnx``. TorchScript files end in ``.pt`` instead. Each path written is
printed. ONNX export needs the ``export`` extra (``pip install 'coopsearch[export]'``).

The policy is read from the run's policy artifact (``RUN_DIR/policy/``, as
:func:`marl.load_policy`): nothing is unpickled unless ``--trust-checkpoint`` for a run
written before artifacts existed.
"""

from __future__ import annotations

import copy
import importlib
import json
import os
import sys
import warnings

import torch
from torch import Tensor, nn

from marl.models.policies import MASK_LOGIT, TypeActor
from marl.run.artifact import TRUST_CHECKPOINT_HELP
from marl.run.cli import StrictArgumentParser
from marl.run.policy_api import TrainedPolicy, load_policy
from seqmodels.backbones import backbone_spec, registered_backbones

__all__ = [
    "ExportedActor",
    "export_policy",
    "export_paths",
    "export_state_names",
    "main",
    "STATE_NAMES",
    "SUPPORTED_BACKBONES",
]

#: the state inputs of each built-in backbone, in order (the outputs after the logits:
#: ``next_`` + name); a backbone declares its own in its :class:`~seqmodels.backbones.BackboneSpec`
#: and :func:`export_state_names` reads the registry when called, so one registered later
#: exports too
STATE_NAMES: dict[str, tuple[str, ...]] = {
    name: spec.export_state_names
    for name, spec in registered_backbones().items()
    if spec.export_state_names is not None
}
SUPPORTED_BACKBONES = tuple(STATE_NAMES)


def export_state_names(backbone: str) -> tuple[str, ...]:
    """The state inputs of ``backbone``'s exported step function, from the backbone registry
    as it is now (``package.module:NAME`` included). Raises ValueError for a backbone that
    declares none (not exportable), naming the exportable ones."""
    spec = backbone_spec(backbone)
    if spec.export_state_names is None:
        exportable = [
            n for n, s in registered_backbones().items() if s.export_state_names is not None
        ]
        raise ValueError(
            f"export supports the {', '.join(exportable)} backbones, got {backbone!r} (its "
            "BackboneSpec declares no export_state_names)"
        )
    return spec.export_state_names


#: file extension of each format
EXTENSIONS = {"onnx": ".onnx", "torchscript": ".pt"}

#: the packages of the ``export`` extra (``pip install 'coopsearch[export]'``)
EXPORT_EXTRA = ("onnx", "onnxscript", "onnxruntime")

#: the ONNX opset written (18: ReduceMean takes its axes as an input)
ONNX_OPSET = 18


class ExportedActor(nn.Module):
    """One agent type's actor as a plain function of tensors (see the module docstring):
    ``forward(obs, action_mask, agent_index, *state) -> logits`` (mlp) or ``(logits,
    *next_state)``, the operations of :meth:`marl.models.policies.TypeActor.step` on a copy of
    ``actor`` (mamba / mamba2 blocks on the pure-torch ``reference`` backend)."""

    def __init__(self, actor: TypeActor, backbone: str) -> None:
        super().__init__()
        state_names = export_state_names(backbone)
        actor = copy.deepcopy(actor).cpu().eval()
        if backbone in ("mamba", "mamba2"):
            if actor.backbone.num_layers != 1:
                raise ValueError(f"export supports single-layer {backbone} backbones only")
            actor.backbone.backend = "reference"  # readable torch, no numba kernel
        if backbone == "gru" and actor.backbone.num_layers != 1:
            raise ValueError("export supports single-layer GRU backbones only")
        self.actor, self.kind = actor, backbone
        # a shared actor's view holds its modules unregistered: registered here, the trace
        # sees them as parameters (a per-type actor's are its own already)
        self.modules_of_actor = nn.ModuleList([actor.backbone, actor.head])
        self.state_names = state_names

    def state_shapes(self) -> list[list[int]]:
        """The shape of each state input for one agent (the batch dimension left out)."""
        shapes = [list(s.shape[1:]) for s in self.actor.backbone.initial_state(1)]
        return [shape[1:] for shape in shapes] if self.kind == "gru" else shapes

    def initial_state(self, batch_size: int) -> tuple[Tensor, ...]:
        """The state inputs at an episode's start for ``batch_size`` agents: zeros."""
        return tuple(torch.zeros(batch_size, *shape) for shape in self.state_shapes())

    def forward(
        self, obs: Tensor, action_mask: Tensor, agent_index: Tensor, *state: Tensor
    ) -> Tensor | tuple[Tensor, ...]:
        x = self.actor.agent_inputs(obs, agent_index)
        if self.kind == "gru":  # h [B, H] <-> the backbone's (h [B, 1, H],)
            state = (state[0].unsqueeze(1),)
        y, new_state = self.actor.backbone.step(x, tuple(state), None)
        logits = self.actor.head(y)[..., : self.actor.n_actions]  # a shared head: this type's
        logits = logits.masked_fill(action_mask == 0, MASK_LOGIT)
        if not self.state_names:
            return logits
        if self.kind == "gru":
            new_state = (new_state[0][:, 0],)
        return (logits, *new_state)


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


def _rms_norm_symbolic(g, x, normalized_shape, weight, eps):  # ONNX graph values
    """ONNX for ``aten::rms_norm`` (the TorchScript-based exporter has none):
    ``x / sqrt(mean(x^2 over the normalised dims) + eps) * weight``."""
    from torch.onnx import symbolic_helper

    dims = len(symbolic_helper._unpack_list(normalized_shape))
    value = None if symbolic_helper._is_none(eps) else symbolic_helper._get_const(eps, "f", "eps")
    value = torch.finfo(torch.float32).eps if value is None else float(value)
    axes = g.op("Constant", value_t=torch.arange(-dims, 0, dtype=torch.long))
    mean_square = g.op("ReduceMean", g.op("Mul", x, x), axes, keepdims_i=1)
    eps_t = g.op("Constant", value_t=torch.tensor(value, dtype=torch.float32))
    out = g.op("Div", x, g.op("Sqrt", g.op("Add", mean_square, eps_t)))
    return out if symbolic_helper._is_none(weight) else g.op("Mul", out, weight)


def _register_onnx_symbolics() -> None:
    torch.onnx.register_custom_op_symbolic("aten::rms_norm", _rms_norm_symbolic, ONNX_OPSET)


def _add_metadata(path: str, module: ExportedActor, type_name: str) -> None:
    """Record the inputs, the outputs and the initial state in the ONNX file's metadata."""
    import onnx

    model = onnx.load(path)
    props = {
        "coopsearch.agent_type": type_name,
        "coopsearch.backbone": module.kind,
        "coopsearch.state_names": json.dumps(list(module.state_names)),
        "coopsearch.state_shapes": json.dumps(module.state_shapes()),
        "coopsearch.initial_state": "zeros (an episode's start)",
        "coopsearch.greedy_action": "argmax(logits)",
    }
    onnx.helper.set_model_props(model, props)
    onnx.save(model, path)


def export_policy(policy: TrainedPolicy, out: str, fmt: str = "onnx") -> dict[str, str]:
    """Write each agent type's :class:`ExportedActor` as ``fmt`` (onnx | torchscript);
    returns agent type -> path."""
    paths = export_paths(out, list(policy.layout.type_names), fmt)
    if fmt == "onnx":
        require_export_extra()
        _register_onnx_symbolics()
    backbone = policy.policy.backbone_kind
    for name, path in paths.items():
        module = ExportedActor(policy.policy.actors[name], backbone).eval()
        t = next(t for t in policy.layout.types if t.name == name)
        example = (
            torch.zeros(2, t.obs_dim),
            torch.ones(2, t.n_actions, dtype=torch.int8),
            torch.zeros(2, dtype=torch.long),
            *module.initial_state(2),
        )
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        names = ["obs", "action_mask", "agent_index", *module.state_names]
        outputs = ["logits", *(f"next_{n}" for n in module.state_names)]
        with warnings.catch_warnings(), torch.no_grad():
            # torch's notices that torch.jit and its TorchScript-based ONNX exporter
            # (dynamo=False) are deprecated, and the tracer's on the shape checks of the
            # backbones: nothing a user of this command can act on
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            # (the GRU's initial state is an input here, as this warning asks)
            warnings.filterwarnings("ignore", "Exporting a model to ONNX with a batch_size")
            if fmt == "torchscript":
                torch.jit.save(torch.jit.trace(module, example), path)
            else:
                torch.onnx.export(
                    module,
                    example,
                    path,
                    input_names=names,
                    output_names=outputs,
                    dynamic_axes={n: {0: "batch"} for n in names + outputs},
                    opset_version=ONNX_OPSET,
                    dynamo=False,
                )
                _add_metadata(path, module, name)
    return paths


def main(argv: list[str] | None = None) -> int:
    """``python -m marl.export``; returns the exit status: 0 written, 2 bad input or the
    ``export`` extra missing (an ``error:`` line)."""
    p = StrictArgumentParser(
        prog="python -m marl.export",
        allow_abbrev=False,
        description="Export a run's actors (mlp, gru, mamba, mamba2) as ONNX or TorchScript "
        "step functions, one file per agent type: inputs obs [B, obs_dim], action_mask [B, A], "
        "agent_index int64 [B] and the recurrent state (gru: state_h; mamba, mamba2: "
        "state_conv, state_ssm; zeros at an episode's start); outputs the masked logits [B, A] "
        "and the next state (next_state_*). Prints each file written. ONNX needs pip install "
        "'coopsearch[export]'.",
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
    p.add_argument(
        "--checkpoint",
        default=None,
        metavar="FILE",
        help="export the policy of this checkpoint (a path, or a name in RUN_DIR/checkpoints "
        "such as ckpt_40.pt: its weights RUN_DIR/policy/weights_40.pt are read) [default: the "
        "newest policy weights]",
    )
    p.add_argument(
        "--trust-checkpoint",
        action="store_true",
        help=TRUST_CHECKPOINT_HELP,
    )
    args = p.parse_args(argv)
    try:
        export_paths(args.out, ["type"], args.format)  # a bad --out before any work
        if args.format == "onnx":
            require_export_extra()
        policy = load_policy(args.run_dir, checkpoint=args.checkpoint, trust=args.trust_checkpoint)
        paths = export_policy(policy, args.out, args.format)
    except (ValueError, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for name, path in paths.items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
