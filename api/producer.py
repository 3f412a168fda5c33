"""The API's Kafka producer: ``acks=all``, one request in flight per broker, a record's answer
awaited in async code.

librdkafka reports each record's fate to a callback run by ``poll``; a thread polls, and the
callback hands the result to the waiting request's event loop. A record not acknowledged within
``ack_timeout_ms`` is answered 503 (``message.timeout.ms`` is the same, so librdkafka gives up on
it too: the caller's retry, with the same Idempotency-Key, is the one to count on, and a record
that did arrive after all is a duplicate the dedup job suppresses).

Whether the brokers answer is watched: librdkafka's "all brokers down" error marks them down at
once; a probe (the requests topic's metadata, every ``probe_interval_s``) marks them down when
the topic is missing, or when it has gone unanswered ``PROBES_TO_DOWN`` times in a row with no
record acknowledged meanwhile, and up again when it is answered (so does any acknowledgement).
The probe asks on connections of its own (an admin client): a broker answers one connection's
requests in order, so a metadata request sent behind produce requests that wait for their
acknowledgement waits with them. When a broker of three is SIGKILLed, nothing is acknowledged
until the cluster fences it (every partition has it as a replica in sync: ~12 s here); a probe
on the producer's connections went unanswered too, Kafka was marked down and 15% of the
requests were answered 503, where the others waited and were acknowledged once the partitions
had moved. One probe that times out is no outage either: on a machine so busy that a metadata
request takes longer than the probe waits, a probe that marked Kafka down at once answered 2,300
requests 503 (26% of a flood's). While they are down ``unavailable()`` says
why, and the API answers 503 at once instead of making each request wait the whole ack timeout;
it never answers 202 without an acknowledgement either way.

The producer is not librdkafka's idempotent one. That one keeps at most 5 records in flight per
partition, and while a partition is held back with a batch ready, its broker thread wakes at
once, over and over, until an answer comes (``rd_kafka_toppar_producer_serve`` sets the wake-up
before the in-flight check). On one local broker answers come in about a millisecond and it
hardly shows; on three, where ``acks=all`` waits for the followers, its broker threads woke
1.37 million times a second, the producer took 0.71 ms of CPU per record against 0.09 (at 1,000
records/s, ``python -m bench.producer_cpu``; bench/README.md), and the API took 1.2-1.3 of the
machine's 2 cores in bench.slo's broker-kill run; a broker kill, which holds every
acknowledgement for ~12 s, is the worst case. With ``max.in.flight.requests.per.connection`` 1
records keep their order through retries as the idempotent producer's do, and what waits for
the request in flight is batched behind it; what a retry writes twice (a request whose answer
was lost) carries the same dedup key, and the dedup job suppresses it, as it does a caller's
retry.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

logger = logging.getLogger(__name__)


#: the producer's delivery settings (the module's docstring says why it is not the idempotent one)
DELIVERY_SETTINGS: Mapping[str, str] = {
    "enable.idempotence": "false",
    "max.in.flight.requests.per.connection": "1",
    "acks": "all",
}
#: how long after its ack timeout a write still waits for librdkafka's own report of it
_REPORT_GRACE_S = 1.0
#: probes unanswered in a row, with no record acknowledged meanwhile, that mark the brokers down
PROBES_TO_DOWN = 3


class NotAcknowledged(Exception):
    """Kafka did not take the record in time (or refused it); ``reason`` is fit for logs."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Written:
    topic: str
    partition: int
    offset: int


#: a write's delivery report: its waiter, the error's name (refused) or what was written
_Report = tuple["asyncio.Future[Written]", str | None, Written | None]


def _expire(future: asyncio.Future[Written], timeout_s: float) -> None:
    if not future.done():
        future.set_exception(NotAcknowledged(f"no acknowledgement within {timeout_s:g} s"))


