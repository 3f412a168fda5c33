"""The API in front of the real pipeline: its own process (``dedupctl api run``), the session's
broker, the dedup job on the mini-cluster and the sender workers with an HTTP provider (a local
fake: the one thing outside the machine). One of each for the whole module.

The job runs with ``dedup.max_field_bytes = 100`` while the API checks 512: a request the API
takes with a 200-byte key is then invalid downstream, so ``GET`` can be seen to say so.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import httpx
import pytest

from api.scopes import Scope
from harness.local_jaeger import render_trace
from operators import codec
from operators.records import Category, Channel, NotificationRequest
from ops import kafka_io
from tests.api.conftest import PIPELINE_USERS, Pipeline, RunningApi, signed
from tests.senders.conftest import address_of, read_records, wait_until

pytestmark = pytest.mark.integration


def post(p: Pipeline, key: str | None, body: dict, token: str | None = None) -> httpx.Response:  # type: ignore[type-arg]
    headers = {"Idempotency-Key": key} if key is not None else {}
    return p.client(token).post("/v1/notifications", json=body, headers=headers)


SHIPPED = {"user_id": "nusrat", "template": "order_shipped", "params": {"order": "BD-7790"}, "channels": ["sms"]}


def test_a_request_comes_out_on_its_channel_topic_is_sent_and_a_signed_receipt_marks_it_delivered(
    pipeline: Pipeline,
) -> None:
    p = pipeline
    reply = post(p, "evt-2", {**SHIPPED, "priority": "normal"})
    assert reply.status_code == 202, reply.text
    answer = reply.json()
    nid = answer["id"]
    assert answer == {"id": nid, "dedup_key": "shop/evt-2", "queued": ["sms"], "skipped": [],
                      "status_url": f"/v1/notifications/{nid}"}
    # the request, keyed by user id, and its one channel message
    [request] = [r for r in p.requests() if r["dedup_key"] == "shop/evt-2"]  # the caller's key space
    assert (request["notification_id"], request["user_id"], request["template_id"], request["params"],
            request["channels"], request["category"]) == (nid, "nusrat", "order_shipped", {"order": "BD-7790"},
                                                          ["sms"], "transactional")
    wait_until(lambda: any(m["dedup_key"] == "shop/evt-2" for m in read_records(
        p.bootstrap, p.cfg.topics.sms, "channel_message", idle_s=0.5)), 60, "the channel message of evt-2")
    [message] = [m for m in read_records(p.bootstrap, p.cfg.topics.sms, "channel_message")
                 if m["dedup_key"] == "shop/evt-2"]
    assert message["notification_id"] == nid and message["message_key"].startswith("shop/evt-2:sms:")
    wait_until(lambda: p.status(nid)["channels"]["sms"]["status"] == "sent", 60, lambda: str(p.status(nid)))
    status = p.status(nid)
    sms = status["channels"]["sms"]
    assert (status["verdict"], status["dedup_key"], status["user_id"], status["template"]) == (
        "accepted", "shop/evt-2", "nusrat", "order_shipped")
    assert (sms["attempts"], sms["provider"], sms["template_version"], sms["message_key"]) == (
        1, p.provider, 2, message["message_key"])
    [call] = p.fake.to(address_of("nusrat", Channel.SMS))
    assert call.idempotency_key == message["message_key"]
    assert call.body["text"] == "Your order BD-7790 is on its way."
    # the same status by the caller's own key, by the dedup key, and for support by the dedup key
    assert p.status("evt-2")["id"] == p.status("shop/evt-2")["id"] == p.status("shop/evt-2", support=True)["id"] == nid

    # the provider's receipt, signed: sent -> delivered, once
    provider_id = f"msg-{p.fake.requests.index(call) + 1}"
    raw, headers = signed({"message_id": provider_id, "status": "delivered"})
    first = p.client(None).post(f"/webhooks/{p.provider}", content=raw, headers=headers)
    assert first.status_code == 200, first.text
    assert first.json() == {"message_key": message["message_key"], "status": "delivered", "changed": True}
    again = p.client(None).post(f"/webhooks/{p.provider}", content=raw, headers=headers)
    assert again.json() == {"message_key": message["message_key"], "status": "delivered", "changed": False}
    sms = p.status(nid)["channels"]["sms"]
    assert sms["status"] == "delivered"
    assert [(r["status"], r["reason"]) for r in sms["receipts"]] == [("delivered", None)]
    statuses = read_records(p.bootstrap, p.cfg.senders.status_topic, "delivery_status")
    assert [s["status"] for s in statuses if s["message_key"] == message["message_key"]] == [
        "sending", "sent", "delivered"]


def test_a_badly_signed_or_stale_receipt_is_refused_and_changes_nothing(pipeline: Pipeline) -> None:
    p = pipeline
    nid = post(p, "evt-receipt-2", {**SHIPPED, "user_id": "bruno"}).json()["id"]
    wait_until(lambda: p.status(nid)["channels"]["sms"]["status"] == "sent", 60, lambda: str(p.status(nid)))
    [call] = p.fake.to(address_of("bruno", Channel.SMS))
    provider_id = f"msg-{p.fake.requests.index(call) + 1}"
    raw, headers = signed({"message_id": provider_id, "status": "delivered"}, secret="not-the-secret")
    assert p.client(None).post(f"/webhooks/{p.provider}", content=raw, headers=headers).status_code == 401
    raw, headers = signed({"message_id": provider_id, "status": "delivered"}, at=int(time.time()) - 3600)
    assert p.client(None).post(f"/webhooks/{p.provider}", content=raw, headers=headers).status_code == 401
    raw, headers = signed({"message_id": provider_id, "status": "delivered"})
    tampered = raw.replace(b"delivered", b"failed\x20\x20\x20")
    assert p.client(None).post(f"/webhooks/{p.provider}", content=tampered, headers=headers).status_code == 401
    assert p.client(None).post("/webhooks/unknown-provider", content=raw, headers=headers).status_code == 401
    unsigned = {"Content-Type": "application/json"}
    assert p.client(None).post(f"/webhooks/{p.provider}", content=raw, headers=unsigned).status_code == 401
    assert p.status(nid)["channels"]["sms"]["status"] == "sent"
    raw, headers = signed({"message_id": "msg-nope", "status": "delivered"})
    assert p.client(None).post(f"/webhooks/{p.provider}", content=raw, headers=headers).status_code == 404


def test_the_same_idempotency_key_twice_gives_one_message(pipeline: Pipeline) -> None:
    p = pipeline
    body = {**SHIPPED, "user_id": "chen", "params": {"order": "CN-1"}}
    first = post(p, "evt-twice", body)
    second = post(p, "evt-twice", body)
    assert (first.status_code, second.status_code) == (202, 200)
    assert second.json() == first.json()
    other = post(p, "evt-twice", {**body, "params": {"order": "CN-2"}})
    assert other.status_code == 422 and other.json()["error"] == "idempotency_key_reused"
    nid = first.json()["id"]
    wait_until(lambda: p.status(nid)["channels"]["sms"]["status"] == "sent", 60, lambda: str(p.status(nid)))
    assert [r["notification_id"] for r in p.requests() if r["dedup_key"] == "shop/evt-twice"] == [nid]
    messages = read_records(p.bootstrap, p.cfg.topics.sms, "channel_message")
    assert [m["notification_id"] for m in messages if m["dedup_key"] == "shop/evt-twice"] == [nid]
    assert len([c for c in p.fake.to(address_of("chen", Channel.SMS)) if c.body["text"].find("CN-1") >= 0]) == 1


def test_an_unverified_address_gets_no_message_unless_the_template_verifies_it(pipeline: Pipeline) -> None:
    """The contact's verified flag, written with profiles:write, read by the senders (issue 20:
    they never read it): order_shipped to a user whose only phone is unverified is skipped,
    no_verified_address; the one-time code (allow_unverified) goes to it."""
    p = pipeline
    writer = p.api.token("profile-writer", scopes=(Scope.PROFILES_WRITE,))
    phone = "+15550009901"
    assert p.client(p.sender).put("/v1/users/unverified/contacts", json={"sms": [phone]}).status_code == 403
    written = p.client(writer).put("/v1/users/unverified/contacts", json={"sms": [{"address": phone, "verified": False}]})
    assert written.status_code == 200, written.text
    shipped = post(p, "evt-unverified", {**SHIPPED, "user_id": "unverified"})
    assert shipped.status_code == 202 and (shipped.json()["queued"], shipped.json()["skipped"]) == (
        [], ["sms: no verified address"])
    nid = shipped.json()["id"]
    wait_until(lambda: p.status(nid)["channels"]["sms"]["status"] == "skipped", 60, lambda: str(p.status(nid)))
    assert p.status(nid)["channels"]["sms"]["reason"] == "no_verified_address"
    code = post(p, "evt-otp-unverified", {"user_id": "unverified", "template": "otp", "params": {"code": "482913"},
                                          "priority": "high"})
    assert code.status_code == 202 and code.json()["queued"] == ["sms"], code.text
    wait_until(lambda: p.status(code.json()["id"])["channels"]["sms"]["status"] == "sent", 60,
               lambda: str(p.status(code.json()["id"])))
    assert [c.body["text"] for c in p.fake.to(phone)] == [
        "Your code is 482913. It expires in 10 minutes. Never share it."]


def test_every_error_code(pipeline: Pipeline) -> None:
    p = pipeline
    key = f"err-{uuid.uuid4().hex[:6]}"

    def error(reply: httpx.Response) -> tuple[int, str]:
        return reply.status_code, reply.json()["error"]

    assert error(post(p, key, {**SHIPPED, "template": "no_such"})) == (400, "unknown_template")
    missing = post(p, key, {**SHIPPED, "params": {}})
    assert error(missing) == (400, "missing_parameter") and missing.json()["problems"] == ["params.order: missing"]
    assert error(post(p, key, {**SHIPPED, "priority": "urgent"})) == (400, "invalid_request")
    assert error(post(p, key, {**SHIPPED, "colour": "red"})) == (400, "invalid_request")
    assert error(post(p, None, SHIPPED)) == (400, "missing_idempotency_key")
    assert error(post(p, key, {**SHIPPED, "params": {"order": "x" * 5000}})) == (400, "over_limit")
    ahead = int(time.time() * 1000) + 3_600_000
    assert error(post(p, key, {**SHIPPED, "event_time": ahead})) == (400, "over_limit")
    broken = p.client().post("/v1/notifications", content=b"{not json", headers={
        "Idempotency-Key": key, "Content-Type": "application/json"})
    assert error(broken) == (400, "invalid_request")
    assert error(post(p, key, SHIPPED, token="")) == (401, "unauthorized")
    assert error(post(p, key, SHIPPED, token="ndk_not-a-token")) == (401, "unauthorized")
    eid = {"user_id": "nusrat", "template": "eid_sale", "params": {"pct": "20"}}
    assert error(post(p, key, eid)) == (403, "forbidden")  # a marketing template, a transactional caller
    only_otp = p.api.token("otp-only", templates=("otp",))
    assert error(post(p, key, SHIPPED, token=only_otp)) == (403, "forbidden")
    assert error(post(p, key, {**SHIPPED, "user_id": "nobody"})) == (404, "unknown_user")
    huge = p.client().post("/v1/notifications", content=b"{" + b" " * 70_000 + b"}", headers={
        "Idempotency-Key": key, "Content-Type": "application/json"})
    assert error(huge) == (413, "body_too_large")
    slow = p.api.token("slow", rate=1)
    # a budget of 1 per second of the wall clock (api.ratelimit): two requests may fall on both
    # sides of a second's boundary and both pass; three within a second cannot
    passed: list[str] = []
    for n in range(3):
        limited = post(p, f"{key}-{n}", SHIPPED, token=slow)
        if limited.status_code != 202:
            break
        passed.append(f"slow/{key}-{n}")
    assert error(limited) == (429, "rate_limited") and int(limited.headers["Retry-After"]) >= 1
    assert 1 <= len(passed) <= 2, passed
    # none of them wrote anything but what the slow caller was allowed
    assert sorted(r["dedup_key"] for r in p.requests() if key in r["dedup_key"]) == passed


def test_kafka_not_acknowledging_is_503_and_the_retry_with_the_same_key_goes_through(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    p = pipeline
    # the same store and broker, but a requests topic that does not exist: nothing acknowledges
    cfg = p.cfg.with_overrides(topics={"requests": f"missing-{uuid.uuid4().hex[:6]}"},
                               api={"port": _free(), "ack_timeout_ms": 1500,
                                    "outcomes_group": f"o-{uuid.uuid4().hex[:6]}"})
    down = RunningApi(cfg, tmp_path).start(ready_path="/healthz")
    try:
        reply = down.client(p.sender).post("/v1/notifications", json=SHIPPED, headers={"Idempotency-Key": "evt-503"})
        assert reply.status_code == 503 and reply.json()["error"] == "kafka_unavailable"
        assert reply.headers["Retry-After"] == "1"
    finally:
        down.stop()
    retry = post(p, "evt-503", SHIPPED)
    assert retry.status_code == 202
    assert [r["notification_id"] for r in p.requests() if r["dedup_key"] == "shop/evt-503"] == [retry.json()["id"]]


def _free() -> int:
    from harness.ports import free_port

    return free_port()


def test_a_duplicate_names_its_original_and_late_and_invalid_say_so(pipeline: Pipeline) -> None:
    p = pipeline
    original = post(p, "evt-dup", {**SHIPPED, "params": {"order": "D-1"}}).json()["id"]
    # another producer (or a retry the API no longer remembers) writes the same dedup key
    repeat = NotificationRequest(
        notification_id="other-producer-1", user_id="nusrat", template_id="order_shipped", channels=(Channel.SMS,),
        event_time=int(time.time() * 1000), params={"order": "D-1"}, category=Category.TRANSACTIONAL,
        dedup_key="shop/evt-dup",  # shop's key space: what the API wrote for shop's evt-dup
    )
    prod = kafka_io.producer(p.cfg.kafka.client_config())
    kafka_io.produce_all(prod, p.cfg.topics.requests, [(b"nusrat", codec.encode_request(repeat))])
    # not shop's request (another producer wrote it): support finds it, shop does not
    wait_until(lambda: p.verdict("other-producer-1", support=True) == "duplicate", 60,
               lambda: str(p.client(p.support).get("/v1/support/notifications/other-producer-1").text))
    assert p.client().get("/v1/notifications/other-producer-1").status_code == 404
    dup = p.status("other-producer-1", support=True)
    assert (dup["duplicate_of"], dup["occurrence"], dup["channels"]) == (original, 2, {})

    # the watermark: a request of now through the job, then an idle partition's idleness (5 s)
    marker = post(p, "evt-marker", {**SHIPPED, "params": {"order": "M-1"}}).json()["id"]
    wait_until(lambda: p.verdict(marker) == "accepted", 60, lambda: str(p.status(marker)))
    time.sleep(7)
    late = post(p, "evt-late", {**SHIPPED, "event_time": int(time.time() * 1000) - 86_400_000}).json()["id"]
    wait_until(lambda: p.verdict(late) == "late", 60, lambda: str(p.status(late)))
    seen = p.status(late)
    assert seen["watermark"] is not None and seen["watermark"] > seen["event_time"] and seen["reason"]
    assert seen["channels"] == {}

    long_key = "k" * 200  # the API takes 512 bytes (shop/ and the key); this job only 100
    invalid = post(p, long_key, SHIPPED)
    assert invalid.status_code == 202
    nid = invalid.json()["id"]
    wait_until(lambda: p.verdict(nid) == "invalid", 60, lambda: str(p.status(nid)))
    assert p.status(nid)["reason"] == "dedup_key of 205 bytes is over the limit of 100 bytes (dedup.max_field_bytes)"


CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


def _trace_of(p: Pipeline, message_key: str) -> dict | None:  # type: ignore[type-arg]
    """The one trace Jaeger's query API finds for the message key, once it holds the API's span,
    the job's decision, the attempt and the provider call (each process exports in batches)."""
    traces = p.jaeger.traces(p.cfg.telemetry.service("senders"), {"message.key": message_key})
    if len(traces) != 1:
        return None
    names = {s["operationName"] for s in traces[0]["spans"]}
    return traces[0] if {"POST /v1/notifications", "dedup decision", "send sms", f"{p.provider} call"} <= names else None


