"""operators.codec: the schemas, the Avro codecs and the validation of requests."""

from __future__ import annotations

import hashlib
import io
import json
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_reader
from hypothesis import given, settings
from hypothesis import strategies as st

from operators import codec
from operators.errors import DedupError, InvalidRecordError
from operators.records import Category, Channel, NotificationRequest, Priority

PROPERTY = settings(max_examples=200, deadline=None)

LONG = st.integers(-(2**63), 2**63 - 1)
TEXT = st.text(max_size=8)
NONEMPTY = st.text(min_size=1, max_size=8)

REQUESTS = st.builds(
    NotificationRequest,
    notification_id=NONEMPTY,
    user_id=NONEMPTY,
    template_id=NONEMPTY,
    channels=st.lists(st.sampled_from(list(Channel)), min_size=1, max_size=3, unique=True).map(tuple),
    event_time=LONG,
    params=st.dictionaries(TEXT, TEXT, max_size=4),
    priority=st.sampled_from(list(Priority)),
    category=st.sampled_from(list(Category)),
    dedup_key=st.none() | TEXT,
    dedup_ttl_sec=st.none() | LONG,
)


# -- hand-written Avro binary ---------------------------------------------------------------------


def zz(n: int) -> bytes:
    """Avro long: zigzag, then base-128 varint."""
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def s(text: str) -> bytes:
    data = text.encode("utf-8")
    return zz(len(data)) + data


def request_bytes(
    *,
    nid: str = "n",
    user: str = "u",
    template: str = "t",
    params: bytes = zz(0),
    channels: list[int] | None = None,
    priority: int = 1,
    category: int = 0,
    event_time: int = 1_000,
    dedup_key: bytes = zz(0),
    ttl: bytes = zz(0),
    traceparent: bytes = zz(0),
) -> bytes:
    """A NotificationRequest written field by field, any index allowed."""
    chans = [0] if channels is None else channels
    channel_block = (zz(len(chans)) + b"".join(zz(i) for i in chans) + zz(0)) if chans else zz(0)
    return (
        s(nid)
        + s(user)
        + s(template)
        + params
        + channel_block
        + zz(priority)
        + zz(category)
        + zz(event_time)
        + dedup_key
        + ttl
        + traceparent
    )


def raw_request(**fields: Any) -> bytes:
    """A request written by fastavro from a plain dict (no validation on our side)."""
    rec = {
        "notification_id": "n",
        "user_id": "u",
        "template_id": "t",
        "params": {},
        "channels": ["push"],
        "priority": "normal",
        "category": "transactional",
        "event_time": 1_000,
        "dedup_key": None,
        "dedup_ttl_sec": None,
        "traceparent": None,
    }
    rec.update(fields)
    return codec.encode("notification_request", rec)


def test_hand_written_bytes_are_what_fastavro_writes() -> None:
    assert zz(0) == b"\x00" and zz(-1) == b"\x01" and zz(1) == b"\x02" and zz(64) == b"\x80\x01"
    assert request_bytes() == raw_request()
    assert request_bytes(
        params=zz(1) + s("k") + s("v") + zz(0),
        channels=[2, 1],
        priority=0,
        category=1,
        event_time=-5,
        dedup_key=zz(1) + s("dk"),
        ttl=zz(1) + zz(30),
    ) == raw_request(
        params={"k": "v"},
        channels=["email", "sms"],
        priority="high",
        category="marketing",
        event_time=-5,
        dedup_key="dk",
        dedup_ttl_sec=30,
    )


