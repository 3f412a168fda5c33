"""Held receipts on a real store (SQLite and PostgreSQL): kept once, the address encrypted, applied when the message
is recorded as sent, dropped past their time or when their provider is gone."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr

from api.database import StoreAccess
from api.receipts.held import event_of, event_text, held_count, hold, release
from api.receipts.model import ReceiptEvent
from api.receipts.twilio import TwilioReceipts
from api.tables import prepare
from senders.statuses import DeliveryStatus
from senders.store.db import Database
from tests.senders.conftest import CIPHER

DAY_MS = 86_400_000
EVENT = ReceiptEvent(reference="SM1", status=DeliveryStatus.FAILED, kind="undelivered",
                     reason="twilio 30005 undelivered", address="+15550001111", deactivate=True)


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    location = str(tmp_path / "s.sqlite3") if request.param == "sqlite" else request.getfixturevalue("postgres_dsn")
    db = StoreAccess(location).open()  # the senders' tables and the API's
    prepare(db)
    with db.tx() as cur:  # a PostgreSQL store is the session's: this test's rows only
        db.exec(cur, "DELETE FROM api_held_receipt", ())
    yield db
    db.close()


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


def test_events_still_waiting_never_hide_newer_ones(db: Database) -> None:
    """A round reads every held event, a page at a time: the oldest waiting do not keep the rest
    from being looked at (here, every one past its time is dropped in one round of pages of 2)."""
    schemes = {"twilio": TwilioReceipts(SecretStr("tok"), "http://127.0.0.1/webhooks/twilio", "AC1")}
    for n in range(5):
        hold(db, CIPHER, "twilio", ReceiptEvent(reference=f"SM{n}", status=DeliveryStatus.DELIVERED, kind="delivered"),
             1_000 + n)
    waiting = release(db, CIPHER, schemes, 1_002 + DAY_MS, DAY_MS, page=2)
    assert (waiting.dropped, waiting.waiting, held_count(db)) == (3, 2, 2)  # received at 1,000 to 1,002: past
    gone = release(db, CIPHER, schemes, 1_004 + DAY_MS, DAY_MS, page=2)
    assert (gone.dropped, gone.waiting, held_count(db)) == (2, 0, 0)
