"""Index offsets below what the broker retains stop the service, or are moved on from.

The test broker (Tansu) keeps every record and has no DeleteRecords, so a partition whose
earliest offsets expired cannot be staged on it: the broker's answer about its retained
offsets is given here by a stand-in with the one method the check asks (the integration
tests run the check against the real broker, where every offset is retained)."""

from __future__ import annotations

import logging
from typing import Any, cast

import pytest
from confluent_kafka import OFFSET_BEGINNING, OFFSET_INVALID, Consumer, TopicPartition

from stream_dedup.errors import IndexLostError, IndexOffsetsGoneError
from stream_dedup.service.lost_index import check_offsets_retained


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