# -- schemas ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("stem", "record"), sorted(codec.SCHEMA_FILES.items()))
def test_every_schema_parses(stem: str, record: str) -> None:
    schema = codec.load_schema(stem)
    assert schema["type"] == "record"
    assert schema["name"] == f"io.notifydedup.{record}"
    # and the file itself is valid Avro as written (logical types included)
    text = (codec.SCHEMAS_DIR / f"{stem}.avsc").read_text(encoding="utf-8")
    named: dict[str, Any] = {}
    if stem == "late_notice":
        parse_schema(
            json.loads((codec.SCHEMAS_DIR / "notification_request.avsc").read_text()), named_schemas=named
        )
    assert parse_schema(json.loads(text), named_schemas=named)["name"] == f"io.notifydedup.{record}"


def test_every_schema_file_is_known() -> None:
    assert {p.stem for p in codec.SCHEMAS_DIR.glob("*.avsc")} == set(codec.SCHEMA_FILES)


def test_the_logical_type_is_dropped_but_the_wire_is_the_same() -> None:
    """Times stay int milliseconds; a reader with timestamp-millis reads the same instant."""
    raw = raw_request(event_time=1_700_000_000_123)
    full = parse_schema(json.loads((codec.SCHEMAS_DIR / "notification_request.avsc").read_text()))
    as_datetime = schemaless_reader(io.BytesIO(raw), full, None)["event_time"]
    assert int(as_datetime.timestamp() * 1000) == 1_700_000_000_123
    assert codec.decode_request(raw).event_time == 1_700_000_000_123


# -- requests --------------------------------------------------------------------------------------


@PROPERTY
@given(REQUESTS)
def test_request_round_trip(req: NotificationRequest) -> None:
    raw = codec.encode_request(req)
    assert codec.decode_request(raw) == req
    assert codec.decode("notification_request", raw) == req.to_avro()


def test_request_example_round_trip() -> None:
    req = NotificationRequest(
        notification_id="n-1",
        user_id="ユーザー",
        template_id="otp",
        channels=(Channel.SMS, Channel.PUSH),
        event_time=1_700_000_000_000,
        params={"code": "123456", "名前": "Zoë"},
        priority=Priority.HIGH,
        category=Category.MARKETING,
        dedup_key="k",
        dedup_ttl_sec=300,
    )
    back = codec.decode_request(codec.encode_request(req))
    assert back == req
    assert isinstance(back.priority, Priority) and isinstance(back.channels[0], Channel)


def test_empty_bytes() -> None:
    with pytest.raises(InvalidRecordError) as err:
        codec.decode_request(b"")
    assert err.value.reason == "empty record"


def check_garbage(raw: bytes) -> None:
    """Anything but a valid request raises InvalidRecordError and nothing else."""
    try:
        req = codec.decode_request(raw)
    except InvalidRecordError as exc:
        assert exc.reason and isinstance(exc.reason, str)
        assert str(exc) == exc.reason
        assert isinstance(exc, DedupError)
        return
    # it did decode: then it is a valid request that writes back as a decodable record
    assert req.notification_id and req.user_id and req.template_id and req.channels
    assert all(isinstance(c, Channel) for c in req.channels)
    assert codec.decode_request(codec.encode_request(req)) == req


@PROPERTY
@given(st.binary(max_size=200))
def test_arbitrary_bytes_only_raise_invalid_record_error(raw: bytes) -> None:
    check_garbage(raw)


@PROPERTY
@given(REQUESTS, st.data())
def test_damaged_requests_only_raise_invalid_record_error(
    req: NotificationRequest, data: st.DataObject
) -> None:
    raw = bytearray(codec.encode_request(req))
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(raw)))
    check_garbage(bytes(raw[:cut]))
    check_garbage(bytes(raw))


def test_trailing_bytes() -> None:
    with pytest.raises(InvalidRecordError) as err:
        codec.decode_request(raw_request() + b"\x00\x00")
    assert "2 trailing bytes" in err.value.reason


