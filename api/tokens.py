"""Callers and their bearer tokens in the store: ``dedupctl api token create|list|revoke``.

A token is 32 random bytes (url-safe base64) behind the prefix ``ndk_``: guessing one is
hopeless, so a plain SHA-256 is enough to keep (no slow password hash), and looking one up by
its hash compares nothing secret in Python. A token's id is the first 12 hex characters of its
hash: what ``list`` shows and ``revoke`` takes (the token itself is shown once, at creation).

Every lookup checks that the token is not revoked and not expired. The API keeps what it looked
up for ``api.token_cache_ttl_ms`` (a revocation reaches a process that has the token cached
within that time; an expiry is checked on every request, cached or not) and a failed lookup for
``api.token_negative_ttl_ms``, so a flood of bad tokens is not a flood of store queries.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from api.callers import Caller, check_caller, joined, split
from api.expiring import Expiring
from api.scopes import Scope, scopes_text
from operators.records import Category
from senders.store.db import Database

PREFIX = "ndk_"
ID_CHARS = 12
_TOKEN_CHARS = len(PREFIX) + 43  # secrets.token_urlsafe(32)


class CallerExists(ValueError):
    """``token create`` of a caller that exists: rotate its token instead."""


class UnknownCaller(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Found:
    """A live token's caller, and when the token expires (epoch ms; None: never)."""

    caller: Caller
    expires_ms: int | None = None

    def live(self, now_ms: int) -> bool:
        return self.expires_ms is None or now_ms < self.expires_ms


@dataclass(frozen=True, slots=True)
class TokenInfo:
    """What ``token list`` shows of a token (never the token)."""

    token_id: str
    caller: str
    scopes: str
    created_ms: int
    expires_ms: int | None
    revoked: bool


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def token_id(token: str) -> str:
    return token_hash(token)[:ID_CHARS]


def new_token() -> str:
    return PREFIX + secrets.token_urlsafe(32)


def well_formed(token: str) -> bool:
    """Whether a string could be one of our tokens at all (else no store query is made)."""
    return len(token) == _TOKEN_CHARS and token.startswith(PREFIX) and token.isascii()


_SCOPE_NAMES = frozenset(s.value for s in Scope)  # a stored name this code does not know is ignored
_CALLER_COLUMNS = "name, scopes, categories, templates, rate_per_sec, namespaces"


def _caller(row: Any) -> Caller:
    return Caller(
        name=row[0],
        scopes=frozenset(Scope(s) for s in split(row[1]) if s in _SCOPE_NAMES),
        categories=frozenset(Category(c) for c in split(row[2])),
        templates=split(row[3]),
        rate_per_sec=None if row[4] is None else float(row[4]),
        namespaces=split(row[5]),
    )


def _insert_token(db: Database, cur: Any, name: str, now_ms: int, expires_ms: int | None) -> str:
    token = new_token()
    db.exec(
        cur,
        "INSERT INTO api_token (token_hash, caller, created_ms, expires_ms, revoked) VALUES (?, ?, ?, ?, 0)",
        (token_hash(token), name, now_ms, expires_ms),
    )
    return token


def create_caller(db: Database, caller: Caller, now_ms: int, expires_ms: int | None = None) -> str:
    """A new caller and its first token; returns the token (shown once). Raises CallerExists
    when the name is taken, ValueError when the caller is not valid."""
    check_caller(caller)
    with db.tx() as cur:
        taken = db.exec(cur, f"SELECT name FROM api_caller WHERE name = ?{db.for_update}", (caller.name,)).fetchone()
        if taken is not None:
            raise CallerExists(
                f"caller {caller.name} exists: `dedupctl api token create {caller.name} --rotate` issues it another"
                " token (then revoke the old one by its id)"
            )
        db.exec(
            cur,
            f"INSERT INTO api_caller ({_CALLER_COLUMNS}, created_ms) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                caller.name,
                scopes_text(caller.scopes),
                joined(c.value for c in caller.categories),
                joined(caller.templates),
                caller.rate_per_sec,
                joined(caller.namespaces),
                now_ms,
            ),
        )
        return _insert_token(db, cur, caller.name, now_ms, expires_ms)


def rotate(db: Database, name: str, now_ms: int, expires_ms: int | None = None) -> str:
    """Another token of an existing caller (the old ones stay live until revoked)."""
    with db.tx() as cur:
        if db.exec(cur, "SELECT name FROM api_caller WHERE name = ?", (name,)).fetchone() is None:
            raise UnknownCaller(f"no caller {name}: `dedupctl api token create {name} --scopes ...` makes it")
        return _insert_token(db, cur, name, now_ms, expires_ms)


