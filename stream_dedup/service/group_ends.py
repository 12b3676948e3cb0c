"""The other members' "at its end", checked against the broker's end offsets.

A member of the group publishes "at its end" (``x``) with the offset its consumer's end
was reported at (:mod:`.group_order`). Records produced there since are not in its head
until its own fetch brings them and its loop takes them: tens of milliseconds later, or
a busy loop later. A burst after a quiet spell reaches each member on its own fetches,
so without a look at the broker a member would release its share past the others'
``x`` before their owners had taken theirs, deciding the burst in arrival order
(``docs/group-order.md``, "Partitions at their end").

So before releasing past other members' fresh ``x`` this instance asks the broker for
those partitions' end offsets, all in one request. Its own records were on the broker
before it took them, so an end looked at after that take counts every record there that
reached the broker before them: an end above the published offset means records the
owner has not taken yet (:func:`~.group_order.low_watermark` then holds this instance
back). The look is made only when a release would go ahead without it (the caller,
:class:`~.group_turns.GroupTurns`, checks), and again only when this instance took new
records or those heads changed. A broker may answer the base offset of the last record
batch plus one (Tansu does): still above the published end exactly when a batch came
after it.
"""

from __future__ import annotations

import logging
from collections.abc import Set

from confluent_kafka import OFFSET_END, Consumer, KafkaException, TopicPartition

from stream_dedup.index.redis_heads import AT_END, Published
from stream_dedup.logs import LogThrottle, fields

log = logging.getLogger("stream_dedup.service")

TpKey = tuple[str, int]

#: How long a look waits for the broker; past it the look is given up and the ``x`` are
#: taken as published (a warning once a minute) until this instance takes new records.
ENDS_TIMEOUT_S = 2.0


class OtherEnds:
    """The end offsets of the other members' partitions at their end, as last looked at."""

    def __init__(self) -> None:
        #: Partition -> the broker's end offset, from the last look (empty: none valid).
        self.ends: dict[TpKey, int] = {}
        #: Per partition, since when (server ms) it was found behind its end
        #: (kept by :func:`~.group_order.low_watermark`).
        self.behind_since: dict[TpKey, int] = {}
        #: What the last look was made for: (records taken, the heads looked at).
        self._for: tuple[int, tuple[tuple[TpKey, int], ...]] | None = None
        #: Looks made (broker round trips), by outcome: every partition at its end, or
        #: some behind it; and the counts already told (:meth:`take_looks`).
        self.looks = {"at_end": 0, "behind": 0}
        self._told = dict(self.looks)
        self._failed = LogThrottle(60.0)

    def look(
        self, consumer: Consumer, published: Published, own: Set[TpKey], taken: int, fresh_ms: int
    ) -> None:
        """Look at the ends of the partitions not ``own`` whose owner published "at its
        end" with a known offset and was heard from within ``fresh_ms``, unless the last
        look was for the same heads and nothing was taken since (``taken``: the records
        taken from the consumer so far)."""
        asked = tuple(
            sorted(
                (tp, head.time)
                for tp, head in published.heads.items()
                if tp not in own
                and head.kind == AT_END
                and head.time >= 0
                and published.now_ms - head.seen <= fresh_ms
            )
        )
        if not asked:
            self.ends = {}
            return
        if self._for == (taken, asked):
            return
        try:
            answer = consumer.offsets_for_times(
                [TopicPartition(t, p, OFFSET_END) for (t, p), _end in asked],
                timeout=ENDS_TIMEOUT_S,
            )
        except KafkaException as exc:
            # not asked again until something new is taken: a broker that does not answer
            # would otherwise stall every turn of the loop for the timeout
            self.ends, self._for = {}, (taken, asked)
            dropped = self._failed.admit("ends")
            if dropped is not None:
                log.warning(
                    "cannot read the end offsets of other members' partitions; taking their"
                    " 'at its end' as published",
                    extra=fields(error=str(exc), suppressed=dropped),
                )
            return
        self.ends = {(tp.topic, tp.partition): tp.offset for tp in answer if tp.error is None}
        self._for = (taken, asked)
        behind = any(self.ends.get(tp, -1) > end for tp, end in asked)
        self.looks["behind" if behind else "at_end"] += 1

    def take_looks(self) -> dict[str, int]:
        """Looks made since last asked, by outcome (for the metric)."""
        out = {k: v - self._told[k] for k, v in self.looks.items()}
        self._told = dict(self.looks)
        return out
