"""Keep a study's finished runs in the repository, compactly (issue 51).

    python -m marl.experiments.persist SRC DEST [--policies[=VARIANTS]] [--at-env-steps N ...]
    python -m marl.experiments.persist --in-place DIR [--policies[=VARIANTS]]
    python -m marl.experiments.persist --restore DIR OUT

A study outlives the machine it ran on only in git, and git keeps every byte forever. A run's
``metrics.jsonl`` logs ~100 figures per update at full float precision, of which the report
(:mod:`marl.experiments.report`, with the per-run readers of :mod:`marl.experiments.stats`)
reads a few. The compact form of a run is its ``config.yaml``, ``eval.json``,
``finished.json`` and ``metrics.jsonl.xz``: every row of the log, in order (lzma-compressed
JSON lines), with only the keys of :data:`KEYS`, each at the precision the table gives it. A
report regenerated from compact runs equals the one from the full runs: every per-seed value,
p-value and verdict identical, every other figure within 1e-6 relative, and the curves that
are only plotted (``curves`` and ``advantages`` of summary.json) within about a pixel: a run's
value moves by at most 1% of the run's largest magnitude of its key, and a plotted mean over
runs by 0.7% of its panel's y range in a study of 3 seeds, 0.2% in one of 16. Optionally also
the run's final policy (``policy/policy.json``, ``policy/weights.pt``), for the variants whose
policies a later analysis evaluates (``benchmarks/diversity_websearch.py`` evaluates
``calibrated`` and ``baseline``).

* ``SRC DEST``: SRC is a ``marl.compare --out`` directory; DEST (e.g.
  ``docs/results/memory_study/memory``) gets SRC's ``compare.json`` and every finished run
  (``finished.json`` not saying "stopped": the runs marl.compare skips) in the compact form,
  replacing what DEST held for them. Unfinished runs are left out: they restart.
  ``benchmarks/persist_runs.sh`` calls this.
* ``--in-place DIR``: compacts a study persisted before: each run's ``metrics.jsonl.gz`` (or
  ``metrics.jsonl``) becomes ``metrics.jsonl.xz`` and is deleted, and the policies not asked
  for are deleted.
* ``--restore DIR OUT``: the way back, for ``benchmarks/study.sh`` on a new checkout: DIR's
  ``compare.json`` and runs into OUT, each compact log also written out as a plain
  ``metrics.jsonl`` (of the kept keys), which the study's pinned code reads. marl.compare
  lists the runs as finished (``finished.json``) and skips them: a finished run is never
  resumed, so nothing appends to a compact log, and persisting OUT again copies each
  compact log as it is.

``--policies`` alone keeps every variant's policy, ``--policies=a,b`` those of variants a and
b; without it no policy is kept. Where the study also reports at equal env steps
(``marl.compare --at-env-steps N``: an ``at_<N>_env_steps`` directory in SRC, DEST or DIR, or
``--at-env-steps N``), the stability figures at N stay exact too.
"""

from __future__ import annotations

import argparse
import functools
import json
import lzma
import math
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from marl.experiments import stats
from marl.experiments.compare import run_finished
from marl.run.rundir import atomic_write_bytes, atomic_write_text

__all__ = [
    "EXACT",
    "SIGNIFICANT",
    "SUMS",
    "PLOT",
    "KeyRule",
    "KEYS",
    "COMPACT_LOG",
    "PersistError",
    "PersistCount",
    "rule_for",
    "grid",
    "compact_rows",
    "compact_lines",
    "write_compact_log",
    "persist_study",
    "compact_in_place",
    "compact_reports",
    "restore_study",
    "PLOT_TOLERANCE",
    "plot_panel_range",
    "main",
]

EXACT = "exact"
SIGNIFICANT = "significant"
SUMS = "sums"
PLOT = "plot"


#: How far a plotted point of a report regenerated from compact runs may move from the full
#: runs' report, as a fraction of its plot panel's y range (:func:`plot_panel_range`).
PLOT_TOLERANCE = 1e-2


def _finite_numbers(tree: Any) -> list[float]:
    """Every finite number in ``tree`` but its x values (``env_steps``) and run counts (``n``)."""
    if isinstance(tree, Mapping):
        return [
            x for k, v in tree.items() if k not in ("env_steps", "n") for x in _finite_numbers(v)
        ]
    if isinstance(tree, list):
        return [x for v in tree for x in _finite_numbers(v)]
    number = isinstance(tree, int | float) and not isinstance(tree, bool)
    return [float(tree)] if number and math.isfinite(tree) else []


