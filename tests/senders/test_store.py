"""The status store (SQLite and a real PostgreSQL server) and the per-record handler, without Kafka."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest

from operators import codec
from operators.records import Channel
from senders.policy.breaker import BreakerOptions
from senders.policy.bucket import RateLimit
from senders.policy.retry import RetryPolicy, format_step
from senders.policy.transitions import OutcomePlan
from senders.policy.verdict import RuleVerdict
from senders.profiles.model import parse_profile
from senders.providers import FakeProvider
from senders.records import TemplateRef, from_channel_record
from senders.rules.limits import LimitClaim
from senders.rules.reasons import Reason
from senders.runtime.dispatch import Dispatcher
from senders.runtime.handler import DeliveryHandler, Handled, HandlerTopics, SendJob
from senders.runtime.ledger import Entry
from senders.runtime.metrics import Metrics
from senders.runtime.worker import SenderWorker, WorkerOptions, _Run
from senders.statuses import ClaimAction, DeadLetterReason, DeliveryStatus, Lane
from senders.store.batches import ClaimRequest, FinishRequest, claim_many, finish_many, release_many
from senders.store.status import StatusStore, open_store
from tests.senders.conftest import channel_message, profiles_for_tests, rules_for_tests

SMS, NORMAL = Channel.SMS, Lane.NORMAL
NOW = 1_796_115_600_000 + 60_000  # a minute after the test messages' event time
SENT = OutcomePlan(DeliveryStatus.SENT)


@pytest.fixture
def store(store_location: str) -> StatusStore:
    return open_store(store_location, synchronous="NORMAL")


def _claim(
    store: StatusStore, key: str = "k:sms", attempt: int = 1, now: int = 1000, owner: str = "w1"
) -> ClaimAction:
    decision, _, _ = store.claim(
        message_key=key,
        notification_id="n",
        channel=SMS,
        lane=NORMAL,
        attempt=attempt,
        now_ms=now,
        lease_ms=500,
        owner=owner,
    )
    return decision.action


def _finish(
    store: StatusStore,
    now: int,
    owner: str = "w1",
    attempt: int = 1,
    plan: OutcomePlan = SENT,
    error: str | None = None,
    key: str = "k:sms",
    **extra: object,
) -> bool:
    return store.finish(
        message_key=key, attempt=attempt, owner=owner, plan=plan, provider="p", error=error, now_ms=now,
        **extra,  # type: ignore[arg-type]
    )


def test_claim_then_sent_then_a_replay_is_skipped(store: StatusStore) -> None:
    assert _claim(store) is ClaimAction.CLAIM
    assert store.get("k:sms").status is DeliveryStatus.SENDING  # type: ignore[union-attr]
    assert _finish(store, now=1100)
    assert _claim(store, now=1200) is ClaimAction.REPUBLISH  # not yet marked published
    store.mark_published([("k:sms", 1)])
    assert _claim(store, now=1300) is ClaimAction.SKIP
    assert store.get("k:sms").status is DeliveryStatus.SENT  # type: ignore[union-attr]


def test_a_live_claim_waits_and_an_expired_one_moves(store: StatusStore) -> None:
    assert _claim(store, now=1000, owner="w1") is ClaimAction.CLAIM
    assert _claim(store, now=1200, owner="w2") is ClaimAction.WAIT
    assert _claim(store, now=1500, owner="w2") is ClaimAction.CLAIM  # lease (500 ms) ran out
    # the first worker's late outcome is refused: w2 holds the claim now
    assert not _finish(store, now=1600)
    assert _finish(store, now=1600, owner="w2")


def test_a_released_claim_is_taken_over_at_once_and_only_this_owners_attempt_is_released(
    store: StatusStore,
) -> None:
    """A worker whose partition was revoked before its claimed calls started releases them: the
    next owner claims them at once instead of waiting out the lease."""
    for key in ("k1:sms", "k2:sms", "k3:sms"):
        assert _claim(store, key, now=1000, owner="w1") is ClaimAction.CLAIM
    released = release_many(store.db, [("k1:sms", 1), ("k2:sms", 2), ("k3:sms", 1)], owner="w1")
    assert released == 2  # k1 and k3: attempt 2 of k2 is not what w1 holds
    assert store.get("k1:sms").lease_until_ms == 0  # type: ignore[union-attr]
    assert store.get("k1:sms").status is DeliveryStatus.SENDING  # type: ignore[union-attr]
    assert release_many(store.db, [("k1:sms", 1)], owner="w2") == 0  # not w2's claim
    assert release_many(store.db, [], owner="w1") == 0
    assert _claim(store, "k1:sms", now=1001, owner="w2") is ClaimAction.CLAIM
    assert _claim(store, "k3:sms", now=1001, owner="w2") is ClaimAction.CLAIM
    assert _claim(store, "k2:sms", now=1001, owner="w2") is ClaimAction.WAIT  # its lease runs to 1500
    assert store.get("k1:sms").owner == "w2"  # type: ignore[union-attr]


def test_publishing_is_marked_per_attempt(store: StatusStore) -> None:
    _claim(store)
    _finish(store, now=1000, plan=OutcomePlan(DeliveryStatus.QUEUED, 3000), error="503")
    assert _claim(store, attempt=2, now=3000) is ClaimAction.CLAIM
    _finish(store, now=3100, attempt=2)
    store.mark_published([("k:sms", 1)])  # late: must not hide attempt 2's unpublished outcome
    assert store.get("k:sms").unpublished  # type: ignore[union-attr]


def test_a_deactivated_address_is_remembered_by_hash(store: StatusStore) -> None:
    _claim(store)
    plan = OutcomePlan(
        DeliveryStatus.FAILED, dead_letter=DeadLetterReason.PERMANENT_FAILURE, deactivate_address=True
    )
    _finish(store, now=1, plan=plan, error="400", deactivate=(SMS, "+15550100"))
    assert store.is_inactive(SMS, "+15550100")
    assert not store.is_inactive(Channel.EMAIL, "+15550100")
    assert not store.is_inactive(SMS, "+15550101")


def test_concurrent_claims_let_exactly_one_through(store_location: str) -> None:
    path = store_location
    open_store(path).close()
    results: list[ClaimAction] = []
    barrier = threading.Barrier(8)

    def worker(n: int) -> None:
        s = open_store(path, synchronous="NORMAL")
        barrier.wait()
        for k in range(50):
            results.append(_claim(s, key=f"k{k}", owner=f"w{n}"))
        s.close()

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count(ClaimAction.CLAIM) == 50
    assert results.count(ClaimAction.WAIT) == 350



def test_a_batch_changes_the_rows_exactly_as_one_message_at_a_time_does(store: StatusStore) -> None:
    """``claim_many`` / ``finish_many`` / ``mark_published`` (one statement per kind of change)
    against ``claim`` / ``finish`` one by one, on keys of their own: a key twice in a batch, a
    rule's verdict, a lost claim, every kind of outcome (NULLs in every column PostgreSQL types)."""
    shipped = TemplateRef("order_shipped", 2, "en")

    def rejected(counts: object, first_seen: bool) -> RuleVerdict:
        return RuleVerdict(DeliveryStatus.REJECTED, "opted_out", template=shipped)

    def send(counts: object, first_seen: bool) -> RuleVerdict:
        return RuleVerdict(template=shipped)

    claims = [("k1", send), ("k2", None), ("k1", send), ("k3", None), ("k4", rejected), ("k6", None)]
    finishes = [
        ("k1", 1, "w1", SENT, "ref-1", None),
        ("k2", 1, "w1", OutcomePlan(DeliveryStatus.QUEUED, 9000), None, "503"),
        ("k2", 1, "w1", SENT, None, None),  # twice in one batch: the claim is gone by the second
        ("k3", 1, "w1", OutcomePlan(DeliveryStatus.FAILED, dead_letter=DeadLetterReason.PERMANENT_FAILURE), None, "400"),
        ("k5", 1, "w1", SENT, None, None),  # another worker's claim
        ("k6", 2, "w1", SENT, None, None),  # not this attempt's
    ]
    published = [("k1", 1), ("k1", 1), ("k2", 1), ("k3", 2), ("k4", 1)]

    for prefix in "ab":
        _claim(store, key=f"{prefix}k5", owner="w2")
    one = [
        store.claim(message_key=f"a{k}", notification_id="n", channel=SMS, lane=NORMAL, attempt=1, now_ms=1000,
                    lease_ms=500, owner="w1", user_id="u", rules=rules)
        for k, rules in claims
    ]
    batch = claim_many(
        store.db,
        [ClaimRequest(f"b{k}", "n", SMS, NORMAL, 1, "u", rules) for k, rules in claims],
        now_ms=1000, lease_ms=500, owner="w1",
    )
    assert [(d.action, v) for d, _, v in batch] == [(d.action, v) for d, _, v in one]
    assert [d.action for d, _, _ in batch][:3] == [ClaimAction.CLAIM, ClaimAction.CLAIM, ClaimAction.WAIT]
    one_done = [
        store.finish(message_key=f"a{k}", attempt=a, owner=o, plan=plan, provider="p", error=err, now_ms=1100,
                     provider_ref=ref)
        for k, a, o, plan, ref, err in finishes
    ]
    batch_done = finish_many(
        store.db,
        [FinishRequest(f"b{k}", a, plan, "p", err, 1100, provider_ref=ref) for k, a, _, plan, ref, err in finishes],
        owner="w1",
    )
    assert batch_done == one_done == [True, True, False, True, False, False]
    for key, attempt in published:
        store.mark_published([(f"a{key}", attempt)])
    store.mark_published([(f"b{key}", attempt) for key, attempt in published])
    rows = {r.message_key: r for r in store.rows()}
    assert len(rows) == 12
    for k in ("k1", "k2", "k3", "k4", "k5", "k6"):
        a, b = rows[f"a{k}"], rows[f"b{k}"]
        assert replace(b, message_key=a.message_key) == a, k
    assert [rows[f"b{k}"].unpublished for k in ("k1", "k2", "k3", "k4")] == [False, False, True, False]

