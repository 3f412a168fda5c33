"""What a worker does with its records, in steps the worker runs for many records at once:
``decode`` a record (is it due?), ``claim_batch`` (rule on and claim many in one status-store
transaction: ``senders.runtime.ruling``, ``senders.store.batches``), ``call`` the provider with
the rendered message (on the event loop, many at once), ``finish_batch`` (record many outcomes in
one transaction), each giving the records to produce (status, retry or deferral, dead letter).
No Kafka here: the worker owns the consumer and the producer. ``claim_batch`` and
``finish_batch`` block (the store, Fernet, Jinja): the worker runs them on its store thread.

A rule's outcome (skipped, deferred, rejected) is a status with its reason, never a dead letter.
A deferred message waits as a delay-topic record due at its ``not_before``, then is decided again.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from operators import codec
from operators.records import Channel
from senders import records
from senders.errors import StoreUnavailableError
from senders.policy.delays import DelayAction, place_delayed
from senders.policy.leases import send_budget_s
from senders.policy.retry import RetryPolicy
from senders.policy.transitions import AttemptResult, ClaimDecision, OutcomePlan, plan_outcome
from senders.policy.verdict import RuleVerdict
from senders.profiles.model import Contacts, ProfileError
from senders.records import Delivery, TemplateRef
from senders.runtime import slis
from senders.runtime.dispatch import Dispatcher
from senders.runtime.metrics import Metrics
from senders.runtime.ruling import RulesContext, Ruling
from senders.statuses import (
    AttemptOutcome,
    ClaimAction,
    DeadLetterReason,
    DeliveryStatus,
    Lane,
)
from senders.store.batches import ClaimRequest, FinishRequest, claim_many, finish_many, inactive_since_many
from senders.store.profiles import ProfileCache, ProfileRead
from senders.store.status import StatusRow, StatusStore
from senders.templates.render import Rendered

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Output:
    topic: str
    key: bytes | None
    value: bytes


@dataclass(frozen=True, slots=True)
class AttemptEvent:
    """One record's fate, for whoever watches (the demo prints these). No params, no address."""

    channel: Channel
    lane: Lane
    message_key: str
    attempt: int
    outcome: str  # sent, transient, permanent; skipped, deferred, rejected (a rule); or ignored
    provider: str | None = None
    detail: str = ""  # why: the error, the rule's reason, or why a record was ignored
    retry_in_ms: int | None = None
    dead_letter: str | None = None  # the reason, when the message went to the dead-letter topic
    not_before_ms: int | None = None  # a deferred message's
    template: TemplateRef | None = None


@dataclass(slots=True)
class Handled:
    """The records to produce, and the outcomes they publish; or a time to come back."""

    outputs: list[Output] = field(default_factory=list)
    published: list[tuple[str, int]] = field(default_factory=list)
    hold_until_ms: int | None = None


@dataclass(slots=True)
class SendJob:
    """A claimed message the rules say send: its call is to be made (``can_send``), or it fails
    transiently without one (``reason``: its contacts cannot be read)."""

    delivery: Delivery
    claimed_at_ms: int
    outputs: list[Output]  # its "sending" status
    template: TemplateRef | None
    address: str | None = field(default=None, repr=False)
    rendered: Rendered | None = field(default=None, repr=False)
    reason: str = "not ruled"

    @property
    def can_send(self) -> bool:
        return self.address is not None and self.rendered is not None


@dataclass(frozen=True, slots=True)
class HandlerTopics:
    """:param status: status changes :param dlq: dead letters
    :param delay: (channel topic, delay step ms) -> the delay topic"""

    status: str
    dlq: str
    delay: Callable[[str, int], str]


