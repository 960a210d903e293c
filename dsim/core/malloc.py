"""Give large freed arrays back to the operating system at once (glibc only).

glibc serves an allocation above its mmap threshold (128 KiB) with its own mapping and unmaps it on
free, but each such free *raises* the threshold to the freed size (up to 32 MiB).  A long run's
summary reads many whole-run columns (8 MB each at a million requests) one after another; after the
first is freed the next ones come from the heap, whose freed holes are not returned, so the peak
resident size climbs column after column: `dsim bench --requests 1000000 --replicas 4` peaked at
191 MiB, 166 MiB with the threshold held at 128 KiB.  Holding it costs a mapping per large array, no
measurable CPU (docs/performance.md, "Round three, second pass: the summary's peak").

Only the ``dsim`` command sets it: a program that imports dsim keeps its own allocator settings.
"""
from __future__ import annotations

import os
import sys

M_MMAP_THRESHOLD = -3          # glibc's mallopt parameter (malloc.h)
THRESHOLD = 128 * 1024         # glibc's own default, held fixed


def hold_mmap_threshold() -> bool:
    """Fix glibc's mmap threshold at its default instead of letting frees raise it; True when set.
    Leaves it alone off glibc, or when the user chose one (``MALLOC_MMAP_THRESHOLD_``)."""
    if not sys.platform.startswith("linux") or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        import ctypes
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):        # musl and others have no mallopt
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return mallopt(M_MMAP_THRESHOLD, THRESHOLD) == 1
