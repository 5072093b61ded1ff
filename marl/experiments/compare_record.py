"""``OUT/compare.json``: what a study records, and ``--report-only`` reading it back.

:func:`check_and_store_spec` writes the study (its
:class:`~marl.experiments.spec.CompareSpec`) and how it is reported (:class:`ReportSettings`),
and refuses a rerun that would mix a different setup into OUT. :func:`report_only_spec`
rebuilds the study from the record (:func:`recorded_options`; OUT/summary.json for a record
that predates the report settings), each option the command line gives
(:func:`explicit_options`) in place of its recorded value.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from marl.experiments.spec import CompareError, CompareSpec, Variant, build_spec
from marl.run.rundir import atomic_write_json

__all__ = [
    "ReportSettings",
    "check_and_store_spec",
    "explicit_options",
    "recorded_options",
    "report_only_spec",
]


def _file_sha256(path: str | None) -> str | None:
    if path is None:
        return None
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        h.update(fh.read())
    return h.hexdigest()


@dataclass
class ReportSettings:
    """How compare reports a study (the options of the same names), recorded in
    OUT/compare.json (``"report"``) so that ``--report-only --out OUT`` regenerates the same
    report without these options."""

    bootstrap_reps: int
    bootstrap_seed: int
    confidence: float
    entropy_threshold: float
    title: str | None
    at_env_steps: list[int]
    """The ``--at-env-steps`` reports to write; compare.json records every one written into
    OUT so far."""
    allow_mixed_code: bool

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ReportSettings:
        return cls(
            bootstrap_reps=args.bootstrap_reps,
            bootstrap_seed=args.bootstrap_seed,
            confidence=args.confidence,
            entropy_threshold=args.entropy_threshold,
            title=args.title,
            at_env_steps=list(args.at_env_steps or []),
            allow_mixed_code=args.allow_mixed_code,
        )


def _spec_record(spec: CompareSpec, report: ReportSettings | None = None) -> dict[str, Any]:
    config_found = spec.config is None or os.path.isfile(spec.config)
    record = {
        "algo": spec.algo,
        "config": spec.config,
        "config_sha256": _file_sha256(spec.config) if config_found else None,
        "total_steps": spec.total_steps,
        "max_time": spec.max_time,
        "max_cpu_time": spec.max_cpu_time,
        "common": spec.common,
        "variants": {v.name: v.args for v in spec.variants},
        "seeds": spec.seeds,
        "reference": spec.reference,
        "study": spec.study,
        "train_command": spec.train_command,
        "final_eval_episodes": spec.final_eval_episodes,
        "primary_metric": spec.primary_metric,
        "comparisons": [list(pair) for pair in spec.comparisons],
        "jobs": spec.jobs,
    }
    if report is not None:
        record["report"] = asdict(report)
    return record


def check_and_store_spec(
    spec: CompareSpec, *, report_only: bool = False, report: ReportSettings | None = None
) -> None:
    """Write OUT/compare.json (the study, and with ``report`` how it is reported); refuse to mix
    results of a different setup into OUT.

    A rerun may add variants or seeds and change the reference, but a variant name whose options
    changed, or a changed algorithm, config file (content), budget or common options, would mix
    incomparable runs: that raises CompareError. The recorded ``--at-env-steps`` reports
    accumulate: OUT keeps every one written.
    """
    os.makedirs(spec.out, exist_ok=True)
    path = os.path.join(spec.out, "compare.json")
    record = _spec_record(spec, report)
    old: dict[str, Any] = {}
    if os.path.isfile(path):
        with open(path) as fh:
            old = json.load(fh)
        keys = ["algo", "config_sha256", "total_steps", "max_time", "max_cpu_time", "common"]
        if report_only:  # nothing runs: keep the setting the runs were trained with
            record["final_eval_episodes"] = old.get("final_eval_episodes")
            if spec.config is not None and record["config_sha256"] is None:
                record["config_sha256"] = old.get("config_sha256")  # the file is gone
        else:
            keys.append("final_eval_episodes")
        for key in keys:
            if old.get(key) != record[key]:
                raise CompareError(
                    f"{path}: this output directory holds runs with {key}={old.get(key)!r}, "
                    f"now {record[key]!r}; use a new --out (or delete the old runs)"
                )
        for name, args in record["variants"].items():
            if name in old.get("variants", {}) and old["variants"][name] != args:
                raise CompareError(
                    f"{path}: variant {name!r} was run with {old['variants'][name]} and is now "
                    f"{args}; rename the variant or use a new --out"
                )
        merged_variants = dict(old.get("variants", {}))
        merged_variants.update(record["variants"])
        record["all_variants_run"] = merged_variants
    if report is not None:
        written = (old.get("report") or {}).get("at_env_steps") or []
        record["report"]["at_env_steps"] = sorted({*written, *report.at_env_steps})
    atomic_write_json(path, record)


# ------------------------------------------------------------------------------------------
# --report-only: the study OUT records
# ------------------------------------------------------------------------------------------
#: Options that pick the variants: given with --report-only, they replace the recorded
#: variants, and the reference and comparisons come from them (and the study) as in a run.
_VARIANT_OPTIONS = {"study", "variant", "variants"}
_BUDGET_OPTIONS = {"total_steps", "max_time", "max_cpu_time"}


class _Unset(list):
    """An option's value before parsing (:func:`explicit_options`). A list: an ``append``
    option copies its current value and appends to the copy, so a given option never keeps
    this object."""


def explicit_options(parser: argparse.ArgumentParser, argv: Sequence[str]) -> set[str]:
    """The options (argparse dests) that ``argv`` gives, whatever their values: argparse fills
    in a default only where the namespace it is given lacks the attribute."""
    unset = _Unset()
    dests = vars(parser.parse_args(argv))
    given = parser.parse_args(argv, argparse.Namespace(**dict.fromkeys(dests, unset)))
    return {dest for dest, value in vars(given).items() if value is not unset}


def recorded_options(out: str) -> tuple[dict[str, Any], list[Variant]] | None:
    """The study OUT/compare.json records, as compare's options (argparse dests with the
    values of a CompareSpec / ReportSettings field: seeds and common options as lists,
    comparisons as pairs) and its variants; None when OUT holds no compare.json.

    A compare.json written before compare recorded the report (no ``"report"``) leaves the
    report's settings, reference, seeds and variants to OUT/summary.json, the report it made
    (:func:`_published_options`)."""
    path = os.path.join(out, "compare.json")
    if not os.path.isfile(path):
        return None
    with open(path) as fh:
        record = json.load(fh)
    setup = ("algo", "config", "total_steps", "max_time", "max_cpu_time", "common", "study")
    design = ("seeds", "reference", "primary_metric", "final_eval_episodes", "train_command")
    options: dict[str, Any] = {key: record.get(key) for key in (*setup, *design, "jobs")}
    options["first_seed"] = min(record["seeds"], default=0)
    options["comparison"] = [tuple(pair) for pair in record.get("comparisons") or []]
    variants = [Variant(name, list(args)) for name, args in record["variants"].items()]
    if "report" in record:
        options.update(record["report"])
    else:
        published = _published_options(out, record.get("study"), "comparisons" in record)
        variants = published.pop("variants", variants)
        options.update(published)
    return options, variants


def _published_options(out: str, study: str | None, has_comparisons: bool) -> dict[str, Any]:
    """What OUT/summary.json says its report was made with (for a compare.json that predates
    the recorded report): reference, seeds, variants, jobs, bootstrap, entropy threshold, title
    (None when it is the default one), ``--allow-mixed-code``, the pre-registered comparisons
    (unless compare.json has them) and the ``--at-env-steps`` reports (those its command asked
    for, and the ``at_<N>_env_steps`` directories OUT holds). Empty without a summary.json."""
    path = os.path.join(out, "summary.json")
    if not os.path.isfile(path):
        return {}
    with open(path) as fh:
        s = json.load(fh)
    default_title = f"Study '{study}'" if study else "Comparison of variants"
    options = {
        "reference": s["reference"],
        "seeds": list(s["seeds"]),
        "first_seed": min(s["seeds"], default=0),
        "jobs": s.get("jobs"),
        "variants": [Variant(name, list(v.get("args") or [])) for name, v in s["variants"].items()],
        "title": None if s.get("title") in (None, default_title) else s["title"],
        "allow_mixed_code": any(
            w.startswith("mixed code (--allow-mixed-code)") for w in s.get("warnings") or []
        ),
        "at_env_steps": _published_at_env_steps(out, (s.get("commands") or {}).get("compare")),
    }
    bootstrap = s.get("bootstrap") or {}
    for dest, key in (("bootstrap_reps", "reps"), ("bootstrap_seed", "seed")):
        if key in bootstrap:
            options[dest] = bootstrap[key]
    if "confidence" in bootstrap:
        options["confidence"] = bootstrap["confidence"]
    if "entropy_threshold" in s:
        options["entropy_threshold"] = s["entropy_threshold"]
    if not has_comparisons:
        options["comparison"] = [
            (e["variant"], e["baseline"])
            for e in s.get("comparisons") or []
            if e["baseline"] != s["reference"]
        ]
    return options


def _published_at_env_steps(out: str, command: str | None) -> list[int]:
    """The ``--at-env-steps`` values of a recorded compare ``command`` and of the
    ``at_<N>_env_steps`` directories in OUT, sorted."""
    found: set[int] = set()
    try:
        tokens = shlex.split(command or "")
    except ValueError:
        tokens = []
    for i, token in enumerate(tokens):
        value = token.partition("=")[2] if token.startswith("--at-env-steps=") else None
        if token == "--at-env-steps" and i + 1 < len(tokens):
            value = tokens[i + 1]
        if value is not None and value.isdigit():
            found.add(int(value))
    for name in os.listdir(out):
        match = re.fullmatch(r"at_(\d+)_env_steps", name)
        if match and os.path.isdir(os.path.join(out, name)):
            found.add(int(match.group(1)))
    return sorted(found)


def report_only_spec(
    parser: argparse.ArgumentParser, args: argparse.Namespace, raw_argv: Sequence[str]
) -> tuple[CompareSpec, ReportSettings, bool]:
    """``--report-only``: the study OUT/compare.json records (:func:`recorded_options`), each
    option the command line gives (:func:`explicit_options`) in place of its recorded value;
    returns the spec, the report settings and whether the variants are the recorded ones.

    Given variant options (--study, --variant, --variants) replace the recorded variants, with
    the reference and comparisons they imply. Options that say how the runs trained (algorithm,
    config, budget, common options, final evaluation episodes) must agree with the record
    (CompareError here or in :func:`check_and_store_spec`). Without compare.json: the command
    line alone, as before compare recorded studies."""
    recorded = recorded_options(args.out)
    if recorded is None:
        return build_spec(args), ReportSettings.from_args(args), False
    options, variants = recorded
    given = explicit_options(parser, raw_argv)
    own_variants = not given & _VARIANT_OPTIONS
    recorded_episodes = options.get("final_eval_episodes")
    if "final_eval_episodes" in given and (args.final_eval_episodes or None) != recorded_episodes:
        raise CompareError(
            f"--final-eval-episodes {args.final_eval_episodes}: the runs in {args.out} were "
            f"evaluated with final_eval_episodes={recorded_episodes!r} (compare.json); drop "
            "the option or use a new --out"
        )
    skip = set(given) | {"study", "variant", "variants"}
    if given & _BUDGET_OPTIONS:
        skip |= _BUDGET_OPTIONS
    if not own_variants:
        skip |= {"reference", "comparison"}
    filled = argparse.Namespace(**vars(args))
    for dest, value in options.items():
        if dest not in skip:
            setattr(filled, dest, _as_argument(dest, value))
    if own_variants:  # names only: build_spec checks them; the options are set below
        filled.variant, filled.variants, filled.study = [f"{v.name}:" for v in variants], None, None
    spec = build_spec(filled)
    if own_variants:
        spec.variants, spec.study = variants, options.get("study")
    if "common" not in given:
        spec.common = list(options.get("common") or [])
    if "config" not in given:
        spec.config = options.get("config")
    if not given & {"seeds", "first_seed"} and options.get("seeds"):
        spec.seeds = list(options["seeds"])
    return spec, ReportSettings.from_args(filled), own_variants


def _as_argument(dest: str, value: Any) -> Any:
    """A recorded value as :func:`build_spec` takes it from the command line (seeds: their
    count; common options joined with commas and the config file only where build_spec reads
    them, for a --study's backbone; report_only_spec sets the recorded lists after)."""
    if dest == "seeds":
        return len(value)
    if dest == "common":
        return ",".join(value or [])
    if dest == "config":
        return value if value is not None and os.path.isfile(value) else None
    if dest == "comparison":
        return [f"{a}:{b}" for a, b in value]
    if dest == "train_command":
        return shlex.join(value) if value else None
    if dest == "final_eval_episodes":
        return value or 0
    return value
