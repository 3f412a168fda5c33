"""Email over SMTP (smtplib), one connection per message, TLS verified."""

from __future__ import annotations

import hashlib
import smtplib
import socket
import ssl
from email.message import EmailMessage

from pydantic import SecretStr

from operators.errors import ConfigError
from senders.errors import ProviderPermanentError, ProviderRetryableError
from senders.policy.recipients import RecipientRules
from senders.providers.base import Provider
from senders.providers.deadline import deadline
from senders.providers.tls import tls_context
from senders.runtime.metrics import Metrics
from senders.templates.render import EmailContent, Rendered

#: server replies that mean our login is wrong: retried (it is ours to fix), address kept
AUTH_CODES = frozenset({530, 534, 535, 538})
#: a refused recipient with one of these enhanced statuses is an invalid address (5.1.x)
DEFAULT_INVALID_RECIPIENT = "5.1"

def _enhanced(message: bytes | str) -> str:
    """The enhanced status code (5.1.1) a reply's text starts with, or ""."""
    text = message.decode("utf-8", "replace") if isinstance(message, bytes) else str(message)
    first = text.split(" ", 1)[0]
    return first if first.count(".") == 2 and first.replace(".", "").isdigit() else ""


def _reason(code: int, message: bytes | str) -> str:
    """The reply code and its enhanced status code (5.1.1), never the text: it may hold the address."""
    return f"SMTP {code} {_enhanced(message)}".strip()


def message_id(message_key: str) -> str:
    """A Message-ID stable across attempts, so a mailbox can drop a repeated delivery."""
    return f"<{hashlib.sha256(message_key.encode()).hexdigest()[:32]}@notify-dedup>"


class _Smtp(smtplib.SMTP):
    """smtplib.SMTP that keeps its TCP socket, for the deadline to cut (STARTTLS wraps it)."""

    raw: socket.socket | None = None

    def _get_socket(self, host: str, port: int, timeout: float) -> socket.socket:
        self.raw = socket.create_connection((host, port), timeout, self.source_address)
        return self.raw


class _SmtpTls(smtplib.SMTP_SSL, _Smtp):
    """Implicit TLS (port 465), keeping the TCP socket under the TLS one."""

    raw: socket.socket | None = None

    def _get_socket(self, host: str, port: int, timeout: float) -> socket.socket:
        self.raw = socket.create_connection((host, port), timeout, self.source_address)
        return self.context.wrap_socket(self.raw, server_hostname=host)


