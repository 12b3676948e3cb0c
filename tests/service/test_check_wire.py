"""The bytes between the check process's front and its readers: a check's reads and what
a real RocksDB index holds for them survive the trip exactly, and a check scored from the
decoded reply answers as the writer does (plain, containment on, compressed texts)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from stream_dedup.core.config import DedupConfig
from stream_dedup.core.sketch import sketch
from stream_dedup.dedup.check import CheckReads, Held, check_texts, read_held
from stream_dedup.index.records import DocRecord
from stream_dedup.service import check_wire as wire
from tests.index.test_dedup import article, edit
from tests.index.test_follower import batch, writer


def same_reads(a: CheckReads, b: CheckReads) -> None:
    for field in dataclasses.fields(CheckReads):
        x, y = getattr(a, field.name), getattr(b, field.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and np.array_equal(x, y), field.name
            assert y.flags.writeable and y.flags.aligned, field.name
        else:
            assert x == y, field.name


@pytest.mark.parametrize(
    "config",
    [DedupConfig(), DedupConfig(containment=0.8), DedupConfig(verify="signature")],
    ids=["exact", "containment", "signature"],
)
def test_a_check_through_the_wire_answers_as_the_writer(
    tmp_path: Path, config: DedupConfig
) -> None:
    dedup = writer(tmp_path / "index", config)
    try:
        for b in range(3):
            dedup.process(batch(b, 200))
        plan = config.band_plan()
        texts = [
            edit(article(1 * 200 + 7), 3, 1),
            article(2 * 200 + 9)[:400],  # an excerpt
            "a text the index has never seen, short and new",
            edit(article(5), 2, 9),
        ]
        sk = sketch(texts, config, plan, payloads=False)
        reads = CheckReads.of(sk, max(5, config.max_candidates))
        request = wire.encode_reads(reads)
        assert request[:1] == wire.READ
        got = wire.decode_reads(request)
        same_reads(reads, got)
        held = read_held(dedup.index, got)
        assert sum(map(len, held.candidates)) > 0
        back = wire.decode_held(wire.encode_held(held))
        assert back == held

        def through_wire(r: CheckReads) -> Held:
            sent = wire.decode_reads(wire.encode_reads(r))
            return wire.decode_held(wire.encode_held(read_held(dedup.index, sent)))

        expected = check_texts(dedup.index, config, plan, texts, 3)
        assert check_texts(through_wire, config, plan, texts, 3) == expected
        assert [m.id for m in expected[0]][:1] == ["b1-7"]
    finally:
        dedup.index.close()


def test_records_keep_odd_ids_empty_payloads_and_the_text_flag() -> None:
    held = Held(
        [[5, 2], [], [9]],
        {
            5: DocRecord("d\udcff-surrogate", "é-cluster", b"\x00\x01payload", True),
            2: DocRecord("", "", b""),
            9: DocRecord("ünï", "ünï", bytes(range(256)) * 3, False),
        },
    )
    back = wire.decode_held(wire.encode_held(held))
    assert back == held
    assert list(back.records) == [5, 2, 9]
    assert back.records[5].text is True and back.records[9].text is False
    empty = Held([], {})
    assert wire.decode_held(wire.encode_held(empty)) == empty


def test_the_small_messages() -> None:
    assert wire.decode_dictionary(wire.encode_dictionary(None)) is None
    assert wire.decode_dictionary(wire.encode_dictionary(b"")) == b""
    assert wire.decode_dictionary(wire.encode_dictionary(b"\x00dict")) == b"\x00dict"
    assert wire.requested_dictionary(wire.dictionary_request(2**40 + 3)) == 2**40 + 3
    seconds, documents = wire.decode_followed(wire.encode_followed(0.0125, 123_456_789))
    assert (seconds, documents) == (0.0125, 123_456_789)
