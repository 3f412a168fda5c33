"""The dedup rule (operators.window, driven through operators.dedup the way the Flink operator
drives it: tests/operators/drive.py) against the independent reference model (harness.reference).
"""

from __future__ import annotations

import io
from typing import Any

import pytest
from fastavro import schemaless_reader
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import reference
from harness.reference import Outcome
from operators import codec
from operators.contract import Topics
from operators.dedup_key import resolve_dedup_key
from operators.records import Category, Channel, NotificationRequest, Priority
from operators.window import (
    DAY_MS,
    MIN_WINDOW_MS,
    NO_WATERMARK,
    Accepted,
    LatePolicy,
    WindowConfig,
    expiry,
    is_late,
    window_ms,
)
from tests import encoders as routing
from tests.operators.drive import Driver, Summary, summarize
from tests.operators.strategies import BEST, SIDE, cases, configs, req

PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -- the job's way of driving operators.window: operators.dedup, as the adapter does ------------


def drive_window(stream: list[tuple[NotificationRequest, int]], cfg: WindowConfig) -> list[Summary]:
    return Driver(cfg).run(stream)


def verdicts(outcomes: list[Outcome]) -> list[str]:
    return [o.verdict for o in outcomes]


# -- properties ---------------------------------------------------------------------------------


@PROPERTY
@given(cases())
def test_window_matches_reference(case: tuple[WindowConfig, list[tuple[NotificationRequest, int]]]) -> None:
    cfg, stream = case
    assert drive_window(stream, cfg) == summarize(reference.run(stream, cfg))


@PROPERTY
@given(cases(SIDE))
def test_eviction_never_changes_a_decision_with_side_output(
    case: tuple[WindowConfig, list[tuple[NotificationRequest, int]]],
) -> None:
    cfg, stream = case
    with_eviction = reference.run(stream, cfg)
    assert with_eviction == reference.run(stream, cfg, evict=False)


@PROPERTY
@given(cases(BEST))
def test_eviction_never_changes_an_on_time_decision_with_best_effort(
    case: tuple[WindowConfig, list[tuple[NotificationRequest, int]]],
) -> None:
    """Evicted state can only matter to late requests (which best-effort lets through)."""
    cfg, stream = case
    kept = reference.run(stream, cfg, evict=False)
    evicted = reference.run(stream, cfg)
    differ = [i for i, (a, b) in enumerate(zip(kept, evicted, strict=True)) if a != b]
    if differ:
        # the first difference is a late request; later ones may follow from the state it left
        request, watermark = stream[differ[0]]
        assert watermark != NO_WATERMARK
        assert request.event_time < watermark - cfg.allowed_lateness_ms


@PROPERTY
@given(cases())
def test_reference_invariants(case: tuple[WindowConfig, list[tuple[NotificationRequest, int]]]) -> None:
    cfg, stream = case
    outcomes = reference.run(stream, cfg)
    assert len(outcomes) == len(stream)
    accepted: dict[str, NotificationRequest] = {}
    for (request, watermark), o in zip(stream, outcomes, strict=True):
        assert o.request is request
        assert o.dedup_key == resolve_dedup_key(request)
        late = watermark != NO_WATERMARK and request.event_time < watermark - cfg.allowed_lateness_ms
        if cfg.late_policy is SIDE:
            assert (o.verdict == "late") == late
        else:
            assert o.verdict != "late"
        if o.verdict == "duplicate":
            original = accepted[o.dedup_key]
            assert o.original_notification_id == original.notification_id
            assert o.first_seen_event_time == original.event_time
            assert o.occurrence is not None and o.occurrence >= 2
            width = window_ms(original.dedup_ttl_sec, cfg)
            assert abs(request.event_time - original.event_time) < width
        elif o.verdict == "new":
            accepted[o.dedup_key] = request
        if o.verdict == "late":
            assert o.watermark == watermark
        else:
            assert o.watermark is None


# -- explicit examples ---------------------------------------------------------------------------

CFG = WindowConfig()


def run_both(stream: list[tuple[NotificationRequest, int]], cfg: WindowConfig = CFG) -> list[Summary]:
    expected = summarize(reference.run(stream, cfg))
    assert drive_window(stream, cfg) == expected
    return expected


def no_wm(*requests: NotificationRequest) -> list[tuple[NotificationRequest, int]]:
    return [(r, NO_WATERMARK) for r in requests]


