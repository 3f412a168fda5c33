"""What the push providers (FCM, APNs) decide alike: a message's priority, its expiry, its
collapse id and the id derived from its key. Pure: the clock is an argument.

* **Priority**: urgent (a one-time code, or anything of the priority lane: ``MessageContext.urgent``)
  is FCM ``android.priority`` ``high`` and APNs ``apns-priority`` 10; otherwise FCM ``normal``, and
  APNs 5 for marketing, 10 for the rest (APNs' own default for an alert: an order update is not
  held for the device's power budget).
* **Expiry**: ``ttl_s`` after the request's event time (``code_ttl_s`` for one-time codes), so a
  retried message lapses when it would have; one with less than a second left is not sent.
* **Collapse id**: the message key when it fits APNs' 64 bytes as a header, else its SHA-256 (a
  repeat of a message replaces it on the device instead of showing twice).
* **Message id** (``apns-id``): a UUID derived from the message key, the same on every attempt.
"""

from __future__ import annotations

import hashlib
import math
import uuid
from dataclasses import dataclass

from operators.records import Category
from senders.errors import ProviderPermanentError
from senders.templates.render import MessageContext, PushContent, Rendered

#: the longest ``apns-collapse-id`` (bytes)
MAX_COLLAPSE_ID = 64
#: the namespace of the ``apns-id`` UUIDs derived from message keys (fixed: a repeat keeps its id)
MESSAGE_ID_NAMESPACE = uuid.UUID("5d0c8f0e-3f43-4a5e-9b6e-2f1d0c7a4b19")
#: a message with less time to live than this is not sent
MIN_TTL_S = 1.0


@dataclass(frozen=True, slots=True)
class PushOptions:
    """:param ttl_s: how long a message may wait for its device, from its request's event time
    :param code_ttl_s: the same for one-time codes"""

    ttl_s: int = 28 * 86_400
    code_ttl_s: int = 600

    def ttl_of(self, context: MessageContext) -> int:
        return self.code_ttl_s if context.one_time_code else self.ttl_s

    def expires_at_s(self, context: MessageContext, now_s: float) -> float:
        """When the message lapses (epoch seconds): its event time (or now) plus its TTL."""
        start = context.event_time_ms / 1000 if context.event_time_ms is not None else now_s
        return start + self.ttl_of(context)

    def time_to_live_s(self, provider: str, context: MessageContext, now_s: float) -> int:
        """The whole seconds it has left (rounded up); raises ProviderPermanentError (the address
        kept) when that is under a second: it lapsed before it could be sent."""
        left = self.expires_at_s(context, now_s) - now_s
        if left < MIN_TTL_S:
            raise ProviderPermanentError(
                provider, f"expired before it was sent (time to live {self.ttl_of(context)} s)",
                deactivate_address=False,
            )
        return math.ceil(left)


def push_content(provider: str, message: Rendered) -> PushContent:
    """The message's title and body; a provider of push given another channel's message is
    configured wrong (permanent, the address kept)."""
    if not isinstance(message.content, PushContent):
        raise ProviderPermanentError(
            provider, f"a push provider cannot send a {message.channel} message", deactivate_address=False
        )
    return message.content


def android_priority(context: MessageContext) -> str:
    return "high" if context.urgent else "normal"


def apns_priority(context: MessageContext) -> int:
    return 5 if context.kind is Category.MARKETING and not context.urgent else 10


def collapse_id(message_key: str) -> str:
    """The message key if it is at most 64 bytes of printable ASCII, else its SHA-256 in hex."""
    if len(message_key) <= MAX_COLLAPSE_ID and message_key.isascii() and message_key.isprintable():
        return message_key
    return hashlib.sha256(message_key.encode("utf-8")).hexdigest()


def message_id(message_key: str) -> str:
    """A canonical UUID of the message key (``apns-id``): the same for every attempt."""
    return str(uuid.uuid5(MESSAGE_ID_NAMESPACE, message_key))