def plot_panel_range(path: Sequence[Any], summary: Mapping[str, Any]) -> float | None:
    """The y range of the report's plot panel that shows the summary.json value at ``path``
    (keys and list indices from the root), or None where ``path`` is not a plotted y value.

    A learning curve (``variants/V/curves/KEY/...``): its mean and CI band. An advantages
    panel (``variants/V/advantages/GROUP/PREFIX/STAT/...``): mean, mean +- std, pos_mean and
    neg_mean on one axis; ``pos_frac`` on a twin axis from 0 to 1. x values (``env_steps``)
    are not plotted y values. A flat panel counts as a range of 1.
    """
    path = [str(p) for p in path]
    if "env_steps" in path or len(path) < 4 or path[0] != "variants":
        return None
    if path[2] == "curves":
        values = _finite_numbers(summary["variants"][path[1]]["curves"][path[3]])
    elif path[2] == "advantages" and len(path) >= 6:
        if path[5] == "pos_frac":
            return 1.0
        panel = summary["variants"][path[1]]["advantages"][path[3]][path[4]]
        values = _finite_numbers([panel[k] for k in ("mean", "pos_mean", "neg_mean") if panel[k]])
        if panel["mean"] and panel["std"]:
            for m, sd in zip(panel["mean"]["mean"], panel["std"]["mean"], strict=False):
                if m is not None and sd is not None:
                    values += [m + sd, m - sd]
    else:
        return None
    return (max(values) - min(values)) if values and max(values) > min(values) else 1.0


@dataclass(frozen=True)
class KeyRule:
    """Metrics keys (a regular expression matching the whole key), how precisely the compact
    log keeps their values, and what reads them.

    * ``exact``: as logged;
    * ``significant``: each value to ``digits`` significant digits (relative error at most
      ``0.5 * 10**(1 - digits)``; zero stays zero, a sign stays);
    * ``plot``: on a grid (:func:`grid`) whose step is at most ``step`` times the run's
      largest magnitude of the key: each value moves by at most half a step;
    * ``sums``: on such a grid, each value's rounding error carried into the next value and
      cleared (that value kept exact) at every end of a range that the stability figures
      average (:func:`marl.experiments.stats.phase_ranges` of the whole run and of its rows up
      to each ``--at-env-steps`` count): those means are the full log's to floating-point
      rounding, while a single value moves by less than one step.
    """

    pattern: str
    precision: str
    digits: int | None = None
    step: float | None = None
    readers: str = ""


_STAT = "(mean|std|pos_frac|pos_mean|neg_mean)"  # report.ADV_STATS

#: Every key the report reads, with its precision; the compact log drops every other key.
#: Exact: counters, and what a per-seed endpoint or a p-value is computed from. Significant
#: digits: single values that the stability figures report. Sums: series that the stability
#: figures average (exact means) and the advantages plot shows. Plot: series only plotted
#: (a step of 1% of the largest magnitude moves a point by at most 0.5% of it, about a pixel
#: of the advantages plot; the learning curves get 0.2%). 2% was too coarse: a panel's y range
#: can be smaller than a run's largest magnitude, and two points of memory_study/family_3
#: moved by 1.1% of their panel.
KEYS: tuple[KeyRule, ...] = (
    KeyRule("update", EXACT, readers="the update of an entropy collapse (stats.entropy_collapse)"),
    KeyRule(
        "env_steps",
        EXACT,
        readers="x of every curve and area, the rows up to --at-env-steps, a run's env steps",
    ),
    KeyRule(
        "episode/success",
        EXACT,
        readers="auc_success (a per-seed endpoint, report.METRICS) and its learning curve",
    ),
    KeyRule(
        "eval/.+",
        EXACT,
        readers="success_rate_last5 and solved_rate_last5 (per-seed endpoints), every endpoint "
        "at --at-env-steps (stats.run_at_env_steps), the validation curves",
    ),
    KeyRule(
        "entropy",
        SIGNIFICANT,
        digits=7,
        readers="entropy collapse: first update below the threshold, initial, final and least "
        "entropy (stats.entropy_collapse); its learning curve",
    ),
    KeyRule(
        "adv_clip_frac",
        SIGNIFICANT,
        digits=7,
        readers="the fraction of updates with adv_clip_frac > 0 and its mean "
        "(stats.stability_figures)",
    ),
    KeyRule(
        f"adv_raw/{_STAT}",
        SUMS,
        step=0.01,
        readers="advantage statistics before whitening: means over training, its first and "
        "last quarter (stats.stability_figures); the advantages plot",
    ),
    KeyRule(f"adv/{_STAT}", SUMS, step=0.01, readers="as adv_raw/..., after whitening"),
    KeyRule(
        f"adv_raw/[^/]+/{_STAT}",
        PLOT,
        step=0.01,
        readers="advantage statistics of one agent type before whitening: the advantages plot "
        "(report.plots._plot_advantages) and the list of agent types",
    ),
    KeyRule(
        f"adv/[^/]+/{_STAT}", PLOT, step=0.01, readers="as adv_raw/<type>/..., after whitening"
    ),
    KeyRule("episode/return", PLOT, step=0.002, readers="the learning curve of training returns"),
)

