"""Training configuration: one dataclass, a YAML file, CLI overrides, validation.

Precedence (lowest to highest): dataclass defaults < ``--recipe`` values < YAML file
(``--config FILE``) < command-line flags. A recipe never overrides a field that the YAML file
or the command line set explicitly. Environment keyword arguments live under ``env:`` in YAML
and as ``--env.KEY VALUE`` on the command line.

``parse_cli(argv)`` returns a validated :class:`TrainConfig` or raises :class:`ConfigError`
(a ``ValueError``) naming the bad option or value and what is allowed, before any work starts.
``python -m marl.train --help`` lists every field with its meaning and default.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import Any

import yaml

from marl.core import whitening as _whitening

__all__ = [
    "ConfigError",
    "TrainConfig",
    "RECIPES",
    "parse_cli",
    "load_config",
    "load_run_config",
    "config_to_dict",
    "config_from_dict",
    "validate_config",
    "DEMO_MAX_TIME",
]

#: Wall-clock budget used when neither --total-steps nor --max-time is given (the demo).
DEMO_MAX_TIME = 180.0

ALGOS = ("mappo", "grpo")
BACKBONES = ("mlp", "gru", "mamba", "mamba2")
ACTIVATIONS = ("tanh", "relu")
#: Defaults that differ by algorithm (the fields default to None, filled in at construction).
#: MAPPO: 64 envs x 32 steps (the same 2048 env steps per update as 32 x 64, with half the
#: per-step dispatch overhead) and ReLU (the MAPPO paper's default; torch's tanh is ~15x
#: slower than relu on these CPUs), chosen for throughput and re-validated on the learning
#: benchmarks (BENCHMARKS.md); GRPO keeps the settings its results were measured with.
ALGO_DEFAULTS: dict[str, dict[str, Any]] = {
    "mappo": {"num_envs": 64, "activation": "relu"},
    "grpo": {"num_envs": 32, "activation": "tanh"},
}
# The scheme names are marl.core.whitening's (one source of truth): a scheme added there is
# selectable here.
WHITENING_SCHEMES = _whitening.SCHEMES
INNER_SCHEMES = _whitening.GROUPING_SCHEMES
PENALTY_CHANNELS = ("individual", "none")
PENALTY_SCHEDULES = ("none", "constant", "linear")
GRPO_ADVANTAGES = ("outcome", "process")
LR_SCHEDULES = ("constant", "linear")
DEVICES = ("cpu", "cuda", "auto")
RECIPE_NAMES = ("default", "baseline", "calibrated")


class ConfigError(ValueError):
    """An unknown option or an invalid value in the training configuration."""


def _f(default: Any, help: str, **kw: Any) -> Any:  # noqa: A002 - mirrors argparse
    """A dataclass field carrying its CLI help text."""
    if isinstance(default, dict | list):
        return field(default_factory=lambda d=default: type(d)(d), metadata={"help": help, **kw})
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class TrainConfig:
    """Every knob of ``python -m marl.train``; each field is also a ``--field-name`` flag."""

    # ---- run -------------------------------------------------------------------------------
    algo: str = _f("mappo", "Algorithm.", choices=ALGOS)
    recipe: str = _f(
        "default",
        "Preset of objective settings: 'calibrated' = value clip 0.1, 4 value epochs, batch "
        "whitening then clip 5.0, entropy 0.01, optimism offset 0.5; 'baseline' = plain batch "
        "whitening only (no value clip/norm, no entropy, no grad clip); 'default' = the fields' "
        "defaults. Explicit flags/YAML keys override recipe values.",
        choices=RECIPE_NAMES,
    )
    seed: int = _f(0, "Base seed for torch, numpy and the environments.")
    total_steps: int | None = _f(
        None,
        "Environment steps to train (summed over the vector envs: one step of E envs counts E). "
        f"None: until --max-time (when both are None: max_time={DEMO_MAX_TIME:g}s, the demo).",
    )
    max_time: float | None = _f(
        None, "Wall-clock training budget in seconds (then evaluate as at a normal end)."
    )
    run_dir: str | None = _f(None, "Run directory (default runs/<algo>-<backbone>-<timestamp>).")
    device: str = _f("cpu", "Torch device for the update ('auto': cuda when available).")
    torch_threads: int = _f(
        1,
        "torch intra-op threads (0: min(2, cpu count)). 1 is fastest for these small networks "
        "and robust on shared machines (more threads spin and contend).",
    )
    progress: bool = _f(True, "Show a tqdm progress bar with key figures.")
    # ---- environment -----------------------------------------------------------------------
    env_fn: str = _f(
        "envs.multisearch_v0:vector_env",
        "'module:function' building the vector env (docs/CONTRACTS.md section 1).",
    )
    env: dict = _f(
        {}, "Environment keyword arguments (YAML 'env:' mapping; CLI '--env.KEY VALUE')."
    )
    num_envs: int | None = _f(
        None,
        "Number of vectorised environments E (none: the algorithm's default, "
        f"{ALGO_DEFAULTS['mappo']['num_envs']} for mappo, {ALGO_DEFAULTS['grpo']['num_envs']} "
        "for grpo).",
    )
    rollout_steps: int = _f(32, "Steps T per rollout (one update uses T*E env steps).")
    # ---- model -----------------------------------------------------------------------------
    backbone: str = _f("mlp", "Actor backbone (seqmodels.backbones).", choices=BACKBONES)
    hidden_dim: int = _f(64, "Actor backbone width.")
    critic_hidden_dim: int = _f(64, "Centralised critic MLP width.")
    activation: str | None = _f(
        None,
        "Hidden activation of the centralised critic's MLP and of the mlp/gru actor backbones "
        "(the mamba/mamba2 blocks keep their own SiLU); none: the algorithm's default, "
        f"{ALGO_DEFAULTS['mappo']['activation']} for mappo (the MAPPO paper's), "
        f"{ALGO_DEFAULTS['grpo']['activation']} for grpo.",
        choices=ACTIVATIONS,
    )
    seq_len: int = _f(
        16,
        "Training window length for recurrent backbones (must divide rollout_steps); for every "
        "backbone also the window of the position/chunk/sequence whitening keys "
        "(position = step index within the rollout modulo seq_len).",
    )
    burn_in: int = _f(
        0, "Recurrent burn-in steps before each window (no loss on them; recurrent backbones)."
    )
    # ---- optimisation ----------------------------------------------------------------------
    lr: float = _f(1e-3, "Actor learning rate (Adam).")
    critic_lr: float | None = _f(None, "Critic learning rate (None: same as lr).")
    lr_schedule: str = _f("constant", "Learning-rate schedule.", choices=LR_SCHEDULES)
    gamma: float = _f(0.99, "Discount factor.")
    gae_lambda: float = _f(0.95, "GAE lambda.")
    epochs: int = _f(4, "Policy epochs per update.")
    value_epochs: int | None = _f(
        2,
        "Value epochs per update (none: same as epochs). 2 learns as fast per env step as 4 "
        "at half the critic's cost (BENCHMARKS.md, MAPPO defaults).",
    )
    num_minibatches: int = _f(4, "Minibatches per epoch.")
    clip_low: float = _f(0.2, "Ratio clip below 1: ratio >= 1 - clip_low.")
    clip_high: float = _f(0.2, "Ratio clip above 1: ratio <= 1 + clip_high (clip-higher).")
    dual_clip: float | None = _f(
        None, "Dual-clip constant c > 1 bounding the loss for negative advantages (None: off)."
    )
    ent_coef: float = _f(0.01, "Entropy bonus coefficient.")
    ent_coef_final: float | None = _f(
        None, "Entropy coefficient at the end, annealed linearly (None: constant)."
    )
    value_clip: float | None = _f(None, "Clipped value loss epsilon (None: off).")
    value_norm: bool = _f(True, "Normalise value targets with a debiased EMA (MAPPO ValueNorm).")
    value_norm_beta: float = _f(0.99999, "ValueNorm EMA coefficient.")
    value_ensemble: int = _f(1, "Number K of value heads; their advantages are averaged.")
    optimism_offset: float | None = _f(
        None,
        "Learnable optimism offset b, initial value (A' = A + b, b trained to minimise "
        "mean(A')^2; None: off).",
    )
    max_grad_norm: float | None = _f(10.0, "Gradient-norm clip (None: off).")
    parallel_update: bool = _f(
        True,
        "Run the independent parts of an update in threads on separate cores: each agent "
        "type's actor forward/backward side by side (mlp and gru backbones; mamba/mamba2 run "
        "the types one after another, their numba kernels must not be entered from two "
        "threads), and (MAPPO) the critic's value epochs alongside the env steps of the next "
        "rollout, which is collected ahead and kept for the next update (alongside the policy "
        "epochs before a checkpoint). Identical results either way (the parts are combined in "
        "a fixed order; the critic's minibatch order is drawn before the policy's; a rollout "
        "touches no critic state until its values, which wait for the value epochs). "
        "Distributed MAPPO runs the critic after the policy, so that collectives keep their "
        "order.",
    )
    # ---- advantages and whitening ----------------------------------------------------------
    whitening: str = _f(
        "team_individual",
        "Advantage whitening scheme (marl.core.whitening).",
        choices=WHITENING_SCHEMES,
    )
    alpha: float = _f(0.5, "Team weight when mixing whitened team and individual advantages.")
    whiten_inner: str = _f(
        "type", "Grouping inside team_individual whitening.", choices=INNER_SCHEMES
    )
    chunk_size: int = _f(64, "Chunk size for the 'chunk' scheme (positions per chunk).")
    running_momentum: float = _f(0.99, "EMA momentum for 'running_ema'.")
    adv_clip: float | None = _f(None, "Symmetric clip of whitened advantages (None: off).")
    penalty_channel: str = _f(
        "individual",
        "Where the penalty reward goes when penalty shaping is off: added to the individual "
        "channel (learned by the individual value head) or dropped ('none').",
        choices=PENALTY_CHANNELS,
    )
    penalty_beta_schedule: str = _f(
        "none",
        "Seed 003 penalty shaping A - beta(t) * normalised penalty ('none': off).",
        choices=PENALTY_SCHEDULES,
    )
    penalty_beta: float = _f(0.5, "Penalty shaping beta (initial value for 'linear').")
    penalty_beta_floor: float = _f(0.1, "Floor of the linear penalty beta schedule.")
    # ---- GRPO (marl.algos.grpo) ------------------------------------------------------------------
    group_size: int = _f(8, "GRPO: episodes per group (same reset seed).")
    grpo_advantage: str = _f("outcome", "GRPO advantage variant.", choices=GRPO_ADVANTAGES)
    grpo_scale_std: bool = _f(True, "GRPO: divide by the group std (False: Dr. GRPO).")
    grpo_leave_one_out: bool = _f(False, "GRPO: leave-one-out baseline (RLOO).")
    grpo_filter_zero_std: bool = _f(False, "GRPO: drop zero-variance groups.")
    kl_beta: float = _f(0.0, "KL(k3) coefficient to the reference policy.")
    ref_refresh: int = _f(0, "Refresh the reference policy every K updates (0: never).")
    # ---- evaluation, checkpoints, artifacts ------------------------------------------------
    eval_every: int = _f(20, "Evaluate on the validation seeds every N updates (0: end only).")
    eval_episodes: int = _f(32, "Validation episodes (one per validation seed).")
    eval_seed: int = _f(10_000, "First validation seed (seeds eval_seed .. +eval_episodes-1).")
    eval_deterministic: bool = _f(False, "Greedy actions in evaluation (False: sample).")
    checkpoint_every: int = _f(10, "Write checkpoints/latest.pt every N updates.")
    plots: bool = _f(True, "Write PNG plots at the end.")
    gif: bool = _f(True, "Write episode.gif of one evaluation episode at the end.")
    baselines: bool = _f(
        True, "At the end, print the heuristic and random baselines next to the trained policy."
    )

    # ---- derived helpers (not fields) ------------------------------------------------------
    def __post_init__(self) -> None:
        # fields left at None take the algorithm's default (an unknown algo is reported by
        # validate_config)
        for name, value in ALGO_DEFAULTS.get(self.algo, {}).items():
            if getattr(self, name) is None:
                setattr(self, name, value)

    @property
    def resolved_value_epochs(self) -> int:
        """Value epochs (falls back to ``epochs``)."""
        return self.epochs if self.value_epochs is None else self.value_epochs

    @property
    def resolved_critic_lr(self) -> float:
        """Critic learning rate (falls back to ``lr``)."""
        return self.lr if self.critic_lr is None else self.critic_lr


FIELDS: dict[str, dataclasses.Field] = {f.name: f for f in dataclasses.fields(TrainConfig)}

#: Recipe values, applied to fields the user did not set explicitly.
RECIPES: dict[str, dict[str, Any]] = {
    "default": {},
    "baseline": {
        "whitening": "batch",
        "adv_clip": None,
        "value_clip": None,
        "value_norm": False,
        "value_epochs": None,
        "ent_coef": 0.0,
        "optimism_offset": None,
        "max_grad_norm": None,
        "dual_clip": None,
        "value_ensemble": 1,
    },
    "calibrated": {
        "whitening": "batch",
        "adv_clip": 5.0,
        "value_clip": 0.1,
        "value_epochs": 4,
        "ent_coef": 0.01,
        "optimism_offset": 0.5,
    },
}


# ------------------------------------------------------------------------------------------
# conversion helpers
# ------------------------------------------------------------------------------------------
_NONE_STRINGS = {"none", "null", "~", ""}
_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def _field_kind(name: str) -> tuple[type, bool]:
    """(base type, optional) of a config field from its annotation string."""
    ann = str(FIELDS[name].type).replace(" ", "")
    optional = "None" in ann.split("|")
    base = ann.split("|")[0]
    return {"int": int, "float": float, "str": str, "bool": bool, "dict": dict}[base], optional


def _coerce(name: str, value: Any) -> Any:
    """Convert ``value`` (from YAML or a CLI string) to field ``name``'s type."""
    typ, optional = _field_kind(name)
    flag = "--" + name.replace("_", "-")
    choices = FIELDS[name].metadata.get("choices")
    if isinstance(value, str) and choices and value in choices:
        return value  # a choice spelled like None (whitening / penalty schedule 'none')
    if value is None or (isinstance(value, str) and value.strip().lower() in _NONE_STRINGS):
        if optional:
            return None
        if typ is dict and value is None:
            return {}
        raise ConfigError(f"{flag}: None is not allowed (expected {typ.__name__})")
    try:
        if typ is bool:
            if isinstance(value, bool):
                return value
            s = str(value).strip().lower()
            if s in _TRUE:
                return True
            if s in _FALSE:
                return False
            raise ValueError
        if typ is int:
            if isinstance(value, bool):
                raise ValueError
            if isinstance(value, float):
                if not value.is_integer():
                    raise ValueError
                return int(value)
            return (
                int(float(value)) if isinstance(value, str) and "e" in value.lower() else int(value)
            )
        if typ is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if typ is dict:
            if not isinstance(value, dict):
                raise ValueError
            return dict(value)
        return str(value)
    except (TypeError, ValueError):
        allowed = "true/false" if typ is bool else typ.__name__
        if optional and typ is not bool:
            allowed += " or none"
        raise ConfigError(f"{flag}: invalid value {value!r} (expected {allowed})") from None


