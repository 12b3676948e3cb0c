"""Large arrays between two processes through shared memory, not through a pipe.

A batch's sketch is ~9 MB for 2,000 news articles, mostly numpy arrays (the verification
sets and signatures), and its records ~2 MB of text. Pickled through a socket pair, it
costs the receiving service process copies and context switches on the core that is the
service's bottleneck; a message larger than the socket's buffer also makes the reader
wait for the writer to be scheduled again, chunk by chunk, which on a busy machine with a
niced writer adds about as much again to the time the service spends taking a reply.
Here the sender pickles with protocol 5, which leaves the arrays' buffers out of band,
writes those buffers and the pickle itself into a region both processes map, and sends
only their spans through the pipe (a few hundred bytes). The receiver copies the region
once (one ``memcpy``) and unpickles against the copy, so nothing it keeps refers to memory
the sender will overwrite with the next payload.

The region is a ``memfd`` (an anonymous file; a temporary file where there is none) that
the service creates and the worker inherits. The sender grows it when a payload does not
fit; the receiver maps the new size when a message says so. One payload is in flight at a
time: the sender writes the next one only after the receiver took the last.
"""

from __future__ import annotations

import mmap
import os
import pickle
import tempfile
from typing import Any

#: Spans (offset, length) of the out-of-band buffers of one payload, in order.
Spans = list[tuple[int, int]]

#: What goes through the pipe for one payload: the spans of its out-of-band buffers and,
#: last, of the pickle itself; the bytes used.
Envelope = tuple[Spans, int]

_INITIAL_BYTES = 16 << 20


def create_region_fd() -> int:
    """A new anonymous file for a region (inheritable, so a child process can map it)."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("stream-dedup-shared", 0)
    else:  # pragma: no cover - platforms without memfd
        with tempfile.TemporaryFile() as tmp:
            fd = os.dup(tmp.fileno())
    os.set_inheritable(fd, True)
    return fd


class SharedRegion:
    """One side's mapping of a region: :meth:`put` on the sender, :meth:`take` on the receiver."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._map: mmap.mmap | None = None

    def _mapped(self, size: int) -> mmap.mmap:
        """The region mapped with at least ``size`` bytes (the file already has them)."""
        if self._map is None or len(self._map) < size:
            if self._map is not None:
                self._map.close()
            self._map = mmap.mmap(self.fd, os.fstat(self.fd).st_size)
        return self._map

    def put(self, value: Any) -> Envelope:
        """Write ``value`` into the region (its large buffers, then the pickle of the rest);
        what to send through the pipe."""
        buffers: list[pickle.PickleBuffer] = []
        head = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
        raws = [b.raw() for b in buffers]
        raws.append(memoryview(head))
        total = sum(r.nbytes for r in raws)
        if os.fstat(self.fd).st_size < total:
            os.ftruncate(self.fd, max(total + total // 4, _INITIAL_BYTES))
        region = self._mapped(total)
        spans: Spans = []
        at = 0
        for raw in raws:
            region[at : at + raw.nbytes] = raw
            spans.append((at, raw.nbytes))
            at += raw.nbytes
        return spans, total

    def take(self, envelope: Envelope) -> Any:
        """The value :meth:`put` wrapped, backed by a private copy of the region."""
        spans, total = envelope
        local = bytearray(memoryview(self._mapped(total))[:total])
        view = memoryview(local)
        (head_at, head_size), buffers = spans[-1], spans[:-1]
        head = view[head_at : head_at + head_size]
        return pickle.loads(head, buffers=[view[a : a + n] for a, n in buffers])

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
        os.close(self.fd)
