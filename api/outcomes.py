"""The job's verdicts other than accepted, into the store: a thread reads the duplicate, late and
invalid topics (read_committed, its own consumer group, offsets committed after the store has
them) and records one row per notification and verdict, so ``GET /v1/notifications/{id}`` can
say "duplicate of n-1", "late" or "invalid" without reading Kafka.

An invalid record is matched to the request the API wrote by its place in the requests topic;
one another producer wrote is matched by its notification id when its bytes still decode.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException

from api.store import Outcome, record_outcomes, request_at
from operators import codec
from operators.contract import Topics
from ops.trace import resolved_key
from senders.errors import StatusStoreError
from senders.store.db import Database

logger = logging.getLogger(__name__)


def _decoded(stem: str, raw: bytes | None) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        return dict(codec.decode(stem, raw))
    except Exception:  # noqa: BLE001 - fastavro raises many types; a bad record is skipped
        return None


def outcome_of(topic: str, raw: bytes | None, topics: Topics, db: Database, now_ms: int) -> Outcome | None:
    """The verdict a record of one of the job's notice topics says, or None."""
    if topic == topics.duplicates:
        d = _decoded("duplicate_notice", raw)
        if d is None:
            return None
        return Outcome(d["notification_id"], "duplicate", d["dedup_key"], None, d["original_notification_id"],
                       int(d["occurrence"]), None, None, now_ms)
    if topic == topics.late:
        d = _decoded("late_notice", raw)
        if d is None:
            return None
        req = d["request"]
        return Outcome(req["notification_id"], "late", resolved_key(req), req["user_id"], None, None,
                       int(d["watermark"]), d["reason"], now_ms)
    if topic == topics.invalid:
        d = _decoded("invalid_record", raw)
        if d is None:
            return None
        known = request_at(db, int(d["partition"]), int(d["offset"])) if d["topic"] == topics.requests else None
        if known is not None:
            return Outcome(known.notification_id, "invalid", known.dedup_key, known.user_id, reason=d["error"],
                           at_ms=now_ms)
        if len(d["raw"]) == d["raw_length"]:
            req = _decoded("notification_request", d["raw"])
            if req is not None and req.get("notification_id"):
                return Outcome(str(req["notification_id"]), "invalid", req.get("dedup_key") or None,
                               req.get("user_id") or None, reason=d["error"], at_ms=now_ms)
    return None


class OutcomeReader:
    """Runs in its own thread until ``stop()``; failures (broker, store) are retried after a pause.
    One runs per store, in the process that holds the lease (``api.singletons``)."""

    def __init__(
        self, client_config: Mapping[str, str], topics: Topics, group: str, opener: Callable[[], Database]
    ) -> None:
        self._config = dict(client_config)
        self._topics = topics
        self._group = group
        self._opener = opener
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="api-outcomes", daemon=True)
        self.recorded = 0

    def start(self) -> OutcomeReader:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        pause = 0.5
        while not self._stop.is_set():
            try:
                self._consume()
                return
            except (KafkaException, StatusStoreError) as exc:
                logger.warning("reading the job's verdicts failed (%s): again in %.1f s", type(exc).__name__, pause)
            except Exception:  # noqa: BLE001 - keep the thread: the API must keep answering
                logger.exception("reading the job's verdicts failed: again in %.1f s", pause)
            self._stop.wait(pause)
            pause = min(pause * 2, 30.0)

    def _consume(self) -> None:
        db = self._opener()
        consumer = Consumer({
            **self._config,
            "group.id": self._group,
            # one reader for all the API processes of a store (api.leader): a static member, so
            # the next holder's reader takes the partitions over at once instead of waiting for
            # the session of a holder that died to time out (and no leave on a graceful stop)
            "group.instance.id": f"{self._group}-reader",
            "client.id": f"notify-api-outcomes-{uuid.uuid4().hex[:6]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": "false",
            "auto.offset.reset": "earliest",
        })
        try:
            t = self._topics
            consumer.subscribe([t.duplicates, t.late, t.invalid])
            while not self._stop.is_set():
                batch = consumer.consume(500, 0.5)
                if not batch:
                    continue
                now = int(time.time() * 1000)
                found = []
                for msg in batch:
                    err = msg.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            continue
                        raise KafkaException(err)
                    outcome = outcome_of(str(msg.topic()), msg.value(), t, db, now)
                    if outcome is not None:
                        found.append(outcome)
                self.recorded += record_outcomes(db, found)
                consumer.commit(asynchronous=False)
        finally:
            consumer.close()
            db.close()
