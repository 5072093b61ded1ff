"""A run's policy artifact: the trained policy apart from its resume state, read without
unpickling anything.

Layout (docs/CONTRACTS.md section 4)::

    RUN_DIR/policy/policy.json      the description (below)
    RUN_DIR/policy/weights.pt       the newest policy weights
    RUN_DIR/policy/weights_<N>.pt   the policy weights of checkpoints/ckpt_<N>.pt, one file per
                                    checkpoint kept (deleted with it)

A weights file is ``torch.save`` of a flat ``{parameter name: tensor}`` dict, the state dict of
:class:`marl.models.policies.MultiAgentPolicy`: ``torch.load(path, weights_only=True)`` reads it
(torch's restricted unpickler: tensors and plain containers, no code), and
``policy.load_state_dict`` takes it as is. (safetensors would do as well; it is not a
dependency of this package.)

``policy.json`` holds what a user of the policy needs and what :func:`load_run_policy` builds it
from: ``format`` (:data:`FORMAT`) and ``format_version``; ``algo``; ``backbone`` (``kind``,
``hidden_dim``, ``activation``, ``settings``: the layer sizes of the backbone as built);
``agents`` (``possible_agents`` order) and ``agent_types``, each with its ``agents``,
``observation_space``, ``action_space`` and ``state_shapes`` (the recurrent state of one agent,
zeros at an episode's start); ``env`` (``env_fn`` and ``kwargs``); ``version`` (coopsearch),
``commit`` and ``dirty`` (:func:`marl.run.provenance.provenance` of the training process);
``update``, ``env_steps``, ``checkpoint`` (the resume checkpoint holding the same weights) and
``weights``; ``checkpoint_weights`` (one entry per ``weights_<N>.pt``: ``update``,
``env_steps``, ``checkpoint``, ``weights``, newest first); ``evaluation`` (the final evaluation,
eval.json's figures; None until the run trains to its end); ``config`` (the run's resolved
configuration, config.yaml's values).

The trainer writes the artifact with every checkpoint (:func:`write_policy_artifact`: the
policy's state dict only) and once more at the end with the final evaluation, before
finished.json; a resumed run rewrites it from the checkpoint it resumes. Resume checkpoints
(pickled, :mod:`marl.run.checkpoint`) are read only by ``marl.train --resume``.
:func:`load_run_policy` (``marl.load_policy``, ``marl.evaluate``, ``marl.export``) reads the
artifact; a run directory written before it existed has only pickled checkpoints, which it
loads only when told ``trust=True`` (``--trust-checkpoint``): unpickling runs whatever code the
file names.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import re
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from marl.adapters.envapi import make_vector_env
from marl.models.policies import AgentLayout, MultiAgentPolicy, TypeSpec
from marl.run.checkpoint import (
    CheckpointError,
    load_checkpoint,
    load_newest_checkpoint,
    numbered_checkpoints,
)
from marl.run.config import ConfigError, config_from_dict, config_to_dict, load_run_config
from marl.run.rundir import atomic_write_bytes, atomic_write_json

__all__ = [
    "POLICY_DIR",
    "DESCRIPTION_FILE",
    "WEIGHTS_FILE",
    "FORMAT",
    "FORMAT_VERSION",
    "PolicyArtifactError",
    "LoadedPolicy",
    "save_weights",
    "load_weights",
    "describe_policy",
    "write_policy_artifact",
    "read_description",
    "layout_from_description",
    "resolve_checkpoint",
    "load_run_policy",
]

#: the artifact's folder in a run directory
POLICY_DIR = "policy"
DESCRIPTION_FILE = "policy.json"
WEIGHTS_FILE = "weights.pt"
FORMAT = "coopsearch-policy"
FORMAT_VERSION = 1
_WEIGHTS_RE = re.compile(r"^weights_(\d+)\.pt$")
_CKPT_RE = re.compile(r"^ckpt_(\d+)\.pt$")

#: why a pickled checkpoint is not loaded without being told to (the end of error messages)
TRUST_HINT = (
    "loading it means unpickling, which runs whatever code the file names: pass trust=True "
    "(marl.evaluate / marl.export: --trust-checkpoint) only for a run directory you trust"
)

#: The help of ``--trust-checkpoint`` (marl.evaluate, marl.export).
TRUST_CHECKPOINT_HELP = (
    "allow loading a pickled checkpoint where the run has no policy weights for it (runs "
    "written before RUN_DIR/policy/ existed): unpickling runs whatever code the file names, "
    "so only for a run directory you trust"
)


class PolicyArtifactError(ValueError):
    """A policy artifact (or a checkpoint asked for) that cannot be used; one line."""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


# ------------------------------------------------------------------------------------------
# weights files
# ------------------------------------------------------------------------------------------
def save_weights(path: str, state_dict: Mapping[str, Tensor]) -> None:
    """Write ``state_dict`` (CPU copies of its tensors, a plain dict) to ``path`` atomically
    with ``torch.save``; ``torch.load(path, weights_only=True)`` reads it back."""
    flat = {str(k): v.detach().to("cpu").clone() for k, v in state_dict.items()}
    buffer = io.BytesIO()
    torch.save(flat, buffer)
    atomic_write_bytes(path, buffer.getbuffer())


def load_weights(path: str, map_location: str | torch.device = "cpu") -> dict[str, Tensor]:
    """The ``{name: tensor}`` dict of a weights file, read with ``weights_only=True`` (nothing
    in the file is executed). FileNotFoundError when missing; :class:`PolicyArtifactError`
    (one line) when it is not such a file (corrupt, truncated, or a pickle of anything else)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the restricted unpickler's notes on odd files
            data = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure: one line naming the file
        raise _not_weights(path, _load_failure(exc)) from None
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, Tensor) for k, v in data.items()
    ):
        raise _not_weights(path, "not a dict of tensors")
    return data


