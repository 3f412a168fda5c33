"""Every status and state name of the senders, as StrEnums, with the groups the code needs."""

from __future__ import annotations

from enum import StrEnum


class DeliveryStatus(StrEnum):
    """The life of one message key in the status store (and in ``notifications.status``)."""

    QUEUED = "queued"  # waiting for its next attempt (a retry is scheduled)
    SENDING = "sending"  # claimed by a worker; the provider call is in progress
    SENT = "sent"  # the provider accepted it
    DELIVERED = "delivered"  # the provider confirmed delivery to the device or mailbox
    FAILED = "failed"  # given up: dead-lettered
    SKIPPED = "skipped"  # nothing to send, and that is a success: no address, opted out
    DEFERRED = "deferred"  # a rule says not yet (quiet hours): checked again at ``not_before``
    REJECTED = "rejected"  # not sent by a rule: a limit, a template that cannot be rendered


#: nothing more will be sent for a key in one of these
FINAL_STATUSES = frozenset(
    {
        DeliveryStatus.SENT,
        DeliveryStatus.DELIVERED,
        DeliveryStatus.FAILED,
        DeliveryStatus.SKIPPED,
        DeliveryStatus.REJECTED,
    }
)
#: done as it should be: the provider took it, or there was nothing to send
SUCCESS_STATUSES = frozenset({DeliveryStatus.SENT, DeliveryStatus.DELIVERED, DeliveryStatus.SKIPPED})
#: still in the senders' hands
IN_PROGRESS_STATUSES = frozenset({DeliveryStatus.QUEUED, DeliveryStatus.SENDING, DeliveryStatus.DEFERRED})
#: what the send-time rules decide without a provider call (``senders.rules``)
RULE_STATUSES = frozenset({DeliveryStatus.SKIPPED, DeliveryStatus.DEFERRED, DeliveryStatus.REJECTED})


class Lane(StrEnum):
    """Each channel has two lanes with their own topics and workers."""

    NORMAL = "normal"
    PRIORITY = "priority"


class AttemptOutcome(StrEnum):
    """What one provider call came to."""

    SENT = "sent"
    TRANSIENT = "transient"
    PERMANENT = "permanent"


class DeadLetterReason(StrEnum):
    """Why a message went to the dead-letter topic (the symbols of schemas/dead_letter.avsc)."""

    MAX_ATTEMPTS = "max_attempts"
    PERMANENT_FAILURE = "permanent_failure"
    ADDRESS_INACTIVE = "address_inactive"
    NO_ADDRESS = "no_address"
    UNDECODABLE = "undecodable"


class CircuitState(StrEnum):
    """The primary provider's circuit: closed (in use), open (failed over), half-open (probing)."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class ClaimAction(StrEnum):
    """What a worker does with a record, given what the status store holds for its key."""

    CLAIM = "claim"  # call the provider
    SKIP = "skip"  # already sent, failed, or superseded by a later attempt
    WAIT = "wait"  # another worker holds a live claim: come back when its lease ends
    REPUBLISH = "republish"  # the outcome is stored but its records may not have been produced
    DEFER = "defer"  # deferred and not due yet: put back in the delay topic until ``not_before``
