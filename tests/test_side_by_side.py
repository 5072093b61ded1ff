"""marl.algos.parallel.side_by_side: results in job order, errors after every job joined, and
workers computing with the caller's torch thread count (OpenMP keeps that count per thread,
so a worker started under another setting would split its GEMMs differently)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from marl.algos import parallel
from marl.algos.parallel import side_by_side


@pytest.fixture
def restore_threads(monkeypatch):
    """One worker thread (so the warmed-up worker is the one that runs the next job), and the
    thread count restored afterwards."""
    monkeypatch.setattr(parallel, "_POOL", ThreadPoolExecutor(max_workers=1))
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)
    parallel._POOL.shutdown()


def test_results_come_back_in_job_order() -> None:
    jobs = [lambda i=i: i * i for i in range(4)]
    assert side_by_side(jobs, parallel=True) == [0, 1, 4, 9]
    assert side_by_side(jobs, parallel=False) == [0, 1, 4, 9]


def test_the_first_error_in_job_order_is_raised_after_all_jobs_ran() -> None:
    ran = []

    def ok() -> None:
        ran.append("ok")

    def bad(msg: str) -> None:
        raise ValueError(msg)

    with pytest.raises(ValueError, match="second"):
        side_by_side([ok, lambda: bad("second"), lambda: bad("third"), ok], parallel=True)
    assert ran == ["ok", "ok"]


def test_workers_follow_the_callers_thread_count(restore_threads) -> None:
    torch.set_num_threads(2)
    side_by_side([torch.get_num_threads] * 2, parallel=True)  # the worker ran torch at 2 threads
    torch.set_num_threads(1)
    assert side_by_side([torch.get_num_threads] * 2, parallel=True) == [1, 1]
    torch.set_num_threads(2)
    assert side_by_side([torch.get_num_threads] * 2, parallel=True) == [2, 2]