def test_a_notification_is_one_trace_from_the_callers_span_to_the_provider_call(pipeline: Pipeline) -> None:
    """The caller's traceparent, the API's span, the request record carrying its context to the
    job, the job's decision, the channel message carrying the decision's context, the sender's
    attempt and its provider call: one trace in Jaeger, found by the message key, each span the
    child of the one before, in its own service; and no user id, address or parameter in any span."""
    p = pipeline
    body = {"user_id": "chen", "template": "order_shipped", "params": {"order": "TR-4411"}, "channels": ["sms"]}
    reply = p.client().post("/v1/notifications", json=body, headers={
        "Idempotency-Key": "evt-traced", "traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"})
    assert reply.status_code == 202, reply.text
    nid = reply.json()["id"]
    wait_until(lambda: p.status(nid)["channels"]["sms"]["status"] == "sent", 60, lambda: str(p.status(nid)))
    message_key = p.status(nid)["channels"]["sms"]["message_key"]
    # the request record carries the API span's context, the channel message the decision's: both
    # in the caller's trace
    [request] = [r for r in p.requests() if r["notification_id"] == nid]
    [message] = [m for m in read_records(p.bootstrap, p.cfg.topics.sms, "channel_message")
                 if m["notification_id"] == nid]
    assert request["traceparent"].startswith(f"00-{CALLER_TRACE}-")
    assert message["traceparent"].startswith(f"00-{CALLER_TRACE}-") and message["traceparent"] != request["traceparent"]

    wait_until(lambda: _trace_of(p, message_key) is not None, 30, f"the trace of {message_key} in Jaeger")
    trace = _trace_of(p, message_key)
    assert trace is not None and trace["traceID"] == CALLER_TRACE
    services = {pid: proc["serviceName"] for pid, proc in trace["processes"].items()}
    spans = {s["operationName"]: s for s in trace["spans"]}

    def parent(span: dict) -> str | None:  # type: ignore[type-arg]
        refs = [r["spanID"] for r in span["references"] if r["refType"] == "CHILD_OF"]
        return refs[0] if refs else None

    def tags(span: dict) -> dict:  # type: ignore[type-arg]
        return {t["key"]: t["value"] for t in span["tags"]}

    api, decision = spans["POST /v1/notifications"], spans["dedup decision"]
    attempt, call = spans["send sms"], spans[f"{p.provider} call"]
    assert [services[s["processID"]] for s in (api, decision, attempt, call)] == [
        "notify-dedup-api", "notify-dedup-job", "notify-dedup-senders", "notify-dedup-senders"]
    assert (parent(api), parent(decision), parent(attempt), parent(call)) == (
        CALLER_SPAN, api["spanID"], decision["spanID"], attempt["spanID"])
    assert request["traceparent"] == f"00-{CALLER_TRACE}-{api['spanID']}-01"
    assert message["traceparent"] == f"00-{CALLER_TRACE}-{decision['spanID']}-01"
    assert {k: tags(api)[k] for k in ("caller", "notification.id", "http.response.status_code")} == {
        "caller": "shop", "notification.id": nid, "http.response.status_code": 202}
    assert {k: tags(decision)[k] for k in ("notification.id", "dedup.decision")} == {
        "notification.id": nid, "dedup.decision": "accepted"}
    assert {k: tags(attempt)[k] for k in ("message.key", "channel", "lane", "attempt", "outcome", "provider")} == {
        "message.key": message_key, "channel": "sms", "lane": "normal", "attempt": 1, "outcome": "sent",
        "provider": p.provider}
    assert {k: tags(call)[k] for k in ("message.key", "provider", "outcome")} == {
        "message.key": message_key, "provider": p.provider, "outcome": "sent"}
    text = render_trace(trace)
    assert [line.split()[:2] for line in text.splitlines()[1:]] == [
        ["notify-dedup-api", "POST"], ["notify-dedup-job", "dedup"], ["notify-dedup-senders", "send"],
        ["notify-dedup-senders", f"{p.provider}"]]
    if os.environ.get("DEDUP_TRACE_TEXT"):  # the README's trace: DEDUP_TRACE_TEXT=<file> pytest -k one_trace
        Path(os.environ["DEDUP_TRACE_TEXT"]).write_text(text + "\n", encoding="utf-8")
    # what the logs may not hold, no span holds either
    text = str(trace)
    for secret in ("chen", address_of("chen", Channel.SMS), "TR-4411", p.sender):
        assert secret not in text


