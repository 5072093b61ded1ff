"""Aggregate statistics across seeds for ``python -m marl.compare``.

Point estimates and stratified-bootstrap confidence intervals come from ``rliable``
(Agarwal et al. 2021, "Deep RL at the Edge of the Statistical Precipice"):

* ``iqm`` / ``mean`` of a per-seed score (final success rate, solved rate, return, area
  under the learning curve), each with a percentile-bootstrap CI over runs;
* the probability of improvement ``P(X > Y)`` of a variant over a reference variant (the
  Mann-Whitney U statistic divided by ``n_x * n_y``; ties count one half) with a CI from
  resampling both variants' runs independently;
* learning curves: mean / IQM across seeds at each point of a common env-step grid, with
  pointwise bootstrap bands.

rliable's stratified bootstrap draws its resampling indices from numpy's *global* random
state (``np.random.choice``), whatever ``random_state`` is passed. For reproducible CIs every
estimate here runs under :func:`seeded_global_rng`, which seeds the global state and restores
the caller's state afterwards. Fewer than two runs give the point estimate and no CI.

The per-run readers (:func:`load_run`, :func:`learning_curve`, :func:`normalized_auc`,
:func:`entropy_collapse`, :func:`stability_figures`) turn a run directory (docs/CONTRACTS.md
section 4: ``eval.json``, ``metrics.jsonl``, ``config.yaml``) into the numbers aggregated here.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import lzma
import math
import os
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "RunData",
    "METRICS_FILES",
    "metrics_file",
    "read_metrics_file",
    "load_run",
    "rows_at_env_steps",
    "phase_ranges",
    "run_at_env_steps",
    "last_evaluations_mean",
    "seeded_global_rng",
    "derive_seed",
    "iqm",
    "interval_estimates",
    "probability_of_improvement",
    "mean_difference",
    "curve_bands",
    "learning_curve",
    "resample_curves",
    "normalized_auc",
    "entropy_collapse",
    "stability_figures",
    "aggregate_stability",
    "verdict",
    "performance_profiles",
]

#: Default number of bootstrap resamples (rliable's paper uses 50k for final figures; 2k
#: keeps a compare of ten variants within a minute; pass more for publication figures).
DEFAULT_REPS = 2000

#: Below this many runs per side, verdicts are marked "indicative only": a percentile bootstrap
#: over so few runs cannot see beyond them and its CIs are too narrow.
FEW_RUNS = 5


#: What to install for the statistics (a bare ``pip install rliable`` may pull arch 8 or
#: pandas 3, under which rliable does not import: the extra pins them).
COMPARE_EXTRA_HINT = (
    "marl.compare's statistics need the 'compare' extra: pip install 'coopsearch[compare]' "
    "(rliable with arch<8 and pandas<3; a bare 'pip install rliable' may not import)."
)


def check_dependencies() -> str | None:
    """None when the statistics' libraries import, else the error to show (with the extra to
    install). marl.compare calls it before it trains anything."""
    try:
        _rliable()
        import scipy.stats  # noqa: F401
    except ImportError as exc:
        return str(exc) if COMPARE_EXTRA_HINT in str(exc) else f"{COMPARE_EXTRA_HINT} ({exc})"
    return None


def _rliable() -> tuple[Any, Any]:
    """Import rliable's library and metrics modules, with an actionable error."""
    try:
        from rliable import library as rly
        from rliable import metrics
    except Exception as exc:  # pragma: no cover - depends on the installed stack
        raise ImportError(
            f"{COMPARE_EXTRA_HINT} Importing rliable.library failed with "
            f"{type(exc).__name__}: {exc}."
        ) from exc
    return rly, metrics


# ------------------------------------------------------------------------------------------
# reproducible bootstrap
# ------------------------------------------------------------------------------------------
@contextlib.contextmanager
def seeded_global_rng(seed: int) -> Iterator[None]:
    """Seed numpy's global random state for the block, then restore the previous state."""
    if not isinstance(seed, int | np.integer) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    saved = np.random.get_state()
    np.random.seed(int(seed) % (2**32))
    try:
        yield
    finally:
        np.random.set_state(saved)


def derive_seed(seed: int, *labels: str) -> int:
    """A stable per-estimate seed: ``seed`` combined with a CRC32 of the labels."""
    text = "\x1f".join(labels).encode()
    return (int(seed) + zlib.crc32(text)) % (2**32)


