"""A reader of the check process: a RocksDB secondary instance that answers checks' index
reads, and catches up with the writer when its front says so.

Started by :class:`~stream_dedup.service.check_readers.Readers` in the check process as a
fresh interpreter (``python -m stream_dedup.service.check_reader CONN``, one inherited
descriptor: a :mod:`multiprocessing.connection` over a socket pair). On ``CONN`` it
receives the index's location and detector settings, opens the index as a
:class:`~stream_dedup.index.follower.FollowerIndex`, runs one check's reads to load the
compiled kernels, and says ``("ready", pid, documents)``. Then it answers, one at a time
and in order, until ``CONN`` ends (the front closed it, or died: nothing is left running):

- ``("read", CheckReads)`` -> ``("held", Held)``, or ``("failed", reason)`` when the index
  cannot be read (:func:`~stream_dedup.dedup.check.read_held`: one request per check);
- ``("dictionary", id)`` -> ``("dictionary", bytes or None)``: a stored payload
  dictionary, which the front's scoring needs to decompress the candidates' payloads;
- ``("follow",)`` -> ``("followed", seconds, documents)``: a catch-up with the writer's
  log (:meth:`FollowerIndex.follow`). The front sends it only while no check of its is in
  flight here, so no check waits for it. A follow that fails ends the process (its front
  starts another, which opens the index afresh).

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

from stream_dedup.core.config import DedupConfig
from stream_dedup.dedup.check import CheckReads, check_texts, read_held
from stream_dedup.errors import StreamDedupError
from stream_dedup.index.follower import FollowerIndex
from stream_dedup.index.opener import open_follower
from stream_dedup.logs import fields, setup_logging

log = logging.getLogger("stream_dedup.service.checks")

#: A reply: its kind, then its values.
Reply = tuple[object, ...]


def _answer(index: FollowerIndex, request: tuple[object, ...]) -> Reply:
    """The reply to one request of the front (see the module docstring)."""
    if request[0] == "read":
        reads = request[1]
        if not isinstance(reads, CheckReads):
            raise TypeError(f"a read carries CheckReads, not {type(reads).__name__}")
        try:
            return ("held", read_held(index, reads))
        except (StreamDedupError, OSError, RuntimeError) as exc:
            return ("failed", f"{type(exc).__name__}: {exc}")
    if request[0] == "dictionary":
        ident = request[1]
        if not isinstance(ident, int):
            raise TypeError(f"a dictionary is asked for by its id, not {ident!r}")
        return ("dictionary", index.dictionary_bytes(ident))
    if request[0] == "follow":
        started = time.perf_counter()
        index.follow()
        return ("followed", time.perf_counter() - started, index.counter("documents"))
    raise ValueError(f"unknown request {request[0]!r}")


def serve(conn: Connection) -> None:
    """Open the follower, then answer the front's requests until it goes."""
    where, dedup, log_settings = conn.recv()
    if not isinstance(where, Path) or not isinstance(dedup, DedupConfig):
        raise TypeError("a reader is started with an index directory and its settings")
    setup_logging(*log_settings)
    index = open_follower(where)
    try:
        # The first real check must not load the kernels (the front's sketch is its own).
        check_texts(index, dedup, dedup.band_plan(), ["warm-up text for the check path"], 1)
        conn.send(("ready", os.getpid(), index.counter("documents")))
        while True:
            try:
                request = conn.recv()
            except EOFError:
                return
            conn.send(_answer(index, request))
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