def test_truncated_record() -> None:
    raw = raw_request(dedup_key="abc")
    # a record that ends where its trailing optional fields begin (dedup_key, dedup_ttl_sec,
    # traceparent: 5, 1 and 1 bytes here) was written by an older schema
    # (test_a_request_of_an_older_schema_reads_as_null)
    older = {len(raw) - 7, len(raw) - 2, len(raw) - 1}
    for cut in sorted(set(range(1, len(raw))) - older):
        with pytest.raises(InvalidRecordError, match="undecodable NotificationRequest"):
            codec.decode_request(raw[:cut])


TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_a_request_of_an_older_schema_reads_as_null() -> None:
    """An old producer's request (written before traceparent) decodes, its traceparent null; so does
    one from before dedup_ttl_sec; a cut inside a field with no default is still undecodable."""
    before_traceparent = raw_request(dedup_key="k", dedup_ttl_sec=30)[:-1]
    req = codec.decode_request(before_traceparent)
    assert (req.dedup_key, req.dedup_ttl_sec, req.traceparent) == ("k", 30, None)
    assert codec.decode_request(raw_request(dedup_key="k")[:-2]).dedup_key == "k"
    with pytest.raises(InvalidRecordError):
        codec.decode_request(raw_request(dedup_key="k")[:-3])  # inside dedup_key's string


def test_a_request_carries_its_traceparent() -> None:
    raw = raw_request(traceparent=TRACEPARENT)
    assert raw == request_bytes(traceparent=zz(1) + s(TRACEPARENT))
    assert codec.decode_request(raw).traceparent == TRACEPARENT
    with pytest.raises(InvalidRecordError, match="traceparent must be a string"):
        codec.request_from_fields({**codec.decode("notification_request", raw), "traceparent": 5})


def test_a_channel_message_of_an_older_schema_reads_as_null() -> None:
    """A channel message the job wrote before the upgrade reaches the new senders' decoder."""
    msg = {"message_key": "k:push:1", "channel": "push", "notification_id": "n", "user_id": "u",
           "template_id": "t", "params": {}, "channels": ["push"], "priority": "normal",
           "category": "transactional", "event_time": 1, "dedup_key": "k", "dedup_ttl_sec": None,
           "traceparent": TRACEPARENT}
    assert codec.decode("channel_message", codec.encode("channel_message", msg))["traceparent"] == TRACEPARENT
    old = codec.encode("channel_message", {**msg, "traceparent": None})[:-1]
    assert codec.decode("channel_message", old) == {**msg, "traceparent": None}


def test_invalid_utf8() -> None:
    raw = zz(2) + b"\xff\xfe" + request_bytes()[2:]
    with pytest.raises(InvalidRecordError, match="undecodable"):
        codec.decode_request(raw)


@pytest.mark.parametrize("name", ["notification_id", "user_id", "template_id"])
def test_empty_required_text(name: str) -> None:
    with pytest.raises(InvalidRecordError) as err:
        codec.decode_request(raw_request(**{name: ""}))
    assert err.value.reason == f"{name} is missing or empty"


def test_empty_channels() -> None:
    with pytest.raises(InvalidRecordError) as err:
        codec.decode_request(raw_request(channels=[]))
    assert err.value.reason == "channels is missing or empty"
    with pytest.raises(InvalidRecordError, match="channels"):
        codec.decode_request(request_bytes(channels=[]))


@pytest.mark.parametrize(
    "fields",
    [
        {"channels": [3]},
        {"channels": [0, 7]},
        {"channels": [-1]},  # fastavro would read this as the last symbol, email
        {"channels": [-3]},
        {"priority": 3},
        {"priority": -1},
        {"category": 2},
        {"category": -1},
        {"dedup_key": zz(2) + s("x")},  # union index 2 of [null, string]
        {"dedup_key": zz(-1) + s("x")},  # -1 would pick the string branch
        {"ttl": zz(2) + zz(5)},
        {"ttl": zz(-1) + zz(5)},  # -1 would pick the long branch
    ],
    ids=repr,
)
def test_index_out_of_range(fields: dict[str, Any]) -> None:
    with pytest.raises(InvalidRecordError) as err:
        codec.decode_request(request_bytes(**fields))
    assert err.value.reason.startswith("undecodable NotificationRequest")


