"""The outbox's files: one JSON file per rendered message, where a developer can read it.

``<data_dir>/outbox/<channel>/<written, epoch ns>-<id>.json``, so that the names sort by time
(oldest first). A file appears whole or not at all (written beside, then renamed into place);
the oldest are removed once a channel holds more than ``max_messages`` of them or they are older
than ``max_age_ms``. The outbox provider (``senders.providers.outbox``) writes them, the API's
outbox page (``api.outbox_routes``) reads them: this module and ``senders.policy.outbox`` (the
names, the limits) are the one description of the format.

A record holds the address and the rendered parts (a one-time code among them): it stays in
these files and the API's ``support:read`` route, never in a log line.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from operators.records import Channel
from senders.policy.outbox import OutboxLimits, file_name, time_of, to_prune
from senders.templates.render import Rendered

logger = logging.getLogger(__name__)

#: the outbox's folder under the data directory
OUTBOX_DIR = "outbox"


def outbox_root(data_dir: Path) -> Path:
    """Where the outbox is: ``<data_dir>/outbox``."""
    return data_dir / OUTBOX_DIR


def new_message_id() -> str:
    """The provider's id of a message written to the outbox (kept with its status as the
    provider's reference, as a real provider's id is, so that a receipt could find it)."""
    return f"ob_{uuid.uuid4().hex}"


def outbox_record(*, message_id: str, message_key: str, to: str, message: Rendered) -> dict[str, Any]:
    """What a file holds (and the API's ``GET /v1/outbox`` shows); the writer adds ``at``, when
    it was written (epoch ms)."""
    return {
        "id": message_id,
        "message_key": message_key,
        "channel": message.channel.value,
        "to": to,
        "template": message.template,
        "version": message.version,
        "locale": message.locale,
        "parts": message.fields(),
    }


def _names(folder: Path) -> list[str]:
    try:
        return sorted(n for n in os.listdir(folder) if time_of(n) is not None)
    except FileNotFoundError:
        return []


class OutboxWriter:
    """Writes records into the outbox's channel folders (blocking: run it in a worker thread) and
    keeps each folder within its limits. Thread-safe. The files a folder held when this writer
    first wrote to it count towards the limits, with its own; another process writing to the same
    folder at the same time is counted the next time that folder is first written to."""

    def __init__(self, root: Path, limits: OutboxLimits, clock_ns: Callable[[], int] = time.time_ns) -> None:
        self.root = root
        self.limits = limits
        self._clock_ns = clock_ns
        self._lock = threading.Lock()
        self._held: dict[str, deque[str]] = {}
        self._last_ns = 0

    def write(self, record: dict[str, Any]) -> Path:
        """Write one record (``outbox_record``) with the time it is written (``at``) atomically,
        then remove what the limits drop. One write at a time (a development tool's volume; it
        keeps the count exact and the names in the order of the writes)."""
        channel = Channel(str(record["channel"])).value
        folder = self.root / channel
        with self._lock:
            stamp = self._last_ns = max(self._last_ns + 1, self._clock_ns())
            name = file_name(stamp, str(record["id"]))
            data = json.dumps({**record, "at": stamp // 1_000_000}, ensure_ascii=False, indent=2).encode("utf-8")
            folder.mkdir(parents=True, exist_ok=True)  # again each time: a developer may empty it
            held = self._held.get(channel)
            if held is None:  # what the folder holds already counts
                held = self._held[channel] = deque(_names(folder))
            temporary = folder / f".{name}.tmp"
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(data)
                os.replace(temporary, folder / name)
            except BaseException:
                temporary.unlink(missing_ok=True)
                raise
            held.append(name)
            for _ in range(to_prune(held, stamp // 1_000_000, self.limits)):
                (folder / held.popleft()).unlink(missing_ok=True)
        return folder / name


def read_newest(
    root: Path, *, channels: Iterable[Channel] = tuple(Channel), to: str | None = None, limit: int = 50
) -> list[dict[str, Any]]:
    """The newest records of the outbox, newest first, at most ``limit``; of one address only
    when ``to`` is given. A file removed or unreadable meanwhile is passed over."""
    found: list[tuple[str, Path]] = []
    for channel in channels:
        folder = root / channel.value
        found += [(name, folder / name) for name in _names(folder)]
    found.sort(key=lambda item: item[0], reverse=True)
    out: list[dict[str, Any]] = []
    for _, path in found:
        if len(out) >= limit:
            break
        try:
            record = json.loads(path.read_bytes())
        except FileNotFoundError:  # pruned since the listing
            continue
        except (OSError, ValueError) as exc:
            logger.debug("outbox file %s is not readable: %s", path.name, type(exc).__name__)
            continue
        if isinstance(record, dict) and (to is None or record.get("to") == to):
            out.append(record)
    return out