def config_to_dict(cfg: TrainConfig) -> dict[str, Any]:
    """Every field of ``cfg`` as plain Python values (``env`` as a nested mapping)."""
    return {name: getattr(cfg, name) for name in FIELDS}


def config_from_dict(d: dict[str, Any], *, strict: bool = True) -> TrainConfig:
    """Build a config from a mapping (e.g. a run's config.yaml); unknown keys raise."""
    kwargs = {}
    for key, value in d.items():
        name = key.replace("-", "_")
        if name not in FIELDS:
            if strict:
                raise ConfigError(f"unknown config key {key!r}; known keys: {', '.join(FIELDS)}")
            continue
        kwargs[name] = _coerce(name, value)
    cfg = TrainConfig(**kwargs)
    validate_config(cfg)
    return cfg


def load_config(path: str) -> dict[str, Any]:
    """Read a YAML config file into a mapping of field name -> value (validated names)."""
    if not os.path.isfile(path):
        raise ConfigError(f"--config: file not found: {path!r}")
    with open(path) as fh:
        data = yaml.safe_load(fh) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path!r}: expected a mapping at top level")
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name not in FIELDS:
            raise ConfigError(
                f"--config {path!r}: unknown key {key!r}; known keys: {', '.join(FIELDS)}"
            )
        out[name] = _coerce(name, value)
    return out


