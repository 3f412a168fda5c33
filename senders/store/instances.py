"""Which ``senders run`` process holds which instance id, in the status store.

The instance id names a process's transactional producers. Two live processes with one id would
fence each other's producers in a loop, so a process records itself (a random holder token, its
host and pid) and renews that record; a second one is refused while the first is alive. A SQLite
store is one file on one host and cannot share claims with another host, so it serves one
process whatever its instance id.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from senders.store.db import Database


@dataclass(frozen=True, slots=True)
class ProcessEntry:
    instance_id: str
    holder: str
    host: str
    pid: int
    heartbeat_ms: int


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process, but alive
    return True


def in_the_way(
    entries: list[ProcessEntry],
    *,
    instance_id: str,
    holder: str,
    host: str,
    now_ms: int,
    ttl_ms: int,
    exclusive: bool,
    alive_here: Callable[[int], bool] = pid_alive,
) -> ProcessEntry | None:
    """The live entry that keeps ``holder`` from taking ``instance_id`` (any other live entry
    when ``exclusive``), or None. An entry is live while renewed within ``ttl_ms``, unless it is
    on this host and its pid is gone."""
    for e in entries:
        if e.holder == holder or (not exclusive and e.instance_id != instance_id):
            continue
        if now_ms - e.heartbeat_ms > ttl_ms:
            continue
        if e.host == host and not alive_here(e.pid):
            continue
        return e
    return None


class InstanceRegistry:
    def __init__(self, db: Database) -> None:
        self._db = db

    def entries(self) -> list[ProcessEntry]:
        with self._db.tx(write=False) as cur:
            rows = self._db.exec(
                cur, "SELECT instance_id, holder, host, pid, heartbeat_ms FROM sender_process"
            ).fetchall()
        return [ProcessEntry(r[0], r[1], r[2], int(r[3]), int(r[4])) for r in rows]

    def acquire(
        self, *, instance_id: str, holder: str, host: str, pid: int, now_ms: int, ttl_ms: int, exclusive: bool
    ) -> ProcessEntry | None:
        """Record this process as the holder of ``instance_id``; returns the live entry in the
        way instead, if there is one."""
        with self._db.tx() as cur:
            if self._db.dialect == "postgresql":
                cur.execute("LOCK TABLE sender_process IN EXCLUSIVE MODE")  # one acquirer at a time
            rows = self._db.exec(cur, "SELECT instance_id, holder, host, pid, heartbeat_ms FROM sender_process")
            entries = [ProcessEntry(r[0], r[1], r[2], int(r[3]), int(r[4])) for r in rows.fetchall()]
            blocking = in_the_way(
                entries,
                instance_id=instance_id,
                holder=holder,
                host=host,
                now_ms=now_ms,
                ttl_ms=ttl_ms,
                exclusive=exclusive,
            )
            if blocking is not None:
                return blocking
            self._db.exec(cur, "DELETE FROM sender_process WHERE instance_id = ?", (instance_id,))
            self._db.exec(
                cur,
                "INSERT INTO sender_process (instance_id, holder, host, pid, heartbeat_ms) VALUES (?, ?, ?, ?, ?)",
                (instance_id, holder, host, pid, now_ms),
            )
            return None

    def renew(self, *, instance_id: str, holder: str, now_ms: int) -> bool:
        """False when the record is no longer ours (another process took the instance id over)."""
        with self._db.tx() as cur:
            return (
                self._db.exec(
                    cur,
                    "UPDATE sender_process SET heartbeat_ms = ? WHERE instance_id = ? AND holder = ?",
                    (now_ms, instance_id, holder),
                ).rowcount
                == 1
            )

    def release(self, *, instance_id: str, holder: str) -> None:
        with self._db.tx() as cur:
            self._db.exec(
                cur, "DELETE FROM sender_process WHERE instance_id = ? AND holder = ?", (instance_id, holder)
            )