class RequestProducer:
    def __init__(
        self,
        client_config: Mapping[str, str],
        *,
        ack_timeout_ms: int,
        linger_ms: int,
        topic: str | None = None,
        probe_interval_s: float = 1.0,
        on_ack: Callable[[float], None] | None = None,
    ) -> None:
        """``on_ack(seconds)``: each acknowledged record's time from produce to its acknowledgement."""
        self._on_ack = on_ack
        self.ack_timeout_s = ack_timeout_ms / 1000
        self._topic = topic
        self._probe_interval_s = probe_interval_s
        self._down: str | None = None  # None: up, or not known to be down yet
        self._unanswered = 0  # probes unanswered in a row
        self._unanswered_since = 0.0  # when the first of them was sent
        self._acked_at = 0.0  # when a record was last acknowledged (time.monotonic)
        self._reports: collections.deque[_Report] = collections.deque()  # appended by librdkafka's callbacks
        self._producer = Producer({
            **client_config,
            **DELIVERY_SETTINGS,
            "linger.ms": str(linger_ms),
            "message.timeout.ms": str(ack_timeout_ms),
            "client.id": "notify-api",
            "error_cb": self._on_error,
        })
        self._prober_client = AdminClient({**client_config, "client.id": "notify-api-probe"}) if topic else None
        self._running = True
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="api-producer-poll", daemon=True)
        self._thread.start()
        self._prober: threading.Thread | None = None
        if topic is not None:
            self._prober = threading.Thread(target=self._probe_loop, name="api-kafka-probe", daemon=True)
            self._prober.start()

    def _on_error(self, err: KafkaError) -> None:
        if err.code() == KafkaError._ALL_BROKERS_DOWN:
            if self._down is None:
                logger.warning("Kafka is unreachable (all brokers down): new notifications are 503 until it answers")
            self._down = "Kafka is unreachable"

    def _probe_loop(self) -> None:
        while not self._stopped.is_set():
            self.probe()
            self._stopped.wait(self._probe_interval_s)

    def probe(self) -> bool:
        """Ask the brokers for the requests topic now; False when they are taken as down."""
        assert self._topic is not None and self._prober_client is not None
        started = time.monotonic()
        try:
            metadata = self._prober_client.list_topics(self._topic,
                                                       timeout=max(0.5, min(2.0, self._probe_interval_s)))
            found = metadata.topics.get(self._topic)
            down = None if found is not None and found.error is None else f"the topic {self._topic} is missing"
            self._unanswered = 0
        except KafkaException:
            if not self._unanswered:
                self._unanswered_since = started
            self._unanswered += 1
            acked = self._acked_at >= self._unanswered_since
            down = "Kafka is unreachable" if self._unanswered >= PROBES_TO_DOWN and not acked else self._down
        if (down is None) != (self._down is None):
            logger.warning("Kafka: %s", "reachable again" if down is None else down)
        self._down = down
        return down is None

    def unavailable(self) -> str | None:
        """Why a write would not be acknowledged now (the brokers are known to be down), or None."""
        return self._down

    def _poll(self) -> None:
        while self._running:
            try:
                self._producer.poll(0.05)
            except Exception:  # noqa: BLE001 - a callback's bug must not stop delivery reports
                logger.exception("the producer's delivery reports failed")
            self._hand_over()

    def _hand_over(self) -> None:
        """The delivery reports gathered since the last call, to their event loops: one wake-up of
        a loop for all of a poll's reports, not one per record."""
        reports = self._reports
        if not reports:
            return
        by_loop: dict[asyncio.AbstractEventLoop, list[_Report]] = {}
        while reports:
            report = reports.popleft()
            by_loop.setdefault(report[0].get_loop(), []).append(report)
        for loop, batch in by_loop.items():
            try:
                loop.call_soon_threadsafe(self._settle, batch)
            except RuntimeError:  # the loop is closed: nobody waits for these any more
                pass

    def _settle(self, batch: list[_Report]) -> None:
        """In the event loop: each write's outcome to its waiter."""
        for future, error, written in batch:
            if future.done():  # the waiter gave up (its timeout, or it was cancelled)
                continue
            if written is None:
                future.set_exception(NotAcknowledged(f"Kafka refused the record: {error}"))
            else:
                self._down = None  # acknowledged: the brokers answer
                future.set_result(written)

    async def write(self, topic: str, key: bytes | None, value: bytes) -> Written:
        """Write one record and wait for Kafka's acknowledgement; raises NotAcknowledged."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Written] = loop.create_future()
        produced = time.perf_counter()
        on_ack, reports = self._on_ack, self._reports

        def settle(err: KafkaError | None, msg: Any) -> None:  # in the polling thread
            if err is not None:
                reports.append((future, err.name(), None))
                return
            if on_ack is not None:
                on_ack(time.perf_counter() - produced)
            self._acked_at = time.monotonic()
            reports.append((future, None, Written(msg.topic(), msg.partition(), msg.offset())))

        try:
            self._producer.produce(topic, key=key, value=value, on_delivery=settle)
        except BufferError:
            raise NotAcknowledged("the producer's queue is full") from None
        except KafkaException as exc:
            raise NotAcknowledged(f"Kafka refused the record: {exc.args[0].name()}") from None
        # librdkafka reports every record within message.timeout.ms (the same time); the timer is
        # the guard should a report never come
        timer = loop.call_later(self.ack_timeout_s + _REPORT_GRACE_S, _expire, future, self.ack_timeout_s)
        try:
            return await future
        finally:
            timer.cancel()

    def close(self, timeout_s: float) -> int:
        """Deliver what is queued (up to ``timeout_s``), then stop; returns the records left."""
        deadline = time.monotonic() + timeout_s
        self._stopped.set()
        left = self._producer.flush(max(0.0, timeout_s))
        self._running = False
        self._thread.join(max(0.1, deadline - time.monotonic()))
        self._hand_over()  # the reports flush served in this thread
        if self._prober is not None:
            self._prober.join(max(0.1, deadline - time.monotonic()))
        if left:
            logger.warning("%d records were not delivered before the shutdown", left)
        else:
            # its threads and connections go now, not when it is collected (Producer.close is new in
            # confluent-kafka 2.13; the bench extra's quixstreams holds it below that)
            closing = getattr(self._producer, "close", None)
            if closing is not None:
                closing()
        return int(left)