def test_a_campaign_batch_is_the_parent_of_its_requests_decisions(pipeline: Pipeline) -> None:
    """A campaign's requests carry the context of the batch that wrote them (``campaign batch``, a
    span of the API's, found in Jaeger by the campaign id): each request's decision in the job is
    its child, and each channel message carries its decision's context on to the senders."""
    p = pipeline
    growth = p.api.token("growth", categories=(Category.MARKETING,), scopes=(Scope.CAMPAIGNS,), rate=1000)
    body = {"template": "eid_sale", "segment": PIPELINE_USERS, "params": {"pct": "20"}, "channels": ["sms"],
            "rate": 1000}
    with p.client(growth) as c:
        created = c.post("/v1/campaigns", json=body)
        assert created.status_code == 202, created.text
        cid = created.json()["campaign_id"]
        wait_until(lambda: c.get(f"/v1/campaigns/{cid}").json()["state"] == "done", 30,
                   lambda: c.get(f"/v1/campaigns/{cid}").text)
    requests = [r for r in p.requests() if r["notification_id"].startswith(f"{cid}-")]
    assert len(requests) == len(PIPELINE_USERS)
    [batch_context] = {r["traceparent"] for r in requests}  # one batch: 3 users at 1,000/s
    trace_id, batch_span, flags = batch_context.split("-")[1:4]

    def trace() -> dict | None:  # type: ignore[type-arg]
        found = p.jaeger.traces(p.cfg.telemetry.service("api"), {"campaign.id": cid})
        if len(found) != 1:
            return None
        decisions = [s for s in found[0]["spans"] if s["operationName"] == "dedup decision"]
        return found[0] if len(decisions) == len(PIPELINE_USERS) else None

    wait_until(lambda: trace() is not None, 60, f"campaign {cid}'s trace in Jaeger")
    found = trace()
    assert found is not None and found["traceID"] == trace_id
    services = {pid: proc["serviceName"] for pid, proc in found["processes"].items()}
    [batch] = [s for s in found["spans"] if s["operationName"] == "campaign batch"]
    tags = {t["key"]: t["value"] for t in batch["tags"]}
    assert (batch["spanID"], services[batch["processID"]]) == (batch_span, "notify-dedup-api")
    assert {k: tags[k] for k in ("campaign.id", "campaign.requests")} == {
        "campaign.id": cid, "campaign.requests": len(PIPELINE_USERS)}
    decisions = {
        next(t["value"] for t in s["tags"] if t["key"] == "notification.id"): s
        for s in found["spans"] if s["operationName"] == "dedup decision"
    }
    assert sorted(decisions) == sorted(r["notification_id"] for r in requests)
    for span in decisions.values():
        assert services[span["processID"]] == "notify-dedup-job"
        assert [r["spanID"] for r in span["references"] if r["refType"] == "CHILD_OF"] == [batch_span]
    messages = [m for m in read_records(p.bootstrap, p.cfg.topics.sms, "channel_message")
                if m["notification_id"].startswith(f"{cid}-")]
    assert sorted((m["notification_id"], m["traceparent"]) for m in messages) == sorted(
        (nid, f"00-{trace_id}-{span['spanID']}-{flags}") for nid, span in decisions.items())


