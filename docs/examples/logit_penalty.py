"""Worked example (docs/extending.md): a new loss term as one small file.

A logit penalty ``coef * mean(logits^2)`` over the samples that enter the loss keeps the
policy's logits small (a soft alternative to an entropy bonus). The objective shared by MAPPO
and GRPO (:class:`marl.algos.ppo.ClipPPOObjective`) adds the terms of every hook in its
``extra_terms`` list to its own, the update sums every ``loss/...`` term and reports each as
a metric, so the new term needs no change to the update: a config class adds the
coefficient, an algorithm class appends the hook, ``register_algorithm`` makes it ``--algo
mappo_logit``.

Run it: ``python docs/examples/logit_penalty.py --total-steps 20000 --logit-coef 0.01``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import partial
from typing import ClassVar

from torch import Tensor

from marl.algos import register_algorithm
from marl.algos.base import config_field
from marl.algos.mappo import MAPPO, MAPPOConfig
from marl.algos.ppo import Minibatch, per_run_sum
from marl.models.policies import TypeActor


def logit_penalty(
    actor: TypeActor, mb: Minibatch, terms: dict[str, Tensor], mask: Tensor, coef: float
) -> dict[str, Tensor]:
    """``{"loss/logit": coef * sum over the samples of mask of mean_a logits^2 / count}`` for
    one agent type's minibatch: ``mask [B, L, n]`` marks the (step, agent) samples that enter
    the loss (agents that have left their episode excluded), ``terms["count"]`` is the number
    of such samples of all agent types, the denominator of every term. ``per_run_sum`` sums
    over one run's samples: the whole minibatch, or each seed's in a ``--seeds`` batch."""
    logits = terms["logits"]  # [B, L, n, A], this minibatch's forward (with its graph)
    allowed = mb.action_mask.to(logits.dtype)  # masked actions' logits are set, not learned
    per_sample = (logits.pow(2) * allowed).sum(-1) / allowed.sum(-1).clamp_min(1.0)
    count = terms["count"]  # [S]: one per run (S = 1 for a plain run)
    return {"loss/logit": coef * per_run_sum(per_sample * mask, count) / count}


@dataclass
class LogitMAPPOConfig(MAPPOConfig):
    """MAPPO with a logit penalty: one option more."""

    algo_name: ClassVar[str] = "mappo_logit"
    algo: str = config_field("mappo_logit", "Algorithm.")
    logit_coef: float = config_field(0.01, "Coefficient of the logit penalty mean(logits^2).")


class LogitMAPPO(MAPPO):
    """MAPPO plus the logit penalty in every policy minibatch."""

    name: ClassVar[str] = "mappo_logit"
    config_class: ClassVar[type] = LogitMAPPOConfig

    def __init__(self, cfg: LogitMAPPOConfig, ctx, device="cpu") -> None:
        super().__init__(cfg, ctx, device)
        hook = partial(logit_penalty, coef=cfg.logit_coef)
        self.policy_update.objective.extra_terms.append(hook)


register_algorithm(LogitMAPPO)  # --algo mappo_logit (its `name`)

if __name__ == "__main__":
    from marl.run.train import main

    raise SystemExit(main(["--algo", "mappo_logit", *sys.argv[1:]]))