_PATTERNS = tuple((re.compile(rule.pattern), rule) for rule in KEYS)

#: The compact log's name in a persisted run directory.
COMPACT_LOG = "metrics.jsonl.xz"
#: The small files a persisted run keeps besides its log and its policy.
RUN_FILES = ("config.yaml", "eval.json", "finished.json")
POLICY_FILES = ("policy.json", "weights.pt")
_AT_DIR = re.compile(r"^at_([1-9][0-9]*)_env_steps$")
#: lzma: the extreme preset (9% smaller than the plain one; a log's 8 MB dictionary is ample),
#: literals coded with 4 bits of context and no position bits (text): 1% smaller again.
_XZ_FILTERS = [{"id": lzma.FILTER_LZMA2, "preset": 6 | lzma.PRESET_EXTREME, "lc": 4, "pb": 0}]


class PersistError(ValueError):
    """A directory that cannot be persisted, compacted or restored as asked."""


@functools.lru_cache(maxsize=4096)
def rule_for(key: str) -> KeyRule | None:
    """The :data:`KEYS` rule of a metrics key; None for a key the compact log drops."""
    for pattern, rule in _PATTERNS:
        if pattern.fullmatch(key):
            return rule
    return None


# ------------------------------------------------------------------------------------------
# rounding
# ------------------------------------------------------------------------------------------
def _finite(value: Any) -> bool:
    """A finite number, not a bool: a value the report's readers use (stats._number)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def grid(largest: float, fraction: float) -> tuple[float, int] | None:
    """``(step, decimals)``: the largest step of 1, 2 or 5 times a power of ten that is at most
    ``fraction * largest``, and the decimals that write its multiples exactly (at least one,
    so a value stays a float). None when ``largest`` is 0."""
    if largest <= 0.0:
        return None
    target = fraction * largest * (1 + 1e-12)  # (a step equal to the target is allowed)
    exponent = math.floor(math.log10(target))
    if 10.0 ** (exponent + 1) <= target:  # log10 rounded down across a power of ten
        exponent += 1
    mantissa = next((m for m in (5, 2, 1) if m * 10.0**exponent <= target), 1)
    return mantissa * 10.0**exponent, max(1, -exponent)


def _on_grid(value: float, step: float, decimals: int) -> float:
    return float(f"{round(value / step) * step:.{decimals}f}")


def _cut_points(
    env_steps: Sequence[Any], present: Sequence[bool], at_env_steps: Sequence[int]
) -> set[int] | None:
    """Positions in the series of one key (its finite values, in log order) where a range that
    the stability figures average starts or ends: :func:`stats.phase_ranges` of the whole
    series and of its rows up to each count of ``at_env_steps``. None when those rows are not
    a prefix of the log (env steps missing or out of order): no grid then keeps their sums."""
    points = {p for rng in stats.phase_ranges(max(1, sum(present))).values() for p in rng}
    for count in at_env_steps:
        kept = [_finite(x) and x <= count for x in env_steps]
        n_rows = sum(kept)
        if not all(kept[:n_rows]):
            return None
        n = sum(present[:n_rows])
        if n:
            points |= {p for rng in stats.phase_ranges(n).values() for p in rng}
    return points


def _round_series(
    values: list[float], rule: KeyRule, cut_points: set[int] | None
) -> tuple[list[float], int | None]:
    """One key's finite values (in log order) at the rule's precision, and the decimals of
    its grid (None: no grid)."""
    if rule.precision == SIGNIFICANT:
        assert rule.digits is not None
        return [float(f"{v:.{rule.digits}g}") for v in values], None
    assert rule.step is not None
    cells = grid(max((abs(v) for v in values), default=0.0), rule.step)
    if cells is None or (rule.precision == SUMS and cut_points is None):
        return list(values), None  # all zero, or sums that no grid keeps: exact
    step, decimals = cells
    if rule.precision == PLOT:
        return [_on_grid(v, step, decimals) for v in values], decimals
    assert cut_points is not None
    out: list[float] = []
    carry = 0.0
    for i, value in enumerate(values):
        target = value + carry
        if i + 1 in cut_points:  # the last value of a range: absorb the carried error
            out.append(target)
            carry = 0.0
        else:
            out.append(_on_grid(target, step, decimals))
            carry = target - out[-1]
    return out, decimals


def _column(key: str) -> tuple[bool, str, str]:
    """Where ``key`` goes in a compact row: the exact keys first, then by the statistic (the
    last part of the key), so that like columns (every ``pos_frac``, every ``std``) sit side
    by side: lzma then finds more repeats (the logs come out 8% smaller)."""
    rule = rule_for(key)
    return (rule is None or rule.precision != EXACT, key.rpartition("/")[2], key)


def _compact(
    rows: Sequence[Mapping[str, Any]], at_env_steps: Sequence[int]
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    out = [{k: row[k] for k in sorted(row, key=_column) if rule_for(k) is not None} for row in rows]
    env_steps = [row.get("env_steps") for row in rows]
    decimals: dict[str, int] = {}
    for key in dict.fromkeys(k for row in out for k in row):
        rule = rule_for(key)
        if rule is None or rule.precision == EXACT:
            continue
        present = [_finite(row.get(key)) for row in out]
        positions = [i for i, p in enumerate(present) if p]
        cuts = _cut_points(env_steps, present, at_env_steps) if rule.precision == SUMS else None
        rounded, key_decimals = _round_series([out[i][key] for i in positions], rule, cuts)
        for i, value in zip(positions, rounded, strict=True):
            if not (isinstance(out[i][key], int) and value == out[i][key]):
                out[i][key] = value  # (an integer on the grid stays an integer)
        if key_decimals is not None:
            decimals[key] = key_decimals
    return out, decimals


def compact_rows(
    rows: Sequence[Mapping[str, Any]], at_env_steps: Sequence[int] = ()
) -> list[dict[str, Any]]:
    """A run's metrics rows (in log order) with only the :data:`KEYS` keys, each at its
    precision. Every row stays, in order (the stability figures count updates); non-numeric
    and non-finite values stay as they are. ``at_env_steps``: env-step counts whose stability
    figures stay exact too."""
    return _compact(rows, at_env_steps)[0]


def compact_lines(rows: Sequence[Mapping[str, Any]], at_env_steps: Sequence[int] = ()) -> list[str]:
    """:func:`compact_rows` as JSON lines (no newline). A value on its key's grid is written
    with the grid's decimals (``0.250``: trailing zeros keep the digits of every row in
    columns, which lzma compresses ~6% better); ``json.loads`` reads the same numbers."""
    compacted, decimals = _compact(rows, at_env_steps)
    lines = []
    for row in compacted:
        parts = []
        for key, value in row.items():
            text = json.dumps(value)
            d = decimals.get(key)
            if d is not None and isinstance(value, float) and math.isfinite(value):
                fixed = f"{value:.{d}f}"
                if float(fixed) == value:
                    text = fixed
            parts.append(f"{json.dumps(key)}:{text}")
        lines.append("{" + ",".join(parts) + "}")
    return lines


def write_compact_log(source: str, dest: str, at_env_steps: Sequence[int] = ()) -> int:
    """Write the compact form of the metrics log ``source`` (plain, .gz or .xz) to ``dest``,
    atomically; returns its size in bytes. Unparsable lines are kept verbatim at the end, so
    a regenerated report warns about them as the original did."""
    rows, bad = stats.read_metrics_file(source)
    text = "".join(f"{line}\n" for line in [*compact_lines(rows, at_env_steps), *bad])
    tmp = f"{dest}.tmp"
    with lzma.open(tmp, "wt", format=lzma.FORMAT_XZ, filters=_XZ_FILTERS) as fh:
        fh.write(text)
    os.replace(tmp, dest)
    return os.path.getsize(dest)


# ------------------------------------------------------------------------------------------
# studies
# ------------------------------------------------------------------------------------------
@dataclass
class PersistCount:
    """What :func:`persist_study` or :func:`compact_in_place` did."""

    runs: int = 0  # runs persisted / compacted
    left_out: int = 0  # unfinished runs (persist) / runs already compact (in place)
    policies: int = 0  # policies kept
    log_bytes: int = 0  # the compact logs' total size


def _run_dirs(study: str) -> list[str]:
    """``study/runs/<variant>/seed_<k>`` directories, sorted."""
    root = os.path.join(study, "runs")
    found = []
    for variant in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        vdir = os.path.join(root, variant)
        for name in sorted(os.listdir(vdir)) if os.path.isdir(vdir) else []:
            if name.startswith("seed_") and os.path.isdir(os.path.join(vdir, name)):
                found.append(os.path.join(vdir, name))
    return found


def _reported_at_env_steps(*studies: str) -> set[int]:
    """The env-step counts of the ``at_<N>_env_steps`` reports in ``studies``."""
    counts = set()
    for study in studies:
        for name in os.listdir(study) if os.path.isdir(study) else []:
            m = _AT_DIR.match(name)
            if m and os.path.isdir(os.path.join(study, name)):
                counts.add(int(m.group(1)))
    return counts


def _require_study(path: str, what: str) -> None:
    if not os.path.isdir(path):
        raise PersistError(f"{what} {path!r} is not a directory")
    if not os.path.isfile(os.path.join(path, "compare.json")):
        raise PersistError(
            f"{what} {path!r} has no compare.json: not a marl.compare --out directory or a "
            "persisted study"
        )


def _check_policy_variants(study: str, policies: Sequence[str] | None) -> None:
    """Refuse variant names that the study does not have (a typo would drop policies)."""
    if not policies:
        return
    with open(os.path.join(study, "compare.json")) as fh:
        spec = json.load(fh)
    known = set(spec.get("all_variants_run") or {}) | set(spec.get("variants") or {})
    unknown = [v for v in policies if v not in known]
    if unknown:
        raise PersistError(
            f"--policies names {', '.join(map(repr, unknown))}: not a variant of {study} "
            f"(its variants: {', '.join(sorted(known)) or 'none'})"
        )


def _keeps_policy(run: str, policies: Sequence[str] | None) -> bool:
    variant = os.path.basename(os.path.dirname(run))
    return policies is not None and (not policies or variant in policies)


def _place_policy(src_run: str, dest_run: str, keep: bool) -> bool:
    """Copy ``src_run``'s policy into ``dest_run`` (keep) or delete ``dest_run/policy``;
    True when ``dest_run`` then holds a policy."""
    dest = os.path.join(dest_run, "policy")
    if not keep:
        if os.path.isdir(dest):
            shutil.rmtree(dest)
        return False
    src = os.path.join(src_run, "policy")
    if not all(os.path.isfile(os.path.join(src, f)) for f in POLICY_FILES):
        return False
    if os.path.realpath(src) != os.path.realpath(dest):
        os.makedirs(dest, exist_ok=True)
        for name in POLICY_FILES:
            shutil.copy2(os.path.join(src, name), os.path.join(dest, name))
    return True


def _delete_logs_but(run: str, keep: str) -> None:
    for name in stats.METRICS_FILES:
        if name != keep and os.path.isfile(os.path.join(run, name)):
            os.remove(os.path.join(run, name))


def persist_study(
    src: str,
    dest: str,
    *,
    policies: Sequence[str] | None = None,
    at_env_steps: Sequence[int] = (),
) -> PersistCount:
    """Copy ``src``'s (a marl.compare --out directory) compare.json and finished runs into
    ``dest`` in the compact form. ``policies``: None keeps no policy (deleting those ``dest``
    held), ``[]`` every variant's, else those of the named variants. A run whose log is
    compact already (restored by :func:`restore_study`) keeps that log as it is."""
    _require_study(src, "SRC")
    if os.path.realpath(src) == os.path.realpath(dest):
        raise PersistError(f"SRC and DEST are one directory ({src}): use --in-place DIR")
    _check_policy_variants(src, policies)
    counts = sorted({*at_env_steps, *_reported_at_env_steps(src, dest)})
    os.makedirs(dest, exist_ok=True)
    shutil.copy2(os.path.join(src, "compare.json"), os.path.join(dest, "compare.json"))
    done = PersistCount()
    for run in _run_dirs(src):
        if not run_finished(run):
            done.left_out += 1
            continue
        target = os.path.join(dest, os.path.relpath(run, src))
        os.makedirs(target, exist_ok=True)
        for name in RUN_FILES:
            if os.path.isfile(os.path.join(run, name)):
                shutil.copy2(os.path.join(run, name), os.path.join(target, name))
        compact = os.path.join(run, COMPACT_LOG)
        log = compact if os.path.isfile(compact) else stats.metrics_file(run)
        if log == compact:
            shutil.copy2(compact, os.path.join(target, COMPACT_LOG))
        elif log is not None:
            write_compact_log(log, os.path.join(target, COMPACT_LOG), counts)
        if log is not None:
            _delete_logs_but(target, COMPACT_LOG)
            done.log_bytes += os.path.getsize(os.path.join(target, COMPACT_LOG))
        done.policies += _place_policy(run, target, _keeps_policy(run, policies))
        done.runs += 1
    return done


def compact_in_place(
    study: str, *, policies: Sequence[str] | None = None, at_env_steps: Sequence[int] = ()
) -> PersistCount:
    """Compact a persisted study: each run's full log (``metrics.jsonl.gz`` or
    ``metrics.jsonl``) becomes ``metrics.jsonl.xz`` and is deleted; the policies not asked for
    are deleted (``policies`` as in :func:`persist_study`). A run that holds a compact log
    already is left as it is (compacting twice could move its grid)."""
    _require_study(study, "DIR")
    _check_policy_variants(study, policies)
    counts = sorted({*at_env_steps, *_reported_at_env_steps(study)})
    done = PersistCount()
    for run in _run_dirs(study):
        compact = os.path.join(run, COMPACT_LOG)
        log = stats.metrics_file(run)
        if os.path.isfile(compact):
            done.left_out += 1
        elif log is not None:
            write_compact_log(log, compact, counts)
            _delete_logs_but(run, COMPACT_LOG)
            done.runs += 1
        if os.path.isfile(compact):
            done.log_bytes += os.path.getsize(compact)
        done.policies += _place_policy(run, run, _keeps_policy(run, policies))
    return done


def restore_study(study: str, out: str) -> int:
    """Copy a persisted study's compare.json and runs into ``out`` (a marl.compare --out
    directory to resume), writing each run's log also as a plain ``metrics.jsonl``; returns
    the number of runs copied. Runs ``out`` holds already are left as they are."""
    _require_study(study, "DIR")
    os.makedirs(out, exist_ok=True)
    if not os.path.isfile(os.path.join(out, "compare.json")):
        shutil.copy2(os.path.join(study, "compare.json"), os.path.join(out, "compare.json"))
    n = 0
    for run in _run_dirs(study):
        target = os.path.join(out, os.path.relpath(run, study))
        if os.path.exists(target):
            continue
        shutil.copytree(run, target)
        log = stats.metrics_file(target)
        if log is not None and not log.endswith("metrics.jsonl"):
            rows, bad = stats.read_metrics_file(log)
            lines = [json.dumps(row) for row in rows]
            with open(os.path.join(target, "metrics.jsonl"), "w") as fh:
                fh.writelines(f"{line}\n" for line in [*lines, *bad])
        n += 1
    return n


def _rewrite_summary_file(path: str) -> int:
    """Rewrite the summary.json ``path`` as reports write it now: its plotted-only curves at
    their digits (:func:`~marl.experiments.report.summary.round_plotted`; every other number
    as it is, ``NaN`` kept where it had one) in
    :func:`~marl.experiments.report.summary.summary_text`'s layout; returns its size in bytes.
    The new text is read back and checked to hold the same values before it replaces the old."""
    from marl.experiments.report.summary import round_plotted, summary_text

    with open(path) as fh:
        raw = fh.read()
    rounded = round_plotted(json.loads(raw))
    text = summary_text(rounded, allow_nan=True)
    if text != raw:
        if json.dumps(json.loads(text)) != json.dumps(rounded):
            raise PersistError(f"{path}: the rewritten summary.json would not read back equal")
        atomic_write_text(path, text)
    return os.path.getsize(path)


def compact_reports(root: str, *, redraw: bool = False) -> tuple[int, int]:
    """Re-encode every PNG under ``root`` (``runs/`` folders left alone) with a palette of at
    most 256 colours, as :mod:`marl.experiments.report` writes plots now
    (:func:`~marl.experiments.report.compact_png`; a palette PNG is left as it is), and
    rewrite every ``summary.json`` as reports write it now (its plotted-only curves at their
    digits, lists of values on one line; every other number, verdict and p-value as it is).
    For studies published before: nothing is recomputed and no run is needed.

    ``redraw``: also draw each study's report plots again from its (rewritten) summary.json,
    at the report's current size (:func:`~marl.experiments.report.make_plots`), replacing
    those of its ``plots/`` folder that the report writes; other PNGs (a study's own figures)
    are only re-encoded, and no plot is added where the study had none. Returns (bytes
    before, bytes after)."""
    from marl.experiments.report import compact_png

    if not os.path.isdir(root):
        raise PersistError(f"DIR {root!r} is not a directory")
    before = _report_bytes(root)
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "runs")
        for name in sorted(n for n in names if n.endswith(".png") or n == "summary.json"):
            path = os.path.join(folder, name)
            if name == "summary.json":
                _rewrite_summary_file(path)
                if redraw:
                    _redraw_plots(folder)
            else:
                compact_png(path, path)  # a redrawn plot is a palette PNG: left as it is
    return before, _report_bytes(root)


def _report_bytes(root: str) -> int:
    """The bytes of the PNGs and summary.json files under ``root``, ``runs/`` left out."""
    total = 0
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d != "runs"]
        total += sum(
            os.path.getsize(os.path.join(folder, n))
            for n in names
            if n.endswith(".png") or n == "summary.json"
        )
    return total


def _redraw_plots(study: str) -> None:
    """Draw the report's plots of ``study`` again from its summary.json into a scratch folder
    and move over those its ``plots/`` already holds (the others stay for re-encoding)."""
    import tempfile

    from marl.experiments.report import make_plots

    plots = os.path.join(study, "plots")
    if not os.path.isdir(plots):
        return
    with open(os.path.join(study, "summary.json")) as fh:
        summary = json.load(fh)
    with tempfile.TemporaryDirectory() as scratch:
        try:
            drawn = {os.path.basename(p) for p in make_plots(summary, scratch)}
        except (KeyError, TypeError, ValueError) as exc:
            raise PersistError(
                f"{study}: its summary.json cannot be drawn by this report ({exc!r}); "
                "re-encode its plots without --redraw"
            ) from exc
        for name in sorted(drawn & set(os.listdir(plots))):
            with open(os.path.join(scratch, "plots", name), "rb") as fh:
                atomic_write_bytes(os.path.join(plots, name), fh.read())


# ------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------
def _policy_names(value: str) -> list[str]:
    names = [v.strip() for v in value.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"expected VARIANT[,VARIANT...], got {value!r}")
    return names


def _plotted_digits() -> int:
    from marl.experiments.report.summary import PLOTTED_DIGITS

    return PLOTTED_DIGITS


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m marl.experiments.persist",
        usage="%(prog)s SRC DEST [--policies[=VARIANTS]] [--at-env-steps N ...]\n"
        "       %(prog)s --in-place DIR [--policies[=VARIANTS]] [--at-env-steps N ...]\n"
        "       %(prog)s --restore DIR OUT\n"
        "       %(prog)s --reports DIR",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Keep a marl.compare study's finished runs in the repository, compactly:\n"
        "per run config.yaml, eval.json, finished.json and metrics.jsonl.xz (every row of its\n"
        "metrics.jsonl, only the keys the report reads, each at the precision the report\n"
        "needs: the table KEYS in marl/experiments/persist.py). A report regenerated from the\n"
        "compact runs has the same per-seed values, p-values and verdicts, every other figure\n"
        "within 1e-6 relative, and its plotted curves within about a pixel.",
        epilog="examples:\n"
        "  %(prog)s runs/memory docs/results/memory_study/memory\n"
        "  %(prog)s --in-place docs/results/calibration_ladder/websearch_v2 \\\n"
        "      --policies=calibrated,baseline\n"
        "  %(prog)s --restore docs/results/memory_factorial runs/memory_factorial",
    )
    parser.add_argument(
        "paths",
        nargs="*",
        metavar="SRC DEST",
        help="a marl.compare --out directory, and where to keep its finished runs (e.g. "
        "docs/results/NAME; created if missing)",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--in-place",
        metavar="DIR",
        help="compact the persisted study DIR: each run's metrics.jsonl.gz (or metrics.jsonl) "
        "becomes metrics.jsonl.xz and is deleted",
    )
    mode.add_argument(
        "--restore",
        nargs=2,
        metavar=("DIR", "OUT"),
        help="copy the persisted study DIR into OUT to resume it there (each log also as a "
        "plain metrics.jsonl)",
    )
    mode.add_argument(
        "--reports",
        metavar="DIR",
        help="re-encode the plots (PNGs) under DIR with at most 256 colours, and rewrite its "
        "summary.json files as reports write them now (plotted-only curves at "
        f"{_plotted_digits()} significant digits, lists of values on one line; runs/ left "
        "alone): for studies published before",
    )
    parser.add_argument(
        "--redraw",
        action="store_true",
        help="with --reports: also draw each study's report plots again from its "
        "summary.json at the report's current size (the plots it already has; its own "
        "figures are only re-encoded)",
    )
    parser.add_argument(
        "--policies",
        nargs="?",
        const=[],
        type=_policy_names,
        metavar="VARIANTS",
        help="keep each run's final policy (policy/policy.json and weights.pt): every "
        "variant's, or with --policies=a,b those of variants a and b (default: keep none, "
        "deleting any there)",
    )
    parser.add_argument(
        "--at-env-steps",
        nargs="+",
        type=int,
        default=[],
        metavar="N",
        help="env-step counts the study also reports at (marl.compare --at-env-steps): their "
        "stability figures stay exact too (its at_<N>_env_steps directories are found "
        "without this)",
    )
    return parser


def _size_mb(path: str) -> float:
    total = 0
    for root, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total / 1e6


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if any(n < 1 for n in args.at_env_steps):
        parser.error(f"--at-env-steps takes positive env-step counts, got {args.at_env_steps}")
    if args.reports:
        if args.paths or args.policies is not None or args.at_env_steps:
            parser.error("--reports takes DIR alone (and --redraw)")
        try:
            before, after = compact_reports(args.reports, redraw=args.redraw)
        except (PersistError, OSError, ValueError) as exc:
            parser.exit(2, f"{parser.prog}: error: {exc}\n")
        print(
            f"persist: the PNGs and summaries under {args.reports}: "
            f"{before / 1e6:.2f} MB -> {after / 1e6:.2f} MB"
        )
        return 0
    if args.redraw:
        parser.error("--redraw goes with --reports DIR")
    if args.in_place or args.restore:
        if args.paths:
            parser.error(f"unexpected argument(s) {' '.join(args.paths)} (SRC DEST take no mode)")
    elif len(args.paths) != 2:
        parser.error(f"expected SRC DEST, got {len(args.paths)} path(s); see --help")
    if args.restore and (args.policies is not None or args.at_env_steps):
        parser.error("--policies and --at-env-steps apply to persisting, not to --restore")
    try:
        if args.restore:
            n = restore_study(*args.restore)
            print(f"persist: {n} run(s) of {args.restore[0]} restored into {args.restore[1]}")
            return 0
        if args.in_place:
            where = args.in_place
            done = compact_in_place(where, policies=args.policies, at_env_steps=args.at_env_steps)
            what = f"{done.runs} run(s) of {where} compacted"
            rest = f", {done.left_out} compact already" if done.left_out else ""
        else:
            src, where = args.paths
            done = persist_study(src, where, policies=args.policies, at_env_steps=args.at_env_steps)
            what = f"{done.runs} finished run(s) of {src} persisted into {where}"
            rest = f", {done.left_out} unfinished left out" if done.left_out else ""
    except (PersistError, OSError) as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    print(
        f"persist: {what}{rest}; {done.policies} polic{'y' if done.policies == 1 else 'ies'} "
        f"kept; logs {done.log_bytes / 1e6:.2f} MB, the study directory {_size_mb(where):.2f} MB"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
