"""The outbox's rules (pure): its files' names, which sort by the time they were written
(nanoseconds, strictly increasing per writer, so two messages of one millisecond keep their
order), and which of them the limits drop. The files themselves: ``senders.providers.outbox_files``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

SUFFIX = ".json"
_STAMP_DIGITS = 19  # nanoseconds since the epoch, until the year 2286


@dataclass(frozen=True, slots=True)
class OutboxLimits:
    """How much the outbox keeps, per channel.

    :param max_messages: files kept per channel; the oldest beyond it are removed (0: no limit)
    :param max_age_ms: files older than this are removed when the next message is written
        (0: no limit)
    """

    max_messages: int = 1_000
    max_age_ms: int = 7 * 24 * 3_600_000


def file_name(stamp_ns: int, message_id: str) -> str:
    return f"{stamp_ns:0{_STAMP_DIGITS}d}-{message_id}{SUFFIX}"


def time_of(name: str) -> int | None:
    """The write time (epoch ms) of an outbox file's name; None for a name that is not one (a
    file being written, anything else in the folder)."""
    stamp, dash, rest = name.partition("-")
    if not (dash and rest.endswith(SUFFIX) and len(stamp) == _STAMP_DIGITS and stamp.isdigit()):
        return None
    return int(stamp) // 1_000_000


def to_prune(names: Sequence[str], now_ms: int, limits: OutboxLimits) -> int:
    """How many of ``names`` (outbox files, oldest first) go: those beyond ``max_messages``
    counted from the newest, and those older than ``max_age_ms``."""
    drop = max(0, len(names) - limits.max_messages) if limits.max_messages > 0 else 0
    if limits.max_age_ms > 0:
        oldest_kept = now_ms - limits.max_age_ms
        while drop < len(names) and (time_of(names[drop]) or 0) < oldest_kept:
            drop += 1
    return drop
