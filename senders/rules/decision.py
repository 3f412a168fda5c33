"""The rules of one channel message at send time, before the provider call.

=======================  ==========================================  ============================
check, in this order     transactional (codes, orders, payments)     marketing
=======================  ==========================================  ============================
no active address        skipped: no_address                         skipped: no_address
no verified one          skipped: no_verified_address, unless the    skipped: no_verified_address
                         template says ``allow_unverified``
preferences unreadable   fail open: go on                            fail closed: deferred
                                                                     (preferences_unavailable)
opt-out                  never                                       skipped: opted_out
quiet hours              never (a code at 2 a.m. is expected)        deferred to the window's end
limit                    one-time codes, per recipient per window    per user per local day
                         -> rejected: recipient_limit                -> rejected: marketing_limit
otherwise                send                                        send
=======================  ==========================================  ============================

A message goes to the channel's active addresses that are verified (``deliverable``): the
``verified`` flag is what the profile's writer (a caller with ``profiles:write``) asserts, and an
address in the short form is verified. A transactional template that verifies the address itself
(a one-time code: ``allow_unverified = true`` in its template.toml) also goes to unverified ones;
marketing never does.

A limit is checked last, so it is consumed only by a message that is really sent.
The kind is the template's: a request that claims ``transactional`` for a marketing template
is marketing. A deferred message is decided again, by the same function, when it is due: the
user may have opted out or changed the quiet hours meanwhile.

Preferences and contacts are passed apart: the preferences may be unreadable (``None``) while the
contacts are known, and transactional messages then still go out. Without the contacts nothing
can be sent at all; failing to read them is a failed attempt to retry, not a rule's outcome.
A user with no profile has no contacts: ``Contacts()`` (skipped: no_address).

Counting exactly once: the store calls ``limit_claims`` for the counters to read inside the
claim transaction, then ``decide`` with their states, and records ``Decision.consume`` (the units
of a message it sends) in the same transaction. Render before recording them: a message that
fails to render is rejected and consumes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from operators.records import Category, Channel
from senders.profiles.model import Contact, Contacts, Preferences
from senders.rules.limits import CounterState, LimitClaim, check_limits, marketing_claim, one_time_code_claims
from senders.rules.options import RuleOptions
from senders.rules.quiet_hours import QuietWindow
from senders.rules.reasons import Outcome, Reason
from senders.templates.catalog import Template

#: names a recipient in a counter key without the address: ``ContactCipher.lookup_hash``
RecipientId = Callable[[Channel, str], str]


@dataclass(frozen=True, slots=True)
class RuleMessage:
    """What the rules look at in one channel message.

    :param kind: the template's kind; the request's own category is not asked
    :param one_time_code: the template sends a one-time code (the abuse limit applies)
    :param notification_id: the unit of the daily marketing limit
    :param message_key: the unit of the one-time-code limit
    :param allow_unverified: the template may go to unverified addresses (transactional only)
    """

    kind: Category
    one_time_code: bool
    channel: Channel
    user_id: str
    notification_id: str
    message_key: str
    allow_unverified: bool = False

    @classmethod
    def of(
        cls, template: Template, *, channel: Channel, user_id: str, notification_id: str, message_key: str
    ) -> RuleMessage:
        """The message of a template: its kind and its flags are the template's."""
        return cls(template.kind, template.one_time_code, channel, user_id, notification_id, message_key,
                   template.allow_unverified)


@dataclass(frozen=True, slots=True)
class Decision:
    """The rules' verdict.

    :param addresses: where to send (SEND only)
    :param not_before_ms: when to decide again (DEFERRED only)
    :param consume: the limit units the store records with the claim (SEND only)
    """

    outcome: Outcome
    reason: Reason | None = None
    addresses: tuple[Contact, ...] = field(default=(), repr=False)
    not_before_ms: int | None = None
    consume: tuple[LimitClaim, ...] = ()