def test_on_sqlite_a_batch_is_the_same_few_statements_whatever_its_size(tmp_path: Path) -> None:
    """A claim batch (with limit counters) and an outcome batch run as many statements for 4
    messages as for 200, none of them one per message: in a busy process each step of a statement
    waits for the interpreter's lock while the store file's write lock is held (``ops.gil``)."""
    store = open_store(str(tmp_path / "store.sqlite3"), synchronous="NORMAL")
    day = 86_400_000
    statements: list[str] = []
    store.db._connection().set_trace_callback(statements.append)

    def limit(n: int) -> LimitClaim:
        return LimitClaim(f"otp:u{n % 3}:0", f"n{n}", 1_000, Reason.MARKETING_LIMIT, 2 * day)

    def send(n: int) -> object:
        return lambda counts, first: RuleVerdict(consume=(limit(n),))

    def batch(size: int, start: int) -> tuple[int, int]:
        keys = [f"s{start + i}" for i in range(size)]
        statements.clear()
        claimed = claim_many(store.db, [ClaimRequest(k, "n", SMS, NORMAL, 1, "u", send(start + i), (limit(start + i),))
                                        for i, k in enumerate(keys)], now_ms=1000, lease_ms=60_000, owner="w1")
        assert [d.action for d, _, _ in claimed] == [ClaimAction.CLAIM] * size
        claims = len(statements)
        statements.clear()
        assert finish_many(store.db, [FinishRequest(k, 1, SENT, "p", None, 1100) for k in keys], owner="w1") == [True] * size
        return claims, len(statements)

    small, large = batch(4, 0), batch(200, 1000)
    assert small == large, (small, large)
    assert large[0] <= 10 and large[1] <= 4, large
    claimed_again = claim_many(store.db, [ClaimRequest("s1", "n", SMS, NORMAL, 1, "u", send(1), (limit(1),))],
                               now_ms=2000, lease_ms=60_000, owner="w2")
    assert claimed_again[0][0].action is not ClaimAction.CLAIM  # sent already: read, not made again
    assert len(store.limit_units("otp:u1:0")) == 1 + 67  # s1 and s1000 .. s1198 step 3: each unit once