def _load_failure(exc: Exception) -> str:
    """Why ``torch.load(weights_only=True)`` refused a file, in a few words (torch's own
    message is a page that suggests loading the file with weights_only=False)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip()
    named = re.search(r"Unsupported global: GLOBAL (\S+)", text)
    if named is not None:
        return f"it names {named.group(1)}; refused unread: not tensors only"
    if isinstance(exc, pickle.UnpicklingError):
        return "refused unread by torch.load(weights_only=True): not tensors only"
    first = text.split(". ")[0].splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _not_weights(path: str, cause: str) -> PolicyArtifactError:
    exc = PolicyArtifactError(f"{path}: not a policy weights file ({cause})")
    exc.cause = cause  # type: ignore[attr-defined]
    return exc


# ------------------------------------------------------------------------------------------
# the description
# ------------------------------------------------------------------------------------------
def _backbone_settings(backbone: torch.nn.Module) -> dict[str, Any]:
    """The sizes of a backbone as built (descriptive; the loader rebuilds it from ``kind``,
    ``hidden_dim`` and ``activation``)."""
    settings: dict[str, Any] = {"output_dim": int(backbone.output_dim)}
    if hasattr(backbone, "gru"):
        settings["num_layers"] = int(backbone.gru.num_layers)
    elif hasattr(backbone, "blocks"):
        settings["num_layers"] = len(backbone.blocks)
        layernorm = isinstance(backbone.norm_f, torch.nn.LayerNorm)
        settings["norm"] = "layernorm" if layernorm else "rmsnorm"
        block = backbone.blocks[0]
        names = ("d_state", "d_conv", "expand", "d_inner", "dt_rank", "headdim", "ngroups")
        names += ("nheads", "d_ssm", "rmsnorm", "norm_before_gate")
        settings["block"] = {n: getattr(block, n) for n in names if hasattr(block, n)}
    else:
        settings["num_layers"] = sum(isinstance(m, torch.nn.Linear) for m in backbone.modules())
    return settings


def _type_entry(t: TypeSpec, policy: MultiAgentPolicy) -> dict[str, Any]:
    state = policy.actors[t.name].backbone.initial_state(1)
    return {
        "name": t.name,
        "agents": list(t.agents),
        "observation_space": {
            "observation": {"shape": [t.obs_dim], "dtype": "float32"},
            "action_mask": {"shape": [t.n_actions], "dtype": "int8", "allowed": 1},
        },
        "action_space": {"type": "Discrete", "n": t.n_actions},
        "state_shapes": [list(s.shape[1:]) for s in state],
    }


def describe_policy(
    policy: MultiAgentPolicy,
    cfg: Any,
    *,
    update: int,
    env_steps: int,
    provenance: Mapping[str, Any] | None = None,
    evaluation: Mapping[str, Any] | None = None,
    checkpoint_weights: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The contents of ``policy.json`` (see the module docstring) for ``policy`` trained with
    config ``cfg``, ``provenance`` the training process's
    (:func:`marl.run.provenance.provenance`)."""
    layout = policy.layout
    prov = dict(provenance or {})
    any_actor = next(iter(policy.actors.values()))
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "algo": cfg.algo,
        "backbone": {
            "kind": policy.backbone_kind,
            "hidden_dim": int(cfg.hidden_dim),
            "activation": cfg.activation,
            "settings": _backbone_settings(any_actor.backbone),
        },
        "agents": list(layout.agents),
        "agent_types": [_type_entry(t, policy) for t in layout.types],
        "state_dim": int(layout.state_dim),
        "env": {"env_fn": cfg.env_fn, "kwargs": dict(cfg.env)},
        "version": (prov.get("versions") or {}).get("coopsearch"),
        "commit": prov.get("commit"),
        "dirty": prov.get("dirty"),
        "update": int(update),
        "env_steps": int(env_steps),
        "checkpoint": os.path.join("checkpoints", f"ckpt_{int(update)}.pt"),
        "weights": WEIGHTS_FILE,
        "checkpoint_weights": list(checkpoint_weights or []),
        "evaluation": None if evaluation is None else dict(evaluation),
        "config": config_to_dict(cfg),
    }


