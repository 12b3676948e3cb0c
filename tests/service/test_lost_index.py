"""Index offsets below what the broker retains stop the service, or are moved on from; an
empty index is counted again after the group's offsets are read.

The test broker (Tansu) keeps every record and has no DeleteRecords, so a partition whose
earliest offsets expired cannot be staged on it: the broker's answer about its retained
offsets is given here by a stand-in with the one method the check asks (the integration
tests run the check against the real broker, where every offset is retained). The order of
the empty-index check's two reads is shown with a stand-in too (another instance commits
exactly between them); ``tests/integration/test_lost_index.py`` runs it with two real
instances on Redis."""

from __future__ import annotations

import logging
from typing import Any, cast

import pytest
from confluent_kafka import OFFSET_BEGINNING, OFFSET_INVALID, Consumer, TopicPartition

from stream_dedup.errors import IndexLostError, IndexOffsetsGoneError
from stream_dedup.service.lost_index import check_empty_index, check_offsets_retained


class _Retained:
    """A broker's retained offsets, ``{partition: (earliest, end)}``, per topic "news"."""

    def __init__(self, retained: dict[int, tuple[int, int]]) -> None:
        self.retained = retained

    def get_watermark_offsets(self, tp: TopicPartition, **_: Any) -> tuple[int, int]:
        return self.retained[tp.partition]


def _positions(*offsets: int) -> list[TopicPartition]:
    return [TopicPartition("news", p, o) for p, o in enumerate(offsets)]


def _check(retained: dict[int, tuple[int, int]], parts: list[TopicPartition], on: str) -> None:
    check_offsets_retained(cast(Consumer, _Retained(retained)), parts, "idx", on)


def test_offsets_within_what_the_broker_retains_are_kept() -> None:
    parts = _positions(500, 0, OFFSET_INVALID)
    _check({0: (100, 900), 1: (0, 0), 2: (50, 60)}, parts, "fail")
    assert [tp.offset for tp in parts] == [500, 0, OFFSET_INVALID]


def test_offsets_below_the_earliest_retained_stop_the_service() -> None:
    parts = _positions(500, 40)
    with pytest.raises(IndexOffsetsGoneError) as caught:
        _check({0: (100, 900), 1: (90, 95)}, parts, "fail")
    assert isinstance(caught.value, IndexLostError)  # one except clause catches both
    assert caught.value.gone == {"news:1": (40, 90, 95)}
    assert "news:1 at offset 40 (the broker holds 90 to 95)" in str(caught.value)
    assert 'index.on_lost = "continue"' in str(caught.value)


@pytest.mark.parametrize("on_lost", ["rebuild", "continue"])
def test_offsets_below_the_earliest_retained_go_on_from_it_loudly(
    on_lost: str, caplog: pytest.LogCaptureFixture
) -> None:
    parts = _positions(500, 40)
    with caplog.at_level(logging.WARNING, logger="stream_dedup.service"):
        _check({0: (100, 900), 1: (90, 95)}, parts, on_lost)
    assert [tp.offset for tp in parts] == [500, OFFSET_BEGINNING]
    assert any("below what the broker retains" in r.getMessage() for r in caplog.records)


class _Group:
    """A group whose committed offsets are ``committed``; ``on_read`` runs as they are
    read (another instance committing a batch at that moment)."""

    def __init__(self, committed: dict[int, int], on_read: Any = None) -> None:
        self.committed_at = committed
        self.on_read = on_read

    def committed(self, parts: list[TopicPartition], _timeout: float) -> list[TopicPartition]:
        if self.on_read is not None:
            self.on_read()
        return [
            TopicPartition(tp.topic, tp.partition, self.committed_at.get(tp.partition, -1001))
            for tp in parts
        ]


def test_an_index_filled_while_the_group_offsets_were_read_is_not_lost(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stored = [0]  # what the index holds, as read now

    def another_instance_commits() -> None:
        stored[0] = 60  # its batch is stored before its offsets reach the group

    parts = _positions(OFFSET_INVALID, OFFSET_INVALID)
    group = cast(Consumer, _Group({0: 30, 1: 30}, another_instance_commits))
    with caplog.at_level(logging.INFO, logger="stream_dedup.service"):
        check_empty_index(group, parts, "idx", "fail", lambda: stored[0])
    assert [tp.offset for tp in parts] == [OFFSET_INVALID, OFFSET_INVALID]  # the group's
    assert any("another instance stored since" in r.getMessage() for r in caplog.records)


def test_an_index_still_empty_after_the_group_offsets_were_read_is_lost() -> None:
    counted: list[int] = []

    def documents() -> int:
        counted.append(0)
        return 0

    parts = _positions(OFFSET_INVALID, OFFSET_INVALID)
    group = cast(Consumer, _Group({0: 30}))
    with pytest.raises(IndexLostError) as caught:
        check_empty_index(group, parts, "idx", "fail", documents)
    assert caught.value.committed == {"news:0": 30}
    assert counted == [0]  # counted again once the group's offsets were read


def test_a_new_group_on_an_empty_index_asks_nothing_more() -> None:
    parts = _positions(OFFSET_INVALID)

    def documents() -> int:
        raise AssertionError("no committed offsets: nothing to count again")

    check_empty_index(cast(Consumer, _Group({})), parts, "idx", "fail", documents)
    assert [tp.offset for tp in parts] == [OFFSET_INVALID]
