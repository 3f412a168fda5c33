"""No record can stop the job, no clock can silence it, no repeat after its window is lost.

On the real broker and mini-cluster: oversized and crafted records mixed into a valid stream go to
notifications.invalid with their reason while the valid output stays exact and the job never
restarts; a producer's clock a day ahead neither gets its request through nor makes anyone
else's late; a key accepted again after its window gets a message key of its own and is sent.
"""

from __future__ import annotations

import hashlib
import time

import pytest

from harness.reference import diff_records, expected_records, run
from operators import codec
from operators.contract import Topics
from operators.dedup_key import resolve_dedup_key
from operators.records import Channel, NotificationRequest, Priority
from operators.window import NO_WATERMARK, WindowConfig
from ops import kafka_io
from ops.flink_rest import RestClient
from senders.providers import FakeProvider
from senders.runtime.pool import build_pool, ensure_topics, open_status_store
from settings import Settings
from tests.jobs.helpers import produce, read_outputs, wait_for_total
from tests.senders.conftest import fast_senders, register_users, wait_until

pytestmark = pytest.mark.integration

BASE = 1_796_115_600_000


def req(nid: str, t: int, **kw: object) -> NotificationRequest:
    fields: dict[str, object] = {"user_id": f"u-{nid}", "template_id": "order_shipped", "params": {"o": nid},
                                 "channels": (Channel.PUSH,)}
    fields.update(kw)
    return NotificationRequest(notification_id=nid, event_time=t, **fields)  # type: ignore[arg-type]


def restarts(cfg: Settings, job_id: str) -> str:
    rest = RestClient(f"http://127.0.0.1:{cfg.flink.rest_port}")
    deadline = time.monotonic() + 30  # the REST metric fetcher refreshes every 10 s
    while time.monotonic() < deadline:
        got = rest.call("GET", f"/jobs/{job_id}/metrics?get=numRestarts")
        if got:
            return str(got[0]["value"])
        time.sleep(1)
    raise AssertionError("no numRestarts metric")


def produce_large(bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes, int]]) -> None:
    """One record at a time, with room for a 1 MB value (the broker's limit is 1 MB and a bit)."""
    prod = kafka_io.producer({"bootstrap.servers": bootstrap}, **{"message.max.bytes": "1040000"})
    for key, value, partition in records:
        kafka_io.produce_all(prod, topic, [(key, value)], partition)


def crafted() -> list[tuple[str, bytes, str]]:
    """(name, bytes, reason) of records no operator may fail on, each with the reason it gets."""
    t = BASE + 5_000
    limit = "is over the limit of 65536 bytes (dedup.max_record_bytes)"
    out = []
    out.append(("600,000-character dedup_key", codec.encode_request(req("big-key", t, dedup_key="k" * 600_000)), ""))
    out.append(("900 KB params map", codec.encode_request(
        req("big-params", t, params={f"p{i}": "v" * 9_000 for i in range(100)})), ""))
    padded = codec.encode_request(req("one-mb", t, params={"pad": ""}))
    pad = 1_000_000 - len(padded) - 2  # the length prefix of the pad grows by 2 bytes
    one_mb = codec.encode_request(req("one-mb", t, params={"pad": "x" * pad}))
    assert len(one_mb) == 1_000_000
    out.append(("1 MB record", one_mb, ""))
    out.append(("1 MB varint", b"\x80" * 999_999 + b"\x00", ""))
    out = [(name, raw, f"record of {len(raw)} bytes {limit}") for name, raw, _ in out]
    # within the record limit, beyond one of the others
    out.append(("dedup_key over 512 bytes", codec.encode_request(req("k513", t, dedup_key="é" * 257)),
                "dedup_key of 514 bytes is over the limit of 512 bytes (dedup.max_field_bytes)"))
    out.append(("65 params", codec.encode_request(req("p65", t, params={f"p{i}": "v" for i in range(65)})),
                "params has 65 entries, more than the limit of 64 (dedup.max_params)"))
    out.append(("a 5 KB param", codec.encode_request(req("p5k", t, params={"code": "9" * 5_000})),
                "a params entry of 5000 bytes is over the limit of 4096 bytes (dedup.max_param_bytes)"))
    varint = b"\x80" * 80_000
    out.append(("80 KB varint", varint, f"record of {len(varint)} bytes {limit}"))
    short = b"\x80" * 40_000 + b"\x00"
    out.append(("40 KB varint", short, "undecodable NotificationRequest: varint longer than 10 bytes in field"
                                       " notification_id at byte 10"))
    return out


