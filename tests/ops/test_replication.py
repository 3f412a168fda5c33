"""How new topics are replicated (ops.kafka_io.replication_for): pure, no broker."""

from __future__ import annotations

import pytest

from ops.kafka_io import Replication, TopicError, replication_for


def test_the_cluster_default_decides_when_nothing_is_set() -> None:
    assert replication_for(None, None, 3, [1, 2, 3]) == Replication(3, 2)
    assert replication_for(None, None, 1, [1]) == Replication(1, 1)
    assert replication_for(None, None, 2, [1, 2, 3]) == Replication(2, 1)


def test_settings_win_over_the_cluster_default() -> None:
    assert replication_for(1, None, 3, [1, 2, 3]) == Replication(1, 1)
    assert replication_for(3, 3, 1, [1, 2, 3]) == Replication(3, 3)
    assert replication_for(None, 1, 3, [1, 2, 3]) == Replication(3, 1)


def test_more_replicas_than_live_brokers_are_refused_with_the_numbers() -> None:
    with pytest.raises(TopicError, match=r"replication factor 3 \(kafka.replication_factor\) needs 3 live brokers, "
                                         r"and the cluster has 2 \(ids 1, 3\)"):
        replication_for(3, None, 1, [3, 1])
    with pytest.raises(TopicError, match=r"replication factor 3 \(the cluster's default.replication.factor\)"):
        replication_for(None, None, 3, [1, 2])


def test_a_min_isr_above_the_replicas_is_refused() -> None:
    with pytest.raises(TopicError, match="min.insync.replicas 3 is above the replication factor 2"):
        replication_for(None, 3, 2, [1, 2, 3])


def test_an_unknown_default_asks_for_the_setting() -> None:
    with pytest.raises(TopicError, match="set kafka.replication_factor"):
        replication_for(None, None, None, [1])
