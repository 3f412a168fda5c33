"""Profiles in the store (SQLite and a real PostgreSQL): contacts encrypted at rest and found by
the keyed hash, the HTTP API's updates, erasure, key rotation, and ``dedupctl users``."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from dedupctl.cli import main as dedupctl
from operators.errors import ConfigError
from operators.records import Channel
from senders.policy.verdict import RuleVerdict
from senders.profiles.crypto import ContactCipher, generate_key
from senders.profiles.model import parse_profile
from senders.records import TemplateRef
from senders.runtime.pool import contact_cipher
from senders.statuses import DeliveryStatus, Lane
from senders.store.profiles import ProfileCache, ProfileStore
from senders.store.status import StatusStore, open_store
from settings import Settings

DOC = {
    "locale": "bn", "tz": "Asia/Dhaka", "quiet_hours": {"from": "22:00", "to": "08:00"},
    "marketing": {"push": True, "sms": True, "email": False},
    "contacts": {"push": ["tok-1"], "sms": ["+8801711000001"], "email": ["a@example.com"]},
}
KEYS = (generate_key(), generate_key())


@pytest.fixture
def store(store_location: str) -> StatusStore:
    return open_store(store_location, synchronous="NORMAL")


def _profiles(store: StatusStore, enc: list[str] | None = None, look: list[str] | None = None) -> ProfileStore:
    return ProfileStore(store.db, ContactCipher(enc or [KEYS[0]], look or [KEYS[1]]))


def _stored(store: StatusStore) -> list[tuple[str, str]]:
    with store.db.tx(write=False) as cur:
        return [(r[0], r[1]) for r in store.db.exec(cur, "SELECT address_enc, address_hash FROM user_contact")]


def test_a_profile_round_trips_with_its_contacts_encrypted_at_rest(store: StatusStore) -> None:
    profiles = _profiles(store)
    profiles.put("u-1", parse_profile(DOC))
    assert profiles.get("u-1") == parse_profile(DOC)
    rows = _stored(store)
    assert len(rows) == 3
    text = json.dumps(rows)
    for address in ("tok-1", "+8801711000001", "a@example.com", "8801711000001"):
        assert address not in text
    assert profiles.users_with(Channel.SMS, "+8801711000001") == ["u-1"]
    assert profiles.users_with(Channel.EMAIL, "A@Example.com") == ["u-1"]  # emails compare in lower case
    assert profiles.get("u-nobody") is None
    read = profiles.read("u-nobody")
    assert not read.exists and read.contacts.active(Channel.SMS) == ()


def test_updates_of_the_http_api(store: StatusStore) -> None:
    profiles = _profiles(store)
    profiles.put("u-1", parse_profile(DOC))
    after = profiles.apply_preferences("u-1", {"marketing": {"sms": False}, "quiet_hours": None})
    assert (after.marketing.sms, after.marketing.email, after.quiet_hours) == (False, False, None)
    profiles.add_device("u-1", "tok-2", "ios")
    contacts = profiles.apply_contacts("u-1", {"email": ["b@example.com"]}).contacts
    assert [c.address for c in contacts.push] == ["tok-1", "tok-2"] and contacts.push[1].platform == "ios"
    assert [c.address for c in contacts.email] == ["b@example.com"]
    assert profiles.get("u-1") == profiles.apply_contacts("u-1", {})


def test_erase_removes_the_profile_contacts_status_history_and_limit_units(store: StatusStore) -> None:
    profiles = _profiles(store)
    profiles.put("u-1", parse_profile(DOC))
    profiles.put("u-2", parse_profile({"contacts": {"sms": ["+15550000002"]}}))
    for key, user in (("a:sms:1", "u-1"), ("b:sms:1", "u-2")):
        store.claim(message_key=key, notification_id="n", channel=Channel.SMS, lane=Lane.NORMAL, attempt=1,
                    now_ms=1, lease_ms=10, owner="w", user_id=user)
    otp = f"otp:{profiles.cipher.lookup_hash(Channel.SMS, '+8801711000001')}:0"
    with store.db.tx() as cur:
        for counter in ("marketing:u-1:2026-12-01", otp, "marketing:u-2:2026-12-01"):
            store.db.exec(cur, "INSERT INTO limit_unit (counter_key, unit, expires_ms) VALUES (?, 'x', 9)", (counter,))
    erased = profiles.erase("u-1")
    assert (erased.profile, erased.contacts, erased.statuses) == (True, 3, 1)
    assert profiles.get("u-1") is None and store.get("a:sms:1") is None
    assert store.get("b:sms:1") is not None and profiles.get("u-2") is not None  # the others stay
    assert store.limit_units("marketing:u-1:2026-12-01") == [] and store.limit_units(otp) == []
    assert store.limit_units("marketing:u-2:2026-12-01") == ["x"]


def test_key_rotation_reencrypts_and_rehashes_then_the_old_keys_go(store: StatusStore) -> None:
    old = _profiles(store)
    old.put("u-1", parse_profile(DOC))
    new_enc, new_look = generate_key(), generate_key()
    both = _profiles(store, [new_enc, KEYS[0]], [new_look, KEYS[1]])
    assert both.get("u-1") == parse_profile(DOC)  # old values still open
    assert both.users_with(Channel.SMS, "+8801711000001") == ["u-1"]  # found under the old hash too
    assert both.rotate() == 3 and both.rotate() == 0
    only_new = _profiles(store, [new_enc], [new_look])
    assert only_new.get("u-1") == parse_profile(DOC)
    assert only_new.users_with(Channel.SMS, "+8801711000001") == ["u-1"]
    with pytest.raises(Exception, match="cannot be decrypted"):
        old.get("u-1")


def test_the_senders_refuse_to_start_without_contact_keys() -> None:
    with pytest.raises(ConfigError, match="senders.contact_encryption_keys and senders.contact_lookup_keys"):
        contact_cipher(Settings())


def test_dedupctl_users_put_get_erase(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    config = tmp_path / "c.toml"
    config.write_text(
        f'data_dir = "{tmp_path}"\n[senders]\ncontact_encryption_keys = "{KEYS[0]}"\n'
        f'contact_lookup_keys = "{KEYS[1]}"\n'
    )
    doc = tmp_path / "p.json"
    doc.write_text(json.dumps(DOC))
    caplog.set_level(logging.DEBUG)
    base = ["--config", str(config), "users"]
    assert dedupctl([*base, "put", "u-1", str(doc)]) == 0
    assert dedupctl([*base, "get", "u-1"]) == 0
    out = capsys.readouterr().out
    shown = json.loads(out[out.index("{"):])
    assert shown["contacts"]["sms"][0]["address"] == "+8801711000001"  # an operator asked for them
    doc.write_text(json.dumps({**DOC, "tz": "Mars/Olympus", "contacts": {"sms": ["01711"]}}))
    assert dedupctl([*base, "put", "u-1", str(doc)]) == 2
    err = capsys.readouterr().err
    assert "tz: a time zone is UTC or an IANA Area/Location name" in err and "contacts.sms[0]" in err and "01711" not in err
    assert dedupctl([*base, "erase", "u-1"]) == 0
    assert dedupctl([*base, "get", "u-1"]) == 3
    for record in caplog.records:  # never in a log
        assert "+8801711000001" not in record.getMessage() and "a@example.com" not in record.getMessage()


def test_dedupctl_senders_status_json_shows_the_rule_and_its_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "c.toml"
    config.write_text(f'data_dir = "{tmp_path}"\n')
    store = open_store(str(tmp_path / "senders" / "status.sqlite3"))
    verdict = RuleVerdict(DeliveryStatus.DEFERRED, "quiet_hours", 7_200_000, template=TemplateRef("eid_sale", 1, "bn"))
    store.claim(message_key="k:push:1", notification_id="n-3", channel=Channel.PUSH, lane=Lane.NORMAL, attempt=1,
                now_ms=1_000, lease_ms=10, owner="w", user_id="u-amina", rules=lambda counts, first: verdict)
    assert dedupctl(["--config", str(config), "senders", "status", "k:push:1", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert {k: shown[k] for k in ("status", "reason", "not_before", "attempts", "provider", "template",
                                  "template_version", "locale")} == {
        "status": "deferred", "reason": "quiet_hours", "not_before": 7_200_000, "attempts": 1, "provider": None,
        "template": "eid_sale", "template_version": 1, "locale": "bn",
    }
    assert dedupctl(["--config", str(config), "senders", "status", "k:push:1"]) == 0
    assert "deferred: quiet_hours until 1970-01-01T02:00:00.000Z" in capsys.readouterr().out


def test_put_many_in_groups_keeps_registrations_and_applies_a_user_given_twice_in_order(store: StatusStore) -> None:
    clock = iter(range(1_000, 10**9, 1_000))
    profiles = ProfileStore(store.db, ContactCipher([KEYS[0]], [KEYS[1]]), clock_ms=lambda: next(clock))
    sms = {"contacts": {"sms": ["+15550001234"]}}
    profiles.put("u-1", parse_profile(sms))
    first = profiles.read("u-1").registered_ms[(Channel.SMS, "+15550001234")]
    # 1,200 users in one call (groups of PUT_GROUP), u-1 among them with the same address: kept
    batch = [(f"v-{i}", parse_profile({"contacts": {"email": [f"v{i}@example.com"]}})) for i in range(1_200)]
    profiles.put_many([*batch[:700], ("u-1", parse_profile({**sms, "locale": "bn"})), *batch[700:]])
    assert profiles.read("u-1").registered_ms[(Channel.SMS, "+15550001234")] == first
    assert profiles.get("u-1") == parse_profile({**sms, "locale": "bn"})
    assert all(profiles.get(u) == p for u, p in batch[::97]) and profiles.get("v-1199") == batch[-1][1]
    assert profiles.users_with(Channel.EMAIL, "v1199@example.com") == ["v-1199"]
    # the same user twice in one batch: dropped, then given again, as one put after another would
    profiles.put_many([("u-1", parse_profile({})), ("u-2", parse_profile({})), ("u-1", parse_profile(sms))])
    again = profiles.read("u-1").registered_ms[(Channel.SMS, "+15550001234")]
    assert again > first and profiles.get("u-1") == parse_profile(sms)


def test_the_profile_cache_keeps_a_read_for_its_ttl_and_lets_the_expired_go(store: StatusStore) -> None:
    profiles = _profiles(store)
    profiles.put_many((f"u{i}", parse_profile({"contacts": {"email": [f"u{i}@example.com"]}})) for i in range(3))
    now = [100.0]
    cache = ProfileCache(profiles, ttl_ms=5_000, clock=lambda: now[0])
    first = cache.read_many(["u0", "u1"], Channel.EMAIL)
    profiles.put("u0", parse_profile({"contacts": {"email": ["changed@example.com"]}}))
    now[0] += 4.9
    again = cache.read_many(["u0", "u1"], Channel.EMAIL)
    assert again["u0"] is first["u0"] and again["u1"] is first["u1"]  # within the TTL: the reads kept
    now[0] += 0.2
    # past it: read again (the change seen), and the expired entries are gone, not kept until a bound
    fresh = cache.read_many(["u0"], Channel.EMAIL)
    assert [c.address for c in fresh["u0"].contacts.email] == ["changed@example.com"]  # type: ignore[union-attr]
    assert cache.read("u2").contacts.email[0].address == "u2@example.com"
    assert sorted(cache._entries) == ["u0", "u2"]


def test_flags_many_reads_what_read_many_reads_without_opening_an_address(store: StatusStore) -> None:
    """The API's read (``flags_many``): each channel's active contacts with their verified flag and
    the preferences, as the whole read has them, and no key needed to read them."""
    profiles = _profiles(store)
    profiles.put("u-1", parse_profile(DOC))
    profiles.put("u-2", parse_profile({"marketing": {"sms": False}, "contacts": {
        "sms": [{"address": "+8801711000002", "verified": False}, {"address": "+8801711000003", "active": False}],
        "push": [{"address": "tok-2", "platform": "ios"}]}}))
    users = ["u-1", "u-2", "u-nobody"]
    whole = profiles.read_many(users)
    for reader in (profiles, _profiles(store, enc=[generate_key()])):  # the second cannot open an address
        flags = reader.flags_many(users)
        assert sorted(flags) == users and not flags["u-nobody"].exists
        for user in ("u-1", "u-2"):
            read = whole[user]
            assert not isinstance(read, Exception)
            assert flags[user].exists and flags[user].preferences == read.preferences
            assert {ch: [c.verified for c in flags[user].contacts.active(ch)] for ch in Channel} == {
                ch: [c.verified for c in read.contacts.active(ch)] for ch in Channel}
    assert {ch: [c.verified for c in profiles.flags_many(["u-2"])["u-2"].contacts.active(ch)] for ch in Channel} == {
        Channel.PUSH: [True], Channel.SMS: [False], Channel.EMAIL: []}
