"""numba's on-disk cache is shared by the test processes: a kernel compiled by one process (the
pytest process, or a ``python -m marl.train`` a test starts) is loaded, not compiled again, by
the next one.

The cache lives where numba puts it by default, beside each kernel's source
(``<package>/__pycache__/*.nbi|*.nbc``), the place the packages' stale-cache checks
(``drop_stale_kernel_cache``, as in :mod:`envs.websearch`) look after; every process of a run,
and every later run, finds it there. A kernel numba cannot cache (it would warn and compile
again in every process) fails this test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from seqmodels.kernels import numba_available

ROOT = Path(__file__).resolve().parents[1]

#: the kernels a training run reaches: both envs' dynamics, the scripted baseline, the grouped
#: whitening, the GRU recurrence (forward and backward) and the Mamba / Mamba2 blocks
#: (sequence forward and backward, one step)
RUN_EVERY_KERNEL_FAMILY = """
import torch
from marl.run.compile_clock import compile_clock

clock = compile_clock()

from envs import multisearch_v0, websearch_v2
from envs.baselines import evaluate_baseline
from marl.core.seed_batched import stack_modules
from marl.core.whitening import whiten
from seqmodels import Mamba, Mamba2

for make in (multisearch_v0.parallel_env, websearch_v2.parallel_env):
    env = make()
    obs, _ = env.reset(seed=0)
    for _ in range(3):
        actions = {a: env.action_space(a).sample(obs[a]["action_mask"]) for a in env.agents}
        obs, *_ = env.step(actions)
evaluate_baseline("heuristic", seeds=[0], preset="small", max_cycles=8)
whiten(torch.randn(64, 4), group=torch.arange(4).repeat(64, 1))
gru = stack_modules([torch.nn.GRU(4, 8, batch_first=True)])
y, h = gru(torch.randn(1, 2, 5, 4), None, torch.rand(1, 2, 5) < 0.3)
(y.sum() + h.sum()).backward()
for cls, kw in ((Mamba, {}), (Mamba2, {"d_state": 8, "headdim": 8})):
    block = cls(16, backend="numba", **kw)
    y, state = block(torch.randn(2, 9, 16))
    y.sum().backward()
    with torch.no_grad():
        block.step(torch.randn(2, 16), state, torch.tensor([True, False]))
print("compiled:", ",".join(sorted(clock.families)) or "-")
"""


def _run_every_kernel_family() -> str:
    res = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(RUN_EVERY_KERNEL_FAMILY)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=1500,  # a cold cache compiles every family (~2 CPU minutes; 9 min loaded)
    )
    assert res.returncode == 0, res.stderr[-4000:]
    assert "NumbaWarning" not in res.stderr, res.stderr[-4000:]  # e.g. "cannot cache ..."
    return res.stdout.strip().splitlines()[-1]


@pytest.mark.skipif(not numba_available(), reason="needs numba")
def test_a_second_process_loads_every_kernel_family_from_the_cache():
    _run_every_kernel_family()  # compiles what no earlier process of this checkout compiled
    assert _run_every_kernel_family() == "compiled: -"
