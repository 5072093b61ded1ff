"""Training configuration: per-algorithm dataclasses, a YAML file, CLI overrides, validation.

The fields live with the algorithms: :class:`marl.algos.base.BaseConfig` holds the shared
ones, :class:`marl.algos.mappo.MAPPOConfig` and :class:`marl.algos.grpo.GRPOConfig` add their
own. **A field applies to an algorithm exactly when its config class declares it**; setting one
that does not apply (``--algo grpo --value-epochs 3``) is an error naming the algorithms it
belongs to. ``python -m marl.train --help`` lists every field of every algorithm, grouped.

Precedence (lowest to highest): the class defaults < ``--recipe`` values (the parts that apply
to the algorithm) < YAML file (``--config FILE``) < command-line flags. Environment keyword
arguments live under ``env:`` in YAML and as ``--env.KEY VALUE`` on the command line.

``parse_cli(argv)`` returns a validated config or raises :class:`ConfigError` (a
``ValueError``) naming the bad option or value and what is allowed, before any work starts;
``parse_train_args(argv)`` returns it with the options of the invocation beside it
(:class:`marl.run.options.RunOptions`: ``--resume``, ``--overwrite``, ``--keep-checkpoints``,
``--wandb*``), which are no config fields.

:func:`effective_config` is the configuration a config trains with: the no-ops its algorithm
declares (:attr:`~marl.algos.base.BaseConfig.no_ops`, e.g. GRPO's ``--whitening none`` is its
``team_individual``) and the options that do not apply set to the values they train as, the
fields that change no result left out; :func:`one_configuration` says why two configs train
identically (``marl.compare`` refuses such variants).

``--resume RUN_DIR`` continues a run with its own configuration (RUN_DIR/config.yaml). Only
the fields in :data:`RESUME_CHANGEABLE` (budget, cadences, outputs, device, threads,
process settings such as numba's threading layer and the allocator thresholds) may be
set to other values on resume; any other field that differs from the run's, from flags or from
``--config``, is refused with a message naming the fields (the run's value and the new one).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import sys
import textwrap
from collections.abc import Sequence
from typing import Any

import yaml

from marl.algos import ALGORITHMS, BaseConfig, GRPOConfig, MAPPOConfig, resolve_algorithm
from marl.algos.base import DEMO_MAX_TIME, ConfigError, whitener_from_config
from marl.run.cli import StrictArgumentParser, closest_flag, option_strings
from marl.run.options import RunOptions
from marl.run.runlog import WandbOptions, add_wandb_arguments, wandb_options_from_args

__all__ = [
    "ConfigError",
    "TrainConfig",
    "BaseConfig",
    "MAPPOConfig",
    "GRPOConfig",
    "RECIPES",
    "FIELDS",
    "parse_cli",
    "parse_train_args",
    "split_wandb_flags",
    "RunOptions",
    "load_config",
    "load_run_config",
    "config_to_dict",
    "config_from_dict",
    "validate_config",
    "effective_config",
    "one_configuration",
    "whitener_from_config",
    "DEMO_MAX_TIME",
    "RESUME_CHANGEABLE",
    "RESUME_CHANGEABLE_ENV",
    "EXIT_INTERRUPTED",
    "MAX_SEED",
]

#: Exit status of ``python -m marl.train`` when SIGINT (Ctrl-C) or SIGTERM stopped the run
#: before its budget: a checkpoint was written (continue with ``--resume RUN_DIR``). 0 is a
#: finished run, 1 a run stopped by the non-finite guard, 2 bad input or a file-system error.
EXIT_INTERRUPTED = 3

#: Largest ``--seed`` / ``--eval-seed``: numpy's global seed is 32-bit, so larger seeds would
#: repeat the numpy streams of smaller ones.
MAX_SEED = 2**32 - 1

#: Fields that may take new values when a run is resumed (``--resume RUN_DIR``): the budget,
#: the cadences, the outputs and where / how fast it runs. None of them changes the training
#: trajectory (``parallel_update`` and the thread count give identical results; the device
#: may round differently). Fields named ``tensorboard`` / ``wandb*`` (outputs) are changeable too.
RESUME_CHANGEABLE: frozenset[str] = frozenset(
    {
        "total_steps",
        "max_time",
        "max_cpu_time",
        "eval_every",
        "final_eval_episodes",
        "checkpoint_every",
        "plots",
        "gif",
        "baselines",
        "progress",
        "tensorboard",
        "device",
        "torch_threads",
        "parallel_update",
        "numba_threading_layer",
        "malloc_tuning",
    }
)


#: Environment keyword arguments that may change on resume: how the env is stepped, not what
#: it computes (the adapter's worker processes give identical results).
RESUME_CHANGEABLE_ENV: frozenset[str] = frozenset({"adapter_workers"})


def _changeable_on_resume(name: str) -> bool:
    return name in RESUME_CHANGEABLE or name.startswith("wandb")


def _changeable_flags() -> str:
    """The flags of the existing fields that may change on resume, for messages."""
    names = [n for n in _all_fields() if _changeable_on_resume(n)]
    return ", ".join("--" + n.replace("_", "-") for n in sorted(names))


#: ``TrainConfig(algo=NAME, **fields)`` builds that algorithm's config (see
#: :class:`marl.algos.base.BaseConfig`); ``isinstance(cfg, TrainConfig)`` holds for every one.
TrainConfig = BaseConfig


def _all_fields() -> dict[str, dataclasses.Field]:
    """Every field of every algorithm's config (shared first, then each algorithm's own)."""
    out: dict[str, dataclasses.Field] = {f.name: f for f in dataclasses.fields(BaseConfig)}
    for cls in ALGORITHMS.values():
        for f in dataclasses.fields(cls.config_class):
            out.setdefault(f.name, f)
    return out


#: name -> dataclass field, over the built-in algorithms (the CLI flags); the functions here
#: read :func:`_all_fields` afresh, so that an algorithm registered later gets its flags
FIELDS: dict[str, dataclasses.Field] = _all_fields()


def _owners(name: str) -> list[str]:
    """The algorithms whose config declares field ``name``."""
    return [a for a, cls in ALGORITHMS.items() if name in cls.config_class.field_names()]


def _not_applicable(name: str, algo: str) -> ConfigError:
    meaning = _all_fields()[name].metadata["help"].rstrip(".")
    return ConfigError(
        f"--{name.replace('_', '-')} does not apply to --algo {algo}: it is an option of "
        f"--algo {' / '.join(_owners(name))} only ({meaning}); remove it or change --algo"
    )


#: Recipe values, applied to the fields the user did not set (each algorithm takes the
#: fields its config declares).
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
    """(base type, optional) of a config field from its annotation (a string under
    ``from __future__ import annotations``, else the type itself)."""
    ann = _all_fields()[name].type
    ann = (ann.__name__ if isinstance(ann, type) else str(ann)).replace(" ", "")
    optional = "None" in ann.split("|")
    base = ann.split("|")[0]
    return {"int": int, "float": float, "str": str, "bool": bool, "dict": dict}[base], optional


def _coerce(name: str, value: Any) -> Any:
    """Convert ``value`` (from YAML or a CLI string) to field ``name``'s type."""
    typ, optional = _field_kind(name)
    flag = "--" + name.replace("_", "-")
    choices = _all_fields()[name].metadata.get("choices")
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