class SmtpProvider(Provider):
    """4xx replies, timeouts and connection errors: transient. 5xx: permanent; the address is
    deactivated only when the recipient was refused with an enhanced status of
    ``invalid_recipient`` (by default 5.1.x: bad mailbox, domain or syntax), never for a relay's
    policy (5.7.x), a full mailbox or a reply without an enhanced status. Authentication failures:
    transient.

    TLS: ``starttls`` upgrades the connection, ``implicit_tls`` speaks TLS from the start (port
    465); either verifies the server against the system's CAs or ``ca_file``. With a
    ``username``, one of them is required: credentials never cross the network in clear. Each send
    (connect, TLS, login, the message) has one deadline, ``timeout_s``."""

    deadline_setting = "smtp_timeout_ms"

    def __init__(
        self,
        *,
        name: str,
        host: str,
        port: int,
        sender: str,
        timeout_s: float,
        starttls: bool = False,
        implicit_tls: bool = False,
        ca_file: str | None = None,
        username: str | None = None,
        password: SecretStr | None = None,
        invalid_recipient: RecipientRules | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        super().__init__(name=name, metrics=metrics)
        self.invalid_recipient = invalid_recipient or RecipientRules.parse(DEFAULT_INVALID_RECIPIENT)
        if starttls and implicit_tls:
            raise ConfigError(f"provider {name}: smtp_starttls and smtp_implicit_tls exclude each other")
        if username and not (starttls or implicit_tls):
            raise ConfigError(
                f"provider {name}: refusing to log in without TLS: set smtp_starttls or smtp_implicit_tls"
                " (port 465) in [senders]"
            )
        self.host = host
        self.port = port
        self.sender = sender
        self.timeout_s: float = timeout_s
        self._timeout_s = timeout_s
        self._starttls = starttls
        self._implicit_tls = implicit_tls
        self._tls = tls_context(ca_file) if starttls or implicit_tls else None
        self._username = username
        self._password = password

    def _message(self, to: str, message_key: str, message: Rendered) -> EmailMessage:
        """multipart/alternative: the plain text, then the HTML."""
        content = message.content
        if not isinstance(content, EmailContent):
            raise ProviderPermanentError(self.name, f"not an email: {message.channel}", deactivate_address=False)
        msg = EmailMessage()
        msg["From"] = self.sender
        msg["To"] = to
        msg["Subject"] = content.subject
        msg["Message-ID"] = message_id(message_key)
        msg["X-Notify-Message-Key"] = message_key
        msg["Content-Language"] = message.locale
        msg.set_content(content.text)
        msg.add_alternative(content.html, subtype="html")
        return msg

    def _try_send(self, *, to: str, message_key: str, message: Rendered) -> str | None:
        msg = self._message(to, message_key, message)
        smtp: list[_Smtp] = []  # made inside the deadline: its constructor connects
        accepted = False
        late = ProviderRetryableError(self.name, f"no reply within {self._timeout_s:g} s")
        with deadline(self._timeout_s, lambda: smtp[0].raw if smtp else None) as d:
            try:
                if self._implicit_tls:
                    smtp.append(_SmtpTls(self.host, self.port, timeout=self._timeout_s, context=self._tls))
                else:
                    smtp.append(_Smtp(self.host, self.port, timeout=self._timeout_s))
                self._session(smtp[0], msg)
                accepted = not d.cut
                self._quit(smtp[0])
            except smtplib.SMTPRecipientsRefused as exc:
                code, text = next(iter(exc.recipients.values()))
                self._fail(code, text, address_at_fault=True)
            except smtplib.SMTPNotSupportedError:
                raise ProviderRetryableError(self.name, "the SMTP server offers no STARTTLS") from None
            except smtplib.SMTPResponseException as exc:  # sender refused, data refused, auth, ...
                self._fail(exc.smtp_code, exc.smtp_error, address_at_fault=False)
            except ssl.SSLCertVerificationError:
                raise ProviderRetryableError(self.name, "SMTP TLS certificate not verified") from None
            except (smtplib.SMTPException, OSError) as exc:  # connect, disconnect, timeout, TLS
                if d.passed or isinstance(exc, TimeoutError):
                    raise late from None
                kind = "TLS" if isinstance(exc, ssl.SSLError) else "connection"
                raise ProviderRetryableError(self.name, f"SMTP {kind} failed: {type(exc).__name__}") from None
            finally:
                if smtp:
                    smtp[0].close()
        if not accepted:
            raise late  # the deadline cut the session: what it read is no reply
        return msg["Message-ID"]

    def _session(self, smtp: _Smtp, msg: EmailMessage) -> None:
        smtp.ehlo()
        if self._starttls:
            smtp.starttls(context=self._tls)
            smtp.ehlo()
        if self._username:
            smtp.login(self._username, self._password.get_secret_value() if self._password else "")
        smtp.send_message(msg)

    @staticmethod
    def _quit(smtp: _Smtp) -> None:
        try:
            smtp.quit()
        except (smtplib.SMTPException, OSError):
            pass  # the message was accepted; the connection is closed either way

    def _fail(self, code: int, text: bytes | str, *, address_at_fault: bool) -> None:
        reason = _reason(code, text)
        if code in AUTH_CODES or not 500 <= code < 600:
            raise ProviderRetryableError(self.name, reason, status_code=code)
        invalid = address_at_fault and self.invalid_recipient.matches_smtp(_enhanced(text))
        raise ProviderPermanentError(self.name, reason, status_code=code, deactivate_address=invalid)
