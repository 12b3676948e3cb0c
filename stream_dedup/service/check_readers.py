"""The check process's two readers: each check's index reads go to a reader that is not
catching up, so no check waits for a catch-up.

Why: on RocksDB the check process follows the committed index with a secondary instance,
and rocksdict keeps the interpreter lock for the whole of a catch-up (16-37 ms for a
2,000-document batch measured alone, hundreds of milliseconds on a loaded host): in the
process that answers HTTP, every check arriving during a follow waited for its end, and
while the service ingested that wait was the checks' tail (``docs/check.md``). So the
check process is a front (HTTP, the sketch, the scoring) and two reader processes
(:mod:`.check_reader`), each a secondary instance, answer the reads; a reader catches up
only while no check is in flight on it.

**The turn** (:meth:`Readers.follow`, run by the front's main thread at each commit
notice; nothing else starts a catch-up): the *standby* (the reader not answering) catches
up, then becomes the *active* one (new checks go to it); the previous active, once its
checks in flight are done, catches up too, and is the next standby. Catch-ups run one at a
time, each starting after the one before ended, so each newly active reader sees at least
what the reader before it saw: views never go back. A check takes the active reader for
its one request (:meth:`Readers.read`: the :class:`~stream_dedup.dedup.check.CheckReads`
out, the :class:`~stream_dedup.dedup.check.Held` back), so all of a check's reads see one
committed state. What a check sees: every batch committed before the start of the
catch-up that made its reader active (``docs/check.md`` says it in full).

**The connection**: a :mod:`multiprocessing.connection` over a socket pair per reader,
its messages raw bytes (:mod:`.check_wire`; only the start-up's are pickled). Why: the
check process already talks to its service that way; a request is one small message each
way (a few keys out, a few records back), and a socket pair gives both ends end-of-file
when the other dies (a killed front leaves no reader running; a killed reader fails its check's
``recv`` at once). One request at a time per reader (a lock): a reader answers in order
on one thread anyway, and checks arrive at hundreds per second, each read well under a
millisecond. Shared memory would save the copies but not the wake-up.

**Supervision**, as the service supervises the check process
(:mod:`.check_process`): a thread per reader starts it, waits for it to say ready, and
when it dies starts another after a pause, at most ``http.check_restarts`` times in ten
minutes for both; past that :attr:`Readers.failed` says why, and the check process exits
(its service starts it again, counting that restart). A check whose reader dies under it
is asked again of the other. With one reader serving, it answers, and catches up with
checks held back meanwhile (they wait, as before readers existed); with none, checks
answer 503 and the process is not ready.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path

from stream_dedup.core.config import DedupConfig
from stream_dedup.core.payload_dictionary import add_source
from stream_dedup.dedup.check import CheckReads, Held
from stream_dedup.errors import IndexStoreError
from stream_dedup.logs import fields
from stream_dedup.service import check_wire as wire
from stream_dedup.service.check_metrics import CheckMetrics

__all__ = ["Readers"]

log = logging.getLogger("stream_dedup.service.checks")

#: How long a reader may take to start: import, open the index, load its kernels.
START_TIMEOUT_S = 120.0
#: The restarts counted against ``http.check_restarts`` are those of this window.
RESTART_WINDOW_S = 600.0
#: Pause before a restart (a reader that dies at once does not spin).
RESTART_PAUSE_S = 0.5
#: How long a check waits for a reader to serve (one restarting) before a 503.
ACQUIRE_TIMEOUT_S = 5.0


class _Reader:
    """One reader process as the front sees it. ``serving``, ``following`` and
    ``in_flight`` change under :attr:`Readers._cond`; ``conn`` under :attr:`lock`."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.lock = threading.Lock()  # one request at a time on the connection
        self.conn: Connection | None = None
        self.pid: int | None = None
        self.serving = False
        self.following = False  # catching up: no check may be sent to it
        self.in_flight = 0  # checks sent to it and not yet answered
        self.documents = 0  # what it saw at its last catch-up


