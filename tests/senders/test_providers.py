"""The HTTP provider against a local http.server, the SMTP provider against a local aiosmtpd."""

from __future__ import annotations

import contextlib
import email.policy
import socket
import time
from collections.abc import Iterator
from email import message_from_bytes
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from pydantic import SecretStr

from operators.records import Channel
from senders.errors import ProviderPermanentError, ProviderRetryableError
from senders.policy import unsubscribe
from senders.providers import HttpProvider, SmtpProvider
from senders.providers.smtp import message_id
from senders.runtime.metrics import Metrics
from senders.templates.catalog import load_catalog
from senders.templates.options import TemplateOptions
from senders.templates.render import Rendered, render
from settings import REPO_ROOT
from tests.senders.conftest import sample_message, send_now
from tests.senders.fake_http import FakeHttpProvider


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- HTTP ------------------------------------------------------------------------------------------


@pytest.fixture
def server() -> Iterator[FakeHttpProvider]:
    srv = FakeHttpProvider(
        replies={
            "throttled": (429, {"Retry-After": "7"}),
            "broken": (500, {}),
            "unavailable": (503, {}),
            "unauthorized": (401, {}),
            "bad-request": (400, {}),
            "gone": (410, {}),
            "unprocessable": (422, {}),
            "too-big": (413, {}),
        },
        stall={"stalls"},
        stall_s=1.0,
    ).start()
    yield srv
    srv.stop()


def _send(provider: HttpProvider | SmtpProvider, to: str, key: str = "dk1:sms") -> Any:
    return send_now(provider, to=to, message_key=key, message=sample_message(Channel.SMS))


def test_2xx_is_sent_with_the_message_key_as_idempotency_key(server: FakeHttpProvider) -> None:
    metrics = Metrics()
    provider = HttpProvider(
        name="sms-a", url=server.url, timeout_s=0.5, token=SecretStr("s3cret"), metrics=metrics
    )
    receipt = _send(provider, "+15550100")
    assert receipt.provider == "sms-a" and receipt.reference == "msg-1"
    [request] = server.requests
    assert request.idempotency_key == "dk1:sms"
    assert request.authorization == "Bearer s3cret"
    assert request.body == {
        "message_key": "dk1:sms",
        "channel": "sms",
        "to": "+15550100",
        "template": "otp",
        "template_version": 1,
        "locale": "en",
        "text": "Your code is 123456.",
        "encoding": "gsm7",
        "segments": 1,
    }
    assert metrics.value("provider_calls_total", provider="sms-a", outcome="sent") == 1


@pytest.mark.parametrize(("to", "status"), [("throttled", 429), ("broken", 500), ("unavailable", 503)])
def test_429_and_5xx_are_transient(server: FakeHttpProvider, to: str, status: int) -> None:
    provider = HttpProvider(name="sms-a", url=server.url, timeout_s=0.5)
    with pytest.raises(ProviderRetryableError) as err:
        _send(provider, to)
    assert err.value.status_code == status
    assert err.value.retry_after_s == (7.0 if status == 429 else None)


def test_a_timeout_is_transient(server: FakeHttpProvider) -> None:
    provider = HttpProvider(name="sms-a", url=server.url, timeout_s=0.2)
    with pytest.raises(ProviderRetryableError, match="no reply within"):
        _send(provider, "stalls")


def test_a_refused_connection_is_transient() -> None:
    provider = HttpProvider(name="sms-a", url=f"http://127.0.0.1:{_closed_port()}/send", timeout_s=0.5)
    with pytest.raises(ProviderRetryableError, match="connection failed"):
        _send(provider, "+15550100")


@pytest.mark.parametrize(
    ("to", "status", "deactivate"),
    [
        ("bad-request", 400, False),  # not an explicit "invalid recipient": the address stays
        ("gone", 410, True),
        ("unprocessable", 422, False),
        ("too-big", 413, False),
    ],
)
def test_other_4xx_are_permanent(server: FakeHttpProvider, to: str, status: int, deactivate: bool) -> None:
    metrics = Metrics()
    provider = HttpProvider(name="sms-a", url=server.url, timeout_s=0.5, metrics=metrics)
    with pytest.raises(ProviderPermanentError) as err:
        _send(provider, to)
    assert (err.value.status_code, err.value.deactivate_address) == (status, deactivate)
    assert err.value.reason == f"HTTP {status}"  # nothing of the body or the address
    assert metrics.value("provider_calls_total", outcome="permanent") == 1


# -- SMTP ------------------------------------------------------------------------------------------


class _Handler:
    def __init__(self) -> None:
        self.messages: list[tuple[list[str], bytes]] = []
        #: MAIL FROM and its options, per message
        self.envelopes: list[tuple[str, list[str]]] = []

    async def handle_RCPT(self, server: Any, session: Any, envelope: Any, address: str, options: Any) -> str:  # noqa: N802
        if address.startswith("nobody@"):
            return f"550 5.1.1 <{address}>: Recipient address rejected: User unknown"
        if address.startswith("greylisted@"):
            return f"451 4.7.1 <{address}>: Greylisted, try again later"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        self.messages.append((list(envelope.rcpt_tos), envelope.content))
        self.envelopes.append((envelope.mail_from, list(envelope.mail_options)))
        return "250 Message accepted"