def test_in_range_indexes_decode() -> None:
    req = codec.decode_request(
        request_bytes(channels=[2, 0], priority=2, category=1, dedup_key=zz(1) + s("x"), ttl=zz(1) + zz(5))
    )
    assert req.channels == (Channel.EMAIL, Channel.PUSH)
    assert (req.priority, req.category, req.dedup_key, req.dedup_ttl_sec) == (
        Priority.LOW,
        Category.MARKETING,
        "x",
        5,
    )


def test_blocked_arrays_and_maps_decode() -> None:
    """Writers may split arrays and maps into blocks, with a negative count and a byte size."""
    params = zz(-1) + zz(4) + s("a") + s("1") + zz(1) + s("b") + s("2") + zz(0)
    channels = zz(-2) + zz(2) + zz(1) + zz(2) + zz(0)
    raw = s("n") + s("u") + s("t") + params + channels + zz(1) + zz(0) + zz(7) + zz(0) + zz(0)
    req = codec.decode_request(raw)
    assert req.params == {"a": "1", "b": "2"}
    assert req.channels == (Channel.SMS, Channel.EMAIL)


def test_duplicate_channels_collapse_in_order() -> None:
    req = codec.decode_request(raw_request(channels=["sms", "push", "sms", "push"]))
    assert req.channels == (Channel.SMS, Channel.PUSH)
    fields = dict(raw_request_fields(), channels=["email", "email"])
    assert codec.request_from_fields(fields).channels == (Channel.EMAIL,)


def raw_request_fields() -> dict[str, Any]:
    return {"notification_id": "n", "user_id": "u", "template_id": "t", "channels": ["push"], "event_time": 1}


def test_defaults_of_missing_optional_fields() -> None:
    req = codec.request_from_fields(raw_request_fields())
    assert req.priority is Priority.NORMAL and req.category is Category.TRANSACTIONAL
    assert req.params == {} and req.dedup_key is None and req.dedup_ttl_sec is None
    req = codec.request_from_fields(dict(raw_request_fields(), priority=None, category="", params=None))
    assert req.priority is Priority.NORMAL and req.category is Category.TRANSACTIONAL and req.params == {}
    plain = NotificationRequest("n", "u", "t", (Channel.PUSH,), 1)
    assert plain.priority is Priority.NORMAL and plain.category is Category.TRANSACTIONAL


@pytest.mark.parametrize("event_time", ["1700000000000", 1.5, 1e12, True, False, None, [1]])
def test_event_time_must_be_an_integer(event_time: Any) -> None:
    with pytest.raises(InvalidRecordError) as err:
        codec.request_from_fields(dict(raw_request_fields(), event_time=event_time))
    assert err.value.reason == "event_time is missing or not an integer (epoch milliseconds)"


def test_event_time_missing() -> None:
    fields = raw_request_fields()
    del fields["event_time"]
    with pytest.raises(InvalidRecordError, match="event_time"):
        codec.request_from_fields(fields)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"notification_id": None}, "notification_id is missing or empty"),
        ({"user_id": 7}, "user_id is missing or empty"),
        ({"channels": "push"}, "channels is missing or empty"),
        ({"channels": ["push", "fax"]}, "unknown enum value"),
        ({"priority": "urgent"}, "unknown enum value"),
        ({"category": "spam"}, "unknown enum value"),
        ({"params": {"a": 1}}, "params must map strings to strings"),
        ({"params": ["a"]}, "params must map strings to strings"),
        ({"dedup_key": 5}, "dedup_key must be a string or null"),
        ({"dedup_ttl_sec": "60"}, "dedup_ttl_sec must be an integer or null"),
        ({"dedup_ttl_sec": True}, "dedup_ttl_sec must be an integer or null"),
    ],
    ids=repr,
)
def test_request_from_fields_rejects(change: dict[str, Any], reason: str) -> None:
    with pytest.raises(InvalidRecordError) as err:
        codec.request_from_fields(dict(raw_request_fields(), **change))
    assert err.value.reason.startswith(reason)


