"""A provider behind an HTTP API: POST JSON, the message key as the idempotency key.

http.client, not urllib: a redirect is an answer, never followed (urllib re-sends a POST as a GET,
``Authorization`` included, to wherever the ``Location`` points, and reports that host's 2xx as
sent). TLS is verified against the system's CAs or ``ca_file``. Each send has one deadline.
"""

from __future__ import annotations

import base64
import http.client
import json
import math
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from urllib.parse import unquote, urlsplit

from pydantic import SecretStr

from operators.errors import ConfigError
from senders.errors import ProviderPermanentError, ProviderRetryableError
from senders.policy.recipients import RecipientRules
from senders.providers.base import Provider
from senders.providers.deadline import deadline
from senders.providers.tls import tls_context
from senders.runtime.metrics import Metrics
from senders.templates.render import Rendered

IDEMPOTENCY_HEADER = "Idempotency-Key"
#: the most of a reply body read (for its ``id``); the rest is not needed
MAX_BODY = 64 * 1024
#: the longest provider message id kept (a longer one is no id of ours to look up)
MAX_REFERENCE = 256

#: 4xx replies that are retried (the contract: 2xx sent, 408/425/429/5xx/timeout transient,
#: other 4xx permanent)
RETRYABLE_4XX = frozenset({408, 425, 429})
#: the answers of this project's HTTP contract that say the address itself is invalid
DEFAULT_INVALID_RECIPIENT = "400:invalid_recipient,404:invalid_recipient,410"


@dataclass(frozen=True, slots=True)
class HttpReply:
    status: int
    headers: Mapping[str, str]
    body: bytes


def retry_after_s(value: str, now_s: float | None = None) -> float | None:
    """A Retry-After header: seconds, or an HTTP date; anything else (inf, nan, negative,
    words) is no hint. Bounding a long hint is the retry policy's job."""
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            return None
        return max(0.0, when.timestamp() - (time.time() if now_s is None else now_s))
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def _retry_after_s(headers: Mapping[str, str]) -> float | None:
    for name, value in headers.items():
        if name.lower() == "retry-after":
            return retry_after_s(value)
    return None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError):
        return "TLS certificate not verified"
    if isinstance(exc, ssl.SSLError):
        return f"TLS failed: {type(exc).__name__}"
    return f"connection failed: {type(exc).__name__}"


class HttpProvider(Provider):
    """``POST <url>`` with ``{"message_key", "channel", "to", "template", "template_version",
    "locale", ...}`` and the rendered parts (push: ``title``, ``body``; SMS: ``text``,
    ``encoding``, ``segments``; email: ``subject``, ``text``, ``html``).

    2xx: sent; ``id`` (or ``message_id``) of a JSON reply is the provider's message id, recorded
    with the status so that its delivery receipts find the message. 408, 425, 429, 5xx, a timeout or a
    connection error: transient (Retry-After honoured). 3xx: permanent (the URL is wrong: not
    followed). Any other 4xx: permanent. Only an answer of ``invalid_recipient`` (by default
    ``410``, or 400/404 whose body says ``invalid_recipient``) deactivates the address: a wrong
    URL's 404 or a rejected credential must not silence every address it meets.
    ``user:password@`` in the URL is sent as Basic authentication (unless a bearer ``token`` is
    set) and shown nowhere.
    """

    deadline_setting = "http_timeout_ms"

    def __init__(
        self,
        *,
        name: str,
        url: str,
        timeout_s: float,
        token: SecretStr | None = None,
        ca_file: str | None = None,
        invalid_recipient: RecipientRules | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        super().__init__(name=name, metrics=metrics)
        self.invalid_recipient = invalid_recipient or RecipientRules.parse(DEFAULT_INVALID_RECIPIENT)
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"provider {name}: not an http(s) URL")
        self.timeout_s: float = timeout_s
        self._timeout_s = timeout_s
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._token = token
        self._basic = (
            SecretStr(base64.b64encode(f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()).decode())
            if parts.username
            else None
        )
        self._tls = tls_context(ca_file) if self._https else None

    def __repr__(self) -> str:
        return f"HttpProvider({self.name!r})"

    def _connection(self, timeout_s: float) -> http.client.HTTPConnection:
        if self._tls is not None:
            return http.client.HTTPSConnection(self._host, self._port, timeout=timeout_s, context=self._tls)
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout_s)

    def _post(self, body: bytes, headers: dict[str, str]) -> HttpReply:
        conn = self._connection(self._timeout_s)
        late = ProviderRetryableError(self.name, f"no reply within {self._timeout_s:g} s")
        with deadline(self._timeout_s, lambda: conn.sock) as d:
            try:
                conn.request("POST", self._target, body=body, headers=headers)
                resp = conn.getresponse()
                reply = HttpReply(resp.status, dict(resp.getheaders()), resp.read(MAX_BODY))
                cut_short = d.cut  # read before the cut: a whole reply
            except (OSError, http.client.HTTPException) as exc:
                if d.passed or isinstance(exc, TimeoutError):
                    raise late from None
                raise ProviderRetryableError(self.name, _reason(exc)) from None
            finally:
                conn.close()
        if cut_short:
            raise late  # what was read after the cut may parse, but it is no reply
        return reply

    def _try_send(self, *, to: str, message_key: str, message: Rendered) -> str | None:
        body = json.dumps(
            {
                "message_key": message_key,
                "channel": message.channel.value,
                "to": to,
                "template": message.template,
                "template_version": message.version,
                "locale": message.locale,
                **message.fields(),
            },
            ensure_ascii=False,
        ).encode("utf-8")
        headers = {"Content-Type": "application/json", IDEMPOTENCY_HEADER: message_key}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token.get_secret_value()}"
        elif self._basic is not None:
            headers["Authorization"] = f"Basic {self._basic.get_secret_value()}"
        reply = self._post(body, headers)
        status = reply.status
        if 200 <= status < 300:
            return self._reference(reply.body)
        reason = f"HTTP {status}"  # never the body: it may echo the address
        if 300 <= status < 400:
            raise ProviderPermanentError(
                self.name, f"{reason} (a redirect: not followed)", status_code=status, deactivate_address=False
            )
        if status in RETRYABLE_4XX or not 400 <= status < 500:
            raise ProviderRetryableError(
                self.name, reason, status_code=status, retry_after_s=_retry_after_s(reply.headers)
            )
        raise ProviderPermanentError(
            self.name,
            reason,
            status_code=status,
            deactivate_address=self.invalid_recipient.matches_http(status, reply.body),
        )

    @staticmethod
    def _reference(body: bytes) -> str | None:
        try:
            parsed = json.loads(body) if body else None
        except ValueError:
            return None
        if not isinstance(parsed, dict):
            return None
        ref = parsed.get("id", parsed.get("message_id"))
        if isinstance(ref, bool) or not isinstance(ref, str | int) or not str(ref) or len(str(ref)) > MAX_REFERENCE:
            return None
        return str(ref)
