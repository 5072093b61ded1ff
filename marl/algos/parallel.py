"""The one concurrency helper of the algorithms: independent jobs side by side in threads.

torch releases the GIL inside its operations, so two jobs that share no tensors (the agent
types' actors, or the actor and the critic) compute on two cores. The results are the same
as running the jobs one after another in the given order, provided the jobs draw no random
numbers (callers draw minibatch orders before starting them). Each worker runs its job with
the caller's number of torch intra-op threads: OpenMP keeps that number per thread, so a
worker started while the process had another setting would otherwise split its GEMMs
differently from the caller, and the results would differ in the last bits.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

__all__ = ["side_by_side"]

#: worker threads, reused (starting threads for every minibatch costs more than the small
#: jobs gain); the executor starts its threads on the first submit, not here
_POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="marl-side-by-side")


def _with_threads(job: Callable[[], Any], threads: int) -> Any:
    """Run ``job`` in this worker with ``threads`` torch intra-op threads (the caller's)."""
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return job()


def side_by_side(jobs: list[Callable[[], Any]], *, parallel: bool) -> list[Any]:
    """Run ``jobs`` (callables without arguments) and return their results in order.

    ``parallel=False``: one after another in this thread (the readable path). ``parallel``:
    the first job in this thread, the others in worker threads; every job is joined before an
    error is raised (the first error in job order).
    """
    if not parallel or len(jobs) < 2:
        return [job() for job in jobs]
    threads = torch.get_num_threads()
    futures = [_POOL.submit(_with_threads, job, threads) for job in jobs[1:]]
    try:
        first = jobs[0]()
    finally:
        errors = [f.exception() for f in futures]  # waits for every worker
    for error in errors:
        if error is not None:
            raise error
    return [first] + [f.result() for f in futures]
