"""What the rules decide for a message, and why (the reason strings of its status)."""

from __future__ import annotations

from enum import StrEnum


class Outcome(StrEnum):
    SEND = "send"  # call the provider for these addresses
    SKIPPED = "skipped"  # nothing to do, and that is a success: no address, opted out
    DEFERRED = "deferred"  # not yet: check again at ``not_before``
    REJECTED = "rejected"  # not sent, by a limit


class Reason(StrEnum):
    NO_ADDRESS = "no_address"
    NO_VERIFIED_ADDRESS = "no_verified_address"  # active addresses, none verified (and none allowed)
    OPTED_OUT = "opted_out"
    QUIET_HOURS = "quiet_hours"
    PREFERENCES_UNAVAILABLE = "preferences_unavailable"
    MARKETING_LIMIT = "marketing_limit"
    RECIPIENT_LIMIT = "recipient_limit"