#: Values of fields added after runs were first written, as those runs used them: a run
#: directory's config.yaml without the key was trained with this value (not today's default).
LEGACY_RUN_VALUES: dict[str, Any] = {"activation": "tanh"}


def load_run_config(run_dir: str) -> dict[str, Any]:
    """A run directory's resolved ``config.yaml`` (as :func:`load_config`), with the values
    older runs were trained with for fields their config.yaml predates."""
    out = load_config(os.path.join(run_dir, "config.yaml"))
    for name, value in LEGACY_RUN_VALUES.items():
        out.setdefault(name, value)
    return out


# ------------------------------------------------------------------------------------------
# validation
# ------------------------------------------------------------------------------------------
def _check(cond: bool, name: str, value: Any, allowed: str) -> None:
    if not cond:
        raise ConfigError(
            f"--{name.replace('_', '-')}: invalid value {value!r}; allowed: {allowed}"
        )


def _check_applicable(cfg: TrainConfig, explicit: Any) -> None:
    """Reject options that the chosen whitening scheme / schedule would silently ignore.

    A field counts as set when it was given on the command line (``explicit``, even at its
    default value) or when its value differs from the default (YAML, code); recipes never
    set these fields, so a recipe alone never triggers the error.
    """
    explicit = frozenset(explicit or ())

    def is_set(name: str) -> bool:
        f = FIELDS[name]
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]
        return name in explicit or getattr(cfg, name) != default

    scheme = cfg.whitening
    grouped = ("team_individual", "running", "running_ema")
    # GRPO always mixes team and individual returns by alpha within groups of its inner
    # grouping, and has no value norm (marl.algos.grpo.validate_grpo_config checks its options)
    grpo = cfg.algo == "grpo"
    # (field, applies?, when it applies)
    rules = (
        ("alpha", grpo or scheme == "team_individual", "--whitening team_individual"),
        (
            "whiten_inner",
            grpo or scheme in grouped,
            "--whitening team_individual, running or running_ema (their inner grouping)",
        ),
        (
            "chunk_size",
            scheme == "chunk" or (scheme in grouped and cfg.whiten_inner == "chunk"),
            "--whitening chunk, or team_individual/running/running_ema with --whiten-inner chunk",
        ),
        ("running_momentum", scheme == "running_ema", "--whitening running_ema"),
        (
            "penalty_beta",
            cfg.penalty_beta_schedule != "none",
            "--penalty-beta-schedule constant or linear",
        ),
        (
            "penalty_beta_floor",
            cfg.penalty_beta_schedule == "linear",
            "--penalty-beta-schedule linear",
        ),
        ("value_norm_beta", grpo or bool(cfg.value_norm), "--value-norm true"),
    )
    for name, applies, when in rules:
        if not applies and is_set(name):
            current = {
                "penalty_beta": f"--penalty-beta-schedule {cfg.penalty_beta_schedule}",
                "penalty_beta_floor": f"--penalty-beta-schedule {cfg.penalty_beta_schedule}",
                "value_norm_beta": f"--value-norm {cfg.value_norm}",
            }.get(name, f"--whitening {scheme}")
            raise ConfigError(
                f"--{name.replace('_', '-')}: has no effect with {current}; it applies only "
                f"with {when} (remove it or change that option)"
            )