# -- the handler -----------------------------------------------------------------------------------


def _handler(store: StatusStore, fake: FakeProvider, now: list[int], root: Path) -> DeliveryHandler:
    profiles = profiles_for_tests(store)
    profiles.store.put("user-1", parse_profile({"contacts": {"sms": ["+15550001"]}}))
    profiles.store.put("user-2", parse_profile({"contacts": {"sms": ["+15550002"]}}))
    metrics = Metrics()
    dispatcher = Dispatcher(
        channel=SMS,
        primary=fake,
        secondary=None,
        limit=RateLimit(1000, 100),
        breaker=BreakerOptions(),
        metrics=metrics,
    )
    return DeliveryHandler(
        channel=SMS,
        lane=NORMAL,
        store=store,
        dispatcher=dispatcher,
        profiles=profiles,
        rules=rules_for_tests(root),
        policy=RetryPolicy(base_ms=1000, max_attempts=2, jitter_ratio=0.0),
        topics=HandlerTopics(
            status="status", dlq="dlq", delay=lambda t, step: f"{t}.retry.{format_step(step)}"
        ),
        lease_ms=5000,
        owner="w",
        metrics=metrics,
        clock_ms=lambda: now[0],
        rand=lambda: 0.0,
    )


def test_a_transient_failure_becomes_a_retry_record_then_a_dead_letter(store: StatusStore, tmp_path: Path) -> None:
    fake = FakeProvider(script={"+15550001": ["transient"]})
    now = [NOW]
    h = _handler(store, fake, now, tmp_path)
    raw = codec.encode("channel_message", channel_message(1))
    first = asyncio.run(h.handle(topic="sms", partition=0, offset=0, key=b"user-1", value=raw))
    topics = [o.topic for o in first.outputs]
    assert topics == ["status", "status", "sms.retry.1s"]
    retry = codec.decode("delayed_delivery", first.outputs[2].value)
    assert (retry["attempt"], retry["not_before"], retry["payload"]) == (2, NOW + 1000, raw)
    store.mark_published(first.published)
    early = asyncio.run(h.handle(
        topic="sms.retry.1s", partition=0, offset=0, key=b"user-1", value=first.outputs[2].value, delay_step_ms=1000
    ))
    assert early.hold_until_ms == NOW + 1000 and not early.outputs
    now[0] = NOW + 1000
    second = asyncio.run(h.handle(
        topic="sms.retry.1s", partition=0, offset=0, key=b"user-1", value=first.outputs[2].value, delay_step_ms=1000
    ))
    letter = codec.decode("dead_letter", second.outputs[-1].value)
    assert (letter["reason_kind"], letter["attempts"], letter["payload"]) == ("max_attempts", 2, raw)
    assert len(fake.received()) == 2


