"""Who may do what, on the real API with its store, the dedup job and the senders (issue 20: any
valid token could do anything to anyone; Idempotency-Key was one space for all callers).

The matrix: one caller per scope, holding only that scope, calls every route of the route table
(``api.scopes.ROUTE_SCOPES``, the one the gate enforces) with a request that is valid for it.
What each route needs is written here again, by hand (``EXPECTED``), so the test fails when
the table (or the gate) is wrong: the one scope expected passes (2xx), every other is 403
naming the expected scope, and no token at all is 401.

Then two callers sending the same Idempotency-Key get two notifications, both sent by the
senders through the real job, and neither can read the other's; two callers granted one
shared namespace get one (the job suppresses the second as a duplicate of the first).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import pytest

from api.database import open_api_store
from api.idempotency import complete_keys, reserve_key
from api.scopes import ROUTE_SCOPES, Scope, display_path
from api.store import RequestRecord
from api.tokens import revoke, token_id
from operators.records import Category, Channel
from senders.runtime.pool import open_status_store
from tests.api.conftest import ALL_SCOPES, Pipeline
from tests.senders.conftest import address_of, read_records, register_users, wait_until

pytestmark = pytest.mark.integration

#: what each route needs, written independently of api.scopes
EXPECTED: dict[tuple[str, str], str] = {
    ("POST", "/v1/notifications"): "send",
    ("GET", "/v1/notifications/{notification_id}"): "status:read",
    ("GET", "/v1/users/{user_id}/notifications"): "status:read",
    ("GET", "/v1/users/{user_id}"): "profiles:read",
    ("PUT", "/v1/users/{user_id}/preferences"): "profiles:write",
    ("PUT", "/v1/users/{user_id}/contacts"): "profiles:write",
    ("POST", "/v1/devices"): "profiles:write",
    ("DELETE", "/v1/users/{user_id}"): "profiles:erase",
    ("POST", "/v1/campaigns"): "campaigns",
    ("GET", "/v1/campaigns/{campaign_id}"): "campaigns",
    ("POST", "/v1/campaigns/{campaign_id}/pause"): "campaigns",
    ("POST", "/v1/campaigns/{campaign_id}/resume"): "campaigns",
    ("GET", "/v1/support/notifications/{notification_id}"): "support:read",
    ("GET", "/v1/support/users/{user_id}/notifications"): "support:read",
    ("GET", "/v1/support/campaigns/{campaign_id}"): "support:read",
    ("POST", "/v1/support/campaigns/{campaign_id}/pause"): "support:read",
    ("POST", "/v1/support/campaigns/{campaign_id}/resume"): "support:read",
    ("GET", "/v1/outbox"): "support:read",
}
SCOPE_NAMES = ["send", "profiles:read", "profiles:write", "profiles:erase", "status:read", "support:read", "campaigns"]


@dataclass
class Matrix:
    """What the routes' requests refer to, filled in as the allowed calls succeed."""

    p: Pipeline
    tokens: dict[str, str]
    ids: dict[str, str] = field(default_factory=dict)


