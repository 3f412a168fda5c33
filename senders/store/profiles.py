"""User profiles in the status store's database (SQLite or PostgreSQL): the preferences as their
JSON document, each contact a row with its address encrypted and found by its keyed lookup hash
(``senders.profiles.sealed``, ``senders.profiles.crypto``). Every method is one transaction.

A contact row also keeps when the user registered the address (``registered_ms``): an address a
provider deactivated (``inactive_address``) is used again once the user registers it after that
(``add_device``, or a ``put``/``apply_contacts`` that brings back an address the profile had
dropped). Putting a profile that already holds an address keeps its time: re-sending the same
document is no new registration.

The senders read profiles through ``ProfileCache`` (a short TTL): an opt-out is seen within it.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from operators.records import Channel
from senders.profiles.crypto import ContactCipher
from senders.profiles.model import STORED, Contacts, Platform, Preferences, Profile, ProfileError, parse_profile
from senders.profiles.sealed import ContactFlags, SealedContact, open_contacts, preferences_document, seal_contacts
from senders.profiles.updates import add_device, apply_contacts, apply_preferences
from senders.rules.limits import MARKETING_PREFIX, ONE_TIME_CODE_PREFIX, is_recipients_counter, is_users_counter
from senders.store.db import Database
from senders.store.status import erase_user_rows

_CONTACT_COLUMNS = "channel, position, address_enc, address_hash, verified, active, platform, registered_ms"
#: the most users ``put_many`` reads and writes with one statement (SQLite's variable limit allows it)
PUT_GROUP = 500
#: the most distinct preferences documents a store keeps parsed
PARSED_DOCUMENTS = 4096
_UNPARSED = object()


@dataclass(frozen=True, slots=True)
class ProfileRead:
    """What the senders read of a user.

    :param preferences: None when the stored document cannot be read (the rules then fail open
        for transactional messages and closed for marketing)
    :param contacts: the user's contacts (empty without a profile)
    :param registered_ms: (channel, address) -> when the user registered it
    """

    preferences: Preferences | None
    contacts: Contacts
    registered_ms: Mapping[tuple[Channel, str], int] = field(default_factory=dict, repr=False)
    exists: bool = True


NO_PROFILE = ProfileRead(Preferences(), Contacts(), {}, exists=False)


@dataclass(frozen=True, slots=True)
class ProfileFlags:
    """What the API's accept path reads of a user (``ProfileStore.flags_many``): the preferences
    (None when the stored document cannot be read) and the contacts' flags, no address opened."""

    preferences: Preferences | None
    contacts: ContactFlags
    exists: bool = True


NO_FLAGS = ProfileFlags(Preferences(), ContactFlags(), exists=False)


@dataclass(frozen=True, slots=True)
class Erased:
    profile: bool
    contacts: int
    statuses: int
    limit_counters: int = 0


def _now_ms() -> int:
    return int(time.time() * 1000)


