"""Builds a process's sender workers from Settings and runs them, one thread each."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from operators.errors import ConfigError
from operators.records import Channel, Priority
from operators.tracing import OFF, Tracing, start_tracing
from ops import kafka_io
from senders.errors import InstanceInUseError
from senders.policy.leases import check_lease
from senders.policy.restarts import FenceWatch, RestartPolicy
from senders.profiles.crypto import ContactCipher
from senders.providers import PROVIDER_SPECS, Provider, build_provider, provider_label
from senders.runtime.dispatch import Dispatcher
from senders.runtime.handler import AttemptEvent, DeliveryHandler, HandlerTopics
from senders.runtime.identity import ProcessIdentity
from senders.runtime.metrics import Metrics
from senders.runtime.ruling import RulesContext
from senders.runtime.threads import name_os_thread
from senders.runtime.worker import SenderWorker, WorkerOptions
from senders.statuses import Lane
from senders.store.db import Database
from senders.store.profiles import ProfileCache, ProfileStore
from senders.store.status import StatusStore, open_store
from senders.templates.catalog import Catalog, load_catalog
from settings import Settings

logger = logging.getLogger(__name__)

ALL_CHANNELS = tuple(Channel)
ALL_LANES = tuple(Lane)


def source_topic(cfg: Settings, channel: Channel, lane: Lane) -> str:
    return cfg.topics.channel_topic(channel, Priority.HIGH if lane is Lane.PRIORITY else Priority.NORMAL)


def group_id(cfg: Settings, channel: Channel, lane: Lane) -> str:
    return f"{cfg.senders.group_prefix}.{channel.value}.{lane.value}"


def sender_topics(
    cfg: Settings, channels: Iterable[Channel] = ALL_CHANNELS, lanes: Iterable[Lane] = ALL_LANES
) -> list[str]:
    """The topics the senders write: status, dead letters, and the delay topics of each lane."""
    names = [cfg.senders.status_topic, cfg.senders.dlq_topic]
    for channel in channels:
        for lane in lanes:
            names += cfg.senders.delay_topics(source_topic(cfg, channel, lane)).values()
    return names


def ensure_topics(
    cfg: Settings, channels: Iterable[Channel] = ALL_CHANNELS, lanes: Iterable[Lane] = ALL_LANES
) -> dict[str, str]:
    return kafka_io.ensure_topics(cfg.kafka, sender_topics(cfg, channels, lanes))


def store_location(cfg: Settings) -> str:
    return cfg.senders.status_store or str(cfg.data_path() / "senders" / "status.sqlite3")


def open_status_store(cfg: Settings) -> StatusStore:
    s = cfg.senders
    password = s.status_store_password.get_secret_value() if s.status_store_password else None
    return open_store(
        store_location(cfg),
        synchronous=s.sqlite_synchronous,
        password=password,
        busy_timeout_ms=s.sqlite_busy_timeout_ms,
    )


def contact_cipher(cfg: Settings) -> ContactCipher:
    """The contacts' keys from the settings; a ConfigError naming the settings when missing."""
    s = cfg.senders
    missing = [n for n in ("contact_encryption_keys", "contact_lookup_keys") if getattr(s, n) is None]
    if missing:
        raise ConfigError(
            f"set senders.{' and senders.'.join(missing)} (DEDUP_SENDERS_{missing[0].upper()}): the contacts"
            " at rest are encrypted and found by a keyed hash; `dedupctl users keygen` makes a key"
        )
    return ContactCipher.from_options(s.contact_keys())


def open_profile_store(cfg: Settings, store: StatusStore | None = None) -> ProfileStore:
    """The profiles, in the status store's database (``store``'s connection, or a new one)."""
    return ProfileStore((store or open_status_store(cfg)).db, contact_cipher(cfg))


def rules_context(cfg: Settings, catalog: Catalog | None = None) -> RulesContext:
    """What the rules need, from the settings: the templates (loaded and validated now: a bad
    directory stops the start with its problems), the limits, the retention."""
    s = cfg.senders
    options = s.template_options()
    cipher = contact_cipher(cfg)
    return RulesContext(
        catalog=catalog if catalog is not None else load_catalog(options),
        rules=s.rule_options(),
        templates=options,
        recipient_id=cipher.lookup_hash,
        retention_ms=s.retention_ms(cfg.dedup.max_window_sec),
    )


