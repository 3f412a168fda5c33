"""The design's own story end to end: requests through Kafka, the dedup job on the mini-cluster,
the channel topics, and the senders with their rules, through the real provider protocols (FCM,
Twilio, SendGrid) to local servers, as ``make demo`` tells it (harness/)."""

from __future__ import annotations

import base64
import json
import logging
import zoneinfo
from datetime import datetime, timedelta
from pathlib import Path
from urllib.parse import parse_qsl

import pytest

from harness import scenario
from harness.demo import produce_scenario, wait_for_counts
from harness.senders_demo import run_senders_demo
from operators.contract import Topics
from senders.statuses import DeliveryStatus
from settings import Settings
from tests.senders.conftest import read_records

pytestmark = pytest.mark.integration


def _next_eight(after_ms: int, zone: str) -> int:
    """08:00 in ``zone`` after an instant inside 22:00-08:00 (zoneinfo, not the code under test)."""
    local = datetime.fromtimestamp(after_ms / 1000, tz=zoneinfo.ZoneInfo(zone))
    day = local.date() + timedelta(days=1) if local.hour >= 22 else local.date()
    eight = datetime(day.year, day.month, day.day, 8, tzinfo=zoneinfo.ZoneInfo(zone))
    return int(eight.timestamp() * 1000)


