"""report.md: one function per section, each turning the summary into lines, and
:func:`write_report`, which writes them in order."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from marl.experiments import stats
from marl.experiments.report.comparisons import _fmt_ci, _verdict_text
from marl.run.rundir import atomic_write_text


def _fmt(x: float | None, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _phase(d: Mapping[str, Any] | None) -> str:
    if not d or d.get("first_quarter") is None:
        return "n/a"
    return f"{d['first_quarter']:.2f} → {d['last_quarter']:.2f}"


def _seed_claim_section(s: Mapping[str, Any]) -> list[str]:
    """For the calibration study: seed 000's (docs/seeds.md) "+22% success" claim against the
    measurement."""
    poi_all = s.get("probability_of_improvement") or {}
    if s.get("study") != "calibration" or s.get("reference") != "baseline":
        return []
    if "success_rate" not in poi_all.get("calibrated", {}):
        return []
    poi = poi_all["calibrated"]["success_rate"]
    diff = poi["mean_difference"]
    conf = f"{100 * s['bootstrap']['confidence']:g}%"
    lines = ["## The seed's claim", ""]
    if diff["value"] is None:
        return [*lines, "No finished runs of calibrated or baseline: nothing to test.", ""]
    text = (
        "Seed 000 reports that its calibrated recipe reaches a success rate about 22% higher "
        "than the baseline. Measured here (final success rate on the validation seeds): "
        f"calibrated − baseline = {100 * diff['value']:+.1f} percentage points"
    )
    if diff["ci"] is not None:
        text += f" [{100 * diff['ci'][0]:+.1f}, {100 * diff['ci'][1]:+.1f}] ({conf} CI)"
    if diff["relative"] is not None:
        text += f", {100 * diff['relative']:+.0f}% relative to the baseline's mean"
        if diff.get("relative_ci") is not None:
            low, high = diff["relative_ci"]
            text += f" [{100 * low:+.0f}%, {100 * high:+.0f}%]"
    text += ". " + stats.verdict("calibrated", "baseline", "final success rate", poi)
    return [*lines, text, ""]


def _primary_section(s: Mapping[str, Any]) -> list[str]:
    """The table of primary comparisons with their p-values and verdicts."""
    family = s.get("comparisons") or []
    lines = ["## Primary comparisons", ""]
    if not family:
        return [*lines, "(only one variant: nothing to compare)", ""]
    outcome = s["decision_rule"]["outcome"]
    lines += [
        f"{outcome['comparisons']} primary comparison(s) on `{s['primary_metric']}`, "
        f"Holm-adjusted together: **{outcome['shown']} shown** ({outcome['better']} better, "
        f"{outcome['worse']} worse)" + (", nothing shown." if outcome["shown"] == 0 else "."),
        "",
    ]
    groups = s.get("one_configuration") or []
    if groups:
        lines += [
            "**One configuration**: "
            + "; ".join(" = ".join(g) for g in groups)
            + " gave identical results on every seed (every evaluation figure, seed for seed): "
            "each group "
            "is one configuration trained more than once. Comparisons within a group are A/A, "
            f"and comparisons that repeat another are no new test: {outcome.get('left_out', 0)} "
            "left out of the Holm family (marked below).",
            "",
        ]
    lines += [
        "| variant | baseline | P(improvement) | mean difference | p | p_holm | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for e in family:
        diff = e.get("mean_difference") or {}
        verdict = _verdict_text(e)
        if e.get("left_out"):
            repeats = e["left_out"]["repeats"]
            verdict = (
                "left out: A/A (one configuration)"
                if repeats is None
                else f"left out: repeats {repeats['variant']} vs {repeats['baseline']} ({verdict})"
            )
        p = "n/a" if e.get("p_value") is None else f"{e['p_value']:.3g}"
        p_holm = "n/a" if e.get("p_holm") is None else f"{e['p_holm']:.3g}"
        lines.append(
            f"| {e['variant']} | {e['baseline']} | {_fmt_ci(e.get('value'), e.get('ci'), 2)} | "
            f"{_fmt_ci(diff.get('value'), diff.get('ci'))} | {p} | {p_holm} | {verdict} |"
        )
    return [*lines, ""]


def _header_section(s: Mapping[str, Any]) -> list[str]:
    """The title, the design in one paragraph, the statistics and the rule."""
    conf = f"{100 * s['bootstrap']['confidence']:g}%"
    lines: list[str] = [f"# {s['title']}", ""]
    budget = s["budget"]
    budget_text = (
        f"{budget['total_steps']} env steps per run"
        if budget["total_steps"] is not None
        else f"{budget['max_time']:g} s wall clock per run"
        if budget["max_time"] is not None
        else f"{budget['max_cpu_time']:g} CPU s per run"
        if budget.get("max_cpu_time") is not None
        else "the config's budget per run"
    )
    lines += [
        f"Algorithm `{s['algo']}`, {len(s['variants'])} variants x {len(s['seeds'])} seeds "
        f"(seeds {s['seeds'][0]}..{s['seeds'][-1]}), budget: {budget_text}, "
        f"{s['jobs']} run(s) at once. Reference variant: **{s['reference']}**. "
        f"Generated {s['created']}.",
        "",
        f"Statistics: IQM (interquartile mean) and mean over seeds with {conf} stratified "
        f"bootstrap confidence intervals ({s['bootstrap']['reps']} resamples, seed "
        f"{s['bootstrap']['seed']}, rliable); probability of improvement P(X > baseline) for "
        "one run of each, with its CI. Primary metric: "
        f"**{s['metrics'].get(s.get('primary_metric'), {}).get('label', s.get('primary_metric'))}**"
        f" (`{s.get('primary_metric')}`). " + s["decision_rule"]["text"],
        "",
    ]
    at_steps = s.get("at_env_steps")
    if at_steps is not None:
        lines += [
            f"**Scored at {at_steps} env steps**, not at the end of the runs: each run's "
            f"validation evaluation logged last at or before {at_steps} env steps (runs "
            "evaluate every `eval_every` updates: the counts are in the last column of the "
            "variants table) stands in for its eval.json, and the curves stop there. Runs that "
            "stopped before that count are excluded (status `short`).",
            "",
        ]
    return lines


def _warnings_section(s: Mapping[str, Any]) -> list[str]:
    """The warnings, if any."""
    lines: list[str] = []
    if s["warnings"]:
        lines += ["## Warnings", ""]
        lines += [f"- {w}" for w in s["warnings"]]
        lines.append("")
    return lines


def _exploratory_section(s: Mapping[str, Any]) -> list[str]:
    """The secondary metrics' comparisons: figures without verdicts."""
    lines: list[str] = []
    exploratory = [v for v in s["verdicts"] if v.startswith("exploratory")]
    if exploratory:
        lines += [
            "## Exploratory comparisons (secondary metrics)",
            "",
            "Unadjusted p-values and no verdict: these suggest where to look next, they show "
            "nothing.",
            "",
        ]
        lines += [f"- {v.removeprefix('exploratory: ')}" for v in exploratory]
        lines.append("")
    return lines


