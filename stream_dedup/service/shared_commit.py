"""The commit strategies of a shared index: decide and store under its lease, then deliver.

The reverse of the order of an index one instance owns (:mod:`.checkpoint`), because the
other instances must see a batch's documents before this one lets the lease go; why it
loses nothing is in ``docs/shared-index.md``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaException, TopicPartition

from stream_dedup.core.sketch import Sketch
from stream_dedup.dedup import BatchResult
from stream_dedup.errors import IndexUnreachableError
from stream_dedup.logs import fields
from stream_dedup.service.commit_strategy import CommitStrategy, Offsets, T, next_offsets
from stream_dedup.service.config import ServiceConfig
from stream_dedup.service.decide import DecidedBatch, Decider, Decision
from stream_dedup.service.index_outage import IndexOutage
from stream_dedup.service.inputs import Decoded
from stream_dedup.service.kafka import EventProducer
from stream_dedup.service.lost_index import BROKER_TIMEOUT_S
from stream_dedup.service.metrics import Metrics
from stream_dedup.service.ranges import Ranges, TpKey

__all__ = ["SharedExactlyOnce", "SharedIndex"]

log = logging.getLogger("stream_dedup.service")


@dataclass(slots=True)
class _Pending:
    """A batch stored and produced whose delivery is not confirmed yet: its next offsets,
    and the seconds its produce took (counted in the checkpoint's duration)."""

    offsets: Offsets
    produce_s: float


class SharedIndex(CommitStrategy):
    """Decide and store under the shared index's lease, deliver outside it.

    The reverse of the owned index's order, because other instances must see the batch's
    documents before this one lets the lease go. Nothing is lost by it: the offsets are
    stored only after the events are confirmed, and a batch consumed again after a crash
    between the two finds every verdict stored and re-emits identical events
    (``docs/shared-index.md``). There are no intents: ``replaying`` is never true here.

    A Redis outage is ridden out (:class:`~stream_dedup.service.index_outage.IndexOutage`,
    up to ``index.redis.outage_limit_s``): steps 1 and 4 are each retried whole, as a
    replay in process would run them.
    """

    def __init__(
        self,
        producer: EventProducer,
        consumer: Consumer,
        decider: Decider,
        metrics: Metrics,
        config: ServiceConfig,
        keep_waiting: Callable[[], bool],
    ) -> None:
        super().__init__(producer, consumer, decider, metrics, config, keep_waiting)
        self._outage = IndexOutage(config.index.redis.outage_limit_s, metrics, keep_waiting)
        #: The batch produced and not yet confirmed (:meth:`commit`).
        self._pending: _Pending | None = None

    @property
    def index_down_since(self) -> float | None:
        return self._outage.down_since

    def ride_out(self, operation: str, step: Callable[[], T]) -> T:
        return self._outage.call(operation, step)

    def stored_offsets(self) -> dict[TpKey, int]:
        return self._outage.call("reading offsets", self._index.offsets)

    def stored_intent(self) -> Ranges | None:
        return self._outage.call("reading the batch intent", self._index.intent)

    def stored_documents(self) -> int:
        """Read from Redis, not the counter as of this instance's last lease: the other
        instances store documents meanwhile
        (:meth:`~stream_dedup.index.progress.IndexProgress.stored_documents`)."""
        return self._outage.call("counting documents", self._index.stored_documents)

    def decide_ahead(self, decoded: Decoded, sketched: Sketch | None) -> Sketch | None:
        """The batch the group's order holds back, decided against the index as it is
        now, while the member before this one decides its turn: when the batch is
        released, :meth:`_decide_and_store` settles it (``predecide``: only the documents
        near what that member wrote are decided again). In an outage, nothing: the
        batch is decided when it comes, riding the outage out there."""
        try:
            return self._decider.decide_ahead(decoded, sketched)
        except IndexUnreachableError:
            return None

    def commit(
        self, decoded: Decoded, sketched: Sketch | None, ranges: Ranges, *, replaying: bool
    ) -> BatchResult:
        """Steps 1 and 2; steps 3 to 5 are left to :meth:`deliver_pending`, which the
        loop calls once it has collected the next batch (and this method before its own
        step 1, so one batch at most is ever undelivered).

        Confirming a delivery is a wait on the broker (a few milliseconds to tens), and
        storing the offsets a Redis round trip: here they overlap with what the loop
        does next (collecting the next batch, waiting for the group's order, deciding
        ahead), which needs neither. Nothing else changes: the batch is stored before
        its events go out either way, so a crash before its offsets are stored replays
        its stored verdicts, as one right after step 2 always did.
        """
        self.deliver_pending()
        out = self._store(decoded, sketched, ranges)  # 1. decide and store, under the lease
        started = time.perf_counter()
        self._produce(out.records, out.refused)  # 2. produce
        self._pending = _Pending(next_offsets(ranges), time.perf_counter() - started)
        return out.result

    def deliver_pending(self) -> None:
        """Steps 3 to 5 of the batch :meth:`commit` produced last, if not done yet."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        started = time.perf_counter()
        offsets = pending.offsets
        self._deliver(offsets)  # 3. every delivery confirmed
        self._outage.call("storing offsets", lambda: self._index.write_offsets(offsets))  # 4.
        self._offsets_to_group(offsets)  # 5.
        self._committed(started - pending.produce_s)

    def drop_pending(self) -> None:
        self._pending = None

    def _deliver(self, offsets: Offsets) -> None:
        """Step 3: return once the broker confirmed every record of the batch."""
        self._confirm(offsets)

    def _offsets_to_group(self, offsets: Offsets) -> None:
        """Step 5: the offsets to the consumer group too, for lag tools (the index's are
        where the group resumes)."""
        self._commit_kafka(offsets)

    def _store(self, decoded: Decoded, sketched: Sketch | None, ranges: Ranges) -> DecidedBatch:
        """Step 1, retried whole through an outage of the index, calling ``on_stored`` at
        the write's commit point; only then what the batch needs that does not change the
        index: its events, and what it left for later (``after_lease``).

        ``on_stored`` hands the group's turn over (the group's time order publishes the
        new heads, waking the members waiting for exactly this batch): the batch is
        stored at its commit point, so nothing after it is theirs to wait for, not even
        applying the write to the record hashes (the next holder reads it through its
        redo record, :mod:`stream_dedup.index.redis_redo`). The events (a JSON record per
        document) and the work left for later are this instance's alone (its set cache;
        gathering texts and, once, training the payload dictionary: ~0.5 s, which the
        other members used to wait out), so they run after the hand-over, beside the next
        member's turn. The events are built once, from the last attempt's verdicts, so
        its dead letters are counted once.
        """
        handed = False

        def hand_over() -> None:  # once, even where an outage has the step run again
            nonlocal handed
            if not handed and self.on_stored is not None:
                handed = True
                self.on_stored(ranges)

        decision = self._outage.call(
            "deciding and storing a batch",
            lambda: self._decide_and_store(decoded, sketched, hand_over),
        )
        out = self._decider.records(decoded, decision)
        self._outage.call("after the lease", self._decider.dedup.after_lease)
        return out

    def _decide_and_store(
        self, decoded: Decoded, sketched: Sketch | None, committed: Callable[[], None]
    ) -> Decision:
        """Step 1: decide the batch before the lease, then under it settle it (decide it
        again where another instance wrote near it meanwhile) and store it (one atomic
        write, ``committed`` called at its commit point);
        ``stream_dedup.dedup.predecide`` tells why the verdicts are the same.

        Run again after an outage, it takes a new lease, which first applies a write the
        outage interrupted after its commit point; the batch's documents stored by then
        get their stored verdicts back, so its events are the same as the first try's.
        """
        metrics = self._metrics
        # Alone, an instance decides inside the lease (others_writing); a batch decided
        # ahead is settled all the same: its deciding is done, settling it costs less.
        decider = self._decider
        ahead = self._index.others_writing or decider.decided_ahead(decoded)
        pre = decider.predecide(decoded, sketched) if ahead else None
        waited = time.perf_counter()
        with self._index.exclusive():
            held = time.perf_counter()
            metrics.lease_wait.observe(held - waited)
            decision = self._decider.settle(decoded, sketched, pre)
            pending = self._decider.dedup.prepare(decision.result)
            self._index.apply(pending, committed)  # 1. store
        metrics.lease_held.observe(self._index.lease_end() - held)
        return decision


class SharedExactlyOnce(SharedIndex):
    """The shared index's order with the delivery in one Kafka transaction.

    Store-then-deliver: the batch is decided and stored under the lease first (as
    :class:`SharedIndex`), then its records and input offsets go in one transaction with
    the group's metadata (a member of an older generation is refused: zombie fencing).
    Kafka's committed group offsets are the input's position: a crash before the commit
    leaves them before the batch, whose next owner replays the stored verdicts,
    byte-identical, in a new transaction. The index's offsets, written after each commit,
    are never ahead of them on a broker that keeps every committed transaction's offsets;
    where they are ahead, the broker lost a commit and the index's are where to resume
    (:meth:`stored_offsets`, ``docs/shared-index.md``, exactly-once).
    """

    replay_action = "none: it is delivered once"

    def commit(
        self, decoded: Decoded, sketched: Sketch | None, ranges: Ranges, *, replaying: bool
    ) -> BatchResult:
        """Every step at once: the transaction carries the consumer group's metadata, and
        one left open while the loop consumes again would meet a rebalance's new
        generation and be refused, its batch aborted (:mod:`.transactions`)."""
        result = super().commit(decoded, sketched, ranges, replaying=replaying)
        self.deliver_pending()
        return result

    def stored_offsets(self) -> dict[TpKey, int]:
        """The partitions whose index offset is ahead of the group's committed one, at the
        index's offset; every other partition starts at the group's (read stable, so a
        transaction still open on it is waited for).

        The index's offset of a partition is written only after a transaction carrying
        that offset committed, so on Apache Kafka it never passes the group's and this is
        empty (but after a run in at-least-once mode, which stores the index's first). A
        broker that drops a committed transaction's offsets (Tansu 0.6.0 defers them while
        another producer's transaction is open on an output partition, and loses them when
        both producers restart) would otherwise have the batch replayed and its events
        committed twice.
        """
        index = super().stored_offsets()
        if not index:
            return {}
        try:
            answer = self._consumer.committed(
                [TopicPartition(t, p) for t, p in index], BROKER_TIMEOUT_S
            )
        except KafkaException as exc:
            log.warning(
                "cannot read the group's committed offsets to compare with the index's",
                extra=fields(error=str(exc), action="none: resuming from the group's offsets"),
            )
            return {}
        group = {(tp.topic, tp.partition): tp.offset for tp in answer if tp.error is None}
        ahead = {tp: offset for tp, offset in index.items() if offset > group.get(tp, -1)}
        if ahead:
            behind = {f"{t}:{p}": [group.get((t, p), -1), o] for (t, p), o in ahead.items()}
            log.warning(
                "the index's offsets are ahead of the consumer group's",
                extra=fields(
                    partitions=behind,  # [the group's, the index's]
                    action=(
                        "none: resuming at the index's offsets, which only committed"
                        " transactions write in this mode (the broker did not keep their"
                        " offsets, the last run delivered at least once, or the group's"
                        " offsets were reset: the index decides where to resume)"
                    ),
                ),
            )
        return ahead

    def _deliver(self, offsets: Offsets) -> None:
        """Step 3: the batch's records (produced in a transaction) and its input offsets
        committed together, with the group's metadata for fencing."""
        self._confirm(offsets, self._consumer.consumer_group_metadata())

    def _offsets_to_group(self, offsets: Offsets) -> None:
        """Nothing: the transaction carried the offsets to the group."""
