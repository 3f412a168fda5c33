"""operators.inprocess.RedisDedup against a real redis-server."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from harness.local_redis import LocalRedis
from operators.inprocess import Check, RedisDedup
from operators.window import WindowConfig


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[redis.Redis]:
    with LocalRedis(Path(tmp_path_factory.mktemp("redis"))) as server:
        yield redis.Redis(port=server.port)


def test_first_set_wins_and_a_repeat_names_the_original(client: redis.Redis) -> None:
    dedup = RedisDedup(client, prefix="t1:")
    assert dedup.check("order-7", "n-1") == Check(True)
    assert dedup.check("order-7", "n-2") == Check(False, "n-1")
    assert dedup.should_send("order-8") is True
    assert client.pttl("t1:order-7") > 7 * 86_400_000 - 60_000  # the default window


def test_the_window_is_the_jobs_clamped_ttl_and_expires(client: redis.Redis) -> None:
    dedup = RedisDedup(client, WindowConfig(max_window_ms=3_000), prefix="t2:")
    assert dedup.check("k", "n-1", ttl_sec=0).new  # clamped up to one second
    assert 0 < client.pttl("t2:k") <= 1_000
    assert not dedup.check("k", "n-2", ttl_sec=0).new
    time.sleep(1.1)
    assert dedup.check("k", "n-3", ttl_sec=10_000).new
    assert 2_000 < client.pttl("t2:k") <= 3_000  # clamped down to max_window_ms


def test_check_many_pipelines_a_batch_in_order(client: redis.Redis) -> None:
    dedup = RedisDedup(client, prefix="t3:")
    got = dedup.check_many([("a", "n-1", None), ("b", "n-2", None), ("a", "n-3", None)])
    assert got == [Check(True), Check(True), Check(False, "n-1")]