def _variants_section(s: Mapping[str, Any]) -> list[str]:
    """Each variant's options, run counts, env steps and throughput."""
    lines: list[str] = []
    at_steps = s.get("at_env_steps")
    budget = s["budget"]
    steps_column = "env steps reached" if at_steps is None else "evaluated at (env steps)"
    lines += [
        "## Variants",
        "",
        f"| variant | options | finished | failed | missing | {steps_column} | "
        "env steps/s | CPU s per run |",
        "|---|---|---|---|---|---|---|---|",
    ]
    step_key = "env_steps" if at_steps is None else "eval_env_steps"
    for name, v in s["variants"].items():
        opts = " ".join(v["args"]) or "(none)"
        mark = " (reference)" if name == s["reference"] else ""
        steps = [
            r[step_key] for r in s["runs"] if r["variant"] == name and r.get(step_key) is not None
        ]
        steps_text = "-" if not steps else f"{min(steps):.0f}–{max(steps):.0f}"
        work = v.get("work") or {}
        rate = (work.get("env_steps_per_s") or {}).get("mean")
        cpu = (work.get("cpu_s") or {}).get("mean")
        lines.append(
            f"| {name}{mark} | `{opts}` | {v['n_finished']} | {v['n_failed']} | "
            f"{v['n_missing'] + v.get('n_short', 0)} | {steps_text} | "
            f"{'-' if rate is None else f'{rate:.0f}'} | {'-' if cpu is None else f'{cpu:.0f}'} |"
        )
    if at_steps is not None:
        lines += [
            "",
            f"Every run is scored at the same sample count ({at_steps} env steps), whatever its "
            "budget let it reach: the comparison is per env step, not per unit of time.",
        ]
    elif budget["max_time"] is not None:
        lines += [
            "",
            "The budget is wall-clock time: runs that shared the CPU with others reached "
            "fewer env steps (see the last column), so the comparison is per time, not per step.",
        ]
    elif budget.get("max_cpu_time") is not None:
        lines += [
            "",
            "The budget is CPU time (each run's own, unaffected by other jobs on the cores): "
            "variants that compute more per step reached fewer env steps (see the last column), "
            "so the comparison is per unit of compute, not per step.",
        ]
    if s.get("common"):
        lines += ["", f"Options common to all variants: `{' '.join(s['common'])}`."]
    lines.append("")
    return lines


