"""Delivery receipts' signatures (pure): HMAC-SHA256 over ``<timestamp>.<body>`` with the
provider's secret, sent as ``X-Notify-Timestamp: <unix seconds>`` and ``X-Notify-Signature:
sha256=<hex>``. Compared in constant time; a timestamp further than the tolerance from the clock
is refused, so a captured receipt cannot be replayed later (within the window the same receipt
twice is one change anyway)."""

from __future__ import annotations

import hashlib
import hmac

TIMESTAMP_HEADER = "X-Notify-Timestamp"
SIGNATURE_HEADER = "X-Notify-Signature"
SCHEME = "sha256="


def sign(secret: bytes, timestamp: int, body: bytes) -> str:
    """The signature header's value for a receipt (providers, and the tests, compute it so)."""
    digest = hmac.new(secret, str(timestamp).encode("ascii") + b"." + body, hashlib.sha256).hexdigest()
    return SCHEME + digest


def verify(
    secret: bytes | None, timestamp: str | None, signature: str | None, body: bytes, now_s: float, tolerance_s: int
) -> str | None:
    """None when the receipt is genuine and fresh; else why not (for the log, never the caller)."""
    if secret is None:
        return "no secret for this provider"
    if not timestamp or not signature:
        return "unsigned"
    if not (timestamp.isascii() and timestamp.isdigit()) or len(timestamp) > 12:  # "²".isdigit() is true
        return "malformed timestamp"
    if abs(now_s - int(timestamp)) > tolerance_s:
        return "timestamp outside the replay window"
    expected = sign(secret, int(timestamp), body)
    # one comparison whatever the input: hmac.compare_digest takes equal-type arguments in
    # constant time for equal lengths
    if not hmac.compare_digest(expected.encode("ascii"), signature.strip().encode("utf-8", "replace")):
        return "bad signature"
    return None