def config_to_dict(cfg: BaseConfig) -> dict[str, Any]:
    """Every field of ``cfg`` as plain Python values (``env`` as a nested mapping)."""
    return {name: getattr(cfg, name) for name in type(cfg).field_names()}


def _known(key: str, where: str) -> str:
    name = str(key).replace("-", "_")
    if name not in _all_fields():
        raise ConfigError(f"{where}unknown key {key!r}; known keys: {', '.join(_all_fields())}")
    return name


def config_from_dict(d: dict[str, Any], *, strict: bool = True) -> BaseConfig:
    """Build a validated config from a mapping (e.g. a run's config.yaml); unknown keys raise
    (``strict=False``: they are dropped)."""
    kwargs = {}
    if isinstance(d.get("algo"), str) and ":" in d["algo"]:
        resolve_algorithm(d["algo"])  # its own fields become known keys
    for key, value in d.items():
        name = str(key).replace("-", "_")
        if name not in _all_fields():
            if strict:
                _known(key, "")
            continue
        kwargs[name] = _coerce(name, value)
    cfg = BaseConfig.for_algo(kwargs.get("algo", "mappo"))(**kwargs)
    validate_config(cfg)
    return cfg


def load_config(path: str, *, what: str = "--config") -> dict[str, Any]:
    """Read a YAML config file into a mapping of field name -> value (validated names);
    ``what`` names the file's role in error messages (``--config``, ``--resume DIR``)."""
    if not os.path.isfile(path):
        raise ConfigError(f"{what}: file not found: {path!r}")
    try:
        with open(path) as fh:
            data = yaml.safe_load(fh) or {}
    except OSError as exc:
        raise ConfigError(f"{what} {path!r}: cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        where = ""
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1}, column {mark.column + 1}"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{what} {path!r}: YAML syntax error{where}: {problem}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} {path!r}: not a text file ({exc.reason})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {path!r}: expected a mapping at top level")
    if isinstance(data.get("algo"), str) and ":" in data["algo"]:
        resolve_algorithm(data["algo"])  # its own fields become known keys
    return {
        name: _coerce(name, value)
        for name, value in ((_known(k, f"--config {path!r}: "), v) for k, v in data.items())
    }


