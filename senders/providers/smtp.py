"""Email over SMTP (aiosmtplib): a small pool of connections per relay, TLS verified."""

from __future__ import annotations

import asyncio
import hashlib
import ssl
import time

import aiosmtplib
from pydantic import SecretStr

from operators.errors import ConfigError
from operators.records import Category
from senders.errors import ProviderPermanentError, ProviderRetryableError
from senders.policy import unsubscribe
from senders.policy.recipients import RecipientRules
from senders.providers import mime
from senders.providers.base import Provider
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


#: an idle connection older than this is closed rather than used (relays drop idle sessions)
IDLE_S = 10.0


def _refused_by_reply(exc: BaseException) -> bool:
    """The server answered the message with a refusal (sender, recipient, data): the session
    is sound, its envelope to be reset (RSET) before it carries the next message."""
    if isinstance(exc, aiosmtplib.SMTPRecipientsRefused):
        return True
    return isinstance(exc, aiosmtplib.SMTPResponseException) and not isinstance(
        exc, aiosmtplib.SMTPServerDisconnected | aiosmtplib.SMTPConnectError | aiosmtplib.SMTPTimeoutError
    )


def _cause(exc: BaseException) -> BaseException:
    """The TLS error under a library's wrapping, if there is one."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return exc


class SmtpProvider(Provider):
    """4xx replies, timeouts and connection errors: transient. 5xx: permanent; the address is
    deactivated only when the recipient was refused with an enhanced status of
    ``invalid_recipient`` (by default 5.1.x: bad mailbox, domain or syntax), never for a relay's
    policy (5.7.x), a full mailbox or a reply without an enhanced status. Authentication failures:
    transient.

    TLS: ``starttls`` upgrades the connection, ``implicit_tls`` speaks TLS from the start (port
    465); either verifies the server against the system's CAs or ``ca_file``. With a
    ``username``, one of them is required: credentials never cross the network in clear. Each send
    (waiting for a connection, connect, TLS, login, the message) has one deadline, ``timeout_s``.
    Up to ``pool_size`` sessions stay open and carry one message after another (the provider's
    ``capacity``: the dispatcher claims no more messages than that, so none waits for a session
    in its deadline). A message the server refused by its reply leaves its session idle, reset
    (RSET) before the next message; a session that failed otherwise (a lost connection, a
    timeout, a cancellation, a refused RSET) is closed, and the next message opens a new one.
    With ``unsubscribe_url`` and its key, a marketing email carries ``List-Unsubscribe`` and
    ``List-Unsubscribe-Post`` (one-click, RFC 8058)."""

    protocol = "smtp"

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
        pool_size: int = 4,
        unsubscribe_url: str = "",
        unsubscribe_key: bytes | None = None,
    ) -> None:
        super().__init__(name=name, metrics=metrics)
        if pool_size < 1:
            raise ConfigError(f"provider {name}: the SMTP pool needs at least one connection")
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
        try:
            self._from = mime.mailbox("From", sender)
        except ValueError as exc:
            raise ConfigError(f"provider {name}: the sender is not an email address: {exc}") from None
        self.timeout_s: float = timeout_s
        self._timeout_s = timeout_s
        self._pool_size = pool_size
        self.capacity: int | None = pool_size
        #: idle sessions: since when, and whether its last message was refused (RSET it first)
        self._idle: list[tuple[aiosmtplib.SMTP, float, bool]] = []
        self._slots: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._starttls = starttls
        self._implicit_tls = implicit_tls
        self._tls = tls_context(ca_file) if starttls or implicit_tls else None
        self._username = username
        self._password = password
        self._unsubscribe = (unsubscribe_url, unsubscribe_key) if unsubscribe_url and unsubscribe_key else None

    def _message(self, to: str, message_key: str, message: Rendered) -> tuple[bytes, mime.Mailbox]:
        """The message's bytes (multipart/alternative: the plain text, then the HTML) and its
        recipient."""
        content = message.content
        if not isinstance(content, EmailContent):
            raise ProviderPermanentError(self.name, f"not an email: {message.channel}", deactivate_address=False)
        rcpt = mime.mailbox("To", to)
        headers = [
            self._from.header,
            rcpt.header,
            mime.subject(content.subject),
            mime.date(int(time.time())),
            mime.header("Message-ID", message_id(message_key)),
            mime.header("X-Notify-Message-Key", message_key),
        ]
        user = message.context.user_id
        if self._unsubscribe is not None and message.context.kind is Category.MARKETING and user:
            links = unsubscribe.headers(*self._unsubscribe, user)
            headers += (mime.header(name, value) for name, value in links.items())
        headers.append(mime.header("Content-Language", message.locale))
        return mime.alternative(headers, content.text, content.html), rcpt

    def _pool(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._slots is None or self._loop is not loop:
            self._slots, self._loop, self._idle = asyncio.Semaphore(self._pool_size), loop, []
        return self._slots

    async def _connect(self) -> aiosmtplib.SMTP:
        smtp = aiosmtplib.SMTP(
            hostname=self.host,
            port=self.port,
            timeout=self._timeout_s,
            use_tls=self._implicit_tls,
            start_tls=False,
            tls_context=self._tls if self._implicit_tls else None,
        )
        await smtp.connect()
        try:
            await smtp.ehlo()
            if self._starttls:
                if not smtp.supports_extension("starttls"):
                    raise ProviderRetryableError(self.name, "the SMTP server offers no STARTTLS")
                await smtp.starttls(tls_context=self._tls)
            if self._username:
                await smtp.login(self._username, self._password.get_secret_value() if self._password else "")
        except BaseException:
            smtp.close()
            raise
        return smtp

    def _take_idle(self) -> tuple[aiosmtplib.SMTP, bool] | None:
        now = time.monotonic()
        while self._idle:
            smtp, since, refused = self._idle.pop()
            if smtp.is_connected and now - since < IDLE_S:
                return smtp, refused
            smtp.close()
        return None

    async def _session(self) -> aiosmtplib.SMTP:
        """An open session: the newest idle one (reset first if its last message was refused:
        one that fails its RSET is closed and the next tried), or a new one."""
        while (taken := self._take_idle()) is not None:
            smtp, refused = taken
            if not refused:
                return smtp
            try:
                await smtp.rset()
                return smtp
            except (aiosmtplib.SMTPException, OSError):
                smtp.close()
            except BaseException:
                smtp.close()
                raise
        return await self._connect()

    async def _try_send(self, *, to: str, message_key: str, message: Rendered) -> str | None:
        data, rcpt = self._message(to, message_key, message)
        options = ["SMTPUTF8"] if rcpt.utf8 or self._from.utf8 else []  # refused where not offered
        async with self._pool():
            smtp: aiosmtplib.SMTP | None = None
            try:
                smtp = await self._session()
                await smtp.sendmail(self._from.addresses[0], list(rcpt.addresses), data, mail_options=options)
            except BaseException as exc:
                if smtp is not None:
                    if _refused_by_reply(exc) and smtp.is_connected:
                        self._idle.append((smtp, time.monotonic(), True))
                    else:
                        smtp.close()  # whatever state it is in: never reused
                self._raise(exc)
                raise
            self._idle.append((smtp, time.monotonic(), False))
        return message_id(message_key)

    def _raise(self, exc: BaseException) -> None:
        """A library error as the provider's; returns for what is not one (a cancellation)."""
        if isinstance(exc, ProviderRetryableError | ProviderPermanentError):
            return
        if isinstance(exc, aiosmtplib.SMTPRecipientsRefused):
            refused = exc.recipients[0]
            self._fail(refused.code, refused.message, address_at_fault=True)
        if isinstance(exc, aiosmtplib.SMTPResponseException) and not isinstance(
            exc, aiosmtplib.SMTPServerDisconnected | aiosmtplib.SMTPConnectError | aiosmtplib.SMTPTimeoutError
        ):  # sender refused, data refused, auth, ...
            self._fail(exc.code, exc.message, address_at_fault=isinstance(exc, aiosmtplib.SMTPRecipientRefused))
        if isinstance(exc, TimeoutError):
            raise ProviderRetryableError(self.name, f"no reply within {self._timeout_s:g} s") from None
        if isinstance(exc, aiosmtplib.SMTPException | OSError | ssl.SSLError):
            cause = _cause(exc)
            if isinstance(cause, ssl.SSLCertVerificationError):
                raise ProviderRetryableError(self.name, "SMTP TLS certificate not verified") from None
            kind = "TLS" if isinstance(cause, ssl.SSLError) else "connection"
            raise ProviderRetryableError(self.name, f"SMTP {kind} failed: {type(cause).__name__}") from None

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for smtp, _, _ in idle:
            try:
                await asyncio.wait_for(smtp.quit(), 1.0)
            except (aiosmtplib.SMTPException, OSError, TimeoutError):
                smtp.close()

    def _fail(self, code: int, text: bytes | str, *, address_at_fault: bool) -> None:
        """Raises the provider's error for an SMTP reply."""
        reason = _reason(code, text)
        if code in AUTH_CODES or not 500 <= code < 600:
            raise ProviderRetryableError(self.name, reason, status_code=code)
        invalid = address_at_fault and self.invalid_recipient.matches_smtp(_enhanced(text))
        raise ProviderPermanentError(self.name, reason, status_code=code, deactivate_address=invalid)
