"""What a provider's receipt says, once its signature is checked and its body read (pure): the
events it carries, each naming the provider's message id and what becomes of the message."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from operators.records import Channel
from senders.statuses import DeliveryStatus

#: the longest reason kept with a receipt (the status store's and the receipts table's)
MAX_REASON = 200


class BadReceipt(ValueError):
    """A signed body that is not the receipt its scheme describes; the message is for the
    caller (400), never quoting the body."""


@dataclass(frozen=True, slots=True)
class ReceiptEvent:
    """One event of a receipt.

    :param reference: the provider's id of the message (the one its send returned)
    :param status: what the message becomes (delivered or failed); None: acknowledged, no change
    :param kind: the receipt as the message's history shows it (``delivered``, ``failed``,
        ``complaint``)
    :param reason: why (a code, never text that may hold an address)
    :param address: the address the event names, for a deactivation
    :param deactivate: the event says the address cannot take messages (deactivated)
    :param opt_out: a complaint: the user is opted out of marketing on the scheme's channel
    :param message_key: the message key the provider echoes back, when it does (checked against
        the message found by ``reference``)
    """

    reference: str
    status: DeliveryStatus | None
    kind: str = ""
    reason: str | None = None
    address: str | None = None
    deactivate: bool = False
    opt_out: bool = False
    message_key: str | None = None


class ReceiptScheme(Protocol):
    """One provider kind's receipts: how they are signed and what their bodies say."""

    @property
    def kind(self) -> str:
        """The scheme's name (``notify``, ``twilio``, ``sendgrid``)."""
        ...

    @property
    def channel(self) -> Channel | None:
        """The channel its messages are on (a deactivation and an opt-out apply to it); None: any."""
        ...

    def verify(self, headers: Mapping[str, str], body: bytes, now_s: float) -> str | None:
        """None when the receipt is genuine (and fresh, where the scheme can tell); else why
        not, for the log (never the caller). ``headers``' names in lower case."""
        ...

    def events(self, body: bytes) -> Sequence[ReceiptEvent]:
        """The events of a verified body; raises BadReceipt."""
        ...


def clean_reason(text: str) -> str | None:
    """A reason as kept: letters, digits and ``_.:- `` only, at most MAX_REASON characters."""
    kept = "".join(c for c in text if c.isascii() and (c.isalnum() or c in "_.:- "))[:MAX_REASON].strip()
    return kept or None
