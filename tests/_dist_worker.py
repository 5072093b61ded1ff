"""Worker for the 2-process torch.distributed (gloo) whitening test.

Run as ``python tests/_dist_worker.py RANK WORLD_SIZE INIT_FILE OUT_DIR``. Each rank builds
its own data (unequal sizes; group 4 absent on rank 0), runs the distributed whitening
calls and saves inputs and outputs to ``OUT_DIR/rank{RANK}.pt`` for the test to compare
against single-process whitening of the concatenation.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from marl.core.advantages import group_relative_advantages  # noqa: E402
from marl.core.whitening import RunningMoments, whiten  # noqa: E402


def make_data(rank: int) -> dict[str, torch.Tensor]:
    """Rank-dependent data: rank 0 has 37 entries, rank 1 has 101; group 4 only on rank 1."""
    gen = torch.Generator().manual_seed(1234 + rank)
    n = 37 if rank == 0 else 101
    x = torch.randn(n, generator=gen, dtype=torch.float64) * (1 + rank) + 50.0 * rank + 1000.0
    x = x.float()
    high = 4 if rank == 0 else 5
    group = torch.randint(0, high, (n,), generator=gen)
    mask = torch.rand(n, generator=gen) > 0.25
    group[~mask] = -1  # padding ids at masked-out entries are ignored
    returns = torch.randint(0, 3, (n,), generator=gen).float()
    episode_group = torch.randint(0, 6 if rank else 4, (n,), generator=gen)
    return {"x": x, "group": group, "mask": mask, "returns": returns, "ep_group": episode_group}


def main() -> None:
    rank, world, init_file, out_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=60),
    )
    data = make_data(rank)
    x, group, mask = data["x"], data["group"], data["mask"]
    out: dict[str, object] = dict(data)
    out["grouped"] = whiten(x, mask=mask, group=group, distributed=True)
    out["batch"] = whiten(x, distributed=True)
    out["no_center"] = whiten(x, mask=mask, group=group, center=False, distributed=True)
    out["no_scale"] = whiten(x, mask=mask, group=group, scale=False, distributed=True)
    adv, frac = group_relative_advantages(
        data["returns"], data["ep_group"], leave_one_out=True, distributed=True
    )
    out["grpo"], out["grpo_frac"] = adv, frac

    running = RunningMoments(num_groups=6)
    running.update(x, mask=mask, group=group, distributed=True)
    running.update(x[: 10 + rank], group=group[: 10 + rank].clamp_min(0), distributed=True)
    out["running"] = running.state_dict()
    ema = RunningMoments(num_groups=6, momentum=0.9)
    ema.update(x, mask=mask, group=group, distributed=True)
    ema.update(x * 2, mask=mask, group=group, distributed=True)
    out["ema"] = ema.state_dict()

    # A NaN on one rank only: every rank must raise (no rank left waiting).
    bad = x.clone()
    if rank == 1:
        bad[3] = float("nan")
        mask_bad = mask.clone()
        mask_bad[3] = True
    else:
        mask_bad = mask
    try:
        whiten(bad, mask=mask_bad, group=group.clamp_min(0), distributed=True)
        out["nan_error"] = ""
    except ValueError as err:
        out["nan_error"] = str(err)
    # Bad ids on rank 0 only: rank 0 raises its own error, rank 1 is told (no hang).
    bad_group = group.clamp_min(0)
    if rank == 0:
        bad_group[0] = -5
    try:
        whiten(x, group=bad_group, distributed=True)
        out["bad_input_error"] = ""
    except ValueError as err:
        out["bad_input_error"] = str(err)
    # ...and the process group still works afterwards.
    out["after_error"] = whiten(x, group=group.clamp_min(0), distributed=True)
    torch.save(out, Path(out_dir) / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