def test_bound_is_exclusive_on_both_sides() -> None:
    t0, w = 100_000, 10_000
    for t, verdict in [
        (t0 + w - 1, "duplicate"),
        (t0 + w, "new"),
        (t0 - w + 1, "duplicate"),
        (t0 - w, "new"),
    ]:
        out = run_both(no_wm(req("a", t0, ttl=10), req("b", t, ttl=10)))
        assert out[1][0] == verdict, t - t0


def test_out_of_order_within_window_is_a_duplicate_of_the_later_original() -> None:
    out = run_both(no_wm(req("a", 50_000, ttl=10), req("b", 41_000, ttl=10), req("c", 50_000, ttl=10)))
    assert out == [("new", None, None, None), ("duplicate", "a", 50_000, 2), ("duplicate", "a", 50_000, 3)]


def test_window_reopens_after_w_and_counts_restart() -> None:
    stream = no_wm(
        req("a", 0, ttl=10),
        req("b", 1_000, ttl=10),
        req("c", 9_999, ttl=10),
        req("d", 5_000, ttl=10),
        req("e", 10_000, ttl=10),  # reopens: t0 + W of a
        req("f", 12_000, ttl=10),
        req("g", 1_000, ttl=10),  # |1000 - 10000| < 10000: a repeat of e, not of a
        req("h", 20_000, ttl=10),
    )
    assert run_both(stream) == [
        ("new", None, None, None),
        ("duplicate", "a", 0, 2),
        ("duplicate", "a", 0, 3),
        ("duplicate", "a", 0, 4),
        ("new", None, None, None),
        ("duplicate", "e", 10_000, 2),
        ("duplicate", "e", 10_000, 3),
        ("new", None, None, None),
    ]


def test_out_of_order_far_before_the_original_replaces_it() -> None:
    """Latest accepted in processing order wins, even when its event time is older."""
    stream = no_wm(req("a", 100_000, ttl=10), req("b", 50_000, ttl=10), req("c", 95_000, ttl=10))
    assert run_both(stream) == [
        ("new", None, None, None),
        ("new", None, None, None),
        ("new", None, None, None),  # |95000 - 50000| >= 10 s: the latest accepted is b
    ]


def test_the_originals_window_decides_not_the_repeats() -> None:
    stream = no_wm(
        req("a", 0, ttl=10),
        req("b", 15_000, ttl=1_000),  # outside a's 10 s although its own window is larger
        req("c", 900_000, ttl=1),  # inside b's 1000 s although its own window is 1 s
    )
    assert run_both(stream) == [
        ("new", None, None, None),
        ("new", None, None, None),
        ("duplicate", "b", 15_000, 2),
    ]


def test_keys_are_independent() -> None:
    stream = no_wm(req("a", 0, key="x"), req("b", 0, key="y"), req("c", 1, key="x"), req("d", 2, key="y"))
    assert run_both(stream) == [
        ("new", None, None, None),
        ("new", None, None, None),
        ("duplicate", "a", 0, 2),
        ("duplicate", "b", 0, 2),
    ]


def test_derived_and_empty_keys_share_state() -> None:
    stream = no_wm(req("a", 0, key=None), req("b", 1, key=""), req("c", 2, key=None, params={"x": "1"}))
    assert [v for v, *_ in run_both(stream)] == ["new", "duplicate", "new"]


@pytest.mark.parametrize(
    ("ttl", "expected_ms"),
    [
        (None, CFG.default_window_ms),
        (0, MIN_WINDOW_MS),
        (-5, MIN_WINDOW_MS),
        (1, 1_000),
        (2, 2_000),
        (86_400, DAY_MS),
        (30 * 86_400, 30 * DAY_MS),
        (30 * 86_400 + 1, 30 * DAY_MS),
        (10**15, 30 * DAY_MS),
    ],
)
def test_dedup_ttl_sec_is_clamped(ttl: int | None, expected_ms: int) -> None:
    assert window_ms(ttl, CFG) == expected_ms
    assert reference.request_window_ms(ttl, CFG) == expected_ms
    out = run_both(no_wm(req("a", 0, ttl=ttl), req("b", expected_ms - 1), req("c", expected_ms)))
    assert [v for v, *_ in out] == ["new", "duplicate", "new"]


def test_default_and_max_window_come_from_the_config() -> None:
    cfg = WindowConfig(default_window_ms=4_000, max_window_ms=6_000)
    assert window_ms(None, cfg) == 4_000
    assert window_ms(100, cfg) == 6_000
    out = run_both(no_wm(req("a", 0), req("b", 3_999), req("c", 4_000, ttl=100), req("d", 9_999)), cfg)
    assert [v for v, *_ in out] == ["new", "duplicate", "new", "duplicate"]


