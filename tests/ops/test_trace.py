"""``dedupctl trace``: matching records to a notification id or dedup key, and the answer in words.

The pure matching runs without Kafka; the command itself runs against the real broker (the
topics filled as the job fills them) in the integration test at the end. The real job's own
output is traced in tests/ops/test_ops_job.py.
"""

from __future__ import annotations

import json
import uuid

import pytest

from dedupctl import cli
from operators.contract import Topics
from operators.dedup_key import key_group_of, shard_of
from ops import kafka_io
from ops.trace import Tracer, TraceResult, parse_since
from ops.trace_view import render
from tests.ops import trace_story as story
from tests.ops.helpers import prefixed_topics, write_config

TOPICS = Topics()
STATUS = "notifications.status"


def run(query: str, status_topic: str | None = STATUS) -> TraceResult:
    tracer = Tracer(query, TOPICS, status_topic, shards=128, max_parallelism=128)
    msgs = story.messages(TOPICS, status_topic)
    for m in msgs:
        if m.topic == TOPICS.requests:
            tracer.add_request(m)
    for m in msgs:
        if m.topic != TOPICS.requests:
            tracer.add_output(m)
    return tracer.result


def test_accepted_with_its_channel_messages_and_delivery_status():
    r = run("n-1")
    n1 = r.notifications["n-1"]
    assert n1.verdict == "accepted"
    assert n1.dedup_key == story.KEY1
    got = [(m["channel"], m["kafka"]["topic"], m["message_key"], m["kafka"]["key"]) for m in n1.accepted]
    assert got == [
        ("push", TOPICS.push, f"{story.KEY1}:push:{story.N1.event_time}", "u-1"),
        ("sms", TOPICS.sms, f"{story.KEY1}:sms:{story.N1.event_time}", "u-1"),
    ]
    assert n1.request_at is not None and (n1.request_at.topic, n1.request_at.offset) == (TOPICS.requests, 0)
    assert [s["status"] for s in n1.statuses] == ["queued", "sending", "sent", "deferred"]
    assert n1.channels["sms"] == {
        "message_key": f"{story.KEY1}:sms:{story.N1.event_time}", "status": "deferred", "reason": "quiet_hours",
        "not_before": story.BASE + 3_600_000, "attempts": 1, "provider": None, "template": "order_shipped",
        "template_version": 2, "locale": "bn", "at": story.BASE + 300,
    }
    assert (n1.channels["push"]["status"], n1.channels["push"]["provider"], n1.channels["push"]["not_before"]) == (
        "sent", "fake", None
    )
    assert r.to_dict()["notifications"]["n-1"]["channels"] == n1.channels
    # the repeat of n-1 shares its dedup key, so it is reported too
    assert r.notifications["n-2"].verdict == "duplicate"
    assert set(r.notifications) == {"n-1", "n-2"}


def test_duplicate_names_its_original():
    r = run("n-2")
    n2 = r.notifications["n-2"]
    assert n2.verdict == "duplicate"
    assert (n2.duplicate["original_notification_id"], n2.duplicate["occurrence"]) == ("n-1", 2)
    assert n2.duplicate["kafka"]["topic"] == TOPICS.duplicates
    text = render(r)
    assert "n-2  DUPLICATE of n-1 (occurrence 2, original event time 2026-12-01T09:00:00.000Z)" in text
    assert "n-1  ACCEPTED  (same dedup key)" in text
    # where the job keeps the key's state (shard_of and key_group_of are checked against the JVM
    # and Flink's own assignment in tests/vectors.json)
    shard = shard_of(story.KEY1, 128)
    assert f"    dedup key {story.KEY1}  (state: shard {shard}, key group {key_group_of(shard, 128)})" in text
    assert r.to_dict()["notifications"]["n-2"]["state"] == {"shard": shard, "key_group": key_group_of(shard, 128)}


def test_late_with_the_watermark():
    r = run("n-3")
    n3 = r.notifications["n-3"]
    assert n3.verdict == "late" and n3.late["watermark"] == story.WATERMARK
    assert set(r.notifications) == {"n-3"}
    assert "n-3  LATE: event time behind the watermark 2026-12-01T09:08:59.999Z by 8m59s" in render(r)


def test_invalid_when_the_raw_bytes_mention_the_id():
    r = run("n-4")
    assert r.notifications == {}
    [inv] = r.invalid
    assert inv["error"] == "user_id is missing or empty"
    assert inv["source"] == f"{TOPICS.requests}[0]@6"
    assert f"INVALID  {TOPICS.invalid}[0]@0: user_id is missing or empty" in render(r)


