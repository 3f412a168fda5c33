"""Send dead-lettered messages again: each dead letter once.

Producing a letter's payload back to its channel topic is not enough: its key is ``failed`` in the
status store, final, so the record would be skipped. A redrive first puts the row back to
``queued`` with no attempt made and remembers the letter (``StatusStore.begin_redrive``), then
produces, in one Kafka transaction, the channel record and a ``queued`` status record, then marks
the letter produced. A redrive stopped in between is finished by the next one; a letter already
redriven is left alone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from confluent_kafka import Producer

from operators import codec
from ops import kafka_io
from senders import records
from senders.runtime.handler import Output
from senders.statuses import DeadLetterReason, DeliveryStatus, Lane
from senders.store.status import LetterPosition, RedriveStep, StatusStore
from settings import Settings

logger = logging.getLogger(__name__)

#: letters produced per Kafka transaction
BATCH = 500


@dataclass
class RedriveReport:
    redriven: int = 0
    already: int = 0
    not_failed: int = 0
    undecodable: int = 0
    left_out: int = 0
    letters: list[str] = field(default_factory=list)  # message keys redriven (or that would be)


@dataclass(frozen=True)
class RedriveFilter:
    """Which dead letters: none given in a field means all."""

    channels: Collection[str] = ()
    reasons: Collection[str] = ()
    message_keys: Collection[str] = ()

    def wants(self, letter: dict[str, object]) -> bool:
        return (
            (not self.channels or letter["channel"] in self.channels)
            and (not self.reasons or letter["reason_kind"] in self.reasons)
            and (not self.message_keys or letter["message_key"] in self.message_keys)
        )


def redrive(
    cfg: Settings,
    store: StatusStore,
    which: RedriveFilter,
    *,
    dry_run: bool = False,
    producer_factory: Callable[[dict[str, str]], Producer] = Producer,
) -> RedriveReport:
    s = cfg.senders
    report = RedriveReport()
    producer: Producer | None = None
    pending: list[tuple[LetterPosition, list[Output]]] = []

    def flush() -> None:
        nonlocal producer
        if not pending:
            return
        if producer is None:
            producer = producer_factory(
                {
                    **cfg.kafka.client_config(),
                    # one redrive at a time: a second one fences the first
                    "transactional.id": f"{s.group_prefix}.redrive",
                    "transaction.timeout.ms": str(s.transaction_timeout_ms),
                }
            )
            producer.init_transactions(s.kafka_timeout_ms / 1000)
        producer.begin_transaction()
        for _, outs in pending:
            for out in outs:
                producer.produce(out.topic, key=out.key, value=out.value)
        producer.commit_transaction(s.kafka_timeout_ms / 1000)
        for position, _ in pending:
            store.finish_redrive(position)
        pending.clear()

    for m in kafka_io.read_committed(cfg.kafka.client_config(), [s.dlq_topic], idle_timeout_s=2.0):
        if m.value is None:
            continue
        letter = codec.decode("dead_letter", m.value)
        if not which.wants(letter):
            report.left_out += 1
            continue
        key = letter["message_key"]
        if key is None or letter["reason_kind"] == DeadLetterReason.UNDECODABLE.value:
            report.undecodable += 1  # the producer's bytes: nothing to send
            continue
        try:
            outs = _records(cfg, letter)
        except Exception:  # noqa: BLE001 - a payload that no longer decodes: never redriven
            report.undecodable += 1
            continue
        position = (m.topic, m.partition, m.offset)
        step = store.begin_redrive(position, key, int(time.time() * 1000), apply=not dry_run)
        if step is RedriveStep.ALREADY:
            report.already += 1
        elif step is RedriveStep.NOT_FAILED:
            report.not_failed += 1
        else:
            report.redriven += 1
            report.letters.append(key)
            if not dry_run:
                pending.append((position, outs))
                if len(pending) >= BATCH:
                    flush()
    if not dry_run:
        flush()
    return report


def _records(cfg: Settings, letter: dict[str, object]) -> list[Output]:
    """The channel record to produce again, and a status record saying the message is queued."""
    payload = letter["payload"]
    assert isinstance(payload, bytes)
    lane = Lane(str(letter["lane"]))
    d = records.from_channel_record(payload, key=None, lane=lane, source_topic=str(letter["source_topic"]))
    now = int(time.time() * 1000)
    status = records.status_record(
        d, status=DeliveryStatus.QUEUED, attempt=0, at_ms=now, error="redriven from the dead-letter topic"
    )
    return [
        Output(d.source_topic, d.user_id.encode(), payload),  # keyed by user, as the dedup job writes it
        Output(cfg.senders.status_topic, d.message_key.encode(), codec.encode("delivery_status", status)),
    ]
