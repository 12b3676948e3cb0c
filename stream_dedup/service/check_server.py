"""The check process itself: ``POST /check`` and ``/check/batch`` answered from followers
of the committed index, on the port its service bound (``http.check_port``).

Started by :class:`~stream_dedup.service.check_process.CheckProcess` as a fresh
interpreter (``python -m stream_dedup.service.check_server CONN NOTICES SOCKET``, three
inherited descriptors), for the reasons the sketch worker is (:mod:`.prefetch.worker`):
forking a process that runs librdkafka threads and RocksDB is unsafe. It receives the
service's settings on ``CONN`` and serves the listening ``SOCKET`` with the service's own
HTTP handler and check endpoint (:mod:`.http`, :mod:`.check_http`); its port also
answers ``/metrics`` (its requests and latency, the process's CPU and memory),
``/healthz`` and ``/readyz``.

On RocksDB it is a front: it sketches and scores, and two reader processes
(:mod:`.check_readers`), each a secondary instance, answer each check's reads and catch
up in turn, so no check waits for a catch-up (rocksdict keeps the interpreter lock for a
catch-up's whole length). On Redis it follows the index itself (a
:class:`~stream_dedup.index.follower.FollowerIndex`: the records are read live, following
re-reads a few keys). It says ``ready`` once its reads are answered (on RocksDB: once a
reader serves), then ``("readers", n)`` whenever the number of serving readers changes,
so that the service's readiness follows.

``NOTICES`` is a pipe on which the service writes a byte after each commit. The main
thread waits on it and takes a turn (:meth:`.check_readers.Readers.follow`, or the
follower's follow) for every notice so far; each catch-up is timed
(``stream_dedup_check_follow_seconds``). Without a notice for a second it follows
anyway (other instances of a shared Redis index commit too). The pipe's end of file is the
service gone, killed included: the process then stops, and its readers with it, leaving
nothing running. SIGINT and SIGTERM are ignored, as the sketch worker ignores them: the
service stops it.

On Redis an outage is ridden out as the service rides it out (``index.redis``): while
the index cannot be reached, opening it is tried again each second and a follow that
fails leaves the process up but not serving (``/readyz`` 503, checks 503 with the reason);
the next follow that reaches it serves again. Dying instead would spend the service's
``http.check_restarts`` within seconds and leave checks unanswered once Redis is back.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path

from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector

from stream_dedup.core import jit
from stream_dedup.core.sketch import sketch
from stream_dedup.dedup.check import HeldReader, check_texts
from stream_dedup.errors import IndexStoreError, IndexUnreachableError
from stream_dedup.index.follower import FollowerIndex
from stream_dedup.index.opener import Location, RedisSettings, open_follower
from stream_dedup.index.store import DedupIndex
from stream_dedup.logs import fields, setup_logging
from stream_dedup.service.check_http import CheckEndpoint
from stream_dedup.service.check_metrics import CheckMetrics
from stream_dedup.service.check_readers import Readers
from stream_dedup.service.config import ServiceConfig
from stream_dedup.service.http import HttpEndpoints

log = logging.getLogger("stream_dedup.service.checks")

#: Without a notice for this long, the index is followed anyway.
_FOLLOW_EVERY_S = 1.0


class Notices:
    """The service's commit notices: a non-blocking pipe, read whole at each look."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        os.set_blocking(fd, False)
        self.gone = False  # the service closed its end (it stopped, or died)

    def moved(self) -> bool:
        """Whether a commit was announced since the last look (the main thread alone
        reads)."""
        seen = False
        while True:
            try:
                chunk = os.read(self.fd, 4096)
            except BlockingIOError:
                return seen
            except OSError as exc:
                if exc.errno != errno.EBADF:
                    raise
                chunk = b""
            if not chunk:
                self.gone = True
                return seen
            seen = True


class _OwnFollower:
    """The check process following the index itself (a shared Redis index: nothing to
    catch up, the records are read live; following re-reads the counters and epochs)."""

    def __init__(self, index: FollowerIndex, metrics: CheckMetrics) -> None:
        self.index = index
        self._metrics = metrics
        self.failed: str | None = None
        self.reachable = True  # false from a follow that could not reach the index

    def reads(self) -> DedupIndex | HeldReader:
        return self.index

    def documents(self) -> int:
        return self.index.counter("documents")

    def serving(self) -> int:
        return 1 if self.reachable else 0

    def follow(self) -> None:
        """Re-read the index's state; an index out of reach is not a failure of this
        process (see the module docstring): it stops serving until a follow reaches it."""
        started = time.perf_counter()
        try:
            self.index.follow()
        except IndexUnreachableError as exc:
            if self.reachable:
                log.warning(
                    "the index is unreachable; checks are refused until it is back",
                    extra=fields(error=str(exc)),
                )
            self.reachable = False
            return
        self._metrics.follow.observe(time.perf_counter() - started)
        if not self.reachable:
            log.info("the index is reachable again; checks are answered")
            self.reachable = True

    def close(self) -> None:
        self.index.close()


