"""The Kafka edge: client configuration, consumer construction, a confirming producer.

Nothing here knows about the index or about verdicts. Client settings are merged in a fixed
order, later wins::

    our defaults  <  the user's [kafka] table  <  what the commit protocol needs

The enforced keys are :data:`CONSUMER_ENFORCED` and :data:`PRODUCER_ENFORCED`: offsets are
committed only by the checkpoint (never automatically), end-of-partition events tell the
time-ordered merge that a partition is caught up, and an event counts as delivered only
when every in-sync replica has it. In the user's table a ``consumer.`` or
``producer.`` prefix limits a key to one client; keys that only make sense for one role
(``group.id``, ``linger.ms``...) go only to that one. Security settings
(``security.protocol``, ``sasl.*``, ``ssl.*``) pass through unchanged to both, so SASL and
TLS need configuration only.

Constructors open no connection; librdkafka connects in the background and reconnects on
its own with backoff. An outage is logged once, not once per retry: :class:`BrokerWatch`
turns the clients' errors into one warning, a summary a minute while it lasts and a line
when it ends, and :class:`LibrdkafkaLog` keeps librdkafka's own log lines from flooding.
:func:`check_client_config` has librdkafka check the settings without connecting.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import weakref
from collections.abc import Callable, Hashable, Mapping
from typing import Any

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from stream_dedup.errors import ConfigError, StreamDedupError
from stream_dedup.logs import fields
from stream_dedup.service.events import OutRecord

log = logging.getLogger("stream_dedup.service.kafka")

#: What a delivery report tells of its record: topic, key and value (not the headers).
_Identity = tuple[str, bytes | None, bytes | None]

#: Reconnect backoff of both clients. librdkafka's 100 ms start retries a broker that is
#: down 10-20 times a second (a consumer asks for its group coordinator besides); 1 s makes
#: that one or two. It adds at most a second to a reconnect after a broker restart. The
#: wait doubles per failed attempt up to the maximum (librdkafka's own 10 s, stated).
CONNECTION_DEFAULTS: Mapping[str, str] = {
    "reconnect.backoff.ms": "1000",
    "reconnect.backoff.max.ms": "10000",
}
CONSUMER_DEFAULTS: Mapping[str, str] = {
    **CONNECTION_DEFAULTS,
    # A group with no stored offsets starts at the oldest message: nothing goes undecided.
    "auto.offset.reset": "earliest",
    # Feeds the consumer-lag metric; dropped when no statistics callback is given.
    "statistics.interval.ms": "5000",
    # How long the broker may hold a fetch that finds no data (librdkafka: 500). Apache
    # Kafka answers as soon as fetch.min.bytes (1) has arrived, so there this costs no
    # latency, only up to 20 empty fetches/s per broker while idle. A broker that polls
    # its log instead (Tansu re-reads on a timer within the wait) adds up to this much
    # to a message; 50 ms bounds that. The embedded broker's clients go lower still
    # (stream_dedup.tools.broker.TANSU_CONSUMER_SETTINGS).
    "fetch.wait.max.ms": "50",
    # A backlog arrives in few large fetches, so batches fill up to batch.max_messages.
    "max.partition.fetch.bytes": "8388608",
}
CONSUMER_ENFORCED: Mapping[str, str] = {
    # The time-ordered merge learns from these events that a partition with nothing
    # buffered is at its end and need not be waited for (stream_dedup.service.ordering).
    "enable.partition.eof": "true",
    "enable.auto.commit": "false",
    "enable.auto.offset.store": "false",
}
PRODUCER_DEFAULTS: Mapping[str, str] = {
    **CONNECTION_DEFAULTS,
    # Lets a batch's events share produce requests. It adds no latency to a batch: the
    # checkpoint's flush() sends what is queued at once, whatever linger.ms says.
    "linger.ms": "2",
    # librdkafka's own default, stated because confirm() relies on a delivery that cannot
    # be made being reported as failed (then produced again), not retried forever.
    "message.timeout.ms": "300000",
}
PRODUCER_ENFORCED: Mapping[str, str] = {
    "acks": "all",
}

#: Keys (or key prefixes ending in '.') that belong to one client role only.
_CONSUMER_ONLY = (
    "group.",
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "auto.offset.reset",
    "enable.auto.",
    "auto.commit.interval.ms",
    "partition.assignment.strategy",
    "max.poll.interval.ms",
    "fetch.",
    "max.partition.fetch.bytes",
    "isolation.level",
    "enable.partition.eof",
    "check.crcs",
    "queued.",
    "coordinator.query.interval.ms",
)
_PRODUCER_ONLY = (
    "linger.ms",
    "queue.buffering.",
    "acks",
    "request.required.acks",
    "enable.idempotence",
    "compression.",
    "batch.",
    "message.timeout.ms",
    "delivery.timeout.ms",
    "message.send.max.retries",
    "retries",
    "transactional.id",
    "transaction.timeout.ms",
    "partitioner",
    "sticky.partitioning.linger.ms",
)


def _belongs(key: str, prefixes: tuple[str, ...]) -> bool:
    return any(key == p or (p.endswith(".") and key.startswith(p)) for p in prefixes)


def client_config(role: str, user: Mapping[str, str]) -> dict[str, str]:
    """The librdkafka settings for ``role`` ('consumer' or 'producer'), merged in order."""
    defaults, enforced, foreign = (
        (CONSUMER_DEFAULTS, CONSUMER_ENFORCED, _PRODUCER_ONLY)
        if role == "consumer"
        else (PRODUCER_DEFAULTS, PRODUCER_ENFORCED, _CONSUMER_ONLY)
    )
    other = "producer." if role == "consumer" else "consumer."
    merged = dict(defaults)
    for key, value in user.items():
        if key.startswith(other) or _belongs(key, foreign):
            continue
        merged[key.removeprefix(f"{role}.")] = value
    if "transactional.id" in merged and not any(
        k.removeprefix("producer.") in ("message.timeout.ms", "delivery.timeout.ms") for k in user
    ):
        # librdkafka wants message.timeout.ms <= transaction.timeout.ms (60 s by default)
        # and, left unset, takes the latter: a delivery cannot outlive its transaction.
        del merged["message.timeout.ms"]
    merged.update(enforced)
    return merged


def python_client_keys(conf: dict[str, Any]) -> dict[str, Any]:
    """``conf`` with the keys the Python client reads itself given the type it wants.

    confluent_kafka takes ``delivery.report.only.error`` only as a bool, while a
    configuration's values are strings: "true"/"1" become True, anything else False.
    """
    if "delivery.report.only.error" in conf:
        value = str(conf["delivery.report.only.error"]).strip().lower()
        conf["delivery.report.only.error"] = value in ("true", "1")
    return conf


class _Discard:
    """A ``logger`` for clients made only to check settings: their lines say nothing new."""

    def log(self, level: int, fmt: str, *args: object) -> None:
        return None


#: The name librdkafka reports for a setting -> the other names it is also set by.
_ALIASES: Mapping[str, tuple[str, ...]] = {
    "queue.buffering.max.ms": ("linger.ms",),
    "request.required.acks": ("acks",),
    "message.send.max.retries": ("retries",),
    "message.timeout.ms": ("delivery.timeout.ms",),
    "metadata.broker.list": ("bootstrap.servers",),
    "max.in.flight.requests.per.connection": ("max.in.flight",),
    "compression.codec": ("compression.type",),
    "sasl.mechanisms": ("sasl.mechanism",),
}


def _kafka_config_error(role: str, user: Mapping[str, str], problem: str) -> ConfigError:
    """A rejected setting as a :class:`ConfigError` naming the user's own key, if found."""
    problem = " ".join(problem.split())  # librdkafka's messages may end in a newline
    quoted = re.search(r'["`]([A-Za-z0-9_.\-]+)["`]', problem)
    names: tuple[str, ...] = ()
    if quoted:
        names = (quoted.group(1), *_ALIASES.get(quoted.group(1), ()))
    elif "SASL mechanism" in problem:
        # Often none was set: librdkafka's default, GSSAPI (Kerberos), is seldom built in.
        names = ("sasl.mechanism", "sasl.mechanisms")
        if not any(k.removeprefix(f"{role}.") in names for k in user):
            return ConfigError(
                "kafka.sasl.mechanism",
                f"not set, and librdkafka's default does not work here ({problem}); "
                "set it to the broker's: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER",
            )
    key = next(
        (
            k
            for k in user
            if k in names or (k.startswith(f"{role}.") and k[len(role) + 1 :] in names)
        ),
        None,
    )
    if "No such configuration property" in problem:
        what = (
            "librdkafka has no such setting: check its spelling against librdkafka's "
            "CONFIGURATION.md (a key for one client only takes a consumer. or producer. "
            "prefix)"
        )
    else:
        what = f"librdkafka rejects it for the {role}: {problem}"
    if key is None:
        return ConfigError("kafka", what if quoted is None else f"{quoted.group(1)}: {what}")
    return ConfigError(f"kafka.{key}", what)


