"""A repeat after a 202 always gets 200 with the first answer (issue 20: the same POST right after
its 202 was 409 in 6 of 200 pairs: the repeat read the key as still in progress, then looked for
the held answer after the completion batch had stored it and dropped it from memory).

In one API process, the repeat is sent at once, hundreds of times; with two API processes on
one store (as two processes on one port will be), the first and the repeat go to different
processes at the same moment, so one finds the key pending in the store and must wait for the
other's answer instead of answering 409.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from harness.ports import free_port
from tests.api.conftest import RunningApi, api_settings
from tests.senders.conftest import register_users

pytestmark = pytest.mark.integration

BODY = {"user_id": "repeat-user", "template": "order_shipped", "params": {"order": "R-1"}, "channels": ["sms"]}


@pytest.fixture(scope="module")
def two_apis(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningApi, RunningApi]]:
    root = tmp_path_factory.mktemp("idem")
    cfg = api_settings(kafka_bootstrap, root)
    register_users(cfg, ["repeat-user"])
    first = RunningApi(cfg, root).start()
    other = cfg.with_overrides(api={"port": free_port(), "outcomes_group": f"{cfg.api.outcomes_group}-2"})
    second = RunningApi(other, root / "second")
    (root / "second").mkdir()
    second.start()
    try:
        yield first, second
    finally:
        for api in (first, second):
            if api.proc is not None:
                api.stop()


def test_the_same_request_right_after_its_202_is_200_with_the_first_answer(
    two_apis: tuple[RunningApi, RunningApi],
) -> None:
    api = two_apis[0]
    token = api.token("repeater", rate=10_000)
    codes: dict[int, int] = {}
    with api.client(token) as c:
        for n in range(300):
            body = {**BODY, "params": {"order": f"R-{n}"}}
            headers = {"Idempotency-Key": f"ord-{n}"}
            first = c.post("/v1/notifications", json=body, headers=headers)
            assert first.status_code == 202, first.text
            again = c.post("/v1/notifications", json=body, headers=headers)
            codes[again.status_code] = codes.get(again.status_code, 0) + 1
            assert again.status_code == 200 and again.json() == first.json(), (n, codes, again.text)
    assert codes == {200: 300}


def _race(url_a: str, url_b: str, token: str, key: str) -> list[httpx.Response]:
    """The same request to two URLs at the same moment."""
    body = {**BODY, "params": {"order": key}}
    headers = {"Idempotency-Key": key, "Authorization": f"Bearer {token}"}
    go = threading.Barrier(2)
    replies: list[httpx.Response] = []
    lock = threading.Lock()

    def send(url: str) -> None:
        with httpx.Client(timeout=30) as c:
            go.wait()
            reply = c.post(f"{url}/v1/notifications", json=body, headers=headers)
        with lock:
            replies.append(reply)

    threads = [threading.Thread(target=send, args=(u,)) for u in (url_a, url_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return replies


@pytest.mark.parametrize("where", ["one process", "two processes"])
def test_a_repeat_at_the_same_moment_waits_for_the_first_answer(
    two_apis: tuple[RunningApi, RunningApi], where: str
) -> None:
    a, b = two_apis
    tag = where.replace(" ", "-")
    token = a.token(f"racer-{tag}", rate=10_000)
    other = a.url if where == "one process" else b.url
    seen: dict[tuple[int, ...], int] = {}
    for n in range(100):
        replies = _race(a.url, other, token, f"race-{tag}-{n}")
        codes = tuple(sorted(r.status_code for r in replies))
        seen[codes] = seen.get(codes, 0) + 1
        assert codes == (200, 202), (where, n, seen, [r.text for r in replies])
        assert replies[0].json() == replies[1].json()
    assert seen == {(200, 202): 100}


def test_a_sender_holding_the_store_file_s_write_lock_holds_up_no_new_notification(
    two_apis: tuple[RunningApi, RunningApi],
) -> None:
    """On SQLite a sender's transaction holds the store file's write lock, and a writer waits for
    it up to ``senders.sqlite_busy_timeout_ms``. A request waits for nothing in that file: its key
    and record are in the requests file, and so is its caller's rate budget, whose chunk a caller
    of 50/s leases in each window's first request (two processes, two budgets' windows each)."""
    import sqlite3

    from senders.runtime.pool import store_location
    from senders.store.db import sqlite_path

    a, b = two_apis
    assert a.cfg.senders.sqlite_busy_timeout_ms >= 5_000
    token = a.token("while-locked", rate=50)  # under api.ratelimit.LEASE_AHEAD_BUDGET: leased on demand
    sender = sqlite3.connect(sqlite_path(store_location(a.cfg)), isolation_level=None, timeout=0)
    sender.execute("BEGIN IMMEDIATE")
    try:
        for n in range(4):
            api = (a, b)[n % 2]
            with api.client(token) as c:
                started = time.monotonic()
                reply = c.post("/v1/notifications", json={**BODY, "params": {"order": f"L-{n}"}},
                               headers={"Idempotency-Key": f"locked-{n}"})
                assert reply.status_code == 202, reply.text
                assert time.monotonic() - started < 3.0, n
            time.sleep(0.6)  # the next request in another window of the caller's budget
        with pytest.raises(sqlite3.OperationalError, match="locked"):  # the lock was the sender's throughout
            sqlite3.connect(sqlite_path(store_location(a.cfg)), isolation_level=None, timeout=0).execute(
                "BEGIN IMMEDIATE")
    finally:
        sender.execute("ROLLBACK")
        sender.close()
