"""Regenerate every published study from what its directory holds, and compare the result
with the published summary.json (issue 51).

    python benchmarks/check_regeneration.py              # every study under docs/results
    python benchmarks/check_regeneration.py docs/results/memory_study/family_1

For each directory with a compare.json: copy it to a temporary directory (without plots),
run ``python -m marl.compare --report-only --out TMP`` (no other option: the study and how it
was reported come from the directory), and compare each regenerated summary.json (the
study's own report and its ``at_<N>_env_steps`` reports) with the published one:

* verdicts (``shown``, ``direction``, and the verdict sentences where the published summary
  follows the study protocol), ``p_value``, ``p_holm`` and per-seed values (each metric's
  ``values`` and ``seeds``, each run's ``eval``) must be equal;
* every other number must agree within 1e-6 relative (|a - b| <= 1e-6 max(|a|, |b|)), but
  the points of the curves a report only plots (each variant's ``curves`` and
  ``advantages``): within 1e-2 of their plot panel's y range, the rule of
  :mod:`marl.experiments.persist`, which keeps the series they come from at plot precision;
* fields only one side has (added or removed by newer code since publication), text that
  differs (warnings, labels) and the fields that say when and where a report was made
  (created, environment, wall_s, commands, plots, and the runs' status.json entries, which a
  published study does not keep) are listed, not failures.

When newer code leaves comparisons out of the Holm family (``left_out``: an A/A comparison of
arms that are one configuration, or one that repeats another), the family's p_holm and
verdicts change with it: those differences count as explained, not failures, only when Holm
over the published p-values of the comparisons kept gives every regenerated p_holm and the
decision rule every verdict (:func:`holm_family_change`).

It prints a table per report and one over all of them. Exit status 0 when every report
matches (differences explained as above included), 1 otherwise. ``--keep DIR`` keeps the
regenerated summaries; ``--regenerated DIR`` compares with kept ones instead of regenerating.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from marl.experiments import persist, significance

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REL_TOL = 1e-6
#: A variant's sections that are only plotted (learning curves, advantage statistics over
#: training): each point within PLOT_TOL of its plot panel's y range, the rule of
#: marl.experiments.persist, which keeps the series they come from at plot precision.
PLOTTED = ("curves", "advantages")
PLOT_TOL = persist.PLOT_TOLERANCE
#: Keys whose values must be equal wherever they are: decisions and p-values.
EXACT_KEYS = {"shown": "verdicts", "direction": "verdicts", "p_value": "p-values"}
EXACT_KEYS["p_holm"] = "p-values"
#: Top-level fields that say when and where a report was made: not compared.
NOT_COMPARED = {
    "created": "when the report was made",
    "environment": "the machine and code that made it",
    "wall_s": "compare's own run time",
    "commands": "command lines (train commands come from status.json, not published)",
    "plots": "the plots written",
}
#: A run's fields that come from status.json, which a published study does not keep.
RUN_STATUS_FIELDS = {"command", "log", "attempts", "wall_s", "returncode"}
AT_REPORT = re.compile(r"at_\d+_env_steps")


@dataclass
class Comparison:
    """What one regenerated summary.json has in common with the published one."""

    exact: Counter = field(default_factory=Counter)  # category -> values found equal
    numbers: int = 0
    plotted: int = 0  # points of plotted curves compared
    plot_deviation: tuple[float, str] = (0.0, "")  # the largest, in its panel's y range
    differences: list[tuple[float, str]] = field(default_factory=list)  # (relative, where)
    failures: list[str] = field(default_factory=list)
    explained: list[str] = field(default_factory=list)  # failures a verified cause accounts for
    cause: str | None = None
    added: Counter = field(default_factory=Counter)  # path pattern -> count
    removed: Counter = field(default_factory=Counter)
    text: Counter = field(default_factory=Counter)
    not_compared: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)
    published: dict = field(default_factory=dict)  # the whole published summary (plot panels)

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def largest(self) -> tuple[float, str]:
        """The largest relative difference of a number and where, outside the explained."""
        explained = {f.split(":")[0] for f in self.explained}
        return max((d for d in self.differences if d[1] not in explained), default=(0.0, ""))


def _pattern(path: tuple[Any, ...]) -> str:
    """``path`` with list indices, variant names and the metric of a comparison as ``*``
    (one line for many fields)."""
    parts = [str(part) for part in path]
    for i, part in enumerate(path):
        named = i == 1 and path[0] in ("variants", "probability_of_improvement")
        metric = i > 0 and path[i - 1] == "probability_of_improvement" and path[0] == "variants"
        metric |= i == 2 and path[0] == "probability_of_improvement"
        if isinstance(part, int) or named or metric:
            parts[i] = "*"
    return "/".join(parts)


def _exact_category(path: tuple[Any, ...]) -> str | None:
    """The category of a field that must be equal, or None."""
    key = path[-1] if path else None
    if isinstance(key, str) and key in EXACT_KEYS:
        return EXACT_KEYS[key]
    names = [p for p in path if isinstance(p, str)]
    per_seed = len(names) == 5 and names[-1] in ("values", "seeds")
    if names[:1] == ["variants"] and per_seed and names[2] == "metrics":
        return "per-seed values"
    if names[:1] == ["runs"] and "eval" in names:
        return "per-seed values"
    return None


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def compare(published: Any, regenerated: Any, result: Comparison, path: tuple = ()) -> None:
    """Walk both summaries, recording into ``result`` (see the module docstring)."""
    if len(path) == 1 and path[0] in NOT_COMPARED:
        result.not_compared.add(f"{path[0]} ({NOT_COMPARED[path[0]]})")
        return
    if len(path) == 3 and path[0] == "runs" and path[2] in RUN_STATUS_FIELDS:
        result.not_compared.add("runs/*/" + "|".join(sorted(RUN_STATUS_FIELDS)) + " (status.json)")
        return
    if path == ("warnings",):
        gone, new = set(published) - set(regenerated), set(regenerated) - set(published)
        for text in sorted(gone):
            result.text[f"warnings: published only: {text[:90]}"] += 1
        for text in sorted(new):
            result.text[f"warnings: regenerated only: {text[:90]}"] += 1
        return
    category = _exact_category(path)
    if isinstance(published, dict) and isinstance(regenerated, dict):
        for key in published.keys() - regenerated.keys():
            result.removed[_pattern((*path, key))] += 1
        for key in regenerated.keys() - published.keys():
            result.added[_pattern((*path, key))] += 1
        for key in published.keys() & regenerated.keys():
            compare(published[key], regenerated[key], result, (*path, key))
    elif isinstance(published, list) and isinstance(regenerated, list):
        if len(published) != len(regenerated):
            result.failures.append(
                f"{_pattern(path)}: {len(published)} published, {len(regenerated)} regenerated"
            )
            return
        scale = _curve_scale(path, published, result.published)
        for i, (a, b) in enumerate(zip(published, regenerated, strict=True)):
            if scale is not None and _is_number(b):
                _compare_plotted(a, b, scale, (*path, i), result)
            else:
                compare(a, b, result, (*path, i))
    elif category is not None:
        if published == regenerated or _both_nan(published, regenerated):
            result.exact[category] += 1
        else:
            where = "/".join(map(str, path))
            result.failures.append(f"{where}: {published!r} published, {regenerated!r} now")
    elif _is_number(published) and _is_number(regenerated):
        _compare_numbers(float(published), float(regenerated), path, result)
    elif isinstance(published, str) and isinstance(regenerated, str):
        if published != regenerated:
            result.text[f"{_pattern(path)}: text differs"] += 1
    elif published != regenerated:
        where = "/".join(map(str, path))
        result.failures.append(f"{where}: {published!r} published, {regenerated!r} now")


def _both_nan(a: Any, b: Any) -> bool:
    return _is_number(a) and _is_number(b) and math.isnan(a) and math.isnan(b)


def _curve_scale(path: tuple, values: list, summary: dict) -> float | None:
    """A plotted curve's scale: the y range of the report's panel that shows it
    (:func:`marl.experiments.persist.plot_panel_range`, the rule compact logs keep), None for
    any other list."""
    plotted = len(path) >= 3 and path[0] == "variants" and path[2] in PLOTTED
    if not plotted or not values or not all(_is_number(x) for x in values):
        return None
    return persist.plot_panel_range(path, summary)


def _compare_plotted(a: float, b: float, scale: float, path: tuple, result: Comparison) -> None:
    result.plotted += 1
    off = abs(a - b) / scale if scale else float(a != b)
    where = "/".join(map(str, path))
    if off > result.plot_deviation[0]:
        result.plot_deviation = (off, where)
    if off > PLOT_TOL:
        result.failures.append(f"{where}: {a!r} published, {b!r} now ({off:.2g} of the curve)")


def _compare_numbers(a: float, b: float, path: tuple, result: Comparison) -> None:
    result.numbers += 1
    scale = max(abs(a), abs(b))
    rel = 0.0 if a == b else abs(a - b) / scale
    if rel > 0:
        result.differences.append((rel, "/".join(map(str, path))))
    if rel > REL_TOL:
        result.failures.append(f"{'/'.join(map(str, path))}: {a!r} published, {b!r} now")


def compare_summaries(published: dict, regenerated: dict) -> Comparison:
    """:func:`compare` of two summary.json mappings; the verdict sentences are compared only
    where the published summary follows the study protocol (it has ``decision_rule``)."""
    result = Comparison(published=published)
    if "decision_rule" not in published:
        result.notes.append(
            "verdict sentences not compared: published before the study protocol (no p-values)"
        )
        published = {k: v for k, v in published.items() if k != "verdicts"}
        regenerated = {k: v for k, v in regenerated.items() if k != "verdicts"}
    else:
        same = published.get("verdicts") == regenerated.get("verdicts")
        result.exact["verdicts"] += len(published.get("verdicts") or [])
        if not same:
            result.failures.append("verdicts: the verdict sentences differ")
        published = {k: v for k, v in published.items() if k != "verdicts"}
        regenerated = {k: v for k, v in regenerated.items() if k != "verdicts"}
    compare(published, regenerated, result)
    cause = holm_family_change(published, regenerated)
    if cause is not None:
        primary = regenerated.get("primary_metric")
        covered = [f for f in result.failures if _follows_the_family(f.split(":")[0], primary)]
        result.failures = [f for f in result.failures if f not in covered]
        result.explained, result.cause = covered, cause
    return result


def holm_family_change(published: dict, regenerated: dict) -> str | None:
    """Why the Holm family's p_holm and verdicts differ, when newer code leaves comparisons
    out of it (``left_out``) and that alone accounts for the difference: Holm over the
    published p-values of the comparisons kept gives every regenerated ``p_holm``, and the
    decision rule on it (with the published CI and difference) every ``shown`` and
    ``direction``. None otherwise."""
    old, new = published.get("comparisons") or [], regenerated.get("comparisons") or []
    pairs = [(e["variant"], e["baseline"]) for e in old]
    if pairs != [(e["variant"], e["baseline"]) for e in new] or any(e.get("left_out") for e in old):
        return None
    kept = [i for i, e in enumerate(new) if not e.get("left_out")]
    if len(kept) == len(new):
        return None
    for i, p_holm in zip(kept, significance.holm([old[i]["p_value"] for i in kept]), strict=True):
        rule = significance.decide(p_holm, old[i].get("ci"), old[i]["mean_difference"]["value"])
        if (new[i]["p_holm"], new[i]["shown"], new[i]["direction"]) != (
            p_holm,
            rule["shown"],
            rule["direction"],
        ):
            return None
    left = [
        f"{e['variant']} vs {e['baseline']}: {e['left_out']['why']}"
        for e in new
        if e.get("left_out")
    ]
    return (
        f"newer code leaves {len(left)} of {len(new)} primary comparisons out of the Holm "
        f"family ({'; '.join(left)}); Holm over the published p-values of the {len(kept)} kept "
        "gives every regenerated p_holm, and the rule on it every verdict"
    )


def _follows_the_family(where: str, primary: str | None) -> bool:
    """Whether the field at ``where`` follows from the Holm family: a primary comparison's
    p_holm, verdict or being left out, the verdict sentences, the family's outcome."""
    parts = where.split("/")
    if where == "verdicts" or parts[:2] == ["decision_rule", "outcome"]:
        return True
    if parts[-1] not in ("p_holm", "shown", "direction", "left_out"):
        return False
    if parts[0] == "comparisons":
        return True
    return primary in parts and "probability_of_improvement" in parts