def test_request_from_fields_accepts_json_like_fields() -> None:
    req = codec.request_from_fields(
        dict(raw_request_fields(), channels=("email",), priority="high", params={"a": "b"}, dedup_ttl_sec=0)
    )
    assert req.channels == (Channel.EMAIL,) and req.priority is Priority.HIGH and req.dedup_ttl_sec == 0


# -- the output records ----------------------------------------------------------------------------


def round_trip(stem: str, record: dict[str, Any]) -> Any:
    raw = codec.encode(stem, record)
    # what any other Avro reader makes of these bytes
    assert schemaless_reader(io.BytesIO(raw), codec.load_schema(stem), None) == record
    with pytest.raises(ValueError, match="trailing"):
        codec.decode(stem, raw + b"\x00")
    return codec.decode(stem, raw)


@PROPERTY
@given(REQUESTS, st.sampled_from(list(Channel)))
def test_channel_message_round_trip(req: NotificationRequest, channel: Channel) -> None:
    msg = dict(
        req.to_avro(), dedup_key=req.dedup_key or "derived", message_key=f"k:{channel}", channel=channel.value
    )
    assert round_trip("channel_message", msg) == msg


@PROPERTY
@given(NONEMPTY, NONEMPTY, NONEMPTY, LONG, LONG, st.integers(2, 2**31 - 1))
def test_duplicate_notice_round_trip(nid: str, key: str, orig: str, t0: int, t: int, occurrence: int) -> None:
    notice = {
        "notification_id": nid,
        "dedup_key": key,
        "original_notification_id": orig,
        "first_seen_event_time": t0,
        "event_time": t,
        "occurrence": occurrence,
    }
    assert round_trip("duplicate_notice", notice) == notice


@PROPERTY
@given(REQUESTS, LONG, TEXT)
def test_late_notice_round_trip(req: NotificationRequest, watermark: int, reason: str) -> None:
    notice = {"request": req.to_avro(), "watermark": watermark, "reason": reason}
    back = round_trip("late_notice", notice)
    assert back == notice
    assert codec.request_from_fields(back["request"]) == req


@PROPERTY
@given(st.binary(max_size=64), TEXT, TEXT, st.integers(0, 2**31 - 1), st.integers(0, 2**63 - 1))
def test_invalid_record_round_trip(raw: bytes, error: str, topic: str, partition: int, offset: int) -> None:
    record = {
        "raw": raw, "raw_length": len(raw), "raw_sha256": hashlib.sha256(raw).hexdigest(),
        "error": error, "topic": topic, "partition": partition, "offset": offset,
    }
    assert round_trip("invalid_record", record) == record


def test_output_records_reject_bad_enum_indexes_too() -> None:
    good = codec.encode(
        "duplicate_notice",
        {
            "notification_id": "n",
            "dedup_key": "k",
            "original_notification_id": "o",
            "first_seen_event_time": 1,
            "event_time": 2,
            "occurrence": 2,
        },
    )
    assert codec.decode("duplicate_notice", good)["occurrence"] == 2
    msg = dict(
        NotificationRequest("n", "u", "t", (Channel.PUSH,), 1).to_avro(),
        dedup_key="k",
        message_key="k:push",
        channel="push",
    )
    raw = codec.encode("channel_message", msg)
    assert raw[: len(s("k:push"))] == s("k:push") and raw[len(s("k:push"))] == 0  # channel index 0
    bad = raw[: len(s("k:push"))] + zz(-1) + raw[len(s("k:push")) + 1 :]
    with pytest.raises(ValueError, match="index -1 out of range"):
        codec.decode("channel_message", bad)