#: Values of fields added after runs were first written, as those runs used them: a run
#: directory's config.yaml without the key was trained with this value (not today's default).
LEGACY_RUN_VALUES: dict[str, Any] = {"activation": "tanh"}


def load_run_config(run_dir: str) -> dict[str, Any]:
    """A run directory's resolved ``config.yaml`` (as :func:`load_config`), with the values
    older runs were trained with for fields their config.yaml predates. Runs written before
    the per-algorithm configs hold every algorithm's fields: those that do not apply to the
    run's algorithm are dropped."""
    out = load_config(os.path.join(run_dir, "config.yaml"), what=f"run directory {run_dir!r}")
    for name, value in LEGACY_RUN_VALUES.items():
        out.setdefault(name, value)
    own = set(BaseConfig.for_algo(out.get("algo", "mappo")).field_names())
    return {name: value for name, value in out.items() if name in own}


def validate_config(cfg: BaseConfig, explicit: frozenset[str] | set[str] | None = None) -> None:
    """Raise ConfigError naming the first invalid field and its allowed values, or an option
    that does not apply with the others (set in ``explicit`` or away from its default)."""
    if cfg.algo != type(cfg).algo_name and BaseConfig.for_algo(cfg.algo) is not type(cfg):
        raise ConfigError(
            f"--algo {cfg.algo!r} does not match the config class {type(cfg).__name__}"
        )
    cfg.validate()
    for name in ("seed", "eval_seed"):
        value = getattr(cfg, name)
        if not 0 <= value <= MAX_SEED:
            raise ConfigError(
                f"--{name.replace('_', '-')}: invalid value {value}; allowed: an integer in "
                f"[0, {MAX_SEED}] (2**32 - 1)"
            )
    cfg.check_option_rules(frozenset(explicit or ()))


# ------------------------------------------------------------------------------------------
# the configuration a config trains with
# ------------------------------------------------------------------------------------------
def _canonical(cfg: BaseConfig) -> tuple[dict[str, Any], dict[str, str]]:
    """(:func:`effective_config`, field -> why it was changed) of ``cfg``."""
    cls = type(cfg)
    work = copy.copy(cfg)  # the rules read attributes: a shallow copy to rewrite
    reasons: dict[str, str] = {}
    for _ in range(len(cls.field_names()) + 1):  # until nothing changes (a rule may enable one)
        changed = False
        for name, applies, when in work.option_rules():
            default = cls.default_of(name)
            if not applies and getattr(work, name) != default:
                flag = "--" + name.replace("_", "-")
                reasons.setdefault(
                    name, f"{flag} {getattr(work, name)} has no effect unless {when}"
                )
                setattr(work, name, default)
                changed = True
        for rule in cls.no_ops:
            if rule.applies(work):
                reasons.setdefault(rule.option, rule.describe(getattr(work, rule.option)))
                setattr(work, rule.option, rule.same_as)
                changed = True
        if not changed:
            break
    values = {n: getattr(work, n) for n in cls.field_names() if n not in cls.result_free}
    return values, reasons


def effective_config(cfg: BaseConfig) -> dict[str, Any]:
    """The configuration ``cfg`` trains with, as field -> value: the fields that change no
    result (:attr:`~marl.algos.base.BaseConfig.result_free`: outputs, threads) left out, each
    option that does not apply with the others (:meth:`~marl.algos.base.BaseConfig.
    option_rules`) at its default, and each no-op of the algorithm
    (:attr:`~marl.algos.base.BaseConfig.no_ops`) at the value it trains as. Two configs
    whose effective configs are equal train identically, bit for bit."""
    return _canonical(cfg)[0]


