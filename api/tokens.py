"""Bearer tokens: ``dedupctl api token create`` prints one once; the store keeps its SHA-256.

A token is 32 random bytes (url-safe base64) behind the prefix ``ndk_``: guessing one is hopeless,
so a plain SHA-256 is enough to keep (no slow password hash), and looking one up by its hash
compares nothing secret in Python.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from api.expiring import Expiring
from operators.records import Category
from senders.store.db import Database

PREFIX = "ndk_"


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a token speaks for, and what it may send.

    :param templates: the templates it may send; empty: every template of its categories
    :param rate_per_sec: its notifications per second; None: ``api.default_rate_per_sec``
    """

    name: str
    categories: frozenset[Category]
    templates: frozenset[str] = frozenset()
    rate_per_sec: float | None = None

    def may_send_kind(self, kind: Category) -> bool:
        return kind in self.categories

    def may_send_template(self, template: str) -> bool:
        return not self.templates or template in self.templates

    @property
    def marketing(self) -> bool:
        return Category.MARKETING in self.categories


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def new_token() -> str:
    return PREFIX + secrets.token_urlsafe(32)


def parse_categories(text: str) -> frozenset[Category]:
    """``transactional,marketing`` -> the categories; raises ValueError naming a wrong one."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ValueError("at least one category: transactional, marketing")
    known = {c.value for c in Category}
    for name in names:
        if name not in known:
            raise ValueError(f"unknown category {name!r}: transactional or marketing")
    return frozenset(Category(n) for n in names)


def create_token(db: Database, caller: Caller, now_ms: int) -> str:
    """A new token for ``caller``; only its hash is stored. Returns the token (shown once)."""
    if not caller.name.strip():
        raise ValueError("the caller needs a name")
    if caller.rate_per_sec is not None and not caller.rate_per_sec > 0:
        raise ValueError("the rate must be positive")
    token = new_token()
    with db.tx() as cur:
        db.exec(
            cur,
            "INSERT INTO api_token (token_hash, caller, categories, templates, rate_per_sec, created_ms)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (
                token_hash(token),
                caller.name,
                ",".join(sorted(c.value for c in caller.categories)),
                ",".join(sorted(caller.templates)),
                caller.rate_per_sec,
                now_ms,
            ),
        )
    return token


def revoke_callers_tokens(db: Database, caller: str) -> int:
    with db.tx() as cur:
        done = db.exec(cur, "UPDATE api_token SET revoked = 1 WHERE caller = ? AND revoked = 0", (caller,))
        return int(done.rowcount)


def lookup(db: Database, token: str) -> Caller | None:
    """The caller of a live token, or None."""
    if not token.startswith(PREFIX) or len(token) > 200:
        return None
    with db.tx(write=False) as cur:
        row = db.exec(
            cur,
            "SELECT caller, categories, templates, rate_per_sec FROM api_token WHERE token_hash = ? AND revoked = 0",
            (token_hash(token),),
        ).fetchone()
    if row is None:
        return None
    return Caller(
        name=row[0],
        categories=frozenset(Category(c) for c in _split(row[1])),
        templates=frozenset(_split(row[2])),
        rate_per_sec=None if row[3] is None else float(row[3]),
    )


def _split(text: str) -> Iterable[str]:
    return (p for p in text.split(",") if p)


class TokenCache:
    """Verified tokens (by hash) kept for ``ttl_s``; unknown tokens are not kept."""

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic, max_entries: int = 10_000) -> None:
        self._callers: Expiring[str, Caller] = Expiring(ttl_s, clock, max_entries)

    def get(self, token: str) -> Caller | None:
        return self._callers.get(token_hash(token))

    def put(self, token: str, caller: Caller) -> None:
        self._callers.put(token_hash(token), caller)