def _read_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_policy_artifact(
    run_dir: str,
    policy: MultiAgentPolicy,
    cfg: Any,
    *,
    update: int,
    env_steps: int,
    provenance: Mapping[str, Any] | None = None,
    evaluation: Mapping[str, Any] | None = None,
) -> str:
    """Write ``RUN_DIR/policy/``: ``weights.pt`` and (when ``checkpoints/ckpt_<update>.pt``
    exists) ``weights_<update>.pt`` with the policy's state dict, then ``policy.json``; delete
    the ``weights_<N>.pt`` whose checkpoint is gone. Each file is written atomically; returns
    the folder. (Cheap: the policy's tensors and a small JSON file.)"""
    folder = os.path.join(run_dir, POLICY_DIR)
    os.makedirs(folder, exist_ok=True)
    state = policy.state_dict()
    save_weights(os.path.join(folder, WEIGHTS_FILE), state)
    kept = {u for u, _ in numbered_checkpoints(run_dir)}
    previous = _read_json(os.path.join(folder, DESCRIPTION_FILE)) or {}
    env_steps_of = {
        int(e["update"]): int(e["env_steps"])
        for e in previous.get("checkpoint_weights", [])
        if isinstance(e, dict) and "update" in e and "env_steps" in e
    }
    if update in kept:
        save_weights(os.path.join(folder, f"weights_{int(update)}.pt"), state)
        env_steps_of[int(update)] = int(env_steps)
    entries = []
    for name in sorted(os.listdir(folder)):
        m = _WEIGHTS_RE.match(name)
        if m is None:
            continue
        u = int(m.group(1))
        if u not in kept:
            os.remove(os.path.join(folder, name))
            continue
        entries.append(
            {
                "update": u,
                "env_steps": env_steps_of.get(u),
                "checkpoint": os.path.join("checkpoints", f"ckpt_{u}.pt"),
                "weights": name,
            }
        )
    entries.sort(key=lambda e: -e["update"])
    description = describe_policy(
        policy,
        cfg,
        update=update,
        env_steps=env_steps,
        provenance=provenance,
        evaluation=evaluation,
        checkpoint_weights=entries,
    )
    atomic_write_json(os.path.join(folder, DESCRIPTION_FILE), description)
    return folder


