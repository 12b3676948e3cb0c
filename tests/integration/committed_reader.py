"""A ``read_committed`` reader that decides from the transaction markers in the log itself.

A Kafka consumer with ``isolation.level=read_committed`` relies on the broker to list the
aborted transactions in each fetch response; Apache Kafka does, but the embedded test
broker (Tansu 0.6.0) always answers with an empty list, so there a read_committed consumer
also returns the records of aborted transactions (open ones it does hold back). The
markers themselves are in the log: every transaction ends with a control batch saying
COMMIT or ABORT. This reader fetches the raw record batches (Fetch v4,
read_uncommitted) and applies the rule the Kafka protocol defines: a transactional
batch's records are visible once its producer's next marker on that partition is a
COMMIT, never if it is an ABORT, and not yet while there is none. Non-transactional
records are always visible. Against Apache Kafka it returns what a read_committed
consumer returns.

Only what the tests need: one partition at a time, uncompressed batches (the service's
producer does not compress), record values and keys.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass, field

FETCH = 1
FETCH_VERSION = 4
MAX_BYTES = 16 * 1024 * 1024


@dataclass
class Log:
    """What a partition holds, as the raw reader found it."""

    committed: list[tuple[bytes | None, bytes | None]] = field(default_factory=list)
    aborted: int = 0  # records of aborted transactions (what the marker rule dropped)
    commits: int = 0
    aborts: int = 0


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    """A zigzag varint (Kafka record fields) at ``pos``: (value, next position)."""
    shift = result = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
    return (result >> 1) ^ -(result & 1), pos


def _bytes(buf: bytes, pos: int) -> tuple[bytes | None, int]:
    n, pos = _varint(buf, pos)
    if n < 0:
        return None, pos
    return buf[pos : pos + n], pos + n


def _records(body: bytes, count: int) -> list[tuple[bytes | None, bytes | None]]:
    """(key, value) of ``count`` uncompressed records (headers skipped)."""
    out = []
    pos = 0
    for _ in range(count):
        length, pos = _varint(body, pos)
        end = pos + length
        pos += 1  # attributes
        _ts, pos = _varint(body, pos)
        _delta, pos = _varint(body, pos)
        key, pos = _bytes(body, pos)
        value, pos = _bytes(body, pos)
        out.append((key, value))
        pos = end
    return out


def _fetch(host: str, port: int, topic: str, partition: int, offset: int) -> tuple[bytes, int]:
    """One Fetch v4 (read_uncommitted) from ``offset``: (record set bytes, high watermark)."""
    name = topic.encode()
    body = struct.pack(">iiiib", -1, 100, 1, MAX_BYTES, 0)
    body += struct.pack(">ih", 1, len(name)) + name
    body += struct.pack(">iiqi", 1, partition, offset, MAX_BYTES)
    header = struct.pack(">hhih", FETCH, FETCH_VERSION, 1, 4) + b"test"
    request = header + body
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(struct.pack(">i", len(request)) + request)
        size = struct.unpack(">i", _read(sock, 4))[0]
        resp = _read(sock, size)
    pos = 4 + 4  # correlation id, throttle time
    (topics,) = struct.unpack_from(">i", resp, pos)
    assert topics == 1
    pos += 4
    (n,) = struct.unpack_from(">h", resp, pos)
    pos += 2 + n
    (parts,) = struct.unpack_from(">i", resp, pos)
    assert parts == 1
    pos += 4
    _p, error, high, _lso = struct.unpack_from(">ihqq", resp, pos)
    assert error == 0, f"fetch error {error}"
    pos += 4 + 2 + 8 + 8
    (aborted,) = struct.unpack_from(">i", resp, pos)
    pos += 4 + max(aborted, 0) * 16
    (size,) = struct.unpack_from(">i", resp, pos)
    pos += 4
    return (resp[pos : pos + size] if size > 0 else b""), high


def _read(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(n)
        assert chunk, "broker closed the connection"
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_committed(bootstrap: str, topic: str, partition: int = 0) -> Log:
    """Every record of ``topic[partition]`` that a read_committed reader may see."""
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    log = Log()
    pending: dict[int, list[tuple[bytes | None, bytes | None]]] = {}
    offset = 0
    while True:
        data, high = _fetch(host, int(port), topic, partition, offset)
        pos = 0
        progressed = False
        while pos + 61 <= len(data):
            base, length = struct.unpack_from(">qi", data, pos)
            if pos + 12 + length > len(data):
                break  # a partial batch at the end of the response
            batch = data[pos : pos + 12 + length]
            pos += 12 + length
            (attributes, last_delta) = struct.unpack_from(">hi", batch, 21)
            producer, _epoch, _seq, count = struct.unpack_from(">qhii", batch, 43)
            assert attributes & 0x07 == 0, "compressed batches are not read here"
            records = _records(batch[61:], count)
            offset = max(offset, base + last_delta + 1)
            progressed = True
            if attributes & 0x20:  # a control batch: the transaction's marker
                key = records[0][0] or b""
                kind = struct.unpack_from(">hh", key)[1]
                done = pending.pop(producer, [])
                if kind == 1:
                    log.committed += done
                    log.commits += 1
                else:
                    log.aborted += len(done)
                    log.aborts += 1
            elif attributes & 0x10:  # transactional: wait for the marker
                pending.setdefault(producer, []).extend(records)
            else:
                log.committed += records
        if not progressed or offset >= high:
            return log
