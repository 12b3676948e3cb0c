"""The service's interpreter switch interval: set for its run, restored after, even when
the run fails (tests run services inside their own process)."""

from __future__ import annotations

import sys

import pytest

from stream_dedup.service.config import ServiceSection
from stream_dedup.service.switching import switch_interval


def test_the_interval_is_set_inside_and_restored_after() -> None:
    before = sys.getswitchinterval()
    with switch_interval(0.5):
        assert sys.getswitchinterval() == pytest.approx(0.0005)
    assert sys.getswitchinterval() == before
    with pytest.raises(RuntimeError), switch_interval(2.0):
        assert sys.getswitchinterval() == pytest.approx(0.002)
        raise RuntimeError("the run failed")
    assert sys.getswitchinterval() == before


def test_the_default_is_pythons_own() -> None:
    assert ServiceSection().switch_interval_ms / 1000 == pytest.approx(0.005)
