"""The SMTP provider stub: aiosmtpd, accepting every message ``latency`` after its DATA. A call
is one message (DATA), counted on the ``email`` channel by its ``Message-ID``; the message key
the senders put in ``X-Notify-Message-Key`` is kept beside it, for the claim-to-provider times.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from aiosmtpd.smtp import SMTP, Envelope, Session

from bench.stubs.http import StubState

CHANNEL = "email"
_MESSAGE_ID = re.compile(rb"^message-id:[ \t]*([^\r\n]*)", re.IGNORECASE | re.MULTILINE)
_MESSAGE_KEY = re.compile(rb"^x-notify-message-key:[ \t]*([^\r\n]*)", re.IGNORECASE | re.MULTILINE)


def header(content: bytes, pattern: re.Pattern[bytes]) -> str | None:
    head = content.split(b"\r\n\r\n", 1)[0]
    found = pattern.search(head)
    return found.group(1).strip().decode("utf-8", "replace") if found else None


class StubHandler:
    """aiosmtpd's handler: every message accepted after the latency."""

    def __init__(self, state: StubState) -> None:
        self.state = state

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:  # noqa: N802 - aiosmtpd's hook
        content = envelope.original_content or b""
        if isinstance(content, str):
            content = content.encode("utf-8", "replace")
        tally = self.state.tally(CHANNEL)
        tally.arrive(header(content, _MESSAGE_ID), self.state.clock(), header(content, _MESSAGE_KEY))
        try:
            if self.state.latency_s > 0:
                await asyncio.sleep(self.state.latency_s)
        finally:
            tally.answered()
        return "250 2.0.0 OK: queued"


class StubSmtp(SMTP):
    """aiosmtpd's session, counting connections like the HTTP stub."""

    def __init__(self, handler: StubHandler, **options: Any) -> None:
        super().__init__(handler, hostname="stub.invalid", ident="notify-dedup bench stub", **options)
        self._state = handler.state

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._state.opened()
        super().connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._state.connections -= 1
        super().connection_lost(exc)
