"""The collector's settings while a service runs, and back as they were after it."""

from __future__ import annotations

import gc

from ops import collector


def test_serving_freezes_start_up_and_collects_the_young_less_often_then_undoes_both() -> None:
    before = gc.get_threshold()
    kept = [[i] for i in range(100)]  # objects start-up made
    with collector.serving():
        assert gc.get_freeze_count() >= len(kept)
        assert gc.get_threshold() == (collector.YOUNG_THRESHOLD, *before[1:])
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_the_api_s_way_freezes_only() -> None:
    before = gc.get_threshold()
    with collector.serving(young_threshold=None):
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