class ProfileStore:
    def __init__(self, db: Database, cipher: ContactCipher, clock_ms: Callable[[], int] = _now_ms) -> None:
        self._db = db
        self._cipher = cipher
        self._clock_ms = clock_ms
        self._parsed: dict[str, Preferences | None] = {}  # preferences document -> parsed

    @property
    def cipher(self) -> ContactCipher:
        return self._cipher

    # -- reads ------------------------------------------------------------------------------------

    def _rows(self, cur: Any, user_id: str) -> tuple[str | None, list[tuple[SealedContact, int]]]:
        found = self._db.exec(
            cur, f"SELECT preferences FROM user_profile WHERE user_id = ?{self._db.for_update}", (user_id,)
        ).fetchone()
        rows = self._db.exec(
            cur, f"SELECT {_CONTACT_COLUMNS} FROM user_contact WHERE user_id = ?", (user_id,)
        ).fetchall()
        sealed = [
            (SealedContact(Channel(r[0]), int(r[1]), r[2], r[3], bool(r[4]), bool(r[5]), r[6]), int(r[7])) for r in rows
        ]
        return (found[0] if found else None), sealed

    def _registered(
        self, sealed: Iterable[tuple[SealedContact, int]], decrypt: Callable[[str], str] | None = None
    ) -> dict[tuple[Channel, str], int]:
        opened = decrypt or self._cipher.decrypt
        return {(row.channel, opened(row.address_enc)): at for row, at in sealed}

    def read(self, user_id: str) -> ProfileRead:
        """The senders' view; raises ContactDecryptError (or ProfileError) when the contacts
        cannot be read: then nothing can be sent, and the attempt is retried."""
        with self._db.tx(write=False) as cur:
            document, sealed = self._rows(cur, user_id)
        if document is None:
            return NO_PROFILE
        return self._read(document, sealed)

    def read_many(
        self, user_ids: Iterable[str], channel: Channel | None = None
    ) -> dict[str, ProfileRead | ProfileError]:
        """``read`` for many users in one transaction; with ``channel``, only that channel's
        contacts are opened (a channel's sender needs no others). A user whose contacts cannot
        be read maps to the ProfileError (so one bad row fails one message, not the batch)."""
        documents, sealed = self._rows_many(user_ids, channel)
        out: dict[str, ProfileRead | ProfileError] = {}
        for user_id, document in documents.items():
            if document is None:
                out[user_id] = NO_PROFILE
                continue
            rows = sorted(sealed.get(user_id, []), key=lambda item: (item[0].channel.value, item[0].position))
            try:
                out[user_id] = self._read(document, rows)
            except ProfileError as exc:
                out[user_id] = exc
        return out

    def flags_many(self, user_ids: Iterable[str]) -> dict[str, ProfileFlags]:
        """What the users' profiles say without opening an address (``ProfileFlags``): their
        preferences and their contacts' flags, in one transaction."""
        documents, sealed = self._rows_many(user_ids)
        return {
            user_id: NO_FLAGS if document is None else ProfileFlags(
                self._preferences(document),
                ContactFlags(tuple(row for row, _ in sealed.get(user_id, ()))),
            )
            for user_id, document in documents.items()
        }

    def _rows_many(
        self, user_ids: Iterable[str], channel: Channel | None = None
    ) -> tuple[dict[str, str | None], dict[str, list[tuple[SealedContact, int]]]]:
        """Each user's preferences document (None: no profile) and contact rows, in one
        transaction of two statements, their rows each as one (``Database.select_rows``): the
        API's store writer reads a round's new users so beside its busy event loop."""
        ids = sorted(set(user_ids))
        documents: dict[str, str | None] = dict.fromkeys(ids)
        sealed: dict[str, list[tuple[SealedContact, int]]] = {}
        only = "" if channel is None else " AND channel = ?"
        with self._db.tx(write=False) as cur:
            for i in range(0, len(ids), 500):
                marks, part = self._db.in_list(ids[i : i + 500])
                for user_id, document in self._db.select_rows(
                    cur, "user_id, preferences", f"FROM user_profile WHERE user_id IN ({marks})", part
                ):
                    documents[user_id] = document
                for r in self._db.select_rows(
                    cur, f"user_id, {_CONTACT_COLUMNS}", f"FROM user_contact WHERE user_id IN ({marks}){only}",
                    (*part, *([channel.value] if channel is not None else [])),
                ):
                    contact = SealedContact(Channel(r[1]), int(r[2]), r[3], r[4], bool(r[5]), bool(r[6]), r[7])
                    sealed.setdefault(r[0], []).append((contact, int(r[8])))
        return documents, sealed

    def _read(self, document: str, sealed: list[tuple[SealedContact, int]]) -> ProfileRead:
        plain: dict[str, str] = {}

        def decrypt(token: str) -> str:  # each contact decrypted once for both uses
            if token not in plain:
                plain[token] = self._cipher.decrypt(token)
            return plain[token]

        contacts = open_contacts([row for row, _ in sealed], self._cipher, decrypt)
        return ProfileRead(self._preferences(document), contacts, self._registered(sealed, decrypt))

    def _preferences(self, document: str) -> Preferences | None:
        """A stored preferences document, parsed (None when this code cannot read it); kept by
        its text, as most users' documents are one of a few (immutable, read the same each time)."""
        hit = self._parsed.get(document, _UNPARSED)
        if hit is not _UNPARSED:
            return hit  # type: ignore[return-value]
        try:
            preferences: Preferences | None = Preferences.model_validate(json.loads(document), context=STORED)
        except ValueError:  # pydantic's ValidationError is one: a document this code cannot read
            preferences = None
        if len(self._parsed) >= PARSED_DOCUMENTS:
            self._parsed.clear()
        self._parsed[document] = preferences
        return preferences

    def get(self, user_id: str) -> Profile | None:
        """The whole profile, or None; raises ProfileError when it cannot be read."""
        with self._db.tx(write=False) as cur:
            document, sealed = self._rows(cur, user_id)
        if document is None:
            return None
        return self._open(document, sealed)

    def _open(self, document: str, sealed: list[tuple[SealedContact, int]]) -> Profile:
        try:
            preferences = json.loads(document)
        except ValueError:
            raise ProfileError(["the stored preferences are not JSON"]) from None
        return parse_profile({**preferences, "contacts": open_contacts([r for r, _ in sealed], self._cipher)},
                             stored=True)

    def users_with(self, channel: Channel, address: str) -> list[str]:
        """The users holding an address (under any configured lookup key)."""
        hashes = self._cipher.lookup_hashes(channel, address)
        marks = ", ".join("?" * len(hashes))
        with self._db.tx(write=False) as cur:
            rows = self._db.exec(
                cur,
                f"SELECT DISTINCT user_id FROM user_contact WHERE channel = ? AND address_hash IN ({marks})",
                (channel.value, *hashes),
            ).fetchall()
        return sorted(r[0] for r in rows)

    # -- writes -----------------------------------------------------------------------------------

    def _sealed_rows(
        self,
        user_id: str,
        profile: Profile,
        old: list[tuple[SealedContact, int]],
        now_ms: int,
        registered_again: Iterable[tuple[Channel, str]] = (),
    ) -> tuple[tuple[Any, ...], list[tuple[Any, ...]]]:
        """The profile's row and its contacts' rows, sealed; a contact it already held keeps when
        it was registered (unless registered again now)."""
        kept = self._registered(old)
        again = set(registered_again)
        document = json.dumps(preferences_document(profile), sort_keys=True)
        by_position = {(c.channel, c.position): c for c in seal_contacts(profile.contacts, self._cipher)}
        contacts = []
        for channel in Channel:
            for position, contact in enumerate(profile.contacts.of(channel)):
                row = by_position[(channel, position)]
                key = (channel, contact.address)
                at = now_ms if key in again or key not in kept else kept[key]
                contacts.append(
                    (
                        user_id,
                        channel.value,
                        position,
                        row.address_enc,
                        row.address_hash,
                        int(row.verified),
                        int(row.active),
                        row.platform,
                        at,
                    )
                )
        return (user_id, document, now_ms), contacts

    def _store(self, cur: Any, profiles: list[tuple[Any, ...]], contacts: list[tuple[Any, ...]]) -> None:
        """Replace the profiles' rows and all of their contacts: a few statements, however many."""
        cur.executemany(
            self._db.sql(
                "INSERT INTO user_profile (user_id, preferences, updated_ms) VALUES (?, ?, ?)"
                " ON CONFLICT (user_id) DO UPDATE SET preferences = excluded.preferences,"
                " updated_ms = excluded.updated_ms"
            ),
            profiles,
        )
        users = [p[0] for p in profiles]
        marks = ", ".join("?" * len(users))
        self._db.exec(cur, f"DELETE FROM user_contact WHERE user_id IN ({marks})", users)
        if contacts:
            cur.executemany(
                self._db.sql(
                    f"INSERT INTO user_contact (user_id, {_CONTACT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
                ),
                contacts,
            )

    def _write(
        self,
        cur: Any,
        user_id: str,
        profile: Profile,
        old: list[tuple[SealedContact, int]],
        now_ms: int,
        registered_again: Iterable[tuple[Channel, str]] = (),
    ) -> None:
        row, contacts = self._sealed_rows(user_id, profile, old, now_ms, registered_again)
        self._store(cur, [row], contacts)

    def put(self, user_id: str, profile: Profile) -> None:
        """Replace the user's profile (validated: a ``Profile``)."""
        self.put_many([(user_id, profile)])

    def put_many(self, profiles: Iterable[tuple[str, Profile]]) -> None:
        """Replace several profiles in one transaction (an import), in groups of up to
        ``PUT_GROUP`` users: each group's rows locked and read in one statement each and written in
        a few, so a batch costs a few round trips, not several per profile. A user given again
        starts a new group: the profiles are applied in order, as one put after another."""
        with self._db.tx() as cur:
            group: dict[str, Profile] = {}
            for user_id, profile in profiles:
                if not user_id:
                    raise ProfileError(["user_id: must not be empty"])
                if user_id in group or len(group) >= PUT_GROUP:
                    self._put_group(cur, group)
                    group = {}
                group[user_id] = profile
            self._put_group(cur, group)

    def _put_group(self, cur: Any, group: dict[str, Profile]) -> None:
        if not group:
            return
        users = list(group)
        marks = ", ".join("?" * len(users))
        if self._db.for_update:  # PostgreSQL: the rows another writer must wait for (SQLite holds its write lock)
            self._db.exec(cur, f"SELECT user_id FROM user_profile WHERE user_id IN ({marks}) FOR UPDATE", users)
        old: dict[str, list[tuple[SealedContact, int]]] = {}
        for r in self._db.exec(
            cur, f"SELECT user_id, {_CONTACT_COLUMNS} FROM user_contact WHERE user_id IN ({marks})", users
        ).fetchall():
            sealed = SealedContact(Channel(r[1]), int(r[2]), r[3], r[4], bool(r[5]), bool(r[6]), r[7])
            old.setdefault(r[0], []).append((sealed, int(r[8])))
        now = self._clock_ms()
        profiles: list[tuple[Any, ...]] = []
        contacts: list[tuple[Any, ...]] = []
        for user_id, profile in group.items():
            row, rows = self._sealed_rows(user_id, profile, old.get(user_id, []), now)
            profiles.append(row)
            contacts += rows
        self._store(cur, profiles, contacts)

    def _update(
        self, user_id: str, change: Callable[[Profile], Profile], registered_again: Iterable[tuple[Channel, str]] = ()
    ) -> Profile:
        with self._db.tx() as cur:
            document, old = self._rows(cur, user_id)
            current = Profile() if document is None else self._open(document, old)
            updated = change(current)
            self._write(cur, user_id, updated, old, self._clock_ms(), registered_again)
        return updated

    def apply_preferences(self, user_id: str, update: Mapping[str, Any]) -> Profile:
        """``PUT /v1/users/{id}/preferences`` (a user without a profile gets one)."""
        return self._update(user_id, lambda p: apply_preferences(p, update))

    def apply_contacts(self, user_id: str, update: Mapping[str, Any]) -> Profile:
        """``PUT /v1/users/{id}/contacts``."""
        return self._update(user_id, lambda p: apply_contacts(p, update))

    def add_device(self, user_id: str, token: str, platform: Platform) -> Profile:
        """``POST /v1/devices``: the token is registered (again) now, so a provider's earlier
        deactivation of it no longer holds."""
        updated = add_device(Profile(), token, platform)  # validates the token first
        token = updated.contacts.push[0].address
        return self._update(user_id, lambda p: add_device(p, token, platform), [(Channel.PUSH, token)])

    def erase(self, user_id: str) -> Erased:
        """Remove the profile, its contacts, the user's status history and limit counters, in
        one transaction. (Everything the API keeps of a user too: ``api.erase.erase_user``.)"""
        with self._db.tx() as cur:
            return self.erase_rows(cur, user_id)

    def erase_rows(self, cur: Any, user_id: str) -> Erased:
        """Inside a transaction: the profile, its contacts, the user's status history, and the
        limit counters that are the user's (marketing, by the user id) or the user's addresses'
        (one-time codes, by each lookup hash of each address), matched by exact key."""
        document, sealed = self._rows(cur, user_id)
        recipients: list[str] = []
        for row, _ in sealed:
            try:
                address = self._cipher.decrypt(row.address_enc)
            except ProfileError:
                continue  # no key opens it: its units expire within the hour
            recipients += self._cipher.lookup_hashes(row.channel, address)
        prefixes = [f"{MARKETING_PREFIX}{user_id}:", *(f"{ONE_TIME_CODE_PREFIX}{h}:" for h in recipients)]

        def owns(key: str) -> bool:
            return is_users_counter(key, user_id) or any(is_recipients_counter(key, h) for h in recipients)

        self._db.exec(cur, "DELETE FROM user_contact WHERE user_id = ?", (user_id,))
        self._db.exec(cur, "DELETE FROM user_profile WHERE user_id = ?", (user_id,))
        statuses, counters = erase_user_rows(self._db, cur, user_id, prefixes, owns)
        return Erased(document is not None, len(sealed), statuses, counters)

    def rotate(self) -> int:
        """Re-encrypt every contact with the newest encryption key and re-hash it with the newest
        lookup key (step 2 of a rotation, docs/senders.md); returns the rows changed. Safe to run
        again after an interruption."""
        with self._db.tx(write=False) as cur:
            users = [r[0] for r in self._db.exec(cur, "SELECT DISTINCT user_id FROM user_contact").fetchall()]
        changed = 0
        for user_id in users:
            with self._db.tx() as cur:
                _, sealed = self._rows(cur, user_id)
                for row, _ in sealed:
                    address = self._cipher.decrypt(row.address_enc)
                    digest = self._cipher.lookup_hash(row.channel, address)
                    if self._cipher.is_current(row.address_enc) and digest == row.address_hash:
                        continue
                    self._db.exec(
                        cur,
                        "UPDATE user_contact SET address_enc = ?, address_hash = ? WHERE user_id = ?"
                        " AND channel = ? AND position = ?",
                        (self._cipher.rotate(row.address_enc), digest, user_id, row.channel.value, row.position),
                    )
                    changed += 1
        return changed