def policy_folder(path: str) -> str | None:
    """The artifact folder of ``path`` (a run directory, or the ``policy/`` folder itself), or
    None when it has none."""
    for folder in (path, os.path.join(path, POLICY_DIR)):
        if os.path.isfile(os.path.join(folder, DESCRIPTION_FILE)):
            return folder
    return None


def read_description(folder: str) -> dict[str, Any]:
    """``folder/policy.json``, checked to be a description this version reads
    (:class:`PolicyArtifactError` otherwise)."""
    path = os.path.join(folder, DESCRIPTION_FILE)
    try:
        with open(path) as fh:
            desc = json.load(fh)
    except OSError as exc:
        raise PolicyArtifactError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise PolicyArtifactError(f"{path}: not valid JSON ({_first_line(exc)})") from None
    if not isinstance(desc, dict) or desc.get("format") != FORMAT:
        raise PolicyArtifactError(f"{path}: not a {FORMAT} description")
    version = desc.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise PolicyArtifactError(f"{path}: format_version must be an int, got {version!r}")
    if version > FORMAT_VERSION:
        raise PolicyArtifactError(
            f"{path}: format version {desc.get('format_version')} is newer than this package "
            f"reads ({FORMAT_VERSION}); upgrade coopsearch"
        )
    missing = [k for k in ("backbone", "agents", "agent_types", "config") if k not in desc]
    if missing:
        raise PolicyArtifactError(f"{path}: incomplete description (no {', '.join(missing)})")
    return desc


def layout_from_description(desc: Mapping[str, Any]) -> AgentLayout:
    """The :class:`AgentLayout` a description records (no env is built)."""
    agents = tuple(desc["agents"])
    types = tuple(
        TypeSpec(
            t["name"],
            tuple(t["agents"]),
            tuple(agents.index(a) for a in t["agents"]),
            int(t["observation_space"]["observation"]["shape"][0]),
            int(t["action_space"]["n"]),
        )
        for t in desc["agent_types"]
    )
    return AgentLayout(agents, types, int(desc.get("state_dim", 0)))


# ------------------------------------------------------------------------------------------
# loading: the artifact, or (trusted) a pickled checkpoint of an older run
# ------------------------------------------------------------------------------------------
@dataclass
class LoadedPolicy:
    """What :func:`load_run_policy` returns."""

    policy: MultiAgentPolicy
    layout: AgentLayout
    config: Any
    #: the file the weights came from
    weights: str
    #: the resume checkpoint these weights are those of (``checkpoints/ckpt_<N>.pt``)
    checkpoint: str
    update: int | None
    env_steps: int | None
    #: policy.json's contents (None for a trusted pickled checkpoint)
    description: dict[str, Any] | None = None


def resolve_checkpoint(run_dir: str, name: str) -> str:
    """``checkpoint=`` / ``--checkpoint NAME``: a path, else a file of that name in RUN_DIR,
    RUN_DIR/checkpoints or RUN_DIR/policy. :class:`PolicyArtifactError` when there is none."""
    for path in (
        name,
        os.path.join(run_dir, name),
        os.path.join(run_dir, "checkpoints", name),
        os.path.join(run_dir, POLICY_DIR, name),
    ):
        if os.path.isfile(path):
            return path
    raise PolicyArtifactError(
        f"--checkpoint {name!r}: no such file (looked at it as a path, in {run_dir!r}, in "
        f"{os.path.join(run_dir, 'checkpoints')!r} and in {os.path.join(run_dir, POLICY_DIR)!r})"
    )


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _checkpoint_update(path: str) -> int | None:
    """N of ``ckpt_<N>.pt``; for ``latest.pt`` that of the numbered checkpoint it is (the
    newest one where it is a copy, as after a copy of the run directory); else None."""
    m = _CKPT_RE.match(os.path.basename(path))
    if m is not None:
        return int(m.group(1))
    if os.path.basename(path) == "latest.pt":
        numbered = numbered_checkpoints(os.path.dirname(os.path.dirname(os.path.abspath(path))))
        for u, other in numbered:
            if _same_file(path, other):
                return u
        return numbered[0][0] if numbered else None
    return None