def published_reports(study: str) -> list[str]:
    """The study's reports, relative to it: ``.`` and each ``at_<N>_env_steps`` directory
    holding a summary.json."""
    found = ["."]
    for name in sorted(os.listdir(study)):
        if AT_REPORT.fullmatch(name) and os.path.isfile(os.path.join(study, name, "summary.json")):
            found.append(name)
    return found


def regenerate(study: str, tmp: str) -> tuple[int, str, set[str]]:
    """Copy ``study`` to ``tmp`` (no plots; the at_N reports' summaries removed, so each one
    found after is regenerated) and run ``marl.compare --report-only --out tmp`` there;
    returns the exit status, the tail of its output and the summaries it wrote."""
    shutil.copytree(study, tmp, ignore=shutil.ignore_patterns("plots"))
    for name in published_reports(study)[1:]:
        os.remove(os.path.join(tmp, name, "summary.json"))
    command = [sys.executable, "-m", "marl.compare", "--report-only", "--out", tmp]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    output = done.stdout + done.stderr
    written = {
        os.path.normpath(line.removeprefix("summary: ").strip())
        for line in done.stdout.splitlines()
        if line.startswith("summary: ")
    }
    return done.returncode, "\n".join(output.splitlines()[-15:]), written


def check_study(
    study: str, *, keep: str | None = None, regenerated: str | None = None
) -> list[tuple[str, Comparison]]:
    """Regenerate ``study`` in a temporary directory and compare each of its reports;
    ``keep``: also copy the regenerated summaries there (laid out as the study);
    ``regenerated``: compare the summaries kept there instead of regenerating."""
    if regenerated is not None:
        written = {
            os.path.normpath(os.path.join(regenerated, rel, "summary.json"))
            for rel in published_reports(regenerated)
        }
        return _compare_reports(study, regenerated, 0, "", written)
    with tempfile.TemporaryDirectory(prefix="regenerate_") as parent:
        tmp = os.path.join(parent, "study")
        code, tail, written = regenerate(study, tmp)
        for path in sorted(written) if keep is not None else []:
            dest = os.path.join(keep, os.path.relpath(path, tmp))
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            shutil.copy2(path, dest)
        return _compare_reports(study, tmp, code, tail, written)


