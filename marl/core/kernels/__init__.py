"""Compiled fast paths for :mod:`marl.core`.

Each kernel here accelerates a function whose readable torch implementation lives in the
module it serves (that implementation is the specification); tests compare the two.

* :mod:`marl.core.kernels.whitening_numba`: fused numba CPU loops for the passes of
  :func:`marl.core.whitening.whiten` (count and sum, centred sums, apply).
* :mod:`marl.core.kernels.gru_numba`: the recurrence of a seed-stacked GRU
  (:class:`marl.core.seed_batched.SeedGRU`, whose torch loop with ``fused=False`` is the
  specification) as one compiled loop forward and one backward.

numba's on-disk cache keys a kernel on its own file only, and the GRU kernel inlines
``seqmodels``' vectorisable exp (:mod:`seqmodels.kernels.numba.numerics`): importing this
package drops its cached kernels whenever its sources or that file changed.
"""

from __future__ import annotations

import os

try:
    from seqmodels.kernels.numba import drop_stale_kernel_cache, numerics
except ImportError:  # pragma: no cover - numba is a core dependency
    pass
else:
    drop_stale_kernel_cache(os.path.dirname(os.path.abspath(__file__)), (numerics.__file__,))
