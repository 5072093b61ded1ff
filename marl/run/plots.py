"""PNG plots of a run (matplotlib, Agg backend) and the episode GIF (imageio).

- ``plots/learning_curves.png``: success, return, eval success, entropy, value loss,
  explained variance against environment steps (from metrics.jsonl);
- ``plots/advantages.png``: histograms of the last update's advantages before and after
  whitening, one panel per agent type;
- ``episode.gif``: frames of one evaluation episode, drawn under :func:`headless_rendering`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence

import numpy as np

from marl.run.rundir import atomic_write

__all__ = ["headless_rendering", "plot_learning_curves", "plot_advantage_histograms", "write_gif"]

#: SDL's drivers that need no display and no sound device (``rgb_array`` frames are drawn all
#: the same); a variable the caller set is kept
HEADLESS_SDL = {"SDL_VIDEODRIVER": "dummy", "SDL_AUDIODRIVER": "dummy"}

CURVES = (
    ("episode/success", "success (train episodes)"),
    ("eval/success_rate", "success (validation)"),
    ("episode/return", "episode return"),
    ("entropy", "policy entropy"),
    ("loss/value", "value loss"),
    ("explained_variance", "explained variance"),
)


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_learning_curves(rows: Sequence[dict], path: str, title: str = "") -> str:
    """Plot the CURVES keys of metrics rows against env_steps; returns ``path``."""
    plt = _plt()
    fig, axes = plt.subplots(2, 3, figsize=(13, 6.5))
    for ax, (key, label) in zip(axes.ravel(), CURVES, strict=True):
        pts = [(r["env_steps"], r[key]) for r in rows if r.get(key) is not None]
        if pts:
            x, y = zip(*pts, strict=True)
            ax.plot(x, y, lw=1.2, marker="o" if key.startswith("eval/") else None, ms=3)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("env steps", fontsize=8)
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_advantage_histograms(
    advantages: dict[str, tuple[np.ndarray, np.ndarray]], path: str, title: str = ""
) -> str:
    """``advantages[type] = (raw, whitened)`` flat arrays -> one row of two panels per type."""
    plt = _plt()
    n = max(1, len(advantages))
    fig, axes = plt.subplots(n, 2, figsize=(10, 2.8 * n), squeeze=False)
    for row, (name, (raw, white)) in enumerate(advantages.items()):
        for col, (x, label) in enumerate(((raw, "before whitening"), (white, "after whitening"))):
            ax = axes[row, col]
            x = np.asarray(x, dtype=np.float64)
            x = x[np.isfinite(x)]
            ax.hist(x, bins=80, color="tab:blue" if col == 0 else "tab:orange", alpha=0.85)
            if x.size:
                ax.axvline(0.0, color="k", lw=0.8)
                ax.set_title(
                    f"{name}: {label} (mean {x.mean():.3f}, std {x.std():.3f}, "
                    f"pos {np.mean(x > 0):.2f})",
                    fontsize=9,
                )
            ax.set_yscale("log")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


@contextlib.contextmanager
def headless_rendering() -> Iterator[None]:
    """Draw ``rgb_array`` frames without a display: SDL (pygame, which Gymnasium's classic
    control and many PettingZoo envs draw with) on its dummy video and audio drivers inside the
    block, unless ``SDL_VIDEODRIVER`` / ``SDL_AUDIODRIVER`` are set. Without it SDL looks for a
    display, and on a machine without one prints ``error: XDG_RUNTIME_DIR is invalid or not set
    in the environment.`` although the frames are drawn. Env worker processes started inside
    the block inherit the setting."""
    added = {k: v for k, v in HEADLESS_SDL.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def write_gif(frames: Sequence[np.ndarray], path: str, fps: int = 8) -> str | None:
    """Write frames as an animated GIF (looping); returns ``path`` or None without frames."""
    if not frames:
        return None
    import imageio.v2 as imageio

    images = [np.asarray(f, dtype=np.uint8) for f in frames]
    # the temporary file ends in .gif: imageio picks the format by the extension
    atomic_write(
        path,
        lambda tmp: imageio.mimsave(tmp, images, duration=1.0 / fps, loop=0),
        suffix=".gif",
    )
    return path
