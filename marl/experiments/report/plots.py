"""plots/*.png: learning curves, aggregate intervals, probability of improvement and each
variant's advantage statistics over training, saved as palette PNGs (:func:`save_png`)."""

from __future__ import annotations

import io
import os
import re
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from marl.experiments.report.metrics import CURVE_KEYS
from marl.run.rundir import atomic_write_bytes


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _colors(names: Sequence[str]) -> dict[str, Any]:
    plt = _plt()
    cmap = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")
    return {name: cmap(i % cmap.N) for i, name in enumerate(names)}


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", name)


def save_png(fig: Any, path: str, *, dpi: int) -> None:
    """Write ``fig`` to ``path`` as a PNG of at most 256 colours (optimised). A plot is flat
    colours, lines and their anti-aliasing, which a palette keeps to the eye at about a
    quarter of matplotlib's RGBA bytes (issue 51's results budget)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    buffer.seek(0)
    compact_png(buffer, path)


def compact_png(source: Any, dest: str) -> int:
    """Re-encode the PNG ``source`` (a path or a binary file) into ``dest`` with a palette of
    at most 256 colours; a PNG in palette form already is written byte for byte as it is (so
    compacting twice changes nothing). Returns the bytes written."""
    from PIL import Image

    if isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as fh:
            data = fh.read()
    else:
        data = source.read()
    with Image.open(io.BytesIO(data)) as image:
        if image.mode != "P":
            buffer = io.BytesIO()
            image.convert("RGB").quantize(256, method=Image.Quantize.FASTOCTREE).save(
                buffer, format="PNG", optimize=True
            )
            data = buffer.getvalue()
    atomic_write_bytes(dest, data)
    return len(data)


def _wrapped(title: str, width: int = 60) -> str:
    """``title`` on lines of at most ``width`` characters: a long metric label (the diversity
    metrics' are over 100) otherwise runs into the next panel's."""
    return textwrap.fill(title, width=width)


#: Dots per inch of the report's figures (issue 51's results budget: at 110 and 100 dpi the
#: plots were a sixth of docs/results; these sizes take about a third fewer bytes).
PLOT_DPI = 80
ADVANTAGES_DPI = 72


def make_plots(summary: Mapping[str, Any], out: str) -> list[str]:
    """Write the PNG plots under ``out/plots``; returns their paths relative to ``out``:
    learning curves, aggregate intervals, probability of improvement, and each variant's
    advantage distribution over training (a plot with nothing to show is left out).

    Sized for a screen: :data:`PLOT_DPI` (the learning curves' three panels 1,440 pixels
    wide, about 1.6x the width at which a GitHub page shows them) and
    :data:`ADVANTAGES_DPI`; every figure is drawn again from ``summary`` alone, so the size
    loses nothing of record (``python -m marl.experiments.persist --reports DIR --redraw``
    redraws a published study's plots)."""
    plt = _plt()
    plot_dir = os.path.join(out, "plots")
    os.makedirs(plot_dir, exist_ok=True)
    names = list(summary["variants"])
    colors = _colors(names)
    written: list[str] = []

    def save(filename: str, fig: Any, dpi: int = PLOT_DPI) -> None:
        if fig is None:
            return
        fig.tight_layout()
        path = os.path.join(plot_dir, filename)
        save_png(fig, path, dpi=dpi)
        plt.close(fig)
        written.append(os.path.relpath(path, out))

    save("learning_curves.png", _plot_learning_curves(plt, summary, names, colors))
    save("aggregate_intervals.png", _plot_intervals(plt, summary, names, colors))
    save("probability_of_improvement.png", _plot_improvement(plt, summary, names, colors))
    for name in names:
        figure = _plot_advantages(plt, summary, name)
        save(f"advantages_{_safe(name)}.png", figure, dpi=ADVANTAGES_DPI)
    return written


def _plot_learning_curves(
    plt: Any, summary: Mapping[str, Any], names: list[str], colors: Mapping[str, Any]
) -> Any:
    """Each curve key's mean over seeds with its CI band, one panel per key (None: no
    variant logged a curve)."""
    keys = [k for k in CURVE_KEYS if any(k in v["curves"] for v in summary["variants"].values())]
    if not keys:
        return None
    ncols = min(3, len(keys))
    nrows = -(-len(keys) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(6 * ncols, 4 * nrows), squeeze=False)
    for ax in axes.flat[len(keys) :]:
        ax.set_visible(False)
    for ax, key in zip(axes.flat, keys, strict=False):
        for name in names:
            c = summary["variants"][name]["curves"].get(key)
            if c is None:
                continue
            x = np.asarray(c["env_steps"])
            ax.plot(x, c["mean"], color=colors[name], label=f"{name} (n={c['n']})")
            if c["mean_ci"] is not None:
                ax.fill_between(x, c["mean_ci"][0], c["mean_ci"][1], color=colors[name], alpha=0.2)
        ax.set_xlabel("env steps")
        ax.set_ylabel(key)
        ax.set_title(f"{key}: mean over seeds, {summary['bootstrap']['confidence']:.0%} CI")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return fig


def _plot_intervals(
    plt: Any, summary: Mapping[str, Any], names: list[str], colors: Mapping[str, Any]
) -> Any:
    """Aggregate interval estimates: one panel per metric x (IQM, mean), a bar per variant."""
    metrics = list(summary["metrics"])
    fig, axes = plt.subplots(
        len(metrics),
        2,
        figsize=(10, 0.5 + 0.45 * len(names) * len(metrics) + len(metrics)),
        squeeze=False,
    )
    for row, metric in enumerate(metrics):
        for col, stat_name in enumerate(("iqm", "mean")):
            ax = axes[row][col]
            for i, name in enumerate(names):
                m = summary["variants"][name]["metrics"][metric]
                if m[stat_name] is None:
                    ax.text(
                        0.02,
                        i,
                        "no finished runs",
                        va="center",
                        fontsize=8,
                        transform=ax.get_yaxis_transform(),
                    )
                    continue
                ci = m[f"{stat_name}_ci"]
                if ci is not None:
                    ax.barh(i, ci[1] - ci[0], left=ci[0], height=0.6, color=colors[name], alpha=0.6)
                ax.plot([m[stat_name]], [i], "k|", markersize=14)
            ax.set_yticks(range(len(names)))
            ax.set_yticklabels(names if col == 0 else [""] * len(names))
            title = f"{stat_name.upper()} of {summary['metrics'][metric]['label']}"
            ax.set_title(_wrapped(title), fontsize=9)
            ax.grid(axis="x", alpha=0.3)
    return fig


def _plot_improvement(
    plt: Any, summary: Mapping[str, Any], names: list[str], colors: Mapping[str, Any]
) -> Any:
    """P(variant > reference) with its CI, one panel per metric (None: no other variant)."""
    others = [n for n in names if n != summary["reference"]]
    if not others:
        return None
    metrics = list(summary["metrics"])
    fig, axes = plt.subplots(
        1,
        len(metrics),
        # the titles (up to three lines), the suptitle and the x axis need about 1.6 inches
        # whatever the number of rows: below that one comparison's panels were clipped
        figsize=(3.2 * len(metrics), 1.6 + 0.45 * len(others)),
        squeeze=False,
    )
    for ax, metric in zip(axes[0], metrics, strict=True):
        for i, name in enumerate(others):
            poi = summary["probability_of_improvement"][name][metric]
            if poi["value"] is None:
                continue
            if poi["ci"] is not None:
                lo, hi = poi["ci"]
                ax.barh(i, hi - lo, left=lo, height=0.6, color=colors[name], alpha=0.6)
            ax.plot([poi["value"]], [i], "k|", markersize=14)
        ax.axvline(0.5, color="grey", linestyle="--", linewidth=1)
        ax.set_xlim(0, 1)
        ax.set_yticks(range(len(others)))
        ax.set_yticklabels(others if ax is axes[0][0] else [""] * len(others))
        ax.set_title(_wrapped(summary["metrics"][metric]["label"], width=40), fontsize=9)
    fig.suptitle(f"P(variant > {summary['reference']})", fontsize=10)
    return fig


def _plot_advantages(plt: Any, summary: Mapping[str, Any], name: str) -> Any:
    """Variant ``name``'s advantage distribution over training, per agent type, before and
    after whitening (None: it logged none)."""
    adv = summary["variants"][name]["advantages"]
    groups = [g for g in adv if any(adv[g][p]["mean"] for p in ("adv_raw", "adv"))]
    if not groups:
        return None
    fig, axes = plt.subplots(
        len(groups), 2, figsize=(11, 2.8 * len(groups)), squeeze=False, sharex=True
    )
    for row, group in enumerate(groups):
        for col, prefix in enumerate(("adv_raw", "adv")):
            ax = axes[row][col]
            curves = adv[group][prefix]
            mean, std = curves["mean"], curves["std"]
            if mean is None:
                ax.set_visible(False)
                continue
            x = np.asarray(mean["env_steps"])
            mu = np.asarray(mean["mean"])
            ax.plot(x, mu, color="C0", label="mean")
            if std is not None and len(std["mean"]) == len(mu):
                sd = np.asarray(std["mean"])
                ax.fill_between(x, mu - sd, mu + sd, color="C0", alpha=0.2, label="± std")
            for stat_name, color in (("pos_mean", "C2"), ("neg_mean", "C3")):
                c = curves[stat_name]
                if c is not None:
                    ax.plot(c["env_steps"], c["mean"], color=color, linestyle="--", label=stat_name)
            pos = curves["pos_frac"]
            if pos is not None:
                twin = ax.twinx()
                twin.plot(pos["env_steps"], pos["mean"], color="C1", linestyle=":")
                twin.set_ylim(0, 1)
                twin.set_ylabel("pos_frac (dotted)", color="C1", fontsize=8)
            when = "before whitening" if prefix == "adv_raw" else "after whitening"
            ax.set_title(f"{name}: {group}, {when}", fontsize=9)
            ax.grid(alpha=0.3)
            if row == len(groups) - 1:
                ax.set_xlabel("env steps")
            if row == 0 and col == 0:
                ax.legend(fontsize=7, loc="upper right")
    return fig
