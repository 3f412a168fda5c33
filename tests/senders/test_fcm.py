"""The FCM HTTP v1 provider against a local FCM server and token endpoint (HTTP/2 over TLS from a
throwaway CA): the OAuth2 exchange and its cache, the message's shape, every error class, token
expiry and refresh, a slow server past the deadline, many calls on one connection."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import jwt
import pytest

from harness.provider_servers.fcm import FcmServer, new_key
from harness.provider_servers.h2 import Clock
from harness.provider_servers.tls import Pki
from operators.errors import ConfigError
from senders.errors import ProviderPermanentError, ProviderRetryableError
from senders.providers import FcmProvider, Receipt, build_provider
from senders.providers.credentials import FCM_SCOPE, ServiceAccount
from senders.providers.push import PushOptions
from senders.runtime.metrics import Metrics
from settings import load_settings
from tests.senders.push_helpers import CODE_BODY, code_message, in_order, push, send_all, send_one

DEVICE = "fcm-device-token-1"


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def fcm(pki: Pki, clock: Clock) -> Iterator[FcmServer]:
    server = FcmServer(pki=pki, clock=clock).start()
    yield server
    server.stop()


def provider(server: FcmServer, pki: Pki, clock: Clock, *, timeout_s: float = 3.0, **kwargs: object) -> FcmProvider:
    return FcmProvider(name="fcm", account=ServiceAccount.parse(server.service_account_json()),
                       base_url=server.origin, timeout_s=timeout_s, ca_file=str(pki.ca_file), clock=clock,
                       metrics=Metrics(), **kwargs)  # type: ignore[arg-type]


def test_a_code_and_a_campaign_push_go_out_as_fcm_documents_them(fcm: FcmServer, pki: Pki, clock: Clock) -> None:
    p = provider(fcm, pki, clock, options=PushOptions(ttl_s=86_400, code_ttl_s=600))
    now_ms = int(clock() * 1000)
    code, sale = code_message(event_time_ms=now_ms - 30_000), push("marketing", event_time_ms=now_ms, body="50% off")
    results = in_order(p, [(DEVICE, "k1:push", code), ("fcm-device-2", "k2:push", sale)])
    assert all(isinstance(r, Receipt) for r in results), results
    # the reply's name is the provider's message id
    assert [r.reference for r in results] == [  # type: ignore[union-attr]
        "projects/proj-1/messages/0:1%31bd1c9631bd1c96", "projects/proj-1/messages/0:2%31bd1c9631bd1c96"]
    first, second = fcm.sends()
    assert first.http_version == second.http_version == "2"
    assert first.path == "/v1/projects/proj-1/messages:send"
    [code_sent] = fcm.messages_to(DEVICE)
    assert code_sent == {
        "token": DEVICE,
        "notification": {"title": "Sign-in code", "body": CODE_BODY},
        "data": {"message_key": "k1:push"},
        # a one-time code: high priority, and it lapses 10 minutes after its request (30 s ago)
        "android": {"priority": "high", "ttl": "570s", "notification": {"tag": "k1:push"}},
        "apns": {"headers": {"apns-priority": "10", "apns-expiration": str(int(clock()) + 570),
                             "apns-collapse-id": "k1:push"}},
    }
    [sale_sent] = fcm.messages_to("fcm-device-2")
    assert (sale_sent["android"]["priority"], sale_sent["android"]["ttl"]) == ("normal", "86400s")
    assert sale_sent["apns"]["headers"]["apns-priority"] == "5"
    # one access token for both, from one assertion checked against the service account's key
    [exchange] = fcm.token_requests()
    assert exchange.headers["content-type"] == "application/x-www-form-urlencoded"
    [claims] = fcm.assertions
    assert (claims["iss"], claims["scope"], claims["aud"], claims["exp"] - claims["iat"]) == (
        fcm.client_email, FCM_SCOPE, fcm.token_uri, 3600)
    assert {s.headers["authorization"] for s in fcm.sends()} == {f"Bearer {next(iter(fcm.issued))}"}


def test_many_calls_share_one_token_fetch_and_one_http2_connection(pki: Pki, clock: Clock) -> None:
    server = FcmServer(pki=pki, clock=clock, delay_s=0.5).start()
    try:
        p = provider(server, pki, clock, timeout_s=30)  # the server and client share one GIL here: slow
        now_ms = int(clock() * 1000)
        results = send_all(p, [(f"device-{i}", f"k{i}:push", push(event_time_ms=now_ms)) for i in range(50)])
        assert all(isinstance(r, Receipt) for r in results), [r for r in results if not isinstance(r, Receipt)][:3]
        assert len(server.token_requests()) == 1 and p.tokens.fetched == 1
        assert len(server.sends()) == 50
        # multiplexed: every call on one connection, many of them open at once
        assert len({s.connection for s in server.sends()}) == 1
        assert server.peak_in_flight >= 20
    finally:
        server.stop()


def test_the_token_is_cached_until_shortly_before_it_expires(fcm: FcmServer, pki: Pki, clock: Clock) -> None:
    fcm.expires_in = 3600
    p = provider(fcm, pki, clock)
    steps = {1: 3000, 2: 290, 3: 20}  # before the call: 3,000 s, then 3,290 s (refresh at 3,300), then 3,310 s

    results = in_order(p, [(DEVICE, f"k{i}:push", push()) for i in range(4)], lambda i: clock.advance(steps.get(i, 0)))
    assert all(isinstance(r, Receipt) for r in results), results
    assert len(fcm.token_requests()) == 2  # the first, and one 5 minutes before the hour
    auth = [s.headers["authorization"] for s in fcm.sends()]
    assert auth[0] == auth[1] == auth[2] != auth[3]


def test_a_401_fetches_a_new_token_once_and_sends_again(fcm: FcmServer, pki: Pki, clock: Clock) -> None:
    p = provider(fcm, pki, clock)
    results = in_order(p, [(DEVICE, "k1:push", push()), (DEVICE, "k2:push", push())],
                       lambda i: fcm.revoke_tokens() if i == 1 else None)
    assert all(isinstance(r, Receipt) for r in results), results
    assert len(fcm.token_requests()) == 2
    assert [s.json()["message"]["data"]["message_key"] for s in fcm.sends()] == ["k1:push", "k2:push", "k2:push"]


def test_a_401_after_the_refresh_is_permanent_an_alert_and_keeps_the_address(
    fcm: FcmServer, pki: Pki, clock: Clock
) -> None:
    fcm.refuse_tokens = True
    p = provider(fcm, pki, clock)
    error = send_one(p, DEVICE, "k1:push", push())
    assert isinstance(error, ProviderPermanentError)
    assert (error.status_code, error.credentials, error.deactivate_address) == (401, True, False)
    assert len(fcm.sends()) == 2 and len(fcm.token_requests()) == 2  # refreshed once, not in a loop
    assert p.metrics.value("provider_auth_failures_total", provider="fcm", channel="push") == 1


@pytest.mark.parametrize(
    ("answer", "kind", "deactivate", "credentials", "retry_after"),
    [
        ("UNREGISTERED", "permanent", True, False, None),
        ("INVALID_TOKEN", "permanent", True, False, None),  # FCM's "not a valid FCM registration token"
        ("INVALID_TOKEN_FIELD", "permanent", True, False, None),  # a BadRequest on message.token
        ("INVALID_PAYLOAD", "permanent", False, False, None),  # our payload: the token is fine
        ("QUOTA_EXCEEDED", "transient", None, None, 17.0),
        ("UNAVAILABLE", "transient", None, None, 5.0),
        ("INTERNAL", "transient", None, None, None),
        ("SENDER_ID_MISMATCH", "permanent", False, True, None),
        ("THIRD_PARTY_AUTH_ERROR", "permanent", False, True, None),
    ],
)
def test_each_error_class(fcm: FcmServer, pki: Pki, clock: Clock, answer: str, kind: str,
                          deactivate: bool | None, credentials: bool | None, retry_after: float | None) -> None:
    fcm.script[DEVICE] = [answer]
    p = provider(fcm, pki, clock)
    error = send_one(p, DEVICE, "k1:push", push())
    if kind == "transient":
        assert isinstance(error, ProviderRetryableError), error
        assert error.retry_after_s == retry_after
    else:
        assert isinstance(error, ProviderPermanentError), error
        assert (error.deactivate_address, error.credentials) == (deactivate, credentials)
    code = "INVALID_ARGUMENT" if answer.startswith("INVALID_") else answer
    assert code in error.reason and DEVICE not in error.reason  # FCM's code, never its text (it may quote the token)
    # one attempt each: THIRD_PARTY_AUTH_ERROR is FCM's APNs/web-push credentials, a new token cannot help
    assert len(fcm.sends()) == 1 and len(fcm.token_requests()) == 1
    alerts = p.metrics.value("provider_auth_failures_total")
    assert alerts == (1 if credentials else 0)


def test_the_token_endpoint_refusing_the_key_is_permanent_and_its_outage_transient(
    fcm: FcmServer, pki: Pki, clock: Clock
) -> None:
    from harness.provider_servers.h2 import Reply

    fcm.token_replies = [Reply(400, {"error": "invalid_grant", "error_description": "Invalid JWT Signature."}),
                         Reply(503, {"error": "backend"})]
    p = provider(fcm, pki, clock)
    refused, down, fine = in_order(p, [(DEVICE, f"k{i}:push", push()) for i in range(3)])
    assert isinstance(refused, ProviderPermanentError) and refused.credentials and not refused.deactivate_address
    assert "invalid_grant" in refused.reason and "Signature" not in refused.reason
    assert isinstance(down, ProviderRetryableError) and "HTTP 503" in down.reason
    assert isinstance(fine, Receipt)  # a failed fetch is not cached: the next call fetched again
    assert len(fcm.sends()) == 1
    # a key the endpoint does not know (signed by another key) is refused by the endpoint itself
    other = FcmServer(pki=pki, clock=clock, key=new_key())
    forged = ServiceAccount.parse(other.service_account_json(token_uri=fcm.token_uri))
    stranger = FcmProvider(name="fcm", account=forged, base_url=fcm.origin, timeout_s=3, ca_file=str(pki.ca_file),
                           clock=clock, project_id="proj-1")
    error = send_one(stranger, DEVICE, "k9:push", push())
    assert isinstance(error, ProviderPermanentError) and error.credentials and "invalid_grant" in error.reason


def test_a_slow_server_is_cut_at_the_deadline(fcm: FcmServer, pki: Pki, clock: Clock) -> None:
    fcm.script[DEVICE] = ["slow"]
    fcm.slow_s = 1.5  # past the 0.5 s deadline; the server stops sooner after
    p = provider(fcm, pki, clock, timeout_s=0.5)
    started = time.monotonic()
    error = send_one(p, DEVICE, "k1:push", push())
    took = time.monotonic() - started
    assert isinstance(error, ProviderRetryableError) and "no reply within 0.5 s" in error.reason
    assert took < 2.0


def test_a_message_that_lapsed_is_not_sent(fcm: FcmServer, pki: Pki, clock: Clock) -> None:
    p = provider(fcm, pki, clock, options=PushOptions(code_ttl_s=600))
    stale = code_message(event_time_ms=int((clock() - 601) * 1000))
    error = send_one(p, DEVICE, "k1:push", stale)
    assert isinstance(error, ProviderPermanentError) and not error.deactivate_address and "expired" in error.reason
    assert fcm.sends() == [] and fcm.token_requests() == []


def test_nothing_secret_reaches_the_logs(fcm: FcmServer, pki: Pki, clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    fcm.script.update({"dev-gone": ["UNREGISTERED"], "dev-auth": ["SENDER_ID_MISMATCH"]})
    p = provider(fcm, pki, clock)
    send_all(p, [(d, f"k{i}:push", code_message()) for i, d in enumerate(("dev-ok", "dev-gone", "dev-auth"))])
    text = caplog.text + repr(p) + repr(p.tokens._token)
    for secret in (*fcm.issued, "dev-ok", "dev-gone", "dev-auth", CODE_BODY, "PRIVATE KEY"):
        assert secret not in text, secret
    assert "refused our credentials" in caplog.text  # the one warning: an operator's to fix


def test_build_provider_reads_the_fcm_table(fcm: FcmServer, pki: Pki, tmp_path: Path) -> None:
    key = tmp_path / "sa.json"
    key.write_text(fcm.service_account_json(project_id="from-key"), encoding="utf-8")
    cfg = load_settings(env={
        "DEDUP_SENDERS_FCM_SERVICE_ACCOUNT_FILE": str(key), "DEDUP_SENDERS_FCM_PROJECT_ID": "proj-1",
        "DEDUP_SENDERS_FCM_BASE_URL": fcm.origin, "DEDUP_SENDERS_HTTP_CA_FILE": str(pki.ca_file),
        "DEDUP_SENDERS_FCM_CODE_TTL_S": "120",
    })
    p = build_provider("fcm", name="fcm", settings=cfg.senders, metrics=Metrics())
    assert isinstance(p, FcmProvider)
    assert isinstance(send_one(p, DEVICE, "k1:push", code_message()), Receipt)
    [sent] = fcm.messages_to(DEVICE)
    assert sent["android"]["ttl"] == "120s"  # the table's, the project the setting's (the path checked it)


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({}, "no key given"),
        ({"DEDUP_SENDERS_FCM_SERVICE_ACCOUNT_FILE": "/nonexistent/sa.json"}, "cannot read the key file"),
        ({"DEDUP_SENDERS_FCM_SERVICE_ACCOUNT_JSON": "{not json"}, "not JSON"),
        ({"DEDUP_SENDERS_FCM_SERVICE_ACCOUNT_JSON": '{"client_email": "a@b", "private_key": "s3cr3t-value"}'},
         "lacks token_uri"),
        ({"DEDUP_SENDERS_FCM_SERVICE_ACCOUNT_JSON":
          '{"client_email": "a@b", "token_uri": "https://t", "private_key": "s3cr3t-value"}'}, "not an unencrypted PEM"),
    ],
)
def test_a_missing_or_broken_key_is_a_config_error_that_shows_no_secret(env: dict[str, str], match: str) -> None:
    cfg = load_settings(env=env)
    with pytest.raises(ConfigError, match=match) as err:
        build_provider("fcm", name="fcm", settings=cfg.senders, metrics=Metrics())
    assert "s3cr3t" not in str(err.value)


def test_the_assertion_is_signed_with_the_accounts_key(fcm: FcmServer) -> None:
    account = ServiceAccount.parse(fcm.service_account_json())
    assertion = account.assertion(1_800_000_000.0)
    assert jwt.get_unverified_header(assertion) == {"alg": "RS256", "kid": "key-1", "typ": "JWT"}
    claims = jwt.decode(assertion, fcm.key.public_key(), algorithms=["RS256"], audience=fcm.token_uri,
                        options={"verify_exp": False, "verify_iat": False})
    assert (claims["iat"], claims["exp"]) == (1_800_000_000, 1_800_003_600)
    assert "PRIVATE" not in repr(account)
