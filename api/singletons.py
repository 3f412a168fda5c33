"""What runs once across the API processes of a store, in the process that holds the lease
(``api.leader``): the campaigns' runners, the reader of the job's verdicts, the pruning of old
records, the held receipts (api/receipts/held.py), and the making of the campaigns topic.
Started when the process is elected, stopped (campaigns after their batch) when it is not, or
when it stops.

The runners are started for every scheduled or running campaign in the store, looked for every
``api.campaign_poll_ms``: a campaign created, or resumed, through any process is picked up by
the holder within that time (at once when it came through the holder itself).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from confluent_kafka import KafkaException, Producer

from api import campaigns
from api.outcomes import OutcomeReader
from api.receipts.apply import status_record
from api.receipts.held import release
from api.receipts.model import ReceiptScheme
from api.store import prune
from operators import codec
from operators.contract import Topics
from ops import kafka_io
from senders.profiles.crypto import ContactCipher
from senders.store.db import Database
from settings.kafka import KafkaSettings

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SingletonsContext:
    """:param opener: a new connection of its own
    :param runner: the campaigns' runners' context
    :param kafka: the brokers, for the campaigns topic (made as every topic the tools make)
    """

    opener: Callable[[], Database]
    runner: campaigns.RunnerContext
    topics: Topics
    outcomes_group: str
    kafka: KafkaSettings
    prune_interval_s: float
    retention_ms: int
    campaign_poll_s: float
    held: HeldReceipts | None = None


@dataclass(frozen=True, slots=True)
class HeldReceipts:
    """What applying the held receipts needs: the providers' schemes, the contacts' cipher, the
    status topic the changes go to, how often and for how long."""

    schemes: Mapping[str, ReceiptScheme]
    cipher: ContactCipher
    status_topic: str
    interval_s: float
    ttl_ms: int
    client_config: Mapping[str, str] = field(default_factory=dict)


class Term:
    """One process's time as the holder: its threads, stopped together."""

    def __init__(self, ctx: SingletonsContext) -> None:
        self._ctx = ctx
        self._stop = threading.Event()
        self.campaigns = campaigns.CampaignManager(ctx.runner)
        self.outcomes = OutcomeReader(ctx.runner.client_config, ctx.topics, ctx.outcomes_group, ctx.opener)
        self.campaigns_topic_ready = False
        self._threads = [
            threading.Thread(target=self._ensure_campaigns_topic, name="api-campaigns-topic", daemon=True),
            threading.Thread(target=self._prune, name="api-prune", daemon=True),
            threading.Thread(target=self._poll_campaigns, name="api-campaigns-poll", daemon=True),
        ]
        if ctx.held is not None:
            self._threads.append(threading.Thread(target=self._release_held, args=(ctx.held,),
                                                  name="api-held-receipts", daemon=True))

    def start(self) -> Term:
        self.outcomes.start()
        for t in self._threads:
            t.start()
        return self

    def stop(self, timeout_s: float) -> None:
        self._stop.set()
        self.campaigns.stop(timeout_s)
        self.outcomes.stop(timeout_s)
        for t in self._threads:
            t.join(timeout_s)

    def _prune(self) -> None:
        """Every ``api.prune_interval_s``: expired idempotency keys, records older than the
        status store's retention, old rate windows."""
        db = None
        while not self._stop.wait(self._ctx.prune_interval_s):
            try:
                db = db or self._ctx.opener()
                dropped = prune(db, int(time.time() * 1000), self._ctx.retention_ms)
                if dropped:
                    logger.info("pruned %d expired idempotency keys and old records", dropped)
            except Exception:  # noqa: BLE001 - the next round tries again
                logger.exception("pruning the API's records failed")
        if db is not None:
            db.close()

    def _release_held(self, held: HeldReceipts) -> None:
        """Every ``api.held_receipts_interval_ms``: the held receipts whose message is recorded now,
        applied, their changes onto the status topic; those past their time dropped."""
        db, producer = None, None
        while not self._stop.wait(held.interval_s):
            try:
                db = db or self._ctx.opener()
                now = int(time.time() * 1000)
                done = release(db, held.cipher, held.schemes, now, held.ttl_ms)
                if done.dropped:
                    logger.warning("dropped %d held receipt(s): their message was not recorded as sent within %d s"
                                   " (or their provider is no longer configured)", done.dropped, held.ttl_ms // 1000)
                changed = [a.row for a in done.applied if a.changed and a.row is not None]
                if done.applied:
                    logger.info("applied %d held receipt(s), %d still held", len(done.applied), done.waiting)
                if changed:
                    producer = producer or Producer({**held.client_config, "enable.idempotence": "true",
                                                     "acks": "all"})
                    for row in changed:
                        producer.produce(held.status_topic, key=row.message_key.encode(),
                                         value=codec.encode("delivery_status", status_record(row, now)))
                    if producer.flush(10):  # the store has them: the status topic misses these changes
                        logger.warning("%d held receipt change(s) stored, not on the status topic", len(producer))
            except Exception:  # noqa: BLE001 - a store or broker outage: the next round tries again
                logger.exception("applying the held receipts failed")
        if db is not None:
            db.close()
        if producer is not None:
            producer.flush(5)

    def _ensure_campaigns_topic(self) -> None:
        """The campaigns' progress topic, made when the brokers answer (retried until then:
        the runners retry too)."""
        ctx, pause = self._ctx, 1.0
        while not self._stop.is_set():
            try:
                campaigns.ensure_topic(ctx.kafka, ctx.runner.campaigns_topic, timeout_s=10.0)
                self.campaigns_topic_ready = True
                return
            except (KafkaException, kafka_io.TopicError) as exc:
                logger.warning("the campaigns topic cannot be made yet (%s): again in %.0f s", exc, pause)
            self._stop.wait(pause)
            pause = min(pause * 2, 30.0)

    def _poll_campaigns(self) -> None:
        db = None
        while not self._stop.is_set():
            try:
                db = db or self._ctx.opener()
                self.campaigns.start_all(campaigns.active(db))
            except Exception:  # noqa: BLE001 - a store outage: the next look tries again
                logger.warning("looking for campaigns to run failed: again in %.1f s", self._ctx.campaign_poll_s)
            self._stop.wait(self._ctx.campaign_poll_s)
        if db is not None:
            db.close()


class Singletons:
    """Starts a Term when elected, stops it when deposed; ``kick`` starts a campaign at once
    when this process is the holder."""

    def __init__(self, ctx: SingletonsContext, stop_timeout_s: float) -> None:
        self._ctx = ctx
        self._stop_timeout_s = stop_timeout_s
        self._term: Term | None = None
        self._lock = threading.Lock()

    def elected(self) -> None:
        with self._lock:
            if self._term is None:
                self._term = Term(self._ctx).start()

    def deposed(self) -> None:
        with self._lock:
            term, self._term = self._term, None
        if term is not None:
            term.stop(self._stop_timeout_s)

    @property
    def term(self) -> Term | None:
        return self._term

    def kick(self, campaign_id: str) -> None:
        term = self._term
        if term is not None:
            term.campaigns.ensure_running(campaign_id)