def check_client_config(user: Mapping[str, str]) -> None:
    """Have librdkafka check the ``[kafka]`` settings as each client will get them.

    Each client is made with the merged settings of :func:`client_config` and closed at
    once. librdkafka checks every key and value when a client is made (an unknown key is
    "No such configuration property"), so a typo fails at start, not as a traceback when
    ``run`` makes its clients after loading the index. Nothing waits for the network.
    Raises :class:`ConfigError` naming the offending key.
    """
    for role in ("consumer", "producer"):
        conf: dict[str, Any] = python_client_keys(client_config(role, user))
        conf["logger"] = _Discard()
        try:
            client: Consumer | Producer = Consumer(conf) if role == "consumer" else Producer(conf)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            text = err.str() if isinstance(err, KafkaError) else str(exc)
            raise _kafka_config_error(role, user, text) from None
        except (TypeError, ValueError) as exc:  # a key the Python client reads itself
            raise _kafka_config_error(role, user, str(exc)) from None
        client.close()


class LogThrottle:
    """Lets the first line of a kind through, then one per ``window_s``, counting the rest.

    :meth:`admit` answers None for a line to drop, else how many of its kind were dropped
    since the last one let through (to log with it). Kinds are whatever the caller keys
    lines by; a flood of distinct kinds (over ``max_kinds``) starts the memory afresh.
    """

    def __init__(self, window_s: float = 60.0, max_kinds: int = 1024) -> None:
        self._window_s = window_s
        self._max_kinds = max_kinds
        self._seen: dict[Hashable, list[float]] = {}  # kind -> [let through at, dropped]
        self._lock = threading.Lock()

    def admit(self, kind: Hashable) -> int | None:
        now = time.monotonic()
        with self._lock:
            entry = self._seen.get(kind)
            if entry is None:
                if len(self._seen) >= self._max_kinds:
                    self._seen.clear()
                self._seen[kind] = [now, 0]
                return 0
            if now - entry[0] < self._window_s:
                entry[1] += 1
                return None
            dropped = int(entry[1])
            entry[0], entry[1] = now, 0
            return dropped


