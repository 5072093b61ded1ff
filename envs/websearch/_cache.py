"""Keeps numba's on-disk cache of the package's kernels in step with the sources.

numba keys each cached kernel on its own file only; the kernels here call kernels and read
constants of sibling modules. Importing this module (the package does, first) removes the
package's cached kernels whenever any of its source files changed since they were cached.
"""

from __future__ import annotations

import glob
import hashlib
import os


def drop_stale_kernel_cache(package_dir: str = os.path.dirname(os.path.abspath(__file__))) -> bool:
    """Remove ``package_dir/__pycache__/*.nbi|*.nbc`` (numba's cache) when the package's
    sources differ from those the cache was built from (a digest kept beside it); returns
    whether it removed anything. A read-only install is left alone."""
    digest = hashlib.sha256()
    for path in sorted(glob.glob(os.path.join(package_dir, "*.py"))):
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


drop_stale_kernel_cache()
