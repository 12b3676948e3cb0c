"""The shared index's writes after the lease: redo records read through, applied in order.

A write releases the lease at its commit point (its versioned redo record) and is
applied afterwards (``index/redis_redo.py``). What must hold, on a real Redis node and a
3-master cluster: the next holder reads a write not applied yet as if it were; a write
whose applier died is applied by the next write; and a late applier of an older write
never puts its values over a newer write's.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import hiredis
import numpy as np
import pytest
import redis

from stream_dedup.core import jit
from stream_dedup.dedup import Deduplicator
from stream_dedup.index import keys
from stream_dedup.index.redis_backend import RedisBackend
from stream_dedup.index.redis_layout import decode_redo, encode_redo
from stream_dedup.index.redis_overlay import Overlay
from stream_dedup.index.redis_redo import VERSION_FIELD, versioned
from stream_dedup.index.redis_resp import apply_commands, resp_bulks
from stream_dedup.index.redis_wire import Command, Packed
from stream_dedup.models import Document

from .shared_instances import decide_and_store
from .test_dedup import article


def backend_of(dedup: Deduplicator) -> RedisBackend:
    backend = dedup.index._backend
    assert isinstance(backend, RedisBackend)
    return backend


def commit_then_die(dedup: Deduplicator, docs: list[Document]) -> int:
    """Decide ``docs`` and store them up to the commit point, as a process killed right
    after it would: the lease is let go, nothing of the write is applied. Its version."""
    backend = backend_of(dedup)
    with dedup.index.exclusive():
        write = dedup.prepare(dedup.decide(docs)).write
        version, _ = backend.commit_point(write)
    return int(version)


def arguments_of(command: Command | Packed) -> Command:
    """A command's arguments, whether sent as arguments or packed from a redo record."""
    return command.arguments() if isinstance(command, Packed) else command


def record_commands(backend: RedisBackend, monkeypatch: pytest.MonkeyPatch) -> list[Command]:
    """Every command ``backend`` sends in batches from now on, by its arguments."""
    sent: list[Command] = []
    run = backend._wire.run

    def recording(commands: Sequence[Command | Packed]) -> list[Any]:
        sent.extend(map(arguments_of, commands))
        return run(commands)

    monkeypatch.setattr(backend._wire, "run", recording)
    return sent


def originals(n: int) -> list[Document]:
    return [Document(f"o{i}", article(i)) for i in range(n)]


def test_the_lease_is_free_at_the_commit_point(shared: Callable[[], Deduplicator]) -> None:
    first = shared()
    backend = backend_of(first)
    with first.index.exclusive():
        first.index.apply(first.prepare(first.decide(originals(3))))
        assert not backend._client.exists(backend._lock)  # released before the write applied
        assert backend.released_at is not None
        assert first.index.lease_end() == backend.released_at
    backend.wait_applied()
    assert backend._client.hlen(backend._redos) == 0  # applied, then its record deleted


def test_the_next_holder_reads_a_write_not_applied_yet(
    shared: Callable[[], Deduplicator],
) -> None:
    """Nothing of the write is in the hashes, yet the next lease sees its verdicts, its
    documents and its counters; the next write applies it first, then itself."""
    first, second = shared(), shared()
    decide_and_store(second, [Document("warm", article(9999))])
    version = commit_then_die(first, originals(8))
    backend = backend_of(second)
    assert backend.get_many([keys.verdict_key("o2")]) == [None]  # outside a lease: stored
    with second.index.exclusive():
        assert second.index.counter("documents") == 9
        assert backend.get_many([keys.verdict_key("o2")]) != [None]
    copies = [Document(f"c{i}", article(i) + " update") for i in range(8)]
    assert decide_and_store(second, copies) == {f"c{i}": f"o{i}" for i in range(8)}
    backend.wait_applied()  # the write is applied on the applier thread
    assert backend._client.hlen(backend._redos) == 0
    assert backend.get_many([keys.verdict_key("o2")]) != [None]  # applied by second
    applied = backend._client.get(backend._keys.applied)
    assert applied is not None and int(applied) == version + 1
    third = shared()
    assert third.index.counter("documents") == 17
    assert decide_and_store(third, [Document("o5", article(5))]) == {"o5": None}  # replayed