def _entry(desc: Mapping[str, Any], update: int | None) -> dict[str, Any]:
    for e in desc.get("checkpoint_weights", []):
        if isinstance(e, dict) and e.get("update") == update:
            return e
    return {}


def _weights_candidates(
    folder: str, desc: Mapping[str, Any], checkpoint: str | None
) -> tuple[list[tuple[str, int | None]], str | None]:
    """(weights files to try in order with their update, the pickled checkpoint they stand
    for when ``checkpoint`` names one that has no weights file)."""
    if checkpoint is None:  # the newest weights, then each checkpoint's, newest first
        found = [(os.path.join(folder, desc.get("weights", WEIGHTS_FILE)), desc.get("update"))]
        for e in desc.get("checkpoint_weights", []):
            if isinstance(e, dict) and "weights" in e:
                found.append((os.path.join(folder, e["weights"]), e.get("update")))
        return found, None
    base = os.path.basename(checkpoint)
    m = _WEIGHTS_RE.match(base)
    if m is not None:
        return [(checkpoint, int(m.group(1)))], None
    if base == WEIGHTS_FILE:
        return [(checkpoint, desc.get("update"))], None
    update = _checkpoint_update(checkpoint)
    if update is not None:
        twin = os.path.join(
            os.path.dirname(os.path.dirname(os.path.abspath(checkpoint))),
            POLICY_DIR,
            f"weights_{update}.pt",
        )
        if os.path.isfile(twin):
            return [(twin, update)], None
    return [], checkpoint


def _rel(path: str, run_dir: str) -> str:
    rel = os.path.relpath(path, run_dir)
    return path if rel.startswith("..") else rel


def load_run_policy(
    run_dir: str,
    device: str | torch.device = "cpu",
    *,
    checkpoint: str | None = None,
    trust: bool = False,
    warn: Callable[[str], None] | None = None,
) -> LoadedPolicy:
    """The policy of run directory ``run_dir`` (or of a ``policy/`` folder) from its policy
    artifact: the newest weights (a weights file that fails to load is reported through
    ``warn`` and the next newest is used), or with ``checkpoint`` (a file: a weights file, or a
    resume checkpoint ``ckpt_<N>.pt`` / ``latest.pt``, read as its ``policy/weights_<N>.pt``)
    those, without fallback. Nothing is unpickled unless ``trust``: a run directory without
    an artifact, or a checkpoint without a weights file, is then loaded from its pickled
    checkpoint. Raises :class:`PolicyArtifactError` (a ValueError, one line) otherwise."""
    folder = policy_folder(run_dir)
    if checkpoint is not None:
        checkpoint = resolve_checkpoint(run_dir, checkpoint)
    if folder is None:
        return _load_pickled(run_dir, device, checkpoint, trust, warn)
    home = os.path.dirname(folder) if os.path.basename(folder) == POLICY_DIR else folder
    desc = read_description(folder)
    try:
        cfg = config_from_dict(desc["config"], strict=False)
    except (ConfigError, TypeError, ValueError) as exc:
        raise PolicyArtifactError(
            f"{os.path.join(folder, DESCRIPTION_FILE)}: its config does not load "
            f"({_first_line(exc)})"
        ) from None
    try:
        layout = layout_from_description(desc)
        backbone = desc["backbone"]
        policy = MultiAgentPolicy(
            layout,
            backbone["kind"],
            int(backbone["hidden_dim"]),
            backbone.get("activation", "tanh"),
            share_actor=getattr(cfg, "share_actor", "none"),
            agent_ids=getattr(cfg, "agent_ids", True),
        )
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise PolicyArtifactError(
            f"{os.path.join(folder, DESCRIPTION_FILE)}: invalid description ({_first_line(exc)})"
        ) from None
    candidates, pickled = _weights_candidates(folder, desc, checkpoint)
    if pickled is not None:
        if not trust:
            raise PolicyArtifactError(
                f"checkpoint {_rel(pickled, home)} has no policy weights file beside it in "
                f"{os.path.join(home, POLICY_DIR)!r} (a resume checkpoint is a pickle); "
                + TRUST_HINT
            )
        return _load_pickled(home, device, pickled, True, warn, cfg=cfg, layout=layout)
    reasons = []
    for k, (path, update) in enumerate(candidates):
        try:
            state = load_weights(path)
            policy.load_state_dict(state)
        except (FileNotFoundError, PolicyArtifactError, RuntimeError) as exc:
            if isinstance(exc, FileNotFoundError):
                cause = "missing"
            elif isinstance(exc, PolicyArtifactError):
                cause = f"not a policy weights file ({exc.cause})"  # type: ignore[attr-defined]
            else:
                cause = f"does not fit {DESCRIPTION_FILE} ({_first_line(exc)})"
            reasons.append(f"{_rel(path, home)}: {cause}")
            if checkpoint is None and warn is not None and k + 1 < len(candidates):
                warn(f"{_rel(path, home)} could not be loaded ({cause}); trying the next one")
            continue
        if update == desc.get("update"):
            env_steps = desc.get("env_steps")
        else:
            env_steps = _entry(desc, update).get("env_steps")
        ckpt = os.path.join(home, "checkpoints", f"ckpt_{update}.pt")
        return LoadedPolicy(policy.to(device), layout, cfg, path, ckpt, update, env_steps, desc)
    what = "--checkpoint " if checkpoint is not None else ""
    raise PolicyArtifactError(
        f"{what}no policy weights of {home!r} could be loaded: " + "; ".join(reasons)
    )