@pytest.mark.parametrize("policy", [SIDE, BEST])
def test_late_with_zero_lateness(policy: LatePolicy) -> None:
    cfg = WindowConfig(allowed_lateness_ms=0, late_policy=policy)
    stream = [(req("a", 9_999, key="a"), 10_000), (req("b", 10_000, key="b"), 10_000)]
    out = run_both(stream, cfg)
    assert [v for v, *_ in out] == (["late", "new"] if policy is SIDE else ["new", "new"])
    assert reference.run(stream, cfg)[0].watermark == (10_000 if policy is SIDE else None)


def test_late_with_allowed_lateness() -> None:
    cfg = WindowConfig(allowed_lateness_ms=500)
    stream = [(req("a", 9_499, key="a"), 10_000), (req("b", 9_500, key="b"), 10_000)]
    assert [v for v, *_ in run_both(stream, cfg)] == ["late", "new"]


def test_no_watermark_is_never_late() -> None:
    stream = no_wm(req("a", -(10**15), key="a"), req("b", -(2**62), key="b"))
    assert [v for v, *_ in run_both(stream, WindowConfig(allowed_lateness_ms=0))] == ["new", "new"]


def test_side_output_late_requests_leave_state_alone() -> None:
    cfg = WindowConfig(allowed_lateness_ms=0, late_policy=SIDE)
    stream = [
        (req("a", 20_000, ttl=10), 0),
        (req("b", 5_000, ttl=10), 15_000),  # late: not a repeat, no state change
        (req("c", 21_000, ttl=10), 15_000),
    ]
    assert run_both(stream, cfg) == [
        ("new", None, None, None),
        ("late", None, None, None),
        ("duplicate", "a", 20_000, 2),  # occurrence 2: the late request did not count
    ]
    assert is_late(0, 1_001, cfg) and not is_late(1_001, 1_001, cfg)


def test_best_effort_late_requests_are_deduplicated_against_state() -> None:
    cfg = WindowConfig(allowed_lateness_ms=0, late_policy=BEST)
    stream = [
        (req("a", 20_000, ttl=10), 0),
        (req("b", 12_000, ttl=10), 15_000),  # late, and a repeat of a
        (req("c", 6_000, ttl=10), 15_000),  # late, not a repeat: accepted, replaces a
        (req("d", 14_000, ttl=10), 15_000),  # late, a repeat of c (kept until watermark 16000)
        (req("e", 29_000, ttl=10), 16_000),  # c evicted, a replaced: nothing left to repeat
    ]
    assert run_both(stream, cfg) == [
        ("new", None, None, None),
        ("duplicate", "a", 20_000, 2),
        ("new", None, None, None),
        ("duplicate", "c", 6_000, 2),
        ("new", None, None, None),
    ]


def test_best_effort_late_request_can_be_decided_differently_after_eviction() -> None:
    """Why the eviction property is only claimed for side-output."""
    cfg = WindowConfig(allowed_lateness_ms=0, late_policy=BEST)
    stream = [(req("a", 0, ttl=10), 0), (req("b", 5_000, ttl=10), 10_000)]
    assert verdicts(reference.run(stream, cfg)) == ["new", "new"]  # a evicted at watermark 10000
    assert verdicts(reference.run(stream, cfg, evict=False)) == ["new", "duplicate"]
    assert [v for v, *_ in drive_window(stream, cfg)] == ["new", "new"]


def test_eviction_happens_at_expiry_including_lateness() -> None:
    cfg = WindowConfig(allowed_lateness_ms=2_000, late_policy=BEST)
    assert expiry(Accepted("a", 0, 10_000), cfg) == 12_000
    # at watermark 11999 the entry is kept, at 12000 it is gone (seen only by a late request)
    kept = [(req("a", 0, ttl=10), 0), (req("b", 9_000, ttl=10), 11_999)]
    gone = [(req("a", 0, ttl=10), 0), (req("b", 9_000, ttl=10), 12_000)]
    assert [v for v, *_ in run_both(kept, cfg)] == ["new", "duplicate"]
    assert [v for v, *_ in run_both(gone, cfg)] == ["new", "new"]


# -- the expected records, cross-checked with tests/encoders.py ----------------------------------

TOPICS = Topics(
    push="p",
    sms="s",
    email="e",
    push_priority="pp",
    sms_priority="sp",
    email_priority="ep",
    duplicates="d",
    late="l",
    invalid="i",
)


