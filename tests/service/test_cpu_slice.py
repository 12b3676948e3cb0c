"""The check processes' shorter CPU slice: taken by the kernel, inherited by threads and
child processes, and harmless where the kernel has no custom slices."""

from __future__ import annotations

import subprocess
import sys

import pytest

from stream_dedup.service.cpu_slice import current_slice_ns

_CHILD = """
import os, sys, threading
from stream_dedup.service.cpu_slice import current_slice_ns, request_slice
before = current_slice_ns()
took = request_slice(float(sys.argv[1]))
seen = {}
t = threading.Thread(target=lambda: seen.update(thread=current_slice_ns(threading.get_native_id())))
t.start(); t.join()
pid = os.fork()
if pid == 0:
    print(current_slice_ns(), flush=True)
    os._exit(0)
os.waitpid(pid, 0)
print(before, took, current_slice_ns(), seen["thread"], flush=True)
"""


def _run(slice_ms: float) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(slice_ms)], capture_output=True, text=True, check=True
    )
    return out.stdout.split()


@pytest.mark.skipif(current_slice_ns() is None, reason="this kernel shows no se.slice")
def test_a_requested_slice_holds_for_the_thread_its_threads_and_its_children() -> None:
    child, before, took, after, thread = _run(0.5)
    assert took == "True"
    assert int(before) != 500_000  # the kernel's default base slice, not ours
    assert int(after) == int(thread) == int(child) == 500_000


@pytest.mark.skipif(current_slice_ns() is None, reason="this kernel shows no se.slice")
def test_the_kernel_clamps_a_slice_out_of_range() -> None:
    _child, _before, took, after, _thread = _run(0.01)
    assert took == "True"
    assert int(after) == 100_000  # Linux's floor, 0.1 ms


def test_asking_changes_nothing_else() -> None:
    """The nice value and the policy stay as they were (a slice is no priority)."""
    code = (
        "import os; os.nice(3); from stream_dedup.service.cpu_slice import request_slice;"
        "request_slice(0.5); print(os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    nice, policy = out.stdout.split()
    assert (int(nice), int(policy)) == (3, 0)
