"""This process's identity in the status store: its instance id, held while it runs.

``acquire`` refuses to start beside a live process with the same instance id (or beside any
live process on a SQLite store, which serves one); a heartbeat thread renews the record, and a
process whose record was taken over (it stalled longer than ``instance_ttl_ms``) is told so.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable

from senders.errors import InstanceInUseError, StoreUnavailableError
from senders.store.db import Database, is_shared
from senders.store.instances import InstanceRegistry, ProcessEntry

logger = logging.getLogger(__name__)


def _now_ms() -> int:
    return int(time.time() * 1000)


class ProcessIdentity:
    def __init__(self, db: Database, *, instance_id: str, ttl_ms: int) -> None:
        self.instance_id = instance_id
        self.holder = uuid.uuid4().hex
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self._db = db
        self._registry = InstanceRegistry(db)
        self._ttl_ms = ttl_ms
        self._exclusive = not is_shared(db)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # one connection, two threads (heartbeat, supervisor)

    def _refusal(self, other: ProcessEntry) -> str:
        seen = max(0.0, (_now_ms() - other.heartbeat_ms) / 1000)
        who = f"pid {other.pid} on {other.host} (seen {seen:.0f} s ago)"
        if self._exclusive:
            return (
                f"the SQLite status store serves one process, and {who} runs `senders run` on"
                f" {self._db.where}. A SQLite store is one file on one host: processes on other hosts"
                " would not share its claims, and would send messages twice. Stop that process, or run"
                " several on a shared PostgreSQL store (senders.status_store = postgresql://...)"
            )
        return (
            f"senders.instance_id {self.instance_id!r} is in use by {who}: two processes with one"
            " instance id would fence each other's Kafka producers in a loop. Give each `senders run`"
            " process its own senders.instance_id"
        )

    def acquire(self) -> None:
        """Hold the instance id, or raise InstanceInUseError. A holder on another host whose pid
        cannot be checked is waited for until its record is ``instance_ttl_ms`` old."""
        waited = False
        while True:
            with self._lock:
                other = self._registry.acquire(
                    instance_id=self.instance_id,
                    holder=self.holder,
                    host=self.host,
                    pid=self.pid,
                    now_ms=_now_ms(),
                    ttl_ms=self._ttl_ms,
                    exclusive=self._exclusive,
                )
            if other is None:
                return
            if other.host == self.host or waited:
                raise InstanceInUseError(self._refusal(other))
            wait_s = (other.heartbeat_ms + self._ttl_ms - _now_ms()) / 1000 + 0.5
            logger.warning(
                "instance id %r is held by pid %d on %s: waiting %.0f s to see whether it is alive",
                self.instance_id,
                other.pid,
                other.host,
                wait_s,
            )
            time.sleep(max(0.0, wait_s))
            waited = True

    def still_ours(self) -> bool:
        """Renew now; False when another process has taken the instance id over. A store that
        does not answer cannot tell: that counts as ours."""
        try:
            with self._lock:
                return self._registry.renew(instance_id=self.instance_id, holder=self.holder, now_ms=_now_ms())
        except StoreUnavailableError:
            return True

    def start_heartbeat(self, on_lost: Callable[[str], None]) -> None:
        def beat() -> None:
            while not self._stop.wait(self._ttl_ms / 3000):
                if not self.still_ours():
                    on_lost(
                        f"senders.instance_id {self.instance_id!r} was taken over by another process while"
                        f" this one could not renew it for {self._ttl_ms / 1000:.0f} s: stopping"
                    )
                    return

        self._thread = threading.Thread(target=beat, name="sender-identity", daemon=True)
        self._thread.start()

    def release(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        try:
            with self._lock:
                self._registry.release(instance_id=self.instance_id, holder=self.holder)
        except StoreUnavailableError:
            logger.warning("could not release instance id %r: it lapses after instance_ttl_ms", self.instance_id)
        finally:
            self._db.close()
