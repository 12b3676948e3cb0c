"""The allocator setting keeps a batch's freed memory for the next batch."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest

from stream_dedup.malloc_tuning import keep_freed_memory

#: A process that runs "batches" of six 8 MiB arrays (written, so every page is touched,
#: then freed together, as a batch's arrays are) and prints the page faults of ten batches
#: after three of warm-up. glibc's default trims the freed 48 MiB from the heap each time.
BATCHES = """
import resource, sys
import numpy as np
if sys.argv[1] == "tuned":
    from stream_dedup.malloc_tuning import keep_freed_memory
    assert keep_freed_memory()
def batch():
    blocks = [np.ones(8 << 20, dtype=np.uint8) for _ in range(6)]
    del blocks
for _ in range(3):
    batch()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    batch()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""
PAGES_PER_BATCH = 6 * (8 << 20) // resource.getpagesize()


def faults(mode: str) -> int:
    run = subprocess.run(
        [sys.executable, "-c", BATCHES, mode], capture_output=True, text=True, check=True
    )
    return int(run.stdout)


def test_freed_batches_are_reused_without_new_page_faults() -> None:
    if not keep_freed_memory():
        pytest.skip("not glibc: the setting does not apply")
    assert faults("tuned") < PAGES_PER_BATCH // 10
    # The default does fault again on every batch: the setting is what makes the difference.
    assert faults("default") > PAGES_PER_BATCH
