"""The worker's ledger, without Kafka: the offset committed is the end of each partition's
contiguous finished prefix; one entry in flight per user, a user's later ones in arrival order,
other users never waiting; drops (revokes, rewinds) keep a user's open call first in line."""

from __future__ import annotations

from operators import codec
from senders.records import from_channel_record
from senders.runtime.handler import Output
from senders.runtime.ledger import Entry, Ledger, Stage
from senders.statuses import Lane
from tests.senders.conftest import channel_message

TP0, TP1 = ("sms", 0), ("sms", 1)


def _entry(tp: tuple[str, int], offset: int, n: int, user: str) -> Entry:
    raw = codec.encode("channel_message", channel_message(n, user=user))
    return Entry(tp, offset, 1000 + offset, from_channel_record(raw, key=None, lane=Lane.NORMAL, source_topic=tp[0]))


def _out(n: int) -> list[Output]:
    return [Output("status", f"k{n}".encode(), b"x")]


def test_the_committed_offset_is_the_end_of_the_finished_prefix() -> None:
    ledger = Ledger()
    entries = [_entry(TP0, offset, offset, f"u{offset}") for offset in range(4)]
    for e in entries:
        ledger.add(e)
    assert [e.offset for e in ledger.take(10)] == [0, 1, 2, 3]  # four users: all at once
    ledger.finish(entries[1], _out(1), [("k1:sms", 1)])
    ledger.finish(entries[3], _out(3), [("k3:sms", 1)])
    plan = ledger.commit_plan()
    assert plan.offsets == {}  # offset 0 is still in flight
    assert [e.offset for e in plan.entries] == [1, 3]  # their records may go out all the same
    assert ledger.committed(plan) == [("k1:sms", 1), ("k3:sms", 1)]
    ledger.finish(entries[0], _out(0), [("k0:sms", 1)])
    plan = ledger.commit_plan()
    assert plan.offsets == {TP0: 2} and [e.offset for e in plan.entries] == [0]  # 1 was produced already
    ledger.committed(plan)
    assert len(ledger) == 2 and not ledger.commit_plan()
    ledger.finish(entries[2], _out(2), [])
    assert ledger.commit_plan().offsets == {TP0: 4}


def test_a_users_messages_go_one_at_a_time_in_order_and_others_never_wait() -> None:
    ledger = Ledger()
    a1, a2, b1, a3 = _entry(TP0, 0, 1, "a"), _entry(TP0, 1, 2, "a"), _entry(TP1, 0, 3, "b"), _entry(TP1, 1, 4, "a")
    for e in (a1, a2, b1, a3):
        ledger.add(e)
    assert ledger.take(10) == [a1, b1]  # a's later ones wait; b does not wait for a
    assert ledger.take(10) == []
    ledger.finish(b1, [], [])
    assert ledger.take(10) == []  # a1 still in flight
    ledger.finish(a1, [], [])
    assert ledger.take(10) == [a2]
    ledger.finish(a2, [], [])
    assert ledger.take(10) == [a3]


def test_a_waiting_entry_keeps_its_place_and_a_failed_claim_goes_first_again() -> None:
    ledger = Ledger()
    a1, a2, b1 = _entry(TP0, 0, 1, "a"), _entry(TP0, 1, 2, "a"), _entry(TP0, 2, 3, "b")
    for e in (a1, a2, b1):
        ledger.add(e)
    assert ledger.take(1) == [a1]
    ledger.wait(a1)  # claimed by another worker: tried again later
    assert ledger.take(10) == [b1]  # a2 does not overtake a1
    ledger.give_back([b1])
    ledger.wake(a1)
    assert ledger.take(10) == [b1, a1]


def test_a_revoked_partition_leaves_but_a_users_open_call_stays_first() -> None:
    ledger = Ledger()
    a1, a2 = _entry(TP0, 0, 1, "a"), _entry(TP1, 0, 2, "a")  # one user, two partitions (a retry)
    ledger.add(a1)
    ledger.add(a2)
    [taken] = ledger.take(10)
    taken.stage = Stage.SENDING
    gone = ledger.drop([TP0])
    assert gone == [a1] and a1.dropped
    assert ledger.take(10) == []  # a2 waits for the call a1 still has open
    ledger.finish(a1, [], [])
    assert ledger.take(10) == [a2]
    assert TP0 not in ledger.commit_plan().offsets


def test_a_rewind_drops_everything_and_forgets_the_committed_positions() -> None:
    ledger = Ledger()
    e = _entry(TP0, 5, 1, "a")
    ledger.add(e)
    ledger.take(1)
    ledger.finish(e, _out(1), [("k1:sms", 1)])
    ledger.committed(ledger.commit_plan())
    ledger.drop()
    again = _entry(TP0, 5, 1, "a")
    ledger.add(again)
    ledger.take(1)
    ledger.finish(again, [], [])
    assert ledger.commit_plan().offsets == {TP0: 6}  # committed again after the rewind


def test_finished_entries_without_a_user_only_wait_for_the_commit() -> None:
    ledger = Ledger()
    ledger.add(Entry(TP0, 0, 0, None, Stage.DONE, _out(0), []))
    assert ledger.take(10) == []
    plan = ledger.commit_plan()
    assert plan.offsets == {TP0: 1} and len(plan.outputs) == 1
