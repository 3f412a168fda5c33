"""Erasing a user: the one function behind ``DELETE /v1/users/{id}`` and ``dedupctl users erase``.

One transaction removes everything the store keeps of the user (docs/api.md lists it): the
delivery receipts of the user's messages, the job's verdicts on the user's requests, the
idempotency keys and requests the API recorded, the user's entries in campaign segments, then
the profile, its contacts, the status history and the user's limit counters (by exact key).
The order matters: the receipts are found through the status rows, and the verdicts through the
requests, so those go before what finds them.

What is in Kafka (the requests, channel messages and statuses in their topics) stays until the
topics' retention removes it; a campaign that has not reached an erased user skips the entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from senders.profiles.crypto import ContactCipher
from senders.store.db import Database
from senders.store.profiles import ProfileStore


@dataclass(frozen=True, slots=True)
class Erasure:
    """What was removed of one user."""

    profile: bool
    contacts: int
    statuses: int
    limit_counters: int
    requests: int
    idempotency_keys: int
    verdicts: int
    receipts: int
    campaign_entries: int

    @property
    def anything(self) -> bool:
        return any((self.profile, self.statuses, self.limit_counters, self.requests, self.idempotency_keys,
                    self.verdicts, self.receipts, self.campaign_entries))


def _count(db: Database, cur: Any, text: str, params: tuple[Any, ...]) -> int:
    return max(0, int(db.exec(cur, text, params).rowcount))


def erase_user(db: Database, cipher: ContactCipher, user_id: str) -> Erasure:
    """Remove everything of ``user_id`` (an id checked by ``senders.profiles.user_id``); the
    API's tables must exist (``api.tables.prepare``)."""
    with db.tx() as cur:
        receipts = _count(db, cur, "DELETE FROM api_receipt WHERE message_key IN"
                          " (SELECT message_key FROM delivery_status WHERE user_id = ?)", (user_id,))
        mine = "(SELECT notification_id FROM api_request WHERE user_id = ?)"
        verdicts = _count(db, cur, f"DELETE FROM api_outcome WHERE user_id = ? OR notification_id IN {mine}"
                          f" OR original_id IN {mine}", (user_id, user_id, user_id))
        keys = _count(db, cur, "DELETE FROM api_idempotency WHERE user_id = ?", (user_id,))
        requests = _count(db, cur, "DELETE FROM api_request WHERE user_id = ?", (user_id,))
        entries = _count(db, cur, "DELETE FROM api_campaign_user WHERE user_id = ?", (user_id,))
        erased = ProfileStore(db, cipher).erase_rows(cur, user_id)
    return Erasure(erased.profile, erased.contacts, erased.statuses, erased.limit_counters, requests, keys, verdicts,
                   receipts, entries)