def _request(m: Matrix, route: tuple[str, str], client: httpx.Client, n: int) -> httpx.Response:
    """A request to ``route`` that is valid for a caller that may call it (``n`` makes it new)."""
    method, path = route
    later = int(time.time() * 1000) + 86_400_000
    calls: dict[tuple[str, str], Callable[[], httpx.Response]] = {
        ("POST", "/v1/notifications"): lambda: client.post(
            "/v1/notifications", headers={"Idempotency-Key": f"matrix-{n}"},
            json={"user_id": "nusrat", "template": "order_shipped", "params": {"order": f"M-{n}"}}),
        ("GET", "/v1/notifications/{notification_id}"): lambda: client.get("/v1/notifications/status-evt"),
        ("GET", "/v1/users/{user_id}/notifications"): lambda: client.get("/v1/users/nusrat/notifications"),
        ("GET", "/v1/users/{user_id}"): lambda: client.get("/v1/users/nusrat"),
        ("PUT", "/v1/users/{user_id}/preferences"): lambda: client.put(
            "/v1/users/matrix-user/preferences", json={"tz": "Asia/Dhaka"}),
        ("PUT", "/v1/users/{user_id}/contacts"): lambda: client.put(
            "/v1/users/matrix-user/contacts", json={"sms": [{"address": "+8801711009999", "verified": True}]}),
        ("POST", "/v1/devices"): lambda: client.post(
            "/v1/devices", json={"user_id": "matrix-user", "token": "tok-matrix", "platform": "android"}),
        ("DELETE", "/v1/users/{user_id}"): lambda: client.delete("/v1/users/matrix-user"),
        ("POST", "/v1/campaigns"): lambda: client.post("/v1/campaigns", json={
            "template": "eid_sale", "segment": ["nusrat"], "params": {"pct": "10"}, "rate": 5, "send_at": later}),
        ("GET", "/v1/campaigns/{campaign_id}"): lambda: client.get(f"/v1/campaigns/{m.ids['campaign']}"),
        ("POST", "/v1/campaigns/{campaign_id}/pause"): lambda: client.post(f"/v1/campaigns/{m.ids['campaign']}/pause"),
        ("POST", "/v1/campaigns/{campaign_id}/resume"): lambda: client.post(
            f"/v1/campaigns/{m.ids['campaign']}/resume"),
        ("GET", "/v1/support/notifications/{notification_id}"): lambda: client.get(
            f"/v1/support/notifications/{m.ids['notification']}"),
        ("GET", "/v1/support/users/{user_id}/notifications"): lambda: client.get(
            "/v1/support/users/nusrat/notifications"),
        ("GET", "/v1/support/campaigns/{campaign_id}"): lambda: client.get(f"/v1/support/campaigns/{m.ids['campaign']}"),
        ("POST", "/v1/support/campaigns/{campaign_id}/pause"): lambda: client.post(
            f"/v1/support/campaigns/{m.ids['campaign']}/pause"),
        ("POST", "/v1/support/campaigns/{campaign_id}/resume"): lambda: client.post(
            f"/v1/support/campaigns/{m.ids['campaign']}/resume"),
        ("GET", "/v1/outbox"): lambda: client.get("/v1/outbox"),
    }
    return calls[(method, path)]()


def _own_notification(p: Pipeline, caller: str) -> None:
    """A notification of ``caller`` (which may only read statuses) in the store, as the API
    records the ones it wrote: its Idempotency-Key ``status-evt``."""
    db = open_api_store(p.cfg)
    try:
        now = int(time.time() * 1000)
        key = f"{caller}/status-evt"
        reserve_key(db, key, "fp", "n_matrix_status", "nusrat", now, 60_000, 10_000)
        complete_keys(db, [(key, {"id": "n_matrix_status"}, RequestRecord(
            "n_matrix_status", key, "nusrat", "order_shipped", ("sms",), "normal", caller, now, now, 0, 0))])
    finally:
        db.close()


def test_every_route_admits_exactly_its_scope(pipeline: Pipeline) -> None:
    p = pipeline
    table = {(m, display_path(path)): scope.value for (m, path), scope in ROUTE_SCOPES.items()}
    assert table == EXPECTED  # the gate's table says what this test expects (and lists every /v1 route)
    served = {(m.upper(), path) for path, item in p.api.client(None).get("/openapi.json").json()["paths"].items()
              for m in item if path.startswith("/v1/")}
    assert served == set(EXPECTED)
    tokens = {
        s: p.api.token(f"only-{s.replace(':', '-')}", scopes=(Scope(s),),
                       categories=(Category.TRANSACTIONAL, Category.MARKETING), rate=100)
        for s in SCOPE_NAMES
    }
    m = Matrix(p, tokens)
    _own_notification(p, "only-status-read")
    outcomes: dict[tuple[str, str], dict[str, int]] = {}
    for n, route in enumerate(ROUTE_SCOPES):
        shown = (route[0], display_path(route[1]))
        wanted = EXPECTED[shown]
        seen: dict[str, int] = {}
        for scope in [s for s in SCOPE_NAMES if s != wanted] + [wanted]:  # the refused ones first
            with p.client(tokens[scope]) as client:
                reply = _request(m, shown, client, n)
            seen[scope] = reply.status_code
            if scope != wanted:
                assert reply.status_code == 403, (shown, scope, reply.text)
                assert reply.json()["error"] == "forbidden" and reply.json()["scope"] == wanted, reply.text
            else:
                assert 200 <= reply.status_code < 300, (shown, scope, reply.text)
                if shown == ("POST", "/v1/notifications"):
                    m.ids["notification"] = reply.json()["id"]
                if shown == ("POST", "/v1/campaigns"):
                    m.ids["campaign"] = reply.json()["campaign_id"]
        with p.api.client(None) as anonymous:
            assert _request(m, shown, anonymous, n).status_code == 401
        outcomes[shown] = seen
    assert {r: [s for s, code in seen.items() if code < 300] for r, seen in outcomes.items()} == {
        r: [s] for r, s in EXPECTED.items()}
    # what is open stays open, without a token
    with p.api.client(None) as c:
        assert [c.get(path).status_code for path in ("/healthz", "/readyz", "/openapi.json", "/support")] == [
            200, 200, 200, 200]
        assert c.post(f"/webhooks/{p.provider}", json={"message_id": "x", "status": "delivered"}).status_code == 401


