"""What the routes use, built from the settings once per process: the store's connections and its
writer, the Kafka producer, the templates, the contacts' keys, the callers' limits, the metrics,
and the election of the one process that runs the campaigns' runners, the reader of the job's
verdicts and pruning (``api.leader``, ``api.singletons``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from fastapi import Request

from api import campaigns
from api.accept import Reach
from api.backlog import Backlog
from api.backlog import Lane as BacklogLane
from api.database import StoreAccess
from api.idempotency import Terms
from api.leader import Elector
from api.metrics import ApiMetrics
from api.pool import StorePool
from api.producer import RequestProducer
from api.profile_cache import ProfileReads
from api.ratelimit import CallerLimits
from api.receipts.registry import receipt_schemes
from api.singletons import HeldReceipts, Singletons, SingletonsContext
from api.tokens import TokenCache
from api.writer import StoreWriter
from operators.limits import RequestLimits
from operators.records import Channel
from operators.tracing import OFF, Tracing, start_tracing
from senders.profiles.crypto import ContactCipher
from senders.runtime.pool import contact_cipher, group_id, source_topic
from senders.statuses import Lane
from senders.store.db import Database, is_postgres
from senders.store.profiles import ProfileStore
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
    budgets: StorePool  # the rate budgets' leases (``callers``)
    callers: CallerLimits
    singletons: Singletons
    elector: Elector
    writer: StoreWriter
    profiles: ProfileReads
    profile_reads: Database  # the store writer's connection for its profile reads
    metrics: ApiMetrics
    tracing: Tracing = OFF
    ready: bool = field(default=False)

    def start(self) -> None:
        """Start what runs beside the routes: the election of the process that runs the
        campaigns, the verdicts' reader and pruning. Nothing here waits for Kafka (those retry
        until the brokers answer)."""
        self.metrics.watch_gc()
        self.elector.start()
        self.ready = True

    def stop(self) -> None:
        self.ready = False
        timeout = self.cfg.api.shutdown_timeout_s
        self.elector.stop(timeout)  # what this process ran once stops first, then the lease goes
        self.producer.close(timeout)
        self.writer.stop(timeout)
        self.profile_reads.close()
        self.pool.close()
        self.budgets.close()
        self.metrics.unwatch_gc()
        self.tracing.shutdown()


def build_services(cfg: Settings) -> Services:
    """Everything the API needs; a wrong setting (store, keys, templates, secrets) stops the start."""
    s, api = cfg.senders, cfg.api
    store = StoreAccess.of(cfg)
    metrics = ApiMetrics()

    def timed(open_db: Callable[[], Database], connection: str) -> Callable[[], Database]:
        """``open_db``, its connections telling their write-lock waits to the metric."""
        wait = metrics.store_lock_wait.labels(connection)

        def opened() -> Database:
            db = open_db()
            db.on_lock_wait = wait.observe
            return db

        return opened

    opener = timed(store.open, "routes")

    def observe_store(queued_s: float, call_s: float) -> None:
        metrics.store_queue.observe(queued_s)
        metrics.store_call.observe(call_s)

    # SQLite takes one writer at a time: more threads only wait in its busy handler
    pool = StorePool(opener, api.store_threads if is_postgres(store.location) else 1, observe_store)
    # the rate budgets' leases: a thread of their own, on SQLite on the requests file alone, so a
    # lease waits neither for the senders' lock on the store file nor behind the pool's calls
    budgets = StorePool(timed(store.open_requests, "budgets"), 1, observe_store, prepare_tables=False)
    limits = cfg.dedup.request_limits()
    client = cfg.kafka.client_config()
    cipher = contact_cipher(cfg)
    profiles = ProfileReads(s.profile_cache_ttl_ms)
    reads = store.open_store()  # the store writer's profile reads (api.database: not the requests file)
    profile_store = ProfileStore(reads, cipher)

    def read_profiles(user_ids: Sequence[str]) -> dict[str, Reach]:
        out: dict[str, Reach] = {}
        missing = []
        for user_id in dict.fromkeys(user_ids):
            found = profiles.get(user_id)
            if found is None:
                missing.append(user_id)
            else:
                out[user_id] = found
        for user_id, read in (profile_store.flags_many(missing) if missing else {}).items():
            out[user_id] = reach = Reach.of(read)
            profiles.put(user_id, reach)  # kept only when the user has a profile
        return out

    def terms() -> Terms:
        # a key pending for longer than two acknowledgement timeouts was abandoned by its writer
        return Terms(int(time.time() * 1000), api.idempotency_ttl_s * 1000, 2 * api.ack_timeout_ms + 5_000)

    tracing = start_tracing(cfg.telemetry.otlp_endpoint, cfg.telemetry.service("api"),
                            sample_ratio=cfg.telemetry.sample_ratio)
    runner = campaigns.RunnerContext(
        client_config=client,
        requests_topic=cfg.topics.requests,
        campaigns_topic=api.campaigns_topic,
        transactional_id_prefix=api.transactional_id_prefix,
        batch_ms=api.campaign_batch_ms,
        limits=limits,
        opener=opener,
        kafka_timeout_s=s.kafka_timeout_ms / 1000,
        tracing=tracing,
        backlog=campaign_backlog(cfg).waiting if api.campaign_max_backlog > 0 else None,
        max_backlog=api.campaign_max_backlog,
        on_hold_start=metrics.hold_started,
        on_hold_end=metrics.hold_ended,
    )
    singletons = Singletons(
        SingletonsContext(opener=opener, runner=runner, topics=cfg.topics, outcomes_group=api.outcomes_group,
                          kafka=cfg.kafka, prune_interval_s=api.prune_interval_s,
                          retention_ms=s.retention_ms(cfg.dedup.max_window_sec),
                          campaign_poll_s=api.campaign_poll_ms / 1000,
                          held=HeldReceipts(receipt_schemes(cfg, api.webhook_secret_map()), cipher,
                                            cfg.senders.status_topic, api.held_receipts_interval_ms / 1000,
                                            api.held_receipts_ttl_s * 1000, client)),
        api.shutdown_timeout_s,
    )

    def elected() -> None:
        metrics.leader.set(1)
        singletons.elected()

    def deposed() -> None:
        singletons.deposed()
        metrics.leader.set(0)

    return Services(
        cfg=cfg,
        pool=pool,
        producer=RequestProducer(client, ack_timeout_ms=api.ack_timeout_ms, linger_ms=api.kafka_linger_ms,
                                 topic=cfg.topics.requests,
                                 probe_interval_s=api.kafka_probe_interval_ms / 1000,
                                 on_ack=metrics.kafka_ack.observe),
        catalog=load_catalog(s.template_options()),
        cipher=cipher,
        limits=limits,
        webhook_secrets=api.webhook_secret_map(),
        tokens=TokenCache(api.token_cache_ttl_ms / 1000, api.token_negative_ttl_ms / 1000),
        budgets=budgets,
        callers=CallerLimits(budgets.run, api.rate_lease_fraction,
                             on_lease=lambda bucket: metrics.rate_grants.labels(bucket).inc()),
        singletons=singletons,
        elector=Elector(opener, ttl_ms=api.lease_ttl_ms, on_elected=elected, on_deposed=deposed),
        writer=StoreWriter(timed(store.open_requests, "writer"), terms, read_profiles, api.writer_max_batch,
                           api.writer_round_ms / 1000, metrics.reservation_batch.observe, metrics.reservation.observe),
        profiles=profiles,
        profile_reads=reads,
        metrics=metrics,
        tracing=tracing,
    )


def campaign_backlog(cfg: Settings) -> Backlog:
    """The campaigns' back-pressure: each channel's normal-lane topic and its sender group."""
    lanes = {c.value: BacklogLane(source_topic(cfg, c, Lane.NORMAL), group_id(cfg, c, Lane.NORMAL)) for c in Channel}
    return Backlog(cfg.kafka.client_config(), lanes)


def services(request: Request) -> Services:
    found: Services = request.app.state.services
    return found
