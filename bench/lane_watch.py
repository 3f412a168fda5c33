"""When each message of some channel topics became visible to a read_committed reader.

The job writes its output in Kafka transactions committed with its checkpoints; a sender, which
reads with ``read_committed``, sees a message only once its transaction is committed. A
:class:`LaneWatch` reads the same topics beside the senders, as they do (``read_committed``, the
same ``fetch.wait.max.ms``), and keeps each message key's first sight (epoch seconds): what
splits a message's way from the API call to the provider into the part before a sender could see
it (the API, the job, the checkpoint that commits it) and the part after (the sender).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Mapping, Sequence

from confluent_kafka import Consumer, KafkaException

from operators import codec

#: the senders' consumers' (senders/runtime/worker.py): a fetch answered at once when data is there
FETCH_WAIT_MS = 100


class LaneWatch(threading.Thread):
    """Reads ``topics`` from their end at :meth:`start` until :meth:`stop`; ``seen``: message key
    -> epoch seconds it was first read. A record that does not decode is counted, not kept."""

    def __init__(self, client_config: Mapping[str, str], topics: Sequence[str]) -> None:
        super().__init__(name="lane-watch", daemon=True)
        self.seen: dict[str, float] = {}
        self.undecodable = 0
        self.errors = 0
        self._topics = list(topics)
        self._stop_event = threading.Event()
        self._assigned = threading.Event()
        self._consumer = Consumer({
            **client_config,
            "group.id": f"bench-lane-watch-{uuid.uuid4().hex[:12]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": "false",
            "auto.offset.reset": "latest",
            "fetch.wait.max.ms": str(FETCH_WAIT_MS),
        })

    def start(self, timeout_s: float = 60.0) -> None:
        """Start reading; returns once the topics' partitions are assigned (what is committed
        before that is not watched)."""
        self._consumer.subscribe(self._topics, on_assign=lambda _c, _p: self._assigned.set())
        super().start()
        if not self._assigned.wait(timeout_s):
            raise TimeoutError(f"lane watch: no partitions of {self._topics} assigned in {timeout_s:g} s")

    def run(self) -> None:
        try:
            while not self._stop_event.is_set():
                try:
                    msg = self._consumer.poll(0.05)
                except KafkaException:
                    self.errors += 1
                    continue
                if msg is None:
                    continue
                now = time.time()
                if msg.error() is not None or msg.value() is None:
                    self.errors += msg.error() is not None
                    continue
                try:
                    key = str(codec.decode("channel_message", msg.value())["message_key"])
                except Exception:  # noqa: BLE001 - a record of another shape is not a message to time
                    self.undecodable += 1
                    continue
                self.seen.setdefault(key, now)
        finally:
            self._consumer.close()

    def stop(self) -> dict[str, float]:
        """Stop reading; what was seen."""
        self._stop_event.set()
        if self.ident is not None:
            self.join(10)
        return dict(self.seen)
