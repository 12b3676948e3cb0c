"""The service's one HTTP port: ``/metrics``, ``/healthz``, ``/readyz``, and the checks
(``POST /check``, ``POST /check/batch``: :mod:`stream_dedup.service.check_http`).

``/healthz`` answers 200 while the loop is alive (its last iteration is recent) and 503
when it is stuck, so an orchestrator restarts it. ``/readyz`` answers 200 when partitions
are assigned and the index is open. Both bodies are one short JSON object saying why.
``/metrics`` answers 500 with the error, rather than closing the connection, if a
collector fails (reading the index's size from a directory that is gone, say).
An address that cannot be bound is a :class:`~stream_dedup.errors.ConfigError` naming
``http.port`` (or ``http.host``) and the address.
"""

from __future__ import annotations

import errno
import json
import logging
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from stream_dedup.errors import ConfigError

if TYPE_CHECKING:
    from stream_dedup.service.check_http import CheckEndpoint

log = logging.getLogger("stream_dedup.http")

#: A probe returns (ok, details for the body).
Probe = Callable[[], tuple[bool, dict[str, object]]]


#: The paths of the checks (``check_http.CHECK_PATHS``, spelled here so that the port
#: loads the checks' modules only once the service hands it an endpoint).
_CHECKS = ("/check", "/check/batch")


class HttpEndpoints:
    """A small threaded HTTP server on a daemon thread.

    :attr:`checks` answers the check paths once the service sets it (after its index is
    open); until then they answer 503. When :attr:`checks_port` is set instead, another
    process answers them there: a POST here gets 421 naming that port, its body unread.
    ``sock``: a socket already bound and listening to serve (the check process is handed
    the one its service bound), instead of binding ``host:port``.
    """

    def __init__(
        self,
        host: str,
        port: int,
        registry: CollectorRegistry,
        health: Probe,
        ready: Probe,
        sock: socket.socket | None = None,
    ) -> None:
        self.registry = registry
        self.routes: dict[str, Probe] = {"/healthz": health, "/readyz": ready}
        self.checks: CheckEndpoint | None = None
        self.checks_port: int | None = None
        if sock is not None:
            self._server = _Server(sock.getsockname(), _Handler, False)
            self._server.socket.close()
            self._server.socket = sock
        else:
            try:
                self._server = _Server((host, port), _Handler)
            except OSError as exc:
                raise cannot_listen(host, port, exc) from exc
        self._server.daemon_threads = True
        self._server.endpoints = self
        self._thread = threading.Thread(target=self._server.serve_forever, name="http", daemon=True)

    @property
    def port(self) -> int:
        port: int = self._server.server_address[1]
        return port

    @property
    def started(self) -> bool:
        return self._thread.is_alive()

    def start(self) -> None:
        """Serve requests (the port is bound, and listening, from construction on)."""
        self._thread.start()

    def stop(self) -> None:
        """Stop serving, if started, and release the port."""
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()


class _Server(ThreadingHTTPServer):
    """The threaded server, with the endpoints its handlers answer for."""

    endpoints: HttpEndpoints


class _Handler(BaseHTTPRequestHandler):
    """One connection's requests, answered from the :class:`HttpEndpoints` of its server."""

    server: _Server

    # Keep-alive: a client that sends many checks reuses its connection, and the
    # port takes no connection and starts no thread per request (each a wait for
    # the interpreter lock while the loop decides a batch). Every reply has a
    # Content-Length. A buffered writer (flushed by the base class after each request)
    # sends a small reply's headers and body in one write: one system call and one
    # segment, so the client wakes once per reply. TCP_NODELAY for the larger ones,
    # written in parts: without it a kept-alive reply's last part waits for the
    # client's delayed ACK (~40 ms).
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    wbufsize = 64 * 1024
    # A connection idle (or a body unsent) this long is closed: a kept-alive client
    # that went away does not hold a thread for ever.
    timeout = 60

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        routes = self.server.endpoints.routes
        if path == "/metrics":
            try:
                body = generate_latest(self.server.endpoints.registry)
            except Exception as exc:  # a collector failed: say so, keep serving
                log.exception(
                    "collecting metrics failed",
                    extra={"fields": {"action": "see the error; the loop goes on"}},
                )
                text = f"collecting metrics failed: {type(exc).__name__}: {exc}\n"
                self._send(500, "text/plain", text.encode())
                return
            self._send(200, CONTENT_TYPE_LATEST, body)
        elif path in _CHECKS:
            self._json(405, {"error": "method_not_allowed", "detail": "use POST"})
        elif path in routes:
            ok, details = routes[path]()
            payload = {"status": "ok" if ok else "unavailable", **details}
            self._send(200 if ok else 503, "application/json", json.dumps(payload).encode())
        else:
            self._send(404, "text/plain", b"not found: try /metrics, /healthz, /readyz, /check\n")

    def do_POST(self) -> None:
        path, _, query = self.path.partition("?")
        endpoints = self.server.endpoints
        checks = endpoints.checks
        if path not in _CHECKS:
            self.close_connection = True  # its body is not read
            self._json(404, {"error": "not_found", "detail": "POST /check, /check/batch"})
            return
        if checks is None and endpoints.checks_port is not None:
            self.close_connection = True
            port = endpoints.checks_port
            detail = f"checks are answered on port {port} (http.check_port)"
            self._json(421, {"error": "misdirected", "detail": detail})
            return
        if checks is None:
            self.close_connection = True
            self._json(503, {"error": "unavailable", "detail": "the index is not open"})
            return
        given = self.headers.get("Content-Length")
        length = int(given) if given is not None and given.isdigit() else None
        code, body = checks.handle(path, query, length, self.rfile.read)
        if code in (411, 413):
            self.close_connection = True  # the body was not read
        self._json(code, body)

    def _json(self, code: int, body: dict[str, object]) -> None:
        self._send(code, "application/json", json.dumps(body, ensure_ascii=False).encode())

    def _send(self, code: int, ctype: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Silence per-request access logs; scrapes would drown the service's logs."""


def cannot_listen(host: str, port: int, exc: OSError, setting: str = "http.port") -> ConfigError:
    """The error for an address the port cannot be bound to, naming the setting to change
    (``http.port``, or ``http.check_port`` for the check process's port)."""
    address = f"{host}:{port}"
    reason = exc.strerror or str(exc)
    flag = " or --http-port" if setting == "http.port" else ""
    if exc.errno == errno.EADDRINUSE:
        return ConfigError(
            setting,
            f"cannot listen on {address}: {reason} (another process holds the port): stop "
            f"it, or choose a free port with {setting}{flag} (0: any free port)",
        )
    if exc.errno == errno.EACCES:
        return ConfigError(
            setting,
            f"cannot listen on {address}: {reason}: ports below 1024 need privileges; "
            f"choose another with {setting}{flag}",
        )
    return ConfigError(
        "http.host", f"cannot listen on {address}: {reason}: check http.host and http.port"
    )
