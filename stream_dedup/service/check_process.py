"""The check process: the service's checks answered outside the process that decides.

Why: a check is ~1.5 ms of Python, and in the deciding process every step of it waits for
the interpreter lock, which the loop holds while it decides a batch and for the whole of a
commit's RocksDB write (80-190 ms for a 2,000-document batch on a shared 2-CPU machine):
at 200 checks/s while ingesting 5,000 docs/s offered, p99 was 211 ms
(``docs/benchmarks.md``). A process of its own has its own interpreter lock.

How requests reach it: on a port of its own, ``http.check_port``. The service binds it
(a busy port is a :class:`~stream_dedup.errors.ConfigError` at start, as for
``http.port``) and hands the listening socket to the process (:mod:`.check_server`), which
accepts and answers; the service never reads a check's bytes. The socket stays bound in
the service across restarts of the process, so a client's connection made while the
process restarts waits in the socket's queue instead of being refused. ``POST /check`` on
the service's own port answers 421 naming the check port.

What it reads: followers of the committed index (on RocksDB two reader processes of its
own, which catch up in turn: :mod:`.check_readers`), which the service keeps in step by
writing a byte to a pipe after each commit (:meth:`CheckProcess.notify`, a non-blocking
write: a commit never waits for the process). A check sees the batches committed up to
its reader's last catch-up (``docs/check.md`` says exactly which) and never the batch
being decided.

Supervision: a thread of the service's watches the process. Dead (killed, crashed), it
is started again after a short pause, at most ``http.check_restarts`` times in ten
minutes, then given up on with an error in the log; meanwhile and after, ``/readyz``
fails with ``checks`` saying why, and ``stream_dedup_check_process_up`` is 0
(``stream_dedup_check_process_restarts_total`` counts the restarts). The same holds
while the process serves but none of its readers does (it says so: ``restarting``).
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
from multiprocessing.connection import Connection

from stream_dedup.logs import fields
from stream_dedup.service.check_metrics import CheckProcessMetrics
from stream_dedup.service.config import ServiceConfig
from stream_dedup.service.http import cannot_listen

log = logging.getLogger("stream_dedup.service.checks")

#: How long the process may take to start: import, open the index, load its kernels.
START_TIMEOUT_S = 120.0
#: The restarts counted against ``http.check_restarts`` are those of this window.
RESTART_WINDOW_S = 600.0
#: Pause before a restart (a process that dies at once does not spin).
RESTART_PAUSE_S = 0.5


def bind_check_port(host: str, port: int) -> socket.socket:
    """The listening socket of the check port (``port`` 0: any free one)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise cannot_listen(host, port, exc, "http.check_port") from exc
    return sock