def get_caller(db: Database, name: str) -> Caller | None:
    with db.tx(write=False) as cur:
        row = db.exec(cur, f"SELECT {_CALLER_COLUMNS} FROM api_caller WHERE name = ?", (name,)).fetchone()
    return _caller(row) if row else None


def list_tokens(db: Database) -> list[TokenInfo]:
    with db.tx(write=False) as cur:
        rows = db.exec(
            cur,
            "SELECT t.token_hash, t.caller, c.scopes, t.created_ms, t.expires_ms, t.revoked FROM api_token t"
            " LEFT JOIN api_caller c ON c.name = t.caller ORDER BY t.caller, t.created_ms, t.token_hash",
        ).fetchall()
    return [
        TokenInfo(r[0][:ID_CHARS], r[1], r[2] or "", int(r[3]), None if r[4] is None else int(r[4]), bool(r[5]))
        for r in rows
    ]


def revoke(db: Database, *, token_id: str | None = None, caller: str | None = None) -> int:
    """Revoke one token (by its id: a prefix of its hash, at least ``ID_CHARS`` long when several
    could match) or every token of a caller; returns the tokens revoked. Raises ValueError when
    an id matches several tokens."""
    with db.tx() as cur:
        if caller is not None:
            done = db.exec(cur, "UPDATE api_token SET revoked = 1 WHERE caller = ? AND revoked = 0", (caller,))
            return max(0, int(done.rowcount))
        assert token_id is not None
        wanted = token_id.strip().lower()
        if not wanted or any(c not in "0123456789abcdef" for c in wanted):
            raise ValueError("a token id is the hex prefix `dedupctl api token list` shows")
        matches = db.exec(
            cur, "SELECT token_hash FROM api_token WHERE substr(token_hash, 1, ?) = ?", (len(wanted), wanted)
        ).fetchall()
        if len(matches) > 1:
            raise ValueError(f"token id {wanted} matches {len(matches)} tokens: give more of it")
        if not matches:
            return 0
        done = db.exec(cur, "UPDATE api_token SET revoked = 1 WHERE token_hash = ? AND revoked = 0", (matches[0][0],))
        return max(0, int(done.rowcount))


def lookup(db: Database, token: str, now_ms: int) -> Found | None:
    """The caller of a live (not revoked, not expired) token, or None."""
    if not well_formed(token):
        return None
    with db.tx(write=False) as cur:
        row = db.exec(
            cur,
            f"SELECT {', '.join('c.' + c.strip() for c in _CALLER_COLUMNS.split(','))}, t.expires_ms FROM api_token t"
            " JOIN api_caller c ON c.name = t.caller WHERE t.token_hash = ? AND t.revoked = 0",
            (token_hash(token),),
        ).fetchone()
    if row is None:
        return None
    found = Found(_caller(row), None if row[6] is None else int(row[6]))
    return found if found.live(now_ms) else None


_REFUSED = Found(Caller("", frozenset()), 0)  # a failed lookup, cached


class TokenCache:
    """Looked-up tokens by hash: a live one for ``ttl_s``, a failed one for ``negative_ttl_s``
    (both bounded in number). ``get`` gives the Found, ``REFUSED`` for a cached failure, or None
    when the store must be asked. A cached token past its expiry is refused at once."""

    REFUSED = _REFUSED

    def __init__(
        self,
        ttl_s: float,
        negative_ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
        wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        max_entries: int = 10_000,
    ) -> None:
        self._ttl_s = ttl_s
        self._live: Expiring[str, Found] = Expiring(ttl_s, clock, max_entries)
        self._refused: Expiring[str, Found] = Expiring(negative_ttl_s, clock, max_entries)
        self._wall_ms = wall_ms

    def get(self, token: str) -> Found | None:
        return self.read(token)[0]

    def read(self, token: str) -> tuple[Found | None, bool]:
        """``get``, and whether a live token is past half its time in the cache: to read again
        now, in the background, so its requests do not wait for the store when it expires."""
        digest = token_hash(token)
        live = self._live.entry(digest)
        if live is not None:
            found, left_s = live
            if found.live(self._wall_ms()):
                return found, left_s < self._ttl_s / 2
            self._live.drop(digest)
            return _REFUSED, False
        return self._refused.get(digest), False

    def put(self, token: str, found: Found | None) -> None:
        digest = token_hash(token)
        if found is None:
            self._live.drop(digest)  # a cached token read again and found revoked
            self._refused.put(digest, _REFUSED)
        else:
            self._live.put(digest, found)
