"""One time order for a consumer group on the shared index: the group's low watermark.

Within one instance the partition merge (:mod:`.ordering`) releases records smallest
time first across the partitions it owns. Instances of one group on one Redis index each
own some partitions of a topic, and the lease alone orders their batches as they come.
So each instance publishes, per partition it owns, what comes next there (the time of
its next undecided record, "empty since", or "at its end"), and releases a record only
when its (time, topic, partition) is below every other partition's head: the group's
*low watermark*, the way one instance's merge holds a partition's records back while
another has an earlier head. The group's order counts time in ticks of
``index.redis.order_tick_ms`` (:class:`~.ordering.TickedTime`), and within a tick goes
instance by instance (by the token each writes on its heads), then partition, so that
instances take turns about once per tick each, not at every record where the
partitions' times interleave nor at every partition of a tick. The whole argument, with
each crash and rebalance, is in ``docs/group-order.md``.

:func:`low_watermark` is the rule, a function of the published heads alone;
:class:`GroupOrder` is the instance's side of the exchange: it publishes and reads the
heads in one Redis round trip (:class:`~stream_dedup.index.redis_heads.GroupHeads`), at
each turn where this instance's heads changed or a heartbeat is due, after each stored
batch (at its commit point: the turn is handed over before anything else of the batch
runs), and while a batch waits for the watermark. That wait blocks on a wake-up the
other members push when their heads move, so the member whose turn it is goes on within
a round trip; the wake-up's timeout backs off (1 ms doubling to 16 ms), so a member
that moves without waking anyone (one going stale, a new member) is seen as before.
While the loop is busy elsewhere (waiting for the lease, deciding a large batch,
delivering), a heartbeat thread keeps this instance's heads fresh, so that a busy member
is not taken for a dead one; it refreshes only fields no newer owner has written.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple, TypeVar

from confluent_kafka import Consumer, KafkaException

from stream_dedup.errors import IndexIOError, IndexUnreachableError
from stream_dedup.index.redis_heads import AT_END, EMPTY, HEAD, GroupHeads, Published
from stream_dedup.logs import LogThrottle, fields
from stream_dedup.service.group_ends import OtherEnds

log = logging.getLogger("stream_dedup.service")

T = TypeVar("T")


def _directly(_operation: str, step: Callable[[], T]) -> T:
    """An exchange with no outage handling around it (a failure is held back and logged)."""
    return step()


TpKey = tuple[str, int]
#: A record's place in the group's order: (time, owner, (topic, partition)): its time cut
#: to the order's tick (:class:`~.ordering.TickedTime`), the token of the instance that
#: owns its partition, then the partition. Within one instance the owner is the same for
#: every record, so its merge and ``time_order`` compare (time, (topic, partition)).
OrderKey = tuple[int, str, TpKey]
#: A ceiling below every record: nothing may be released.
BLOCKED: OrderKey = (-(2**63), "", ("", -1))

_FIRST_PAUSE_S = 0.001
_LAST_PAUSE_S = 0.016
#: How recently a partition's owner must have written or touched its "at its end" head
#: for it to hold nothing back (at most ``max_idle_ms``). Records that arrive on a
#: partition whose owner was killed are fetched by nobody until the group moves it: its
#: last "at its end" must stop counting as "nothing to come" within a heartbeat or two,
#: not at ``max_idle_ms``, or the others decide later records before them. A live owner's
#: heartbeat touches its fields every quarter of it: only an owner stalled for most of it
#: holds the others back meanwhile (a wait, not a wrong order).
AT_END_FRESH_MS = 1000


class Watermark(NamedTuple):
    """What this instance may release: records below ``ceiling`` (None: no limit)."""

    ceiling: OrderKey | None
    #: While a partition holds everything back (empty or unowned, and not for long
    #: yet): milliseconds until it stops holding; else None.
    hold_ms: int | None = None


def low_watermark(
    published: Published,
    partitions: Mapping[str, int],
    mine: Iterable[TpKey],
    max_idle_ms: int,
    missing_since: dict[TpKey, int],
    ends: Mapping[TpKey, int] | None = None,
    behind_since: dict[TpKey, int] | None = None,
) -> Watermark:
    """The smallest head over the partitions of ``partitions`` (topic -> count) that are
    not ``mine``, as ``published``.

    A head is a bound only while its owner is alive: one not written for ``max_idle_ms``
    (the owner was killed, or lost the partition and nobody owns it yet) is treated as
    idle. An empty partition, or one nobody has written (``missing_since`` remembers
    when this instance first found it so, in server ms), holds everything back until it
    has been so for ``max_idle_ms``; a partition at its end holds nothing back while its
    owner is heard from (:data:`AT_END_FRESH_MS`), else everything until ``max_idle_ms``
    after it was last heard from, as an empty one.

    ``ends`` are the partitions' end offsets as the broker gave them after this instance
    last took records: an "at its end" whose owner published a lower end offset has
    records its owner has not taken yet (a burst reaching each member on its own
    fetches), so it holds everything back as an empty one does, from when it was first
    found so (``behind_since``, server ms), until its owner publishes their head.
    """
    fresh_ms = min(max_idle_ms, AT_END_FRESH_MS)
    now = published.now_ms
    own = set(mine)
    ceiling: OrderKey | None = None
    hold: int | None = None
    behind: set[TpKey] = set()
    for topic, count in partitions.items():
        for partition in range(count):
            tp = (topic, partition)
            if tp in own:
                continue
            head = published.heads.get(tp)
            if head is None:
                left = missing_since.setdefault(tp, now) + max_idle_ms - now
            else:
                missing_since.pop(tp, None)
                silent = now - head.seen
                if silent > max_idle_ms:
                    continue  # an owner gone: idle
                if head.kind == AT_END:
                    if silent > fresh_ms:
                        left = head.seen + max_idle_ms - now  # its owner silent: maybe killed
                    elif ends is not None and ends.get(tp, -1) > head.time >= 0:
                        behind.add(tp)
                        since = now if behind_since is None else behind_since.setdefault(tp, now)
                        left = since + max_idle_ms - now  # records there not taken yet
                    else:
                        continue  # nothing more to come, and its owner is there to fetch it
                elif head.kind == HEAD:
                    key = (head.time, head.owner, tp)
                    ceiling = key if ceiling is None else min(ceiling, key)
                    continue
                else:
                    left = head.since + max_idle_ms - now  # EMPTY (or a kind not known)
            if left > 0:
                hold = left if hold is None else min(hold, left)
    if behind_since is not None:  # a wait for records not taken ends with it
        for tp in behind_since.keys() - behind:
            del behind_since[tp]
    if hold is not None:
        return Watermark(BLOCKED, hold)
    return Watermark(ceiling)


class GroupOrder:
    """This instance's side of the group's heads (see the module docstring)."""

    def __init__(
        self,
        heads: GroupHeads,
        topics: Iterable[str],
        max_idle_ms: int,
        ride_out: Callable[[str, Callable[[], Published]], Published] = _directly,
        tick_ms: int = 1,
    ) -> None:
        self._heads = heads
        #: The order's tick (``index.redis.order_tick_ms``). It rides on this instance's
        #: token, which every field it writes carries, so that a member whose tick
        #: differs is named in a warning: pairs closer than the larger tick could then
        #: be decided in lease order (a rolling change of the setting passes through it).
        self.tick_ms = tick_ms
        heads.token = f"{heads.token}-t{tick_ms}"
        #: This instance's place within a tick (:data:`OrderKey`): its token.
        self.token = heads.token
        #: Runs the exchange through the commit strategy's outage handling, so Redis down
        #: while this instance waits for the watermark makes it unready, is retried and
        #: stops the service after ``index.redis.outage_limit_s``, as in a commit.
        self._ride_out = ride_out
        self._max_idle_ms = max_idle_ms
        #: Topic -> number of partitions, from the broker's metadata at each assignment.
        self._partitions: dict[str, int] = dict.fromkeys(topics, 0)
        self._missing_since: dict[TpKey, int] = {}
        #: The other members' partitions at their end, as the broker's end offsets say.
        self.ends = OtherEnds()
        self._learn = True
        self._last: Published | None = None
        self._sent: dict[TpKey, tuple[str, int]] = {}
        self._sent_at = 0.0
        #: A heartbeat keeps this instance's heads fresh well within ``max_idle_ms`` and
        #: :data:`AT_END_FRESH_MS`.
        self._heartbeat_s = max(0.02, min(max_idle_ms, AT_END_FRESH_MS) / 4000.0)
        self._pause_s = _FIRST_PAUSE_S
        self._failed = LogThrottle(60.0)
        #: Round trips made, and seconds spent waiting for the watermark (see
        #: :meth:`take_waited`).
        self.exchanges = 0
        self.waited_s = 0.0
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, name="group-heads", daemon=True)
        self._beat.start()

    def close(self) -> None:
        """Stop the heartbeat (the service stops: its heads go stale, as a dead member's),
        and wait for a touch under way, so that none runs on a client closed after this."""
        self._stop.set()
        if self._beat is not threading.current_thread():
            self._beat.join(timeout=5.0)

    def _heartbeat(self) -> None:
        """Touch this instance's heads whenever the loop has not exchanged for a beat."""
        while not self._stop.wait(self._heartbeat_s / 2):
            if time.monotonic() - self._sent_at < self._heartbeat_s:
                continue
            try:
                self._heads.touch(sorted(self._partitions))
            except IndexIOError:
                continue  # the loop finds the outage too, and says so
            except Exception:  # the index was closed under it: the service is stopping
                return

    def partitions_changed(self) -> None:
        """The group rebalanced: read the partition counts again before the next release
        (not here: the consumer's rebalance callback must not call the consumer)."""
        self._learn = True

    def learn_partitions(self, consumer: Consumer, timeout_s: float = 10.0) -> None:
        """Read each topic's partition count, once after each rebalance (a partition
        nobody publishes holds the others back until ``max_idle_ms``, so every one must
        be known)."""
        if not self._learn:
            return
        self._learn = False
        for topic in list(self._partitions):
            try:
                meta = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
            except KafkaException as exc:  # the broker unreachable: ask again next time
                self._learn = True
                dropped = self._failed.admit("partitions")
                if dropped is not None:
                    log.warning(
                        "cannot read the topic's partitions",
                        extra=fields(error=str(exc), suppressed=dropped),
                    )
                continue
            if meta is not None and meta.error is None:
                self._partitions[topic] = len(meta.partitions)

    def exchange(self, mine: Mapping[TpKey, tuple[str, int]]) -> None:
        """Publish ``mine`` (each owned partition's (kind, time)) and read the group's."""
        topics = sorted({*self._partitions, *(t for t, _p in mine)})
        for topic in topics:
            self._partitions.setdefault(topic, 0)
        wake = self._to_wake() if mine != self._sent else ()
        try:
            self._last = self._ride_out(
                "exchanging the group's heads",
                lambda: self._heads.exchange(topics, mine, wake),
            )
        except IndexUnreachableError:
            raise  # the outage outlasted its limit: the service stops, as in a commit
        except IndexIOError as exc:
            self._last = None  # nothing known: hold back until Redis answers
            dropped = self._failed.admit("exchange")
            if dropped is not None:
                log.warning(
                    "cannot exchange the group's heads; holding batches back",
                    extra=fields(error=str(exc), suppressed=dropped),
                )
            return
        self.exchanges += 1
        self._sent = dict(mine)
        self._sent_at = time.monotonic()

    def _to_wake(self) -> list[str]:
        """The other members, as the last exchange named them (whom this one's moved
        heads may let go on)."""
        if self._last is None:
            return []
        token = self._heads.token
        return sorted({h.owner for h in self._last.heads.values() if h.owner not in ("", token)})

    def wait(self, timeout_s: float) -> None:
        """Wait until another member's heads move (it wakes this one), at most
        ``timeout_s``; where Redis cannot be asked, sleep instead (the next exchange
        finds the outage and says so)."""
        try:
            self._heads.wait(timeout_s)
        except IndexIOError:
            time.sleep(timeout_s)

    def keep_alive(self, mine: Mapping[TpKey, tuple[str, int]]) -> None:
        """:meth:`exchange` if ``mine`` changed since it was last published, or the
        heartbeat is due."""
        if mine != self._sent or time.monotonic() - self._sent_at >= self._heartbeat_s:
            self.exchange(mine)

    def watermark(
        self, mine: Iterable[TpKey], consumer: Consumer | None = None, taken: int = 0
    ) -> Watermark:
        """Below what this instance may release now, from the last exchange; with
        ``consumer``, other members' "at its end" are checked against the broker's end
        offsets, looked at again whenever ``taken`` (the records taken from the consumer
        so far) or those heads changed."""
        if self._last is None:
            return Watermark(BLOCKED, 100)
        self._check_ticks(self._last)
        own = set(mine)
        if consumer is not None:
            fresh_ms = min(self._max_idle_ms, AT_END_FRESH_MS)
            self.ends.look(consumer, self._last, own, taken, fresh_ms)
        return low_watermark(
            self._last,
            self._partitions,
            own,
            self._max_idle_ms,
            self._missing_since,
            self.ends.ends,
            self.ends.behind_since,
        )

    def _check_ticks(self, published: Published) -> None:
        """Warn (once a minute) while a live member orders with another tick."""
        now, idle = published.now_ms, self._max_idle_ms
        fresh = (_tick_of(h.owner) for h in published.heads.values() if now - h.seen <= idle)
        ticks = {t for t in fresh if t is not None and t != self.tick_ms}
        if not ticks:
            return
        dropped = self._failed.admit("tick")
        if dropped is not None:
            log.warning(
                "another instance of the group has a different index.redis.order_tick_ms:"
                " set the same on every instance",
                extra=fields(tick_ms=self.tick_ms, others=sorted(ticks), suppressed=dropped),
            )

    def pause(self, hold_ms: int | None) -> float:
        """Seconds to wait before asking again (doubling while held back, up to 16 ms, and
        never past the moment a holding partition stops holding)."""
        wait = self._pause_s
        self._pause_s = min(2 * wait, _LAST_PAUSE_S)
        if hold_ms is not None:
            wait = min(wait, max(hold_ms / 1000.0, 0.0005))
        self.waited_s += wait
        return wait

    def take_waited(self) -> float:
        """Seconds waited for the watermark since last asked (for the metric)."""
        waited, self.waited_s = self.waited_s, 0.0
        return waited

    def released(self) -> None:
        """Something was released: the next wait starts short again."""
        self._pause_s = _FIRST_PAUSE_S


def _tick_of(owner: str) -> int | None:
    """The tick a member's token names (``<hex>-t<ms>``), or None for one without."""
    _token, sep, tick = owner.rpartition("-t")
    return int(tick) if sep and tick.isdigit() else None


def own_heads(
    inflight: Mapping[TpKey, int],
    buffered: Mapping[TpKey, int],
    assigned: Iterable[TpKey],
    at_end: Mapping[TpKey, int],
) -> dict[TpKey, tuple[str, int]]:
    """Each assigned partition's (kind, time): its first undecided record's time, taken
    (``inflight``: released, not yet stored) or still buffered; else at its end (with the
    end offset in place of the time, -1 where not known) or empty."""
    out: dict[TpKey, tuple[str, int]] = {}
    for tp in assigned:
        if tp in inflight:
            out[tp] = (HEAD, inflight[tp])
        elif tp in buffered:
            out[tp] = (HEAD, buffered[tp])
        else:
            out[tp] = (AT_END, at_end[tp]) if tp in at_end else (EMPTY, 0)
    return out