class CheckProcess:
    """Starts, feeds and supervises the check process (see the module docstring).

    Construct it (binds the port), :meth:`start` once the index is open and its key
    filter built, :meth:`notify` after each commit, :meth:`close` at the end.
    """

    def __init__(self, config: ServiceConfig, metrics: CheckProcessMetrics) -> None:
        self._config = config
        self._metrics = metrics
        self._sock = bind_check_port(config.http.host, config.http.check_port)
        self._lock = threading.Lock()  # the notice pipe's end, swapped at each restart
        self._notice: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        self._restarts: deque[float] = deque()
        #: ``starting``, ``serving``, ``restarting``, ``failed`` or ``stopped``.
        self.state = "starting"
        self._thread = threading.Thread(target=self._supervise, name="checks", daemon=True)
        metrics.up.set(0)

    @property
    def port(self) -> int:
        port: int = self._sock.getsockname()[1]
        return port

    @property
    def pid(self) -> int | None:
        """The process's id while one runs (for tests and diagnostics)."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def start(self) -> None:
        """Start the process and the thread that restarts it (it answers once ready)."""
        self._thread.start()

    def notify(self) -> None:
        """Tell the process a batch was committed (called by the loop after each commit:
        one non-blocking write of a byte; a full pipe already holds a notice)."""
        with self._lock:
            if self._notice is None:
                return
            with contextlib.suppress(BlockingIOError, BrokenPipeError):
                os.write(self._notice, b"c")

    def ready(self) -> tuple[bool, dict[str, object]]:
        """Whether checks are answered now, and the details ``/readyz`` shows."""
        return self.state == "serving", {"checks": self.state, "check_port": self.port}

    def _supervise(self) -> None:
        """Start the process; whenever it dies, start it again (bounded), until closed."""
        while not self._stopping.is_set():
            try:
                self._run_one()
            except Exception as exc:  # it failed to start: counted as a death below
                log.warning("the check process failed to start", extra=fields(error=str(exc)))
            self._metrics.up.set(0)
            if self._stopping.is_set():
                return
            if not self._may_restart():
                return
            self._stopping.wait(RESTART_PAUSE_S)

    def _run_one(self) -> None:
        """One process: start it, wait until ready, then until it exits (or is closed)."""
        notice_r, notice_w = os.pipe()
        os.set_blocking(notice_w, False)
        parent, child = multiprocessing.Pipe(duplex=True)
        fds = (child.fileno(), notice_r, self._sock.fileno())
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "stream_dedup.service.check_server", *map(str, fds)],
                pass_fds=fds,
                stdin=subprocess.DEVNULL,
            )
        finally:
            child.close()
            os.close(notice_r)
        with self._lock:
            self._proc, self._notice = proc, notice_w
        try:
            parent.send(self._config)
            self._wait_ready(parent, proc)
            while proc.poll() is None and not self._stopping.is_set():
                if parent.poll(0.25):
                    try:
                        self._heard(parent.recv())
                    except (EOFError, OSError):
                        break  # it died: reaped below, then started again
        finally:
            with self._lock:
                self._notice = None
            os.close(notice_w)  # the process's end of file: it stops
            parent.close()
            self._reap(proc)

    def _wait_ready(self, conn: Connection, proc: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not conn.poll(0.25):
            if proc.poll() is not None or self._stopping.is_set():
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"not ready within {START_TIMEOUT_S} s")
        kind, value = conn.recv()
        if kind != "ready":
            raise RuntimeError(str(value))
        self.state = "serving"
        self._metrics.up.set(1)
        log.info("the check process answers checks", extra=fields(port=self.port, pid=value))

    def _heard(self, message: tuple[str, int]) -> None:
        """How many of its readers serve, as the process says when that changes: with
        none, checks are not answered (the readers are being started again)."""
        kind, serving = message
        if kind == "readers" and self.state in ("serving", "restarting"):
            self.state = "serving" if serving else "restarting"
            self._metrics.up.set(1 if serving else 0)

    def _may_restart(self) -> bool:
        """Count a restart; false (and the state ``failed``) past the bound."""
        now = time.monotonic()
        while self._restarts and now - self._restarts[0] > RESTART_WINDOW_S:
            self._restarts.popleft()
        most = self._config.http.check_restarts
        if len(self._restarts) >= most:
            self.state = "failed"
            log.error(
                "the check process keeps dying; checks are no longer answered",
                extra=fields(
                    restarts=len(self._restarts),
                    window_s=RESTART_WINDOW_S,
                    action="see its errors above; restart the service (ingest goes on)",
                ),
            )
            return False
        self._restarts.append(now)
        self._metrics.restarts.inc()
        self.state = "restarting"
        log.warning(
            "the check process died; starting it again",
            extra=fields(restarts_in_window=len(self._restarts), limit=most),
        )
        return True

    def _reap(self, proc: subprocess.Popen[bytes]) -> None:
        try:
            proc.wait(5.0 if self._stopping.is_set() else 0.5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def close(self) -> None:
        """Stop the process and the supervising thread; release the port."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(10.0)
        self.state = "stopped"
        self._metrics.up.set(0)
        self._sock.close()