def test_a_read_in_the_lease_asks_redis_only_for_what_no_waiting_record_holds(
    shared: Callable[[], Deduplicator], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The waiting record's values are newer than the stored ones: a read inside the
    lease takes them from the record and sends only the other keys to Redis."""
    first, second = shared(), shared()
    decide_and_store(second, [Document("warm", article(9999))])
    commit_then_die(first, originals(8))
    backend = backend_of(second)
    sent = record_commands(backend, monkeypatch)
    held, absent = keys.verdict_key("o2"), keys.verdict_key("nobody")
    with second.index.exclusive():
        sent.clear()
        got = backend.get_many([held, absent, keys.verdict_key("warm")])
    assert got[0] is not None and got[1] is None and got[2] is not None
    asked = [field for command in sent if command[0] == b"HMGET" for field in command[2:]]
    assert sorted(asked) == sorted([absent, keys.verdict_key("warm")])


def test_a_late_applier_never_writes_over_a_newer_write(
    shared: Callable[[], Deduplicator],
) -> None:
    """An instance paused between its commit point and its apply: the next write applies
    its write and then the newer one; when it wakes and applies its own, the newer
    values (counters, verdicts, buckets) stay."""
    first, second = shared(), shared()
    backend = backend_of(first)
    with first.index.exclusive():
        write = first.prepare(first.decide(originals(5))).write
        version, _ = backend.commit_point(write)
    again = [Document(f"o{i}", article(i) + " revised, a new paragraph") for i in range(5)]
    decide_and_store(second, [*again, Document("n1", article(77))])
    backend_of(second).wait_applied()
    rest = write.flat().grouped(backend._keys)
    snapshot = {name: backend._client.hgetall(name) for name in rest if name} | {
        b"own": backend._client.mget(rest[b""][0])
    }
    # first wakes up: its part of every hash and of the own keys, as apply sends them
    replies = backend._wire.run(versioned(backend._keys, int(version), rest))
    # refused where the newer write went; elsewhere the same values again (the newer
    # write's applier applied this one first)
    assert 0 in replies
    after = {name: backend._client.hgetall(name) for name in rest if name} | {
        b"own": backend._client.mget(rest[b""][0])
    }
    assert after == snapshot
    # the newer write reached hashes this one writes too (the verdicts of o0-o4)
    applied = [int(backend._client.hget(name, VERSION_FIELD) or 0) for name in rest if name]
    assert max(applied) > int(version)
    assert second.index.counter("documents") == 11
    with first.index.exclusive():
        assert first.index.counter("documents") == 11


def test_the_overlay_finds_every_value_a_redo_record_writes_and_nothing_else(
    shared: Callable[[], Deduplicator],
) -> None:
    """A real write's record: every field found with its value (band buckets by number,
    the rest by key), own keys by their index key, other epochs and absent keys not."""
    first = shared()
    decide_and_store(first, originals(30))
    with first.index.exclusive():
        write = first.prepare(first.decide(originals(60)[30:])).write
    epoch, wanted, expected, _ = decode_redo(write.redo)
    # a real batch's buckets go into the record packed, straight from the arrays
    assert epoch == write.epoch and write.rest is None
    overlay = Overlay([write.redo])
    own = [v for k, v in zip(wanted, expected, strict=True) if k[0] not in keys.SCOPED]
    assert sum(k[:1] == b"b" for k in wanted) > 100 and own
    absent = [keys.verdict_key("nobody"), b"b" + bytes(10), wanted[-1][:-1] + b"\xff"]
    got: list[bytes | None] = [None] * (len(wanted) + len(absent))
    # the positions filled are those a read inside the lease does not ask Redis for
    assert overlay.fill(epoch, [*wanted, *absent], got) == set(range(len(wanted)))
    assert got == [*expected, None, None, None]
    assert any(k[:1] == b"d" for k in wanted)  # the document records travel in it too
    other: list[bytes | None] = [None] * len(wanted)
    filled = overlay.fill(epoch + 1, wanted, other)  # another epoch's records: only own keys
    assert [v for v in other if v is not None] == own and len(filled) == len(own)


def test_a_filter_built_while_a_write_waits_learns_its_keys_from_the_log(
    shared: Callable[[], Deduplicator],
) -> None:
    """An instance's first batch builds its key filter from a scan of the hashes: a
    write past its commit point but not applied is not in them, so the filter follows
    the log from before it and learns its keys there."""
    first, second = shared(), shared()
    decide_and_store(first, [Document("warm", article(9999))])
    commit_then_die(first, originals(6))
    copies = [Document(f"c{i}", article(i) + " update") for i in range(6)]
    assert decide_and_store(second, copies) == {f"c{i}": f"o{i}" for i in range(6)}


@pytest.mark.parametrize("layout", ["sorted", "unsorted", "loose"])
def test_the_overlay_finds_buckets_however_a_record_lays_them_out(layout: str) -> None:
    """A batch's record holds its band buckets last and in key order (searched as they
    lie); any other record (buckets out of order, or one among the mixed keys) is
    searched by number: the same values either way, absent keys not found."""
    rng = random.Random(5)
    keyset = {b"b" + bytes(rng.randrange(256) for _ in range(10)) for _ in range(300)}
    keyset.add(b"b\x01" + bytes(9))  # trailing zero bytes compare as bytes do
    pairs = [(k, b"%d" % i) for i, k in enumerate(sorted(keyset))]
    mixed = [(keys.verdict_key("a"), b"va"), (keys.counter_key("documents"), b"7")]
    if layout == "unsorted":
        pairs.reverse()
    if layout == "loose":
        mixed.append(pairs.pop(7))
    record = [*mixed, *pairs]
    blob = encode_redo(3, [k for k, _ in record], [v for _, v in record], len(mixed))
    absent = [b"b" + bytes(10), b"b\x01" + bytes(8) + b"\x01", keys.verdict_key("b")]
    wanted = [k for k, _ in reversed(record)] + absent
    got: list[bytes | None] = [None] * len(wanted)
    filled = Overlay([blob]).fill(3, wanted, got)
    assert got == [v for _, v in reversed(record)] + [None] * len(absent)
    assert filled == set(range(len(record)))


def test_the_turn_is_handed_over_at_the_commit_point(
    shared: Callable[[], Deduplicator],
) -> None:
    """``committed`` runs once the lease is free and the write is its redo record,
    before any of it is applied: the next holder can take the lease there and reads the
    write through the record; the writer applies it after the hand-over."""
    first, second = shared(), shared()
    decide_and_store(second, [Document("warm", article(9999))])
    backend, other = backend_of(first), backend_of(second)
    seen: dict[str, Any] = {}

    def hand_over() -> None:
        seen["lock"] = backend._client.exists(backend._lock)
        seen["records"] = backend._client.hlen(backend._redos)
        seen["outside"] = other.get_many([keys.verdict_key("o2")])
        with second.index.exclusive():
            seen["inside"] = other.get_many([keys.verdict_key("o2")])
            seen["documents"] = second.index.counter("documents")

    with first.index.exclusive():
        first.index.apply(first.prepare(first.decide(originals(4))), hand_over)
    assert seen["lock"] == 0 and seen["records"] == 1
    assert seen["outside"] == [None]  # not applied yet
    assert seen["inside"] != [None] and seen["documents"] == 5
    backend.wait_applied()  # applied after the hand-over, on the applier thread
    assert backend._client.hlen(backend._redos) == 0
    assert other.get_many([keys.verdict_key("o2")]) != [None]


def test_an_applier_leaves_a_live_writers_record_to_it(
    shared: Callable[[], Deduplicator], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The next writer finds the write before its own still waiting while that write's
    writer applies it: it waits for it instead of sending the same write again."""
    first, second = shared(), shared()
    decide_and_store(second, [Document("warm", article(9999))])
    backend, other = backend_of(first), backend_of(second)
    with first.index.exclusive():
        write = first.prepare(first.decide(originals(6))).write
        version, waiting = backend.commit_point(write)
        backend._queue.keep(version, write.redo, write.rest)
    sent = record_commands(other, monkeypatch)
    late = threading.Timer(0.3, backend._queue.apply, (waiting, backend._epoch_set))
    late.start()  # the writer applies its own write while the next one is stored
    copies = [Document(f"c{i}", article(i) + " update") for i in range(6)]
    started = time.monotonic()
    assert decide_and_store(second, copies) == {f"c{i}": f"o{i}" for i in range(6)}
    other.wait_applied()  # its applier thread waits for the writer
    late.join()
    assert 0.2 < time.monotonic() - started < 1.0  # waited for the writer, not the grace
    versions = {int(c[5]) for c in sent if c[0] == b"EVAL" and c[3] != other._keys.applied}
    assert int(version) not in versions and versions  # its own write only
    assert other._client.hlen(other._redos) == 0
    third = shared()
    assert third.index.counter("documents") == 13
    assert decide_and_store(third, [Document("o3", article(3))]) == {"o3": None}