def _as_scores(values: Sequence[float] | np.ndarray, what: str) -> np.ndarray:
    """Finite per-run scores as rliable's ``(num_runs, num_tasks=1)`` float64 matrix."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{what}: expected a 1-D sequence of per-run scores, got {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{what}: scores must be finite numbers, got {arr.tolist()}")
    return arr.reshape(-1, 1)


def _check_reps_confidence(reps: int, confidence: float) -> None:
    if not isinstance(reps, int | np.integer) or isinstance(reps, bool) or reps < 1:
        raise ValueError(f"reps must be an integer >= 1, got {reps!r}")
    if not (0.0 < float(confidence) < 1.0):
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")


def iqm(values: Sequence[float] | np.ndarray) -> float:
    """Interquartile mean (25% trimmed mean, as rliable/scipy: floor(n/4) cut per side)."""
    _, metrics = _rliable()
    return float(metrics.aggregate_iqm(_as_scores(values, "iqm")))


def interval_estimates(
    values: Sequence[float] | np.ndarray,
    *,
    reps: int = DEFAULT_REPS,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """IQM and mean of per-run scores with stratified-bootstrap percentile CIs.

    Returns ``{"n", "values", "iqm", "iqm_ci", "mean", "mean_ci", "std", "min", "max"}``; the
    CIs are ``[low, high]`` lists, or ``None`` with fewer than two runs. With no runs every
    figure is ``None``. ``std`` is the sample standard deviation (ddof 1; ``None`` for n < 2).
    """
    _check_reps_confidence(reps, confidence)
    scores = _as_scores(values, "interval_estimates")
    n = scores.shape[0]
    out: dict[str, Any] = {
        "n": n,
        "values": scores[:, 0].tolist(),
        "iqm": None,
        "iqm_ci": None,
        "mean": None,
        "mean_ci": None,
        "std": None,
        "min": None,
        "max": None,
    }
    if n == 0:
        return out
    rly, metrics = _rliable()
    out["iqm"] = float(metrics.aggregate_iqm(scores))
    out["mean"] = float(metrics.aggregate_mean(scores))
    out["min"] = float(scores.min())
    out["max"] = float(scores.max())
    if n < 2:
        return out
    out["std"] = float(np.std(scores[:, 0], ddof=1))

    def both(s: np.ndarray) -> np.ndarray:
        return np.array([metrics.aggregate_iqm(s), metrics.aggregate_mean(s)])

    with seeded_global_rng(seed):
        _, intervals = rly.get_interval_estimates(
            {"x": scores}, both, reps=int(reps), confidence_interval_size=float(confidence)
        )
    ci = np.asarray(intervals["x"], dtype=np.float64)  # [2 (low, high), 2 (iqm, mean)]
    out["iqm_ci"] = [float(ci[0, 0]), float(ci[1, 0])]
    out["mean_ci"] = [float(ci[0, 1]), float(ci[1, 1])]
    return out


def probability_of_improvement(
    x: Sequence[float] | np.ndarray,
    y: Sequence[float] | np.ndarray,
    *,
    reps: int = DEFAULT_REPS,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """``P(X > Y)`` for one run of X against one run of Y (ties count 1/2), with a CI.

    The CI resamples the runs of ``x`` and of ``y`` independently (rliable's
    ``StratifiedIndependentBootstrap``). Returns ``{"value", "ci", "n_x", "n_y"}``; ``ci`` is
    ``None`` when either side has fewer than two runs; ``value`` is ``None`` when one is empty.
    """
    _check_reps_confidence(reps, confidence)
    sx = _as_scores(x, "probability_of_improvement x")
    sy = _as_scores(y, "probability_of_improvement y")
    out: dict[str, Any] = {"value": None, "ci": None, "n_x": sx.shape[0], "n_y": sy.shape[0]}
    if sx.shape[0] == 0 or sy.shape[0] == 0:
        return out
    rly, metrics = _rliable()
    out["value"] = float(metrics.probability_of_improvement(sx, sy))
    if sx.shape[0] < 2 or sy.shape[0] < 2:
        return out
    with seeded_global_rng(seed):
        _, intervals = rly.get_interval_estimates(
            {"x": [sx, sy]},
            metrics.probability_of_improvement,
            reps=int(reps),
            confidence_interval_size=float(confidence),
        )
    ci = np.asarray(intervals["x"], dtype=np.float64).reshape(2)
    out["ci"] = [float(ci[0]), float(ci[1])]
    return out


def mean_difference(
    x: Sequence[float] | np.ndarray,
    y: Sequence[float] | np.ndarray,
    *,
    reps: int = DEFAULT_REPS,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """``mean(x) - mean(y)`` with a CI (runs of x and of y resampled independently), and the
    relative difference ``mean(x) / mean(y) - 1`` (None when mean(y) is 0) with its CI from
    the same resamples.

    Returns ``{"value", "ci", "relative", "relative_ci"}``; the CIs are None when a side has
    fewer than two runs (``relative_ci`` also when a resample's mean(y) is 0), every figure
    None when a side is empty.
    """
    _check_reps_confidence(reps, confidence)
    sx = _as_scores(x, "mean_difference x")
    sy = _as_scores(y, "mean_difference y")
    out: dict[str, Any] = {"value": None, "ci": None, "relative": None, "relative_ci": None}
    if sx.shape[0] == 0 or sy.shape[0] == 0:
        return out
    mx, my = float(sx.mean()), float(sy.mean())
    out["value"] = mx - my
    out["relative"] = mx / my - 1.0 if my != 0 else None
    if sx.shape[0] < 2 or sy.shape[0] < 2:
        return out

    def both(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        mean_b = np.mean(b)
        relative = np.mean(a) / mean_b - 1.0 if mean_b != 0 else np.nan
        return np.array([np.mean(a) - mean_b, relative])

    rly, _ = _rliable()
    with seeded_global_rng(seed), np.errstate(divide="ignore", invalid="ignore"):
        _, intervals = rly.get_interval_estimates(
            {"x": [sx, sy]}, both, reps=int(reps), confidence_interval_size=float(confidence)
        )
    ci = np.asarray(intervals["x"], dtype=np.float64).reshape(2, 2)
    out["ci"] = [float(ci[0, 0]), float(ci[1, 0])]
    if out["relative"] is not None and np.isfinite(ci[:, 1]).all():
        out["relative_ci"] = [float(ci[0, 1]), float(ci[1, 1])]
    return out


def curve_bands(
    curves: np.ndarray,
    *,
    reps: int = DEFAULT_REPS,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """Pointwise mean and IQM across runs of ``curves: [runs, points]``, with bootstrap bands.

    As rliable's stratified bootstrap does for a ``[runs, 1, points]`` score array, the runs
    are resampled independently at each point (pointwise bands, not simultaneous ones).

    Returns ``{"mean", "iqm"}`` (lists of length ``points``) and ``"mean_ci"``, ``"iqm_ci"``
    (``[low list, high list]``, or ``None`` with fewer than two runs).
    """
    _check_reps_confidence(reps, confidence)
    arr = np.asarray(curves, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"curves must be a non-empty [runs, points] array, got {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError("curves must be finite (interpolate runs onto a common grid first)")
    rly, _ = _rliable()
    from scipy.stats import trim_mean

    points = arr.shape[1]

    def mean_and_iqm(s: np.ndarray) -> np.ndarray:  # s: [runs, 1, points]
        flat = s[:, 0, :]
        return np.concatenate([flat.mean(axis=0), trim_mean(flat, 0.25, axis=0)])

    base = mean_and_iqm(arr[:, None, :])
    out: dict[str, Any] = {
        "mean": base[:points].tolist(),
        "iqm": base[points:].tolist(),
        "mean_ci": None,
        "iqm_ci": None,
    }
    if arr.shape[0] < 2:
        return out
    with seeded_global_rng(seed):
        _, intervals = rly.get_interval_estimates(
            {"x": arr[:, None, :]},
            mean_and_iqm,
            reps=int(reps),
            confidence_interval_size=float(confidence),
        )
    ci = np.asarray(intervals["x"], dtype=np.float64)  # [2, 2 * points]
    out["mean_ci"] = [ci[0, :points].tolist(), ci[1, :points].tolist()]
    out["iqm_ci"] = [ci[0, points:].tolist(), ci[1, points:].tolist()]
    return out


def verdict(
    name: str, reference: str, metric: str, poi: Mapping[str, Any], *, confidence: float = 0.95
) -> str:
    """A plain sentence on whether ``name`` beats ``reference`` on ``metric``.

    "beats" only when the whole CI of P(improvement) lies above 0.5, "is worse than" only when
    it lies below 0.5, otherwise "does not clearly beat" (the CI includes 0.5). Without a CI
    (fewer than two runs on a side) no claim is made; with fewer than ``FEW_RUNS`` runs on a
    side (``n_x``/``n_y`` in ``poi``) a claim is marked "indicative only".
    """
    value = poi.get("value")
    ci = poi.get("ci")
    pct = f"{100 * confidence:g}%"
    if value is None:
        return f"{name} vs {reference} on {metric}: no finished runs to compare."
    if ci is None:
        return (
            f"{name} vs {reference} on {metric}: P(improvement) = {value:.2f} "
            "(no CI: fewer than 2 runs on a side; no claim either way)."
        )
    figure = f"P(improvement) = {value:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]"
    n_x, n_y = poi.get("n_x"), poi.get("n_y")
    caveat = ""
    if n_x is not None and n_y is not None and min(n_x, n_y) < FEW_RUNS:
        caveat = f" ({n_x} vs {n_y} runs: indicative only)"
    if ci[0] > 0.5:
        return f"{name} beats {reference} on {metric}: {figure}{caveat}."
    if ci[1] < 0.5:
        return f"{name} is worse than {reference} on {metric}: {figure}{caveat}."
    return (
        f"{name} does not clearly beat {reference} on {metric}: {figure} "
        f"(the {pct} CI includes 0.5)."
    )


# ------------------------------------------------------------------------------------------
# per-run readers
# ------------------------------------------------------------------------------------------
@dataclass
class RunData:
    """What a finished (or partial) run directory holds, as plain Python objects."""

    run_dir: str
    eval: dict[str, Any] | None = None  # eval.json, None while the run is unfinished
    records: list[dict[str, Any]] = field(default_factory=list)  # metrics.jsonl rows
    config: dict[str, Any] | None = None  # config.yaml
    bad_lines: int = 0  # unparsable metrics.jsonl lines (e.g. a torn last line)
    marker: dict[str, Any] | None = None  # finished.json: work done, commit, provenance

    @property
    def finished(self) -> bool:
        """eval.json present (whether the run trained to its end is marl.compare's decision,
        from ``finished.json``; here: whether there are final figures to aggregate)."""
        return self.eval is not None


def _json_object(path: str) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when the file does not exist. Malformed JSON or
    another top-level type raises ValueError naming the file."""
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as fh:
            loaded = json.load(fh)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(loaded, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(loaded).__name__}")
    return loaded


#: A run's metrics log, in the order :func:`metrics_file` looks for it: as a run writes it,
#: and as a persisted study keeps it (``python -m marl.experiments.persist``: the compact
#: lzma form; benchmarks/persist_runs.sh wrote gzipped full logs before it).
METRICS_FILES = ("metrics.jsonl", "metrics.jsonl.xz", "metrics.jsonl.gz")


def metrics_file(run_dir: str | os.PathLike[str]) -> str | None:
    """The first of :data:`METRICS_FILES` in ``run_dir``; None when it holds none."""
    for name in METRICS_FILES:
        path = os.path.join(os.fspath(run_dir), name)
        if os.path.isfile(path):
            return path
    return None


def read_metrics_file(path: str | os.PathLike[str]) -> tuple[list[dict[str, Any]], list[str]]:
    """The rows of a metrics log (plain, ``.xz`` or ``.gz`` by its suffix) and its unparsable
    lines, stripped (a run killed while writing leaves a torn last line; a line that is JSON
    but not an object counts too). Blank lines are neither."""
    path = os.fspath(path)
    opener: Any = lzma.open if path.endswith(".xz") else gzip.open if path.endswith(".gz") else open
    rows: list[dict[str, Any]] = []
    bad: list[str] = []
    with opener(path, "rt") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                bad.append(line)
                continue
            if isinstance(row, dict):
                rows.append(row)
            else:
                bad.append(line)
    return rows, bad


def load_run(run_dir: str | os.PathLike[str]) -> RunData:
    """Read ``eval.json``, the metrics log (:func:`metrics_file`: ``metrics.jsonl``, or a
    persisted run's ``metrics.jsonl.xz`` / ``.gz``), ``finished.json`` and ``config.yaml`` of a
    run directory.

    Missing files give ``None`` / an empty list; unparsable metrics lines (a run killed while
    writing) are skipped and counted in ``bad_lines``. A malformed ``eval.json`` raises
    ValueError naming the file.
    """
    run_dir = os.fspath(run_dir)
    data = RunData(run_dir=run_dir)
    data.eval = _json_object(os.path.join(run_dir, "eval.json"))
    metrics_path = metrics_file(run_dir)
    if metrics_path is not None:
        data.records, bad = read_metrics_file(metrics_path)
        data.bad_lines = len(bad)
    data.marker = _json_object(os.path.join(run_dir, "finished.json"))
    config_path = os.path.join(run_dir, "config.yaml")
    if os.path.isfile(config_path):
        import yaml

        with open(config_path) as fh:
            loaded_cfg = yaml.safe_load(fh)
        data.config = loaded_cfg if isinstance(loaded_cfg, dict) else None
    return data


#: Config fields whose values make a run's state at N env steps depend on its total budget
#: (schedules over training progress): field -> the value that does not.
BUDGET_FREE_SETTINGS: dict[str, Any] = {
    "lr_schedule": "constant",
    "ent_coef_final": None,
    "penalty_beta_schedule": "none",
}


def run_at_env_steps(run: RunData, env_steps: float) -> tuple[RunData | None, str | None]:
    """``run`` as it stood after ``env_steps`` env steps, for comparisons at equal samples.

    Returns ``(truncated, None)``: the metrics.jsonl rows with ``env_steps <= env_steps``, and as
    ``eval`` the validation evaluation logged last at or before that count (the row's
    ``eval/<name>`` fields as ``<name>``, plus ``env_steps``: the count it was logged at). Or
    ``(None, reason)`` when the run stopped before ``env_steps`` or logged no validation
    evaluation by then (runs evaluate every ``eval_every`` updates).

    A run's rows up to N env steps are those of a run trained for exactly N steps only when
    nothing depends on the budget (no learning-rate, entropy or penalty schedule over training
    progress; :data:`BUDGET_FREE_SETTINGS`): callers check ``run.config`` for that.
    """
    limit = float(env_steps)
    steps = [x for x in (_number(r.get("env_steps")) for r in run.records) if x is not None]
    if not steps or max(steps) < limit:
        reached = f"{max(steps):.0f}" if steps else "no"
        return None, f"trained {reached} env steps, fewer than {limit:.0f}"
    kept = rows_at_env_steps(run.records, limit)
    evals = [r for r in kept if _number(r.get("eval/success_rate")) is not None]
    if not evals:
        return None, f"no validation evaluation logged at or before {limit:.0f} env steps"
    last = evals[0]
    for row in evals:  # the latest count; of equal counts (a resumed run) the last logged
        if row["env_steps"] >= last["env_steps"]:
            last = row
    evaluation: dict[str, Any] = {
        key[len("eval/") :]: value for key, value in last.items() if key.startswith("eval/")
    }
    evaluation["env_steps"] = last["env_steps"]
    return (
        RunData(
            run_dir=run.run_dir,
            eval=evaluation,
            records=kept,
            config=run.config,
            marker=run.marker,
        ),
        None,
    )


def rows_at_env_steps(
    records: Sequence[Mapping[str, Any]], env_steps: float
) -> list[Mapping[str, Any]]:
    """The metrics rows logged at or before ``env_steps`` env steps (rows without a finite
    ``env_steps`` are left out): what :func:`run_at_env_steps` keeps of a run."""
    limit = float(env_steps)
    return [r for r in records if (x := _number(r.get("env_steps"))) is not None and x <= limit]


def last_evaluations_mean(
    records: Sequence[Mapping[str, Any]], key: str, last: int = 5
) -> float | None:
    """Mean of the last ``last`` periodic validation evaluations ``key`` (e.g.
    ``eval/success_rate``) in metrics.jsonl rows, in env-step order (None when none was
    logged). A second endpoint beside the final evaluation: less sensitive to where one
    evaluation happens to fall in a noisy curve."""
    if last < 1:
        raise ValueError(f"last must be >= 1, got {last}")
    _, values = learning_curve(records, key)
    if values.size == 0:
        return None
    return float(values[-last:].mean())


def _number(value: Any) -> float | None:
    """A finite float from a metrics value, else None (missing, null, NaN, non-numeric)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def learning_curve(
    records: Sequence[Mapping[str, Any]], key: str, *, x_key: str = "env_steps"
) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` float64 arrays of the rows where both ``x_key`` and ``key`` are finite.

    Rows are sorted by x (stable), so a resumed run whose log repeats updates stays ordered.
    """
    xs, ys = [], []
    for row in records:
        x, y = _number(row.get(x_key)), _number(row.get(key))
        if x is not None and y is not None:
            xs.append(x)
            ys.append(y)
    x_arr, y_arr = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
    order = np.argsort(x_arr, kind="stable")
    return x_arr[order], y_arr[order]


def normalized_auc(x: np.ndarray, y: np.ndarray) -> float | None:
    """Area under the curve ``y(x)`` (trapezoids) divided by the x range.

    That is the step-weighted mean of the curve: 1.0 for a curve at 1 throughout, whatever the
    number of steps, so runs of different lengths compare. One point gives its y; none, None.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"x and y must be 1-D of equal length, got {x.shape} and {y.shape}")
    if x.size == 0:
        return None
    if x.size == 1 or x[-1] == x[0]:
        return float(np.mean(y))
    if np.any(np.diff(x) < 0):
        raise ValueError("x must be non-decreasing")
    area = float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2.0))
    return area / float(x[-1] - x[0])


def resample_curves(
    curves: Sequence[tuple[np.ndarray, np.ndarray]], num_points: int = 50
) -> tuple[np.ndarray, np.ndarray] | None:
    """Linear interpolation of several runs' curves onto one common x grid.

    The grid spans the x range that *every* run covers (so no run is extrapolated), with
    ``num_points`` points. Returns ``(grid [P], values [runs, P])`` or None when there is no
    run with data or the common range is empty.
    """
    usable = [(np.asarray(x), np.asarray(y)) for x, y in curves if len(x) > 0]
    if not usable:
        return None
    lo = max(float(x[0]) for x, _ in usable)
    hi = min(float(x[-1]) for x, _ in usable)
    if hi < lo:
        return None
    grid = np.array([lo]) if hi == lo else np.linspace(lo, hi, int(num_points))
    values = np.stack([np.interp(grid, x, y) for x, y in usable])
    return grid, values


def entropy_collapse(
    records: Sequence[Mapping[str, Any]], threshold: float, *, key: str = "entropy"
) -> dict[str, Any]:
    """When the policy entropy first fell below ``threshold`` (nats), if it did.

    Returns ``{"threshold", "collapsed", "update", "env_steps", "initial", "final", "min"}``;
    ``collapsed`` is None when the run logged no entropy.
    """
    out: dict[str, Any] = {
        "threshold": float(threshold),
        "collapsed": None,
        "update": None,
        "env_steps": None,
        "initial": None,
        "final": None,
        "min": None,
    }
    values = []
    for row in records:
        h = _number(row.get(key))
        if h is None:
            continue
        values.append(h)
        if out["collapsed"] is not True and h < threshold:
            out["collapsed"] = True
            out["update"] = row.get("update")
            out["env_steps"] = row.get("env_steps")
    if values:
        out["initial"], out["final"], out["min"] = values[0], values[-1], min(values)
        if out["collapsed"] is None:
            out["collapsed"] = False
    return out


def _series(records: Sequence[Mapping[str, Any]], key: str) -> np.ndarray:
    vals = [_number(row.get(key)) for row in records]
    return np.asarray([v for v in vals if v is not None], dtype=np.float64)


def phase_ranges(n: int) -> dict[str, tuple[int, int]]:
    """The index ranges ``[start, stop)`` of a per-update series of ``n >= 1`` values that the
    stability figures average: all of it, its first and its last quarter."""
    q = max(1, n // 4)
    return {"mean": (0, n), "first_quarter": (0, q), "last_quarter": (n - q, n)}


def _phase_means(series: np.ndarray) -> dict[str, float | None]:
    """Mean of a per-update series over each of its :func:`phase_ranges`."""
    if series.size == 0:
        return {"mean": None, "first_quarter": None, "last_quarter": None}
    return {
        phase: float(series[start:stop].mean())
        for phase, (start, stop) in phase_ranges(series.size).items()
    }


def stability_figures(
    records: Sequence[Mapping[str, Any]], *, entropy_threshold: float
) -> dict[str, Any]:
    """Per-run stability figures from metrics.jsonl rows.

    * ``entropy``: :func:`entropy_collapse`;
    * ``adv_clip_active_frac``: fraction of updates with ``adv_clip_frac > 0`` (None when the
      key was never logged), and ``adv_clip_frac_mean``;
    * ``advantage``: for ``adv_raw`` (before whitening) and ``adv`` (after), the positive
      fraction ``pos_frac`` and the means ``pos_mean``, ``neg_mean``, ``mean``, ``std``
      averaged over training, over its first and over its last quarter.
    """
    clip = _series(records, "adv_clip_frac")
    out: dict[str, Any] = {
        "n_updates": len(records),
        "entropy": entropy_collapse(records, entropy_threshold),
        "adv_clip_active_frac": float(np.mean(clip > 0)) if clip.size else None,
        "adv_clip_frac_mean": float(clip.mean()) if clip.size else None,
        "advantage": {},
    }
    for prefix in ("adv_raw", "adv"):
        out["advantage"][prefix] = {
            stat: _phase_means(_series(records, f"{prefix}/{stat}"))
            for stat in ("pos_frac", "pos_mean", "neg_mean", "mean", "std")
        }
    return out


def _mean_or_none(values: Sequence[float | None]) -> float | None:
    finite = [v for v in values if v is not None]
    return float(np.mean(finite)) if finite else None


def aggregate_stability(per_run: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Combine :func:`stability_figures` of a variant's runs.

    Entropy collapse as a count (``collapsed_runs`` of ``runs_with_entropy``) with the median
    collapse update / env step of the collapsed runs; every other figure as the mean over runs
    (runs that did not log it are left out).
    """
    ent = [r["entropy"] for r in per_run]
    collapsed = [e for e in ent if e["collapsed"]]
    with_entropy = [e for e in ent if e["collapsed"] is not None]

    def median(key: str) -> float | None:
        vals = [e[key] for e in collapsed if _number(e.get(key)) is not None]
        return float(np.median(vals)) if vals else None

    out: dict[str, Any] = {
        "entropy_threshold": ent[0]["threshold"] if ent else None,
        "runs_with_entropy": len(with_entropy),
        "collapsed_runs": len(collapsed),
        "collapse_update_median": median("update"),
        "collapse_env_steps_median": median("env_steps"),
        "final_entropy_mean": _mean_or_none([e["final"] for e in ent]),
        "adv_clip_active_frac": _mean_or_none([r["adv_clip_active_frac"] for r in per_run]),
        "adv_clip_frac_mean": _mean_or_none([r["adv_clip_frac_mean"] for r in per_run]),
        "advantage": {},
    }
    for prefix in ("adv_raw", "adv"):
        out["advantage"][prefix] = {}
        for stat in ("pos_frac", "pos_mean", "neg_mean", "mean", "std"):
            out["advantage"][prefix][stat] = {
                phase: _mean_or_none([r["advantage"][prefix][stat][phase] for r in per_run])
                for phase in ("mean", "first_quarter", "last_quarter")
            }
    return out


def performance_profiles(
    scores: Mapping[str, np.ndarray],
    thresholds: Sequence[float] | np.ndarray,
    *,
    reps: int = DEFAULT_REPS,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
    """rliable's score-distribution performance profiles: per method, the fraction of runs
    (over every task) whose score exceeds each threshold, with stratified-bootstrap CIs.

    ``scores[name]``: ``[runs, tasks]`` (tasks as strata). Returns ``name -> (profile [K],
    ci [2, K] or None)`` for ``K`` thresholds; the CI is None with fewer than two runs.
    """
    _check_reps_confidence(reps, confidence)
    rly, _ = _rliable()
    tau = np.asarray(thresholds, dtype=np.float64)
    out: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
    for name, values in scores.items():
        x = np.asarray(values, dtype=np.float64)
        if x.ndim != 2 or x.shape[0] == 0:
            raise ValueError(f"scores[{name!r}] must be [runs, tasks], got shape {x.shape}")
        profile = (x[:, :, None] > tau[None, None, :]).mean(axis=(0, 1))
        band = None
        if x.shape[0] >= 2:
            with seeded_global_rng(derive_seed(seed, "profile", name)):
                _, cis = rly.create_performance_profile(
                    {name: x}, tau, reps=int(reps), confidence_interval_size=float(confidence)
                )
            band = np.asarray(cis[name], dtype=np.float64)
        out[name] = (profile, band)
    return out
