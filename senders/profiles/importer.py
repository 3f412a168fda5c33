"""Bulk profile import (``dedupctl users import FILE|-``): JSON lines of ``{"user_id": ...,
<profile document>}``, validated line by line, stored in batches through ``ProfileStore.put_many``.

A bad line never stops the import: it is reported by its number and the problem, never quoted
(contacts are personal data), and the import goes on. A line's document is the profile minus its
``user_id``, validated as ``dedupctl users put`` validates one (``senders.profiles.model``); a
user id follows the one rule of every entry point (``senders.profiles.user_id``). A user given
twice is stored as its last line says (each line replaces the profile, as ``users put`` does), so
importing a file again is safe.

The parsing is pure (:func:`parse_line`, :func:`read_lines`); :func:`import_profiles` is the
thin loop over a store.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import BinaryIO, Protocol

from senders.errors import StoreUnavailableError
from senders.profiles.model import MAX_DOCUMENT_BYTES, Profile, ProfileError, parse_profile
from senders.profiles.user_id import user_id_problem

logger = logging.getLogger(__name__)

def max_line_bytes(max_user_id_bytes: int) -> int:
    """The longest line taken: the largest profile document plus room for its user id, escaped
    (``\\uXXXX``: 6 bytes per byte of the id), and the ``"user_id": "",`` around it."""
    return MAX_DOCUMENT_BYTES + 6 * max_user_id_bytes + 32


@dataclass(frozen=True, slots=True)
class BadLine:
    """A line that was not imported: its number (1-based) and why, without its content."""

    number: int
    problem: str

    def __str__(self) -> str:
        return f"line {self.number}: {self.problem}"


@dataclass(frozen=True, slots=True)
class GoodLine:
    number: int
    user_id: str
    profile: Profile = field(repr=False)


@dataclass(frozen=True, slots=True)
class RawLine:
    """A line as read: its bytes, or None with ``size`` when it was longer than the limit."""

    number: int
    data: bytes | None
    size: int


def read_lines(source: BinaryIO, limit: int, chunk: int = 1 << 16) -> Iterator[RawLine]:
    """The lines of ``source`` (newline removed); a line longer than ``limit`` bytes is not held
    in memory: it comes back with ``data`` None and its size, and reading goes on after it."""
    number = 0
    while True:
        line = source.readline(limit + 1)
        if not line:
            return
        number += 1
        if len(line) <= limit or line.endswith(b"\n"):
            yield RawLine(number, line.rstrip(b"\r\n"), len(line))
            continue
        size = len(line)
        while not line.endswith(b"\n"):
            line = source.readline(chunk)
            if not line:
                break
            size += len(line)
        yield RawLine(number, None, size)


def parse_line(raw: RawLine, max_user_id_bytes: int) -> GoodLine | BadLine | None:
    """One line: a user id and its profile, why not, or None for a blank line."""
    if raw.data is None:
        return BadLine(raw.number, f"too long: {raw.size} bytes, more than {max_line_bytes(max_user_id_bytes)}")
    if not raw.data.strip():
        return None
    try:
        document = json.loads(raw.data)
    except json.JSONDecodeError as exc:
        return BadLine(raw.number, f"not JSON: {exc.msg} (column {exc.colno})")
    except ValueError:
        return BadLine(raw.number, "not JSON: not UTF-8 text")
    if not isinstance(document, dict):
        return BadLine(raw.number, "not a JSON object")
    if "user_id" not in document:
        return BadLine(raw.number, "no user_id")
    user_id = document.pop("user_id")
    if not isinstance(user_id, str):
        return BadLine(raw.number, "user_id: must be a string")
    problem = user_id_problem(user_id, max_user_id_bytes)
    if problem:
        return BadLine(raw.number, f"user_id: {problem}")
    try:
        profile = parse_profile(document)
    except ProfileError as exc:
        return BadLine(raw.number, "invalid profile: " + "; ".join(exc.problems))
    return GoodLine(raw.number, user_id, profile)


@dataclass(slots=True)
class ImportStats:
    """How far an import got: lines read (blank ones included), profiles stored, bad lines."""

    read: int = 0
    imported: int = 0
    bad: int = 0
    started: float = field(default_factory=time.monotonic)

    def elapsed_s(self, now: float | None = None) -> float:
        return (time.monotonic() if now is None else now) - self.started

    def rate(self, now: float | None = None) -> float:
        """Lines read per second so far."""
        elapsed = self.elapsed_s(now)
        return self.read / elapsed if elapsed > 0 else 0.0

    def progress(self, now: float | None = None) -> str:
        return (
            f"{self.read} lines read: {self.imported} imported, {self.bad} bad,"
            f" {self.rate(now):,.0f} lines/s"
        )


class Importer(Protocol):
    def put_many(self, profiles: Iterable[tuple[str, Profile]]) -> None: ...


@dataclass(frozen=True, slots=True)
class ImportOptions:
    """:param batch_size: profiles per store transaction
    :param max_user_id_bytes: the longest user id (``dedup.max_field_bytes``)
    :param progress_lines: report progress every this many lines read (0: never by lines)
    :param progress_s: and at least this often, in seconds (0: never by time)
    :param store_retries: a batch the store did not take (unavailable, locked) is tried again
        this many times, with a growing pause, before the import stops"""

    batch_size: int = 1000
    max_user_id_bytes: int = 512
    progress_lines: int = 100_000
    progress_s: float = 10.0
    store_retries: int = 5


class ImportStopped(StoreUnavailableError):
    """The store stayed unavailable: lines up to ``through_line`` were imported (or bad)."""

    def __init__(self, through_line: int, cause: BaseException) -> None:
        super().__init__(
            f"the store did not take a batch ({cause}); every line up to {through_line} was imported"
            " or reported: import the file again (a re-import replaces, so it is safe)"
        )
        self.through_line = through_line


def import_profiles(
    lines: Iterable[RawLine],
    store: Importer,
    options: ImportOptions,
    on_bad: Callable[[BadLine], None],
    on_progress: Callable[[ImportStats], None],
    sleep: Callable[[float], None] = time.sleep,
) -> ImportStats:
    """Parse and store every line; bad lines go to ``on_bad`` and the import goes on. Raises
    ImportStopped when the store stays unavailable through ``store_retries``."""
    stats = ImportStats()
    batch: list[GoodLine] = []
    next_lines = options.progress_lines or None
    next_time = stats.started + options.progress_s if options.progress_s > 0 else None
    done_through = 0

    def flush() -> None:
        nonlocal done_through
        if batch:
            _store_batch(batch, store, options, on_bad, stats, sleep, done_through)
            done_through = batch[-1].number
            batch.clear()

    for raw in lines:
        stats.read += 1
        parsed = parse_line(raw, options.max_user_id_bytes)
        if isinstance(parsed, BadLine):
            stats.bad += 1
            on_bad(parsed)
        elif parsed is not None:
            batch.append(parsed)
            if len(batch) >= options.batch_size:
                flush()
        now = time.monotonic()
        if (next_lines is not None and stats.read >= next_lines) or (next_time is not None and now >= next_time):
            flush()  # what is reported as imported is stored
            on_progress(stats)
            if next_lines is not None:
                next_lines = stats.read + options.progress_lines
            if next_time is not None:
                next_time = now + options.progress_s
    flush()
    return stats


def _store_batch(
    batch: list[GoodLine],
    store: Importer,
    options: ImportOptions,
    on_bad: Callable[[BadLine], None],
    stats: ImportStats,
    sleep: Callable[[float], None],
    done_through: int,
) -> None:
    pause = 0.5
    for attempt in range(options.store_retries + 1):
        try:
            store.put_many((g.user_id, g.profile) for g in batch)
            stats.imported += len(batch)
            return
        except StoreUnavailableError as exc:
            if attempt == options.store_retries:
                raise ImportStopped(done_through, exc) from exc
            logger.warning("the store did not take a batch (%s): trying again in %.1f s", exc, pause)
            sleep(pause)
            pause = min(pause * 2, 10.0)
        except ProfileError:
            break  # one profile of the batch refused: find it below, store the others
    for good in batch:
        try:
            store.put_many([(good.user_id, good.profile)])
            stats.imported += 1
        except ProfileError as exc:
            stats.bad += 1
            on_bad(BadLine(good.number, "refused by the store: " + "; ".join(exc.problems)))
