"""One batch ahead of the loop, decoded and sketched by the worker while the loop decides.

The service loop hands each batch it collected (in time order, with its sources:
:class:`~stream_dedup.service.inputs.MessageBatch`) to :meth:`SketchAhead.advance`, which takes the
worker's result for the batch handed in before it, gives the worker the new batch, and
only then processes the earlier one: the worker (:mod:`stream_dedup.service.prefetch.worker`)
decodes and sketches batch N+1 on one core while the loop decides and commits batch N on
the other. Batches are still processed one at a time and in the order they were
collected, so the commit protocol (:mod:`stream_dedup.service.checkpoint`) is unchanged; a batch
held here has not been decided, and nothing of it has left the process.

Without a worker (``service.sketch_worker = false``), or for a batch the worker fails on,
the batch is decoded and sketched in the service process when it is processed: the
verdicts are the same either way. So is a batch that arrives while the worker is idle,
with nothing held: there is no batch being decided for the worker's work to overlap with.
A small one (at most ``service.sketch_inline_max`` messages) is sketched here whole: its
round trip (waking a niced process on a busy machine and waiting for it) costs more
latency than sketching a few documents here. A larger one is split: its first third is
decoded, sketched and decided here while the worker sketches the rest, which is then held
as the next batch. Deciding a document takes about twice as long as sketching one, so the
worker is done about when this side is, instead of the loop waiting for a whole batch's
sketch each time it starts from idle, e.g. with a backlog after a restart.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from confluent_kafka import Message

from stream_dedup.core.config import DedupConfig
from stream_dedup.core.payload_dictionary import Dictionary
from stream_dedup.core.sketch import Sketch
from stream_dedup.service.inputs import Decoded, InputDecoder, MessageBatch
from stream_dedup.service.prefetch.worker import SketchWorker, SketchWorkerError

log = logging.getLogger("stream_dedup.service")

#: Decides and checkpoints one decoded batch, given its sketch if it was computed ahead.
Process = Callable[[Decoded, Sketch | None], None]


class SketchAhead:
    """Holds at most one batch that the worker is decoding and sketching."""

    def __init__(
        self,
        config: DedupConfig | None,
        decoder: InputDecoder,
        on_failure: Callable[[SketchWorkerError], None],
        inline_max: int = 0,
        dictionary: Callable[[], Dictionary | None] = lambda: None,
    ) -> None:
        """``config`` None: no worker; every batch is processed as soon as it is handed in.

        A batch handed in while no batch is held is processed here at once: all of it if
        it has at most ``inline_max`` messages, else its first third, the rest going to
        the worker (0: every batch goes to the worker whole). The worker starts loading
        at once (a second or so), while the caller starts up. ``dictionary`` gives the
        payload dictionary in use when a batch is handed over (it changes once, when the
        index trains one: :mod:`stream_dedup.dedup.dictionary`).
        """
        self._decoder = decoder
        self._dictionary = dictionary
        self._on_failure = on_failure
        self._inline_max = inline_max
        self._worker: SketchWorker | None = None
        if config is not None:
            try:
                self._worker = SketchWorker(config, decoder.message_format)
            except OSError as exc:  # no process could be started: sketch in process
                on_failure(SketchWorkerError(f"cannot start the sketch worker: {exc}"))
        self._ahead: MessageBatch | None = None
        #: Records handed to the worker for a later batch (:meth:`sketch_early`), with
        #: the messages they were asked for by.
        self._early: tuple[list[Message], MessageBatch] | None = None
        #: Documents whose sketch the worker gave back to be decided (the service's
        #: ``stream_dedup_sketched_documents_total{by="worker"}``).
        self.worker_sketched = 0

    @property
    def holding(self) -> bool:
        """Whether a batch is waiting to be processed (then the loop should not block)."""
        return self._ahead is not None

    @property
    def idle(self) -> bool:
        """Whether the worker has nothing to do (it could :meth:`sketch_early`)."""
        return self._worker is not None and self._ahead is None and self._early is None

    def advance(self, records: MessageBatch | None, process: Process) -> None:
        """Process the batch held, after handing the worker ``records`` (if any).

        Without a worker, or when handing it over fails, ``records`` is decoded and
        processed here, after the batch held; when none is held, all or the first part of
        it is (see the constructor). Batches are always processed in the order handed in,
        and a part here before the part held.
        """
        if records is not None:
            self._drop_early()
        ahead, self._ahead = self._ahead, None
        done = self._result(ahead) if ahead is not None else None
        here = records
        if records is not None:
            here, rest = records.split(self._keep_here(len(records.sources), ahead is None))
            if rest.sources and self._submit(rest):
                self._ahead = rest
            else:
                here = records
        if done is not None:
            process(*done)
        if here is not None and (here.sources or self._ahead is None):
            process(self._decoder.decode(here), None)

    def _keep_here(self, size: int, idle: bool) -> int:
        """How many of a new batch's first messages to decode and sketch here."""
        if self._worker is None:
            return size
        if not idle or self._inline_max == 0:
            return 0
        return size if size <= self._inline_max else size // 3

    def sketch_early(self, key: list[Message], records: MessageBatch) -> bool:
        """Have the worker decode and sketch ``records`` (``key``'s messages in time
        order), expected to be a later batch, if it has nothing else to do; True if it
        took them. :meth:`take_early` takes the result.

        The group's order on a shared index asks it: its batches come one turn at a
        time, each released only once the one before is stored, so no batch is ever
        held here while another is decided; but an instance knows its next turn (its
        records of the next tick), and the worker sketches that while it decides this
        one (``docs/group-order.md``)."""
        if self._worker is None or self._ahead is not None or self._early is not None:
            return False
        if not records.sources or not self._submit(records):
            return False
        self._early = (key, records)
        return True

    def take_early(self, key: list[Message]) -> tuple[Decoded, Sketch | None] | None:
        """The worker's result for ``key``'s messages when they are what
        :meth:`sketch_early` was given, else None (the worker's work is dropped)."""
        early, self._early = self._early, None
        if early is None:
            return None
        asked, records = early
        if len(asked) != len(key) or any(a is not b for a, b in zip(asked, key, strict=True)):
            self._discard()
            return None
        return self._result(records)

    def _drop_early(self) -> None:
        """Forget the records handed early: the worker is wanted for a batch now."""
        if self._early is not None:
            self._early = None
            self._discard()

    def _discard(self) -> None:
        if self._worker is not None:
            self._worker.discard()

    def drain(self, process: Process) -> None:
        """Process the batch held, if any (before partitions are revoked, or a stop)."""
        self._drop_early()
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            process(*self._result(ahead))

    def take_back(self) -> list[Message]:
        """Give up the batch held without deciding it: its messages, to be collected again."""
        self._drop_early()
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return []
        self._discard()
        return ahead.batch

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()

    def _submit(self, records: MessageBatch) -> bool:
        """Give the worker ``records``; False when they are decoded and sketched here."""
        if self._worker is None:
            return False
        try:
            self._worker.use_dictionary(self._dictionary())
            self._worker.submit(*self._decoder.request(records))
        except SketchWorkerError as exc:
            self._on_failure(exc)
            return False
        return True

    def _result(self, records: MessageBatch) -> tuple[Decoded, Sketch | None]:
        """``records`` decoded, with their sketch: the worker's, or (after it failed) None
        and decoded here, to be sketched in process."""
        assert self._worker is not None
        try:
            decoded, sketched = self._worker.result()
        except SketchWorkerError as exc:
            self._on_failure(exc)
            return self._decoder.decode(records), None
        if sketched is not None:
            self.worker_sketched += sketched.size
        return self._decoder.assemble(records, decoded), sketched
