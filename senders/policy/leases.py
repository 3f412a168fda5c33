"""A claim's lease must outlast the send it covers, or a second worker may send the message too."""

from __future__ import annotations

from collections.abc import Mapping

from operators.errors import ConfigError

#: what a lease keeps beyond the send for recording its outcome in the status store
RECORD_MARGIN_MS = 1000


def send_budget_s(lease_ms: int, elapsed_ms: int) -> float:
    """The time a call may still take, ``elapsed_ms`` after the claim."""
    return (lease_ms - elapsed_ms - RECORD_MARGIN_MS) / 1000


def check_lease(lease_ms: int, deadlines_ms: Mapping[str, float]) -> None:
    """Refuse a lease that does not exceed every send deadline (setting name -> ms) by the margin."""
    if not deadlines_ms:
        return
    setting, longest = max(deadlines_ms.items(), key=lambda item: item[1])
    if lease_ms < longest + RECORD_MARGIN_MS:
        raise ConfigError(
            f"senders.lease_ms ({lease_ms}) must exceed the longest send deadline, senders.{setting}"
            f" ({longest:.0f}), by at least {RECORD_MARGIN_MS} ms: a send that outlives its claim's"
            " lease can be made a second time by another worker"
        )