def test_a_caller_cannot_read_or_change_another_callers_notifications_and_campaigns(pipeline: Pipeline) -> None:
    p = pipeline
    mine = p.api.token("reader-a", scopes=(Scope.SEND, Scope.STATUS_READ, Scope.CAMPAIGNS),
                       categories=(Category.TRANSACTIONAL, Category.MARKETING), rate=50)
    theirs = p.api.token("reader-b", scopes=(Scope.SEND, Scope.STATUS_READ, Scope.CAMPAIGNS),
                         categories=(Category.TRANSACTIONAL, Category.MARKETING), rate=50)
    body = {"user_id": "bruno", "template": "order_shipped", "params": {"order": "R-1"}}
    nid = p.client(mine).post("/v1/notifications", json=body, headers={"Idempotency-Key": "private-1"}).json()["id"]
    later = int(time.time() * 1000) + 86_400_000
    cid = p.client(mine).post("/v1/campaigns", json={"template": "eid_sale", "segment": ["bruno"], "rate": 5,
                                                     "params": {"pct": "5"}, "send_at": later}).json()["campaign_id"]
    with p.client(theirs) as c:
        for path in (f"/v1/notifications/{nid}", "/v1/notifications/private-1", "/v1/notifications/reader-a/private-1",
                     f"/v1/campaigns/{cid}"):
            assert c.get(path).status_code == 404, path  # as if it did not exist
        assert c.post(f"/v1/campaigns/{cid}/pause").status_code == 404
        assert [n["id"] for n in c.get("/v1/users/bruno/notifications").json()["notifications"]] == []
    with p.client(mine) as c:
        assert c.get("/v1/notifications/private-1").json()["id"] == nid
        assert nid in [n["id"] for n in c.get("/v1/users/bruno/notifications").json()["notifications"]]
        assert c.get(f"/v1/campaigns/{cid}").json()["state"] == "scheduled"
    assert p.client(p.support).get(f"/v1/support/notifications/{nid}").json()["id"] == nid


def test_two_callers_with_one_idempotency_key_get_two_notifications_both_sent(pipeline: Pipeline) -> None:
    p = pipeline
    register_users(p.cfg, ["two-callers"], [Channel.SMS])
    a = p.api.token("orders-a")
    b = p.api.token("orders-b")
    body = {"user_id": "two-callers", "template": "order_shipped", "params": {"order": "ORD-1001"}, "channels": ["sms"]}
    first = p.client(a).post("/v1/notifications", json=body, headers={"Idempotency-Key": "order-1001"})
    second = p.client(b).post("/v1/notifications", json=body, headers={"Idempotency-Key": "order-1001"})
    assert (first.status_code, second.status_code) == (202, 202), (first.text, second.text)
    ids = first.json()["id"], second.json()["id"]
    assert ids[0] != ids[1]
    assert (first.json()["dedup_key"], second.json()["dedup_key"]) == ("orders-a/order-1001", "orders-b/order-1001")
    for token, nid in zip((a, b), ids, strict=True):
        wait_until(lambda t=token, n=nid: p.status(n, token=t)["channels"]["sms"]["status"] == "sent", 90,
                   lambda t=token, n=nid: str(p.status(n, token=t)))
        assert p.status("order-1001", token=token)["id"] == nid  # each caller's key finds its own
    calls = [c for c in p.fake.to(address_of("two-callers", Channel.SMS)) if "ORD-1001" in c.body["text"]]
    assert len(calls) == 2  # both sent: neither was taken for a repeat of the other
    messages = read_records(p.bootstrap, p.cfg.topics.sms, "channel_message")
    assert sorted(m["notification_id"] for m in messages if m["dedup_key"].endswith("/order-1001")) == sorted(ids)