def validate_config(cfg: TrainConfig) -> None:
    """Raise ConfigError naming the first invalid field and its allowed values."""
    for name, f in FIELDS.items():
        choices = f.metadata.get("choices")
        if choices is not None:
            _check(getattr(cfg, name) in choices, name, getattr(cfg, name), ", ".join(choices))
    pos_int = "an integer >= 1"
    for name in (
        "num_envs",
        "rollout_steps",
        "hidden_dim",
        "critic_hidden_dim",
        "seq_len",
        "epochs",
        "num_minibatches",
        "value_ensemble",
        "chunk_size",
        "group_size",
        "eval_episodes",
        "checkpoint_every",
    ):
        _check(getattr(cfg, name) >= 1, name, getattr(cfg, name), pos_int)
    for name in ("seed", "eval_seed", "burn_in", "eval_every", "ref_refresh", "torch_threads"):
        _check(getattr(cfg, name) >= 0, name, getattr(cfg, name), "an integer >= 0")
    if cfg.value_epochs is not None:
        _check(cfg.value_epochs >= 1, "value_epochs", cfg.value_epochs, pos_int + " or none")
    if cfg.total_steps is not None:
        _check(cfg.total_steps >= 1, "total_steps", cfg.total_steps, pos_int + " or none")
    if cfg.max_time is not None:
        _check(
            math.isfinite(cfg.max_time) and cfg.max_time > 0,
            "max_time",
            cfg.max_time,
            "a number > 0 or none",
        )
    for name in ("lr", "value_norm_beta"):
        v = getattr(cfg, name)
        _check(math.isfinite(v) and v > 0, name, v, "a number > 0")
    _check(cfg.value_norm_beta < 1, "value_norm_beta", cfg.value_norm_beta, "a number in (0, 1)")
    if cfg.critic_lr is not None:
        _check(cfg.critic_lr > 0, "critic_lr", cfg.critic_lr, "a number > 0 or none")
    for name in ("gamma", "gae_lambda", "alpha"):
        v = getattr(cfg, name)
        _check(0.0 <= v <= 1.0, name, v, "a number in [0, 1]")
    _check(0.0 < cfg.clip_low < 1.0, "clip_low", cfg.clip_low, "a number in (0, 1)")
    _check(cfg.clip_high > 0.0, "clip_high", cfg.clip_high, "a number > 0")
    if cfg.dual_clip is not None:
        _check(cfg.dual_clip > 1.0, "dual_clip", cfg.dual_clip, "a number > 1 or none")
    _check(cfg.ent_coef >= 0, "ent_coef", cfg.ent_coef, "a number >= 0")
    if cfg.ent_coef_final is not None:
        _check(cfg.ent_coef_final >= 0, "ent_coef_final", cfg.ent_coef_final, ">= 0 or none")
    for name in ("value_clip", "max_grad_norm", "adv_clip"):
        v = getattr(cfg, name)
        if v is not None:
            _check(v > 0, name, v, "a number > 0 or none")
    _check(0.0 < cfg.running_momentum < 1.0, "running_momentum", cfg.running_momentum, "(0, 1)")
    if cfg.optimism_offset is not None:
        _check(
            math.isfinite(cfg.optimism_offset),
            "optimism_offset",
            cfg.optimism_offset,
            "a finite number or none",
        )
    _check(cfg.penalty_beta >= 0, "penalty_beta", cfg.penalty_beta, "a number >= 0")
    _check(cfg.penalty_beta_floor >= 0, "penalty_beta_floor", cfg.penalty_beta_floor, ">= 0")
    _check(cfg.kl_beta >= 0, "kl_beta", cfg.kl_beta, "a number >= 0")
    _check(":" in cfg.env_fn, "env_fn", cfg.env_fn, "'module:function'")
    if cfg.backbone != "mlp":
        _check(
            cfg.rollout_steps % cfg.seq_len == 0,
            "seq_len",
            cfg.seq_len,
            f"a divisor of rollout_steps={cfg.rollout_steps} for recurrent backbones",
        )
        _check(
            cfg.burn_in + cfg.seq_len <= cfg.rollout_steps,
            "burn_in",
            cfg.burn_in,
            f"an integer in [0, rollout_steps - seq_len = {cfg.rollout_steps - cfg.seq_len}]",
        )
    else:
        _check(cfg.burn_in == 0, "burn_in", cfg.burn_in, "0 for the mlp backbone (no memory)")
    for key in cfg.env:
        _check(isinstance(key, str) and key.isidentifier(), "env", key, "keyword-argument names")
    _check_applicable(cfg, getattr(cfg, "_explicit", None))
    # options that do not apply to the chosen algorithm (value heads with grpo, GRPO-only
    # options with mappo) are rejected, not ignored
    from marl.algos.grpo import validate_grpo_config

    validate_grpo_config(cfg, getattr(cfg, "_explicit", None))


