"""Campaigns: one request per user of a segment, ``dedup_key`` ``<campaign_id>:<user_id>``, on the
normal lane, paced at the campaign's rate and held while the senders are behind on its channels
(``api.backlog``), pausable, resumed after a restart of the API.

Each batch of requests is written in one Kafka transaction together with the campaign's new
position (a record keyed by the campaign id in ``api.campaigns_topic``). A campaign's producer has
the transactional id ``<api.transactional_id_prefix>.<campaign_id>``: whoever runs it next (after
a pause, a restart, a crash; in this process or another) first fences the one before and aborts
its open transaction, then reads the position from the topic. So each user's request is
committed exactly once, however the API stops. The store's ``written`` follows the topic (for
``GET /v1/campaigns/{id}``); the segment and the state (scheduled, running, paused, done) are in
the store.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition

from api.accept import build_request
from api.backlog import Gate
from operators.limits import RequestLimits
from operators.records import Category, Priority
from operators.tracing import CAMPAIGN_BATCH_SPAN, CAMPAIGN_ID, OFF, AttributeValue, Tracing
from ops import kafka_io
from senders.policy.bucket import RateLimit, TokenBucket
from senders.store.db import Database
from settings.kafka import KafkaSettings

logger = logging.getLogger(__name__)

STATES = ("scheduled", "running", "paused", "done")


@dataclass(frozen=True, slots=True)
class Campaign:
    campaign_id: str
    caller: str
    template: str
    params: Mapping[str, str]
    channels: tuple[str, ...]
    kind: Category
    rate_per_sec: float
    send_at_ms: int
    state: str
    total: int
    written: int
    created_ms: int
    updated_ms: int


_COLUMNS = (
    "campaign_id, caller, template, params, channels, rate_per_sec, send_at_ms, state, total, written, created_ms,"
    " updated_ms"
)


def _campaign(row: Sequence[Any]) -> Campaign:
    params = json.loads(row[3])
    kind = Category(params.pop("__kind__", Category.MARKETING.value))
    return Campaign(row[0], row[1], row[2], params, tuple(row[4].split(",")), kind, float(row[5]), int(row[6]),
                    row[7], int(row[8]), int(row[9]), int(row[10]), int(row[11]))


def new_campaign_id() -> str:
    return f"camp-{uuid.uuid4().hex[:12]}"


ACTIVE = ("scheduled", "running", "paused")


class TooManyCampaigns(Exception):
    def __init__(self, active: int) -> None:
        super().__init__(f"{active} campaigns active")
        self.active = active


def dedup_key(c: Campaign, user_id: str) -> str:
    """A campaign request's dedup key, in its caller's key space: each user once per campaign."""
    return f"{c.caller}/{c.campaign_id}:{user_id}"


def create(db: Database, c: Campaign, users: Sequence[str], max_active: int | None = None, batch: int = 1000) -> None:
    """Store a new campaign and its segment; raises TooManyCampaigns when its caller already has
    ``max_active`` scheduled, running or paused (counted and inserted in one transaction, the
    caller's row locked, so two creates at once cannot both pass)."""
    params = json.dumps({**c.params, "__kind__": c.kind.value}, sort_keys=True)
    with db.tx() as cur:
        if max_active is not None:
            db.exec(cur, f"SELECT name FROM api_caller WHERE name = ?{db.for_update}", (c.caller,)).fetchone()
            marks = ", ".join("?" * len(ACTIVE))
            active = int(db.exec(
                cur, f"SELECT COUNT(*) FROM api_campaign WHERE caller = ? AND state IN ({marks})", (c.caller, *ACTIVE)
            ).fetchone()[0])
            if active >= max_active:
                raise TooManyCampaigns(active)
        db.exec(
            cur,
            f"INSERT INTO api_campaign ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 0, ?, ?)",
            (c.campaign_id, c.caller, c.template, params, ",".join(c.channels), c.rate_per_sec, c.send_at_ms,
             c.state, len(users), c.created_ms, c.created_ms),
        )
        text = db.sql("INSERT INTO api_campaign_user (campaign_id, position, user_id) VALUES (?, ?, ?)")
        for start in range(0, len(users), batch):
            cur.executemany(text, [(c.campaign_id, start + i, u) for i, u in enumerate(users[start : start + batch])])


def get(db: Database, campaign_id: str) -> Campaign | None:
    with db.tx(write=False) as cur:
        row = db.exec(cur, f"SELECT {_COLUMNS} FROM api_campaign WHERE campaign_id = ?", (campaign_id,)).fetchone()
    return _campaign(row) if row else None


def set_state(db: Database, campaign_id: str, new: str, allowed_from: Sequence[str], now_ms: int) -> bool:
    marks = ", ".join("?" * len(allowed_from))
    with db.tx() as cur:
        return bool(
            db.exec(
                cur,
                f"UPDATE api_campaign SET state = ?, updated_ms = ? WHERE campaign_id = ? AND state IN ({marks})",
                (new, now_ms, campaign_id, *allowed_from),
            ).rowcount
        )


def set_written(db: Database, campaign_id: str, written: int, done: bool, now_ms: int) -> None:
    with db.tx() as cur:
        db.exec(
            cur,
            "UPDATE api_campaign SET written = ?, updated_ms = ?" + (", state = 'done'" if done else "")
            + " WHERE campaign_id = ?",
            (written, now_ms, campaign_id),
        )


def users_from(db: Database, campaign_id: str, position: int, n: int) -> list[tuple[int, str]]:
    """The next ``n`` (position, user id) of the segment from ``position`` on; an erased user's
    entry is gone, so positions may skip."""
    with db.tx(write=False) as cur:
        rows = db.exec(
            cur,
            "SELECT position, user_id FROM api_campaign_user WHERE campaign_id = ? AND position >= ?"
            " ORDER BY position LIMIT ?",
            (campaign_id, position, n),
        ).fetchall()
    return [(int(r[0]), r[1]) for r in rows]


def active(db: Database) -> list[str]:
    with db.tx(write=False) as cur:
        rows = db.exec(
            cur, "SELECT campaign_id FROM api_campaign WHERE state IN ('scheduled', 'running') ORDER BY created_ms"
        ).fetchall()
    return [r[0] for r in rows]


def ensure_topic(kafka: KafkaSettings, topic: str, timeout_s: float = 30.0) -> None:
    """The campaigns' progress topic: one partition, compacted (the newest position per campaign),
    replicated as every topic the tools make (``ops.kafka_io.create_topics``). Raises
    KafkaException when the brokers do not answer within ``timeout_s``, TopicError when too few
    are alive for its replicas."""
    kafka_io.ensure_topics(kafka, [topic], 1, config={"cleanup.policy": "compact"}, timeout_s=timeout_s)


def read_position(client_config: Mapping[str, str], topic: str, campaign_id: str, timeout_s: float = 30.0) -> int:
    """The campaign's committed position: its newest record in the progress topic (0: none)."""
    consumer = Consumer({
        **client_config,
        "group.id": f"notify-api-progress-{uuid.uuid4().hex[:8]}",
        "isolation.level": "read_committed",
        "enable.auto.commit": "false",
        "enable.partition.eof": "true",
    })
    position = 0
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + timeout_s
        while True:
            if time.monotonic() > deadline:
                raise KafkaException(KafkaError(KafkaError._TIMED_OUT, f"reading {topic} took over {timeout_s:g} s"))
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    return position
                raise KafkaException(err)
            value = msg.value()
            if msg.key() == campaign_id.encode() and value:
                position = max(position, int(json.loads(value)["position"]))
    finally:
        consumer.close()


@dataclass(frozen=True, slots=True)
class RunnerContext:
    client_config: Mapping[str, str]
    requests_topic: str
    campaigns_topic: str
    transactional_id_prefix: str
    batch_ms: int
    limits: RequestLimits
    opener: Callable[[], Database]
    kafka_timeout_s: float = 30.0
    #: a span per batch (``campaign batch``), whose context its requests carry to the job and senders
    tracing: Tracing = OFF
    #: the messages waiting for the senders on the normal lanes of some channels (``api.backlog``),
    #: None when unknown; with ``max_backlog`` > 0 a batch waits while they are more than that
    backlog: Callable[[Sequence[str]], int | None] | None = None
    max_backlog: int = 0
    #: told when a campaign's hold starts, and when it ends with how long it lasted (the metrics)
    on_hold_start: Callable[[], None] = lambda: None
    on_hold_end: Callable[[float], None] = lambda held_s: None


class Runner:
    """Writes one campaign until it is done, paused, or the API stops."""

    def __init__(self, campaign_id: str, ctx: RunnerContext, manager: CampaignManager) -> None:
        self.campaign_id = campaign_id
        self._ctx = ctx
        self._manager = manager
        self.thread = threading.Thread(target=self._run, name=f"campaign-{campaign_id}", daemon=True)

    def _run(self) -> None:
        pause = 1.0
        while not self._manager.stopping.is_set():
            try:
                if self._write():
                    return
                pause = 1.0
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                if isinstance(error, KafkaError) and error.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED):
                    logger.warning("campaign %s: taken over by another runner", self.campaign_id)
                    self._manager.finished(self, force=True)
                    return
                logger.warning("campaign %s: Kafka failed (%s): again in %.0f s", self.campaign_id,
                               error.name() if isinstance(error, KafkaError) else exc, pause)
            except Exception:  # noqa: BLE001 - a store outage or a bug: retried, the API goes on
                logger.exception("campaign %s failed: again in %.0f s", self.campaign_id, pause)
            self._manager.stopping.wait(pause)
            pause = min(pause * 2, 30.0)
        self._manager.finished(self, force=True)

    def _write(self) -> bool:
        """Run the campaign; True when this runner is done with it (done, paused, or deregistered)."""
        ctx = self._ctx
        db = ctx.opener()
        producer = Producer({
            **ctx.client_config,
            "transactional.id": f"{ctx.transactional_id_prefix}.{self.campaign_id}",
            "enable.idempotence": "true",
            "acks": "all",
            "linger.ms": "5",
            "transaction.timeout.ms": "60000",
        })
        held_since: float | None = None  # when the hold in progress began
        try:
            producer.init_transactions(ctx.kafka_timeout_s)  # fences the previous runner, aborts its transaction
            position = read_position(ctx.client_config, ctx.campaigns_topic, self.campaign_id, ctx.kafka_timeout_s)
            c = get(db, self.campaign_id)
            if c is None:
                self._manager.finished(self, force=True)
                return True
            set_written(db, c.campaign_id, position, position >= c.total, _now_ms())
            wait_s = (c.send_at_ms - _now_ms()) / 1000
            while wait_s > 0:
                if self._manager.stopping.wait(min(wait_s, 1.0)) or not self._keep_going(db):
                    return True
                wait_s = (c.send_at_ms - _now_ms()) / 1000
            if c.state == "scheduled":
                set_state(db, c.campaign_id, "running", ("scheduled",), _now_ms())
            per_batch = max(1, int(c.rate_per_sec * ctx.batch_ms / 1000))
            bucket = TokenBucket(RateLimit(c.rate_per_sec, per_batch), time.monotonic())
            gate = Gate(ctx.backlog, ctx.max_backlog) if ctx.backlog is not None else None
            next_note = 0.0  # a hold is logged at its start, then after 10 s, 20 s, 40 s ... held
            while position < c.total:
                if self._manager.stopping.is_set() or not self._keep_going(db):
                    return True
                if gate is not None and (hold := gate.hold_s(c.channels)) > 0:
                    if held_since is None:
                        held_since = time.monotonic()
                        ctx.on_hold_start()
                    if time.monotonic() - held_since >= next_note:
                        logger.info("campaign %s: held, %s messages wait for the senders on its lanes (bound %d)",
                                    c.campaign_id, gate.found, ctx.max_backlog)
                        next_note = min(next_note * 2 if next_note else 10.0, 600.0)
                    self._manager.stopping.wait(hold)  # the senders are behind: the rest waits here
                    continue
                if held_since is not None:
                    ctx.on_hold_end(time.monotonic() - held_since)
                    held_since = None
                next_note = 0.0
                users = users_from(db, c.campaign_id, position, min(per_batch, c.total - position))
                wait = bucket.reserve(time.monotonic(), max(1, len(users)))
                if wait > 0 and self._manager.stopping.wait(wait):
                    return True
                position = users[-1][0] + 1 if users else c.total
                self._batch(producer, c, position, users)
                set_written(db, c.campaign_id, position, position >= c.total, _now_ms())
            logger.info("campaign %s: done, %d requests written", c.campaign_id, c.total)
            self._manager.finished(self, force=True)
            return True
        finally:
            if held_since is not None:  # stopped, paused or failed while held
                ctx.on_hold_end(time.monotonic() - held_since)
            db.close()

    def _keep_going(self, db: Database) -> bool:
        c = get(db, self.campaign_id)
        if c is not None and c.state in ("scheduled", "running"):
            return True
        return not self._manager.finished(self)

    def _batch(self, producer: Producer, c: Campaign, position: int, users: Sequence[tuple[int, str]]) -> None:
        """The requests of ``users`` and the campaign's new ``position`` (after them), in one
        transaction: with tracing on, one span, ``campaign batch``, the parent of each request's
        trace (a trace per batch, not one of millions of spans per campaign)."""
        attributes: dict[str, AttributeValue] = {
            CAMPAIGN_ID: c.campaign_id, "campaign.position": position, "campaign.requests": len(users)}
        with self._ctx.tracing.span(CAMPAIGN_BATCH_SPAN, parent=None, kind="producer", attributes=attributes):
            self._write_batch(producer, c, position, users, self._ctx.tracing.traceparent())

    def _write_batch(
        self, producer: Producer, c: Campaign, position: int, users: Sequence[tuple[int, str]], traceparent: str | None
    ) -> None:
        ctx = self._ctx
        now = _now_ms()
        producer.begin_transaction()
        try:
            for at, user in users:
                request, encoded = build_request(
                    {
                        "notification_id": f"{c.campaign_id}-{at}",
                        "user_id": user,
                        "template_id": c.template,
                        "params": dict(c.params),
                        "channels": list(c.channels),
                        "priority": Priority.NORMAL.value,
                        "category": c.kind.value,
                        "event_time": now,
                        "dedup_key": dedup_key(c, user),
                        "traceparent": traceparent,
                    },
                    ctx.limits,
                    now,
                )
                _produce(producer, ctx.requests_topic, request.user_id.encode("utf-8"), encoded)
            progress = json.dumps({"campaign_id": c.campaign_id, "position": position}).encode()
            _produce(producer, ctx.campaigns_topic, c.campaign_id.encode(), progress, partition=0)
            producer.commit_transaction(ctx.kafka_timeout_s)
        except BaseException:
            try:
                producer.abort_transaction(ctx.kafka_timeout_s)
            except KafkaException:
                pass  # fenced or gone: the next runner aborts it
            raise


