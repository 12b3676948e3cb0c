"""The service: start the clients, run the batch loop until told to stop, shut down cleanly.

One instance consumes every partition of the input topics against one index it owns
(RocksDB's lock: a second process on the same directory stops at start-up with
:class:`~stream_dedup.errors.IndexLockedError`), or many instances of one group share a
Redis index (``docs/shared-index.md``). A restarted instance resumes from the offsets
stored in the index (``docs/commit-protocol.md``).

:class:`Service` only starts and stops things: each turn of its loop is a verb of the
batches' owner, :class:`~stream_dedup.service.lifecycle.BatchLife`, which takes a batch,
has the sketch worker (:mod:`.prefetch`) sketch it while the batch before it is decided
and committed by the commit strategy chosen at start
(:mod:`stream_dedup.service.checkpoint`). Bad input never stops the loop: a message that
cannot be decoded, or whose processing raises, goes to the dead-letter topic
(:mod:`stream_dedup.service.decide`) and its offset is committed like any other.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaException
from prometheus_client import CollectorRegistry

from stream_dedup.dedup import Deduplicator
from stream_dedup.index import DedupIndex
from stream_dedup.index.params import IndexParams
from stream_dedup.logs import fields
from stream_dedup.service import gc_tuning
from stream_dedup.service.broker_watch import BrokerWatch
from stream_dedup.service.check_http import CheckEndpoint
from stream_dedup.service.check_process import CheckProcess
from stream_dedup.service.checkpoint import CommitStrategy, kafka_commit_reporter, open_strategy
from stream_dedup.service.config import ServiceConfig
from stream_dedup.service.decide import Decider
from stream_dedup.service.http import HttpEndpoints
from stream_dedup.service.index_outage import IndexOutage
from stream_dedup.service.inputs import InputDecoder
from stream_dedup.service.kafka import DeliveryAbandonedError, build_consumer
from stream_dedup.service.lifecycle import BatchLife
from stream_dedup.service.metrics import Metrics
from stream_dedup.service.ordering import RecordTime
from stream_dedup.service.prefetch.ahead import SketchAhead
from stream_dedup.service.prefetch.worker import SketchWorkerError
from stream_dedup.service.starting import join_notice, log_started, open_configured_index
from stream_dedup.service.stopping import StartInterruptedError, StopRequest
from stream_dedup.service.switching import switch_interval

log = logging.getLogger("stream_dedup.service")


#: Keys between progress lines while the key filter is built at start-up (a few seconds).
_FILTER_LOG_EVERY = 5_000_000
DeduplicatorFactory = Callable[[DedupIndex, ServiceConfig], Deduplicator]


def default_deduplicator(index: DedupIndex, config: ServiceConfig) -> Deduplicator:
    return Deduplicator(index, config.dedup)


class Service:
    """``stream-dedup run``: construct, then :meth:`run` until :meth:`stop`.

    The constructor binds the HTTP port, then opens the index (so a busy port or a second
    instance fails before touching Kafka, and a busy port before creating the index), but
    opens no Kafka connection; :meth:`run` serves the port and starts the Kafka clients.
    A shared index's Redis is waited for while the port is served already (healthy, not
    ready), up to ``index.redis.outage_limit_s``.
    """

    def __init__(
        self,
        config: ServiceConfig,
        registry: CollectorRegistry | None = None,
        deduplicator: DeduplicatorFactory = default_deduplicator,
        stop: StopRequest | None = None,
    ) -> None:
        """``stop``: the request that SIGTERM/SIGINT set, when the command installed its
        handlers before building the service (``stream-dedup run`` does, first thing)."""
        self.config = config
        self._stop = stop if stop is not None else StopRequest()
        self._stop.bound(config.service.shutdown_timeout_s)
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = Metrics(self.registry)
        self._last_beat = time.monotonic()
        self._filter_logged = 0
        self._index_open = True
        #: The batches' owner and its commit strategy, from the start of :meth:`run` on.
        self._life: BatchLife | None = None
        self._strategy: CommitStrategy | None = None
        self.http: HttpEndpoints | None = None
        #: The process answering checks on their own port (``http.check_process``).
        self.checks: CheckProcess | None = None
        if config.http.enabled:
            http = config.http
            self.http = HttpEndpoints(http.host, http.port, self.registry, self.health, self.ready)
            if http.check_process:
                try:
                    self.checks = CheckProcess(config, self.metrics.check_process)
                except BaseException:
                    self.http.stop()
                    raise
                self.http.checks_port = self.checks.port
        #: Redis down while the service starts: that wait, for readiness (else None).
        self._opening: IndexOutage | None = None
        try:
            self.index = self._open_index()
        except BaseException:
            if self.http is not None:
                self.http.stop()
            if self.checks is not None:
                self.checks.close()
            raise
        self.dedup = deduplicator(self.index, config)
        self.metrics.index_source = lambda: (self.index.stats(), self.index.filter_bytes())
        self.metrics.apply_failures_source = lambda: self.index.apply_failures()
        self._inputs = InputDecoder(
            config.input.message_format(), RecordTime(config.input.time_field)
        )
        self._decider = Decider(config, self.dedup, self.metrics)
        #: Checks may read the index: from the end of the warm-up until it closes.
        self._checks_open = False
        if self.checks is not None:
            self.index.on_commit = self.checks.notify
        elif self.http is not None:
            self.http.checks = CheckEndpoint(
                self.index,
                (self.dedup.config, self.dedup.plan),
                config.input.document_format(),
                config.http,
                self.metrics.checks,
                lambda: self._checks_open,
            )

    def _open_index(self) -> DedupIndex:
        """The configured index; a shared one's Redis is waited for as in an outage.

        Redis may come up after the service (a restart of both, a failover): opening is
        retried up to ``index.redis.outage_limit_s`` (:class:`IndexOutage`), with the HTTP
        port served meanwhile, healthy and not ready, as when Redis goes away later.
        """
        cfg = self.config
        params = IndexParams.of(cfg.dedup)
        if cfg.index.backend != "redis":
            return open_configured_index(cfg.index, params)
        if self.http is not None:
            self.http.start()
        self._opening = IndexOutage(
            cfg.index.redis.outage_limit_s, self.metrics, self._keep_opening
        )
        index = self._opening.call(
            "opening the index", lambda: open_configured_index(cfg.index, params)
        )
        self._opening = None
        return index

    def _keep_opening(self) -> bool:
        """While Redis is waited for at start: beat, and give up when a stop is asked."""
        self._beat()
        return not self._stop.is_set()

    # -- control -------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the loop to finish its batch, checkpoint and return (thread- and signal-safe)."""
        self._stop.request()

    def _keep_waiting(self) -> bool:
        """While confirming deliveries: beat, and give up only when a stop is overdue."""
        self._beat()
        waited = self._stop.waited_s()
        return waited is None or waited < self.config.service.shutdown_timeout_s * 0.8

    def _beat(self) -> None:
        self._last_beat = time.monotonic()

    def _filter_progress(self, added: int) -> None:
        """While the key filter is built at start-up: beat, log every ~5 million keys, and
        give up the build when a stop is requested (the epochs built so far are saved at
        close; the next start builds the rest)."""
        self._beat()
        if self._stop.is_set():
            raise StartInterruptedError
        if added >= self._filter_logged + _FILTER_LOG_EVERY:
            self._filter_logged = added
            log.info(
                "building the key filter from the index",
                extra=fields(keys_so_far=added, action="wait; the service subscribes next"),
            )

    def health(self) -> tuple[bool, dict[str, object]]:
        age = time.monotonic() - self._last_beat
        return age < self.config.http.health_max_age_s, {"last_loop_s": round(age, 3)}

    def ready(self) -> tuple[bool, dict[str, object]]:
        """Partitions assigned, the index open, and (shared index) Redis reachable."""
        assigned = self._life.assigned if self._life is not None and self._index_open else 0
        strategy, opening = self._strategy, self._opening
        reachable = (strategy is None or strategy.index_down_since is None) and (
            opening is None or opening.down_since is None
        )
        ok = assigned > 0 and self._index_open and reachable
        details: dict[str, object] = {"partitions": assigned, "index_open": self._index_open}
        if not reachable:
            details["index_reachable"] = False
        if self.checks is not None:
            checks_ok, about = self.checks.ready()
            ok, details = ok and checks_ok, details | about
        return ok, details

    # -- the loop ------------------------------------------------------------------------

    def run(self) -> int:
        """Consume until stopped; returns the exit code (0 after a clean stop)."""
        with switch_interval(self.config.service.switch_interval_ms):
            return self._run()

    def _run(self) -> int:
        ahead = self._start_worker()
        try:
            self._warm_up()
        except StartInterruptedError:
            log.info("stop requested while starting; no Kafka client was started")
            self._release(ahead)
            return 0
        consumer_watch = BrokerWatch("consumer")
        consumer = build_consumer(
            self.config.client_settings(),
            consumer_watch,
            self.metrics.on_statistics,
            on_commit=kafka_commit_reporter(self.metrics),
        )
        strategy = open_strategy(
            self.config, consumer, self._decider, self.metrics, self._keep_waiting
        )
        self._strategy = strategy
        life = BatchLife(
            self.config,
            self.index,
            consumer,
            strategy,
            ahead,
            self._inputs,
            self.metrics,
            self._stop.event,
        )
        self._life = life
        consumer.subscribe(
            list(self.config.input.topics),
            on_assign=life.assign,
            on_revoke=life.revoke,
            on_lost=life.lose,
        )
        log_started(self.config, self.index, self.http, self.checks)
        life.start()
        code = 0
        joining: float | None = time.monotonic()  # until the first assignment
        gc_tuning.enter()
        try:
            while not self._stop.is_set():
                self._beat()
                gc_tuning.collect_due()
                if joining is not None:
                    joining = join_notice(self.config, joining, life.assigned)
                if consumer_watch.fatal is not None:
                    raise KafkaException(consumer_watch.fatal)
                if life.turn():
                    consumer_watch.alive()
            life.finish()
        except DeliveryAbandonedError as exc:
            log.warning(
                "stopped before the last batch was confirmed; it will be replayed",
                extra=fields(error=str(exc), action="none: replayed events are identical"),
            )
            life.abandon()
            code = 1
        except BaseException as exc:
            # A batch failed (the index could not be written, a bug): decide nothing more;
            # everything from the last stored batch on is consumed again at the next start.
            life.abandon()
            log.error(
                "stopping: the service cannot go on",
                extra=fields(
                    error=f"{type(exc).__name__}: {exc}",
                    action="fix the cause and start again; the batch not stored is replayed",
                ),
            )
            raise
        finally:
            self._shutdown(consumer, strategy, ahead)
            gc_tuning.leave()
        return code

    def _start_worker(self) -> SketchAhead:
        """The HTTP port and the sketch worker (it loads while :meth:`_warm_up` runs)."""
        cfg = self.config
        if self.http is not None and not self.http.started:
            self.http.start()
        ahead = SketchAhead(
            self.dedup.config if cfg.service.sketch_worker else None,
            self._inputs,
            self._worker_failed,
            cfg.service.sketch_inline_max,
            lambda: self.dedup.payload_dictionary.dictionary,
        )
        self.metrics.sketch_source = lambda: (ahead.worker_sketched, self.dedup.sketched_here)
        return ahead

    def _warm_up(self) -> None:
        """The key filter and the compiled kernels, before the first Kafka client; a stop
        requested meanwhile ends the start here."""
        self.index.load_filter(self._filter_progress)
        self.dedup.warm_up(log.info)  # says so first when the kernels must be compiled
        self._checks_open = True  # the key filter is built: checks only read it now
        if self.checks is not None:
            self.checks.start()  # it follows the index from here on
        if self._stop.is_set():
            raise StartInterruptedError

    def _shutdown(self, consumer: Consumer, strategy: CommitStrategy, ahead: SketchAhead) -> None:
        """Leave the group, then release everything else even if leaving failed: the
        revoke callback commits leftovers, and an index error there must not keep the
        index's lock held or the HTTP port open."""
        self._stop.event.set()
        try:
            consumer.close()  # leaves the group; the revoke callback commits leftovers
        except (KafkaException, RuntimeError) as exc:
            log.warning("consumer close failed", extra=fields(error=str(exc)))
        finally:
            left = strategy.close(5.0)
            if left:
                log.warning("records left undelivered at exit", extra=fields(records=left))
            self._release(ahead)

    def _release(self, ahead: SketchAhead | None) -> None:
        """Close the sketch worker, the index and the HTTP port."""
        if ahead is not None:
            ahead.close()
        self._index_open = False
        self._checks_open = False
        if self.checks is not None:
            self.checks.close()
        self.index.close()  # waits for a check reading it (see check_http)
        if self.http is not None:
            self.http.stop()
        log.info("stopped", extra=fields(documents=self.index.counter("documents")))

    def _worker_failed(self, exc: SketchWorkerError) -> None:
        self.metrics.sketch_worker_failures.inc()
        log.warning(
            "sketch worker failed; this batch is decoded and sketched in the service process",
            extra=fields(
                error=str(exc),
                action="none: verdicts are unaffected; a dead worker is started again",
            ),
        )