def routed_records(
    outcomes: list[Outcome],
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, list[bytes | None]]]:
    """What tests/encoders.py writes for these outcomes: decoded values and Kafka keys per topic."""
    stems = {
        TOPICS.duplicates: "duplicate_notice",
        TOPICS.late: "late_notice",
        TOPICS.invalid: "invalid_record",
    }
    out: dict[str, list[dict[str, Any]]] = {t: [] for t in TOPICS.outputs()}
    keys: dict[str, list[bytes | None]] = {t: [] for t in TOPICS.outputs()}
    for o in outcomes:
        if o.verdict == "new":
            routed = routing.channel_messages(o.request, o.dedup_key, TOPICS)
        elif o.verdict == "duplicate":
            assert o.original_notification_id is not None and o.first_seen_event_time is not None
            assert o.occurrence is not None
            original = Accepted(o.original_notification_id, o.first_seen_event_time, 1, o.occurrence)
            routed = [routing.duplicate_notice(o.request, o.dedup_key, original, TOPICS)]
        else:
            assert o.watermark is not None
            routed = [routing.late_notice(o.request, o.watermark, "behind the watermark", TOPICS)]
        for r in routed:
            rec = schemaless_reader(
                io.BytesIO(r.value), codec.load_schema(stems.get(r.topic, "channel_message")), None
            )
            out[r.topic].append(rec)
            keys[r.topic].append(r.key)
    return out, keys


def test_expected_records_example() -> None:
    cfg = WindowConfig(allowed_lateness_ms=0)
    a = req(
        "a",
        1_000,
        key=None,
        user="ann",
        channels=(Channel.PUSH, Channel.EMAIL),
        priority=Priority.HIGH,
        params={"code": "123"},
        ttl=60,
    )
    b = req(
        "b",
        2_000,
        key=None,
        user="ann",
        channels=(Channel.PUSH, Channel.EMAIL),
        priority=Priority.HIGH,
        params={"code": "123"},
    )
    c = req("c", 10, key="kc", user="bob", channels=(Channel.SMS,))
    outcomes = reference.run([(a, NO_WATERMARK), (b, 500), (c, 500)], cfg)
    expected = reference.expected_records(outcomes, TOPICS)
    key = resolve_dedup_key(a)
    assert expected["pp"] == [
        {
            "message_key": f"{key}:push:1000",
            "channel": "push",
            "notification_id": "a",
            "user_id": "ann",
            "template_id": "tmpl",
            "params": {"code": "123"},
            "channels": ["push", "email"],
            "priority": "high",
            "category": "transactional",
            "event_time": 1_000,
            "dedup_key": key,
            "dedup_ttl_sec": 60,
            "traceparent": None,
        }
    ]
    assert [m["message_key"] for m in expected["ep"]] == [f"{key}:email:1000"]
    assert expected["p"] == expected["e"] == expected["s"] == expected["sp"] == expected["i"] == []
    assert expected["d"] == [
        {
            "notification_id": "b",
            "dedup_key": key,
            "original_notification_id": "a",
            "first_seen_event_time": 1_000,
            "event_time": 2_000,
            "occurrence": 2,
        }
    ]
    assert expected["l"] == [
        {
            "request": {
                "notification_id": "c",
                "user_id": "bob",
                "template_id": "tmpl",
                "params": {},
                "channels": ["sms"],
                "priority": "normal",
                "category": "transactional",
                "event_time": 10,
                "dedup_key": "kc",
                "dedup_ttl_sec": None,
                "traceparent": None,
            },
            "watermark": 500,
            "reason": None,
        }
    ]
    messages = reference.expected_messages(outcomes, TOPICS)
    assert [k for k, _ in messages["pp"]] == [b"ann"]
    assert [k for k, _ in messages["d"]] == [key.encode()]
    assert [k for k, _ in messages["l"]] == [b"bob"]


def test_expected_records_collapse_repeated_channels_like_the_decoder() -> None:
    r = req("a", 0, channels=(Channel.SMS, Channel.SMS, Channel.PUSH))
    expected = reference.expected_records(reference.run(no_wm(r), CFG), TOPICS)
    assert [m["channels"] for m in expected["s"]] == [["sms", "push"]]
    assert len(expected["s"]) == len(expected["p"]) == 1


REQUEST_FIELDS = st.builds(
    NotificationRequest,
    notification_id=st.text(min_size=1, max_size=5),
    user_id=st.sampled_from(["u", "v", "ü"]),
    template_id=st.sampled_from(["t1", "t2"]),
    channels=st.lists(st.sampled_from(list(Channel)), min_size=1, max_size=4).map(tuple),
    event_time=st.integers(0, 30_000),
    params=st.dictionaries(st.sampled_from(["a", "b"]), st.sampled_from(["1", "é"]), max_size=2),
    priority=st.sampled_from(list(Priority)),
    category=st.sampled_from(list(Category)),
    dedup_key=st.sampled_from([None, "", "k"]),
    dedup_ttl_sec=st.sampled_from([None, 0, 5, 10**9]),
)


