"""How far a run is, and how it shows it: the budget (:class:`Budget`), the clock that counts
training time against it (:class:`TrainingClock`), and the progress bar on stderr
(:class:`ProgressBar`: tqdm on a terminal, plain :class:`ProgressLines` elsewhere).

The budget is the first of ``--total-steps``, ``--max-time`` and ``--max-cpu-time`` reached;
the time budgets leave out numba's compilation of kernels on their first use
(:mod:`marl.run.compile_clock`).
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any

from tqdm import tqdm

from marl.algos.base import BaseConfig
from marl.run.compile_clock import compile_clock

__all__ = ["Budget", "ProgressBar", "ProgressLines", "TrainingClock"]


class Budget:
    """Progress in [0, 1]: the largest of step, wall-time and CPU-time progress (of a budget
    resolved by :func:`marl.run.train.resolve_budget`)."""

    def __init__(self, cfg: BaseConfig) -> None:
        self.total_steps = cfg.total_steps
        self.max_time = cfg.max_time
        self.max_cpu_time = cfg.max_cpu_time
        if self.total_steps is None and self.max_time is None and self.max_cpu_time is None:
            raise ValueError("no budget: resolve_budget(cfg) first")

    def progress(self, env_steps: int, elapsed: float, cpu: float) -> float:
        """``elapsed``: wall seconds of training so far; ``cpu``: CPU seconds so far."""
        p = 0.0
        if self.total_steps is not None:
            p = max(p, env_steps / self.total_steps)
        if self.max_time is not None:
            p = max(p, elapsed / self.max_time)
        if self.max_cpu_time is not None:
            p = max(p, cpu / self.max_cpu_time)
        return p

    def describe(self) -> str:
        """The budget as flags, e.g. ``--total-steps 4000 --max-time 180``."""
        limits = (
            ("--total-steps", self.total_steps),
            ("--max-time", self.max_time),
            ("--max-cpu-time", self.max_cpu_time),
        )
        return " ".join(
            f"{flag} {int(value) if float(value).is_integer() else value}"
            for flag, value in limits
            if value is not None
        )

    def bar_total(self) -> tuple[float, str]:
        """What the progress bar counts: (its total, its unit: 'step', 's' or 'cpu s')."""
        if self.total_steps is not None:
            return self.total_steps, "step"
        if self.max_time is not None:
            return self.max_time, "s"
        return float(self.max_cpu_time), "cpu s"  # type: ignore[arg-type]


class TrainingClock:
    """Wall and CPU seconds of training, this invocation's (from the clock's creation) and the
    earlier ones' (a resume), numba's compilations left out: what ``--max-time`` and
    ``--max-cpu-time`` count."""

    def __init__(self, elapsed_before: float = 0.0, cpu_before: float = 0.0) -> None:
        self.elapsed_before, self.cpu_before = elapsed_before, cpu_before
        # numba compiles a kernel on its first use (once: it is cached for later runs)
        self._compiles = compile_clock()
        self._compiled_wall, self._compiled_cpu = self._compiles.wall_s, self._compiles.cpu_s
        self._wall_start = time.perf_counter()
        self._cpu_start = time.process_time()

    def elapsed(self) -> float:
        """Wall seconds of training so far."""
        compiling = self._compiles.wall_s - self._compiled_wall
        return self.elapsed_before + time.perf_counter() - self._wall_start - compiling

    def cpu(self) -> float:
        """CPU seconds of training so far."""
        compiling = self._compiles.cpu_s - self._compiled_cpu
        return self.cpu_before + time.process_time() - self._cpu_start - compiling


class ProgressLines:
    """The progress bar where stderr is not a terminal (a log file, a pipe, a scheduler's
    output): one plain line every :attr:`interval` seconds instead of tqdm's carriage-return
    frames, e.g. ``[marl.train] mappo 33.3% of budget (64/192 step, 00:30 elapsed):
    update=1 env_steps=64 agent_sps=2133 eval_success=0.50``. It takes the calls the training
    loop makes on a tqdm bar (``n``, ``total``, ``set_postfix``, ``refresh``, ``close``)."""

    interval: float = 30.0
    #: the bar's postfix names -> the names in the line (those of metrics.jsonl)
    _NAMES = {
        "upd": "update",
        "steps": "env_steps",
        "sps": "agent_sps",
        "succ": "episode_success",
        "ret": "episode_return",
        "eval": "eval_success",
    }

    def __init__(self, total: float, initial: int, desc: str, unit: str) -> None:
        self.total, self.n, self.desc, self.unit = total, initial, desc, unit
        self.postfix: dict[str, Any] = {}
        self.start = self.last = time.perf_counter()

    def set_postfix(self, postfix: dict[str, Any], refresh: bool = False) -> None:  # noqa: ARG002
        self.postfix = dict(postfix)

    def refresh(self) -> None:
        """Write a line if :attr:`interval` seconds have passed since the last one."""
        now = time.perf_counter()
        if now - self.last < self.interval:
            return
        self.last = now
        fields = " ".join(f"{self._NAMES.get(k, k)}={v}" for k, v in self.postfix.items())
        print(
            f"[marl.train] {self.desc} {self.n / self.total:.1%} of budget ({self.n}/"
            f"{self.total:.0f} {self.unit}, {tqdm.format_interval(now - self.start)} elapsed): "
            f"{fields}",
            file=sys.stderr,
            flush=True,
        )

    def close(self) -> None:
        pass


class ProgressBar:
    """The run's progress on stderr, updated with each metrics row: a tqdm bar on a terminal,
    :class:`ProgressLines` elsewhere, nothing when not ``enabled`` (``--progress false``, or a
    rank other than 0). It counts env steps towards ``--total-steps``, else seconds towards
    ``--max-time``, else CPU seconds towards ``--max-cpu-time``, and shows the update, the env
    steps, the agent steps per second, the episodes' success and return and the last
    evaluation's success."""

    def __init__(
        self,
        budget: Budget,
        desc: str,
        start: tuple[int, float, float] = (0, 0.0, 0.0),
        *,
        enabled: bool = True,
    ) -> None:
        """``start``: (env steps, wall seconds, CPU seconds) of training done before (a
        resumed run's)."""
        total, self.unit = budget.bar_total()
        self.eval_success: float | None = None
        self.bar: Any = None
        if not enabled:
            return
        initial = self._position(*start)
        if not sys.stderr.isatty():
            self.bar = ProgressLines(total, initial, desc, self.unit)
            return
        in_steps = self.unit == "step"
        self.bar = tqdm(
            total=total if in_steps else math.ceil(total),
            initial=initial,
            desc=desc,
            unit=self.unit,
            unit_scale=in_steps,
            # seconds of budget per second is no rate: show the times instead
            bar_format=None
            if in_steps
            else "{l_bar}{bar}| {n_fmt}/{total_fmt} "
            + self.unit
            + " [{elapsed}<{remaining}{postfix}]",
            leave=False,
            dynamic_ncols=True,
            file=sys.stderr,
        )

    def _position(self, env_steps: int, elapsed: float, cpu: float) -> int:
        if self.unit == "step":
            return env_steps
        return int(elapsed if self.unit == "s" else cpu)

    def show(self, row: dict[str, Any]) -> None:
        """Move to a metrics row (``update``, ``env_steps``, ``time_s``, ``cpu_s``,
        ``agent_sps``, and when present ``episode/success``, ``episode/return``,
        ``eval/success_rate``)."""
        if "eval/success_rate" in row:
            self.eval_success = row["eval/success_rate"]
        if self.bar is None:
            return
        position = self._position(row["env_steps"], row["time_s"], row["cpu_s"])
        self.bar.n = min(position, self.bar.total)
        post = {"upd": row["update"], "steps": row["env_steps"], "sps": f"{row['agent_sps']:.0f}"}
        if "episode/success" in row:
            post["succ"] = f"{row['episode/success']:.2f}"
        if "episode/return" in row:
            post["ret"] = f"{row['episode/return']:.2f}"
        if self.eval_success is not None:
            post["eval"] = f"{self.eval_success:.2f}"
        self.bar.set_postfix(post, refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        """Close the bar (tqdm clears its line); closing again does nothing."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