_NUMBERS = re.compile(r"\d+")

#: librdkafka log facilities whose lines also reach ``error_cb`` (see :class:`LibrdkafkaLog`).
_ALSO_ERRORS = frozenset({"FAIL", "ERROR"})


class LibrdkafkaLog:
    """librdkafka's own log lines into a Python logger (the ``logger`` client setting).

    confluent_kafka calls ``log(level, "%s [%s] %s", facility, client, text)``. Lines that
    differ only in numbers (ports, milliseconds, counts) are one kind: the first is
    logged, then at most one per ``window_s`` carrying the count of those left out. A
    broker that is down makes a ``FAIL`` line at every reconnect attempt; such lines (and
    ``ERROR`` ones) are logged at debug level, because each is also an error for
    ``error_cb``, which :class:`BrokerWatch` turns into one warning and a summary a minute.
    """

    def __init__(self, logger: logging.Logger, window_s: float = 60.0) -> None:
        self.logger = logger
        self._throttle = LogThrottle(window_s)

    def log(self, level: int, fmt: str, *args: object) -> None:
        try:
            text = fmt % args
        except TypeError:
            text = " ".join(map(str, (fmt, *args)))
        facility = str(args[0]) if args else ""
        if facility in _ALSO_ERRORS:
            level = logging.DEBUG
        if not self.logger.isEnabledFor(level):
            return
        dropped = self._throttle.admit((facility, _NUMBERS.sub("#", text)))
        if dropped is None:
            return
        self.logger.log(level, text, extra=fields(suppressed=dropped) if dropped else None)


