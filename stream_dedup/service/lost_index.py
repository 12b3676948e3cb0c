"""Is the index the one these partitions were decided into? Checked at each assignment.

Two ways an index can stop matching its input, both silent without this check:

* **An empty index while the group has committed offsets**: the index was lost (a deleted
  directory, a Redis restarted without its data, a wrong path). Resuming from the group's
  offsets would call every copy of what it forgot unique.
* **Index offsets the broker no longer has**: below the partition's earliest retained
  offset (the service was down longer than the topic's retention: the messages in between
  were never decided). Seeking there would hand the position to ``auto.offset.reset``,
  which may skip to the end without a word.

An index offset *past* a partition's end (a recreated topic) is not checked: the high
watermark is not reliable on every Kafka-protocol broker (Tansu answers the base offset of
the last record batch plus one, far below the end after a batched produce), and a check
that misfires would stop healthy services.

``index.on_lost`` decides what follows: ``fail`` (the default) raises an
:class:`~stream_dedup.errors.IndexLostError`, so an operator looks before anything is
decided; ``rebuild`` decides again from the earliest retained messages; ``continue`` goes on
from the group's committed offsets (an empty index) or the earliest retained offset,
loudly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaException,
    TopicPartition,
)

from stream_dedup.errors import IndexLostError, IndexOffsetsGoneError
from stream_dedup.logs import fields

log = logging.getLogger("stream_dedup.service")

#: How long each check waits for the broker (committed offsets, watermarks).
BROKER_TIMEOUT_S = 10.0


def check_empty_index(
    consumer: Consumer,
    partitions: list[TopicPartition],
    location: str,
    on_lost: str,
    documents: Callable[[], int],
) -> None:
    """The index was found empty: if the group committed offsets, it was lost. ``fail``
    raises :class:`~stream_dedup.errors.IndexLostError`; ``rebuild`` seeks every partition
    to its earliest retained message; ``continue`` leaves the group's offsets, loudly.

    ``documents()`` counts the index's documents again once the group's offsets are read:
    on a shared index another instance may have committed a batch after the first count,
    and it stored the batch before its offsets reached the group, so read in this order
    the two agree (an index found filled meanwhile is whole, not lost)."""
    try:
        answer = consumer.committed(
            [TopicPartition(tp.topic, tp.partition) for tp in partitions], BROKER_TIMEOUT_S
        )
    except KafkaException as exc:
        log.warning(
            "cannot read the group's committed offsets to check the empty index",
            extra=fields(error=str(exc), action="none: resuming from the group's offsets"),
        )
        return
    committed = {f"{tp.topic}:{tp.partition}": tp.offset for tp in answer if tp.offset >= 0}
    if not committed:
        return  # a new index for a new group
    stored = documents()
    if stored:
        log.info(
            "the index, empty at first look, holds documents another instance stored since",
            extra=fields(index=location, documents=stored, committed=committed),
        )
        return
    if on_lost == "fail":
        raise IndexLostError(location, committed)
    rebuild = on_lost == "rebuild"
    log.warning(
        "the index is empty but the consumer group has committed offsets",
        extra=fields(
            index=location,
            committed=committed,
            on_lost=on_lost,
            action="deciding again from the earliest retained messages"
            if rebuild
            else "resuming from the group's offsets: copies of what the index forgot "
            "are called unique",
        ),
    )
    if rebuild:
        for tp in partitions:
            tp.offset = OFFSET_BEGINNING


def check_offsets_retained(
    consumer: Consumer, partitions: list[TopicPartition], location: str, on_lost: str
) -> None:
    """Each partition's position from the index (``tp.offset >= 0``) must not lie below
    what the broker retains. ``fail`` raises
    :class:`~stream_dedup.errors.IndexOffsetsGoneError`; ``rebuild`` and ``continue`` seek
    such a partition to its earliest retained message (nothing nearer is left)."""
    gone: dict[str, tuple[int, int, int]] = {}
    moved: list[TopicPartition] = []
    for tp in partitions:
        if tp.offset < 0:
            continue  # not from the index: the group's offset or auto.offset.reset
        try:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(tp.topic, tp.partition), timeout=BROKER_TIMEOUT_S, cached=False
            )
        except KafkaException as exc:
            log.warning(
                "cannot read a partition's retained offsets to check the index's position",
                extra=fields(
                    partition=f"{tp.topic}:{tp.partition}",
                    error=str(exc),
                    action="none: resuming from the index's offset",
                ),
            )
            continue
        if low < 0 or tp.offset >= low:
            continue  # (a broker that does not report watermarks gives logical offsets)
        gone[f"{tp.topic}:{tp.partition}"] = (tp.offset, low, high)
        moved.append(tp)
    if not gone:
        return
    if on_lost == "fail":
        raise IndexOffsetsGoneError(location, gone)
    log.warning(
        "the index's offsets are below what the broker retains",
        extra=fields(
            index=location,
            partitions={
                k: {"index": o, "earliest": lo, "end": hi} for k, (o, lo, hi) in gone.items()
            },
            on_lost=on_lost,
            action="going on from the earliest retained messages: the messages before them "
            "were never decided",
        ),
    )
    for tp in moved:
        tp.offset = OFFSET_BEGINNING