def test_encode_rejects_a_record_that_does_not_fit_the_schema() -> None:
    with pytest.raises(Exception):  # noqa: B017 - fastavro's own error types
        codec.encode("duplicate_notice", {"notification_id": "n"})


# -- the generated writer and checker -------------------------------------------------------------


def _values(schema: Any) -> st.SearchStrategy[Any]:
    """Values of an expanded schema, edges included (varints of every length, long text)."""
    kind, schema = codec._kind(schema)
    if kind == "record":
        return st.fixed_dictionaries({f["name"]: _values(f["type"]) for f in schema["fields"]})
    if kind == "union":
        return st.one_of([_values(branch) for branch in schema])
    if kind == "enum":
        return st.sampled_from(schema["symbols"])
    if kind == "array":
        return st.lists(_values(schema["items"]), max_size=3)
    if kind == "map":
        return st.dictionaries(st.text(max_size=70), _values(schema["values"]), max_size=3)
    if kind == "string":
        return st.text(max_size=70)
    if kind == "bytes":
        return st.binary(max_size=70)
    if kind == "int":
        return st.integers(-(2**31), 2**31 - 1) | st.sampled_from([0, 63, 64, -64, -65, 2**31 - 1, -(2**31)])
    if kind == "long":
        return LONG | st.sampled_from([0, 63, 64, -64, -65, 2**63 - 1, -(2**63)])
    assert kind == "null", kind
    return st.none()


def _fastavro_bytes(stem: str, record: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    codec.schemaless_writer(buf, codec.load_schema(stem), record)
    return buf.getvalue()


@pytest.mark.parametrize("stem", sorted(codec.SCHEMA_FILES))
@given(data=st.data())
@PROPERTY
def test_the_generated_writer_writes_what_fastavro_writes_and_the_checker_skips_it(stem: str, data: Any) -> None:
    record = data.draw(_values(codec._expanded(stem)))
    raw = codec._writer(stem)(record)
    assert raw == _fastavro_bytes(stem, record)
    assert codec._check(stem)(memoryview(raw), 0) == len(raw)
    assert codec.decode(stem, raw) == schemaless_reader(io.BytesIO(raw), codec.load_schema(stem), None)


def test_a_missing_field_is_written_as_its_default() -> None:
    msg = {"message_key": "k:push", "channel": "push", "notification_id": "n", "user_id": "u", "template_id": "t",
           "channels": ["push"], "event_time": 5, "dedup_key": "k"}
    raw = codec._writer("channel_message")(msg)
    assert raw == _fastavro_bytes("channel_message", msg)
    assert codec.decode("channel_message", raw)["priority"] == "normal"


@pytest.mark.parametrize(
    "change",
    [
        {"template_version": True},  # a bool is no int to a union of fastavro's ...
        {"attempt": 2**31},  # ... nor one out of the int range
        {"attempt": 1.0},
        {"at": 2**63},
        {"channel": "fax"},
        {"message_key": b"bytes"},
        {"provider": 5},
    ],
    ids=repr,
)
def test_what_the_generated_writer_does_not_take_goes_to_fastavro(change: dict[str, Any]) -> None:
    record = {
        "message_key": "k", "notification_id": "n", "channel": "sms", "lane": "normal", "status": "sent",
        "attempt": 1, "provider": None, "error": None, "retry_at": None, "at": 7, "reason": None,
        "not_before": None, "template": None, "template_version": None, "locale": None, **change,
    }
    with pytest.raises(Exception):  # noqa: B017 - the generated writer's, then fastavro's own
        codec._writer("delivery_status")(record)
    try:
        expected: bytes | type[Exception] = _fastavro_bytes("delivery_status", record)
    except Exception as exc:  # noqa: BLE001
        expected = type(exc)
    if isinstance(expected, bytes):
        assert codec.encode("delivery_status", record) == expected
    else:
        with pytest.raises(expected):
            codec.encode("delivery_status", record)
