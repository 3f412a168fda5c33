"""Email over SMTP (smtplib), one connection per message."""

from __future__ import annotations

import hashlib
import smtplib
from collections.abc import Callable, Mapping
from email.message import EmailMessage

from pydantic import SecretStr

from operators.records import Channel
from senders.errors import ProviderPermanentError, ProviderRetryableError
from senders.providers.base import Provider
from senders.runtime.metrics import Metrics

#: server replies that mean our login is wrong: retried (it is ours to fix), address kept
AUTH_CODES = frozenset({530, 534, 535, 538})

Renderer = Callable[[str, Mapping[str, str]], tuple[str, str]]


def render_plain(template_id: str, params: Mapping[str, str]) -> tuple[str, str]:
    """Subject and body of a message; a stand-in until templates are rendered upstream."""
    body = "\n".join(f"{k}: {v}" for k, v in sorted(params.items())) or template_id
    return template_id, body + "\n"


def _reason(code: int, message: bytes | str) -> str:
    """The reply code and its enhanced status code (5.1.1), never the text: it may hold the address."""
    text = message.decode("utf-8", "replace") if isinstance(message, bytes) else str(message)
    first = text.split(" ", 1)[0]
    enhanced = first if first.count(".") == 2 and first.replace(".", "").isdigit() else ""
    return f"SMTP {code} {enhanced}".strip()


def message_id(message_key: str) -> str:
    """A Message-ID stable across attempts, so a mailbox can drop a repeated delivery."""
    return f"<{hashlib.sha256(message_key.encode()).hexdigest()[:32]}@notify-dedup>"


class SmtpProvider(Provider):
    """4xx replies, timeouts and connection errors: transient. 5xx for the recipient: permanent,
    the address deactivated. Other 5xx (sender refused, content rejected): permanent, address kept.
    Authentication failures: transient."""

    def __init__(
        self,
        *,
        name: str,
        host: str,
        port: int,
        sender: str,
        timeout_s: float,
        starttls: bool = False,
        username: str | None = None,
        password: SecretStr | None = None,
        smtp_factory: Callable[..., smtplib.SMTP] = smtplib.SMTP,
        renderer: Renderer = render_plain,
        metrics: Metrics | None = None,
    ) -> None:
        super().__init__(name=name, metrics=metrics)
        self.host = host
        self.port = port
        self.sender = sender
        self.timeout_s = timeout_s
        self._starttls = starttls
        self._username = username
        self._password = password
        self._smtp_factory = smtp_factory
        self._renderer = renderer

    def _try_send(
        self, *, to: str, message_key: str, channel: Channel, template_id: str, params: Mapping[str, str]
    ) -> str | None:
        subject, body = self._renderer(template_id, params)
        msg = EmailMessage()
        msg["From"] = self.sender
        msg["To"] = to
        msg["Subject"] = subject
        msg["Message-ID"] = message_id(message_key)
        msg["X-Notify-Message-Key"] = message_key
        msg.set_content(body)
        try:
            with self._smtp_factory(self.host, self.port, timeout=self.timeout_s) as smtp:
                if self._starttls:
                    smtp.starttls()
                if self._username:
                    smtp.login(self._username, self._password.get_secret_value() if self._password else "")
                smtp.send_message(msg)
        except smtplib.SMTPRecipientsRefused as exc:
            code, text = next(iter(exc.recipients.values()))
            self._fail(code, text, address_at_fault=True)
        except smtplib.SMTPResponseException as exc:  # sender refused, data refused, auth, ...
            self._fail(exc.smtp_code, exc.smtp_error, address_at_fault=False)
        except (smtplib.SMTPException, OSError) as exc:  # connect, disconnect, timeout
            raise ProviderRetryableError(self.name, f"SMTP connection failed: {type(exc).__name__}") from None
        return msg["Message-ID"]

    def _fail(self, code: int, text: bytes | str, *, address_at_fault: bool) -> None:
        reason = _reason(code, text)
        if code in AUTH_CODES or not 500 <= code < 600:
            raise ProviderRetryableError(self.name, reason, status_code=code)
        raise ProviderPermanentError(self.name, reason, status_code=code, deactivate_address=address_at_fault)
