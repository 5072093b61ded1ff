"""glibc's allocator thresholds, on the caller's terms: seqmodels itself never changes them.

Why a program may want them: glibc serves every allocation above its *mmap threshold* with a
fresh ``mmap`` and returns it to the kernel on ``free``, and it gives memory at the top of its
heap back to the kernel (*trims*) once more than the *trim threshold* is free there. Both
thresholds start at 128 KiB and grow on their own (the mmap threshold to the largest freed
mmapped block, at most 32 MiB on 64-bit systems; the trim threshold to twice that). A training
step allocates and frees tensors of many MiB each time (a Mamba block's ``[B, L, d_inner]``
activations and their gradients: 16 MiB each at B=32, L=1024, d_inner=128, float32), so the
heap is trimmed after every backward pass and the next step touches fresh pages: every 4 KiB
page costs a page fault, and the kernel zeroes it. Measured (one thread, B=32, L=1024,
d_model 64): a Mamba block's forward + backward took about 18k page faults (72 MiB of fresh
pages, 10-15% of its time), nn.GRU's none.

:func:`set_malloc_thresholds` fixes both thresholds for the process (``mallopt``, the same
setting as glibc's ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` environment
variables): blocks up to the mmap threshold come from the heap, and up to the trim threshold
of freed memory stays with the process for the next step. The cost is that memory: a process
keeps up to ``trim_threshold`` bytes it has freed (the default, 512 MiB, is a few training
steps' worth). Other C libraries (musl, macOS) have no such setting: the function then
returns False and changes nothing. The trainer calls it unless ``--malloc-tuning false``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

#: glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

#: The largest mmap threshold glibc accepts on 64-bit systems (DEFAULT_MMAP_THRESHOLD_MAX).
MAX_MMAP_THRESHOLD = 32 * 1024 * 1024
DEFAULT_MMAP_THRESHOLD = MAX_MMAP_THRESHOLD
DEFAULT_TRIM_THRESHOLD = 512 * 1024 * 1024


@functools.lru_cache(maxsize=1)
def _glibc() -> ctypes.CDLL | None:
    """The process's C library when it is glibc (it has ``gnu_get_libc_version`` and
    ``mallopt``), else None."""
    try:
        libc = ctypes.CDLL(None)
    except OSError:  # pragma: no cover - platforms without a loadable C library
        return None
    if not (hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "mallopt")):
        return None
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    return libc


def malloc_tuning_available() -> bool:
    """True where the process runs on glibc (where :func:`set_malloc_thresholds` works)."""
    return _glibc() is not None


def set_malloc_thresholds(
    mmap_threshold: int = DEFAULT_MMAP_THRESHOLD,
    trim_threshold: int = DEFAULT_TRIM_THRESHOLD,
) -> bool:
    """Fix glibc's mmap and trim thresholds for this process (a program's own choice, e.g.
    the trainer's; seqmodels never calls it). See the module docstring for why.

    Args:
        mmap_threshold: bytes; blocks at least this large get their own mmap (0 to
            ``MAX_MMAP_THRESHOLD``, 32 MiB).
        trim_threshold: bytes of free memory at the top of the heap kept before glibc gives
            it back to the kernel (0 to 2**31 - 1).

    Returns:
        True when set; False where the C library is not glibc (nothing changed).

    Raises:
        ValueError: a threshold outside its range (nothing changed).
    """
    for name, value, top in (
        ("mmap_threshold", mmap_threshold, MAX_MMAP_THRESHOLD),
        ("trim_threshold", trim_threshold, 2**31 - 1),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top:
            raise ValueError(f"{name} must be an int of bytes in [0, {top}], got {value!r}")
    libc = _glibc()
    if libc is None:
        return False
    if not libc.mallopt(_M_MMAP_THRESHOLD, mmap_threshold):  # pragma: no cover - checked above
        raise ValueError(f"glibc refused mmap_threshold={mmap_threshold}")
    if not libc.mallopt(_M_TRIM_THRESHOLD, trim_threshold):  # pragma: no cover
        raise ValueError(f"glibc refused trim_threshold={trim_threshold}")
    return True


__all__ = [
    "DEFAULT_MMAP_THRESHOLD",
    "DEFAULT_TRIM_THRESHOLD",
    "MAX_MMAP_THRESHOLD",
    "malloc_tuning_available",
    "set_malloc_thresholds",
]