def one_configuration(a: BaseConfig, b: BaseConfig) -> str | None:
    """None when configs ``a`` and ``b`` train differently; else why they are one
    configuration: the options in which they differ and what makes each one a no-op (or
    that they set the same configuration)."""
    (eff_a, why_a), (eff_b, why_b) = _canonical(a), _canonical(b)
    if eff_a != eff_b:
        return None
    raw_a, raw_b = config_to_dict(a), config_to_dict(b)
    reasons: list[str] = []
    for name in raw_a:
        if raw_a[name] == raw_b[name]:
            continue
        flag = "--" + name.replace("_", "-")
        if name in type(a).result_free:
            reasons.append(f"{flag} changes no result")
            continue
        for why in (why_a.get(name), why_b.get(name)):
            if why is not None and why not in reasons:
                reasons.append(why)
    if not reasons:
        return f"they set the same --algo {a.algo} configuration"
    return f"under --algo {a.algo}, " + "; ".join(reasons)


# ------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------
class _Parser(StrictArgumentParser):
    """Flags spelled in full (``allow_abbrev=False``); errors raise :class:`ConfigError`."""

    def error(self, message: str):  # type: ignore[override]
        raise ConfigError(message)


def _default_text(name: str) -> str:
    owners = _owners(name)
    defaults = {a: ALGORITHMS[a].config_class.default_of(name) for a in owners}
    texts = {a: "none" if v is None else repr(v) for a, v in defaults.items()}
    if len(set(texts.values())) == 1:
        return next(iter(texts.values()))
    return ", ".join(f"{v} ({a})" for a, v in texts.items())