class Readers:
    """Two reader processes of a RocksDB index at ``where`` (see the module docstring).

    :meth:`start`, then :meth:`read` from any thread (it is a
    :data:`~stream_dedup.dedup.check.HeldReader`), :meth:`follow` from one thread after
    each commit notice, :meth:`close` at the end. ``on_change`` is called with the number
    of serving readers whenever it changes.
    """

    def __init__(
        self,
        where: Path,
        dedup: DedupConfig,
        settings: tuple[str, str, int],
        metrics: CheckMetrics,
        on_change: Callable[[int], None] = lambda n: None,
    ) -> None:
        self._where, self._dedup = where, dedup
        self._log_level, self._log_format, self._most_restarts = settings
        self._metrics = metrics
        self._on_change = on_change
        self._cond = threading.Condition()
        self._readers = (_Reader(0), _Reader(1))
        self._active = 0
        self._stopping = threading.Event()
        self._restarts: deque[float] = deque()
        #: Why the readers were given up on (they kept dying), else ``None``.
        self.failed: str | None = None
        self._threads = [
            threading.Thread(target=self._supervise, args=(r,), name=f"reader-{r.number}")
            for r in self._readers
        ]
        metrics.readers.set(0)
        add_source(self.dictionary)

    def start(self) -> None:
        for thread in self._threads:
            thread.daemon = True
            thread.start()

    def wait_serving(self, timeout_s: float = START_TIMEOUT_S) -> bool:
        """Wait until a reader serves (false: none did in time, or they were given up)."""
        with self._cond:
            self._cond.wait_for(lambda: self.serving() > 0 or self.failed is not None, timeout_s)
            return self.serving() > 0

    def serving(self) -> int:
        """How many readers answer reads now."""
        return sum(r.serving for r in self._readers)

    def documents(self) -> int:
        """The documents the active reader saw at its last catch-up."""
        return self._readers[self._active].documents

    def pids(self) -> list[int | None]:
        """The readers' process ids (``None``: not running), for tests and diagnostics."""
        return [r.pid for r in self._readers]

    # -- a check's reads --------------------------------------------------------------

    def read(self, reads: CheckReads) -> Held:
        """A check's reads, answered by the active reader (by the other, when that one
        dies under it). :class:`~stream_dedup.errors.IndexStoreError` when no reader
        serves, or the reader could not read the index."""
        return wire.decode_held(self._request(wire.encode_reads(reads), wire.HELD))

    def dictionary(self, ident: int) -> bytes | None:
        """The payload dictionary ``ident`` as the index stores it (``None``: not
        stored). The front's scoring decompresses the candidates' payloads, which name
        their dictionary; it asks once per dictionary (registered with
        :func:`~stream_dedup.core.payload_dictionary.add_source`)."""
        reply = self._request(wire.dictionary_request(ident), wire.DICTIONARY)
        return wire.decode_dictionary(reply)

    def _request(self, request: bytes, kind: bytes) -> bytes:
        """One request's reply (a message of ``kind``) from the active reader, asked again
        of the other when that one dies under it."""
        for _ in range(len(self._readers) + 1):
            reader = self._take()
            try:
                reply = self._ask(reader, request)
            finally:
                self._give(reader)
            if reply is None:
                continue  # it died: asked again of a reader that serves
            if reply[:1] == wire.FAILED:
                reason = reply[1:].decode(errors="replace")
                raise IndexStoreError(f"{self._where}: a check reader could not read: {reason}")
            if reply[:1] != kind:
                raise IndexStoreError(f"{self._where}: a check reader answered {reply[:1]!r}")
            return reply
        raise IndexStoreError(f"{self._where}: the check readers died under a check")

    def _free(self) -> _Reader | None:
        """The reader a check goes to now: the active one, else the other; not one
        catching up or not serving."""
        active = self._readers[self._active]
        for reader in (active, self._readers[1 - self._active]):
            if reader.serving and not reader.following:
                return reader
        return None

    def _take(self) -> _Reader:
        with self._cond:
            if not self._cond.wait_for(self._free, ACQUIRE_TIMEOUT_S):
                raise IndexStoreError(f"{self._where}: no check reader serves")
            reader = self._free()
            assert reader is not None
            reader.in_flight += 1
            return reader

    def _give(self, reader: _Reader) -> None:
        with self._cond:
            reader.in_flight -= 1
            if not reader.in_flight:
                self._cond.notify_all()

    def _ask(self, reader: _Reader, request: bytes) -> bytes | None:
        """One request and its reply (``None``: the reader is gone)."""
        with reader.lock:
            conn = reader.conn
            if conn is None:
                return None
            try:
                conn.send_bytes(request)
                return conn.recv_bytes()
            except (EOFError, OSError):
                self._lost(reader)
                return None

    # -- the turn ---------------------------------------------------------------------

    def follow(self) -> None:
        """One turn after a commit notice: the standby catches up and becomes active,
        then the previous active catches up once its checks are answered."""
        with self._cond:
            previous = self._readers[self._active]
            standby = self._readers[1 - self._active]
        if standby.serving and self._catch_up(standby):
            with self._cond:
                if standby.serving:
                    self._active = standby.number
        if previous.serving:
            self._catch_up(previous)

    def _catch_up(self, reader: _Reader) -> bool:
        """Catch ``reader`` up once no check is in flight on it; none is sent to it
        meanwhile. False when it died."""
        with self._cond:
            reader.following = True
            self._cond.wait_for(lambda: not reader.in_flight or not reader.serving)
        try:
            reply = self._ask(reader, wire.FOLLOW) if reader.serving else None
        finally:
            with self._cond:
                reader.following = False
                self._cond.notify_all()
        if reply is None:
            return False
        seconds, reader.documents = wire.decode_followed(reply)
        self._metrics.follow.observe(seconds)
        return True

    # -- supervision ------------------------------------------------------------------

    def _supervise(self, reader: _Reader) -> None:
        """Start the reader; whenever it dies, start it again (bounded), until closed."""
        while not self._stopping.is_set():
            try:
                self._run_one(reader)
            except Exception as exc:  # it failed to start: counted as a death below
                log.warning(
                    "a check reader failed to start",
                    extra=fields(reader=reader.number, error=str(exc)),
                )
            if self._stopping.is_set() or not self._may_restart(reader):
                return
            self._stopping.wait(RESTART_PAUSE_S)

    def _run_one(self, reader: _Reader) -> None:
        """One reader process: start it, wait until ready, serve until it exits."""
        parent, child = multiprocessing.Pipe(duplex=True)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "stream_dedup.service.check_reader", str(child.fileno())],
                pass_fds=(child.fileno(),),
                stdin=subprocess.DEVNULL,
            )
        finally:
            child.close()
        try:
            parent.send((self._where, self._dedup, (self._log_level, self._log_format)))
            documents = self._wait_ready(parent, proc)
            if documents is None:
                return
            with reader.lock:
                reader.conn, reader.pid = parent, proc.pid
            with self._cond:
                reader.documents, reader.serving = documents, True
                if not self._readers[self._active].serving:
                    self._active = reader.number
                self._cond.notify_all()
            self._changed()
            while proc.poll() is None and not self._stopping.wait(0.25):
                pass
        finally:
            self._lost(reader)
            with contextlib.suppress(OSError), socket.socket(fileno=_dup(parent)) as sock:
                sock.shutdown(socket.SHUT_RDWR)  # wakes a check waiting on it
            with reader.lock:
                reader.conn, reader.pid = None, None
                parent.close()
            _reap(proc, self._stopping.is_set())

    def _wait_ready(self, conn: Connection, proc: subprocess.Popen[bytes]) -> int | None:
        """The documents the new reader sees once it says ready (``None``: closed)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while not conn.poll(0.25):
            if proc.poll() is not None:
                raise RuntimeError(f"it exited with {proc.returncode} before it was ready")
            if self._stopping.is_set():
                return None
            if time.monotonic() > deadline:
                raise RuntimeError(f"not ready within {START_TIMEOUT_S} s")
        kind, pid, documents = conn.recv()
        if kind != "ready":
            raise RuntimeError(f"it said {kind!r}, not ready")
        log.info("a check reader serves", extra=fields(pid=pid, documents=documents))
        return int(documents)

    def _lost(self, reader: _Reader) -> None:
        """``reader`` no longer serves: checks go to the other."""
        with self._cond:
            was = reader.serving
            reader.serving = False
            if self._active == reader.number:
                self._active = 1 - reader.number
            self._cond.notify_all()
        if was:
            self._changed()

    def _changed(self) -> None:
        n = self.serving()
        self._metrics.readers.set(n)
        self._on_change(n)

    def _may_restart(self, reader: _Reader) -> bool:
        """Count a restart; false (and :attr:`failed` set) past the bound."""
        now = time.monotonic()
        with self._cond:
            while self._restarts and now - self._restarts[0] > RESTART_WINDOW_S:
                self._restarts.popleft()
            if len(self._restarts) >= self._most_restarts:
                self.failed = (
                    f"the check readers died {len(self._restarts)} times in "
                    f"{RESTART_WINDOW_S:.0f} s (http.check_restarts)"
                )
                self._cond.notify_all()
                return False
            self._restarts.append(now)
        self._metrics.reader_restarts.inc()
        log.warning(
            "a check reader died; starting it again",
            extra=fields(reader=reader.number, restarts_in_window=len(self._restarts)),
        )
        return True

    def close(self) -> None:
        """Stop both readers and their supervising threads."""
        self._stopping.set()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(10.0)


def _dup(conn: Connection) -> int:
    return os.dup(conn.fileno())


def _reap(proc: subprocess.Popen[bytes], stopping: bool) -> None:
    """Wait for the reader to exit (its connection closed, it stops), else kill it."""
    try:
        proc.wait(5.0 if stopping else 0.5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
