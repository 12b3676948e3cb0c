"""Decoding and sketching in a helper process, one batch ahead of the service loop.

Why a process: decoding a batch's records (:func:`stream_dedup.decode.decode_messages`) and
sketching its documents (normalise, shingle, sign, band; :mod:`stream_dedup.core.sketch`)
depend on the records alone, not on the index, and they are about a third of the
service's CPU. The rest of the loop (index reads, deciding, the RocksDB write, producing)
is Python that holds the interpreter lock, so a thread could not run the sketch beside it;
a process on a second core can. While the loop decides and commits batch N, the worker
decodes and sketches batch N+1, which the loop has already consumed.

The worker is a fresh interpreter (``python -m stream_dedup.service.prefetch.worker``; forking a
process that runs librdkafka threads and RocksDB is unsafe, and ``multiprocessing``'s
spawn would import the embedding program's main module again) joined by a socket pair
and two shared memory regions (:mod:`.shared_memory`): one carries each batch's
records to the worker, the other its decoded records and sketch back; the pipe only says
where they are.
It exits when the pipe closes, which includes the service being killed (``kill -9``):
nothing is left running. It
ignores SIGINT and SIGTERM, which stop the service, so that the batch in hand is still
sketched during a graceful stop; :meth:`SketchWorker.close` ends it.

Deciding is unchanged by where the batch was decoded and sketched: the same functions of
the same bytes (tests check the verdicts are identical). If the worker fails (it raised on
a batch, or it died), :meth:`SketchWorker.result` raises :class:`SketchWorkerError` and
the caller decodes and sketches that batch itself; a dead worker is started again for the
next batch.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection

from stream_dedup.core import jit
from stream_dedup.core.config import DedupConfig
from stream_dedup.core.payload_dictionary import Dictionary, known
from stream_dedup.core.sketch import PackedSketch, Sketch, sketch, sketch_packed, unpack
from stream_dedup.decode import DecodeOutcome, MessageFormat, decode_messages
from stream_dedup.errors import StreamDedupError
from stream_dedup.malloc_tuning import keep_freed_memory
from stream_dedup.service.prefetch.shared_memory import Envelope, SharedRegion, create_region_fd

log = logging.getLogger("stream_dedup.service.prefetch.worker")

#: How long the worker may take to import and load its compiled kernels.
START_TIMEOUT_S = 120.0
#: How much the worker lowers its scheduling priority (``nice``) below the service's.
NICENESS = 5


class SketchWorkerError(StreamDedupError):
    """The worker could not sketch a batch; the caller sketches it in process instead."""


def _serve(conn: Connection, region: SharedRegion, requests: SharedRegion) -> None:
    """The worker's loop: its settings, then records in, documents and sketches out, until EOF.

    A batch's records arrive through the shared ``requests`` region and its reply goes
    through ``region`` (:mod:`.shared_memory`); the pipe only points at them. A
    ``("dictionary", bytes)`` message in between sets the payload dictionary the next
    sketches compress with (the index's, once it has one), and has no reply.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        config: DedupConfig
        records: MessageFormat
        config, records = conn.recv()
    except (EOFError, OSError):
        return
    plan = config.band_plan()
    with jit.forced(True):  # two texts would otherwise take the Python path
        sketch(["warm-up text for the compiled kernels", "warm-up text"], config, plan)
    try:
        conn.send(("ready", None))
    except OSError:
        return  # the service is gone already
    dictionary: Dictionary | None = None
    while True:
        try:
            message = conn.recv()
            if message[0] == "dictionary":
                dictionary = known(message[1])
                continue
            values, keys, positions = requests.take(message)
        except (EOFError, OSError):
            return
        try:
            decoded = decode_messages(values, keys, positions, records)
            contents = decoded[1]
            packed = sketch_packed(contents, config, plan, dictionary) if contents else None
            reply: tuple[str, object] = ("ok", region.put((decoded, packed)))
        except Exception as exc:
            reply = ("error", f"{type(exc).__name__}: {exc}")
        try:
            conn.send(reply)
        except OSError:
            return


class SketchWorker:
    """One helper process that decodes and sketches one batch of records at a time
    (:meth:`submit`, :meth:`result`).

    The process is started by the constructor and loads its kernels while the caller does
    other start-up work; the first :meth:`submit` waits until it is ready.
    """

    def __init__(self, config: DedupConfig, records: MessageFormat | None = None) -> None:
        self._config = config
        self._records = records if records is not None else MessageFormat()
        self._conn: Connection | None = None
        self._region: SharedRegion | None = None
        self._requests: SharedRegion | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._ready = False
        self._busy = False
        self._dictionary: bytes | None = None  # the payload dictionary to sketch with
        self._start()

    def _start(self) -> None:
        parent, child = multiprocessing.Pipe(duplex=True)
        region = SharedRegion(create_region_fd())
        requests = SharedRegion(create_region_fd())
        try:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "stream_dedup.service.prefetch",
                    str(child.fileno()),
                    str(region.fd),
                    str(requests.fd),
                ],
                pass_fds=(child.fileno(), region.fd, requests.fd),
                stdin=subprocess.DEVNULL,
            )
        except BaseException:
            region.close()
            requests.close()
            raise
        finally:
            child.close()
        parent.send((self._config, self._records))
        if self._dictionary is not None:
            parent.send(("dictionary", self._dictionary))
        self._conn, self._proc, self._ready, self._busy = parent, proc, False, False
        self._region, self._requests = region, requests

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def busy(self) -> bool:
        """Whether a submitted batch's result has not been taken yet."""
        return self._busy

    def use_dictionary(self, dictionary: Dictionary | None) -> None:
        """Compress the payloads of the batches submitted from now on with ``dictionary``
        (see :mod:`stream_dedup.dedup.dictionary`); sent to the worker once."""
        raw = None if dictionary is None else dictionary.raw
        if raw == self._dictionary:
            return
        self._dictionary = raw
        if raw is not None and self._conn is not None:
            try:
                self._conn.send(("dictionary", raw))
            except OSError:  # a dead worker: started again, and sent it, at the next submit
                self._stop()

    def submit(
        self,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None = None,
        positions: Sequence[tuple[str, int, int]] | None = None,
    ) -> None:
        """Start decoding and sketching records (see :func:`decode_messages`); take the
        result with :meth:`result` before submitting the next batch."""
        if self._busy:
            raise RuntimeError("take the previous batch's result before submitting another")
        if self._proc is None or self._proc.poll() is not None:
            log.warning(
                "sketch worker not running; starting it again",
                extra={"fields": {"exitcode": self._proc.returncode if self._proc else None}},
            )
            self._stop()
            self._start()
        try:
            if not self._ready:
                self._receive(START_TIMEOUT_S)
                self._ready = True
            assert self._conn is not None and self._requests is not None
            # The worker took its copy of the last request before it replied to it.
            self._conn.send(self._requests.put((values, keys, positions)))
        except (SketchWorkerError, OSError) as exc:
            self._stop()
            raise SketchWorkerError(f"sketch worker failed to start: {exc}") from exc
        self._busy = True

    def result(self) -> tuple[DecodeOutcome, Sketch | None]:
        """The submitted records decoded, and the sketch of their documents (None when
        none decoded); raises :class:`SketchWorkerError` on failure."""
        if not self._busy:
            raise RuntimeError("no batch was submitted")
        self._busy = False
        try:
            kind, value = self._receive(None)
        except SketchWorkerError:
            self._stop()
            raise
        if kind != "ok":
            raise SketchWorkerError(f"sketch worker failed on the batch: {value}")
        assert self._region is not None
        envelope: Envelope = value  # type: ignore[assignment]
        reply: tuple[DecodeOutcome, PackedSketch | None] = self._region.take(envelope)
        decoded, packed = reply
        return decoded, (unpack(packed) if packed is not None else None)

    def discard(self) -> None:
        """Drop the result of the submitted batch, if any (its batch will not be decided)."""
        if self._busy:
            with contextlib.suppress(SketchWorkerError):
                self.result()

    def _receive(self, timeout_s: float | None) -> tuple[str, object]:
        """The worker's next message; waits while it is alive (and within ``timeout_s``)."""
        conn, proc = self._conn, self._proc
        assert conn is not None and proc is not None
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            while not conn.poll(1.0):
                if proc.poll() is not None:
                    raise SketchWorkerError(f"the worker exited with code {proc.returncode}")
                if deadline is not None and time.monotonic() > deadline:
                    raise SketchWorkerError(f"the worker was not ready within {timeout_s} s")
            message: tuple[str, object] = conn.recv()
        except (EOFError, OSError) as exc:
            raise SketchWorkerError(f"the worker exited ({exc or 'pipe closed'})") from exc
        return message

    def close(self, timeout_s: float = 5.0) -> None:
        """End the worker: close its pipe (it exits on EOF), then kill it if it lingers."""
        self._stop(timeout_s)

    def _stop(self, timeout_s: float = 5.0) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._proc is not None:
            try:
                self._proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        for region in (self._region, self._requests):
            if region is not None:
                region.close()
        self._region = self._requests = None
        self._busy = False
        self._ready = False


def main() -> None:
    """Entry point of the worker process: argv[1] is the pipe's descriptor, argv[2] and
    argv[3] those of the reply and request regions.

    The worker owns its process, so it keeps freed memory for the next batch
    (:mod:`stream_dedup.malloc_tuning`): each batch allocates some 50 MB of arrays, and
    without this every batch pays a page fault per 4 KiB of them, a large share of the
    worker's time.

    It also yields the CPU to the service when both want it (:data:`NICENESS`): the
    service's loop is the pipeline's critical path, since it decides and commits every
    batch in order, while the worker, one batch ahead, needs about half a core and has a
    whole batch's time to finish. On a busy machine the loop otherwise waits in the run
    queue behind the worker, the broker and librdkafka's threads; with the worker niced it
    waits less, and the whole service keeps up a higher rate.
    """
    keep_freed_memory()
    with contextlib.suppress(OSError):
        os.nice(NICENESS)  # raising one's own niceness needs no privilege
    _serve(
        Connection(int(sys.argv[1])), SharedRegion(int(sys.argv[2])), SharedRegion(int(sys.argv[3]))
    )