def build_dispatchers(
    cfg: Settings,
    channels: Iterable[Channel],
    metrics: Metrics,
    providers: Mapping[Channel, tuple[Provider, Provider | None]] | None = None,
    workers_per_channel: int = 1,
    tracing: Tracing = OFF,
) -> dict[Channel, Dispatcher]:
    """One dispatcher per channel; ``providers`` replaces the configured ones (tests, the demo).
    A provider's connections are sized for the calls of the ``workers_per_channel`` workers that
    share it (``senders.max_in_flight`` each)."""
    out = {}
    connections = cfg.senders.max_in_flight * max(1, workers_per_channel)
    for channel in channels:
        if providers and channel in providers:
            primary, secondary = providers[channel]
        else:
            primary_spec, secondary_spec = cfg.senders.providers(channel)
            if not primary_spec:
                raise ConfigError(
                    f"no provider for {channel}: set senders.{channel.value}_primary"
                    f" ({PROVIDER_SPECS}), or leave the channel out with --channel"
                )
            primary = build_provider(
                primary_spec,
                name=provider_label(primary_spec),
                settings=cfg.senders,
                metrics=metrics,
                max_connections=connections,
                data_dir=cfg.data_path(),
            )
            secondary = None
            if secondary_spec:
                label = provider_label(secondary_spec)
                secondary = build_provider(
                    secondary_spec,
                    name=label if label != primary.name else f"{label}-2",
                    settings=cfg.senders,
                    metrics=metrics,
                    max_connections=connections,
                    data_dir=cfg.data_path(),
                )
        out[channel] = Dispatcher(
            channel=channel,
            primary=primary,
            secondary=secondary,
            limit=cfg.senders.rate_limit(channel),
            breaker=cfg.senders.breaker_options(),
            metrics=metrics,
            tracing=tracing,
        )
    return out


#: the upper bounds of the store's write-lock histograms (seconds)
STORE_LOCK_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


def watch_store(metrics: Metrics, db: Database, channel: Channel, lane: Lane) -> None:
    """A worker's store connection counted: its committed transactions
    (``sender_store_transactions_total``) and, on SQLite, each write transaction's wait for the
    file's write lock and how long it then held it (``sender_store_lock_wait_seconds``,
    ``sender_store_lock_held_seconds``: a code's claim waits for the campaign's)."""
    labels = {"channel": channel.value, "lane": lane.value}
    committed = metrics.counter_key("sender_store_transactions_total", **labels)
    db.on_commit = lambda: metrics.add((committed, 1.0))
    db.on_lock_wait = lambda s: metrics.observe("sender_store_lock_wait_seconds", s, STORE_LOCK_BUCKETS, **labels)
    db.on_lock_held = lambda s: metrics.observe("sender_store_lock_held_seconds", s, STORE_LOCK_BUCKETS, **labels)