def test_a_worker_releases_the_claims_of_a_partition_revoked_while_they_were_being_claimed(
    store: StatusStore, tmp_path: Path
) -> None:
    """The partition goes (a rebalance) while a batch is in the store thread being claimed: no
    call is made for it, and its claims are released, so the next owner takes them at once."""
    fake = FakeProvider()
    h = _handler(store, fake, [NOW], tmp_path)
    worker = SenderWorker(
        name="sms.normal.0",
        client_config={},
        options=WorkerOptions(group_id="g", transactional_id="t", source_topic="sms", delay_topics={}),
        handler=h,
        metrics=Metrics(),
    )
    deliveries = []
    for i, user in ((1, "user-1"), (2, "user-2")):
        d = h.decode(topic="sms", partition=0, offset=i, key=user.encode(),
                     value=codec.encode("channel_message", channel_message(i, user=user)))
        assert not isinstance(d, Handled)
        deliveries.append(d)
    run = _Run()
    entries = [Entry(("sms", 0), i, NOW, d) for i, d in enumerate(deliveries)]
    for entry in entries:
        run.ledger.add(entry)
    batch = run.ledger.take(2)
    steps = h.claim_batch([e.delivery for e in batch])  # type: ignore[misc]
    assert all(isinstance(step, SendJob) for step in steps)
    run.ledger.drop([("sms", 0)])  # revoked meanwhile

    async def start() -> None:
        async with asyncio.TaskGroup() as tasks:
            worker._start(run, tasks, batch, steps, granted=2)

    worker._threads = {"store": ThreadPoolExecutor(1)}
    try:
        asyncio.run(start())
    finally:
        worker._threads["store"].shutdown()
    assert fake.received() == []
    for d in deliveries:
        row = store.get(d.message_key)
        assert row is not None and row.status is DeliveryStatus.SENDING and row.lease_until_ms == 0
        assert _claim(store, d.message_key, now=NOW + 1, owner="next") is ClaimAction.CLAIM