class _FromReaders:
    """The check process as a front of two RocksDB readers (:mod:`.check_readers`)."""

    def __init__(self, readers: Readers) -> None:
        self.readers = readers

    @property
    def failed(self) -> str | None:
        return self.readers.failed

    def reads(self) -> DedupIndex | HeldReader:
        return self.readers.read

    def documents(self) -> int:
        return self.readers.documents()

    def serving(self) -> int:
        return self.readers.serving()

    def follow(self) -> None:
        self.readers.follow()

    def close(self) -> None:
        self.readers.close()


def _source(
    config: ServiceConfig, metrics: CheckMetrics, tell: Callable[[int], None], notices: Notices
) -> _OwnFollower | _FromReaders:
    """What answers the checks' reads: two readers of a RocksDB index (started, one
    serving), or a follower in this process (a Redis index, or ``http.check_readers``
    off)."""
    where = config.index.location()
    if isinstance(where, RedisSettings) or where is None or not config.http.check_readers:
        return _OwnFollower(_open_follower(where, notices), metrics)
    path = Path(where)
    settings = (config.log.level, config.log.format, config.http.check_restarts)
    readers = Readers(path, config.dedup, settings, metrics, tell)
    readers.start()
    if not readers.wait_serving():
        readers.close()
        raise IndexStoreError(readers.failed or f"{path}: no check reader started")
    return _FromReaders(readers)


def _open_follower(where: Location, notices: Notices) -> FollowerIndex:
    """The follower of ``where``, opened once the index can be reached (tried each second
    while the service lives: its own start waits for Redis the same way)."""
    said = False
    while True:
        try:
            return open_follower(where)
        except IndexUnreachableError as exc:
            if notices.gone:
                raise
            if not said:
                log.warning(
                    "the index is unreachable; the check process waits for it",
                    extra=fields(error=str(exc)),
                )
                said = True
            select.select([notices.fd], [], [], _FOLLOW_EVERY_S)
            notices.moved()


def _warm_up(reads: DedupIndex | HeldReader, config: ServiceConfig) -> None:
    """Load the compiled kernels and run one check, before saying ready: the first real
    check must not pay for either."""
    plan = config.dedup.band_plan()
    with jit.forced(True):
        sketch(["warm-up text for the compiled kernels", "warm-up text"], config.dedup, plan)
    check_texts(reads, config.dedup, plan, ["warm-up text for the check path"], 1)


def serve(conn: Connection, notices: Notices, sock: socket.socket) -> None:
    """Open the index's readers (or follower), serve the checks, follow the commits until
    the service goes."""
    config: ServiceConfig = conn.recv()
    setup_logging(config.log.level, config.log.format)
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    metrics = CheckMetrics(registry)
    telling = threading.Lock()
    said_ready = False

    def tell(serving: int) -> None:
        """Tell the service how many readers serve (its readiness follows)."""
        with telling:
            if said_ready:
                with contextlib.suppress(OSError):
                    conn.send(("readers", serving))

    source = _source(config, metrics, tell, notices)
    open_now = True
    http = HttpEndpoints(
        config.http.host,
        sock.getsockname()[1],
        registry,
        lambda: (True, {"role": "checks"}),
        lambda: (
            open_now and source.serving() > 0,
            {"role": "checks", "documents": source.documents(), "readers": source.serving()},
        ),
        sock=sock,
    )
    http.checks = CheckEndpoint(
        source.reads(),
        (config.dedup, config.dedup.band_plan()),
        config.input.document_format(),
        config.http,
        metrics,
        lambda: open_now and source.serving() > 0,
    )
    try:
        _warm_up(source.reads(), config)
        http.start()
        with telling:
            conn.send(("ready", os.getpid()))
            said_ready = True
        while not notices.gone and source.failed is None:
            select.select([notices.fd], [], [], _FOLLOW_EVERY_S)
            notices.moved()  # every notice so far: one turn covers them all
            source.follow()
        if source.failed is not None:
            raise IndexStoreError(source.failed)
    finally:
        open_now = False
        http.stop()
        source.close()


def main() -> None:
    """Entry point: argv[1] the settings pipe, argv[2] the notices, argv[3] the socket."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    conn = Connection(int(sys.argv[1]))
    try:
        serve(conn, Notices(int(sys.argv[2])), socket.socket(fileno=int(sys.argv[3])))
    except (EOFError, BrokenPipeError):
        return  # the service went away while this process started
    except BaseException as exc:
        with contextlib.suppress(OSError):
            conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        raise


if __name__ == "__main__":
    main()
