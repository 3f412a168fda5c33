"""One erase (issue 20): ``DELETE /v1/users/{id}`` and ``dedupctl users erase`` remove everything
of a user, by exact key, on SQLite and on PostgreSQL. Two users whose ids share a prefix (``a``
and ``a:b``) are seeded in every table, by the functions that write them in production (the
senders' claims with their limit units, the API's reservations and requests, the job's verdicts
from its topics, receipts, campaigns); erasing ``a`` leaves nothing of ``a`` and all of ``a:b``.

On the code before the change: ``a``'s erase took ``a:b``'s marketing limit units (an unescaped
prefix), left the campaign segment rows, and the command left the API's requests, keys,
verdicts and receipts (and removed the status rows the API's erase needed to find receipts)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from api import campaigns
from api.database import StoreAccess
from api.erase import erase_user
from api.idempotency import complete_keys, reserve_key
from api.store import Outcome, RequestRecord, record_outcomes, record_receipt
from api.tables import prepare
from dedupctl.cli import main
from harness.settings_file import write_settings
from operators.records import Category, Channel
from senders.policy.transitions import OutcomePlan
from senders.policy.verdict import RuleVerdict
from senders.rules.limits import marketing_claim, one_time_code_claims
from senders.rules.options import RuleOptions
from senders.statuses import DeliveryStatus, Lane
from senders.store.db import Database
from senders.store.profiles import ProfileStore
from senders.store.status import StatusStore
from settings import Settings
from tests.senders.conftest import CIPHER, CONTACT_KEYS, address_of, profile_of, store_location  # noqa: F401

UTC = ZoneInfo("UTC")
NOW = int(time.time() * 1000)
USERS = ("a", "a:b")


def seed(db: Database, user: str, n: int) -> None:
    """Everything a user can have in the store, as production writes it."""
    ProfileStore(db, CIPHER).put(user, profile_of(f"u{n}", (Channel.SMS, Channel.EMAIL)))
    address = ProfileStore(db, CIPHER).read(user).contacts.sms[0].address
    store = StatusStore(db)
    nid, dedup = f"n-{n}", f"shop/evt-{n}"
    otp = one_time_code_claims([CIPHER.lookup_hash(Channel.SMS, address)], f"{dedup}:sms:1", NOW, RuleOptions())
    sale = marketing_claim(user, f"camp-{n}", UTC, NOW, RuleOptions())
    assert sale is not None
    for key, claims in ((f"{dedup}:sms:1", otp), (f"camp/{n}:{user}:sms:1", (sale,))):
        store.claim(message_key=key, notification_id=nid if key.startswith("shop") else f"camp-{n}",
                    channel=Channel.SMS, lane=Lane.NORMAL, attempt=1, now_ms=NOW, lease_ms=60_000, owner="w",
                    user_id=user, rules=lambda counts, first, c=claims: RuleVerdict(consume=c), limits=claims)
        store.finish(message_key=key, attempt=1, owner="w", plan=OutcomePlan(DeliveryStatus.SENT), provider="p",
                     error=None, now_ms=NOW, provider_ref=f"ref-{key}")
        record_receipt(db, "p", f"ref-{key}", "delivered", key, None, NOW)
    reserve_key(db, f"shop/evt-{n}", "fp", nid, user, NOW, 60_000, 10_000)
    complete_keys(db, [(f"shop/evt-{n}", {"id": nid}, RequestRecord(
        nid, dedup, user, "otp", ("sms",), "high", "shop", NOW, NOW, 0, n))])
    record_outcomes(db, [
        Outcome(f"dup-{n}", "duplicate", dedup, None, nid, 2, None, None, NOW),  # the job names no user
        Outcome(f"late-{n}", "late", f"k-{n}", user, None, None, NOW, "late", NOW),
    ])


def counts(db: Database, user: str, n: int) -> dict[str, int]:
    """The rows of ``user`` (seeded as number ``n``) in every table."""
    marketing = marketing_claim(user, "x", UTC, NOW, RuleOptions())
    assert marketing is not None
    otp = one_time_code_claims([CIPHER.lookup_hash(Channel.SMS, address_of(f"u{n}", Channel.SMS))], "x", NOW,
                               RuleOptions())[0]
    messages = (f"shop/evt-{n}:sms:1", f"camp/{n}:{user}:sms:1")
    queries = {
        "user_profile": ("SELECT COUNT(*) FROM user_profile WHERE user_id = ?", (user,)),
        "user_contact": ("SELECT COUNT(*) FROM user_contact WHERE user_id = ?", (user,)),
        "delivery_status": ("SELECT COUNT(*) FROM delivery_status WHERE user_id = ?", (user,)),
        "marketing units": ("SELECT COUNT(*) FROM limit_unit WHERE counter_key = ?", (marketing.key,)),
        "marketing counters": ("SELECT COUNT(*) FROM limit_counter WHERE counter_key = ?", (marketing.key,)),
        "otp units": ("SELECT COUNT(*) FROM limit_unit WHERE counter_key = ?", (otp.key,)),
        "otp counters": ("SELECT COUNT(*) FROM limit_counter WHERE counter_key = ?", (otp.key,)),
        "api_receipt": ("SELECT COUNT(*) FROM api_receipt WHERE message_key IN (?, ?)", messages),
        "api_idempotency": ("SELECT COUNT(*) FROM api_idempotency WHERE user_id = ?", (user,)),
        "api_request": ("SELECT COUNT(*) FROM api_request WHERE user_id = ?", (user,)),
        "api_outcome": ("SELECT COUNT(*) FROM api_outcome WHERE notification_id IN (?, ?)", (f"dup-{n}", f"late-{n}")),
        "api_campaign_user": ("SELECT COUNT(*) FROM api_campaign_user WHERE user_id = ?", (user,)),
    }
    out = {}
    with db.tx(write=False) as cur:
        for name, (text, params) in queries.items():
            out[name] = int(db.exec(cur, text, params).fetchone()[0])
    return out


@pytest.fixture
def seeded(store_location: str) -> Iterator[Database]:  # noqa: F811 - the fixture
    db = StoreAccess(store_location).open()
    prepare(db)
    for n, user in enumerate(USERS):
        seed(db, user, n)
    c = campaigns.Campaign("camp-1", "growth", "eid_sale", {"pct": "20"}, ("sms",), Category.MARKETING, 10.0,
                           NOW, "scheduled", 3, 0, NOW, NOW)
    campaigns.create(db, c, ["a", "a:b", "c"])
    yield db
    db.close()


def test_erasing_a_takes_everything_of_a_and_nothing_of_a_b(seeded: Database) -> None:
    db = seeded
    full = counts(db, "a", 0)
    assert all(v > 0 for v in full.values()), full  # the seed reached every table
    other = counts(db, "a:b", 1)
    assert all(v > 0 for v in other.values()), other

    done = erase_user(db, CIPHER, "a")
    assert counts(db, "a", 0) == dict.fromkeys(full, 0)
    assert counts(db, "a:b", 1) == other
    assert (done.profile, done.contacts, done.statuses, done.requests, done.idempotency_keys, done.receipts,
            done.campaign_entries, done.verdicts, done.limit_counters) == (True, 2, 2, 1, 1, 2, 1, 2, 2)
    # the campaign goes on without a: its other users are still there, in order
    assert campaigns.users_from(db, "camp-1", 0, 10) == [(1, "a:b"), (2, "c")]
    again = erase_user(db, CIPHER, "a")
    assert not again.anything


def test_the_command_erases_the_same(seeded: Database, store_location: str, tmp_path: Path,  # noqa: F811
                                     capsys: pytest.CaptureFixture[str]) -> None:
    cfg = Settings().with_overrides(senders={"status_store": store_location, **CONTACT_KEYS})
    config = write_settings(cfg, tmp_path / "cfg.toml")
    other = counts(seeded, "a:b", 1)
    assert main(["--config", str(config), "users", "erase", "a"]) == 0
    out = capsys.readouterr().out
    assert "profile erased, 2 contact(s), 2 status row(s), 2 limit counter(s), 1 API request(s)" in out
    assert "1 idempotency key(s), 2 verdict(s), 2 receipt(s), 1 campaign entry" in out
    assert counts(seeded, "a", 0) == dict.fromkeys(other, 0)
    assert counts(seeded, "a:b", 1) == other
    assert main(["--config", str(config), "users", "erase", "a"]) == 3  # nothing left


@pytest.mark.parametrize("bad", ["", " a", "a ", "a\x00b", "a/b", "a\nb", "x" * 513, "é" * 257])
def test_the_command_takes_user_ids_by_the_one_rule(bad: str, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    cfg = Settings().with_overrides(senders={"status_store": str(tmp_path / "s.sqlite3"), **CONTACT_KEYS})
    config = write_settings(cfg, tmp_path / "cfg.toml")
    for command in ("erase", "get"):
        assert main(["--config", str(config), "users", command, bad]) == 2
        assert "user id: a user id" in capsys.readouterr().err
