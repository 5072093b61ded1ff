"""Sequence models for recurrent RL policies: Mamba / Mamba2 blocks (mamba-ssm compatible state
dicts, resets, step mode), selective-scan backends, and policy backbones (mlp, gru, mamba,
mamba2).

Layout:

- :mod:`seqmodels.mamba`: the ``Mamba``, ``Mamba2`` and ``RMSNormGated`` modules.
- :mod:`seqmodels.backbones`: ``make_backbone`` and the ``Backbone`` interface for policies.
- :mod:`seqmodels.ops`: the block's operations (causal conv + SiLU, gated RMSNorm, Mamba's
  gated SSM, the whole Mamba block) as readable torch, and their dispatchers.
- :mod:`seqmodels.scan`: the scans and single-step state updates (sequential reference,
  chunked torch), the backends (``BACKENDS``, ``resolve_backend``) and the dispatchers.
- :mod:`seqmodels.kernels`: the compiled kernels (numba, mamba-ssm), each the fused twin of a
  readable op above with the same signature; numba's threading layer
  (``seqmodels.kernels.set_numba_threading_layer``).

Importing this package never needs mamba-ssm, triton or CUDA, does not import numba, and
changes no process-wide setting.
"""

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