def test_a_callers_trace_that_is_not_kept_is_passed_on_as_it_came(pipeline: Pipeline) -> None:
    """The caller's traceparent with its sampled bit off: no span anywhere, and the request record
    and the channel message carry the caller's context unchanged (a hop that does not record)."""
    p = pipeline
    unsampled = f"00-{uuid.uuid4().hex}-{CALLER_SPAN}-00"
    body = {"user_id": "bruno", "template": "order_shipped", "params": {"order": "TR-5512"}, "channels": ["sms"]}
    reply = p.client().post("/v1/notifications", json=body, headers={
        "Idempotency-Key": "evt-unsampled", "traceparent": unsampled})
    assert reply.status_code == 202, reply.text
    nid = reply.json()["id"]
    wait_until(lambda: p.status(nid)["channels"]["sms"]["status"] == "sent", 60, lambda: str(p.status(nid)))
    [request] = [r for r in p.requests() if r["notification_id"] == nid]
    [message] = [m for m in read_records(p.bootstrap, p.cfg.topics.sms, "channel_message")
                 if m["notification_id"] == nid]
    assert request["traceparent"] == message["traceparent"] == unsampled
    message_key = p.status(nid)["channels"]["sms"]["message_key"]
    time.sleep(2)  # each process exports within 0.5 s: anything recorded would be in Jaeger by now
    assert p.jaeger.traces(p.cfg.telemetry.service("senders"), {"message.key": message_key}) == []