def _without_frames(exc: BaseException) -> BaseException:
    """The failure as kept in ``errors``: without its tracebacks (and its causes'). A traceback
    keeps the failed run's frames, so its Kafka clients: a producer whose init_transactions
    failed would stay alive and reconnect to a broker that is gone for as long as the pool is
    kept (librdkafka's "Connect ... refused" lines long after the outage)."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        link.__traceback__ = None
        link = link.__cause__ or link.__context__
    return exc


def _is_fenced(exc: BaseException) -> bool:
    error = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    return isinstance(error, KafkaError) and error.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


def _send_deadlines(dispatchers: Iterable[Dispatcher]) -> dict[str, float]:
    out: dict[str, float] = {}
    for d in dispatchers:
        for p in (d.primary, d.secondary):
            if p is not None and p.timeout_s is not None:
                out[p.deadline_setting] = max(out.get(p.deadline_setting, 0.0), p.timeout_s * 1000)
    return out


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop where it is installed (a third of the default loop's CPU per provider call here),
    else asyncio's own."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvicorn[standard] brings it
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


@dataclass
class SenderPool:
    """The workers of one process, on one event loop in one thread (the providers' calls are
    its I/O; each worker's blocking work runs on the worker's own threads). Each worker is
    supervised: a failed worker backs off and starts again (a new consumer and producer, the
    store reconnected), so one channel's trouble never stops another. Only losing the process's
    identity (its instance id taken by a live process) stops them all: ``fatal`` says why."""

    workers: list[SenderWorker]
    metrics: Metrics
    dispatchers: dict[Channel, Dispatcher]
    identity: ProcessIdentity | None = None
    restarts: RestartPolicy = field(default_factory=RestartPolicy)
    stop_event: threading.Event = field(default_factory=threading.Event)
    #: every failure a worker had (it was restarted after each, unless ``fatal`` is set)
    errors: list[BaseException] = field(default_factory=list)
    fatal: InstanceInUseError | None = None
    #: the process's traces (``[telemetry]``): flushed when the pool stops
    tracing: Tracing = OFF
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> SenderPool:
        """Hold the process's instance id, then start the workers; raises InstanceInUseError
        (and starts nothing) when another live process holds it."""
        if self.identity is not None:
            try:
                self.identity.acquire()
            except BaseException:
                self._close_stores()
                self.identity.release()
                raise
            self.identity.start_heartbeat(self._lose_identity)
        thread = threading.Thread(target=self._serve, name="senders", daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def _serve(self) -> None:
        name_os_thread("snd-loop")
        loop = new_event_loop()
        try:
            loop.run_until_complete(self._main())
        finally:
            loop.close()

    async def _main(self) -> None:
        lag = asyncio.get_running_loop().create_task(self._watch_loop_lag())
        try:
            await asyncio.gather(*(self._supervise(worker) for worker in self.workers))
        finally:
            lag.cancel()
            for dispatcher in self.dispatchers.values():
                try:
                    await dispatcher.aclose()
                except Exception:  # noqa: BLE001 - closing connections on the way out
                    logger.debug("closing the providers of %s failed", dispatcher.channel, exc_info=True)

    async def _watch_loop_lag(self, interval_s: float = 0.1) -> None:
        """How late the event loop runs what is due (blocking work on it shows here): the worst
        lag of each second, ``sender_loop_lag_seconds``."""
        worst, window_end = 0.0, time.monotonic() + 1.0
        while True:
            start = time.monotonic()
            await asyncio.sleep(interval_s)
            worst = max(worst, time.monotonic() - start - interval_s)
            if time.monotonic() >= window_end:
                self.metrics.set("sender_loop_lag_seconds", worst)
                worst, window_end = 0.0, time.monotonic() + 1.0

    def _lose_identity(self, reason: str) -> None:
        logger.error("%s", reason)
        self.fatal = InstanceInUseError(reason)
        self.stop_event.set()

    async def _pause(self, seconds: float) -> None:
        """Sleep, but no longer than until the pool is told to stop."""
        end = time.monotonic() + seconds
        while not self.stop_event.is_set() and time.monotonic() < end:
            await asyncio.sleep(min(0.05, end - time.monotonic()))

    async def _supervise(self, worker: SenderWorker) -> None:
        labels: dict[str, Any] = {"channel": worker.handler.channel.value, "lane": worker.handler.lane.value}
        fences = FenceWatch(self.restarts)
        failures = 0
        try:
            while not self.stop_event.is_set():
                started = time.monotonic()
                try:
                    await worker.run(self.stop_event)
                    return
                except Exception as exc:  # noqa: BLE001 - any failure: back off and start again
                    logger.debug("%s failure", worker.name, exc_info=True)
                    self.errors.append(_without_frames(exc))
                    self.metrics.set("sender_worker_up", 0, **labels)
                    if _is_fenced(exc) and await asyncio.to_thread(self._fenced_for_good, worker, fences):
                        return
                    failures = self.restarts.failures_after(failures, (time.monotonic() - started) * 1000)
                    delay = self.restarts.delay_ms(failures) / 1000
                    logger.warning("%s failed (%s): starting again in %.1f s", worker.name, _describe(exc), delay)
                    self.metrics.inc("sender_worker_restarts_total", **labels)
                    await self._pause(delay)
        finally:
            self.metrics.set("sender_worker_up", 0, **labels)
            worker.handler.store.close()

    def _fenced_for_good(self, worker: SenderWorker, fences: FenceWatch) -> bool:
        """A fenced producer starts again (it fences the zombie back), unless another live
        process holds our instance id or the fencing goes round in a loop."""
        taken = self.identity is not None and not self.identity.still_ours()
        if taken or fences.fenced(time.monotonic() * 1000):
            self._lose_identity(
                f"{worker.name}: the producer {worker.options.transactional_id!r} keeps being fenced by"
                " another live producer with the same transactional id: is senders.instance_id"
                f" {self.identity.instance_id if self.identity else ''!r} used by two processes?"
                " Give each `senders run` process its own senders.instance_id"
            )
            return True
        return False

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        for worker in self.workers:
            if not worker.ready.wait(max(0.0, deadline - time.monotonic())):
                raise TimeoutError(f"{worker.name} got no partitions within {timeout_s:.0f} s")

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop the workers: each finishes its open calls, records and commits them."""
        self.stop_event.set()
        for thread in self._threads:
            thread.join(timeout_s)
        if not self._threads:
            self._close_stores()
        if self.identity is not None:
            self.identity.release()
        self.tracing.shutdown()

    def _close_stores(self) -> None:
        for worker in self.workers:
            worker.handler.store.close()

    def alive(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    def __enter__(self) -> SenderPool:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def build_pool(
    cfg: Settings,
    *,
    channels: Sequence[Channel] = ALL_CHANNELS,
    lanes: Sequence[Lane] = ALL_LANES,
    workers_per_lane: int = 1,
    providers: Mapping[Channel, tuple[Provider, Provider | None]] | None = None,
    metrics: Metrics | None = None,
    on_attempt: Callable[[AttemptEvent], None] | None = None,
    catalog: Catalog | None = None,
    clock_ms: Callable[[], int] | None = None,
) -> SenderPool:
    """Workers for each channel and lane (``workers_per_lane`` of each, one consumer group per
    channel and lane); the dispatchers (providers, breakers, rate limits) are shared. ``clock_ms``
    replaces the rules' and the handlers' clock (a test, or a demo at night somewhere)."""
    s = cfg.senders
    metrics = metrics if metrics is not None else Metrics()
    tracing = start_tracing(cfg.telemetry.otlp_endpoint, cfg.telemetry.service("senders"),
                            sample_ratio=cfg.telemetry.sample_ratio)
    dispatchers = build_dispatchers(cfg, channels, metrics, providers, len(lanes) * workers_per_lane, tracing)
    check_lease(s.lease_ms, _send_deadlines(dispatchers.values()))
    rules = rules_context(cfg, catalog)
    cipher = contact_cipher(cfg)
    clock = {"clock_ms": clock_ms} if clock_ms is not None else {}
    instance = s.instance_id or uuid.uuid4().hex[:12]
    policy = s.retry_policy()
    prices = s.prices()
    topics = HandlerTopics(
        status=s.status_topic, dlq=s.dlq_topic, delay=lambda topic, step: s.delay_topics(topic)[step]
    )
    workers: list[SenderWorker] = []
    for channel in channels:
        for lane in lanes:
            source = source_topic(cfg, channel, lane)
            for n in range(workers_per_lane):
                name = f"{channel.value}.{lane.value}.{n}"
                txn_id = f"{group_id(cfg, channel, lane)}.{instance}.{n}"
                store = open_status_store(cfg)
                watch_store(metrics, store.db, channel, lane)
                handler = DeliveryHandler(
                    channel=channel,
                    lane=lane,
                    store=store,
                    dispatcher=dispatchers[channel],
                    profiles=ProfileCache(ProfileStore(store.db, cipher), s.profile_cache_ttl_ms),
                    rules=rules,
                    policy=policy,
                    topics=topics,
                    lease_ms=s.lease_ms,
                    owner=f"{txn_id}/{uuid.uuid4().hex[:8]}",
                    metrics=metrics,
                    on_attempt=on_attempt,
                    prune_interval_ms=s.prune_interval_ms if not workers else 0,  # the first worker prunes
                    prices=prices,
                    **clock,
                )
                options = WorkerOptions(
                    group_id=group_id(cfg, channel, lane),
                    transactional_id=txn_id,
                    source_topic=source,
                    delay_topics={name: step for step, name in s.delay_topics(source).items()},
                    batch_size=s.batch_size,
                    poll_timeout_s=s.poll_timeout_ms / 1000,
                    session_timeout_ms=s.session_timeout_ms,
                    transaction_timeout_ms=s.transaction_timeout_ms,
                    kafka_timeout_s=s.kafka_timeout_ms / 1000,
                    max_in_flight=s.max_in_flight,
                    claim_batch=s.claim_batch,
                    buffered_records=s.buffered_records,
                    commit_interval_s=s.commit_interval_ms / 1000,
                )
                workers.append(
                    SenderWorker(
                        name=name,
                        client_config=cfg.kafka.client_config(),
                        options=options,
                        handler=handler,
                        metrics=metrics,
                    )
                )
    identity = ProcessIdentity(open_status_store(cfg).db, instance_id=instance, ttl_ms=s.instance_ttl_ms)
    restarts = RestartPolicy(initial_ms=s.restart_backoff_ms, max_ms=s.restart_backoff_max_ms)
    return SenderPool(workers, metrics, dispatchers, identity=identity, restarts=restarts, tracing=tracing)
