"""Keep freed memory in the process between batches (glibc), for fewer page faults.

Every batch allocates and frees tens of megabytes: numpy arrays of code points, grams and
signatures, RocksDB write batches. By default glibc serves a large allocation with a fresh
``mmap`` (above a threshold that it moves as blocks are freed) and gives the top of the
heap back to the kernel when a large block is freed, so each batch writes to new pages and
pays one page fault per 4 KiB on first touch, which is slow in virtual machines. Pinning
the mmap threshold at its maximum (32 MiB) and the trim threshold at 512 MiB keeps those
blocks in the heap for the next batch, so most of those page faults never happen. The
price is that the resident size stays at its peak (a few hundred MiB at most) instead of
shrinking between batches.

Process-wide, so only the process's owner calls it (the command line, the benchmark);
a library user's process is left alone. Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 512 << 20


def keep_freed_memory() -> bool:
    """Apply the settings above; ``False`` where the C library is not glibc."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        libc.gnu_get_libc_version  # noqa: B018 - present in glibc only
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # mallopt returns 1 on success, 0 on error.
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