#: Errors that mean a client cannot reach the brokers: refused, unresolvable, no answer.
_UNREACHABLE = frozenset(
    {
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TRANSPORT,
        KafkaError._RESOLVE,
        KafkaError._TIMED_OUT,
    }
)


class _Outage:
    """Whether the brokers at one bootstrap address are reachable, shared by the clients
    of a process that use them: one outage is one story in the log, not one per client."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.lock = threading.Lock()
        self.down_since: float | None = None
        self.last_error_at = 0.0
        self.last_line_at = 0.0
        self.suppressed = 0
        self.clients: set[str] = set()


#: The outages of the bootstrap addresses in use (forgotten with their last watch).
_OUTAGES: weakref.WeakValueDictionary[str, _Outage] = weakref.WeakValueDictionary()
_OUTAGES_LOCK = threading.Lock()


def _outage_of(bootstrap: str) -> _Outage:
    with _OUTAGES_LOCK:
        outage = _OUTAGES.get(bootstrap)
        if outage is None:
            outage = _Outage(bootstrap)
            _OUTAGES[bootstrap] = outage
        return outage


class BrokerWatch:
    """librdkafka ``error_cb``: an outage is logged once, summarized, and closed.

    librdkafka keeps reconnecting by itself (``reconnect.backoff.ms`` up to
    ``reconnect.backoff.max.ms``) and reports every failed attempt; the loop just keeps
    polling. The first error of an outage is a warning that says what to check; while it
    lasts, at most one summary per ``summary_s`` says for how long and how many errors
    were left out; a line says when the brokers answer again (:meth:`alive`, or a
    connected broker in the client's statistics), once no error came for ``quiet_s`` (so
    a broker that stays down among others that answer does not open and close an outage
    at every attempt). The consumer and the producer of a process share one outage per
    bootstrap address (:meth:`bind`). Other errors are logged once per kind a minute. A
    fatal error is remembered for the loop to raise: nothing can recover it in-process.
    """

    def __init__(self, client: str, summary_s: float = 60.0, quiet_s: float = 5.0) -> None:
        self.client = client
        self.fatal: KafkaError | None = None
        self._summary_s = summary_s
        self._quiet_s = quiet_s
        self._outage = _Outage("")  # this client's own until bind()
        self._errors = LogThrottle(summary_s)

    def bind(self, conf: Mapping[str, Any]) -> None:
        """Share the outage of ``conf``'s bootstrap address with the process's other clients.

        Errors come about once per ``reconnect.backoff.ms`` while a broker is down, so an
        outage is over only after three of those without one (``quiet_s`` at least).
        """
        self._outage = _outage_of(str(conf.get("bootstrap.servers", "")))
        try:
            backoff_s = float(conf.get("reconnect.backoff.ms", 100)) / 1000.0
        except ValueError:
            backoff_s = 0.1
        self._quiet_s = max(self._quiet_s, 3 * backoff_s)

    @property
    def down_since(self) -> float | None:
        """When the current outage began (monotonic clock), or None while none is open."""
        return self._outage.down_since

    def __call__(self, err: KafkaError) -> None:
        if err.fatal():
            self.fatal = err
            log.error(
                "fatal Kafka client error",
                extra=fields(client=self.client, error=err.str(), action="restart"),
            )
            return
        if err.code() in _UNREACHABLE:
            self._unreachable(err.str())
            return
        dropped = self._errors.admit(err.code())
        if dropped is not None:
            log.warning(
                "Kafka client error",
                extra=fields(client=self.client, error=err.str(), suppressed=dropped),
            )

    def _action(self) -> str:
        return (
            f"check that a Kafka broker is running at bootstrap.servers "
            f"({self._outage.bootstrap}) and that this host can reach it (address, port, "
            "firewall, DNS, security settings); the clients keep reconnecting meanwhile"
        )

    def _unreachable(self, error: str) -> None:
        now = time.monotonic()
        o = self._outage
        with o.lock:
            o.last_error_at = now
            o.clients.add(self.client)
            if o.down_since is None:
                o.down_since, o.last_line_at, o.suppressed = now, now, 0
                summary = None
            elif now - o.last_line_at >= self._summary_s:
                summary = (round(now - o.down_since, 1), o.suppressed, sorted(o.clients))
                o.last_line_at, o.suppressed = now, 0
            else:
                o.suppressed += 1
                return
        if summary is None:
            log.warning(
                "Kafka broker unreachable; waiting for it",
                extra=fields(
                    bootstrap=o.bootstrap,
                    client=self.client,
                    error=error,
                    action=self._action(),
                ),
            )
            return
        down_s, suppressed, clients = summary
        log.warning(
            "Kafka broker still unreachable",
            extra=fields(
                bootstrap=o.bootstrap,
                down_s=down_s,
                errors_suppressed=suppressed,
                clients=clients,
                error=error,
                action=self._action(),
            ),
        )

    def alive(self) -> None:
        """Called when the client made progress: ends an outage once errors have stopped."""
        now = time.monotonic()
        o = self._outage
        with o.lock:
            if o.down_since is None or now - o.last_error_at < self._quiet_s:
                return
            down_s, suppressed = round(now - o.down_since, 1), o.suppressed
            o.down_since, o.suppressed = None, 0
            o.clients.clear()
        log.info(
            "Kafka broker reachable again",
            extra=fields(
                bootstrap=o.bootstrap,
                client=self.client,
                down_s=down_s,
                errors_suppressed=suppressed,
            ),
        )

    def statistics(self, payload: str) -> None:
        """librdkafka statistics (``stats_cb``): a broker connection that is up ends an outage."""
        if self._outage.down_since is None:
            return
        try:
            brokers = json.loads(payload).get("brokers", {})
        except ValueError:
            return
        if any(b.get("state") == "UP" for b in brokers.values() if isinstance(b, dict)):
            self.alive()


def build_consumer(
    user: Mapping[str, str],
    watch: BrokerWatch,
    stats_cb: Callable[[str], None] | None,
    on_commit: Callable[[KafkaError | None, list[TopicPartition]], None] | None = None,
) -> Consumer:
    """A consumer with merged settings; no network until the first poll.

    ``on_commit`` hears how each offset commit ended (asynchronous commits report there).
    """
    conf: dict[str, Any] = client_config("consumer", user)
    watch.bind(conf)
    conf["error_cb"] = watch
    if on_commit is not None:
        conf["on_commit"] = on_commit
    conf["logger"] = LibrdkafkaLog(logging.getLogger("stream_dedup.librdkafka.consumer"))
    if stats_cb is not None:

        def statistics(payload: str) -> None:
            watch.statistics(payload)  # a connected broker ends an outage
            stats_cb(payload)

        conf["stats_cb"] = statistics
    else:
        conf.pop("statistics.interval.ms", None)
    return Consumer(conf)


class DeliveryAbandonedError(StreamDedupError):
    """Deliveries could not be confirmed before the caller gave up (stopping)."""


class EventProducer:
    """Asynchronous produce, then :meth:`confirm`: every record delivered, or wait.

    ``produce`` never blocks on a full local queue for long: on ``BufferError`` it serves
    delivery reports (``poll``) and retries. ``confirm`` flushes and re-produces any record
    whose delivery failed (events are keyed by id and identical on retry, so a duplicate
    delivery is harmless); while the broker is away it waits with exponential backoff and
    logs, instead of failing the batch.
    """

    def __init__(self, user: Mapping[str, str], watch: BrokerWatch) -> None:
        conf: dict[str, Any] = client_config("producer", user)
        watch.bind(conf)
        conf["error_cb"] = watch
        conf["logger"] = LibrdkafkaLog(logging.getLogger("stream_dedup.librdkafka.producer"))
        # Delivery reports only for failures (unless the user says otherwise), through one
        # producer-wide callback: confirm() needs the failed records, to produce them
        # again, not a Python callback per delivered event (a callback bound to each
        # record is one more Python call per event on the loop's thread); flush()
        # returning 0 says everything else was acknowledged.
        conf.setdefault("delivery.report.only.error", "true")
        python_client_keys(conf)
        conf["on_delivery"] = self._report
        self._producer = Producer(conf)
        self._watch = watch
        #: Records produced since the last confirmed flush, to rebuild failed ones from.
        self._inflight: list[OutRecord] = []
        self._failed: list[tuple[_Identity, KafkaError]] = []

    #: Whether :meth:`deliver` also commits the input offsets (a transaction does).
    commits_offsets = False

    def begin(self) -> None:
        """A batch's records follow (a transaction begins in the transactional producer)."""

    def deliver(
        self,
        offsets: Mapping[tuple[str, int], int],
        group: object,
        step_s: float,
        backoff: tuple[float, float],
        give_up: Callable[[], bool] = lambda: False,
    ) -> None:
        """Return once the batch's records are delivered for good: here, :meth:`confirm`.

        ``offsets`` (the batch's next input offsets) and ``group`` (the consumer's group
        metadata) serve the transactional producer, which commits them with the records.
        """
        self.confirm(step_s, backoff, give_up)

    def produce(self, rec: OutRecord) -> None:
        """Queue one record; raises KafkaException if the client rejects it outright.

        Delivery reports are served by :meth:`confirm` (and by ``poll`` when the local
        queue is full), not once per record. Only failures are reported by default
        (``delivery.report.only.error``); a success report is ignored.
        """
        self._send(rec)
        self._inflight.append(rec)

    def _send(self, rec: OutRecord) -> None:
        while True:
            try:
                self._producer.produce(rec.topic, rec.value, rec.key, headers=rec.headers)
                return
            except BufferError:
                self._producer.poll(0.05)

    def _report(self, err: KafkaError | None, msg: Message) -> None:
        # A report's message has no headers: the record is found again by the rest.
        if err is not None:
            self._failed.append(((msg.topic() or "", msg.key(), msg.value()), err))

    def _failed_records(self, failed: list[tuple[_Identity, KafkaError]]) -> list[OutRecord]:
        """The produced records (headers included) that the failure reports name."""
        produced: dict[_Identity, list[OutRecord]] = {}
        for rec in self._inflight:
            produced.setdefault((rec.topic, rec.key, rec.value), []).append(rec)
        records = []
        for identity, _err in failed:
            same = produced.get(identity)
            if not same:  # never: librdkafka reports the bytes it was given
                raise DeliveryAbandonedError(
                    f"a failed delivery to {identity[0]} matches no record produced"
                )
            records.append(same.pop())
        return records

    def confirm(
        self,
        step_s: float,
        backoff: tuple[float, float],
        give_up: Callable[[], bool] = lambda: False,
    ) -> None:
        """Return once every produced record is acknowledged by the broker.

        ``step_s`` is how long one flush waits before the outage is logged; ``backoff`` is
        (initial, maximum) seconds between re-produce attempts of failed records. Raises
        :class:`DeliveryAbandonedError` when ``give_up()`` turns true while records are
        still unconfirmed.
        """
        delay = backoff[0]
        started = time.monotonic()
        while True:
            # 0 once every record is acknowledged or failed (failures are reported first).
            remaining = self._producer.flush(step_s)
            if self._failed:
                failed, self._failed = self._failed, []
                records = self._failed_records(failed)
                log.warning(
                    "event deliveries failed, producing them again",
                    extra={
                        "fields": {
                            "records": len(failed),
                            "error": failed[0][1].str(),
                            "retry_in_s": delay,
                            "action": "check that the output topics exist and the broker is up",
                        }
                    },
                )
                if give_up():
                    raise DeliveryAbandonedError(f"{len(failed)} records failed to deliver")
                time.sleep(delay)
                delay = min(delay * 2, backoff[1])
                for rec in records:
                    self._send(rec)  # still in _inflight: a retry does not add it again
                continue
            if not remaining:
                self._inflight.clear()
                break
            log.warning(
                "waiting for event deliveries",
                extra={
                    "fields": {
                        "outstanding": remaining,
                        "waited_s": round(time.monotonic() - started, 1),
                        "action": "check the broker; the batch commits once all are delivered",
                    }
                },
            )
            if give_up():
                raise DeliveryAbandonedError(f"{remaining} deliveries unconfirmed")
        self._watch.alive()

    def close(self, timeout_s: float) -> int:
        """Flush what is left; returns the number of records still undelivered."""
        remaining: int = self._producer.flush(timeout_s)
        return remaining


def raise_if_fatal(msg: Message) -> KafkaError | None:
    """A consumed message's error: fatal ones raise, others are returned for logging."""
    err: KafkaError | None = msg.error()
    if err is not None and err.fatal():
        raise KafkaException(err)
    return err
