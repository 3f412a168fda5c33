"""Receipts that come before their message: held, and applied once the message is recorded.

A provider can call back within milliseconds of accepting a message (Twilio's ``sent`` and
``delivered`` callbacks), sooner than the sender's batch records the send and the provider's id
with it. Twilio does not call again after an error answer, so such an event is not refused: the
webhook keeps it here (one row per provider, provider id and kind; its address encrypted as
contacts are) and answers 200. The process that holds the API's lease applies the held events
every ``api.held_receipts_interval_ms`` through the same ``apply_event`` as the webhook (status,
history, deactivation, opt-out; the change onto the status topic); an event whose message is still
unknown after ``api.held_receipts_ttl_s`` is dropped and counted in the log.

This project's own receipts (scheme ``notify``) are not held: their 404 tells the sender to send
them again, as the API has always answered.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from api.receipts.apply import Applied, apply_event
from api.receipts.model import ReceiptEvent, ReceiptScheme
from senders.errors import SenderError
from senders.profiles.crypto import ContactCipher
from senders.statuses import DeliveryStatus
from senders.store.db import Database

logger = logging.getLogger(__name__)

#: the scheme whose events are refused with 404 when their message is not recorded yet (its senders
#: send again); every other scheme's are held
RESENT_SCHEME = "notify"


def holds(scheme: ReceiptScheme) -> bool:
    """Whether the scheme's events are held rather than refused with 404 (every provider's but
    this project's own receipts, whose senders send again)."""
    return scheme.kind != RESENT_SCHEME


def event_text(event: ReceiptEvent, cipher: ContactCipher) -> str:
    return json.dumps({
        "reference": event.reference, "status": None if event.status is None else event.status.value,
        "kind": event.kind, "reason": event.reason,
        "address": None if event.address is None else cipher.encrypt(event.address),
        "deactivate": event.deactivate, "opt_out": event.opt_out, "message_key": event.message_key,
    }, separators=(",", ":"))


def event_of(text: str, cipher: ContactCipher) -> ReceiptEvent:
    fields = json.loads(text)
    address = fields["address"]
    if address is not None:
        try:
            address = cipher.decrypt(address)
        except SenderError:  # its key is no longer configured: the event goes on without a deactivation
            address = None
    status = fields["status"]
    return ReceiptEvent(
        reference=fields["reference"], status=None if status is None else DeliveryStatus(status), kind=fields["kind"],
        reason=fields["reason"], address=address, deactivate=bool(fields["deactivate"] and address),
        opt_out=bool(fields["opt_out"]), message_key=fields["message_key"],
    )


def hold(db: Database, cipher: ContactCipher, provider: str, event: ReceiptEvent, now_ms: int) -> None:
    """Keep ``event`` until its message is recorded (the same event twice is one row)."""
    kind = event.kind or (event.status.value if event.status is not None else "")
    with db.tx() as cur:
        db.exec(
            cur,
            "INSERT INTO api_held_receipt (provider, provider_ref, kind, event, received_ms) VALUES (?, ?, ?, ?, ?)"
            " ON CONFLICT (provider, provider_ref, kind) DO NOTHING",
            (provider, event.reference, kind, event_text(event, cipher), now_ms),
        )


def held_count(db: Database) -> int:
    with db.tx(write=False) as cur:
        return int(db.exec(cur, "SELECT COUNT(*) FROM api_held_receipt", ()).fetchone()[0])


@dataclass(frozen=True, slots=True)
class Released:
    """One round: the events applied now (their message was recorded), those dropped (past the
    time to live, or of a provider no longer configured) and those still held."""

    applied: list[Applied]
    dropped: int
    waiting: int


def release(
    db: Database, cipher: ContactCipher, schemes: Mapping[str, ReceiptScheme], now_ms: int, ttl_ms: int,
    page: int = 500,
) -> Released:
    """Apply every held event whose message is recorded now, oldest first, ``page`` rows read at a
    time (so events still waiting never hide newer ones); drop those past ``ttl_ms``. Each event's
    steps are idempotent, so an event applied again after a crash between its steps and its row's
    deletion changes nothing."""
    applied: list[Applied] = []
    dropped = waiting = 0
    after: tuple[int, str, str, str] = (-1, "", "", "")
    while True:
        with db.tx(write=False) as cur:
            rows = db.exec(
                cur,
                "SELECT provider, provider_ref, kind, event, received_ms FROM api_held_receipt"
                " WHERE (received_ms, provider, provider_ref, kind) > (?, ?, ?, ?)"
                " ORDER BY received_ms, provider, provider_ref, kind LIMIT ?",
                (*after, page),
            ).fetchall()
        for provider, reference, kind, text, received_ms in rows:
            scheme = schemes.get(provider)
            result = None if scheme is None else apply_event(db, cipher, provider, scheme, event_of(text, cipher),
                                                             now_ms)
            if result is not None and not result.missing:
                applied.append(result)
            elif scheme is not None and received_ms > now_ms - ttl_ms:
                waiting += 1
                continue
            else:
                dropped += 1
            with db.tx() as cur:
                db.exec(cur, "DELETE FROM api_held_receipt WHERE provider = ? AND provider_ref = ? AND kind = ?",
                        (provider, reference, kind))
        if len(rows) < page:
            return Released(applied, dropped, waiting)
        last = rows[-1]
        after = (int(last[4]), str(last[0]), str(last[1]), str(last[2]))