class Flagged(Protocol):
    """What the rule asks of a contact beyond being active: whether the address is verified."""

    @property
    def verified(self) -> bool: ...


C = TypeVar("C", bound=Flagged, covariant=True)


class ActiveContacts(Protocol[C]):
    """A user's contacts as the rule reads them: a channel's active ones (``Contacts``, or a
    profile's rows read without opening their addresses, ``senders.profiles.sealed.ContactFlags``)."""

    def active(self, channel: Channel) -> tuple[C, ...]: ...


def deliverable(contacts: ActiveContacts[C], channel: Channel, kind: Category, allow_unverified: bool) -> tuple[C, ...]:
    """The addresses a message of this kind may go to: active, and verified unless a
    transactional template allows unverified ones (marketing never goes to those)."""
    return deliverable_among(contacts.active(channel), kind, allow_unverified)


def deliverable_among(active: tuple[C, ...], kind: Category, allow_unverified: bool) -> tuple[C, ...]:
    """``deliverable`` of a channel's active addresses."""
    unverified_ok = allow_unverified and kind is Category.TRANSACTIONAL
    return tuple(c for c in active if c.verified or unverified_ok)


def quiet_window(preferences: Preferences) -> QuietWindow | None:
    """The user's quiet hours in the user's time zone, if any."""
    qh = preferences.quiet_hours
    if qh is None:
        return None
    return QuietWindow(start=qh.start_time(), end=qh.end_time(), zone=preferences.zone())


def limit_claims(
    msg: RuleMessage,
    preferences: Preferences | None,
    contacts: Contacts,
    now_ms: int,
    options: RuleOptions,
    recipient_id: RecipientId,
) -> tuple[LimitClaim, ...]:
    """The counters ``decide`` consults for this message (the store reads these keys)."""
    if msg.kind is Category.MARKETING:
        if preferences is None:
            return ()
        claim = marketing_claim(msg.user_id, msg.notification_id, preferences.zone(), now_ms, options)
        return () if claim is None else (claim,)
    if msg.one_time_code:
        to = deliverable(contacts, msg.channel, msg.kind, msg.allow_unverified)
        recipients = [recipient_id(msg.channel, c.address) for c in to]
        return one_time_code_claims(recipients, msg.message_key, now_ms, options)
    return ()


def decide(
    msg: RuleMessage,
    preferences: Preferences | None,
    contacts: Contacts,
    counts: Mapping[str, CounterState],
    now_ms: int,
    options: RuleOptions,
    recipient_id: RecipientId,
) -> Decision:
    """Send, skip, defer or reject ``msg`` at ``now_ms``.

    :param preferences: the user's preferences; None when they could not be read
    :param counts: the store's state of the keys of ``limit_claims`` (a key missing: empty)
    """
    if not contacts.active(msg.channel):
        return Decision(Outcome.SKIPPED, Reason.NO_ADDRESS)
    addresses = deliverable(contacts, msg.channel, msg.kind, msg.allow_unverified)
    if not addresses:
        return Decision(Outcome.SKIPPED, Reason.NO_VERIFIED_ADDRESS)
    if msg.kind is Category.MARKETING:
        if preferences is None:
            retry_at = now_ms + options.preferences_retry_ms
            return Decision(Outcome.DEFERRED, Reason.PREFERENCES_UNAVAILABLE, not_before_ms=retry_at)
        if not preferences.marketing.allows(msg.channel):
            return Decision(Outcome.SKIPPED, Reason.OPTED_OUT)
        window = quiet_window(preferences)
        until = window.ends_at(now_ms) if window is not None else None
        if until is not None:
            return Decision(Outcome.DEFERRED, Reason.QUIET_HOURS, not_before_ms=until)
    claims = limit_claims(msg, preferences, contacts, now_ms, options, recipient_id)
    full = check_limits(claims, counts)
    if full is not None:
        return Decision(Outcome.REJECTED, full)
    return Decision(Outcome.SEND, addresses=addresses, consume=claims)
