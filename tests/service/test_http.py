"""The HTTP endpoints answer, and a failing metrics collector gives a 500 that says why."""

from __future__ import annotations

import json
import logging
import socket
import struct
import sys
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.registry import Collector

from stream_dedup.service.http import HttpEndpoints
from stream_dedup.service.metrics import Metrics
from tests.integration.support import http_get as get


class Broken(Collector):
    def collect(self) -> Iterator[object]:
        raise FileNotFoundError("index directory is gone")


@pytest.fixture
def registry() -> CollectorRegistry:
    reg = CollectorRegistry()
    Counter("stream_dedup_things", "Things.", registry=reg).inc(3)
    return reg


def serve(registry: CollectorRegistry) -> HttpEndpoints:
    endpoints = HttpEndpoints(
        "127.0.0.1", 0, registry, lambda: (True, {"loop": "alive"}), lambda: (False, {})
    )
    endpoints.start()
    return endpoints


def test_metrics_health_and_readiness_answer(registry: CollectorRegistry) -> None:
    endpoints = serve(registry)
    try:
        code, body = get(endpoints.port, "/metrics")
        assert code == 200 and "stream_dedup_things_total 3.0" in body
        code, body = get(endpoints.port, "/healthz")
        assert code == 200 and json.loads(body) == {"status": "ok", "loop": "alive"}
        assert get(endpoints.port, "/readyz")[0] == 503
        assert get(endpoints.port, "/nowhere")[0] == 404
    finally:
        endpoints.stop()


def test_a_failing_collector_gives_a_500_that_says_why(
    registry: CollectorRegistry, package_logs: list[logging.LogRecord]
) -> None:
    registry.register(Broken())
    endpoints = serve(registry)
    try:
        code, body = get(endpoints.port, "/metrics")
        assert code == 500
        assert "FileNotFoundError: index directory is gone" in body
        assert get(endpoints.port, "/healthz")[0] == 200  # the server still answers
    finally:
        endpoints.stop()
    assert any("collecting metrics failed" in r.getMessage() for r in package_logs)


@pytest.mark.skipif(sys.platform != "linux", reason="process_* metrics read /proc")
def test_metrics_include_the_process_and_platform_series() -> None:
    registry = CollectorRegistry()  # the service's own registry, not the global one
    Metrics(registry)
    endpoints = serve(registry)
    try:
        code, body = get(endpoints.port, "/metrics")
    finally:
        endpoints.stop()
    assert code == 200
    cpu = [line for line in body.splitlines() if line.startswith("process_cpu_seconds_total ")]
    assert len(cpu) == 1 and float(cpu[0].split()[1]) > 0
    assert "process_resident_memory_bytes " in body and "process_open_fds " in body
    assert "python_info{" in body
    assert registry.get_sample_value("process_start_time_seconds", {}) is not None


def test_a_connection_is_kept_alive_for_many_requests(registry: CollectorRegistry) -> None:
    """A client sending many requests (checks, scrapes) reuses one connection: HTTP/1.1,
    every reply with its length, and no 40 ms wait for a delayed ACK."""
    import http.client
    import time

    endpoints = serve(registry)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", endpoints.port, timeout=5)
        started = time.perf_counter()
        for _ in range(20):
            conn.request("GET", "/healthz")
            resp = conn.getresponse()
            assert resp.status == 200 and resp.version == 11
            assert json.loads(resp.read())["status"] == "ok"
        assert conn.sock is not None  # still the first connection
        assert time.perf_counter() - started < 0.5  # 20 x 40 ms if Nagle held the bodies
        conn.close()
    finally:
        endpoints.stop()


def data_segments_in(sock: socket.socket) -> int:
    """The data segments this TCP socket has received (Linux ``tcp_info``'s
    ``tcpi_data_segs_in``, at byte 152 since Linux 4.6)."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    return int(struct.unpack_from("<I", info, 152)[0])


@pytest.mark.skipif(sys.platform != "linux", reason="reads Linux's tcp_info")
def test_a_small_reply_is_one_segment_and_a_large_one_arrives_whole(
    registry: CollectorRegistry,
) -> None:
    """A small reply's headers and body leave in one write: one segment on the wire, so
    the client is woken once per reply (as two writes, each its own segment under
    TCP_NODELAY: 20 for these 10 replies). A reply larger than the buffer (a scrape)
    still arrives whole."""
    endpoints = serve(registry)
    try:
        with socket.create_connection(("127.0.0.1", endpoints.port), timeout=5) as sock:
            before = data_segments_in(sock)
            for _ in range(10):
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                got = sock.recv(65536)
                while b"alive" not in got:
                    got += sock.recv(65536)
            assert data_segments_in(sock) - before == 10
            for i in range(1000):
                Counter(f"stream_dedup_many_{i}", "Padding for a large scrape.", registry=registry)
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            got = b""
            while b"\r\n\r\n" not in got:
                got += sock.recv(65536)
            head, _, body = got.partition(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            assert length > 64 * 1024  # larger than the reply buffer
            while len(body) < length:
                body += sock.recv(65536)
            assert len(body) == length and b"stream_dedup_many_999_total 0.0" in body
    finally:
        endpoints.stop()
