"""Connecting to Redis (a node or a cluster) and naming what failed there.

Shared by the Redis backend's parts: one place decides whether a URL is a cluster, and
one place turns a Redis error into the index's own errors, so that the service's outage
handling (``service/index_outage.py``) sees :class:`~stream_dedup.errors.IndexUnreachableError`
whatever step failed, and a lost lease is told apart from an outage.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import redis
from redis.cluster import RedisCluster

from stream_dedup.errors import IndexLeaseLostError, IndexUnreachableError

__all__ = ["connect", "failing"]


def connect(
    url: str, location: str, password: str | None, ca: str | None, timeout_s: float
) -> redis.Redis | RedisCluster:
    """A client for ``url``: a cluster client when the server says it is in a cluster."""
    options: dict[str, Any] = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s}
    if password:
        options["password"] = password
    if ca:
        options["ssl_ca_certs"] = ca
    try:
        probe = redis.Redis.from_url(url, **options)
        try:
            info = probe.info("cluster")
        finally:
            probe.close()
        if info.get("cluster_enabled"):
            return RedisCluster.from_url(url, **options)
        return redis.Redis.from_url(url, **options)
    except (redis.RedisError, OSError, ValueError) as exc:
        raise IndexUnreachableError(location, "connecting", str(exc)) from exc


@contextlib.contextmanager
def failing(location: str, operation: str) -> Iterator[None]:
    """Redis errors inside as the index's: a lost lease, else an unreachable index."""
    try:
        yield
    except redis.ResponseError as exc:
        if "LEASE lost" in str(exc):
            raise IndexLeaseLostError(location) from exc
        raise IndexUnreachableError(location, operation, str(exc)) from exc
    except (redis.RedisError, OSError) as exc:
        raise IndexUnreachableError(location, operation, str(exc)) from exc
