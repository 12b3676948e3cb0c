"""A decoded batch -> the records to produce: events and dead letters.

The service's step between decoding (:mod:`stream_dedup.service.inputs`) and checkpointing,
:meth:`Decider.build`: decide the documents in the batch's time order
(:class:`~stream_dedup.dedup.Deduplicator`; their sketch may have been computed ahead, by
:mod:`stream_dedup.service.prefetch.worker`), and turn each verdict into an event
(:mod:`stream_dedup.service.events`). Nothing here touches Kafka or writes the index; the result
is made durable by the commit strategy (:mod:`stream_dedup.service.checkpoint`).

Bad input never stops a batch: a message that cannot be decoded, a document whose
deciding raises, and an event the broker refuses for good (:mod:`.refusals`) each become
a dead letter with the reason, counted in ``stream_dedup_dead_letters_total`` (each one)
and logged (one line per reason a minute, with the count of those left out). A broken
environment is not bad input: an index error (:class:`~stream_dedup.errors.IndexStoreError`,
e.g. RocksDB failing to read) or ``OSError``/``MemoryError`` raised while deciding would fail
every document alike, so it stops the service instead (exit code 3 for the index) before
anything of the batch is produced or stored; the batch is decided again after a restart.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import NamedTuple

from confluent_kafka import KafkaError, KafkaException

from stream_dedup.core.sketch import Sketch
from stream_dedup.dedup import BatchResult, Deduplicator
from stream_dedup.dedup.predecide import Predecided
from stream_dedup.errors import IndexStoreError
from stream_dedup.logs import LogThrottle, fields
from stream_dedup.models import Document
from stream_dedup.service.config import ServiceConfig
from stream_dedup.service.events import OutRecord, Source, dead_letter, document_json, event
from stream_dedup.service.inputs import Decoded
from stream_dedup.service.metrics import Metrics
from stream_dedup.service.refusals import Refused, without_value

log = logging.getLogger("stream_dedup.service")

#: Errors of the environment, not of a document: deciding a batch never blames these on
#: its documents (see the module docstring).
ENVIRONMENT_ERRORS: tuple[type[BaseException], ...] = (IndexStoreError, OSError, MemoryError)


@dataclass(frozen=True, slots=True)
class DecidedBatch:
    """What one batch produces: its records (events first, then dead letters), the
    decided batch for the index write, and what replaces a record refused for good."""

    records: list[OutRecord]
    result: BatchResult
    refused: Refused


class Decision(NamedTuple):
    """A batch decided, its records not built: the verdicts and index write, and the
    positions of the documents whose deciding raised on their own (with the error)."""

    result: BatchResult
    failed: list[tuple[int, Exception]]


class Decider:
    """Decides batches and builds what each produces (a :class:`DecidedBatch`), for one
    service configuration."""

    def __init__(
        self,
        config: ServiceConfig,
        dedup: Deduplicator,
        metrics: Metrics,
        log_every_s: float = 60.0,
    ) -> None:
        self.config = config
        self.dedup = dedup
        self.metrics = metrics
        #: A producer sending bad records sends many: one warning per reason per
        #: ``log_every_s``, with the count of those left out; the metric counts each one.
        self._dead_log = LogThrottle(log_every_s)
        self._text = config.input.format == "text"
        #: (unique, duplicate) topics: derived from the input topic, read once.
        self._topics = (config.unique_topic, config.duplicate_topic)
        #: A batch decided before the group's order released it (:meth:`decide_ahead`).
        self._ahead: tuple[Decoded, Predecided] | None = None

    def build(
        self, decoded: Decoded, sketched: Sketch | None = None, *, told: bool = False
    ) -> DecidedBatch:
        """Decide the decoded batch and build its records.

        ``sketched`` is the sketch of ``decoded.docs`` when it was computed ahead (by the
        sketch worker); without it the documents are sketched here. ``told``: an earlier
        build of this batch counted and logged its dead letters already (the shared
        index's strategy builds a batch again after a Redis outage); nothing is counted
        before deciding has succeeded, so a build that raised counted nothing.
        """
        return self.records(decoded, self.decide(decoded, sketched), told=told)

    def decide(self, decoded: Decoded, sketched: Sketch | None = None) -> Decision:
        """The first half of :meth:`build`: the verdicts and the index write, no records.
        A shared index's lease holds this half only; the records, a JSON event per
        document, are built after it (:meth:`records`)."""
        return Decision(*self._decide(decoded.docs, sketched))

    def decide_ahead(self, decoded: Decoded, sketched: Sketch | None = None) -> Sketch | None:
        """:meth:`predecide` ``decoded`` now, before the group's order releases it; the
        result is kept for the :meth:`predecide` of this very batch (the next one, or
        nothing). Its sketch, or None where it is decided in the lease only.

        One batch at a time: inside the lease the index tells the writes since its last
        read as of a version (``written_since``), which a second batch decided ahead
        would move past the first's."""
        pre = self.predecide(decoded, sketched)
        self._ahead = None if pre is None else (decoded, pre)
        return None if pre is None else pre.parts.sk

    def decided_ahead(self, decoded: Decoded) -> bool:
        """Whether :meth:`decide_ahead` holds ``decoded`` decided."""
        return self._ahead is not None and self._ahead[0] is decoded

    def predecide(self, decoded: Decoded, sketched: Sketch | None = None) -> Predecided | None:
        """A shared index's batch decided before the lease (``None``: inside it only):
        the one :meth:`decide_ahead` kept if it is this batch, else decided now.

        A document whose deciding raises is found inside the lease, where the batch is
        then decided again (:meth:`decide`): here nothing is counted or blamed."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] is decoded:
            return ahead[1]
        try:
            return self.dedup.predecide(decoded.docs, sketched)
        except ENVIRONMENT_ERRORS:
            raise
        except Exception:
            return None

    def settle(self, decoded: Decoded, sketched: Sketch | None, pre: Predecided | None) -> Decision:
        """Inside the lease: ``pre`` as deciding now would give it, else :meth:`decide`;
        the documents it decides again are counted."""
        counts = self.dedup.predecided
        again = counts.redecided_docs
        result = None if pre is None else self.dedup.settle(pre)
        self.metrics.redecided.inc(counts.redecided_docs - again)
        return self.decide(decoded, sketched) if result is None else Decision(result, [])

    def records(self, decoded: Decoded, decision: Decision, *, told: bool = False) -> DecidedBatch:
        """The second half of :meth:`build`: each verdict's event, then the dead letters
        (counted and logged here unless ``told``)."""
        cfg = self.config
        result, failed = decision
        bad: list[tuple[Source, str, Exception, str]] = [
            (src, exc.reason, exc, "decode") for src, exc in decoded.undecodable
        ]
        bad += [(decoded.sources[i], "processing_error", e, "process") for i, e in failed]
        dead = [
            dead_letter(src, cfg.dlq_topic, reason, exc, stage)
            if told
            else self.dead_letter(src, reason, exc, stage)
            for src, reason, exc, stage in bad
        ]
        failed_idx = {i for i, _ in failed}
        kept = [s for i, s in enumerate(decoded.sources) if i not in failed_idx]
        records: list[OutRecord] = []
        for source, verdict in zip(kept, result.verdicts, strict=True):
            topic = self._topics[verdict.is_duplicate]
            document = (
                document_json(source.value, text=self._text)
                if cfg.output.include_document and source.value is not None
                else None
            )
            records.append(event(verdict, source, document, topic))
        records.extend(dead)

        return DecidedBatch(records, result, self._refusals(records, kept))

    def _refusals(self, records: list[OutRecord], kept: list[Source]) -> Refused:
        """What replaces a record of this batch refused for good (:mod:`.refusals`): an
        event -> its message's dead letter; a dead letter -> itself without its value."""
        sources = {id(rec): source for rec, source in zip(records, kept, strict=False)}
        refused_total = self.metrics.refused

        def refused(rec: OutRecord, err: KafkaError) -> OutRecord:
            source = sources.pop(id(rec), None)
            if source is not None:
                refused_total.labels("event").inc()
                return self.dead_letter(source, "refused", KafkaException(err), "produce")
            refused_total.labels("dead_letter").inc()
            replacement = without_value(rec, err)
            suppressed = self._dead_log.admit("refused dead letter")
            if suppressed is not None:
                log.warning(
                    "dead letter refused; sent without its value",
                    extra=fields(
                        error=err.str(),
                        dlq_topic=rec.topic,
                        suppressed=suppressed,
                        action="the input message stays at the offset its headers name; "
                        "raise the dead-letter topic's max.message.bytes to keep the value",
                    ),
                )
            return replacement

        return refused

    def _decide(
        self, docs: list[Document], sketched: Sketch | None
    ) -> tuple[BatchResult, list[tuple[int, Exception]]]:
        """Decide the batch; if that raises, find the documents that fail on their own.

        The failing documents are dead-lettered (``processing_error``) and the rest decided
        together. Deciding is deterministic, so a replay isolates the same documents. An
        :data:`ENVIRONMENT_ERRORS` exception propagates, from the batch or from any single
        document: the index or the machine failed, and blaming the documents would
        dead-letter, and commit, a batch of good ones.
        """
        if not docs:
            return BatchResult.empty(), []
        try:
            return self.dedup.decide(docs, sketched), []
        except ENVIRONMENT_ERRORS:
            raise
        except Exception as batch_exc:
            failed: list[tuple[int, Exception]] = []
            for i, doc in enumerate(docs):
                try:
                    self.dedup.decide([doc])
                except ENVIRONMENT_ERRORS:
                    raise
                except Exception as exc:
                    failed.append((i, exc))
            if not failed:
                raise batch_exc
            bad = {i for i, _ in failed}
            rest = [d for i, d in enumerate(docs) if i not in bad]
            return (self.dedup.decide(rest) if rest else BatchResult.empty()), failed

    def dead_letter(self, source: Source, reason: str, exc: BaseException, stage: str) -> OutRecord:
        """The dead letter for ``source``, counted, and logged (the first of its reason,
        then one a minute carrying ``suppressed``: how many of that reason went unlogged)."""
        self.metrics.dead_letters.labels(reason).inc()
        suppressed = self._dead_log.admit(reason)
        if suppressed is not None:
            log.warning(
                "message dead-lettered",
                extra=fields(
                    reason=reason,
                    error=str(exc)[:500],
                    topic=source.topic,
                    partition=source.partition,
                    offset=source.offset,
                    dlq_topic=self.config.dlq_topic,
                    suppressed=suppressed,
                    action="inspect the record in the dead-letter topic; fix the producer",
                ),
            )
        return dead_letter(source, self.config.dlq_topic, reason, exc, stage)