def test_an_aborted_batch_is_republished_not_resent(store: StatusStore, tmp_path: Path) -> None:
    fake = FakeProvider()
    h = _handler(store, fake, [NOW], tmp_path)
    raw = codec.encode("channel_message", channel_message(2, user="user-2"))
    first = asyncio.run(h.handle(topic="sms", partition=0, offset=0, key=None, value=raw))
    # the transaction that carried ``first.outputs`` aborted: the record comes again
    again = asyncio.run(h.handle(topic="sms", partition=0, offset=0, key=None, value=raw))
    assert len(fake.received()) == 1
    sent = [codec.decode("delivery_status", o.value)["status"] for o in again.outputs]
    assert sent == ["sent"] and again.published == first.published
    # the provider's id of the message is kept, so that its delivery receipt finds it
    row = store.get(channel_message(2)["message_key"])
    assert row is not None and (row.provider, row.provider_ref) == (fake.name, f"{fake.name}-1")


def test_undecodable_records_are_dead_lettered_addressless_ones_skipped(store: StatusStore, tmp_path: Path) -> None:
    fake = FakeProvider()
    h = _handler(store, fake, [NOW], tmp_path)
    bad = asyncio.run(h.handle(topic="sms", partition=1, offset=7, key=b"x", value=b"\x00garbage"))
    assert codec.decode("dead_letter", bad.outputs[0].value)["reason_kind"] == "undecodable"
    nobody = codec.encode("channel_message", channel_message(3, user="user-unknown"))
    out = asyncio.run(h.handle(topic="sms", partition=0, offset=0, key=None, value=nobody))
    [status] = [codec.decode("delivery_status", o.value) for o in out.outputs]
    assert (status["status"], status["reason"], status["template"]) == ("skipped", "no_address", "tmpl")
    row = store.get("k3:sms")
    assert row is not None and (row.status, row.reason, row.user_id) == (DeliveryStatus.SKIPPED, "no_address", "user-unknown")
    assert fake.received() == []


def test_two_marketing_messages_of_one_user_in_one_claim_batch_let_exactly_one_through(
    store: StatusStore, tmp_path: Path
) -> None:
    """One claim transaction for both: the daily limit (1) still admits exactly one, and its
    counter holds that one's unit."""
    h = _handler(store, FakeProvider(), [NOW], tmp_path)
    sale = {"template": "eid_sale", "params": {"pct": "20"}}
    first, second = (
        from_channel_record(
            codec.encode("channel_message", {**channel_message(n, user="user-1", **sale), "category": "marketing"}),
            key=b"user-1",
            lane=NORMAL,
            source_topic="sms",
        )
        for n in (1, 2)
    )
    admitted, refused = h.claim_batch([first, second])
    assert isinstance(admitted, SendJob) and admitted.can_send
    assert isinstance(refused, Handled)
    [status] = [codec.decode("delivery_status", o.value) for o in refused.outputs]
    assert (status["message_key"], status["status"], status["reason"]) == ("k2:sms", "rejected", "marketing_limit")
    rows = {r.message_key: (r.status, r.reason) for r in store.rows()}
    assert rows == {"k1:sms": (DeliveryStatus.SENDING, None), "k2:sms": (DeliveryStatus.REJECTED, "marketing_limit")}
    day = dt.datetime.fromtimestamp(NOW / 1000, dt.UTC).date().isoformat()
    assert store.limit_units(f"marketing:user-1:{day}") == ["n-1"]


# -- retention -------------------------------------------------------------------------------------


def test_prune_drops_finished_rows_older_than_the_retention_and_keeps_the_rest(store: StatusStore) -> None:
    day = 86_400_000
    for key, at in (("old:sms", 1_000), ("new:sms", 5 * day)):
        assert _claim(store, key, now=at) is ClaimAction.CLAIM
        assert _finish(store, at, key=key)
        store.mark_published([(key, 1)])
    assert _claim(store, "waiting:sms", now=1_000) is ClaimAction.CLAIM  # still sending: kept
    store.claim(
        message_key="limited:sms", notification_id="n", channel=SMS, lane=NORMAL, attempt=1, now_ms=1_000,
        lease_ms=500, owner="w1",
        rules=lambda counts, first: RuleVerdict(consume=(LimitClaim("marketing:u:1970-01-01", "n", 1,
                                                                   Reason.MARKETING_LIMIT, 2 * day),)),
        limits=(LimitClaim("marketing:u:1970-01-01", "n", 1, Reason.MARKETING_LIMIT, 2 * day),),
    )
    assert store.limit_units("marketing:u:1970-01-01") == ["n"]
    dropped = store.prune(now_ms=6 * day, retention_ms=2 * day)
    assert dropped == 1 + 1 + 1  # the old row, the expired unit and its counter
    assert store.get("old:sms") is None
    assert store.get("new:sms") is not None and store.get("waiting:sms") is not None
    assert store.limit_units("marketing:u:1970-01-01") == []
    assert store.prune(now_ms=6 * day, retention_ms=2 * day) == 0