def test_oversized_and_crafted_records_go_to_invalid_and_the_job_never_restarts(
    kafka_bootstrap, topic_factory, settings_factory, job_factory
):
    topics = topic_factory(partitions=2)
    cfg = settings_factory(topics, parallelism=2)
    job = job_factory(cfg)
    valid = [req(f"n-{i}", BASE + i * 100, params={"o": str(i % 40)}, user_id=f"u-{i % 40}") for i in range(200)]
    bad = crafted()
    stream: list[tuple[bytes | None, bytes, int]] = []
    expected_invalid = []
    offsets = [0, 0]
    for i, r in enumerate(valid):
        stream.append((r.user_id.encode(), codec.encode_request(r), 0))
        offsets[0] += 1
        if i % 20 == 10 and bad:
            name, raw, reason = bad.pop(0)
            stream.append((None, raw, 1))
            expected_invalid.append({
                "raw": raw[:4096], "raw_length": len(raw), "raw_sha256": hashlib.sha256(raw).hexdigest(),
                "error": reason, "topic": topics.requests, "partition": 1, "offset": offsets[1],
            })
            offsets[1] += 1
    assert not bad
    produce_large(kafka_bootstrap, topics.requests, stream)

    expected = expected_records(run([(r, NO_WATERMARK) for r in valid], WindowConfig()), topics)
    expected[topics.invalid] = expected_invalid
    wait_for_total(kafka_bootstrap, topics, sum(len(v) for v in expected.values()), timeout_s=240)
    time.sleep(3)
    out = {t: [v for _, v in recs] for t, recs in read_outputs(kafka_bootstrap, topics).items()}
    invalid = sorted(out[topics.invalid], key=lambda v: v["offset"])
    got_invalid = [(v["error"], v["raw_length"]) for v in invalid]
    assert got_invalid == [(v["error"], v["raw_length"]) for v in expected_invalid]
    assert diff_records(expected, out, topics) == []
    assert all(len(v["raw"]) <= 4096 for v in invalid)
    assert restarts(cfg, str(job.get_job_id())) == "0"


def test_a_request_from_a_clock_a_day_ahead_is_invalid_and_makes_no_one_late(
    kafka_bootstrap, topic_factory, settings_factory, job_factory
):
    topics = topic_factory(partitions=2)
    cfg = settings_factory(topics)
    job_factory(cfg)
    now = int(time.time() * 1000)
    future = req("future", now + 86_400_000, priority=Priority.HIGH, channels=(Channel.SMS,))
    first = [req(f"a{p}", now - 2_000, channels=(Channel.SMS,), priority=Priority.HIGH) for p in (0, 1)]
    produce(kafka_bootstrap, topics.requests, [(future.user_id.encode(), codec.encode_request(future), 0)])
    produce(kafka_bootstrap, topics.requests,
            [(r.user_id.encode(), codec.encode_request(r), p) for p, r in enumerate(first)])
    wait_for_total(kafka_bootstrap, topics, 3)
    time.sleep(8)  # partition 1 goes idle (5 s): only partition 0 holds the watermark now
    later = [req(f"b{i}", now - 1_000 + i, channels=(Channel.SMS,), priority=Priority.HIGH) for i in range(6)]
    produce(kafka_bootstrap, topics.requests, [(r.user_id.encode(), codec.encode_request(r), 0) for r in later])
    wait_for_total(kafka_bootstrap, topics, 9)
    time.sleep(3)
    out = read_outputs(kafka_bootstrap, topics)
    assert sorted(v["notification_id"] for _, v in out[topics.sms_priority]) == ["a0", "a1", *(f"b{i}" for i in range(6))]
    assert out[topics.late] == []
    [(_, invalid)] = out[topics.invalid]
    assert invalid["error"].startswith(f"event_time {future.event_time} is ")
    assert invalid["error"].endswith("ms ahead of the clock, more than the 300000 ms allowed (dedup.max_future_ms)")