def written_fields(commands: Sequence[Command | Packed]) -> dict[bytes, dict[bytes, bytes]]:
    """What ``commands`` (a write's apply) set, by container (``b""``: the own keys); a
    packed command's arguments checked to be what it sends, byte for byte."""
    out: dict[bytes, dict[bytes, bytes]] = {}
    for command in commands:
        if isinstance(command, Packed):
            assert hiredis.pack_command(command.arguments()) == command.data
            command = command.arguments()
        assert command[0] == b"EVAL"
        if command[2] == 1:  # a record hash: name, version field, version, pairs
            pairs = command[6:]
            out.setdefault(command[3], {}).update(zip(pairs[::2], pairs[1::2], strict=True))
        else:  # own keys: the applied version's key, the keys, the version, the values
            n = command[2]
            own = zip(command[4 : 3 + n], command[4 + n :], strict=True)
            out.setdefault(b"", {}).update(own)
    return out


@pytest.mark.parametrize("compiled", [True, False], ids=["packed", "python"])
def test_a_record_packed_from_its_bytes_writes_what_its_python_form_writes(
    shared: Callable[[], Deduplicator], compiled: bool
) -> None:
    """A real batch's redo record applied by commands whose fields the compiled loop packs
    straight from the record's bytes (``redis_resp``), or built as Python objects from
    its decoded form (small records, numba not loaded): the same fields and values to
    every hash and own key, each packed command what hiredis packs of its arguments; and
    Redis, sent the packed commands, holds those records."""
    first = shared()
    decide_and_store(first, originals(30))
    with first.index.exclusive():
        write = first.prepare(first.decide(originals(90)[30:])).write
    backend = backend_of(first)
    layout = backend._keys
    with jit.forced(compiled):
        epoch, commands = apply_commands(layout, 1_000_000, write.redo)
    assert epoch == write.epoch
    expected = written_fields(versioned(layout, 1_000_000, write.flat().grouped(layout)))
    assert written_fields(commands) == expected
    assert any(isinstance(c, Packed) for c in commands) == compiled
    assert sum(len(fields) for fields in expected.values()) > 500 and b"" in expected

    assert all(reply == 1 for reply in backend._wire.run(commands))
    for name, fields in expected.items():
        if name:
            stored = backend._client.hgetall(name)
            assert stored.pop(VERSION_FIELD) == b"1000000"
            assert fields.items() <= stored.items()
        else:
            assert backend._client.mget(list(fields)) == list(fields.values())


