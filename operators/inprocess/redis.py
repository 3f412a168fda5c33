"""The dedup rule in Redis: ``SET dedup:<key> <notification_id> NX GET PX <window>``.

>>> dedup = RedisDedup(redis.Redis())          # doctest: +SKIP
>>> dedup.check("order-7:shipped", "n-1")       # doctest: +SKIP
Check(new=True, ...)
>>> dedup.check("order-7:shipped", "n-2")       # doctest: +SKIP
Check(new=False, original_notification_id='n-1', ...)

One round trip per check (``check_many`` pipelines a batch into one). The window is the job's
(``ttl_sec`` clamped as ``dedup_ttl_sec``), but measured by Redis's clock from the first request:
processing time, not event time, so a backfill or a redelivery after a long outage is judged by
when it arrives. Several processes share one Redis: the first SET of a key wins, atomically.
Needs Redis 7 (SET with both NX and GET); the client is any redis-py compatible one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from operators.inprocess.memory import Check
from operators.window import WindowConfig, window_ms

_NEW = Check(True)


class RedisDedup:
    """:param client: a ``redis.Redis`` (or compatible) client
    :param window: the windows
    :param prefix: the keys' prefix in Redis
    """

    def __init__(self, client: Any, window: WindowConfig | None = None, *, prefix: str = "dedup:") -> None:
        self.client = client
        self.window = window or WindowConfig()
        self.prefix = prefix

    def _args(self, dedup_key: str, notification_id: str, ttl_sec: int | None) -> tuple[str, str]:
        return self.prefix + dedup_key, notification_id

    def check(self, dedup_key: str, notification_id: str, *, ttl_sec: int | None = None) -> Check:
        """New (the key was set) or the original's id (it was there)."""
        key, value = self._args(dedup_key, notification_id, ttl_sec)
        previous = self.client.set(key, value, nx=True, get=True, px=window_ms(ttl_sec, self.window))
        return _NEW if previous is None else Check(False, _text(previous))

    def should_send(self, dedup_key: str, *, notification_id: str | None = None, ttl_sec: int | None = None) -> bool:
        return self.check(dedup_key, notification_id or dedup_key, ttl_sec=ttl_sec).new

    def check_many(self, requests: Sequence[tuple[str, str, int | None]]) -> list[Check]:
        """``(dedup_key, notification_id, ttl_sec)`` of a batch, in one round trip, in order (a
        key twice in the batch: the second is a repeat of the first)."""
        pipe = self.client.pipeline(transaction=False)
        for dedup_key, notification_id, ttl_sec in requests:
            key, value = self._args(dedup_key, notification_id, ttl_sec)
            pipe.set(key, value, nx=True, get=True, px=window_ms(ttl_sec, self.window))
        return [_NEW if p is None else Check(False, _text(p)) for p in pipe.execute()]


def _text(value: bytes | str) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else value
