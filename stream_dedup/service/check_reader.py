"""A reader of the check process: a RocksDB secondary instance that answers checks' index
reads, and catches up with the writer when its front says so.

Started by :class:`~stream_dedup.service.check_readers.Readers` in the check process as a
fresh interpreter (``python -m stream_dedup.service.check_reader CONN``, one inherited
descriptor: a :mod:`multiprocessing.connection` over a socket pair). On ``CONN`` it
receives the index's location and detector settings, opens the index as a
:class:`~stream_dedup.index.follower.FollowerIndex`, runs one check's reads to load the
compiled kernels (all of them: a reader never runs the Python ones), and says ``("ready",
pid, documents)``. Then it answers, one at a time and in order, until ``CONN`` ends (the
front closed it, or died: nothing is left running):

- a read (a :class:`~stream_dedup.dedup.check.CheckReads`) -> what the index holds for it
  (a :class:`~stream_dedup.dedup.check.Held`), or a failure's reason when the index
  cannot be read (:func:`~stream_dedup.dedup.check.read_held`: one request per check);
- a dictionary's id -> its stored bytes, or none: the front's scoring needs it to
  decompress the candidates' payloads;
- a follow -> its seconds and the documents now seen: a catch-up with the writer's log
  (:meth:`FollowerIndex.follow`). The front sends it only while no check of its is in
  flight here, so no check waits for it. A follow that fails ends the process (its front
  starts another, which opens the index afresh).

Those messages are raw bytes, not pickles (:mod:`.check_wire`: a quarter less CPU per
round trip).

Why a process of its own: rocksdict keeps the interpreter lock for the whole of a
catch-up (tens to hundreds of milliseconds for a large batch), so a catch-up in the
process that answers HTTP stops every check arriving meanwhile (``docs/check.md``).
One thread: nothing here waits on anything but its connection. SIGINT and SIGTERM are
ignored, as the check process ignores them: its front stops it.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path

from stream_dedup.core import jit
from stream_dedup.core.config import DedupConfig
from stream_dedup.dedup.check import check_texts, read_held
from stream_dedup.errors import StreamDedupError
from stream_dedup.index.follower import FollowerIndex
from stream_dedup.index.opener import open_follower
from stream_dedup.logs import fields, setup_logging
from stream_dedup.service import check_wire as wire

log = logging.getLogger("stream_dedup.service.checks")


def _answer(index: FollowerIndex, request: bytes) -> bytes:
    """The reply to one request of the front (see the module docstring)."""
    kind = request[:1]
    if kind == wire.READ:
        try:
            return wire.encode_held(read_held(index, wire.decode_reads(request)))
        except (StreamDedupError, OSError, RuntimeError) as exc:
            return wire.FAILED + f"{type(exc).__name__}: {exc}".encode()
    if kind == wire.DICTIONARY:
        return wire.encode_dictionary(index.dictionary_bytes(wire.requested_dictionary(request)))
    if kind == wire.FOLLOW:
        started = time.perf_counter()
        index.follow()
        return wire.encode_followed(time.perf_counter() - started, index.counter("documents"))
    raise ValueError(f"unknown request {kind!r}")


def serve(conn: Connection) -> None:
    """Open the follower, then answer the front's requests until it goes."""
    where, dedup, log_settings = conn.recv()
    if not isinstance(where, Path) or not isinstance(dedup, DedupConfig):
        raise TypeError("a reader is started with an index directory and its settings")
    setup_logging(*log_settings)
    index = open_follower(where)
    try:
        # Load the compiled kernels now (once loaded, every size runs compiled): the first
        # real check must not pay for them, and left to the Python kernels a check's reads
        # (hashing its keys, joining its buckets' members) cost as much as RocksDB's.
        with jit.forced(True):
            check_texts(index, dedup, dedup.band_plan(), ["warm-up text for the check path"], 1)
        conn.send(("ready", os.getpid(), index.counter("documents")))
        while True:
            try:
                request = conn.recv_bytes()
            except EOFError:
                return
            conn.send_bytes(_answer(index, request))
    finally:
        index.close()


def main() -> None:
    """Entry point: argv[1] the connection to the front."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    conn = Connection(int(sys.argv[1]))
    try:
        serve(conn)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return  # the front went away
    except BaseException as exc:
        log.error("a check reader failed", extra=fields(error=f"{type(exc).__name__}: {exc}"))
        raise


if __name__ == "__main__":
    main()