@PROPERTY
@given(cfg=configs(), requests=st.lists(REQUEST_FIELDS, max_size=15), watermark=st.integers(-1, 20_000))
def test_expected_records_match_what_routing_writes(
    cfg: WindowConfig, requests: list[NotificationRequest], watermark: int
) -> None:
    # requests as the job sees them: after an Avro round trip (repeated channels collapse)
    decoded = [codec.decode_request(codec.encode_request(r)) for r in requests]
    outcomes = reference.run([(r, watermark if watermark >= 0 else NO_WATERMARK) for r in decoded], cfg)
    from_requests = reference.expected_messages(
        reference.run([(r, watermark if watermark >= 0 else NO_WATERMARK) for r in requests], cfg), TOPICS
    )
    expected = reference.expected_records(outcomes, TOPICS)
    actual, keys = routed_records(outcomes)
    assert reference.diff_records(expected, actual, TOPICS) == []
    # in order, too, and with the same Kafka keys
    for topic, records in actual.items():
        if topic != TOPICS.late:
            assert records == expected[topic]
        else:
            assert [dict(r, reason=None) for r in records] == expected[topic]
    assert {t: [k for k, _ in msgs] for t, msgs in from_requests.items()} == keys
    assert {t: [v for _, v in msgs] for t, msgs in from_requests.items()} == expected


def test_diff_records_reports_differences_and_ignores_order_and_reasons() -> None:
    a = {"notification_id": "a", "occurrence": 2}
    b = {"notification_id": "b", "occurrence": 2}
    assert reference.diff_records({"d": [a, b]}, {"d": [b, a]}, TOPICS) == []
    assert reference.diff_records({"d": [a]}, {}, TOPICS) == [
        "d: missing 1x " + reference._comparable("d", a, TOPICS)
    ]
    assert len(reference.diff_records({"d": [a]}, {"d": [a, a]}, TOPICS)) == 1
    assert reference.diff_records({"d": [a]}, {"d": [dict(a, occurrence=3)]}, TOPICS) != []
    late = {"request": {"notification_id": "x", "params": {"k": "v"}}, "watermark": 5, "reason": None}
    assert reference.diff_records({"l": [late]}, {"l": [dict(late, reason="anything")]}, TOPICS) == []
    assert reference.diff_records({"l": [late]}, {"l": [dict(late, watermark=6)]}, TOPICS) != []
    assert reference.diff_records({"d": [late]}, {"d": [dict(late, reason="x")]}, TOPICS) != []


# -- the watermark model -------------------------------------------------------------------------


def test_watermarks_by_partition() -> None:
    rs = [req(f"n{i}", t) for i, t in enumerate([100, 5_000, 50, 9_000, 200, 300])]
    parts = [0, 0, 1, 0, 1, 1]
    got = [w for _, w in reference.watermarks_by_partition(zip(rs, parts, strict=True), 10)]
    assert got == [
        NO_WATERMARK,  # partition 1 has not had a record yet
        NO_WATERMARK,
        NO_WATERMARK,  # the record itself never moves the watermark it is processed under
        50 - 10 - 1,  # min(5000, 50) - 10 - 1
        50 - 10 - 1,
        200 - 10 - 1,  # min(9000, 200)
    ]
    only_seen = reference.watermarks_by_partition(zip(rs[:2], [0, 0], strict=True), 10)
    assert [w for _, w in only_seen] == [NO_WATERMARK, 100 - 10 - 1]
    held = reference.watermarks_by_partition(zip(rs[:2], [0, 0], strict=True), 10, partitions=[0, 1])
    assert [w for _, w in held] == [NO_WATERMARK, NO_WATERMARK]


@PROPERTY
@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 3)), max_size=30), st.integers(0, 5_000))
def test_watermarks_by_partition_rise_and_follow_the_slowest_partition(
    items: list[tuple[int, int]], bound: int
) -> None:
    rs = [(req(f"n{i}", t), p) for i, (t, p) in enumerate(items)]
    marks = [w for _, w in reference.watermarks_by_partition(rs, bound)]
    assert marks == sorted(marks)
    newest: dict[int, int] = {}
    for (t, p), w in zip(items, marks, strict=True):
        if w != NO_WATERMARK:
            assert w == min(newest.values()) - bound - 1
        newest[p] = max(newest.get(p, t), t)
