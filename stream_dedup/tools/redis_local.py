"""Local Redis servers for tests and benchmarks: one node, or a cluster of three masters,
on loopback.

Started from the Debian package ``redis-server`` (``.ci/run`` installs it when missing),
in a directory of the caller's, on free ports, without persistence (except
:class:`PersistentNode`, which outlives a restart).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis


def free_port() -> int:
    """A loopback port free now whose cluster bus port (+10000) is free too."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port + 10000 > 65535:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


def redis_server_binary() -> str | None:
    """Where ``redis-server`` is, or ``None``."""
    return shutil.which("redis-server")


def _start(directory: Path, port: int, *extra: str) -> subprocess.Popen[bytes]:
    directory.mkdir(parents=True, exist_ok=True)
    binary = redis_server_binary()
    if binary is None:
        raise RuntimeError("redis-server is not installed: apt-get install redis-server")
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    args += ["--appendonly", "no", "--dir", str(directory), *extra]
    with (directory / "server.log").open("wb") as log:  # the server keeps its own handle
        return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)


def _wait_ping(client: redis.Redis, deadline: float) -> None:
    """Until ``client`` gets an answer (the server is up); closes it."""
    try:
        while True:
            try:
                if client.ping():
                    return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    finally:
        client.close()


def _local(port: int) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=0.5)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def single_node(directory: Path) -> Iterator[str]:
    """A Redis server; yields its URL."""
    port = free_port()
    proc = _start(directory, port)
    try:
        _wait_ping(_local(port), time.monotonic() + 20)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        _stop([proc])


class PersistentNode:
    """A Redis server that keeps its data in its directory (an AOF written at every
    command) and can be stopped and started again on the same port: an outage, for tests
    of what rides one out."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the server (loading what it stored) and wait until it answers."""
        extra = ("--appendonly", "yes", "--appendfsync", "always")
        self._proc = _start(self.directory, self.port, *extra)
        _wait_ping(_local(self.port), time.monotonic() + 20)

    def stop(self) -> None:
        """Stop the server (SIGTERM: it finishes its AOF); refused connections follow."""
        if self._proc is not None:
            _stop([self._proc])
            self._proc = None


@contextmanager
def persistent_node(directory: Path) -> Iterator[PersistentNode]:
    """A :class:`PersistentNode`, started; stopped at the end."""
    node = PersistentNode(directory)
    node.start()
    try:
        yield node
    finally:
        node.stop()


def _certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A throw-away CA and a server certificate for 127.0.0.1, made with ``openssl``."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("openssl is not installed: apt-get install openssl")
    directory.mkdir(parents=True, exist_ok=True)
    ca, ca_key = directory / "ca.crt", directory / "ca.key"
    cert, key, csr = directory / "server.crt", directory / "server.key", directory / "server.csr"
    ext = directory / "ext.cnf"
    ext.write_text("subjectAltName=IP:127.0.0.1\n", encoding="utf-8")
    days = ["-days", "2"]
    steps: list[list[str | Path]] = [
        ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca, *days],
        ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr],
        ["x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", *days],
    ]
    steps[0] += ["-subj", "/CN=stream-dedup test CA"]
    steps[1] += ["-subj", "/CN=127.0.0.1"]
    steps[2] += ["-out", cert, "-extfile", ext]
    for step in steps:
        subprocess.run([openssl, *map(str, step)], check=True, capture_output=True, timeout=60)
    return ca, cert, key


@contextmanager
def tls_node(directory: Path, password: str) -> Iterator[tuple[str, Path]]:
    """A Redis server that speaks TLS only and wants ``password``; yields its
    ``rediss://`` URL (without the password) and the CA file that signed its certificate."""
    ca, cert, key = _certificates(directory / "tls")
    port = free_port()
    proc = _start(
        directory,
        port,
        *("--port", "0", "--tls-port", str(port), "--tls-auth-clients", "no"),
        *("--tls-cert-file", str(cert), "--tls-key-file", str(key)),
        *("--tls-ca-cert-file", str(ca), "--requirepass", password),
    )
    try:
        client = redis.Redis(
            host="127.0.0.1", port=port, ssl=True, ssl_ca_certs=str(ca), password=password
        )
        _wait_ping(client, time.monotonic() + 20)
        yield f"rediss://127.0.0.1:{port}/0", ca
    finally:
        _stop([proc])


@contextmanager
def cluster(directory: Path, masters: int = 3) -> Iterator[str]:
    """A Redis Cluster of ``masters`` masters (no replicas); yields one node's URL."""
    ports = [free_port() for _ in range(masters)]
    procs = [
        _start(
            directory / str(port),
            port,
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "5000",
        )
        for port in ports
    ]
    try:
        deadline = time.monotonic() + 20
        for port in ports:
            _wait_ping(_local(port), deadline)
        cli = shutil.which("redis-cli")
        if cli is None:
            raise RuntimeError("redis-cli is not installed: apt-get install redis-server")
        nodes = [f"127.0.0.1:{p}" for p in ports]
        subprocess.run(
            [cli, "--cluster", "create", *nodes, "--cluster-replicas", "0", "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        client = redis.Redis(port=ports[0])
        try:
            while client.cluster("info").get("cluster_state") != "ok":
                if time.monotonic() > deadline + 40:
                    raise TimeoutError("the test Redis Cluster did not become ready")
                time.sleep(0.1)
        finally:
            client.close()
        yield f"redis://127.0.0.1:{ports[0]}/0"
    finally:
        _stop(procs)
