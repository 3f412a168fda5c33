"""A lease in the store: one row per name with its owner and expiry, so that what must run once
across the API processes of one store runs in one of them (``api.leader``).

``take`` takes a free or expired lease, or renews one the owner holds; it is one transaction,
so two processes cannot both take it. An owner that stops renewing (killed, stalled, cut off
from the store) loses it once it expires, and another process takes it. Expiry is judged by the
taker's clock: the processes' clocks must agree to well within the lease's time (one host, or
NTP).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from senders.store.db import Database


@dataclass(frozen=True, slots=True)
class Holder:
    name: str
    owner: str
    host: str
    pid: int
    expires_ms: int
    acquired_ms: int


_COLUMNS = "name, owner, host, pid, expires_ms, acquired_ms"


def take(
    db: Database, name: str, *, owner: str, host: str, pid: int, now_ms: int, ttl_ms: int,
    gone: Callable[[str, int], bool] = lambda host, pid: False,
) -> bool:
    """True when ``owner`` holds the lease until ``now_ms + ttl_ms`` (taken or renewed). A lease
    whose holder ``gone(host, pid)`` says is dead (a process of this host that no longer runs) is
    taken at once, not after its expiry."""
    with db.tx() as cur:
        inserted = db.exec(
            cur,
            f"INSERT INTO api_lease ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO NOTHING",
            (name, owner, host, pid, now_ms + ttl_ms, now_ms),
        ).rowcount
        if inserted == 1:
            return True
        held, expires, held_host, held_pid = db.exec(
            cur, f"SELECT owner, expires_ms, host, pid FROM api_lease WHERE name = ?{db.for_update}", (name,)
        ).fetchone()
        if held == owner:
            db.exec(cur, "UPDATE api_lease SET expires_ms = ? WHERE name = ?", (now_ms + ttl_ms, name))
            return True
        if int(expires) <= now_ms or gone(str(held_host), int(held_pid)):
            db.exec(
                cur,
                "UPDATE api_lease SET owner = ?, host = ?, pid = ?, expires_ms = ?, acquired_ms = ? WHERE name = ?",
                (owner, host, pid, now_ms + ttl_ms, now_ms, name),
            )
            return True
        return False


def release(db: Database, name: str, owner: str) -> bool:
    """Give the lease up at once (another process may take it now); False when not held."""
    with db.tx() as cur:
        done = db.exec(cur, "UPDATE api_lease SET expires_ms = 0 WHERE name = ? AND owner = ?", (name, owner))
        return bool(done.rowcount)


def holder(db: Database, name: str, now_ms: int) -> Holder | None:
    """Who holds the lease now (None: nobody, or it expired)."""
    with db.tx(write=False) as cur:
        row = db.exec(cur, f"SELECT {_COLUMNS} FROM api_lease WHERE name = ?", (name,)).fetchone()
    if row is None or int(row[4]) <= now_ms:
        return None
    return Holder(row[0], row[1], row[2], int(row[3]), int(row[4]), int(row[5]))