def _wrap_paragraphs(text: str, width: int = 88) -> str:
    return "\n\n".join(textwrap.fill(par, width) for par in text.split("\n\n"))


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser generated from the config classes' fields (values as strings),
    one argument group for the shared fields and one per algorithm."""
    p = _Parser(
        prog="python -m marl.train",
        allow_abbrev=False,
        description="Train cooperating agents (MAPPO/GRPO) on a vector env. Every config field "
        "is a flag; YAML --config sets any of them (env kwargs under 'env:'); environment "
        "kwargs on the command line as --env.KEY VALUE (e.g. --env.grid_size 8). Options of "
        "one algorithm are rejected with the other.",
        epilog=_wrap_paragraphs(
            "Run directories: an existing run (a directory holding config.yaml, "
            "metrics.jsonl, checkpoints/, ...) is never overwritten by accident: continue it with "
            "--resume RUN_DIR or start again with --overwrite. On resume only "
            f"{_changeable_flags()} (and --env.adapter_workers) may "
            "change.\n\nSIGINT (Ctrl-C) and SIGTERM stop the run at the end of the current "
            "update and write a checkpoint (a second Ctrl-C stops at once).\n\n"
            "Exit status: 0 finished (eval.json written), or --resume of a finished run without "
            "a larger budget (nothing written); 1 stopped by the non-finite guard; "
            "2 bad input or a file-system error (an 'error:' line says what); "
            f"{EXIT_INTERRUPTED} interrupted by SIGINT/SIGTERM, checkpoint written (continue with "
            "--resume RUN_DIR)."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", default=None, help="YAML config file (keys = field names).")
    p.add_argument(
        "--resume",
        default=None,
        metavar="RUN_DIR",
        help="Continue the run in RUN_DIR from its newest checkpoint that loads, with the "
        "run's own configuration.",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="Start a new run in --run-dir even if it holds a run: that run's files "
        "(config.yaml, metrics.jsonl, checkpoints/, tb/, plots/, eval.json, episode.gif) are "
        "deleted first.",
    )
    p.add_argument(
        "--keep-checkpoints",
        default=None,
        metavar="K",
        help="Keep the K newest checkpoints (checkpoints/ckpt_<update>.pt) [default: "
        "3, or the resumed run's value]",
    )
    shared = set(BaseConfig.field_names())
    groups = {"shared": p.add_argument_group("options of every algorithm")}
    for algo in ALGORITHMS:
        groups[algo] = p.add_argument_group(f"options of --algo {algo} only")
    for name, f in _all_fields().items():
        if name == "env":
            continue
        flags = ["--" + name.replace("_", "-")]
        if "_" in name:
            flags.append("--" + name)
        # --algo: a registered name or package.module:Class (checked by config_class)
        choices = None if name == "algo" else f.metadata.get("choices")
        help_text = f.metadata["help"] + f" [default: {_default_text(name)}]"
        if choices:
            help_text += f" {{{', '.join(choices)}}}"
        group = groups["shared"] if name in shared else groups[_owners(name)[0]]
        group.add_argument(*flags, dest=name, default=None, metavar=name.upper(), help=help_text)
    return p


def _train_flags(parser: argparse.ArgumentParser) -> list[str]:
    """Every flag of ``python -m marl.train``: the config parser's and the ``--wandb*`` ones
    (which :func:`parse_train_args` takes off the command line before the others)."""
    wandb = argparse.ArgumentParser(add_help=False)
    add_wandb_arguments(wandb)
    return option_strings(parser) + option_strings(wandb)


def _parse_env_overrides(extra: list[str], flags: list[str]) -> dict[str, Any]:
    """``--env.KEY VALUE`` / ``--env.KEY=VALUE`` pairs (values parsed as YAML) from the
    arguments the parser did not take; anything else is an error, naming the closest of
    ``flags`` to a misspelt one."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(extra):
        tok = extra[i]
        if not tok.startswith("--env."):
            match = closest_flag(tok, flags)
            hint = f"; did you mean {match}?" if match else ""
            raise ConfigError(
                f"unrecognized option {tok!r}{hint} (see --help for the fields; env kwargs: "
                "--env.KEY VALUE)"
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


def _import_named_algorithm(argv: Sequence[str]) -> None:
    """Register an ``--algo package.module:Class`` named on the command line before the parser
    is built, so that its own options are flags."""
    for i, token in enumerate(argv):
        value = None
        if token.startswith("--algo="):
            value = token.split("=", 1)[1]
        elif token == "--algo" and i + 1 < len(argv):
            value = argv[i + 1]
        if value and ":" in value:
            resolve_algorithm(value)


def parse_train_args(argv: Sequence[str] | None = None) -> tuple[BaseConfig, RunOptions]:
    """The command line of ``python -m marl.train`` (``sys.argv[1:]`` when None): the validated
    config of the chosen algorithm (:func:`parse_cli`) and the options of the invocation,
    ``--resume``, ``--overwrite``, ``--keep-checkpoints`` and the ``--wandb*`` flags
    (:class:`marl.run.options.RunOptions`). Raises :class:`ConfigError` as :func:`parse_cli`
    does, and for a ``--wandb-*`` flag without ``--wandb``."""
    wandb, rest = split_wandb_flags(list(sys.argv[1:] if argv is None else argv))
    cfg, options = _parse_config_args(rest)
    return cfg, dataclasses.replace(options, wandb=wandb)


def parse_cli(argv: list[str] | None = None) -> BaseConfig:
    """Parse command-line arguments into a validated config of the chosen algorithm.

    Raises ConfigError naming an unknown option, an option of another algorithm, or an
    invalid value (and the allowed values). ``--resume RUN_DIR`` loads RUN_DIR/config.yaml as
    the base (CLI flags still override) and sets ``run_dir`` to RUN_DIR. The options of the
    invocation (``--resume``, ``--overwrite``, ``--keep-checkpoints``, the explicitly set
    fields) are what :func:`parse_train_args` returns beside the config.
    """
    cfg, _options = _parse_config_args(list(sys.argv[1:] if argv is None else argv))
    return cfg


def split_wandb_flags(argv: Sequence[str]) -> tuple[WandbOptions | None, list[str]]:
    """(the ``--wandb*`` options, the other arguments for :func:`parse_cli`)."""
    parser = _Parser(add_help=False)
    add_wandb_arguments(parser)
    ns, rest = parser.parse_known_args(list(argv))
    try:
        return wandb_options_from_args(ns), rest
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _parse_keep_checkpoints(raw: str | None) -> int | None:
    """``--keep-checkpoints K``: an integer >= 1 (None when not given)."""
    if raw is None:
        return None
    try:
        keep = int(raw)
    except ValueError:
        keep = 0
    if keep < 1:
        raise ConfigError(f"--keep-checkpoints: invalid value {raw!r}; allowed: an integer >= 1")
    return keep


def _resumed_config(ns: argparse.Namespace) -> dict[str, Any]:
    """The configuration of the run ``--resume RUN_DIR`` continues ({} for a new run), with
    ``run_dir`` set to RUN_DIR."""
    if ns.resume is None:
        return {}
    if ns.overwrite:
        raise ConfigError(
            "--resume and --overwrite exclude each other: --resume continues the run, "
            "--overwrite deletes it and starts again"
        )
    if not os.path.isdir(ns.resume):
        raise ConfigError(f"--resume {ns.resume!r}: no such directory")
    path = os.path.join(ns.resume, "config.yaml")
    if not os.path.isfile(path):
        raise ConfigError(f"--resume {ns.resume!r}: not a run directory (no config.yaml in it)")
    return {**load_run_config(ns.resume), "run_dir": ns.resume}


def _parse_config_args(argv: list[str]) -> tuple[BaseConfig, RunOptions]:
    """:func:`parse_train_args` without the ``--wandb*`` flags."""
    _import_named_algorithm(argv)
    parser = build_parser()
    ns, extra = parser.parse_known_args(argv)
    explicit: dict[str, Any] = {}
    keep = _parse_keep_checkpoints(ns.keep_checkpoints)
    base = _resumed_config(ns)
    if ns.config is not None:
        explicit.update(load_config(ns.config))
    on_command_line = set()
    for name in _all_fields():
        if name == "env":
            continue
        raw = getattr(ns, name)
        if raw is not None:
            explicit[name] = _coerce(name, raw)
            on_command_line.add(name)
    env_over = _parse_env_overrides(extra, _train_flags(parser))
    env_given = bool(env_over) or "env" in explicit
    if ns.resume is not None:
        _check_resume_changes(ns.resume, base, explicit, env_over)
        # the run's own values (equal to any given ones, checked above) and the changeable
        # fields given now; env kwargs merged, never replaced by a --config file's env
        env_over = {**base.get("env", {}), **explicit.pop("env", {}), **env_over}
        explicit.pop("run_dir", None)
    algo = explicit.get("algo", base.get("algo", "mappo"))
    own = set(BaseConfig.for_algo(algo).field_names())
    for name in explicit:
        if name not in own:
            raise _not_applicable(name, algo)
    values: dict[str, Any] = dict(base)
    if not base:
        recipe = explicit.get("recipe", BaseConfig.default_of("recipe"))
        if recipe not in RECIPES:
            raise ConfigError(f"--recipe: invalid value {recipe!r}; allowed: {', '.join(RECIPES)}")
        # a recipe is a preset for every algorithm: each takes the parts that apply to it
        values.update({k: v for k, v in RECIPES[recipe].items() if k in own})
    values.update(explicit)
    env = dict(values.get("env", {}))
    env.update(env_over)
    values["env"] = env
    cfg = BaseConfig.for_algo(algo)(**values)
    validate_config(cfg, on_command_line)
    options = RunOptions(
        resume=ns.resume,
        overwrite=bool(ns.overwrite),
        keep_checkpoints=keep,
        explicit=frozenset(explicit) | ({"env"} if env_given else frozenset()),
    )
    return cfg, options


_UNSET = object()


def _check_resume_changes(
    run_dir: str, base: dict[str, Any], explicit: dict[str, Any], env_over: dict[str, Any]
) -> None:
    """Refuse, naming every field, the settings (flags or ``--config``) that differ from the
    resumed run's own and are not in :data:`RESUME_CHANGEABLE`."""
    run_algo = base.get("algo", "mappo")
    run_class = BaseConfig.for_algo(run_algo)
    own = set(run_class.field_names())

    def run_value(name: str) -> Any:
        if name in base:
            return base[name]
        return run_class.default_of(name) if name in own else _UNSET

    changes: list[str] = []
    for name, value in explicit.items():
        if name == "env" or _changeable_on_resume(name):
            continue
        if name == "run_dir":
            if os.path.abspath(str(value)) != os.path.abspath(run_dir):
                changes.append(f"--run-dir {value!r} (the run is {run_dir!r})")
            continue
        old = run_value(name)
        if old is _UNSET:
            changes.append(f"--{name.replace('_', '-')} (not an option of --algo {run_algo})")
        elif value != old:
            changes.append(f"--{name.replace('_', '-')} {old!r} -> {value!r}")
    run_env = base.get("env", {})
    given_env = {**explicit.get("env", {}), **env_over}
    for key, value in given_env.items():
        if key in RESUME_CHANGEABLE_ENV:
            continue
        old = run_env.get(key, _UNSET)
        if old is _UNSET:
            changes.append(f"--env.{key} (unset in the run) -> {value!r}")
        elif value != old:
            changes.append(f"--env.{key} {old!r} -> {value!r}")
    if changes:
        allowed = (
            _changeable_flags()
            + ", "
            + ", ".join(f"--env.{k}" for k in sorted(RESUME_CHANGEABLE_ENV))
        )
        raise ConfigError(
            f"--resume {run_dir!r}: these settings differ from the run's own configuration "
            f"and cannot change on resume: {'; '.join(changes)}. Only {allowed} may change "
            "when resuming; drop the others (or start a new run with another --run-dir)"
        )