def test_request_without_an_outcome_yet():
    r = run("n-5")
    assert r.notifications["n-5"].verdict == "pending"
    assert "n-5  NO OUTCOME YET" in render(r)


def test_by_dedup_key_lists_every_notification_with_it():
    r = run("campaign:carol")
    assert {n: t.verdict for n, t in r.notifications.items()} == {"n-6": "accepted", "n-7": "duplicate"}
    [msg] = r.notifications["n-6"].accepted
    assert (msg["kafka"]["topic"], msg["priority"]) == (TOPICS.email_priority, "high")
    assert r.notifications["n-7"].duplicate["original_notification_id"] == "n-6"


def test_nothing_found_and_params_never_shown():
    r = run("n-404")
    assert not r.found
    assert render(r).startswith("trace n-404: no record in")
    for q in ("n-1", "n-2", "n-3", "n-4", "campaign:carol"):  # n-4: an invalid record's raw bytes
        dump = json.dumps(run(q).to_dict()) + render(run(q))
        assert "9931" not in dump and "params" not in dump  # one-time codes stay out


def test_without_a_status_topic():
    r = run("n-1", status_topic=None)
    assert r.notifications["n-1"].statuses == []
    assert "no senders' status topic" in render(r)


def test_parse_since():
    now = 1_796_115_600_000
    assert parse_since("30m", now) == now - 30 * 60_000
    assert parse_since("2h", now) == now - 7_200_000
    assert parse_since("1.5d", now) == now - 129_600_000
    assert parse_since("1796115600000") == now
    assert parse_since("2026-12-01T09:00:00Z") == now
    assert parse_since("2026-12-01T10:00:00+01:00") == now


@pytest.mark.integration
def test_trace_command_on_the_topics(kafka_bootstrap, tmp_path, capsys):
    """The command end to end: read_committed scans of real topics, the status topic included."""
    from settings import Settings

    topics = prefixed_topics(f"t{uuid.uuid4().hex[:8]}.")
    status_topic = f"{topics.requests}.status"
    kafka_io.create_topics({"bootstrap.servers": kafka_bootstrap}, [*topics.all(), status_topic], 2)
    prod = kafka_io.producer({"bootstrap.servers": kafka_bootstrap})
    for rec in story.records(topics, status_topic):
        kafka_io.produce_all(prod, rec.topic, [(rec.key, rec.value)], 0)
    cfg = Settings(topics=topics).with_overrides(kafka={"bootstrap_servers": kafka_bootstrap})
    config = write_config(cfg, tmp_path / "cfg.toml", status_topic=status_topic)

    assert cli.main(["--config", str(config), "trace", "n-2"]) == 0
    text = capsys.readouterr().out
    assert "n-2  DUPLICATE of n-1" in text
    assert f"    push      {topics.push}[0]@0  message key {story.KEY1}:push:{story.N1.event_time}  Kafka key u-1" in text
    status = f"    status    {story.KEY1}:push:{story.N1.event_time}  sent  attempt 1  provider fake  at 2026-12-01T09:00:00.900Z"
    assert status in text

    assert cli.main(["--config", str(config), "trace", "--json", "n-3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["notifications"]["n-3"]["verdict"] == "late"
    assert out["notifications"]["n-3"]["late"]["watermark"] == story.WATERMARK
    assert out["status_topic"] == status_topic
    shard = shard_of(out["notifications"]["n-3"]["dedup_key"], cfg.dedup.shards)
    assert out["notifications"]["n-3"]["state"] == {
        "shard": shard, "key_group": key_group_of(shard, cfg.flink.max_parallelism)
    }

    assert cli.main(["--config", str(config), "trace", "n-4"]) == 0
    assert "INVALID" in capsys.readouterr().out

    assert cli.main(["--config", str(config), "trace", "n-404"]) == 1
    assert "no record in" in capsys.readouterr().out

    other = write_config(cfg.with_overrides(topics={"requests": "no.such.topic"}), tmp_path / "other.toml")
    assert cli.main(["--config", str(other), "trace", "n-1"]) == 2
    assert "no topic no.such.topic on" in capsys.readouterr().err

    # --since after every record: nothing read, nothing found
    assert cli.main(["--config", str(config), "trace", "--since", "2999-01-01T00:00:00Z", "n-1"]) == 1
    capsys.readouterr()


def test_a_record_that_cannot_be_read_is_skipped():
    tracer = Tracer("n-1", TOPICS, STATUS)
    for topic in (TOPICS.push, TOPICS.duplicates, TOPICS.late, TOPICS.invalid, STATUS):
        tracer.add_output(kafka_io.Message(topic, 0, 9, None, b"\x02\x00 not Avro n-1", 0))
    assert not tracer.result.found
