"""Exactly-once delivery: a batch's events, dead letters and input offsets in one transaction.

With ``service.delivery = "exactly-once"`` the commit strategy
(:class:`~stream_dedup.service.checkpoint.ExactlyOnce`; the protocol and its crash points are
written down in ``docs/commit-protocol.md``) produces through a
:class:`TransactionalProducer` instead of confirming deliveries one by one. Kafka then
holds two facts atomically: the batch's records are visible to ``read_committed``
readers *and* the group's committed offsets of the input partitions have moved past the
batch. The index is written after the transaction commits, so a crash in between leaves
an index that still announces the batch (its intent) while Kafka says it was delivered;
:func:`intent_delivered` tells the two cases apart at start-up from those group offsets.

A transaction that cannot be committed is aborted and the batch produced again in a new
one (an abortable error: a failed delivery, a broker that lost the transaction); a fatal
error (this producer was fenced by a newer instance with the same ``transactional.id``)
stops the service, whose next start replays the batch from its intent. So does a refusal
of the offsets by the group (this instance is no longer the member that owns the
partitions: zombie fencing by the consumer group metadata); the partitions' new owner
replays the batch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from stream_dedup.errors import TransactionError
from stream_dedup.logs import fields
from stream_dedup.service.broker_watch import BrokerWatch
from stream_dedup.service.events import OutRecord
from stream_dedup.service.kafka import DeliveryAbandonedError, EventProducer
from stream_dedup.service.ranges import Ranges
from stream_dedup.service.refusals import Refused

log = logging.getLogger("stream_dedup.service.transactions")


#: What the group coordinator answers the offsets of a member it no longer counts (a zombie:
#: an instance paused past its session while the group gave its partitions to another).
#: The transaction is aborted and never retried: its batch belongs to the new owner now.
_GROUP_MOVED_ON = frozenset(
    (KafkaError.ILLEGAL_GENERATION, KafkaError.UNKNOWN_MEMBER_ID, KafkaError.FENCED_INSTANCE_ID)
)


def _error(exc: KafkaException) -> KafkaError | None:
    err = exc.args[0] if exc.args else None
    return err if isinstance(err, KafkaError) else None


class TransactionalProducer(EventProducer):
    """:class:`EventProducer` whose :meth:`deliver` commits a transaction, not a flush.

    Use: :meth:`init` once, then per batch :meth:`begin`, :meth:`produce` each record,
    :meth:`deliver` with the batch's next input offsets. ``on_outcome`` hears
    ``"committed"`` or ``"aborted"`` for each transaction that ends (for the metrics).
    """

    def __init__(
        self,
        user: Mapping[str, str],
        watch: BrokerWatch,
        on_outcome: Callable[[str], None] = lambda _outcome: None,
    ) -> None:
        super().__init__(user, watch)
        self._on_outcome = on_outcome
        self._open = False

    def init(self, step_s: float, give_up: Callable[[], bool]) -> None:
        """Register the ``transactional.id``: fences an older instance with the same id and
        completes or aborts the transaction it left open. Waits out an absent broker."""
        started = time.monotonic()
        while True:
            try:
                self._producer.init_transactions(step_s)
                return
            except KafkaException as exc:
                err = _error(exc)
                if err is None or not err.retriable() or give_up():
                    raise TransactionError(f"cannot initialise transactions: {exc}") from exc
                log.warning(
                    "waiting for the transaction coordinator",
                    extra=fields(
                        waited_s=round(time.monotonic() - started, 1),
                        error=err.str(),
                        action="check the broker; exactly-once delivery needs Kafka >= 2.5",
                    ),
                )

    def begin(self, refused: Refused | None = None) -> None:
        super().begin(refused)
        try:
            self._producer.begin_transaction()
        except KafkaException as exc:
            raise TransactionError(f"cannot begin a transaction: {exc}") from exc
        self._open = True

    def produce(self, rec: OutRecord) -> None:
        """Queue one record in the transaction.

        A fatal error (this producer was fenced) is a :class:`TransactionError`, never a
        record to dead-letter; a transaction that must be aborted keeps the record for
        :meth:`deliver`, whose commit then fails, aborts and produces every record again.
        """
        try:
            super().produce(rec)
        except KafkaException as exc:
            err = _error(exc)
            if err is not None and err.fatal():
                raise TransactionError(f"the transaction cannot take records: {exc}") from exc
            if err is not None and err.txn_requires_abort():
                self._inflight.append(rec)
                return
            raise

    def deliver(
        self,
        offsets: Mapping[tuple[str, int], int],
        group: object,
        step_s: float,
        backoff: tuple[float, float],
        give_up: Callable[[], bool] = lambda: False,
    ) -> None:
        """Add the input ``offsets`` to the transaction and commit it; on an abortable
        error abort, wait ``backoff``, and produce the whole batch again in a new one.

        Returns once committed. Raises :class:`DeliveryAbandonedError` when ``give_up()``
        turns true first (the transaction is left for the next start to abort), and
        :class:`TransactionError` on a fatal error.
        """
        tps = [TopicPartition(t, p, o) for (t, p), o in offsets.items()]
        delay = backoff[0]
        started = time.monotonic()
        offsets_sent = False
        while True:
            try:
                if not offsets_sent:
                    self._producer.send_offsets_to_transaction(tps, group, step_s)
                    offsets_sent = True
                self._producer.commit_transaction(step_s)
            except KafkaException as exc:
                err = _error(exc)
                if err is None or err.fatal():
                    self._open = False
                    raise TransactionError(f"transaction failed: {exc}") from exc
                if err.txn_requires_abort():
                    # Records refused for good are replaced in the batch sent again.
                    self._replace_refused(self._failed_records(self._failed))
                    self._abort(err, delay)
                    if err.code() in _GROUP_MOVED_ON:
                        raise TransactionError(
                            "the group gave this instance's partitions to another member "
                            f"({err.str()}): its batch was aborted and is replayed by their "
                            "new owner; was the instance paused past session.timeout.ms?"
                        ) from exc
                    if give_up():
                        raise DeliveryAbandonedError("stopped retrying a transaction") from exc
                    time.sleep(delay)
                    delay = min(delay * 2, backoff[1])
                    self._reproduce()
                    offsets_sent = False
                    continue
                if not err.retriable():
                    raise TransactionError(f"transaction failed: {exc}") from exc
                log.warning(
                    "waiting to commit the batch's transaction",
                    extra=fields(
                        waited_s=round(time.monotonic() - started, 1),
                        error=err.str(),
                        action="check the broker; the batch commits once it answers",
                    ),
                )
                if give_up():
                    raise DeliveryAbandonedError("transaction unconfirmed at stop") from exc
                continue
            self._open = False
            self._inflight.clear()
            self._failed.clear()
            self._on_outcome("committed")
            self._watch.alive()
            return

    def _abort(self, err: KafkaError, retry_in_s: float) -> None:
        try:
            self._producer.abort_transaction(max(retry_in_s, 5.0))
        except KafkaException as exc:
            # A producer fenced by a newer one with the same transactional.id sees its
            # transaction fail and then cannot abort it either: only stopping is left.
            raise TransactionError(
                f"the transaction failed ({err.str()}) and could not be aborted ({exc}); "
                "if another instance uses this transactional.id, only one may run"
            ) from exc
        self._open = False
        self._failed.clear()
        self._on_outcome("aborted")
        log.warning(
            "transaction aborted; producing the batch again in a new one",
            extra=fields(error=err.str(), records=len(self._inflight), retry_in_s=retry_in_s),
        )

    def _reproduce(self) -> None:
        """The aborted transaction's records again, in a new transaction."""
        self.begin()
        self._inflight = [self._send_or_replace(rec) for rec in self._inflight]

    def close(self, timeout_s: float) -> int:
        """Abort a transaction left open (a stop before its commit), then close.

        Aborting now saves the next instance the wait for it; nothing of it was committed,
        and the batch is replayed from its intent.
        """
        if self._open:
            try:
                self._producer.abort_transaction(timeout_s)
                self._on_outcome("aborted")
            except KafkaException as exc:
                log.warning("could not abort the open transaction", extra=fields(error=str(exc)))
            self._open = False
            self._inflight.clear()
        return super().close(timeout_s)


