"""The API's pure parts and its store functions (SQLite), without Kafka."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from api.accept import Reach, channels_now, check_key, check_message, template_for
from api.callers import Caller
from api.database import StoreAccess
from api.errors import ApiError
from api.idempotency import Reservation, complete_key, release_key, reserve_key
from api.scopes import Scope
from api.signing import sign, verify
from api.store import RequestRecord, prune, request_by_id
from api.tables import prepare
from api.tokens import create_caller, lookup, token_hash
from operators.records import Category, Channel, Priority
from senders.profiles.crypto import ContactCipher, generate_key
from senders.profiles.model import Contacts, Preferences, ProfileError, parse_profile
from senders.store.profiles import NO_PROFILE, ProfileRead, ProfileStore
from senders.templates.catalog import load_catalog
from senders.templates.options import TemplateOptions
from settings import REPO_ROOT, DedupSettings

LIMITS = DedupSettings().request_limits()
CATALOG = load_catalog(TemplateOptions(directory=str(REPO_ROOT / "templates")))
SHOP = Caller("shop", frozenset({Scope.SEND}), frozenset({Category.TRANSACTIONAL}))
NOW_S = 1_796_115_600


def test_a_signature_is_accepted_only_genuine_and_fresh() -> None:
    body = b'{"message_id":"m1","status":"delivered"}'
    good = sign(b"s3cret", NOW_S, body)
    assert verify(b"s3cret", str(NOW_S), good, body, NOW_S + 10, 300) is None
    assert verify(b"s3cret", str(NOW_S), good, body + b" ", NOW_S, 300) == "bad signature"
    assert verify(b"other", str(NOW_S), good, body, NOW_S, 300) == "bad signature"
    assert verify(b"s3cret", str(NOW_S), good, body, NOW_S + 301, 300) == "timestamp outside the replay window"
    assert verify(b"s3cret", str(NOW_S + 1), good, body, NOW_S, 300) == "bad signature"  # the time is signed
    assert verify(None, str(NOW_S), good, body, NOW_S, 300) == "no secret for this provider"
    assert verify(b"s3cret", None, good, body, NOW_S, 300) == "unsigned"
    assert verify(b"s3cret", "-5", good, body, NOW_S, 300) == "malformed timestamp"
    assert verify(b"s3cret", str(NOW_S), "sha256=é", body, NOW_S, 300) == "bad signature"


def test_the_idempotency_key_is_required_printable_and_within_the_jobs_field_limit() -> None:
    assert check_key("evt-2", LIMITS) == "evt-2"
    for bad, code in ((None, "missing_idempotency_key"), (" ", "missing_idempotency_key"),
                      ("a\x00b", "invalid_idempotency_key"), ("k" * 513, "invalid_idempotency_key")):
        with pytest.raises(ApiError) as err:
            check_key(bad, LIMITS)
        assert (err.value.status, err.value.code) == (400, code)


def test_templates_kinds_channels_and_parameters() -> None:
    with pytest.raises(ApiError) as err:
        template_for(CATALOG, "eid_sale", SHOP)
    assert err.value.status == 403
    with pytest.raises(ApiError) as err:
        template_for(CATALOG, "order_shipped", Caller("otp", frozenset({Scope.SEND}), frozenset({Category.TRANSACTIONAL}),
                                                      frozenset({"otp"})))
    assert err.value.status == 403
    marketing = Caller("growth", frozenset({Scope.SEND}), frozenset({Category.MARKETING}))
    eid = template_for(CATALOG, "eid_sale", marketing)
    with pytest.raises(ApiError) as err:
        check_message(eid, None, {"pct": "20"}, NOW_S * 1000, Priority.HIGH)
    assert err.value.code == "invalid_priority"
    shipped = template_for(CATALOG, "order_shipped", SHOP)
    assert check_message(shipped, [Channel.SMS, Channel.SMS], {"order": "1"}, NOW_S * 1000, Priority.NORMAL) == (
        Channel.SMS,)
    with pytest.raises(ApiError) as err:
        check_message(shipped, None, {}, NOW_S * 1000, Priority.NORMAL)
    assert (err.value.code, err.value.problems) == ("missing_parameter", ["params.order: missing"])


def test_queued_and_skipped_say_what_the_profile_says_now() -> None:
    profile = parse_profile({"marketing": {"email": False}, "contacts": {"sms": ["+8801711000001"],
                                                                        "email": ["a@example.com"]}})
    read = Reach.of(ProfileRead(profile, profile.contacts))
    everything = (Channel.PUSH, Channel.SMS, Channel.EMAIL)
    assert channels_now(read, everything, Category.TRANSACTIONAL) == (["sms", "email"], ["push: no address"])
    assert channels_now(read, everything, Category.MARKETING) == (["sms"], ["push: no address", "email: opted out"])
    unverified = parse_profile({"contacts": {"sms": [{"address": "+8801711000002", "verified": False}]}})
    read = Reach.of(ProfileRead(unverified, unverified.contacts))
    assert channels_now(read, (Channel.SMS,), Category.TRANSACTIONAL) == ([], ["sms: no verified address"])
    assert channels_now(read, (Channel.SMS,), Category.TRANSACTIONAL, allow_unverified=True) == (["sms"], [])
    assert channels_now(read, (Channel.SMS,), Category.MARKETING, allow_unverified=True) == (
        [], ["sms: no verified address"])
    assert not Reach.of(NO_PROFILE).exists


def test_the_accept_path_reads_the_contacts_flags_without_opening_an_address(tmp_path: Path) -> None:
    """``ProfileStore.flags_many`` (the API's read) says of every channel what the senders' whole
    read says; it needs no contact key, so a user whose addresses this process cannot open is
    still answered by the flags (the senders, which do open them, decide at send time)."""
    db = StoreAccess(str(tmp_path / "s.sqlite3")).open()
    prepare(db)
    keys = (generate_key(), generate_key())
    profiles = ProfileStore(db, ContactCipher([keys[0]], [keys[1]]))
    documents = {
        "all": {"contacts": {"push": ["tok-1"], "sms": ["+8801711000001"], "email": ["a@example.com"]}},
        "unverified": {"contacts": {"sms": [{"address": "+8801711000002", "verified": False}],
                                    "email": [{"address": "b@example.com", "active": False}]}},
        "second": {"contacts": {"sms": [{"address": "+8801711000003", "active": False}, "+8801711000004"],
                                "push": [{"address": "tok-2", "verified": False}, "tok-3"]}},
        "opted-out": {"marketing": {"email": False},
                      "contacts": {"sms": ["+8801711000005"], "email": ["c@example.com"]}},
        "nothing": {"contacts": {}},
    }
    for user, document in documents.items():
        profiles.put(user, parse_profile(document))
    users = [*documents, "nobody"]
    flags = profiles.flags_many(users)
    whole = profiles.read_many(users)
    reaches = {user: Reach.of(flags[user]) for user in users}
    assert reaches == {user: Reach.of(read) for user, read in whole.items() if isinstance(read, ProfileRead)}
    assert not reaches["nobody"].exists and reaches["nothing"].exists
    every = (Channel.PUSH, Channel.SMS, Channel.EMAIL)
    assert channels_now(reaches["unverified"], every, Category.TRANSACTIONAL, allow_unverified=True) == (
        ["sms"], ["push: no address", "email: no address"])
    assert channels_now(reaches["second"], every, Category.MARKETING) == (["push", "sms"], ["email: no address"])
    assert channels_now(reaches["opted-out"], every, Category.MARKETING) == (
        ["sms"], ["push: no address", "email: opted out"])

    elsewhere = ProfileStore(db, ContactCipher([generate_key()], [keys[1]]))  # not the key the rows were sealed with
    assert isinstance(elsewhere.read_many(["all"])["all"], ProfileError)
    assert Reach.of(elsewhere.flags_many(["all"])["all"]) == reaches["all"]


def test_what_the_api_caches_of_a_profile_is_out_of_the_garbage_collector_s_sight() -> None:
    import gc

    profile = parse_profile({"contacts": {"sms": ["+8801711000001"], "email": ["a@example.com"]}})
    read = ProfileRead(profile, profile.contacts)
    reach = Reach.of(read)
    gc.collect()
    # the profile's models are ~two dozen tracked objects a user; a Reach is one, its answers none
    assert gc.is_tracked(read.contacts) and not gc.is_tracked(reach.skips)


def test_tokens_are_stored_as_hashes_and_idempotency_keys_replay_or_refuse(tmp_path: Path) -> None:
    db = StoreAccess(str(tmp_path / "s.sqlite3")).open()
    prepare(db)
    shop = Caller("shop", frozenset({Scope.SEND}), frozenset({Category.TRANSACTIONAL}), rate_per_sec=5)
    token = create_caller(db, shop, 1)
    with db.tx(write=False) as cur:
        stored = [r[0] for r in db.exec(cur, "SELECT token_hash FROM api_token").fetchall()]
    assert stored == [token_hash(token)] and token not in stored
    found = lookup(db, token, 2)
    assert found is not None and found.caller == shop
    assert lookup(db, token + "x", 2) is None and lookup(db, "not-ours", 2) is None

    now = int(time.time() * 1000)
    args = dict(now_ms=now, ttl_ms=60_000, stale_ms=10_000)
    assert reserve_key(db, "k1", "fp1", "n1", "u1", **args).outcome is Reservation.NEW  # type: ignore[arg-type]
    assert reserve_key(db, "k1", "fp1", "n2", "u1", **args).outcome is Reservation.IN_PROGRESS  # type: ignore[arg-type]
    assert reserve_key(db, "k1", "fp2", "n2", "u1", **args).outcome is Reservation.OTHER_BODY  # type: ignore[arg-type]
    complete_key(db, "k1", {"id": "n1"}, RequestRecord("n1", "k1", "u1", "t", ("sms",), "normal", "shop", now, now,
                                                       0, 7))
    replay = reserve_key(db, "k1", "fp1", "n3", "u1", **args)  # type: ignore[arg-type]
    assert (replay.outcome, replay.answer) == (Reservation.REPLAY, {"id": "n1"})
    # expired: the key is new again
    later = dict(now_ms=now + 60_001, ttl_ms=60_000, stale_ms=10_000)
    assert reserve_key(db, "k1", "fp9", "n4", "u1", **later).outcome is Reservation.NEW  # type: ignore[arg-type]
    # released after a failed write: the retry takes it
    release_key(db, "k1", "n4")
    assert reserve_key(db, "k1", "fp9", "n5", "u1", **later).outcome is Reservation.NEW  # type: ignore[arg-type]
    # a writer that died holding it: taken over once stale
    stale = dict(now_ms=now + 75_000, ttl_ms=60_000, stale_ms=10_000)
    assert reserve_key(db, "k1", "fp9", "n6", "u1", **stale).outcome is Reservation.NEW  # type: ignore[arg-type]
    db.close()


def test_prune_drops_expired_keys_and_records_past_the_retention(tmp_path: Path) -> None:
    db = StoreAccess(str(tmp_path / "p.sqlite3")).open()
    prepare(db)
    for n, at in (("old", 1_000), ("new", 90_000)):
        reserve_key(db, n, "fp", n, "u", now_ms=at, ttl_ms=10_000, stale_ms=1_000)
        complete_key(db, n, {"id": n}, RequestRecord(n, n, "u", "t", ("sms",), "normal", "c", at, at, 0, at))
    assert prune(db, now_ms=95_000, retention_ms=50_000) == 2  # the old key and record; the new ones stay
    assert request_by_id(db, "old") is None and request_by_id(db, "new") is not None
    assert reserve_key(db, "new", "fp", "x", "u", now_ms=95_000, ttl_ms=10_000, stale_ms=1_000).outcome is (
        Reservation.REPLAY)
    db.close()


def test_expiring_keeps_entries_for_their_time_and_within_its_bound() -> None:
    from api.expiring import Expiring

    now = [0.0]
    cache: Expiring[str, int] = Expiring(10.0, clock=lambda: now[0], max_entries=2)
    cache.put("a", 1)
    now[0] = 5.0
    cache.put("b", 2)
    assert (cache.get("a"), cache.get("b")) == (1, 2)
    now[0] = 10.0  # a's time is up, b's is not
    assert (cache.get("a"), cache.get("b")) == (None, 2)
    cache.put("c", 3)  # full: the expired a goes, b stays
    assert (cache.get("b"), cache.get("c")) == (2, 3)
    cache.put("d", 4)  # full of live entries: all go, d is kept
    assert (cache.get("b"), cache.get("c"), cache.get("d")) == (None, None, 4)
    cache.drop("d")
    assert cache.get("d") is None
    never: Expiring[str, int] = Expiring(0.0)
    never.put("a", 1)
    assert never.get("a") is None


def test_a_read_waits_for_the_writers_round_holding_the_answers_given_before_it(tmp_path: Path) -> None:
    import asyncio
    import threading

    from api.idempotency import Reserve, Terms
    from api.writer import StoreWriter

    location = str(tmp_path / "w.sqlite3")
    setup = StoreAccess(location).open()
    prepare(setup)
    setup.close()
    held = threading.Event()  # the writer's next round waits for this

    def terms() -> Terms:
        held.wait(10)
        return Terms(int(time.time() * 1000), 60_000, 10_000)

    writer = StoreWriter(StoreAccess(location).open_requests, terms,
                         lambda users: {u: Reach.of(ProfileRead(Preferences(), Contacts())) for u in users})
    reader = StoreAccess(location).open()

    async def scenario() -> None:
        held.set()
        reserved, _ = await writer.reserve(Reserve("k1", "fp", "n1", "u1"))
        assert reserved.outcome is Reservation.NEW
        held.clear()
        await writer.caught_up(0.5)  # nothing held: at once
        now = int(time.time() * 1000)
        writer.complete("k1", {"id": "n1"}, RequestRecord("n1", "shop/k1", "u1", "t", ("sms",), "normal", "shop",
                                                          now, now, 0, 1))
        waiting = asyncio.ensure_future(writer.caught_up(5.0))
        await asyncio.sleep(0.3)
        assert not waiting.done() and request_by_id(reader, "n1") is None  # its round has not run
        held.set()
        await asyncio.wait_for(waiting, 5.0)
        assert request_by_id(reader, "n1") is not None  # returned only once the record was stored
        held.clear()
        writer.complete("k2", {"id": "n2"}, RequestRecord("n2", "shop/k2", "u1", "t", ("sms",), "normal", "shop",
                                                          now, now, 0, 2))
        started = time.monotonic()
        await writer.caught_up(0.2)  # a store that does not answer: the read goes on after the timeout
        assert 0.2 <= time.monotonic() - started < 2.0
        held.set()

    try:
        asyncio.run(scenario())
    finally:
        held.set()
        writer.stop(5.0)
        reader.close()


def test_the_writer_tells_each_reservation_s_time_from_its_hand_over_to_its_answer(tmp_path: Path) -> None:
    import asyncio
    import threading

    from api.idempotency import Reserve, Terms
    from api.writer import StoreWriter

    location = str(tmp_path / "w.sqlite3")
    setup = StoreAccess(location).open()
    prepare(setup)
    setup.close()
    go = threading.Event()  # the writer's round waits for this: a store that is slow to answer
    waits: list[float] = []

    def terms() -> Terms:
        go.wait(10)
        return Terms(int(time.time() * 1000), 60_000, 10_000)

    writer = StoreWriter(StoreAccess(location).open_requests, terms,
                         lambda users: {u: Reach.of(ProfileRead(Preferences(), Contacts())) for u in users}, observe_wait=waits.append)

    async def scenario() -> None:
        threading.Timer(0.3, go.set).start()
        first, second = await asyncio.gather(writer.reserve(Reserve("k1", "fp", "n1", "u1")),
                                             writer.reserve(Reserve("k2", "fp", "n2", "u1")))
        assert first[0].outcome is second[0].outcome is Reservation.NEW

    try:
        asyncio.run(scenario())
    finally:
        go.set()
        writer.stop(5.0)
    assert len(waits) == 2 and all(0.25 <= w < 5.0 for w in waits)


def test_a_round_reads_its_new_users_profiles_together_and_a_user_it_cannot_read_fails_alone(tmp_path: Path) -> None:
    """One profile read for the round's new keys (a repeated user once); a user whose contacts
    cannot be read gets that error and its key is free again; a user without a profile too."""
    import asyncio

    from api.idempotency import Reserve, Terms
    from api.writer import StoreWriter
    from senders.profiles.crypto import ContactDecryptError

    location = str(tmp_path / "w.sqlite3")
    setup = StoreAccess(location).open()
    prepare(setup)
    setup.close()
    asked: list[list[str]] = []
    down = [False]

    def read_profiles(users: Sequence[str]) -> dict[str, Reach | Exception]:
        asked.append(list(users))
        if down[0]:
            raise OSError("the store does not answer")
        return {u: ContactDecryptError() if u == "bad" else
                Reach.of(NO_PROFILE if u == "gone" else ProfileRead(Preferences(), Contacts())) for u in users}

    writer = StoreWriter(StoreAccess(location).open_requests, lambda: Terms(int(time.time() * 1000), 60_000, 10_000),
                         read_profiles, round_s=0.2)

    async def scenario() -> None:
        await writer.reserve(Reserve("k0", "fp", "n0", "u0"))  # a round, then 0.2 s until the next
        users = ["u1", "u1", "bad", "gone"]
        got = await asyncio.gather(*(writer.reserve(Reserve(f"k{i}", "fp", f"n{i}", u)) for i, u in
                                     enumerate(users, 1)), return_exceptions=True)
        assert [r[0].outcome for r in (got[0], got[1], got[3])] == [Reservation.NEW] * 3  # type: ignore[index]
        assert [r[1].exists for r in (got[0], got[1], got[3])] == [True, True, False]  # type: ignore[index, union-attr]
        assert isinstance(got[2], ContactDecryptError)
        again = await writer.reserve(Reserve("k3", "fp", "n9", "u1"))  # released: the key is free
        assert again[0].outcome is Reservation.NEW
        assert (await writer.reserve(Reserve("k4", "fp", "n8", "u1")))[0].outcome is Reservation.NEW
        down[0] = True  # the read itself fails: every new key of the round gets it, and is free again
        with pytest.raises(OSError):
            await writer.reserve(Reserve("k5", "fp", "n5", "u1"))
        down[0] = False
        assert (await writer.reserve(Reserve("k5", "fp", "n6", "u1")))[0].outcome is Reservation.NEW

    try:
        asyncio.run(scenario())
    finally:
        writer.stop(5.0)
    assert asked[:2] == [["u0"], ["u1", "u1", "bad", "gone"]]


def test_a_busy_writer_starts_a_round_no_sooner_than_its_interval_and_an_idle_one_at_once(tmp_path: Path) -> None:
    import asyncio

    from api.idempotency import Reserve, Terms
    from api.writer import StoreWriter

    location = str(tmp_path / "w.sqlite3")
    setup = StoreAccess(location).open()
    prepare(setup)
    setup.close()
    sizes: list[int] = []
    writer = StoreWriter(StoreAccess(location).open_requests, lambda: Terms(int(time.time() * 1000), 60_000, 10_000),
                         lambda users: {u: Reach.of(ProfileRead(Preferences(), Contacts())) for u in users},
                         round_s=0.3, observe_batch=sizes.append)

    async def timed(key: str) -> float:
        started = time.monotonic()
        await writer.reserve(Reserve(key, "fp", key, "u1"))
        return time.monotonic() - started

    async def scenario() -> None:
        assert await timed("a") < 0.25  # idle: at once
        second = asyncio.ensure_future(timed("b"))
        await asyncio.sleep(0.1)
        third = asyncio.ensure_future(timed("c"))  # comes while the second waits: the same round
        assert await second >= 0.25 and await third >= 0.15
        await asyncio.sleep(0.4)
        assert await timed("d") < 0.25  # idle again: at once

    try:
        asyncio.run(scenario())
    finally:
        writer.stop(5.0)
    assert sizes == [1, 2, 1]


def test_the_backlog_counts_what_a_group_has_not_consumed_and_the_gate_reads_it_sparingly() -> None:
    from api.backlog import Gate, waiting

    # partition 0: 10 of 25 consumed; 1: nothing committed, its log starts at 4; 2: all consumed
    assert waiting({0: 25, 1: 9, 2: 7}, {0: 0, 1: 4, 2: 0}, {0: 10, 2: 7}) == 15 + 5
    assert waiting({0: 3}, {0: 0}, {0: -1001}) == 3  # OFFSET_INVALID: no commit yet

    now = [0.0]
    reads: list[tuple[str, ...]] = []
    backlog: list[int | None] = [10]

    def read(channels: Sequence[str]) -> int | None:
        reads.append(tuple(channels))
        return backlog[0]

    gate = Gate(read, bound=5, interval_s=0.5, clock=lambda: now[0])
    assert gate.hold_s(("sms",)) == 0.5  # 10 wait: above the bound
    assert gate.hold_s(("sms",)) == 0.5 and len(reads) == 2  # held: asked every time
    backlog[0] = 5
    assert gate.hold_s(("sms",)) == 0.0 and len(reads) == 3  # at the bound: goes
    now[0] = 0.4
    backlog[0] = 99
    assert gate.hold_s(("sms",)) == 0.0 and len(reads) == 3  # below a moment ago: not asked again yet
    now[0] = 0.6
    assert gate.hold_s(("sms",)) == 0.5 and len(reads) == 4
    backlog[0] = None
    assert gate.hold_s(("sms",)) == 0.0  # unknown: the campaign goes on at its rate
    assert Gate(read, bound=0).hold_s(("sms",)) == 0.0 and len(reads) == 5  # 0: no bound, never asked


def test_on_sqlite_the_writer_s_reservations_do_not_wait_for_the_store_s_write_lock(tmp_path: Path) -> None:
    """A sender in the middle of a transaction holds the store file's write lock; the API's
    reservations and request records are in the requests file, so a round goes on meanwhile."""
    import asyncio
    import sqlite3

    from api.database import requests_file
    from api.idempotency import Reserve, Terms
    from api.writer import StoreWriter

    location = str(tmp_path / "w.sqlite3")
    setup = StoreAccess(location).open()
    prepare(setup)
    setup.close()
    assert requests_file(tmp_path / "w.sqlite3") == tmp_path / "w-requests.sqlite3"
    sender = sqlite3.connect(location, isolation_level=None, timeout=0)
    sender.execute("BEGIN IMMEDIATE")  # the store file's write lock, held
    writer = StoreWriter(StoreAccess(location, busy_timeout_ms=30_000).open_requests,
                         lambda: Terms(int(time.time() * 1000), 60_000, 10_000),
                         lambda users: {u: Reach.of(ProfileRead(Preferences(), Contacts())) for u in users})

    async def reserve() -> Reservation:
        reserved, _ = await asyncio.wait_for(writer.reserve(Reserve("k1", "fp", "n1", "u1")), 5.0)
        return reserved.outcome

    try:
        assert asyncio.run(reserve()) is Reservation.NEW
        with pytest.raises(sqlite3.OperationalError, match="locked"):  # the lock is still the sender's
            sqlite3.connect(location, isolation_level=None, timeout=0).execute("BEGIN IMMEDIATE")
    finally:
        writer.stop(5.0)
        sender.execute("ROLLBACK")
        sender.close()


def test_a_sqlite_store_s_request_tables_move_to_their_own_file_once(tmp_path: Path) -> None:
    """A store from before the requests file: its keys, request records and rate budgets are moved
    there when the API's tables are prepared, and found where they were."""
    import sqlite3

    from api.tables import REQUEST_TABLES, request_schema

    location = str(tmp_path / "old.sqlite3")
    old = StoreAccess(location).open()
    with old.tx() as cur:  # the earlier layout: the request tables in the store's own file
        for ddl in request_schema("main."):
            cur.execute(ddl)
    old.close()
    plain = sqlite3.connect(location, isolation_level=None)
    plain.execute("INSERT INTO api_request (notification_id, dedup_key, user_id, template, channels, priority, caller,"
                  " event_time_ms, accepted_ms, kafka_partition, kafka_offset) VALUES"
                  " ('n1', 'shop/k1', 'u1', 't', 'sms', 'normal', 'shop', 1, 1, 0, 5)")
    plain.execute("INSERT INTO api_idempotency (idem_key, fingerprint, state, notification_id, user_id, answer,"
                  " created_ms, expires_ms) VALUES ('shop/k1', 'fp', 'done', 'n1', 'u1', '{\"id\": \"n1\"}', 1, 9e15)")
    plain.execute("INSERT INTO api_rate_budget (caller, bucket, window_ms, granted) VALUES ('shop', 'send', 1000, 7)")
    db = StoreAccess(location).open()
    prepare(db)
    prepare(db)  # once: nothing left to move
    found = request_by_id(db, "n1")
    assert found is not None and (found.dedup_key, found.offset) == ("shop/k1", 5)
    replay = reserve_key(db, "shop/k1", "fp", "n2", "u1", now_ms=2, ttl_ms=10, stale_ms=10)
    assert (replay.outcome, replay.answer) == (Reservation.REPLAY, {"id": "n1"})
    db.close()
    left = {r[0] for r in plain.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert not left & set(REQUEST_TABLES)
    moved = sqlite3.connect(tmp_path / "old-requests.sqlite3")
    assert moved.execute("SELECT COUNT(*) FROM api_request").fetchone() == (1,)
    assert moved.execute("SELECT caller, bucket, window_ms, granted FROM api_rate_budget").fetchall() == [
        ("shop", "send", 1000, 7)]
    plain.close()
    moved.close()


def test_notification_ids_are_made_in_time_order_and_never_twice() -> None:
    from api.notifications import new_notification_id

    made = [new_notification_id(NOW_S * 1000 + step) for step in (0, 0, 1, 999, 1000, 86_400_000)]
    assert all(len(i) == 34 and i.startswith("n_") and int(i[2:], 16) >= 0 for i in made)
    assert made[2:] == sorted(made[2:]) and made[0][:14] == made[1][:14] and len(set(made)) == len(made)
    assert made[0][2:14] == f"{NOW_S * 1000:012x}"
