"""The APNs provider against a local APNs server (HTTP/2 over TLS from a throwaway CA, the
provider token checked against the team's key): headers and payload, the provider token's
reuse and renewal, every reason class, a slow server past the deadline, many calls on one
connection, and the h2c test mode."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import jwt
import pytest

from harness.provider_servers.apns import ApnsServer
from harness.provider_servers.h2 import Clock
from harness.provider_servers.tls import Pki
from operators.errors import ConfigError
from senders.errors import ProviderPermanentError, ProviderRetryableError
from senders.providers import ApnsProvider, Receipt, build_provider
from senders.providers.credentials import MIN_RENEW_S, RENEW_AFTER_S, ApnsSigningKey
from senders.providers.push import PushOptions, message_id
from senders.runtime.metrics import Metrics
from settings import load_settings
from tests.senders.push_helpers import CODE_BODY, code_message, in_order, push, send_all, send_one

DEVICE = "a" * 64
OTHER = "b" * 64


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def apns(pki: Pki, clock: Clock) -> Iterator[ApnsServer]:
    server = ApnsServer(pki=pki, clock=clock).start()
    yield server
    server.stop()


def provider(server: ApnsServer, pki: Pki | None, clock: Clock, *, timeout_s: float = 3.0,
             **kwargs: object) -> ApnsProvider:
    key = ApnsSigningKey.parse(server.p8(), team_id=server.team_id, key_id=server.key_id)
    return ApnsProvider(name="apns", key=key, topic=server.topic, base_url=server.origin, timeout_s=timeout_s,
                        ca_file=str(pki.ca_file) if pki else None, clock=clock, metrics=Metrics(), **kwargs)  # type: ignore[arg-type]


def test_each_kind_of_message_goes_out_with_its_headers_and_payload(apns: ApnsServer, pki: Pki, clock: Clock) -> None:
    now_ms = int(clock() * 1000)
    p = provider(apns, pki, clock, options=PushOptions(ttl_s=86_400, code_ttl_s=600))
    results = in_order(p, [
        (DEVICE, "k1:push", code_message(event_time_ms=now_ms - 30_000)),
        (OTHER, "k2:push", push("marketing", event_time_ms=now_ms, body="50% off")),
        (OTHER, "k3:push", push("transactional", event_time_ms=now_ms)),
    ])
    assert all(isinstance(r, Receipt) for r in results), results
    # the apns-id derived from the message key is the provider's message id
    assert [r.reference for r in results] == [message_id(f"k{i}:push") for i in (1, 2, 3)]  # type: ignore[union-attr]
    code, sale, shipped = apns.seen
    assert {s.http_version for s in apns.seen} == {"2"}
    assert code.path == f"/3/device/{DEVICE}"
    h = code.headers
    assert (h["apns-topic"], h["apns-push-type"], h["apns-priority"], h["apns-collapse-id"]) == (
        "com.example.app", "alert", "10", "k1:push")
    assert h["apns-expiration"] == str(int(clock()) + 570)  # 10 minutes after the request, 30 s ago
    assert uuid.UUID(h["apns-id"]) == uuid.UUID(message_id("k1:push"))
    assert code.json() == {"aps": {"alert": {"title": "Sign-in code", "body": CODE_BODY}}, "message_key": "k1:push"}
    assert sale.headers["apns-priority"] == "5" and shipped.headers["apns-priority"] == "10"
    assert sale.headers["apns-expiration"] == str(int(now_ms / 1000) + 86_400)
    # one provider token for all three, as APNs verifies it
    [token] = {s.headers["authorization"].removeprefix("bearer ") for s in apns.seen}
    assert jwt.get_unverified_header(token) == {"alg": "ES256", "kid": "KEY1234567", "typ": "JWT"}
    claims = jwt.decode(token, apns.key.public_key(), algorithms=["ES256"], options={"verify_iat": False})
    assert claims == {"iss": "TEAM123456", "iat": int(clock())}


def test_a_repeat_carries_the_same_apns_id(apns: ApnsServer, pki: Pki, clock: Clock) -> None:
    apns.script[DEVICE] = ["InternalServerError", "ok"]
    first, second = in_order(provider(apns, pki, clock), [(DEVICE, "k1:push", push())] * 2)
    assert isinstance(first, ProviderRetryableError) and isinstance(second, Receipt)
    assert [s.headers["apns-id"] for s in apns.seen] == [message_id("k1:push")] * 2
    assert len(apns.tokens) == 1


def test_the_provider_token_is_reused_then_renewed_before_the_hour(apns: ApnsServer, pki: Pki, clock: Clock) -> None:
    steps = {1: MIN_RENEW_S + 60, 2: RENEW_AFTER_S - MIN_RENEW_S - 120, 3: 120}  # 21 min, 49 min, 51 min
    p = provider(apns, pki, clock)
    results = in_order(p, [(DEVICE, f"k{i}:push", push()) for i in range(4)], lambda i: clock.advance(steps.get(i, 0)))
    assert all(isinstance(r, Receipt) for r in results), results
    auth = [s.headers["authorization"] for s in apns.seen]
    assert auth[0] == auth[1] == auth[2] != auth[3]
    assert len(apns.tokens) == 2  # and APNs took the renewal: more than 20 minutes after the first


def test_an_expired_provider_token_is_renewed_and_the_message_sent_once_more(
    apns: ApnsServer, pki: Pki, clock: Clock
) -> None:
    p = provider(apns, pki, clock)

    def between(i: int) -> None:
        if i == 1:  # APNs' clock says the first token expired, 25 minutes after it was made
            clock.advance(25 * 60)
            apns.expire_tokens_before = int(clock())

    results = in_order(p, [(DEVICE, "k1:push", push()), (DEVICE, "k2:push", push())], between)
    assert all(isinstance(r, Receipt) for r in results), results
    assert len(apns.to(DEVICE)) == 3 and len(apns.tokens) == 2
    assert p.metrics.value("provider_auth_failures_total") == 0


def test_a_young_token_said_expired_is_not_renewed_and_is_an_alert(apns: ApnsServer, pki: Pki, clock: Clock) -> None:
    """Renewing sooner than 20 minutes would be refused (TooManyProviderTokenUpdates): a token
    that young is not stale, the clocks disagree."""
    apns.script[DEVICE] = ["ExpiredProviderToken"]
    p = provider(apns, pki, clock)
    error = send_one(p, DEVICE, "k1:push", push())
    assert isinstance(error, ProviderPermanentError)
    assert (error.credentials, error.deactivate_address) == (True, False) and "clock" in error.reason
    assert len(apns.seen) == 1 and len(apns.tokens) == 1
    assert p.metrics.value("provider_auth_failures_total", provider="apns", channel="push") == 1


@pytest.mark.parametrize(
    ("answer", "kind", "deactivate", "credentials", "retry_after"),
    [
        ("Unregistered", "permanent", True, False, None),  # 410
        ("BadDeviceToken", "permanent", True, False, None),  # 400
        ("DeviceTokenNotForTopic", "permanent", False, False, None),  # the topic is ours: keep the address
        ("PayloadTooLarge", "permanent", False, False, None),  # 413
        ("TooManyRequests", "transient", None, None, None),  # 429
        ("TooManyProviderTokenUpdates", "transient", None, None, None),  # 429
        ("InternalServerError", "transient", None, None, None),  # 500
        ("ServiceUnavailable", "transient", None, None, 7.0),  # 503
        ("InvalidProviderToken", "permanent", False, True, None),  # 403
    ],
)
def test_each_reason_class(apns: ApnsServer, pki: Pki, clock: Clock, answer: str, kind: str,
                           deactivate: bool | None, credentials: bool | None, retry_after: float | None) -> None:
    apns.script[DEVICE] = [answer]
    p = provider(apns, pki, clock)
    error = send_one(p, DEVICE, "k1:push", push())
    if kind == "transient":
        assert isinstance(error, ProviderRetryableError), error
        assert error.retry_after_s == retry_after
    else:
        assert isinstance(error, ProviderPermanentError), error
        assert (error.deactivate_address, error.credentials) == (deactivate, credentials)
    assert answer in error.reason and DEVICE not in error.reason
    assert len(apns.seen) == 1
    assert p.metrics.value("provider_auth_failures_total") == (1 if credentials else 0)


def test_a_bad_device_token_reaches_apns_as_one_path_segment(apns: ApnsServer, pki: Pki, clock: Clock) -> None:
    error = send_one(provider(apns, pki, clock), "../../x?y=1#z", "k1:push", push())
    assert isinstance(error, ProviderPermanentError) and error.deactivate_address and "BadDeviceToken" in error.reason
    [seen] = apns.seen
    assert (seen.raw_path, seen.path) == ("/3/device/..%2F..%2Fx%3Fy%3D1%23z", "/3/device/../../x?y=1#z")


def test_a_slow_server_is_cut_at_the_deadline(apns: ApnsServer, pki: Pki, clock: Clock) -> None:
    apns.script[DEVICE] = ["slow"]
    apns.slow_s = 1.5  # past the 0.5 s deadline; the server stops sooner after
    started = time.monotonic()
    error = send_one(provider(apns, pki, clock, timeout_s=0.5), DEVICE, "k1:push", push())
    assert isinstance(error, ProviderRetryableError) and "no reply within 0.5 s" in error.reason
    assert time.monotonic() - started < 2.0


def test_many_calls_on_one_http2_connection(pki: Pki, clock: Clock) -> None:
    server = ApnsServer(pki=pki, clock=clock, delay_s=0.5).start()
    try:
        devices = [f"{i:064x}" for i in range(50)]
        results = send_all(provider(server, pki, clock, timeout_s=30),
                           [(d, f"k{i}:push", push()) for i, d in enumerate(devices)])
        assert all(isinstance(r, Receipt) for r in results), [r for r in results if not isinstance(r, Receipt)][:3]
        assert len(server.connections()) == 1 and len(server.tokens) == 1
        assert server.peak_in_flight >= 20
    finally:
        server.stop()


def test_the_h2c_test_mode_speaks_http2_in_clear(clock: Clock) -> None:
    server = ApnsServer(pki=None, clock=clock).start()
    try:
        assert server.origin.startswith("http://")
        assert isinstance(send_one(provider(server, None, clock), DEVICE, "k1:push", push()), Receipt)
        assert [s.http_version for s in server.seen] == ["2"]
    finally:
        server.stop()


def test_nothing_secret_reaches_the_logs(apns: ApnsServer, pki: Pki, clock: Clock,
                                         caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    apns.script.update({OTHER: ["Unregistered"]})
    p = provider(apns, pki, clock)
    send_all(p, [(DEVICE, "k1:push", code_message()), (OTHER, "k2:push", code_message())])
    token = next(iter(apns.tokens))
    text = caplog.text + repr(p) + repr(p.tokens._token)
    for secret in (token, DEVICE, OTHER, CODE_BODY, "PRIVATE KEY"):
        assert secret not in text, secret
    assert "k2:push" in text  # the key is how a message is found in the logs


def test_build_provider_reads_the_apns_table(apns: ApnsServer, pki: Pki, tmp_path: Path) -> None:
    key = tmp_path / "AuthKey_KEY1234567.p8"
    key.write_text(apns.p8(), encoding="utf-8")
    cfg = load_settings(env={
        "DEDUP_SENDERS_APNS_KEY_FILE": str(key), "DEDUP_SENDERS_APNS_TEAM_ID": apns.team_id,
        "DEDUP_SENDERS_APNS_KEY_ID": apns.key_id, "DEDUP_SENDERS_APNS_TOPIC": apns.topic,
        "DEDUP_SENDERS_APNS_BASE_URL": apns.origin, "DEDUP_SENDERS_HTTP_CA_FILE": str(pki.ca_file),
    })
    p = build_provider("apns", name="apns", settings=cfg.senders, metrics=Metrics())
    assert isinstance(p, ApnsProvider)
    assert isinstance(send_one(p, DEVICE, "k1:push", push()), Receipt)


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"DEDUP_SENDERS_APNS_TEAM_ID": "T", "DEDUP_SENDERS_APNS_KEY_ID": "K", "DEDUP_SENDERS_APNS_TOPIC": "a.b"},
         "no key given"),
        ({"DEDUP_SENDERS_APNS_KEY": "s3cr3t-not-a-key", "DEDUP_SENDERS_APNS_TEAM_ID": "T",
          "DEDUP_SENDERS_APNS_KEY_ID": "K", "DEDUP_SENDERS_APNS_TOPIC": "a.b"}, "not an unencrypted PEM"),
        ({"DEDUP_SENDERS_APNS_KEY": "s3cr3t", "DEDUP_SENDERS_APNS_TOPIC": "a.b"}, "team_id and key_id"),
    ],
)
def test_a_missing_or_broken_key_is_a_config_error_that_shows_no_secret(env: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigError, match=match) as err:
        build_provider("apns", name="apns", settings=load_settings(env=env).senders, metrics=Metrics())
    assert "s3cr3t" not in str(err.value)


def test_an_rsa_key_is_no_apns_key(apns: ApnsServer) -> None:
    from harness.provider_servers.fcm import FcmServer

    rsa_pem = FcmServer(pki=None).service_account_json()
    import json

    with pytest.raises(ConfigError, match="EC P-256"):
        ApnsSigningKey.parse(json.loads(rsa_pem)["private_key"], team_id="T", key_id="K")