def _produce(producer: Producer, topic: str, key: bytes, value: bytes, partition: int | None = None) -> None:
    while True:
        try:
            if partition is None:
                producer.produce(topic, key=key, value=value)
            else:
                producer.produce(topic, key=key, value=value, partition=partition)
            return
        except BufferError:
            producer.poll(0.05)


def _now_ms() -> int:
    return int(time.time() * 1000)


class CampaignManager:
    """The runners of this process: one thread per campaign being written."""

    def __init__(self, ctx: RunnerContext) -> None:
        self._ctx = ctx
        self._runners: dict[str, Runner] = {}
        self._lock = threading.Lock()
        self.stopping = threading.Event()

    def ensure_running(self, campaign_id: str) -> None:
        with self._lock:
            if self.stopping.is_set() or campaign_id in self._runners:
                return
            runner = self._runners[campaign_id] = Runner(campaign_id, self._ctx, self)
            runner.thread.start()

    def finished(self, runner: Runner, force: bool = False) -> bool:
        """A runner that saw its campaign paused asks to stop: it may unless the campaign was
        resumed meanwhile (then it goes on). ``force``: it stops anyway (done, fenced, stopping)."""
        with self._lock:
            if not force:
                db = self._ctx.opener()
                try:
                    c = get(db, runner.campaign_id)
                finally:
                    db.close()
                if c is not None and c.state in ("scheduled", "running"):
                    return False
            if self._runners.get(runner.campaign_id) is runner:
                del self._runners[runner.campaign_id]
            return True

    def start_all(self, campaign_ids: Sequence[str]) -> None:
        for campaign_id in campaign_ids:
            self.ensure_running(campaign_id)

    def running(self) -> list[str]:
        with self._lock:
            return sorted(self._runners)

    def stop(self, timeout_s: float) -> None:
        self.stopping.set()
        with self._lock:
            runners = list(self._runners.values())
        deadline = time.monotonic() + timeout_s
        for runner in runners:
            runner.thread.join(max(0.1, deadline - time.monotonic()))