@contextlib.contextmanager
def _relay() -> Iterator[tuple[_Handler, int]]:
    from aiosmtpd.controller import Controller

    handler = _Handler()
    controller = Controller(handler, hostname="127.0.0.1", port=_closed_port())
    controller.start()
    try:
        yield handler, controller.port
    finally:
        controller.stop()


@pytest.fixture
def smtp_server() -> Iterator[tuple[_Handler, int]]:
    with _relay() as relay:
        yield relay


def _smtp(port: int) -> SmtpProvider:
    return SmtpProvider(name="smtp", host="127.0.0.1", port=port, sender="noreply@example.com", timeout_s=2.0)


def _rendered(template: str, channel: Channel, params: dict[str, str], locale: str = "en") -> Rendered:
    options = TemplateOptions(directory=str(REPO_ROOT / "templates"))
    return render(
        load_catalog(options), template, channel, params, event_time_ms=1_796_115_600_000, locale=locale, options=options
    )


def test_smtp_sends_the_rendered_message_as_text_and_html_parts(smtp_server: tuple[_Handler, int]) -> None:
    handler, port = smtp_server
    message = _rendered("order_shipped", Channel.EMAIL, {"order": "<1001> & co"})
    receipt = send_now(_smtp(port), to="ann@example.com", message_key="dk2:email", message=message)
    [(rcpts, content)] = handler.messages
    assert rcpts == ["ann@example.com"]
    msg = message_from_bytes(content, policy=email.policy.default)
    assert msg["Subject"] == "Your order <1001> & co is on its way" and msg["From"] == "noreply@example.com"
    assert msg["Message-ID"] == message_id("dk2:email") == receipt.reference
    assert msg["X-Notify-Message-Key"] == "dk2:email"
    assert msg.get_content_type() == "multipart/alternative"
    text, html = msg.iter_parts()
    assert text.get_content_type() == "text/plain" and html.get_content_type() == "text/html"
    assert text.get_content().replace("\r\n", "\n").strip() == message.content.text.strip()  # type: ignore[union-attr]
    assert "<1001> & co" in text.get_content()  # the plain text takes the parameter as it is
    assert "&lt;1001&gt; &amp; co" in html.get_content() and "<1001>" not in html.get_content()  # escaped


def test_smtp_sends_each_header_once_and_the_bengali_parts_in_lines_smtp_carries(
    smtp_server: tuple[_Handler, int],
) -> None:
    handler, port = smtp_server
    order = "১০০১ " * 300  # a parameter that makes a body line longer than SMTP carries (998)
    message = _rendered("order_shipped", Channel.EMAIL, {"order": order}, locale="bn")
    provider = SmtpProvider(name="smtp", host="127.0.0.1", port=port, sender="Shop <noreply@example.com>",
                            timeout_s=2.0)
    before = int(time.time())
    send_now(provider, to="ann@example.com", message_key="dk6:email", message=message)
    [(rcpts, content)] = handler.messages
    [(mail_from, options)] = handler.envelopes
    assert (rcpts, mail_from) == (["ann@example.com"], "noreply@example.com")
    assert [o for o in options if not o.startswith("SIZE=")] == []  # 7-bit: no BODY=8BITMIME, no SMTPUTF8
    content.decode("ascii")
    assert max(len(line) for line in content.split(b"\r\n")) <= 998
    msg = message_from_bytes(content, policy=email.policy.default)
    assert not msg.defects
    expected = {"From": "Shop <noreply@example.com>", "To": "ann@example.com", "Subject": message.content.subject,  # type: ignore[union-attr]
                "Message-ID": message_id("dk6:email"), "X-Notify-Message-Key": "dk6:email", "MIME-Version": "1.0",
                "Content-Language": "bn"}
    assert {name: msg[name] for name in expected} == expected
    assert before <= msg["Date"].datetime.timestamp() <= time.time()
    assert sorted(msg.keys()) == sorted([*expected, "Date", "Content-Type"])  # each once, nothing else
    text, html = msg.iter_parts()
    for part, rendered in ((text, message.content.text), (html, message.content.html)):  # type: ignore[union-attr]
        assert part.get_content_charset() == "utf-8"
        assert part.get_content().replace("\r\n", "\n") == rendered.rstrip("\n") + "\n"  # one line break at the end


def test_a_non_ascii_recipient_goes_with_smtputf8() -> None:
    """(aiosmtplib refuses it where the relay does not offer SMTPUTF8; aiosmtpd always does.)"""
    message = _rendered("order_shipped", Channel.EMAIL, {"order": "1001"}, locale="bn")
    with _relay() as (handler, port):
        send_now(_smtp(port), to="অনু@example.com", message_key="dk7:email", message=message)
    [(rcpts, content)] = handler.messages
    assert rcpts == ["অনু@example.com"] and "SMTPUTF8" in handler.envelopes[0][1]
    msg = message_from_bytes(content, policy=email.policy.default)
    assert msg["To"] == "অনু@example.com" and msg["Subject"] == message.content.subject  # type: ignore[union-attr]


