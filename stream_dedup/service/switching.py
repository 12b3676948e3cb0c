"""The interpreter's switch interval while the service runs (``service.switch_interval_ms``).

The service's loop thread decides batches in Python while its HTTP threads answer checks
in the same interpreter. A thread that wants the interpreter lock waits one switch
interval before it asks the holder to hand over, and a check takes and gives back the
lock many times (each socket read and write, each compiled kernel, each index read):
while the loop is busy each of those waits a whole interval. A shorter interval shortens
every such wait; it costs the loop a hand-over each time, and only while another thread
is waiting, so an idle port costs nothing.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

__all__ = ["switch_interval"]


@contextlib.contextmanager
def switch_interval(ms: float) -> Iterator[None]:
    """Run the block with the switch interval at ``ms`` milliseconds; the interval before
    is restored after (the tests run services inside their own process)."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(ms / 1000)
    try:
        yield
    finally:
        sys.setswitchinterval(before)