def _compare_reports(
    study: str, regenerated: str, code: int, tail: str, written: set[str]
) -> list[tuple[str, Comparison]]:
    """Each published report of ``study`` against its counterpart in ``regenerated`` (a
    failure where marl.compare did not write it), then the regenerated reports nobody
    published."""
    results = []
    for rel in published_reports(study):
        result = Comparison()
        path = os.path.normpath(os.path.join(regenerated, rel, "summary.json"))
        if code not in (0, 1) or path not in written:
            result.failures.append(f"not regenerated (marl.compare exit {code}):\n{tail}")
        else:
            with open(os.path.join(study, rel, "summary.json")) as fh:
                published = json.load(fh)
            with open(path) as fh:
                result = compare_summaries(published, json.load(fh))
        results.append((rel, result))
    for path in sorted(written):
        rel = os.path.relpath(os.path.dirname(path), regenerated)
        if rel not in published_reports(study):
            note = Comparison()
            note.notes.append("regenerated, not published: nothing to compare")
            results.append((rel, note))
    return results


def format_comparison(name: str, result: Comparison) -> str:
    """One report's table and lists (markdown)."""
    lines = [f"### {name}", "", "| check | compared | result |", "|---|---:|---|"]
    failed = Counter(_category_of(f.split(":")[0]) for f in result.failures)
    explained = Counter(_category_of(f.split(":")[0]) for f in result.explained)
    for category in ("verdicts", "p-values", "per-seed values"):
        outcome = f"**{failed[category]} differ**" if failed[category] else "equal"
        if explained[category]:
            outcome += f", but {explained[category]} that follow the Holm family (below)"
        lines.append(f"| {category} (equal) | {result.exact[category]} | {outcome} |")
    off, at = result.plot_deviation
    outcome = f"**{failed['plotted curves']} differ**" if failed["plotted curves"] else "within"
    lines.append(
        f"| plotted curves (1e-2 of each panel's y range) | {result.plotted} | {outcome}; largest "
        f"deviation {off:.2g}{' at ' + at if at else ''} |"
    )
    rel, where = result.largest
    verdict = f"**{failed[None]} differ**" if failed[None] else "within 1e-6"
    if explained[None]:
        verdict += f", but {explained[None]} that follow the Holm family (below)"
    lines.append(
        f"| other numbers (relative 1e-6) | {result.numbers} | {verdict}; largest relative "
        f"difference {rel:.2g}{' at ' + where if where else ''} |"
    )
    lines.append("")
    for failure in result.failures[:20]:
        lines.append(f"- FAIL {failure}")
    if len(result.failures) > 20:
        lines.append(f"- FAIL ... and {len(result.failures) - 20} more")
    if result.cause is not None:
        fields = sorted({_pattern(tuple(f.split(":")[0].split("/"))) for f in result.explained})
        lines.append(f"- differ, explained: {result.cause}. Fields: {', '.join(fields)}")
    for label, counter in (
        ("added by newer code", result.added),
        ("removed since publication", result.removed),
        ("text that differs", result.text),
    ):
        if counter:
            items = ", ".join(k + (f" ({n}x)" if n > 1 else "") for k, n in sorted(counter.items()))
            lines.append(f"- {label}: {items}")
    if result.not_compared:
        lines.append("- not compared: " + "; ".join(sorted(result.not_compared)))
    lines += [f"- {note}" for note in result.notes]
    return "\n".join(lines) + "\n"