def test_a_key_accepted_again_after_its_window_gets_a_new_message_key_and_both_are_sent(
    kafka_bootstrap, topic_factory, settings_factory, job_factory, tmp_path
):
    topics: Topics = topic_factory(partitions=1)
    cfg = settings_factory(topics)
    job_factory(cfg)
    first = req("otp-1", BASE, dedup_key="otp:u-1", dedup_ttl_sec=2, channels=(Channel.SMS,), user_id="u-1",
                params={"order": "A-1"})
    again = req("otp-2", BASE + 3_000, dedup_key="otp:u-1", dedup_ttl_sec=2, channels=(Channel.SMS,), user_id="u-1",
                params={"order": "A-1"})
    repeat = req("otp-3", BASE + 3_500, dedup_key="otp:u-1", dedup_ttl_sec=2, channels=(Channel.SMS,), user_id="u-1",
                params={"order": "A-1"})
    produce(kafka_bootstrap, topics.requests, [(b"u-1", codec.encode_request(r), 0) for r in (first, again, repeat)])
    wait_for_total(kafka_bootstrap, topics, 3)
    time.sleep(2)
    out = read_outputs(kafka_bootstrap, topics)
    keys = [v["message_key"] for _, v in out[topics.sms]]
    assert keys == [f"otp:u-1:sms:{BASE}", f"otp:u-1:sms:{BASE + 3_000}"]
    assert [v["original_notification_id"] for _, v in out[topics.duplicates]] == ["otp-2"]
    assert resolve_dedup_key(first) == "otp:u-1"

    senders = cfg.with_overrides(senders=fast_senders(
        tmp_path, status_topic=topics.requests.replace("requests", "status"),
        dlq_topic=topics.requests.replace("requests", "dlq"),
    ))
    ensure_topics(senders)
    register_users(senders, ["u-1"], [Channel.SMS])
    fake = FakeProvider(name="sms-gateway")
    pool = build_pool(senders, channels=[Channel.SMS], providers={Channel.SMS: (fake, None)})
    store = open_status_store(senders)
    try:
        with pool:
            wait_until(lambda: sorted(r.message_key for r in fake.received()) == keys, 60,
                       lambda: f"sent {fake.received()}, statuses {[store.get(k) for k in keys]}")
            wait_until(lambda: all((row := store.get(k)) is not None and row.status == "sent" for k in keys), 30,
                       "both sent in the store")
    finally:
        store.close()


BATCH_BYTES = 16 * 1024


def test_mini_batches_into_python_are_bounded_by_bytes(
    kafka_bootstrap, topic_factory, settings_factory, job_factory
):
    """dedup.batch_max_bytes: requests of about 3 KB with a 16 KB bound go into Python at most a
    few at a time (each batch is one record into the dedup operator), and the output is exact.
    One shard, so that batches are not split by shard as well."""
    topics = topic_factory(partitions=1)
    cfg = settings_factory(topics, dedup={"batch_max_bytes": BATCH_BYTES, "batch_max_delay_ms": 5_000,
                                          "idleness_ms": 5000, "shards": 1})
    job = job_factory(cfg)
    reqs = [req(f"n-{i}", BASE + i, params={"pad": "x" * 3_000, "i": str(i)}) for i in range(300)]
    produce(kafka_bootstrap, topics.requests, [(r.user_id.encode(), codec.encode_request(r), 0) for r in reqs])
    wait_for_total(kafka_bootstrap, topics, 300)
    out = read_outputs(kafka_bootstrap, topics)
    assert sorted(v["notification_id"] for _, v in out[topics.push]) == sorted(r.notification_id for r in reqs)
    rest = RestClient(f"http://127.0.0.1:{cfg.flink.rest_port}")
    job_id = str(job.get_job_id())
    vertex = next(v for v in rest.call("GET", f"/jobs/{job_id}")["vertices"] if "dedup" in v["name"])
    # 300 requests of ~3 KB under a 16 KB bound: at least 300 * 3 KB / 16 KB batches. The REST
    # API's metrics lag (fetched every 10 s) and only grow, so poll until they reach the bound.
    least = 300 * 3_000 / BATCH_BYTES
    deadline = time.monotonic() + 60
    batches = 0.0
    while time.monotonic() < deadline:
        got = rest.call("GET", f"/jobs/{job_id}/vertices/{vertex['id']}/subtasks/metrics?get=dedup.numRecordsIn&agg=sum")
        batches = float(got[0]["sum"]) if got else 0.0
        if batches >= least:
            break
        time.sleep(1)
    assert batches >= least
