"""What the send-time rules made of a claimed message, as the status store applies it inside the
claim's transaction: send (and record the limit units it consumes), or skip, defer or reject it
with a reason, without a provider call."""

from __future__ import annotations

from dataclasses import dataclass

from senders.records import TemplateRef
from senders.rules.limits import LimitClaim
from senders.statuses import DeliveryStatus


@dataclass(frozen=True, slots=True)
class RuleVerdict:
    """:param status: None to send; else SKIPPED, DEFERRED or REJECTED
    :param reason: why (the status record's ``reason``)
    :param not_before_ms: when a DEFERRED message is decided again
    :param consume: the limit units a message to send takes (recorded once: units are distinct)
    :param template: what it is rendered from, as far as known
    """

    status: DeliveryStatus | None = None
    reason: str | None = None
    not_before_ms: int | None = None
    consume: tuple[LimitClaim, ...] = ()
    template: TemplateRef | None = None

    @property
    def send(self) -> bool:
        return self.status is None