def test_the_packing_loop_writes_resp_bulk_strings() -> None:
    """Compiled or run as Python, the loop gives each span as ``$<length>CRLF<bytes>CRLF``,
    end to end, and where each starts."""
    rng = random.Random(5)
    data = bytes(rng.randrange(256) for _ in range(5000))
    spans = sorted(rng.randrange(5000) for _ in range(600))
    starts = np.array(spans[0::2], dtype=np.int64)
    ends = np.array([max(s, e) for s, e in zip(spans[0::2], spans[1::2], strict=True)])
    starts, ends = np.append(starts, [0, 4990]), np.append(ends, [0, 5000])  # empty, last
    want = [b"$%d\r\n%s\r\n" % (e - s, data[s:e]) for s, e in zip(starts, ends, strict=True)]
    u8 = np.frombuffer(data, dtype=np.uint8)
    for form in (jit.python(resp_bulks), jit.compiled(resp_bulks)):
        out, at = form(u8, starts, ends.astype(np.int64))
        assert out.tobytes() == b"".join(want)
        assert at.tolist() == [0, *np.cumsum([len(w) for w in want]).tolist()]


def test_packed_commands_follow_a_cluster_redirection(
    shared: Callable[[], Deduplicator], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cluster answers MOVED (a resharding, a failover): the batch runs again through
    redis-py's pipeline, which follows redirections, packed commands by their arguments."""
    first = shared()
    backend = backend_of(first)
    if not backend.cluster:
        pytest.skip("redirections are a cluster's")
    with first.index.exclusive():
        write = first.prepare(first.decide(originals(40))).write
    with jit.forced(True):
        _, commands = apply_commands(backend._keys, 1_000_000, write.redo)
    wire = backend._wire

    def moved(commands: Sequence[Command | Packed]) -> list[Any]:
        raise redis.ResponseError("MOVED 1234 127.0.0.1:1")

    monkeypatch.setattr(wire, "_raw", moved)
    assert any(isinstance(c, Packed) for c in commands)
    assert all(reply == 1 for reply in wire.run(commands))
    for name, fields in written_fields(commands).items():
        if name:
            assert fields.items() <= backend._client.hgetall(name).items()
