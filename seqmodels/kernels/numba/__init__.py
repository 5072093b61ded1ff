"""The compiled numba loops behind :mod:`seqmodels.kernels.numba_ops`, one module per op family
(imported lazily from there: numba is needed only here). Importing them compiles nothing (numba
compiles, or loads from its disk cache, on a kernel's first call) and changes no numba setting.

=================  =======================================================================
module             what it holds
=================  =======================================================================
``numerics``       the vectorisable exp and softplus, the row sums, the fast-math flags:
                   helpers inlined into (or called from) every kernel; no kernel of its own
``conv``           depthwise causal conv + SiLU: sequence forward / backward, one step
``norm``           RMSNorm and Mamba2's gated RMSNorm: forward / backward over rows
``scan``           Mamba's selective scan: the fused inner part (training), the plain scan,
                   the single-step state updates
``ssd``            Mamba2's scan (SSD): forward / backward, the single-step state update
``block_step``     a whole Mamba / Mamba2 block's step after in_proj in one kernel (rollouts)
=================  =======================================================================

Which kernel runs where (each module's docstring says more; each module's ``HOT_PATH`` names
its hot kernels):

=====================  ============  ==============================================  ===========
kernel                 module        op (``numba_ops``) and caller                   path
=====================  ============  ==============================================  ===========
``mamba_step_fused``   block_step    ``mamba_step_numba_views``: ``Mamba.step``      rollout
                                                                                     step (hot)
``mamba2_step_fused``  block_step    ``mamba2_step_numba_views``: ``Mamba2.step``    rollout
                                                                                     step (hot)
``mamba_fused_fwd``    scan          ``mamba_block_numba``: ``Mamba.forward``        training
                                                                                     fwd (hot)
``mamba_fused_bwd``    scan          ``mamba_block_numba``                           training
                                                                                     bwd (hot)
``ssd_fwd_t``          ssd           ``ssd_scan_numba``: ``Mamba2.forward``          training
                                                                                     fwd (hot)
``ssd_bwd_t``          ssd           ``ssd_scan_numba``                              training
                                                                                     bwd (hot)
``conv_silu_fwd``      conv          ``mamba_block_numba``, ``conv_silu_numba``:     training
                                     ``Mamba.forward``, ``Mamba2.forward``           fwd (hot)
``conv_silu_bwd``      conv          as ``conv_silu_fwd``                            training
                                                                                     bwd (hot)
``rmsnorm_gated_fwd``  norm          ``rmsnorm_gated_numba``: ``Mamba2.forward``     training
                                                                                     fwd (hot)
``rmsnorm_gated_bwd``  norm          ``rmsnorm_gated_numba``                         training
                                                                                     bwd (hot)
``rmsnorm_fwd``        norm          ``rmsnorm_numba``: the backbones' norms on a    training
                                     sequence                                        fwd (hot)
``rmsnorm_bwd``        norm          ``rmsnorm_numba``                               training
                                                                                     bwd (hot)
``conv_step_silu``     conv          ``conv_step_silu_numba``: ``Mamba2.step``'s     fallback
                                     general path                                    step
``ssd_step``           ssd           ``ssd_state_update_numba``: as above            fallback
                                                                                     step
``mamba_fwd_t``        scan          ``selective_scan_numba``                        tests only
``mamba_bwd_t``        scan          ``selective_scan_numba``                        tests only
``mamba_step``         scan          ``selective_state_update_numba``                tests only
``mamba_step_gated``   scan          ``selective_state_update_gated_numba``          tests only
=====================  ============  ==============================================  ===========

"tests only": reached through the public ops (``seqmodels.scan.selective_scan`` and the
single-step updates, numba backend), which no model or trainer calls; the tests compare them
with their readable twins. "fallback step": ``Mamba2.step``'s general path, taken where its
fused kernel does not apply (grad mode on, states or parameters of another dtype or layout),
runs these when no tensor requires grad; ``Mamba.step``'s general path runs
``mamba_step_fused`` too (through ``mamba_step_numba``).

Conventions of the sequence kernels: forward kernels return the outputs, the last state and the
states at every ``every``-th step (checkpoints, ``[B, L / every, ...]``); backward kernels
recompute one chunk of states at a time from those checkpoints and run the reverse recurrence.
Parallel over the batch rows (each thread owns its rows, so the sums over channels into dB / dC
need no atomics); the gradient of A is returned per row and summed by the caller.

Resets (``keep[b, t] == 0``): the state a reset step starts from is replaced by zeros (the
forward kernels zero it; the backward kernels, which keep the state before the step for the
step before, read a zero array instead), never multiplied by 0: a NaN or inf before a reset
reaches neither the outputs and states from it on nor the gradients of the inputs from it on.

Shared bodies: where a kernel repeated the loop of another one, the loop is an
``@numba.njit(inline="always")`` helper both call (results bit-identical to the loops they
replaced); each module's docstring names them and the loops left unshared, whose arithmetic
differs.

numba's on-disk cache (``cache=True``) keys a kernel on its own file only, while the kernels
here inline helpers from the sibling modules: importing this package therefore drops its
cached kernels whenever any of its source files changed (:func:`drop_stale_kernel_cache`), so
that an edit to a helper never leaves a caller in another module stale.
"""

from __future__ import annotations

import glob
import hashlib
import os

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def drop_stale_kernel_cache(package_dir: str = _PACKAGE_DIR, also: tuple[str, ...] = ()) -> bool:
    """Remove ``package_dir/__pycache__/*.nbi|*.nbc`` (numba's cache) when the package's
    sources, and the files ``also`` names (helpers its kernels inline from elsewhere), differ
    from those the cache was built from (a digest kept beside it); returns whether it removed
    anything. A read-only install is left alone."""
    digest = hashlib.sha256()
    for path in [*sorted(glob.glob(os.path.join(package_dir, "*.py"))), *also]:
        with open(path, "rb") as fh:
            digest.update(os.path.basename(path).encode() + b"\0" + fh.read())
    cache = os.path.join(package_dir, "__pycache__")
    stamp = os.path.join(cache, "numba_sources.sha256")
    try:
        with open(stamp) as fh:
            if fh.read().strip() == digest.hexdigest():
                return False
    except OSError:
        pass
    stale = glob.glob(os.path.join(cache, "*.nbi")) + glob.glob(os.path.join(cache, "*.nbc"))
    try:
        for path in stale:
            os.remove(path)
        os.makedirs(cache, exist_ok=True)
        with open(stamp, "w") as fh:
            fh.write(digest.hexdigest() + "\n")
    except OSError:
        return False
    return bool(stale)


# first, before any kernel of the package is compiled or loaded
drop_stale_kernel_cache()

__all__ = ["drop_stale_kernel_cache"]