class DeliveryHandler:
    def __init__(
        self,
        *,
        channel: Channel,
        lane: Lane,
        store: StatusStore,
        dispatcher: Dispatcher,
        profiles: ProfileCache,
        rules: RulesContext,
        policy: RetryPolicy,
        topics: HandlerTopics,
        lease_ms: int,
        owner: str,
        metrics: Metrics,
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        rand: Callable[[], float] = random.random,
        on_attempt: Callable[[AttemptEvent], None] | None = None,
        prune_interval_ms: int = 0,
        prices: Mapping[str, float] | None = None,
    ) -> None:
        """``prune_interval_ms``: prune the status store that often (0: this handler never does);
        ``prices``: a message's price per provider name (``senders.provider_prices``)."""
        self.channel = channel
        self.lane = lane
        self.store = store
        self.dispatcher = dispatcher
        self.profiles = profiles
        self.rules = rules
        self.policy = policy
        self.topics = topics
        self.lease_ms = lease_ms
        self.owner = owner
        self.metrics = metrics
        self._clock_ms = clock_ms
        self._rand = rand
        self._on_attempt = on_attempt
        self._labels: dict[str, Any] = {"channel": channel.value, "lane": lane.value}
        self._prune_interval_ms = prune_interval_ms
        self._next_prune_ms = 0
        self._prices: Mapping[str, float] = prices or {}

    def decode(
        self,
        *,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        delay_step_ms: int | None = None,
        written_ms: int | None = None,
    ) -> Handled | Delivery:
        """One record of the channel topic, or (``delay_step_ms`` given) of its delay topic for
        that step, written at ``written_ms`` (the record's timestamp): the delivery to claim, or
        what becomes of the record at once (undecodable, not due: held or moved on)."""
        try:
            if value is None:
                raise ValueError("empty record")
            if delay_step_ms is not None:
                d = records.from_delay_record(value, key=key, lane=self.lane)
            else:
                d = records.from_channel_record(value, key=key, lane=self.lane, source_topic=topic)
        except Exception as exc:  # noqa: BLE001 - any decoding failure: dead-letter, never drop
            return self._undecodable(topic, partition, offset, key, value or b"", exc)
        now = self._clock_ms()
        if d.not_before_ms > now:
            return self._not_due(d, now, delay_step_ms, now if written_ms is None or written_ms <= 0 else written_ms)
        return d

    async def handle(
        self,
        *,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        delay_step_ms: int | None = None,
        written_ms: int | None = None,
    ) -> Handled:
        """One record all the way (the steps a worker takes for many at once); blocking store
        work runs on a thread."""
        first = self.decode(
            topic=topic, partition=partition, offset=offset, key=key, value=value,
            delay_step_ms=delay_step_ms, written_ms=written_ms,
        )
        if isinstance(first, Handled):
            return first
        [claimed] = await asyncio.to_thread(self.claim_batch, [first])
        if isinstance(claimed, Handled):
            return claimed
        result = await self.call(claimed)
        [done] = await asyncio.to_thread(self.finish_batch, [(claimed, result)])
        return done

    def housekeeping_due(self) -> bool:
        return self._prune_interval_ms > 0 and self._clock_ms() >= self._next_prune_ms

    def housekeeping(self) -> None:
        """Between batches: prune the status store when it is time (a failure waits for the next).
        Blocks."""
        if not self.housekeeping_due():
            return
        now = self._clock_ms()
        self._next_prune_ms = now + self._prune_interval_ms
        try:
            dropped = self.store.prune(now, self.rules.retention_ms)
        except StoreUnavailableError as exc:
            logger.warning("pruning the status store failed: %s", exc)
            return
        if dropped:
            logger.info(
                "pruned %d rows older than the retention (%d ms) from the status store",
                dropped,
                self.rules.retention_ms,
            )
        self.metrics.inc("sender_store_pruned_total", dropped)

    def _not_due(self, d: Delivery, now: int, step_ms: int | None, written_ms: int) -> Handled:
        if step_ms is None:  # a first attempt with a due time: none are written so, but be safe
            return Handled(hold_until_ms=d.not_before_ms)
        place = place_delayed(
            not_before_ms=d.not_before_ms, written_ms=written_ms, step_ms=step_ms, now_ms=now, policy=self.policy
        )
        if place.action is DelayAction.HOLD:
            return Handled(hold_until_ms=place.until_ms)
        logger.debug("moving %s attempt %d on to the %d ms delay topic", d.message_key, d.attempt, place.step_ms)
        self.metrics.inc("sender_retries_moved_total", **self._labels)
        return Handled([self._retry_record(d, d.attempt, place.not_before_ms, d.last_error, place.step_ms)])

    def claim_batch(self, deliveries: Sequence[Delivery]) -> list[Handled | SendJob]:
        """Rule on and claim these deliveries (their profiles read in one transaction, their
        claims made in one): for each, what to produce now, or the call to make. Blocks."""
        if not deliveries:
            return []
        reads = self.profiles.read_many([d.user_id for d in deliveries], self.channel)
        addresses = {
            c.address
            for read in reads.values()
            if isinstance(read, ProfileRead)
            for c in read.contacts.of(self.channel)
            if c.active
        }
        inactive = inactive_since_many(self.store.db, self.channel, addresses)
        now = self._clock_ms()  # after the reads (decrypting takes a while): the leases start now
        rulings = [self._prepare(d, reads[d.user_id], inactive, now) for d in deliveries]
        claimed = claim_many(
            self.store.db,
            [
                ClaimRequest(
                    message_key=d.message_key,
                    notification_id=d.notification_id,
                    channel=d.channel,
                    lane=self.lane,
                    attempt=d.attempt,
                    user_id=d.user_id,
                    rules=ruling.verdict if isinstance(ruling, Ruling) else None,
                    limits=ruling.limits if isinstance(ruling, Ruling) else (),
                )
                for d, ruling in zip(deliveries, rulings, strict=True)
            ],
            now_ms=now,
            lease_ms=self.lease_ms,
            owner=self.owner,
        )
        return [
            self._after_claim(d, now, ruling, *c) for d, ruling, c in zip(deliveries, rulings, claimed, strict=True)
        ]

    def _after_claim(
        self,
        d: Delivery,
        now: int,
        ruling: Ruling | str,
        decision: ClaimDecision,
        row: StatusRow | None,
        verdict: RuleVerdict | None,
    ) -> Handled | SendJob:
        if decision.action is ClaimAction.SKIP:
            logger.debug("skip %s attempt %d: %s", d.message_key, d.attempt, decision.reason)
            self.metrics.inc("sender_skipped_total", **self._labels)
            self._emit(AttemptEvent(d.channel, self.lane, d.message_key, d.attempt, "ignored", detail=decision.reason))
            return Handled()
        if decision.action is ClaimAction.WAIT:
            return Handled(hold_until_ms=decision.until_ms)
        if decision.action is ClaimAction.DEFER:
            # a record of a deferred message before its time: back to wait in the delay topic
            return Handled([self._deferral_record(d, decision.until_ms, now)])
        if decision.action is ClaimAction.REPUBLISH:
            assert row is not None
            logger.debug("republishing the outcome of %s attempt %d", d.message_key, d.attempt)
            return Handled(self._republish(d, row), [(d.message_key, row.attempts)])
        if verdict is not None and not verdict.send:
            return self._ruled(d, verdict, now)
        template = ruling.template if isinstance(ruling, Ruling) else None
        job = SendJob(d, now, [self._status(d, DeliveryStatus.SENDING, d.attempt, now, template=template)], template)
        if isinstance(ruling, Ruling) and ruling.rendered is not None and ruling.address is not None:
            job.rendered, job.address = ruling.rendered, ruling.address
            job.template = TemplateRef(ruling.rendered.template, ruling.rendered.version, ruling.rendered.locale)
        elif isinstance(ruling, str):
            job.reason = ruling
        return job

    def _prepare(
        self, d: Delivery, read: ProfileRead | ProfileError, inactive: Mapping[str, int], now: int
    ) -> Ruling | str:
        """The rules of the delivery, or why its contacts cannot be read (then the attempt fails
        transiently and is retried: nothing can be sent without them)."""
        if isinstance(read, ProfileError):  # a contact no configured key decrypts, a damaged row
            logger.warning("the profile of %s cannot be read: %s", d.message_key, type(read).__name__)
            return "contacts cannot be read (check senders.contact_encryption_keys)"
        return self.rules.prepare(d, read.preferences, self._usable(d.channel, read, inactive), now)

    def _usable(self, channel: Channel, read: ProfileRead, inactive: Mapping[str, int]) -> Contacts:
        """The contacts with those a provider deactivated marked inactive; one deactivated before
        the user registered it again is reactivated."""
        contacts = read.contacts.of(channel)
        if not any(c.active and c.address in inactive for c in contacts):
            return read.contacts  # none deactivated: the common case
        kept = tuple(
            c
            if not c.active
            or self._active(channel, c.address, read.registered_ms.get((channel, c.address), 0), inactive)
            else c.model_copy(update={"active": False})
            for c in contacts
        )
        if kept == contacts:
            return read.contacts
        return read.contacts.model_copy(update={channel.value: kept})

    def _active(self, channel: Channel, address: str, registered_ms: int, inactive: Mapping[str, int]) -> bool:
        since = inactive.get(address)
        if since is None:
            return True
        if registered_ms > since and self.store.reactivate(channel, address):
            logger.info("%s address registered again after its deactivation: reactivated", channel)
            self.metrics.inc("sender_addresses_reactivated_total", **self._labels)
            return True
        return False

    def _ruled(self, d: Delivery, verdict: RuleVerdict, now: int) -> Handled:
        """A rule's outcome, recorded in the claim's transaction: its status (and, deferred, the
        record that brings the message back when due)."""
        assert verdict.status is not None
        outputs = self._outcome_records(
            d,
            status=verdict.status,
            attempt=d.attempt,
            provider=None,
            error=None,
            retry_at_ms=None,
            dead_letter=None,
            now_ms=now,
            reason=verdict.reason,
            not_before_ms=verdict.not_before_ms,
            template=verdict.template,
        )
        logger.debug("%s attempt %d %s: %s", d.message_key, d.attempt, verdict.status, verdict.reason)
        reason = (verdict.reason or "").split(":", 1)[0]
        self.metrics.inc("sender_rule_outcomes_total", status=verdict.status.value, reason=reason, **self._labels)
        self._emit(
            AttemptEvent(
                d.channel,
                self.lane,
                d.message_key,
                d.attempt,
                verdict.status.value,
                detail=verdict.reason or "",
                not_before_ms=verdict.not_before_ms,
                template=verdict.template,
            )
        )
        return Handled(outputs, [(d.message_key, d.attempt)])

    # -- one attempt ------------------------------------------------------------------------------

    async def call(self, job: SendJob) -> AttemptResult:
        """The provider call of a claimed message, within what its lease leaves (no call starts
        that could outlive it). On the event loop; many at once."""
        if not job.can_send:
            return AttemptResult(AttemptOutcome.TRANSIENT, job.reason)
        assert job.address is not None and job.rendered is not None
        budget = send_budget_s(self.lease_ms, self._clock_ms() - job.claimed_at_ms)
        return await self.dispatcher.send(job.delivery, job.address, job.rendered, budget_s=budget, promised=True)

    def finish_batch(self, done: Sequence[tuple[SendJob, AttemptResult]]) -> list[Handled]:
        """Record the outcomes of these calls in one transaction, and build their records. An
        outcome whose claim was lost (the lease ran out mid-call and another worker took the
        message over) is that worker's to record. Blocks."""
        if not done:
            return []
        now = self._clock_ms()
        plans = [
            plan_outcome(result, attempt=job.delivery.attempt, policy=self.policy, now_ms=now, rand=self._rand())
            for job, result in done
        ]
        requests = [
            FinishRequest(
                message_key=job.delivery.message_key,
                attempt=job.delivery.attempt,
                plan=plan,
                provider=result.provider,
                error=result.reason or None,
                now_ms=now,
                deactivate=(job.delivery.channel, job.address)
                if plan.deactivate_address and job.address is not None
                else None,
                provider_ref=result.reference,
            )
            for (job, result), plan in zip(done, plans, strict=True)
        ]
        lease_left_s = (min(job.claimed_at_ms for job, _ in done) + self.lease_ms - self._clock_ms()) / 1000
        recorded = self._record(lambda: finish_many(self.store.db, requests, owner=self.owner), lease_left_s)
        out: list[Handled] = []
        answered: list[tuple[Delivery, OutcomePlan, AttemptResult]] = []
        for (job, result), plan, ok in zip(done, plans, recorded, strict=True):
            d = job.delivery
            if not ok:
                logger.warning("lost the claim on %s attempt %d during the call", d.message_key, d.attempt)
                self.metrics.inc("sender_lost_claims_total", **self._labels)
                out.append(Handled(list(job.outputs)))
                continue
            error = result.reason or None
            outputs = job.outputs + self._outcome_records(
                d,
                status=plan.status,
                attempt=d.attempt,
                provider=result.provider,
                error=error,
                retry_at_ms=plan.retry_at_ms,
                dead_letter=plan.dead_letter,
                now_ms=now,
                template=job.template,
            )
            self._count(d, plan, result, job.template)
            answered.append((d, plan, result))
            out.append(Handled(outputs, [(d.message_key, d.attempt)]))
        slis.record_answers(self.metrics, self.lane, answered, answered_ms=now, prices=self._prices)
        return out

    @staticmethod
    def _record(finish: Callable[[], list[bool]], budget_s: float) -> list[bool]:
        """Record outcomes, retrying while the store is unavailable and the claims' leases last:
        the provider has been called, and an outcome never recorded means a second send once the
        lease runs out."""
        deadline = time.monotonic() + budget_s
        pause = 0.05
        while True:
            try:
                return finish()
            except StoreUnavailableError:
                if time.monotonic() + pause >= deadline:
                    raise
                logger.warning("status store unavailable: retrying the outcomes for %.1f s more", budget_s)
                time.sleep(pause)
                pause = min(pause * 2, 1.0)

    def _count(self, d: Delivery, plan: OutcomePlan, result: AttemptResult, template: TemplateRef | None) -> None:
        retry_in = None
        if plan.retry_at_ms is not None:
            self.metrics.inc("sender_retries_total", **self._labels)
            retry_in = plan.retry_at_ms - self._clock_ms()
        if plan.dead_letter is not None:
            self.metrics.inc("sender_dead_letters_total", reason=plan.dead_letter.value, **self._labels)
        if plan.deactivate_address:
            self.metrics.inc("sender_addresses_deactivated_total", **self._labels)
        if self._on_attempt is None:
            return
        self._emit(
            AttemptEvent(
                d.channel,
                self.lane,
                d.message_key,
                d.attempt,
                result.outcome.value,
                result.provider,
                result.reason,
                retry_in,
                plan.dead_letter.value if plan.dead_letter else None,
                template=template,
            )
        )

    # -- records ----------------------------------------------------------------------------------

    def _status(
        self,
        d: Delivery,
        status: DeliveryStatus,
        attempt: int,
        at_ms: int,
        provider: str | None = None,
        error: str | None = None,
        retry_at_ms: int | None = None,
        reason: str | None = None,
        not_before_ms: int | None = None,
        template: TemplateRef | None = None,
    ) -> Output:
        value = records.status_record(
            d,
            status=status,
            attempt=attempt,
            at_ms=at_ms,
            provider=provider,
            error=error,
            retry_at_ms=retry_at_ms,
            reason=reason,
            not_before_ms=not_before_ms,
            template=template,
        )
        return Output(self.topics.status, d.message_key.encode(), codec.encode("delivery_status", value))

    def _outcome_records(
        self,
        d: Delivery,
        *,
        status: DeliveryStatus,
        attempt: int,
        provider: str | None,
        error: str | None,
        retry_at_ms: int | None,
        dead_letter: DeadLetterReason | None,
        now_ms: int,
        reason: str | None = None,
        not_before_ms: int | None = None,
        template: TemplateRef | None = None,
    ) -> list[Output]:
        out = [self._status(d, status, attempt, now_ms, provider, error, retry_at_ms, reason, not_before_ms, template)]
        if status is DeliveryStatus.QUEUED and retry_at_ms is not None:
            step = self.policy.step_for(retry_at_ms - now_ms)
            out.append(self._retry_record(d, attempt + 1, retry_at_ms, error or "", step))
        if status is DeliveryStatus.DEFERRED and not_before_ms is not None:
            # the same attempt comes back: a deferral makes no provider call
            out.append(self._deferral_record(d, not_before_ms, now_ms, reason or ""))
        if dead_letter is not None:
            called = dead_letter not in (DeadLetterReason.ADDRESS_INACTIVE, DeadLetterReason.NO_ADDRESS)
            letter = records.dead_letter_record(
                message_key=d.message_key,
                channel=d.channel,
                lane=self.lane,
                reason_kind=dead_letter,
                reason=error or dead_letter.value,
                attempts=attempt if called else attempt - 1,
                provider=provider,
                source_topic=d.source_topic,
                payload=d.payload,
                at_ms=now_ms,
            )
            out.append(Output(self.topics.dlq, d.message_key.encode(), codec.encode("dead_letter", letter)))
        return out

    def _deferral_record(self, d: Delivery, not_before_ms: int, now_ms: int, reason: str = "") -> Output:
        step = self.policy.step_for(not_before_ms - now_ms)
        return self._retry_record(d, d.attempt, not_before_ms, f"deferred: {reason}" if reason else "deferred", step)

    def _retry_record(self, d: Delivery, attempt: int, not_before_ms: int, error: str, step_ms: int) -> Output:
        retry = records.delay_record(d, attempt=attempt, not_before_ms=not_before_ms, last_error=error)
        return Output(self.topics.delay(d.source_topic, step_ms), d.kafka_key, codec.encode("delayed_delivery", retry))

    def _republish(self, d: Delivery, row: StatusRow) -> list[Output]:
        return self._outcome_records(
            d,
            status=row.status,
            attempt=row.attempts,
            provider=row.provider,
            error=row.last_error,
            retry_at_ms=row.retry_at_ms,
            dead_letter=row.dead_letter,
            now_ms=row.updated_ms,
            reason=row.reason,
            not_before_ms=row.not_before_ms,
            template=row.template,
        )

    def _undecodable(
        self, topic: str, partition: int, offset: int, key: bytes | None, value: bytes, exc: Exception
    ) -> Handled:
        logger.warning("undecodable record at %s[%d]@%d: %s", topic, partition, offset, type(exc).__name__)
        self.metrics.inc("sender_dead_letters_total", reason=DeadLetterReason.UNDECODABLE.value, **self._labels)
        letter = records.dead_letter_record(
            message_key=None,
            channel=self.channel,
            lane=self.lane,
            reason_kind=DeadLetterReason.UNDECODABLE,
            reason=f"{type(exc).__name__}: {exc}"[:500],
            attempts=0,
            provider=None,
            source_topic=topic,
            payload=value,
            at_ms=self._clock_ms(),
        )
        return Handled([Output(self.topics.dlq, key, codec.encode("dead_letter", letter))])

    def _emit(self, event: AttemptEvent) -> None:
        if self._on_attempt is not None:
            self._on_attempt(event)