# ------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        raise ConfigError(message)


def _default_text(f: dataclasses.Field) -> str:
    default = f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]
    return "none" if default is None else repr(default)


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser generated from TrainConfig's fields (all values as strings)."""
    p = _Parser(
        prog="python -m marl.train",
        description="Train cooperating agents (MAPPO/GRPO) on a vector env. Every config field "
        "is a flag; YAML --config sets any of them (env kwargs under 'env:'); environment "
        "kwargs on the command line as --env.KEY VALUE (e.g. --env.grid_size 8).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", default=None, help="YAML config file (keys = field names).")
    p.add_argument(
        "--resume",
        default=None,
        metavar="RUN_DIR",
        help="Continue the run in RUN_DIR from checkpoints/latest.pt.",
    )
    for name, f in FIELDS.items():
        if name == "env":
            continue
        flags = ["--" + name.replace("_", "-")]
        if "_" in name:
            flags.append("--" + name)
        choices = f.metadata.get("choices")
        help_text = f.metadata["help"] + f" [default: {_default_text(f)}]"
        if choices:
            help_text += f" {{{', '.join(choices)}}}"
        p.add_argument(*flags, dest=name, default=None, metavar=name.upper(), help=help_text)
    return p


def _parse_env_overrides(extra: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    i = 0
    while i < len(extra):
        tok = extra[i]
        if not tok.startswith("--env."):
            raise ConfigError(
                f"unrecognized option {tok!r}; see --help for the fields (env kwargs: --env.KEY V)"
            )
        key = tok[len("--env.") :]
        if "=" in key:
            key, raw = key.split("=", 1)
            i += 1
        else:
            if i + 1 >= len(extra):
                raise ConfigError(f"{tok}: expected a value")
            raw = extra[i + 1]
            i += 2
        if not key.isidentifier():
            raise ConfigError(f"{tok}: {key!r} is not a keyword-argument name")
        out[key] = yaml.safe_load(raw)
    return out


def parse_cli(argv: list[str] | None = None) -> TrainConfig:
    """Parse command-line arguments into a validated TrainConfig.

    Raises ConfigError naming an unknown option or an invalid value (and the allowed values).
    ``--resume RUN_DIR`` loads RUN_DIR/config.yaml as the base (CLI flags still override) and
    sets ``run_dir`` to RUN_DIR; the resume flag is stored on the returned object as
    ``cfg._resume`` and the names of explicitly set fields as ``cfg._explicit`` (attributes,
    not fields).
    """
    parser = build_parser()
    ns, extra = parser.parse_known_args(list(argv) if argv is not None else None)
    explicit: dict[str, Any] = {}
    base: dict[str, Any] = {}
    if ns.resume is not None:
        path = os.path.join(ns.resume, "config.yaml")
        if not os.path.isfile(path):
            raise ConfigError(f"--resume {ns.resume!r}: no config.yaml in that directory")
        base = load_run_config(ns.resume)
        base["run_dir"] = ns.resume
    if ns.config is not None:
        explicit.update(load_config(ns.config))
    for name in FIELDS:
        if name == "env":
            continue
        raw = getattr(ns, name)
        if raw is not None:
            explicit[name] = _coerce(name, raw)
    env_over = _parse_env_overrides(extra)
    values: dict[str, Any] = dict(base)
    if not base:
        recipe = explicit.get("recipe", TrainConfig.recipe)
        if recipe not in RECIPES:
            raise ConfigError(f"--recipe: invalid value {recipe!r}; allowed: {', '.join(RECIPES)}")
        recipe_values = RECIPES[recipe]
        if explicit.get("algo", TrainConfig.algo) == "grpo":
            # a recipe is a preset for both algorithms: GRPO takes the parts that apply to it
            from marl.algos.grpo import INAPPLICABLE_TO_GRPO

            recipe_values = {
                k: v for k, v in recipe_values.items() if k not in INAPPLICABLE_TO_GRPO
            }
        values.update(recipe_values)
    values.update(explicit)
    env = dict(values.get("env", {}))
    env.update(env_over)
    values["env"] = env
    cfg = TrainConfig(**values)
    # fields set on the command line (validate_grpo_config rejects inapplicable ones)
    cfg._explicit = frozenset(  # type: ignore[attr-defined]
        name for name in FIELDS if name != "env" and getattr(ns, name) is not None
    )
    validate_config(cfg)
    cfg._resume = ns.resume  # type: ignore[attr-defined]
    # fields the user set explicitly (YAML or flags; env kwargs as "env"), e.g. for algorithms
    # that reject options they cannot honour
    cfg._explicit = set(explicit) | ({"env"} if env_over else set())  # type: ignore[attr-defined]
    return cfg


def whitener_from_config(
    cfg: TrainConfig, *, num_groups: int, distributed: bool, scheme: str | None = None
) -> _whitening.AdvantageWhitener:
    """The advantage whitener the config asks for (``scheme`` overrides ``cfg.whitening``).

    One place maps the whitening fields (alpha, inner key, chunk size, clip, EMA momentum) to
    :class:`marl.core.whitening.AdvantageWhitener`, for every algorithm.
    """
    return _whitening.AdvantageWhitener(
        cfg.whitening if scheme is None else scheme,
        alpha=cfg.alpha,
        inner=cfg.whiten_inner,
        chunk_size=cfg.chunk_size,
        clip_range=cfg.adv_clip,
        momentum=cfg.running_momentum,
        num_groups=num_groups,
        distributed=distributed,
    )
