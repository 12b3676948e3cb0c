"""One batch ahead of the loop, decoded and sketched by the worker while the loop decides.

The service loop hands each batch it collected (in the canonical order, with its sources:
:class:`~stream_dedup.inputs.Records`) to :meth:`SketchAhead.advance`, which takes the
worker's result for the batch handed in before it, gives the worker the new batch, and
only then processes the earlier one: the worker (:mod:`stream_dedup.sketch_worker`)
decodes and sketches batch N+1 on one core while the loop decides and commits batch N on
the other. Batches are still processed one at a time and in the order they were
collected, so the commit protocol (:mod:`stream_dedup.checkpoint`) is unchanged; a batch
held here has not been decided, and nothing of it has left the process.

Without a worker (``service.sketch_worker = false``), or for a batch the worker fails on,
the batch is decoded and sketched in the service process when it is processed: the
verdicts are the same either way. So is a small batch that arrives while the worker is
idle (``service.sketch_inline_max``): at light load there is no batch being decided for
the worker's work to overlap with, and its round trip (waking a niced process on a busy
machine and waiting for it, ~3 ms per batch at 1,000 docs/s) costs more latency than
sketching a few documents here (~40 us each).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from confluent_kafka import Message

from stream_dedup.config import DedupConfig
from stream_dedup.inputs import BatchDecoder, Decoded, Records
from stream_dedup.sketch import Sketch
from stream_dedup.sketch_worker import SketchWorker, SketchWorkerError

log = logging.getLogger("stream_dedup.service")

#: Decides and checkpoints one decoded batch, given its sketch if it was computed ahead.
Process = Callable[[Decoded, Sketch | None], None]


class SketchAhead:
    """Holds at most one batch that the worker is decoding and sketching."""

    def __init__(
        self,
        config: DedupConfig | None,
        decoder: BatchDecoder,
        on_failure: Callable[[SketchWorkerError], None],
        inline_max: int = 0,
    ) -> None:
        """``config`` None: no worker; every batch is processed as soon as it is handed in.

        A batch of at most ``inline_max`` messages handed in while no batch is held is
        processed at once, here, not handed to the worker (0: every batch goes to it).
        The worker starts loading at once (a second or so), while the caller starts up.
        """
        self._decoder = decoder
        self._on_failure = on_failure
        self._inline_max = inline_max
        self._worker: SketchWorker | None = None
        if config is not None:
            try:
                self._worker = SketchWorker(config, decoder.record_format)
            except OSError as exc:  # no process could be started: sketch in process
                on_failure(SketchWorkerError(f"cannot start the sketch worker: {exc}"))
        self._ahead: Records | None = None

    @property
    def holding(self) -> bool:
        """Whether a batch is waiting to be processed (then the loop should not block)."""
        return self._ahead is not None

    def advance(self, records: Records | None, process: Process) -> None:
        """Process the batch held, after handing the worker ``records`` (if any).

        Without a worker, when handing it over fails, or when ``records`` is a small batch
        and none is held, ``records`` is decoded and processed here, after the batch held:
        batches are always processed in the order handed in.
        """
        ahead, self._ahead = self._ahead, None
        done = self._result(ahead) if ahead is not None else None
        small = ahead is None and records is not None and len(records.sources) <= self._inline_max
        if records is not None and not small and self._submit(records):
            self._ahead = records
        if done is not None:
            process(*done)
        if records is not None and self._ahead is not records:
            process(self._decoder.decode(records), None)

    def drain(self, process: Process) -> None:
        """Process the batch held, if any (before partitions are revoked, or a stop)."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            process(*self._result(ahead))

    def take_back(self) -> list[Message]:
        """Give up the batch held without deciding it: its messages, to be collected again."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return []
        if self._worker is not None:
            self._worker.discard()
        return ahead.batch

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()

    def _submit(self, records: Records) -> bool:
        """Give the worker ``records``; False when they are decoded and sketched here."""
        if self._worker is None:
            return False
        try:
            self._worker.submit(*self._decoder.request(records))
        except SketchWorkerError as exc:
            self._on_failure(exc)
            return False
        return True

    def _result(self, records: Records) -> tuple[Decoded, Sketch | None]:
        """``records`` decoded, with their sketch: the worker's, or (after it failed) None
        and decoded here, to be sketched in process."""
        assert self._worker is not None
        try:
            decoded, sketched = self._worker.result()
        except SketchWorkerError as exc:
            self._on_failure(exc)
            return self._decoder.decode(records), None
        return self._decoder.assemble(records, decoded), sketched
