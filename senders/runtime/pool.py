"""Builds a process's sender workers from Settings and runs them, one thread each."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from operators.errors import ConfigError
from operators.records import Channel, Priority
from ops import kafka_io
from senders.providers import Provider, build_provider, provider_label
from senders.runtime.dispatch import Dispatcher
from senders.runtime.handler import AttemptEvent, DeliveryHandler, HandlerTopics
from senders.runtime.metrics import Metrics
from senders.runtime.worker import SenderWorker, WorkerOptions
from senders.statuses import Lane
from senders.store.addresses import AddressBook, address_book
from senders.store.status import StatusStore, open_store
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
    return kafka_io.create_topics(
        cfg.kafka.client_config(),
        sender_topics(cfg, channels, lanes),
        cfg.kafka.partitions,
        cfg.kafka.replication_factor,
    )


def store_location(cfg: Settings) -> str:
    return cfg.senders.status_store or str(cfg.data_path() / "senders" / "status.sqlite3")


def open_status_store(cfg: Settings) -> StatusStore:
    password = cfg.senders.status_store_password.get_secret_value() if cfg.senders.status_store_password else None
    return open_store(store_location(cfg), synchronous=cfg.senders.sqlite_synchronous, password=password)


def build_dispatchers(
    cfg: Settings,
    channels: Iterable[Channel],
    metrics: Metrics,
    providers: Mapping[Channel, tuple[Provider, Provider | None]] | None = None,
) -> dict[Channel, Dispatcher]:
    """One dispatcher per channel; ``providers`` replaces the configured ones (tests, the demo)."""
    out = {}
    for channel in channels:
        if providers and channel in providers:
            primary, secondary = providers[channel]
        else:
            primary_spec, secondary_spec = cfg.senders.providers(channel)
            if not primary_spec:
                raise ConfigError(
                    f"no provider for {channel}: set senders.{channel.value}_primary"
                    " (an http(s) URL, 'smtp' or"
                    f" 'fake'), or leave the channel out with --channel"
                )
            primary = build_provider(
                primary_spec, name=provider_label(primary_spec), settings=cfg.senders, metrics=metrics
            )
            secondary = None
            if secondary_spec:
                label = provider_label(secondary_spec)
                secondary = build_provider(
                    secondary_spec,
                    name=label if label != primary.name else f"{label}-2",
                    settings=cfg.senders,
                    metrics=metrics,
                )
        out[channel] = Dispatcher(
            channel=channel,
            primary=primary,
            secondary=secondary,
            limit=cfg.senders.rate_limit(channel),
            breaker=cfg.senders.breaker_options(),
            metrics=metrics,
        )
    return out


@dataclass
class SenderPool:
    """The workers of one process and the threads that run them."""

    workers: list[SenderWorker]
    metrics: Metrics
    dispatchers: dict[Channel, Dispatcher]
    stop_event: threading.Event = field(default_factory=threading.Event)
    errors: list[BaseException] = field(default_factory=list)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> SenderPool:
        for worker in self.workers:
            thread = threading.Thread(target=self._run, args=(worker,), name=worker.name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def _run(self, worker: SenderWorker) -> None:
        try:
            worker.run(self.stop_event)
        except BaseException as exc:
            logger.exception("%s failed: stopping every worker", worker.name)
            self.errors.append(exc)
            self.stop_event.set()
        finally:
            worker.handler.store.close()

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        for worker in self.workers:
            if not worker.ready.wait(max(0.0, deadline - time.monotonic())):
                raise TimeoutError(f"{worker.name} got no partitions within {timeout_s:.0f} s")

    def stop(self, timeout_s: float = 30.0) -> None:
        self.stop_event.set()
        for thread in self._threads:
            thread.join(timeout_s)

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
    addresses: AddressBook | None = None,
    metrics: Metrics | None = None,
    on_attempt: Callable[[AttemptEvent], None] | None = None,
) -> SenderPool:
    """Workers for each channel and lane (``workers_per_lane`` of each, one consumer group per
    channel and lane); the dispatchers (providers, breakers, rate limits) are shared."""
    s = cfg.senders
    metrics = metrics if metrics is not None else Metrics()
    dispatchers = build_dispatchers(cfg, channels, metrics, providers)
    book = addresses if addresses is not None else address_book(s.address_book)
    instance = s.instance_id or uuid.uuid4().hex[:12]
    policy = s.retry_policy()
    topics = HandlerTopics(
        status=s.status_topic, dlq=s.dlq_topic, delay=lambda topic, step: s.delay_topics(topic)[step]
    )
    workers = []
    for channel in channels:
        for lane in lanes:
            source = source_topic(cfg, channel, lane)
            for n in range(workers_per_lane):
                name = f"{channel.value}.{lane.value}.{n}"
                txn_id = f"{group_id(cfg, channel, lane)}.{instance}.{n}"
                store = open_status_store(cfg)
                handler = DeliveryHandler(
                    channel=channel,
                    lane=lane,
                    store=store,
                    dispatcher=dispatchers[channel],
                    addresses=book,
                    policy=policy,
                    topics=topics,
                    lease_ms=s.lease_ms,
                    owner=f"{txn_id}/{uuid.uuid4().hex[:8]}",
                    metrics=metrics,
                    on_attempt=on_attempt,
                )
                options = WorkerOptions(
                    group_id=group_id(cfg, channel, lane),
                    transactional_id=txn_id,
                    source_topic=source,
                    delay_topics=list(s.delay_topics(source).values()),
                    batch_size=s.batch_size,
                    poll_timeout_s=s.poll_timeout_ms / 1000,
                    session_timeout_ms=s.session_timeout_ms,
                    transaction_timeout_ms=s.transaction_timeout_ms,
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
    return SenderPool(workers, metrics, dispatchers)