class ProfileCache:
    """A worker's view of the profiles: each user's read kept for ``ttl_ms``."""

    #: the most users kept (the oldest go first past it)
    max_entries = 100_000

    def __init__(self, store: ProfileStore, ttl_ms: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._store = store
        self._ttl_s = ttl_ms / 1000
        self._clock = clock
        self._entries: dict[str, tuple[float, ProfileRead]] = {}
        self._lock = threading.Lock()

    @property
    def store(self) -> ProfileStore:
        return self._store

    def read(self, user_id: str) -> ProfileRead:
        now = self._clock()
        with self._lock:
            hit = self._entries.get(user_id)
            if hit is not None and hit[0] > now:
                return hit[1]
        found = self._store.read(user_id)
        with self._lock:
            self._keep(now, {user_id: found})
        return found

    def _keep(self, now: float, reads: Mapping[str, ProfileRead | ProfileError]) -> None:
        """Cache the reads (not the errors); under the lock. The entries are in the order they
        expire (each one kept goes to the end), so the expired ones are dropped from the front as
        they go: a campaign's users, each read once, do not pile up to ``max_entries``."""
        entries = self._entries
        while entries:
            first = next(iter(entries))
            if entries[first][0] > now and len(entries) < self.max_entries:
                break
            del entries[first]
        until = now + self._ttl_s
        for user_id, read in reads.items():
            if isinstance(read, ProfileRead):
                entries.pop(user_id, None)
                entries[user_id] = (until, read)

    def read_many(
        self, user_ids: Iterable[str], channel: Channel | None = None
    ) -> dict[str, ProfileRead | ProfileError]:
        """``read`` for many users: those not cached read in one transaction (``read_many``);
        a user whose profile cannot be read maps to the ProfileError, and is not cached."""
        now = self._clock()
        out: dict[str, ProfileRead | ProfileError] = {}
        missing: list[str] = []
        with self._lock:
            for user_id in user_ids:
                hit = self._entries.get(user_id)
                if hit is not None and hit[0] > now:
                    out[user_id] = hit[1]
                else:
                    missing.append(user_id)
        if not missing:
            return out
        found = self._store.read_many(missing, channel)
        with self._lock:
            self._keep(now, found)
        out.update(found)
        return out
