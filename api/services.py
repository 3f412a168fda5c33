"""What the routes use, built from the settings once per process: the store's connections, the
Kafka producer, the templates, the contacts' keys, the callers' limits, the campaigns' runners
and the reader of the job's verdicts."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from confluent_kafka import KafkaException
from fastapi import Request

from api import campaigns
from api.completions import CompletionWriter
from api.outcomes import OutcomeReader
from api.pool import StorePool
from api.producer import RequestProducer
from api.profile_cache import ProfileReads
from api.ratelimit import CallerLimits
from api.store import prune
from api.tokens import TokenCache
from operators.limits import RequestLimits
from ops import kafka_io
from senders.profiles.crypto import ContactCipher
from senders.runtime.pool import contact_cipher, store_location
from senders.store.db import Database, open_database
from senders.templates.catalog import Catalog, load_catalog
from settings import Settings

logger = logging.getLogger(__name__)


@dataclass
class Services:
    cfg: Settings
    pool: StorePool
    producer: RequestProducer
    catalog: Catalog
    cipher: ContactCipher
    limits: RequestLimits
    webhook_secrets: dict[str, bytes]
    tokens: TokenCache
    callers: CallerLimits
    campaigns: campaigns.CampaignManager
    outcomes: OutcomeReader
    retention_ms: int
    completions: CompletionWriter
    profiles: ProfileReads
    ready: bool = field(default=False)
    campaigns_topic_ready: bool = field(default=False)
    _stop_pruning: threading.Event = field(default_factory=threading.Event)

    def _prune(self) -> None:
        """Every ``api.prune_interval_s``: expired idempotency keys, and records older than the
        status store's retention."""
        db = None
        while not self._stop_pruning.wait(self.cfg.api.prune_interval_s):
            try:
                db = db or self.pool.opener()
                dropped = prune(db, int(time.time() * 1000), self.retention_ms)
                if dropped:
                    logger.info("pruned %d expired idempotency keys and old records", dropped)
            except Exception:  # noqa: BLE001 - the next round tries again
                logger.exception("pruning the API's records failed")
        if db is not None:
            db.close()

    def _ensure_campaigns_topic(self) -> None:
        """The campaigns' progress topic, created when the brokers answer (retried until then:
        the campaigns' runners retry too)."""
        pause = 1.0
        while not self._stop_pruning.is_set():
            try:
                campaigns.ensure_topic(self.cfg.kafka, self.cfg.api.campaigns_topic, timeout_s=10.0)
                self.campaigns_topic_ready = True
                return
            except (KafkaException, kafka_io.TopicError) as exc:
                logger.warning("the campaigns topic cannot be made yet (%s): again in %.0f s", exc, pause)
            self._stop_pruning.wait(pause)
            pause = min(pause * 2, 30.0)

    def start(self) -> None:
        """Start what runs beside the routes; nothing here waits for Kafka (the topic, the
        verdicts' reader and the campaigns' runners each retry until the brokers answer)."""
        threading.Thread(target=self._ensure_campaigns_topic, name="api-campaigns-topic", daemon=True).start()
        self.outcomes.start()
        self.campaigns.start_all(campaigns.active(self.pool.db()))
        threading.Thread(target=self._prune, name="api-prune", daemon=True).start()
        self.ready = True

    def stop(self) -> None:
        self.ready = False
        self._stop_pruning.set()
        timeout = self.cfg.api.shutdown_timeout_s
        self.campaigns.stop(timeout)
        self.outcomes.stop(timeout)
        self.producer.close(timeout)
        self.completions.stop(timeout)
        self.pool.close()


def build_services(cfg: Settings) -> Services:
    """Everything the API needs; a wrong setting (store, keys, templates, secrets) stops the start."""
    s, api = cfg.senders, cfg.api
    password = s.status_store_password.get_secret_value() if s.status_store_password else None
    location = store_location(cfg)

    def opener() -> Database:
        return open_database(location, synchronous=api.sqlite_synchronous, password=password,
                             busy_timeout_ms=s.sqlite_busy_timeout_ms)

    # SQLite takes one writer at a time: more threads only wait in its busy handler
    shared = location.startswith(("postgresql://", "postgres://"))
    pool = StorePool(opener, api.store_threads if shared else 1)
    limits = cfg.dedup.request_limits()
    client = cfg.kafka.client_config()
    ctx = campaigns.RunnerContext(
        client_config=client,
        requests_topic=cfg.topics.requests,
        campaigns_topic=api.campaigns_topic,
        transactional_id_prefix=api.transactional_id_prefix,
        batch_ms=api.campaign_batch_ms,
        limits=limits,
        opener=opener,
        kafka_timeout_s=s.kafka_timeout_ms / 1000,
    )
    return Services(
        cfg=cfg,
        pool=pool,
        producer=RequestProducer(client, ack_timeout_ms=api.ack_timeout_ms, topic=cfg.topics.requests,
                                 probe_interval_s=api.kafka_probe_interval_ms / 1000),
        catalog=load_catalog(s.template_options()),
        cipher=contact_cipher(cfg),
        limits=limits,
        webhook_secrets=api.webhook_secret_map(),
        tokens=TokenCache(api.token_cache_ttl_ms / 1000, api.token_negative_ttl_ms / 1000),
        callers=CallerLimits(api.default_rate_per_sec),
        campaigns=campaigns.CampaignManager(ctx),
        outcomes=OutcomeReader(client, cfg.topics, api.outcomes_group, opener),
        retention_ms=s.retention_ms(cfg.dedup.max_window_sec),
        completions=CompletionWriter(opener),
        profiles=ProfileReads(s.profile_cache_ttl_ms),
    )


def services(request: Request) -> Services:
    found: Services = request.app.state.services
    return found