def _load_pickled(
    run_dir: str,
    device: str | torch.device,
    checkpoint: str | None,
    trust: bool,
    warn: Callable[[str], None] | None,
    *,
    cfg: Any = None,
    layout: AgentLayout | None = None,
) -> LoadedPolicy:
    """A run directory written before policy artifacts: its (pickled) checkpoint, only when
    ``trust``."""
    if cfg is None:
        if not os.path.isfile(os.path.join(run_dir, "config.yaml")):
            raise PolicyArtifactError(
                f"{run_dir!r} is not a run directory (no config.yaml and no "
                f"{POLICY_DIR}/{DESCRIPTION_FILE} in it)"
            )
        if not trust:
            raise PolicyArtifactError(
                f"{run_dir!r} has no policy artifact ({POLICY_DIR}/{DESCRIPTION_FILE}): it was "
                "written before runs saved their policy apart from their resume checkpoints; "
                + TRUST_HINT
            )
        try:
            cfg = config_from_dict(load_run_config(run_dir))
        except (ConfigError, ValueError) as exc:
            raise PolicyArtifactError(f"{run_dir!r} is not a run directory: {exc}") from None
    try:
        if checkpoint is None:
            ckpt, path, _ = load_newest_checkpoint(run_dir, warn=warn)
        else:
            path = checkpoint
            try:
                ckpt = load_checkpoint(path)
            except Exception as exc:  # noqa: BLE001 - any failure to load: one line
                raise CheckpointError(
                    f"--checkpoint {path!r} could not be loaded ({_first_line(exc)})"
                ) from None
            if not isinstance(ckpt, dict) or "algo" not in ckpt:
                raise CheckpointError(f"--checkpoint {path!r} is not a training checkpoint")
    except CheckpointError as exc:
        raise PolicyArtifactError(str(exc)) from None
    if layout is None:
        layout = AgentLayout.from_env(make_vector_env(cfg.env_fn, 1, cfg.env, autoreset=False))
    policy = MultiAgentPolicy.from_config(layout, cfg)
    try:
        policy.load_state_dict(ckpt["algo"]["policy"])
    except (KeyError, TypeError, RuntimeError) as exc:
        raise PolicyArtifactError(
            f"checkpoint {path} does not fit {run_dir}/config.yaml ({_first_line(exc)})"
        ) from None
    return LoadedPolicy(
        policy.to(device), layout, cfg, path, path, ckpt.get("update"), ckpt.get("env_steps")
    )