def test_the_story_end_to_end(
    kafka_bootstrap: str, topic_factory: object, settings_factory: object, job_factory: object, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    topics: Topics = topic_factory(partitions=2)  # type: ignore[operator]
    cfg: Settings = settings_factory(topics)  # type: ignore[operator]
    cfg = cfg.with_overrides(
        kafka={"partitions": 2},
        senders={"status_topic": f"{topics.requests}.status", "dlq_topic": f"{topics.requests}.dlq"},
    )
    job_factory(cfg)  # type: ignore[operator]
    want = {getattr(cfg.topics, k): n for k, n in scenario.EXPECTED_COUNTS.items() if n}
    before = {getattr(cfg.topics, k): n for k, n in scenario.EXPECTED_BEFORE_BARRIER.items() if n}
    produce_scenario(cfg, lambda _: wait_for_counts(cfg, before, 180), lambda _: None)
    wait_for_counts(cfg, want, 120)

    lines: list[str] = []
    story = run_senders_demo(cfg, lines.append)

    # every channel message: its status and reason, in the store
    by_message = {(nid, ch): story.rows[key] for key, (nid, _, ch) in story.messages.items()}
    assert {k: (r.status.value, r.reason) for k, r in by_message.items()} == scenario.OUTCOMES
    for nid in ("n-1", "n-2"):
        assert (nid, "email") not in by_message
    for key in ("push", "email"):
        deferred = by_message[("n-3", key)]
        assert deferred.not_before_ms == _next_eight(deferred.updated_ms, story.zone)
        assert deferred.attempts == 1 and deferred.provider is None
        assert deferred.template is not None and (deferred.template.name, deferred.template.locale) == ("eid_sale", "bn")
    sms = by_message[("n-1", "sms")]
    assert (sms.attempts, sms.provider) == (3, "twilio")
    assert sms.template is not None and (sms.template.name, sms.template.version, sms.template.locale) == (
        "order_shipped", 2, "en"
    )

    # the local servers got exactly these calls, each through its provider's protocol, with the
    # rendered messages: the gateway's two 503s and then its message, the bad mailbox's 400
    world = story.world
    key_of = {(nid, ch): key for key, (nid, _, ch) in story.messages.items()}
    # Bruno's order update by push: one FCM send with one access token from the token endpoint
    [token_request] = world.fcm.token_requests()
    assert dict(parse_qsl(token_request.body.decode()))["grant_type"] == "urn:ietf:params:oauth:grant-type:jwt-bearer"
    [push] = world.fcm.sends()
    assert push.method == "POST" and push.path == f"/v1/projects/{world.fcm.project}/messages:send"
    assert push.headers["authorization"].removeprefix("Bearer ") in world.fcm.issued
    message = push.json()["message"]
    assert (message["token"], message["notification"], message["data"]) == (
        "tok-bruno-1", {"title": "Your order is on its way", "body": "Your order 1001 is on its way."},
        {"message_key": key_of[("n-1", "push")]},
    )
    assert by_message[("n-1", "push")].provider == "fcm"
    assert str(by_message[("n-1", "push")].provider_ref).startswith(f"projects/{world.fcm.project}/messages/0:")
    bruno = "+351912000002"
    twilio_basic = "Basic " + base64.b64encode(f"{world.twilio.account_sid}:{world.twilio.auth_token}".encode()).decode()
    tries = world.twilio.requests
    assert [(r.method, r.target, r.headers["authorization"]) for r in tries] == [
        ("POST", f"/2010-04-01/Accounts/{world.twilio.account_sid}/Messages.json", twilio_basic)] * 3
    assert [dict(parse_qsl(r.body.decode())) for r in tries] == [
        {"To": bruno, "From": "+15005550006", "Body": "Your order 1001 is on its way."}] * 3
    at = [r.at for r in tries]
    assert 0.95 <= at[1] - at[0] <= 2.5 and 1.95 <= at[2] - at[1] <= 3.5  # after 1 s, then 2 s
    [delivered] = world.twilio.sent  # the third: the first two were answered 503
    assert (delivered.to, sms.provider_ref) == (bruno, delivered.sid)
    mails = [json.loads(r.body) for r in world.sendgrid.requests]
    assert all(r.headers["authorization"] == f"Bearer {world.sendgrid.api_key}" for r in world.sendgrid.requests)
    assert sorted(
        (m["personalizations"][0]["custom_args"]["notify_message_key"], m["personalizations"][0]["to"][0]["email"],
         m["subject"]) for m in mails
    ) == sorted([
        (key_of[("n-5", "email")], "chen@mailbox.invalid", "Payment of 12.50 received"),
        (key_of[("n-6", "email")], "bruno@example.com", "Eid sale: 20% off"),
    ])
    [accepted] = world.sendgrid.sent  # Chen's was refused: not a valid address
    assert (accepted.to, by_message[("n-6", "email")].provider_ref) == ("bruno@example.com", accepted.message_id)
    assert "List-Unsubscribe" in accepted.headers  # a campaign: its one-click link

    # exactly one dead letter: the bad mailbox, at its first attempt; rule outcomes are statuses
    letters = read_records(kafka_bootstrap, cfg.senders.dlq_topic, "dead_letter")
    assert [(d["message_key"], d["reason_kind"], d["attempts"]) for d in letters] == [
        (key_of[("n-5", "email")], "permanent_failure", 1)
    ]
    statuses = read_records(kafka_bootstrap, cfg.senders.status_topic, "delivery_status")
    last = {s["message_key"]: s for s in statuses}
    for key, row in story.rows.items():
        s = last[key]
        assert (s["status"], s["reason"]) == (row.status.value, row.reason)
        assert s["not_before"] == (row.not_before_ms if row.status is DeliveryStatus.DEFERRED else None)
        assert s["template"] == (row.template.name if row.template else None)

    # what the demo prints: each rule by name, and no parameter or address
    text = "\n".join(lines)
    assert "n-1  u-bruno  push  attempt 1: sent via fcm [order_shipped v2 en]" in text
    assert "n-4  u-chen   push  attempt 1: skipped (no_address)" in text
    assert "n-4  u-chen   email attempt 1: skipped (opted_out)" in text
    assert "n-8  u-chen   sms   attempt 1: rejected (missing_parameter: pct)" in text
    assert "(quiet_hours) until 08:00" in text and story.zone in text
    # and which protocol each channel used: the providers its dispatcher was built with, and their calls
    assert story.protocols == [
        "  push  primary fcm-http-v1 (fcm), 1 call",
        "  sms   primary twilio-messages (twilio), 3 calls",
        "  email primary sendgrid-v3 (sendgrid), 2 calls",
    ]
    assert "The protocol each channel used" in text and all(line in lines for line in story.protocols)
    logged = "\n".join(r.getMessage() for r in caplog.records)
    keys = (world.twilio.auth_token, world.sendgrid.api_key, "PRIVATE KEY")
    for secret in ("1001", "12.50", "+351", "+880", "+86", "@example.com", "mailbox.invalid", "tok-amina", "tok-bruno", "% off", *keys):
        assert secret not in text and secret not in logged
