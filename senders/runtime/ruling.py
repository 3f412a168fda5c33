"""The send-time rules applied to one delivery: its template (the kind is the template's), the
user's profile, the rules' decision (``senders.rules.decision.decide``) and the rendered message.

``prepare`` does what needs no lock (the template, the limit counters to consult); the status
store then calls ``Ruling.verdict`` inside the claim's transaction with those counters locked and
counted, so what it decides and the limit units it consumes are recorded together. A message to
send is rendered there too: a render error rejects it and consumes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from operators.records import Channel
from senders.policy.verdict import RuleVerdict
from senders.profiles.model import Contacts, Preferences
from senders.records import Delivery, TemplateRef
from senders.rules.decision import RuleMessage, decide, limit_claims
from senders.rules.limits import CounterState, LimitClaim
from senders.rules.options import RuleOptions
from senders.rules.reasons import Outcome
from senders.statuses import DeliveryStatus
from senders.templates.catalog import Catalog, Template
from senders.templates.errors import NoVersion, TemplateError
from senders.templates.options import TemplateOptions
from senders.templates.render import Rendered, choose_locale, render

#: a message older than the status store's retention, whose key the store no longer has
EXPIRED = "expired"
UNKNOWN_TEMPLATE = "unknown_template"

_OUTCOME_STATUS = {
    Outcome.SKIPPED: DeliveryStatus.SKIPPED,
    Outcome.DEFERRED: DeliveryStatus.DEFERRED,
    Outcome.REJECTED: DeliveryStatus.REJECTED,
}


@dataclass(frozen=True, slots=True)
class RulesContext:
    """What every delivery of a worker is ruled with.

    :param recipient_id: names an address in a limit counter (the keyed lookup hash)
    :param retention_ms: the status store's; an older message seen for the first time is not sent
    """

    catalog: Catalog
    rules: RuleOptions
    templates: TemplateOptions
    recipient_id: Callable[[Channel, str], str]
    retention_ms: int

    def prepare(self, d: Delivery, preferences: Preferences | None, contacts: Contacts, now_ms: int) -> Ruling:
        """``contacts``: the user's, those a provider deactivated already marked inactive."""
        template = self.catalog.templates.get(d.template_id)
        if template is None:
            return Ruling(self, d, None, preferences, contacts, (), now_ms)
        msg = RuleMessage.of(
            template,
            channel=d.channel,
            user_id=d.user_id,
            notification_id=d.notification_id,
            message_key=d.message_key,
        )
        claims = limit_claims(msg, preferences, contacts, now_ms, self.rules, self.recipient_id)
        return Ruling(self, d, template, preferences, contacts, claims, now_ms, msg)


class Ruling:
    """One delivery's rules; after ``verdict`` said send, ``rendered`` and ``address`` are set."""

    def __init__(
        self,
        ctx: RulesContext,
        d: Delivery,
        template: Template | None,
        preferences: Preferences | None,
        contacts: Contacts,
        limits: tuple[LimitClaim, ...],
        now_ms: int,
        msg: RuleMessage | None = None,
    ) -> None:
        self._ctx = ctx
        self._d = d
        self._template = template
        self._preferences = preferences
        self._contacts = contacts
        self._msg = msg
        self.limits = limits
        self.now_ms = now_ms
        self.rendered: Rendered | None = None
        self.address: str | None = None
        self.template = self._ref()

    def _ref(self) -> TemplateRef:
        t = self._template
        if t is None:
            return TemplateRef(self._d.template_id)
        try:
            version = t.version_at(self._d.event_time_ms)
        except NoVersion:
            return TemplateRef(t.name)
        locale = self._preferences.locale if self._preferences is not None else None
        return TemplateRef(t.name, version.number, choose_locale(version, locale, self._ctx.templates.default_locale))

    def _ruled(self, status: DeliveryStatus, reason: str, not_before_ms: int | None = None) -> RuleVerdict:
        return RuleVerdict(status, reason, not_before_ms, template=self.template)

    def verdict(self, counts: Mapping[str, CounterState], first_seen: bool) -> RuleVerdict:
        """Send, skip, defer or reject, given the counters' state (in the claim's transaction).
        ``first_seen``: the store had no row for the key (never seen, or pruned)."""
        d = self._d
        if first_seen and d.event_time_ms + self._ctx.retention_ms < self.now_ms:
            # older than the store remembers: it may have been sent already (a replay)
            return self._ruled(DeliveryStatus.REJECTED, EXPIRED)
        if self._template is None or self._msg is None:
            return self._ruled(DeliveryStatus.REJECTED, UNKNOWN_TEMPLATE)
        decision = decide(
            self._msg, self._preferences, self._contacts, counts, self.now_ms, self._ctx.rules, self._ctx.recipient_id
        )
        if decision.outcome is not Outcome.SEND:
            reason = decision.reason.value if decision.reason is not None else decision.outcome.value
            return self._ruled(_OUTCOME_STATUS[decision.outcome], reason, decision.not_before_ms)
        locale = self._preferences.locale if self._preferences is not None else None
        try:
            rendered = render(
                self._ctx.catalog,
                d.template_id,
                d.channel,
                d.params,
                event_time_ms=d.event_time_ms,
                locale=locale,
                options=self._ctx.templates,
                lane=d.lane,
            )
        except TemplateError as exc:
            return self._ruled(DeliveryStatus.REJECTED, exc.reason)
        self.rendered = rendered
        self.address = decision.addresses[0].address
        ref = TemplateRef(rendered.template, rendered.version, rendered.locale)
        return RuleVerdict(consume=decision.consume, template=ref)
