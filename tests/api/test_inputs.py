"""Every input error is a 4xx, and the smaller defects of issue 20, on the running API: each of
these answered 500, was accepted, or was missing on the code before the change."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from api.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, sign
from operators.records import Category
from tests.api.conftest import ALL_SCOPES, WEBHOOK_SECRET, RunningApi, api_settings, signed
from tests.senders.conftest import read_records, register_users

pytestmark = pytest.mark.integration

BODY = {"user_id": "input-user", "template": "order_shipped", "params": {"order": "I-1"}, "channels": ["sms"]}


@pytest.fixture(scope="module")
def api(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningApi]:
    root: Path = tmp_path_factory.mktemp("inputs")
    cfg = api_settings(kafka_bootstrap, root, api={"calls_rate_per_sec": 20.0})
    register_users(cfg, ["input-user"])
    running = RunningApi(cfg, root).start()
    yield running
    running.stop()


def test_a_webhook_timestamp_that_is_a_digit_but_not_ascii_is_401(api: RunningApi) -> None:
    raw = json.dumps({"message_id": "m", "status": "delivered"}).encode()
    # header bytes reach the app decoded as latin-1: b"\xb2" is "²", whose str.isdigit() is true
    # and int() raises; others arrive as UTF-8 bytes
    for stamp in ("²".encode("latin-1"), "¹²³".encode("latin-1"), "１２３".encode(), "٣".encode()):
        headers = {TIMESTAMP_HEADER: stamp, SIGNATURE_HEADER: sign(WEBHOOK_SECRET.encode(), 1, raw).encode(),
                   "Content-Type": b"application/json"}
        reply = api.client(None).post("/webhooks/127.0.0.1", content=raw, headers=headers)
        assert (reply.status_code, reply.json()["error"]) == (401, "unauthorized"), (stamp, reply.text)


def test_a_signed_webhook_body_nested_32000_deep_is_400(api: RunningApi) -> None:
    deep = b'{"message_id": ' + b"[" * 32_000 + b"]" * 32_000 + b"}"
    ts = int(time.time())
    headers = {TIMESTAMP_HEADER: str(ts), SIGNATURE_HEADER: sign(WEBHOOK_SECRET.encode(), ts, deep),
               "Content-Type": "application/json"}
    reply = api.client(None).post("/webhooks/127.0.0.1", content=deep, headers=headers)
    assert (reply.status_code, reply.json()["error"]) == (400, "invalid_receipt"), reply.text
    raw, headers = signed({"message_id": "m", "status": "delivered"})
    assert api.client(None).post("/webhooks/127.0.0.1", content=raw, headers=headers).status_code == 404  # alive


def test_numbers_and_text_past_what_a_record_can_hold_are_400(api: RunningApi) -> None:
    token = api.token("numbers")
    with api.client(token) as c:
        for change, code in (({"dedup_ttl_sec": 2**70}, "invalid_request"), ({"dedup_ttl_sec": 2**63}, "invalid_request"),
                             ({"event_time": 2**70}, "invalid_request")):
            reply = c.post("/v1/notifications", json={**BODY, **change}, headers={"Idempotency-Key": "n-1"})
            assert (reply.status_code, reply.json()["error"]) == (400, code), (change, reply.text)
        surrogate = b'{"user_id": "input-user", "template": "order_shipped", "params": {"order": "\\ud800"}}'
        reply = c.post("/v1/notifications", content=surrogate, headers={"Idempotency-Key": "n-2",
                                                                        "Content-Type": "application/json"})
        assert reply.status_code == 400, reply.text
        ok = c.post("/v1/notifications", json={**BODY, "dedup_ttl_sec": 2**63 - 1}, headers={"Idempotency-Key": "n-3"})
        assert ok.status_code == 202, ok.text  # the largest Avro long is taken (the job clamps it)


def test_an_idempotency_key_is_utf8_stored_as_sent_and_anything_else_is_400(api: RunningApi) -> None:
    token = api.token("utf8")
    with api.client(token) as c:
        bad = c.post("/v1/notifications", json=BODY, headers={"Idempotency-Key": b"ord-\xff\xfe"})
        assert (bad.status_code, bad.json()["error"]) == (400, "invalid_idempotency_key"), bad.text
        key = "заказ-১০০১"
        reply = c.post("/v1/notifications", json=BODY, headers={"Idempotency-Key": key.encode("utf-8")})
        assert reply.status_code == 202, reply.text
        assert reply.json()["dedup_key"] == f"utf8/{key}"
        assert c.get(f"/v1/notifications/{quote(key)}").json()["id"] == reply.json()["id"]
        again = c.post("/v1/notifications", json=BODY, headers={"Idempotency-Key": key.encode("utf-8")})
        assert (again.status_code, again.json()) == (200, reply.json())
    [record] = [r for r in read_records(api.cfg.kafka.bootstrap_servers, api.cfg.topics.requests,
                                        "notification_request") if r["notification_id"] == reply.json()["id"]]
    assert record["dedup_key"] == f"utf8/{key}"


def test_a_dedup_key_with_slashes_can_be_looked_up(api: RunningApi) -> None:
    token = api.token("slashes")
    with api.client(token) as c:
        reply = c.post("/v1/notifications", json=BODY, headers={"Idempotency-Key": "orders/2026/1001"})
        assert reply.status_code == 202, reply.text
        nid = reply.json()["id"]
        for path in ("/v1/notifications/orders/2026/1001", "/v1/notifications/orders%2F2026%2F1001",
                     "/v1/notifications/slashes/orders/2026/1001"):
            found = c.get(path)
            assert found.status_code == 200 and found.json()["id"] == nid, (path, found.text)
    support = api.token("slash-support", scopes=ALL_SCOPES)
    assert api.client(support).get("/v1/support/notifications/slashes/orders/2026/1001").json()["id"] == nid


@pytest.mark.parametrize("user", ["a\x00b", " padded", "padded ", "tab\there", "x" * 513, "é" * 257])
def test_one_user_id_rule_on_every_route(api: RunningApi, user: str) -> None:
    token = api.token(f"ids-{abs(hash(user)) % 10**8}", scopes=ALL_SCOPES,
                      categories=(Category.TRANSACTIONAL, Category.MARKETING))
    path = quote(user, safe="")
    with api.client(token) as c:
        replies = {
            "preferences": c.put(f"/v1/users/{path}/preferences", json={"tz": "UTC"}),
            "contacts": c.put(f"/v1/users/{path}/contacts", json={"sms": ["+8801711000001"]}),
            "get": c.get(f"/v1/users/{path}"),
            "erase": c.delete(f"/v1/users/{path}"),
            "list": c.get(f"/v1/users/{path}/notifications"),
            "devices": c.post("/v1/devices", json={"user_id": user, "token": "tok-1", "platform": "ios"}),
            "send": c.post("/v1/notifications", json={**BODY, "user_id": user}, headers={"Idempotency-Key": "u-1"}),
            "campaign": c.post("/v1/campaigns", json={"template": "eid_sale", "segment": [user], "params": {"pct": "1"},
                                                      "rate": 1}),
        }
    for route, reply in replies.items():
        assert reply.status_code == 400, (route, reply.status_code, reply.text)
        assert reply.json()["error"] in ("invalid_user_id", "invalid_segment", "invalid_request"), (route, reply.text)


def test_a_device_of_5000_characters_of_user_id_is_refused(api: RunningApi) -> None:
    token = api.token("devices", scopes=ALL_SCOPES)
    reply = api.client(token).post("/v1/devices", json={"user_id": "u" * 5000, "token": "tok-1", "platform": "ios"})
    assert (reply.status_code, reply.json()["error"]) == (400, "invalid_user_id")


@pytest.mark.parametrize("zone", ["localtime", "Factory", "posixrules", "EST5EDT", "CST6CDT", "Etc/GMT+6"])
def test_time_zones_that_are_no_place_are_refused(api: RunningApi, zone: str) -> None:
    token = api.token(f"zones-{zone.replace('/', '-').replace('+', 'p').lower()}", scopes=ALL_SCOPES)
    with api.client(token) as c:
        for body in ({"tz": zone}, {"quiet_hours": {"from": "22:00", "to": "07:00", "tz": zone}}):
            reply = c.put("/v1/users/input-user/preferences", json=body)
            assert reply.status_code == 400, (body, reply.text)
            assert "a time zone is UTC or an IANA Area/Location name" in reply.json()["message"], reply.text
        assert c.put("/v1/users/input-user/preferences", json={"tz": "America/Argentina/Salta"}).status_code == 200


def test_the_support_page_cannot_be_framed_and_answers_are_nosniff(api: RunningApi) -> None:
    with api.client(None) as c:
        page = c.get("/support")
        csp = page.headers["Content-Security-Policy"]
        assert "frame-ancestors 'none'" in csp and "default-src 'self'" in csp
        assert page.headers["X-Frame-Options"] == "DENY"
        for reply in (page, c.get("/healthz"), c.get("/v1/users/x"), c.get("/nowhere"), c.get("/openapi.json")):
            assert reply.headers["X-Content-Type-Options"] == "nosniff", reply.url


def test_every_v1_call_is_rate_limited_per_caller(api: RunningApi) -> None:
    token = api.token("busy", scopes=ALL_SCOPES)
    other = api.token("calm", scopes=ALL_SCOPES)
    with api.client(token) as c:
        replies = [c.get("/v1/users/input-user") for _ in range(60)]  # api.calls_rate_per_sec: 20
    codes = [r.status_code for r in replies]
    assert codes.count(200) >= 20 and 429 in codes, codes
    limited = next(r for r in replies if r.status_code == 429)
    assert int(limited.headers["Retry-After"]) >= 1 and limited.json()["error"] == "rate_limited"
    assert api.client(other).get("/v1/users/input-user").status_code == 200  # its own bucket
