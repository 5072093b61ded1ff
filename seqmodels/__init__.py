"""Sequence models for recurrent RL policies: Mamba / Mamba2 blocks (mamba-ssm compatible state
dicts, resets, step mode), selective-scan backends, and policy backbones (mlp, gru, mamba,
mamba2). Importing this package never needs mamba-ssm, triton or CUDA."""

from __future__ import annotations

from seqmodels.backbones import Backbone, make_backbone
from seqmodels.mamba import Mamba, Mamba2, RMSNormGated
from seqmodels.scan import BACKENDS, selective_scan, ssd_scan

__all__ = [
    "BACKENDS",
    "Backbone",
    "Mamba",
    "Mamba2",
    "RMSNormGated",
    "make_backbone",
    "selective_scan",
    "ssd_scan",
]
