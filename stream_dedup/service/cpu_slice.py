"""A shorter CPU time slice for the processes that answer checks.

Why: a check's latency on a busy host is mostly time spent waiting for a CPU, not time
on one (``docs/benchmarks.md``, the check sections): the check process wakes for each
request, and the deciding process, its sketch worker and the broker keep the CPUs busy
with long runs of work. Linux's scheduler (EEVDF, since 6.6) lets a thread ask for a
shorter slice with ``sched_setattr``'s ``sched_runtime``; since Linux 6.12 a thread with
a shorter slice has an earlier deadline when it wakes and may preempt the running one.
Its share of the CPU does not change, only how soon it runs: what a latency-bound server
beside throughput-bound work wants. No privilege is needed; threads and child processes
(the check readers) inherit the slice.

Python has no binding for ``sched_setattr``, so this calls the system call through
:mod:`ctypes`. On kernels that do not know custom slices, or other systems, the request
is refused or ignored and nothing else changes: the check process runs as before.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
from pathlib import Path

log = logging.getLogger(__name__)

#: ``sched_setattr``'s system call number by machine (Linux's table for each).
_SCHED_SETATTR = {"x86_64": 314, "aarch64": 274}

#: The range Linux accepts for a custom slice (it clamps to it).
MIN_SLICE_MS, MAX_SLICE_MS = 0.1, 100.0


class _SchedAttr(ctypes.Structure):
    """Linux's ``struct sched_attr`` (``sched_setattr(2)``)."""

    _fields_ = [
        ("size", ctypes.c_uint32),
        ("sched_policy", ctypes.c_uint32),
        ("sched_flags", ctypes.c_uint64),
        ("sched_nice", ctypes.c_int32),
        ("sched_priority", ctypes.c_uint32),
        ("sched_runtime", ctypes.c_uint64),
        ("sched_deadline", ctypes.c_uint64),
        ("sched_period", ctypes.c_uint64),
        ("sched_util_min", ctypes.c_uint32),
        ("sched_util_max", ctypes.c_uint32),
    ]


def request_slice(slice_ms: float) -> bool:
    """Ask for a ``slice_ms`` CPU slice for the calling thread (and so for the threads and
    processes it starts later), keeping the normal policy and this process's nice value.
    True when the kernel took it; False (logged once, at debug) where it cannot."""
    number = _SCHED_SETATTR.get(platform.machine())
    if os.name != "posix" or platform.system() != "Linux" or number is None:
        log.debug("no custom CPU slice on this system")
        return False
    attr = _SchedAttr()
    attr.size = ctypes.sizeof(_SchedAttr)
    attr.sched_policy = os.SCHED_OTHER
    attr.sched_nice = os.getpriority(os.PRIO_PROCESS, 0)
    attr.sched_runtime = int(slice_ms * 1_000_000)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(number, 0, ctypes.byref(attr), 0) != 0:
        log.debug("the kernel refused a custom CPU slice: %s", os.strerror(ctypes.get_errno()))
        return False
    return True


def current_slice_ns(tid: int | None = None) -> int | None:
    """The calling (or ``tid``'s) thread's slice in nanoseconds, from the scheduler's
    ``/proc`` view; None where the kernel does not show it."""
    path = Path(f"/proc/self/task/{tid}/sched" if tid else "/proc/thread-self/sched")
    try:
        with path.open(encoding="ascii") as f:
            for line in f:
                if line.startswith("se.slice"):
                    return int(line.split(":")[1])
    except (OSError, ValueError):
        return None
    return None
