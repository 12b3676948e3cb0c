"""What the service opens and says as it starts: the configured index, the start line, and
a notice when the consumer group is slow to form.

Kept out of :mod:`.loop` (which starts and stops the parts and runs the batch loop) because
these are the operator-facing edges of a start: which index the settings name, what the
log says once the clients are up, and why a quiet log before the first assignment is not a
hang.
"""

from __future__ import annotations

import logging
import time

from stream_dedup.index import DedupIndex, open_index
from stream_dedup.index.params import IndexParams
from stream_dedup.logs import fields
from stream_dedup.service.check_process import CheckProcess
from stream_dedup.service.config import IndexConfig, ServiceConfig
from stream_dedup.service.http import HttpEndpoints

__all__ = ["JOIN_NOTICE_S", "join_notice", "log_started", "open_configured_index"]

log = logging.getLogger("stream_dedup.service")

#: How long the first assignment may take before the log says the group is still forming
#: (a broker holds a join until earlier members' ``session.timeout.ms`` has run out).
JOIN_NOTICE_S = 10.0


def open_configured_index(settings: IndexConfig, params: IndexParams) -> DedupIndex:
    """The index the ``[index]`` settings name: a RocksDB directory this instance owns, or
    the Redis index every instance of the group shares."""
    return open_index(
        settings.location(),
        params,
        sync=settings.sync,
        retention=settings.policy(),
    )


def join_notice(config: ServiceConfig, since: float, assigned: int) -> float | None:
    """Before the first assignment: say once when the group takes long to form, so a quiet
    log is not taken for a hang. Returns ``since`` while still waiting quietly, ``None``
    once partitions are assigned or the notice is given."""
    if assigned:
        return None
    if time.monotonic() - since < JOIN_NOTICE_S:
        return since
    log.info(
        "still waiting for the consumer group to assign partitions",
        extra=fields(
            group=config.kafka.get("group.id"),
            topics=list(config.input.topics),
            action="wait: a broker holds a join until earlier members' session.timeout.ms "
            "has passed; check that the input topics exist",
        ),
    )
    return None


def log_started(
    config: ServiceConfig,
    index: DedupIndex,
    http: HttpEndpoints | None,
    checks: CheckProcess | None,
) -> None:
    """The start line: where the service reads, writes and listens, once its Kafka clients
    are built and before the group is joined."""
    log.info(
        "started",
        extra=fields(
            topics=list(config.input.topics),
            unique_topic=config.unique_topic,
            duplicate_topic=config.duplicate_topic,
            dlq_topic=config.dlq_topic,
            index=index.location,
            indexed_documents=index.counter("documents"),
            http_port=http.port if http else None,
            check_port=checks.port if checks else None,
            group=config.kafka.get("group.id"),
            next="joining the consumer group; partitions are logged when assigned",
        ),
    )
