"""Worked example (docs/extending.md): a new advantage scheme as one small file.

Rank advantages: within each agent type, the mixed advantage ``alpha * team + (1 - alpha) *
individual`` is replaced by its centred rank, scaled to [-1, 1] (robust to outliers, the same
scale whatever the reward scale). One config class adds the option, one algorithm class
overrides MAPPO's advantage-scheme hook, and ``register_algorithm`` makes it ``--algo
mappo_rank``.

Run it: ``python docs/examples/rank_advantages.py --total-steps 20000``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from marl.algos import register_algorithm
from marl.algos.base import config_field
from marl.algos.mappo import MAPPO, MAPPOConfig
from marl.core.whitening import GroupKeys


def centred_ranks(x: Tensor, group: Tensor) -> Tensor:
    """Per group, the ranks of ``x`` mapped linearly to [-1, 1] (0 for a group of one);
    ties keep their order. ``x`` and ``group`` flat ``[M]``."""
    out = torch.zeros_like(x)
    for g in torch.unique(group):  # few groups (agent types): a loop is fine here
        idx = torch.nonzero(group == g).squeeze(1)
        n = idx.numel()
        if n > 1:
            ranks = torch.empty(n, dtype=x.dtype, device=x.device)
            ranks[torch.argsort(x[idx], stable=True)] = torch.arange(n, dtype=x.dtype)
            out[idx] = 2.0 * ranks / (n - 1) - 1.0
    return out


@dataclass
class RankMAPPOConfig(MAPPOConfig):
    """MAPPO with rank advantages: one option more."""

    algo_name: ClassVar[str] = "mappo_rank"
    algo: str = config_field("mappo_rank", "Algorithm.")
    rank_scale: float = config_field(1.0, "Scale of the centred ranks (advantages in [-s, s]).")


class RankMAPPO(MAPPO):
    """MAPPO whose advantage scheme is centred ranks per agent type."""

    name: ClassVar[str] = "mappo_rank"
    config_class: ClassVar[type] = RankMAPPOConfig

    def mix_and_whiten(
        self, team: Tensor, individual: Tensor, keys: GroupKeys, mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        raw = self.cfg.alpha * team + (1 - self.cfg.alpha) * individual  # [T, E, N]
        group = keys.type_id.expand_as(raw).reshape(-1)
        final = self.cfg.rank_scale * centred_ranks(raw.reshape(-1), group).reshape(raw.shape)
        return raw, final


register_algorithm(RankMAPPO)  # --algo mappo_rank (its `name`)

if __name__ == "__main__":
    from marl.run.train import main

    raise SystemExit(main(["--algo", "mappo_rank", *sys.argv[1:]]))