def test_smtp_says_the_messages_language(smtp_server: tuple[_Handler, int]) -> None:
    """Content-Language was set before the content, which drops every Content-* header: never sent."""
    handler, port = smtp_server
    message = _rendered("order_shipped", Channel.EMAIL, {"order": "1001"}, locale="bn")
    send_now(_smtp(port), to="ann@example.com", message_key="dk3:email", message=message)
    [(_, content)] = handler.messages
    assert message_from_bytes(content, policy=email.policy.default)["Content-Language"] == "bn"


def test_a_marketing_email_over_smtp_carries_the_one_click_unsubscribe_headers_each_on_one_line(
    smtp_server: tuple[_Handler, int],
) -> None:
    handler, port = smtp_server
    base = "https://notify.example.com/unsubscribe"
    provider = SmtpProvider(name="smtp", host="127.0.0.1", port=port, sender="news@example.com", timeout_s=2.0,
                            unsubscribe_url=base, unsubscribe_key=b"key-1")
    user = "user-with-a-long-id-0000000001"  # the link is longer than a folded header line (78)
    options = TemplateOptions(directory=str(REPO_ROOT / "templates"))
    digest = render(load_catalog(options), "weekly_digest", Channel.EMAIL, {"count": "3"},
                    event_time_ms=1_796_115_600_000, locale="en", options=options, user_id=user)
    send_now(provider, to="ann@example.com", message_key="dk4:email", message=digest)
    receipt = _rendered("order_shipped", Channel.EMAIL, {"order": "1001"})
    send_now(provider, to="ann@example.com", message_key="dk5:email", message=receipt)
    (_, marketing), (_, transactional) = handler.messages
    link = unsubscribe.link(base, b"key-1", user)
    assert len(link) > 78
    assert f"\r\nList-Unsubscribe: <{link}>\r\n".encode() in marketing  # one line: no RFC 2047 encoded words
    assert b"\r\nList-Unsubscribe-Post: List-Unsubscribe=One-Click\r\n" in marketing
    msg = message_from_bytes(marketing, policy=email.policy.default)
    assert unsubscribe.genuine([b"key-1"], user, parse_qs(urlsplit(msg["List-Unsubscribe"][1:-1]).query)["t"][0])
    assert b"List-Unsubscribe" not in transactional  # only marketing email


def test_http_posts_the_rendered_push_message_in_the_users_locale(server: FakeHttpProvider) -> None:
    provider = HttpProvider(name="push-a", url=server.url, timeout_s=0.5)
    message = _rendered("payment_update", Channel.PUSH, {"amount": "12.50"}, locale="bn")
    send_now(provider, to="tok-1", message_key="dk9:push", message=message)
    [request] = server.requests
    assert request.body == {
        "message_key": "dk9:push",
        "channel": "push",
        "to": "tok-1",
        "template": "payment_update",
        "template_version": 1,
        "locale": "bn",
        "title": "পেমেন্ট পাওয়া গেছে",
        "body": "আপনার 12.50 পেমেন্ট পাওয়া গেছে।",
    }


def test_smtp_unknown_recipient_is_permanent_and_blames_the_address(
    smtp_server: tuple[_Handler, int],
) -> None:
    _, port = smtp_server
    with pytest.raises(ProviderPermanentError) as err:
        send_now(_smtp(port), to="nobody@example.com", message_key="dk3:email", message=sample_message(Channel.EMAIL))
    assert err.value.deactivate_address and err.value.status_code == 550
    assert err.value.reason == "SMTP 550 5.1.1"  # not the server's text: it names the address


def test_smtp_4xx_and_connection_failures_are_transient(smtp_server: tuple[_Handler, int]) -> None:
    _, port = smtp_server
    with pytest.raises(ProviderRetryableError) as err:
        send_now(
            _smtp(port),
            to="greylisted@example.com", message_key="dk4:email", message=sample_message(Channel.EMAIL)
        )
    assert err.value.status_code == 451
    with pytest.raises(ProviderRetryableError, match="connection failed"):
        send_now(
            _smtp(_closed_port()),
            to="ann@example.com", message_key="dk5:email", message=sample_message(Channel.EMAIL)
        )


def test_auth_failures_are_permanent_but_keep_the_address(server: FakeHttpProvider) -> None:
    provider = HttpProvider(name="sms-a", url=server.url, timeout_s=0.5)
    with pytest.raises(ProviderPermanentError) as err:
        _send(provider, "unauthorized")
    assert err.value.status_code == 401
    assert err.value.deactivate_address is False


@pytest.mark.parametrize(
    ("body", "reference"),
    [
        (b'{"id": "msg-9"}', "msg-9"),
        (b'{"message_id": 42}', "42"),
        (b'{"id": true}', None),
        (b'{"id": ""}', None),
        (b'{"id": "' + b"x" * 300 + b'"}', None),
        (b"[1]", None),
        (b"not json", None),
        (b"", None),
    ],
)
def test_the_providers_message_id_is_taken_from_its_reply(body: bytes, reference: str | None) -> None:
    assert HttpProvider._reference(body) == reference
