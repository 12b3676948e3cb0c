"""The loop's garbage-collector settings are changed once and restored by the last user."""

from __future__ import annotations

import gc

from stream_dedup import gc_tuning


def test_nested_users_restore_the_settings_when_the_last_leaves() -> None:
    before = gc.get_threshold()
    frozen = gc.get_freeze_count()
    gc_tuning.enter()
    try:
        assert gc.get_threshold()[0] == gc_tuning.YOUNG_THRESHOLD
        assert gc.get_threshold()[1:] == before[1:]
        assert gc.get_freeze_count() > frozen
        gc_tuning.enter()
        gc_tuning.leave()
        assert gc.get_threshold()[0] == gc_tuning.YOUNG_THRESHOLD  # one user is still in
    finally:
        gc_tuning.leave()
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
    gc_tuning.leave()  # an unmatched leave changes nothing
    assert gc.get_threshold() == before