def test_callers_sharing_a_namespace_are_deduplicated_by_the_job(pipeline: Pipeline) -> None:
    p = pipeline
    register_users(p.cfg, ["shared-ns"], [Channel.SMS])
    a = p.api.token("billing", namespaces=("payments",))
    b = p.api.token("ledger", namespaces=("payments",))
    outsider = p.api.token("outsider")
    body = {"user_id": "shared-ns", "template": "payment_update", "params": {"amount": "BDT 500"},
            "channels": ["sms"]}
    shared = {"Idempotency-Key": "pay-77", "Dedup-Namespace": "payments"}
    refused = p.client(outsider).post("/v1/notifications", json=body, headers=shared)
    assert (refused.status_code, refused.json()["error"]) == (403, "forbidden")
    bad = p.client(a).post("/v1/notifications", json=body, headers={**shared, "Dedup-Namespace": "Pay/ments"})
    assert (bad.status_code, bad.json()["error"]) == (400, "invalid_namespace")
    first = p.client(a).post("/v1/notifications", json=body, headers=shared)
    second = p.client(b).post("/v1/notifications", json=body, headers=shared)
    assert (first.status_code, second.status_code) == (202, 202)
    assert first.json()["dedup_key"] == second.json()["dedup_key"] == "ns:payments/pay-77"
    again = p.client(a).post("/v1/notifications", json=body, headers=shared)  # each one's key stays its own
    assert (again.status_code, again.json()) == (200, first.json())
    nid_a, nid_b = first.json()["id"], second.json()["id"]
    wait_until(lambda: p.verdict(nid_b, token=b) == "duplicate", 90, lambda: str(p.status(nid_b, token=b)))
    assert p.status(nid_b, token=b)["duplicate_of"] == nid_a
    wait_until(lambda: p.status(nid_a, token=a)["channels"]["sms"]["status"] == "sent", 90,
               lambda: str(p.status(nid_a, token=a)))
    assert p.status("pay-77", token=b)["id"] == nid_b  # b's key, in its namespace, finds b's request
    assert len(p.fake.to(address_of("shared-ns", Channel.SMS))) == 1


def test_a_revoked_token_is_refused_within_the_cache_time_and_an_expired_one_at_once(pipeline: Pipeline) -> None:
    p = pipeline
    ttl_s = p.cfg.api.token_cache_ttl_ms / 1000
    assert ttl_s <= 5
    token = p.api.token("to-revoke", scopes=ALL_SCOPES)
    assert p.client(token).get("/v1/users/nusrat").status_code == 200  # now cached
    store = open_status_store(p.cfg)
    try:
        assert revoke(store.db, token_id=token_id(token)) == 1
    finally:
        store.close()
    revoked_at = time.monotonic()
    wait_until(lambda: p.client(token).get("/v1/users/nusrat").status_code == 401, ttl_s + 2, "revoked token refused")
    assert time.monotonic() - revoked_at <= ttl_s + 1.0
    expiring = p.api.token("to-expire", scopes=(Scope.PROFILES_READ,), expires_ms=int(time.time() * 1000) + 1500)
    assert p.client(expiring).get("/v1/users/nusrat").status_code == 200  # cached for ttl_s, expires before that
    wait_until(lambda: p.client(expiring).get("/v1/users/nusrat").status_code == 401, 3.0, "expired token refused")
