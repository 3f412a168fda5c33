"""Held receipts on a real SQLite store: kept once, the address encrypted, applied when the message
is recorded as sent, dropped past their time or when their provider is gone."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr

from api.receipts.held import event_of, event_text, held_count, hold, release
from api.receipts.model import ReceiptEvent
from api.receipts.twilio import TwilioReceipts
from api.tables import prepare
from senders.statuses import DeliveryStatus
from senders.store.db import Database
from senders.store.status import open_store
from tests.senders.conftest import CIPHER

DAY_MS = 86_400_000
EVENT = ReceiptEvent(reference="SM1", status=DeliveryStatus.FAILED, kind="undelivered",
                     reason="twilio 30005 undelivered", address="+15550001111", deactivate=True)


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    store = open_store(str(tmp_path / "s.sqlite3"), synchronous="NORMAL")  # the senders' tables
    prepare(store.db)  # the API's
    yield store.db
    store.close()


def test_an_event_is_kept_as_it_came_with_its_address_encrypted() -> None:
    text = event_text(EVENT, CIPHER)
    assert "+15550001111" not in text
    assert event_of(text, CIPHER) == EVENT


def test_a_held_event_stays_until_its_message_is_known_and_is_dropped_after_its_time(db: Database) -> None:
    schemes = {"twilio": TwilioReceipts(SecretStr("tok"), "http://127.0.0.1/webhooks/twilio", "AC1")}
    hold(db, CIPHER, "twilio", EVENT, 1_000)
    hold(db, CIPHER, "twilio", EVENT, 2_000)  # the same event again: one row
    assert held_count(db) == 1
    waiting = release(db, CIPHER, schemes, 1_000 + DAY_MS - 1, DAY_MS)
    assert (waiting.applied, waiting.dropped, waiting.waiting, held_count(db)) == ([], 0, 1, 1)
    gone = release(db, CIPHER, schemes, 1_000 + DAY_MS, DAY_MS)
    assert (gone.applied, gone.dropped, gone.waiting, held_count(db)) == ([], 1, 0, 0)


def test_an_event_of_a_provider_no_longer_configured_is_dropped(db: Database) -> None:
    hold(db, CIPHER, "twilio", EVENT, 1_000)
    out = release(db, CIPHER, {}, 2_000, DAY_MS)
    assert (out.applied, out.dropped, held_count(db)) == ([], 1, 0)