def _category_of(where: str) -> str | None:
    parts = tuple(int(p) if p.isdigit() else p for p in where.split("/"))
    if where == "verdicts":
        return "verdicts"
    plotted = len(parts) >= 3 and parts[0] == "variants" and parts[2] in PLOTTED
    if plotted and isinstance(parts[-1], int):
        return "plotted curves"
    return _exact_category(parts)


def find_studies(root: str) -> list[str]:
    """Every directory under ``root`` holding a compare.json, sorted."""
    found = []
    for directory, _, files in os.walk(root):
        if "compare.json" in files:
            found.append(directory)
    return sorted(found)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("studies", nargs="*", help="Study directories (default: every one).")
    parser.add_argument("--results", default=os.path.join(REPO, "docs", "results"))
    parser.add_argument(
        "--keep", metavar="DIR", help="Also keep the regenerated summaries in DIR/<study>/."
    )
    parser.add_argument(
        "--regenerated",
        metavar="DIR",
        help="Compare with the summaries --keep kept in DIR/<study>/ instead of regenerating.",
    )
    args = parser.parse_args(argv)
    studies = args.studies or find_studies(args.results)
    rows = []
    for study in studies:
        name = os.path.relpath(study, args.results)
        print(f"checking {name} ...", file=sys.stderr, flush=True)
        started = time.time()
        keep = os.path.join(args.keep, name) if args.keep else None
        kept = os.path.join(args.regenerated, name) if args.regenerated else None
        for rel, result in check_study(study, keep=keep, regenerated=kept):
            label = name if rel == "." else f"{name}/{rel}"
            print(format_comparison(label, result), flush=True)
            rows.append((label, result, time.time() - started))
    print("### All reports\n")
    print("| report | result | largest relative difference | largest curve deviation | s |")
    print("|---|---|---:|---:|---:|")
    for label, result, seconds in rows:
        outcome = "matches" if result.ok else f"**{len(result.failures)} differ**"
        if result.ok and result.explained:
            outcome = f"matches but for the Holm family of newer code ({len(result.explained)})"
        time_s = "-" if args.regenerated else f"{seconds:.0f}"
        print(
            f"| {label} | {outcome} | {result.largest[0]:.2g} | {result.plot_deviation[0]:.2g} "
            f"| {time_s} |"
        )
    return 0 if all(result.ok for _, result, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