def test_a_pruned_key_replayed_is_rejected_as_expired_not_sent_again(store: StatusStore, tmp_path: Path) -> None:
    """Once a key's row is pruned the store no longer knows it was sent: a replay of a record
    older than the retention is rejected (``expired``) rather than sent twice."""
    fake = FakeProvider()
    now = [NOW]
    h = _handler(store, fake, now, tmp_path)
    h.rules = rules_for_tests(tmp_path, retention_ms=3_600_000)
    raw = codec.encode("channel_message", channel_message(1, user="user-1"))
    first = asyncio.run(h.handle(topic="sms", partition=0, offset=0, key=None, value=raw))
    store.mark_published(first.published)
    assert len(fake.received()) == 1
    now[0] = NOW + 2 * 3_600_000
    assert store.prune(now[0], 3_600_000) == 1 and store.get("k1:sms") is None
    replay = asyncio.run(h.handle(topic="sms", partition=0, offset=0, key=None, value=raw))
    [status] = [codec.decode("delivery_status", o.value) for o in replay.outputs]
    assert (status["status"], status["reason"]) == ("rejected", "expired")
    assert len(fake.received()) == 1


def test_a_deferral_waits_in_the_delay_topic_and_a_replay_before_its_time_waits_too(
    store: StatusStore, tmp_path: Path
) -> None:
    fake = FakeProvider()
    now = [NOW]  # 09:01 UTC
    h = _handler(store, fake, now, tmp_path)
    h.profiles.store.put(
        "u-q", parse_profile({"tz": "UTC", "quiet_hours": {"from": "08:00", "to": "10:00"}, "contacts": {"sms": ["+15550009"]}})
    )
    ten = NOW - 60_000 + 3_600_000  # 10:00 UTC
    raw = codec.encode(
        "channel_message", {**channel_message(9, user="u-q", template="eid_sale", params={"pct": "20"}), "category": "marketing"}
    )
    first = asyncio.run(h.handle(topic="sms", partition=0, offset=0, key=b"u-q", value=raw))
    status, delay = first.outputs
    s = codec.decode("delivery_status", status.value)
    assert (s["status"], s["reason"], s["not_before"], s["template"], s["locale"]) == ("deferred", "quiet_hours", ten, "eid_sale", "en")
    wait = codec.decode("delayed_delivery", delay.value)
    assert (delay.topic, wait["attempt"], wait["not_before"], wait["payload"]) == ("sms.retry.1s", 1, ten, raw)
    store.mark_published(first.published)
    replayed = asyncio.run(h.handle(topic="sms", partition=0, offset=0, key=b"u-q", value=raw))  # before its time
    assert [o.topic for o in replayed.outputs] == ["sms.retry.1s"] and not replayed.published
    assert codec.decode("delayed_delivery", replayed.outputs[0].value)["not_before"] == ten
    now[0] = ten
    due = asyncio.run(h.handle(topic="sms.retry.1s", partition=0, offset=0, key=b"u-q", value=delay.value, delay_step_ms=1000))
    assert [codec.decode("delivery_status", o.value)["status"] for o in due.outputs] == ["sending", "sent"]
    [call] = fake.received()
    assert call.message is not None and call.message.fields()["text"] == "Eid sale: 20% off. Reply STOP to opt out."


def test_a_receipt_moves_sent_to_delivered_once_by_the_providers_message_id(store: StatusStore) -> None:
    _claim(store)
    assert _finish(store, now=1100, provider_ref="prov-77")
    assert store.get("k:sms").provider_ref == "prov-77"  # type: ignore[union-attr]
    row, changed = store.apply_receipt("p", "prov-77", DeliveryStatus.DELIVERED, None, now_ms=2000)
    assert changed and row is not None and (row.message_key, row.status) == ("k:sms", DeliveryStatus.DELIVERED)
    row, changed = store.apply_receipt("p", "prov-77", DeliveryStatus.DELIVERED, None, now_ms=2100)
    assert not changed and row is not None and row.status is DeliveryStatus.DELIVERED
    stored = store.get("k:sms")
    assert stored is not None and (stored.status, stored.updated_ms) == (DeliveryStatus.DELIVERED, 2000)
    # another provider's id, or an unknown one, finds nothing
    assert store.apply_receipt("other", "prov-77", DeliveryStatus.FAILED, "bounced", now_ms=2200) == (None, False)
    assert store.apply_receipt("p", "prov-78", DeliveryStatus.FAILED, "bounced", now_ms=2200) == (None, False)


