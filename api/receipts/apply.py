"""A verified receipt's events into the store, through the senders' own store functions (runs in
the API's store thread): the message found by the provider's id moves from sent to delivered or
failed once (``StatusStore.apply_receipt``), the receipt is kept in the message's history, an
address the event says cannot take messages is deactivated (``StatusStore.deactivate``, as a
provider's answer to a send does) and a complaint opts the user out of marketing on the channel
(``ProfileStore.apply_preferences``, as ``PUT /v1/users/{id}/preferences`` does).

Each step is idempotent: the provider sends a receipt again when it had no 2xx, and the same
receipt again changes nothing, but deactivates and opts out again (a no-op) in case the process
stopped between the steps the first time.

Only an address of the message's own user is deactivated (the one the event names, compared as
the provider may have changed its case): a provider's event cannot silence anybody else.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from api.receipts.model import ReceiptEvent, ReceiptScheme
from api.store import record_receipt
from operators.records import Channel
from senders.errors import SenderError
from senders.profiles.crypto import ContactCipher
from senders.profiles.model import normalize_address
from senders.store.db import Database
from senders.store.profiles import ProfileStore
from senders.store.status import StatusRow, StatusStore

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Applied:
    """What one event did.

    :param row: the message as it is now (None: no message of the provider has the id, or the
        event is acknowledged only)
    :param changed: this event moved its status
    :param missing: the event names a message this store does not (yet) have
    """

    event: ReceiptEvent
    row: StatusRow | None = None
    changed: bool = False
    missing: bool = False


def _same(channel: Channel, a: str, b: str) -> bool:
    x, y = normalize_address(channel, a), normalize_address(channel, b)
    return x.casefold() == y.casefold() if channel is Channel.EMAIL else x == y


def _owned(db: Database, cipher: ContactCipher, row: StatusRow, address: str) -> list[str]:
    """The addresses of the message's user on its channel that ``address`` names."""
    if not row.user_id:
        return []
    try:
        profile = ProfileStore(db, cipher).get(row.user_id)
    except SenderError as exc:  # a contact no configured key decrypts
        logger.warning("the profile of %s cannot be read for a receipt: %s", row.message_key, type(exc).__name__)
        return []
    if profile is None:
        return []
    return [c.address for c in profile.contacts.of(row.channel) if _same(row.channel, c.address, address)]


def apply_event(
    db: Database, cipher: ContactCipher, provider: str, scheme: ReceiptScheme, event: ReceiptEvent, now_ms: int
) -> Applied:
    if event.status is None:
        return Applied(event)
    statuses = StatusStore(db)
    if event.message_key is not None:
        mine = statuses.get(event.message_key)
        if mine is not None and (mine.provider != provider or mine.provider_ref != event.reference):
            logger.warning("a receipt of %s names %s, which it did not send as that id: ignored", provider,
                           event.message_key)
            return Applied(event)
    row, changed = statuses.apply_receipt(provider, event.reference, event.status, event.reason, now_ms)
    if row is None:
        return Applied(event, missing=True)
    record_receipt(db, provider, event.reference, event.kind or event.status.value, row.message_key, event.reason,
                   now_ms)
    channel_fits = scheme.channel is None or scheme.channel is row.channel
    if event.deactivate and event.address and channel_fits:
        for address in _owned(db, cipher, row, event.address):
            if statuses.deactivate(row.channel, address, event.reason or event.kind, now_ms):
                logger.info("a %s receipt deactivated a %s address of %s", provider, row.channel.value,
                            row.message_key)
    if event.opt_out and row.user_id and channel_fits:
        ProfileStore(db, cipher).apply_preferences(row.user_id, {"marketing": {row.channel.value: False}})
        logger.info("a %s complaint opted the user of %s out of marketing %s", provider, row.message_key,
                    row.channel.value)
    return Applied(event, row, changed)


def apply_events(
    db: Database, cipher: ContactCipher, provider: str, scheme: ReceiptScheme, events: list[ReceiptEvent],
    now_ms: int,
) -> list[Applied]:
    return [apply_event(db, cipher, provider, scheme, e, now_ms) for e in events]


def status_record(row: StatusRow, now_ms: int) -> dict[str, Any]:
    """The receipt's change as the senders' status records say it (no address, no params)."""
    t = row.template
    return {
        "message_key": row.message_key, "notification_id": row.notification_id, "channel": row.channel.value,
        "lane": row.lane.value, "status": row.status.value, "attempt": row.attempts, "provider": row.provider,
        "error": None, "retry_at": None, "at": now_ms, "reason": row.reason, "not_before": None,
        "template": t.name if t else None, "template_version": t.version if t else None,
        "locale": t.locale if t else None,
    }
