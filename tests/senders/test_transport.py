"""Transport and secrets: HTTP never follows a redirect, verifies TLS against a configurable CA and
keeps URL credentials out of labels, metrics and logs; SMTP logs in only over TLS (STARTTLS with a
verifying context, or implicit TLS)."""

from __future__ import annotations

import base64
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from harness.ports import free_port
from harness.provider_servers.tls import Pki, make_pki
from operators.errors import ConfigError
from operators.records import Channel
from senders.errors import ProviderPermanentError, ProviderRetryableError
from senders.providers import HttpProvider, SmtpProvider, provider_label
from senders.runtime.metrics import Metrics
from senders.runtime.pool import build_dispatchers
from settings import Settings
from tests.senders.conftest import sample_message, send_now
from tests.senders.fake_http import FakeHttpProvider


def _send(provider: HttpProvider | SmtpProvider, to: str = "+15550100", channel: Channel = Channel.SMS) -> Any:
    return send_now(provider, to=to, message_key="k1:sms", message=sample_message(channel))


# -- HTTP ------------------------------------------------------------------------------------------


class _Elsewhere:
    """Another host: records what reaches it, and answers 200."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str | None]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self) -> None:
                outer.seen.append((self.command, self.headers.get("Authorization")))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST = _any  # noqa: N815

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/collect"


@pytest.mark.parametrize("http2", [False, True], ids=["http1", "httpx"])
@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_is_not_followed_and_is_no_success(status: int, http2: bool) -> None:
    elsewhere = _Elsewhere()
    server = FakeHttpProvider(replies={"+15550100": (status, {"Location": elsewhere.url})}).start()
    try:
        provider = HttpProvider(name="sms-a", url=server.url, timeout_s=1.0, token=SecretStr("t0ken"), http2=http2)
        with pytest.raises(ProviderPermanentError) as err:
            _send(provider)
        assert err.value.status_code == status and not err.value.deactivate_address
        assert elsewhere.seen == []  # neither the message nor the token went to the other host
    finally:
        server.stop()
        elsewhere.server.shutdown()


@pytest.mark.parametrize("http2", [False, True], ids=["http1", "httpx"])
def test_tls_is_verified_against_the_configured_ca(pki: Pki, tmp_path: Path, http2: bool) -> None:
    server = FakeHttpProvider(tls=pki.server_context()).start()
    try:
        trusted = HttpProvider(name="sms-a", url=server.url, timeout_s=2.0, ca_file=str(pki.ca_file), http2=http2)
        assert _send(trusted).reference == "msg-1"
        stranger = make_pki(tmp_path / "other", name="other")
        for ca in (None, str(stranger.ca_file)):  # the system's CAs, or another CA: not this server
            untrusting = HttpProvider(name="sms-a", url=server.url, timeout_s=2.0, ca_file=ca, http2=http2)
            with pytest.raises(ProviderRetryableError, match="TLS"):
                _send(untrusting)
        assert len(server.requests) == 1
    finally:
        server.stop()


def test_url_credentials_are_sent_but_never_shown(caplog: pytest.LogCaptureFixture) -> None:
    server = FakeHttpProvider(replies={"+15550199": (503, {})}).start()
    url = server.url.replace("http://", "http://acct:s3cr3t@")
    try:
        assert provider_label(url) == f"127.0.0.1:{url.rsplit(':', 1)[1].split('/')[0]}"
        metrics = Metrics()
        cfg = Settings().with_overrides(senders={"sms_primary": url, "sms_secondary": url})
        caplog.set_level(logging.DEBUG)
        dispatcher = build_dispatchers(cfg, [Channel.SMS], metrics)[Channel.SMS]
        assert _send(dispatcher.primary).reference is not None
        with pytest.raises(ProviderRetryableError):
            _send(dispatcher.primary, to="+15550199")
        assert server.requests[0].authorization == "Basic " + base64.b64encode(b"acct:s3cr3t").decode()
        shown = " ".join(
            [dispatcher.primary.name, dispatcher.secondary.name if dispatcher.secondary else "", repr(dispatcher.primary)]
            + list(metrics.snapshot())
            + [metrics.render_prometheus(), caplog.text]
        )
        assert "s3cr3t" not in shown and "acct" not in shown
    finally:
        server.stop()


# -- SMTP ------------------------------------------------------------------------------------------


class _Mailbox:
    def __init__(self) -> None:
        self.messages: list[bytes] = []
        self.logins: list[str] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        self.messages.append(envelope.content)
        return "250 accepted"


@pytest.fixture
def smtp_tls(pki: Pki) -> Iterator[tuple[_Mailbox, int, int]]:
    """(mailbox, STARTTLS port with AUTH over TLS only, implicit-TLS port)."""
    from aiosmtpd.controller import Controller
    from aiosmtpd.smtp import AuthResult

    box = _Mailbox()

    def authenticator(server: Any, session: Any, envelope: Any, mechanism: str, data: Any) -> AuthResult:
        ok = data.login == b"mailer" and data.password == b"pw-4711"
        if ok:
            box.logins.append(data.login.decode())
        return AuthResult(success=ok)

    starttls = Controller(
        box,
        hostname="127.0.0.1",
        port=free_port(),
        tls_context=pki.server_context(),
        require_starttls=True,
        authenticator=authenticator,
        auth_require_tls=True,
    )
    implicit = Controller(box, hostname="127.0.0.1", port=free_port(), ssl_context=pki.server_context())
    starttls.start()
    implicit.start()
    yield box, starttls.port, implicit.port
    starttls.stop()
    implicit.stop()


def test_smtp_starttls_verifies_the_server_and_logs_in_over_tls(
    smtp_tls: tuple[_Mailbox, int, int], pki: Pki, tmp_path: Path
) -> None:
    box, port, _ = smtp_tls
    provider = SmtpProvider(
        name="smtp", host="127.0.0.1", port=port, sender="n@example.com", timeout_s=5.0, starttls=True,
        username="mailer", password=SecretStr("pw-4711"), ca_file=str(pki.ca_file),
    )
    _send(provider, to="ann@example.com", channel=Channel.EMAIL)
    assert len(box.messages) == 1 and box.logins == ["mailer"]
    stranger = make_pki(tmp_path / "other", name="other")
    unverified = SmtpProvider(
        name="smtp", host="127.0.0.1", port=port, sender="n@example.com", timeout_s=5.0, starttls=True,
        username="mailer", password=SecretStr("pw-4711"), ca_file=str(stranger.ca_file),
    )
    with pytest.raises(ProviderRetryableError, match="TLS"):
        _send(unverified, to="ann@example.com", channel=Channel.EMAIL)
    assert len(box.messages) == 1 and box.logins == ["mailer"]  # nothing sent to an unverified server


def test_smtp_implicit_tls(smtp_tls: tuple[_Mailbox, int, int], pki: Pki) -> None:
    box, _, port = smtp_tls
    provider = SmtpProvider(
        name="smtp", host="127.0.0.1", port=port, sender="n@example.com", timeout_s=5.0, implicit_tls=True,
        ca_file=str(pki.ca_file),
    )
    _send(provider, to="ann@example.com", channel=Channel.EMAIL)
    assert len(box.messages) == 1


def test_smtp_credentials_without_tls_are_refused() -> None:
    with pytest.raises(ConfigError, match="TLS"):
        SmtpProvider(
            name="smtp", host="127.0.0.1", port=25, sender="n@example.com", timeout_s=5.0,
            username="mailer", password=SecretStr("pw-4711"),
        )
    cfg = Settings().with_overrides(senders={"email_primary": "smtp", "smtp_username": "mailer", "smtp_password": "x"})
    with pytest.raises(ConfigError, match="smtp_starttls or smtp_implicit_tls"):
        build_dispatchers(cfg, [Channel.EMAIL], Metrics())