def test_a_bounce_fails_a_sent_message_and_a_late_delivered_changes_nothing(store: StatusStore) -> None:
    _claim(store)
    _finish(store, now=1100, provider_ref="prov-9")
    row, changed = store.apply_receipt("p", "prov-9", DeliveryStatus.FAILED, "bounced", now_ms=2000)
    assert changed and row is not None and (row.status, row.reason) == (DeliveryStatus.FAILED, "bounced")
    assert store.apply_receipt("p", "prov-9", DeliveryStatus.DELIVERED, None, now_ms=2100)[1] is False
    assert store.get("k:sms").status is DeliveryStatus.FAILED  # type: ignore[union-attr]


def test_a_receipt_before_the_send_is_recorded_changes_nothing(store: StatusStore) -> None:
    _claim(store)  # sending: the provider's id is not known yet
    assert store.apply_receipt("p", "prov-1", DeliveryStatus.DELIVERED, None, now_ms=1050) == (None, False)


def test_the_rows_of_a_notification_a_dedup_key_and_a_user(store: StatusStore) -> None:
    for key, nid, user in (
        ("a_b:1:sms:5", "n-1", "u1"), ("a_b:1:push:5", "n-1", "u1"), ("aXb:1:sms:5", "n-2", "u1"),
        ("a_b:1:x:sms:5", "n-3", "u2"),
    ):
        store.claim(message_key=key, notification_id=nid, channel=SMS, lane=NORMAL, attempt=1, now_ms=1000,
                    lease_ms=500, owner="w", user_id=user)
    assert sorted(r.message_key for r in store.rows_of_notification("n-1")) == ["a_b:1:push:5", "a_b:1:sms:5"]
    # LIKE's wildcards in the key are literal, and a longer key sharing the prefix is not this one
    assert sorted(r.message_key for r in store.rows_of_dedup_key("a_b:1")) == ["a_b:1:push:5", "a_b:1:sms:5"]
    assert sorted(r.notification_id for r in store.rows_of_user("u1")) == ["n-1", "n-1", "n-2"]


def test_a_worker_s_write_transactions_are_timed_its_wait_for_the_file_and_its_hold(tmp_path: Path) -> None:
    """``sender_store_lock_wait_seconds`` and ``sender_store_lock_held_seconds`` by channel and
    lane (SQLite): a transaction that waits for another connection's is told that wait, and each
    how long it held the file; a read takes no write lock and is told nothing."""
    from senders.runtime.pool import watch_store

    location = str(tmp_path / "store.sqlite3")
    first, second = open_store(location, synchronous="NORMAL"), open_store(location, synchronous="NORMAL")
    metrics = Metrics()
    watch_store(metrics, second.db, SMS, Lane.PRIORITY)
    first_in = threading.Event()

    def hold() -> None:
        with first.db.tx():
            first_in.set()
            threading.Event().wait(0.3)

    t = threading.Thread(target=hold)
    t.start()
    first_in.wait(10)
    with second.db.tx() as cur:
        cur.execute("SELECT 1").fetchall()
        threading.Event().wait(0.1)
    t.join(10)
    with second.db.tx(write=False) as cur:
        cur.execute("SELECT 1").fetchall()
    labels = {"channel": "sms", "lane": "priority"}
    assert metrics.value("sender_store_lock_wait_seconds_count", **labels) == 1
    assert 0.1 < metrics.value("sender_store_lock_wait_seconds_sum", **labels) < 5
    assert metrics.value("sender_store_lock_held_seconds_count", **labels) == 1
    assert 0.1 <= metrics.value("sender_store_lock_held_seconds_sum", **labels) < 5
    assert metrics.value("sender_store_transactions_total", **labels) == 2
    assert 'sender_store_lock_held_seconds_bucket{channel="sms",lane="priority",le="0.25"} 1' in (
        metrics.render_prometheus())