def _results_section(s: Mapping[str, Any]) -> list[str]:
    """One table per metric: IQM and mean with CIs, per seed, P(improvement)."""
    lines: list[str] = []
    conf = f"{100 * s['bootstrap']['confidence']:g}%"
    at_steps = s.get("at_env_steps")
    lines += ["## Results", ""]
    for metric, meta in s["metrics"].items():
        if meta["source"] != "eval":
            source = f"step-weighted mean of `{meta['key']}` over training (metrics.jsonl)"
        elif at_steps is None:
            source = f"`{meta['key']}` of eval.json"
        else:
            source = f"`eval/{meta['key']}` of the evaluation at {at_steps} env steps"
        lines += [f"### {meta['label']} ({source})", ""]
        compare = f"P(improvement over {s['reference']})"
        if meta.get("descriptive"):
            lines += ["Descriptive: no verdict (higher is not better by itself).", ""]
            compare = f"P(higher than {s['reference']})"
        lines += [
            f"| variant | n | IQM [{conf} CI] | mean [{conf} CI] | per seed | "
            f"{compare} | mean − {s['reference']} (relative) |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, v in s["variants"].items():
            m = v["metrics"][metric]
            per_seed = ", ".join(f"{x:.3g}" for x in m["values"]) or "-"
            if name == s["reference"]:
                poi_text = diff_text = "(reference)"
            else:
                poi = s["probability_of_improvement"][name][metric]
                poi_text = _fmt_ci(poi["value"], poi["ci"], 2)
                diff = poi["mean_difference"]
                diff_text = _fmt_ci(diff["value"], diff["ci"])
                if diff["relative"] is not None:
                    rel = f"{100 * diff['relative']:+.0f}%"
                    if diff.get("relative_ci") is not None:
                        low, high = diff["relative_ci"]
                        rel += f" [{100 * low:+.0f}%, {100 * high:+.0f}%]"
                    diff_text += f" ({rel})"
            lines.append(
                f"| {name} | {m['n']} | {_fmt_ci(m['iqm'], m['iqm_ci'])} | "
                f"{_fmt_ci(m['mean'], m['mean_ci'])} | {per_seed} | {poi_text} | {diff_text} |"
            )
        lines.append("")
    return lines


def _stability_section(s: Mapping[str, Any]) -> list[str]:
    """Entropy collapse, advantage clipping and advantage statistics."""
    lines: list[str] = []
    lines += [
        "## Stability",
        "",
        f"Entropy collapse: runs whose policy entropy fell below {s['entropy_threshold']:g} "
        "nats (median update of the collapse). Advantage clip active: fraction of updates with "
        "`adv_clip_frac` > 0. Positive fraction of advantages before (`adv_raw`) and after "
        "(`adv`) whitening, first quarter → last quarter of training; mean of the negative "
        "advantages after whitening over training.",
        "",
        "| variant | entropy collapse | final entropy | adv clip active | adv_raw pos frac | "
        "adv pos frac | adv neg mean |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, v in s["variants"].items():
        st = v["stability"]
        if st is None:
            lines.append(f"| {name} | n/a | n/a | n/a | n/a | n/a | n/a |")
            continue
        if st["runs_with_entropy"] == 0:
            collapse = "not logged"
        else:
            collapse = f"{st['collapsed_runs']}/{st['runs_with_entropy']} runs"
            if st["collapse_update_median"] is not None:
                collapse += f" (update {st['collapse_update_median']:g})"
        adv = st["advantage"]
        lines.append(
            f"| {name} | {collapse} | {_fmt(st['final_entropy_mean'])} | "
            f"{_fmt(st['adv_clip_active_frac'], 2)} | {_phase(adv['adv_raw']['pos_frac'])} | "
            f"{_phase(adv['adv']['pos_frac'])} | {_fmt(adv['adv']['neg_mean']['mean'], 2)} |"
        )
    lines.append("")
    return lines


def _failed_section(s: Mapping[str, Any]) -> list[str]:
    """The failed runs with the tails of their logs."""
    lines: list[str] = []
    failed = [r for r in s["runs"] if r["status"] == "failed"]
    if failed:
        lines += ["## Failed runs (excluded from the statistics)", ""]
        for r in failed:
            lines += [
                f"### {r['variant']}/seed_{r['seed']}",
                "",
                f"Log: `{r['log']}` (relative to this directory)",
                "",
                "```",
                (r.get("error") or "").rstrip(),
                "```",
                "",
            ]
    return lines


def _plots_section(s: Mapping[str, Any]) -> list[str]:
    """The plots."""
    lines: list[str] = []
    plots = s.get("plots") or []
    if plots:
        lines += ["## Plots", ""]
        for rel in plots:
            lines += [f"![{os.path.basename(rel)}]({rel})", ""]
    return lines


def _runs_section(s: Mapping[str, Any]) -> list[str]:
    """Every run's figures (collapsed)."""
    lines: list[str] = []
    lines += [
        "<details><summary>Every run</summary>",
        "",
        "| run | status | success | solved | return | env steps | wall s | attempts |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in s["runs"]:
        ev = r.get("eval") or {}

        def num(key: str, ev: Mapping[str, Any] = ev) -> str:
            value = ev.get(key)
            return f"{value:.3f}" if isinstance(value, int | float) else "-"

        steps = f"{r['env_steps']:.0f}" if r.get("env_steps") is not None else "-"
        wall = f"{r['wall_s']:.0f}" if r.get("wall_s") is not None else "-"
        lines.append(
            f"| {r['variant']}/seed_{r['seed']} | {r['status']} | {num('success_rate')} | "
            f"{num('solved_rate')} | {num('mean_return')} | {steps} | {wall} | "
            f"{r.get('attempts', 0)} |"
        )
    lines += ["", "</details>", ""]
    return lines


def _commands_section(s: Mapping[str, Any]) -> list[str]:
    """The compare command and every train command."""
    lines: list[str] = []
    lines += ["## Commands", "", "```", s["commands"]["compare"] or "(API call)", "```", ""]
    lines += ["<details><summary>Train command of every run</summary>", "", "```"]
    lines += [f"{key}: {cmd}" for key, cmd in s["commands"]["train"].items()]
    lines += ["```", "", "</details>", ""]
    return lines


def _environment_section(s: Mapping[str, Any]) -> list[str]:
    """Python, platform, packages and the runs' commits."""
    lines: list[str] = []
    env = s["environment"]
    lines += [
        "## Environment",
        "",
        f"- Python {env['python']} on {env['platform']} ({env['cpu_count']} CPUs)",
        f"- git commit: {env['git']['commit'] or 'unknown'}"
        + (" (uncommitted changes)" if env["git"]["dirty"] else ""),
        "- packages: " + ", ".join(f"{k} {v}" for k, v in env["packages"].items() if v is not None),
        "- commits of the runs (finished.json): "
        + (", ".join(f"`{c}`" for c in s.get("commits") or []) or "none recorded"),
    ]
    if s.get("wall_s") is not None:
        lines.append(f"- compare wall time (this invocation): {s['wall_s']:.0f} s")
    lines.append("")
    return lines


def write_report(summary: Mapping[str, Any], out: str) -> str:
    """Write ``out/report.md`` from a summary, section by section; returns its path."""
    sections = (
        _header_section,
        _warnings_section,
        _primary_section,
        _exploratory_section,
        _seed_claim_section,
        _variants_section,
        _results_section,
        _stability_section,
        _failed_section,
        _plots_section,
        _runs_section,
        _commands_section,
        _environment_section,
    )
    lines = [line for section in sections for line in section(summary)]
    path = os.path.join(out, "report.md")
    atomic_write_text(path, "\n".join(lines))
    return path