def intent_delivered(consumer: Consumer, intent: Ranges, timeout_s: float) -> bool:
    """Whether the batch announced by ``intent`` was delivered in a committed transaction.

    In exactly-once mode the group's offsets move only inside the service's transactions,
    so they are past every range of the intent exactly when the batch's transaction
    committed (and the crash came before the index write). Call after
    :meth:`TransactionalProducer.init`: that completes a transaction the old instance
    left half-committed, and the read asks for stable offsets (``read_committed``).
    """
    asked = [TopicPartition(t, p) for (t, p) in intent]
    try:
        answer = consumer.committed(asked, timeout_s)
    except KafkaException as exc:
        raise TransactionError(
            f"cannot read the group's committed offsets to finish the pending batch: {exc}; "
            "check the broker and start again (nothing is emitted until this is known)"
        ) from exc
    stored = {(tp.topic, tp.partition): tp.offset for tp in answer}
    past = [stored.get(tp, -1) >= end for tp, (_start, end) in intent.items()]
    if all(past):
        return True
    if any(past):
        log.warning(
            "the group's offsets cover part of the pending batch only; replaying all of it",
            extra=fields(
                committed={f"{t}:{p}": o for (t, p), o in stored.items()},
                action="another client committed offsets for this group: give the service "
                "a group of its own; a read_committed reader may see some events twice",
            ),
        )
    return False
