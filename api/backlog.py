"""What waits for the senders on a channel's normal lane: the campaigns' back-pressure.

A campaign written faster than the senders deliver queues on the lane it shares with the order
updates, and each update then waits behind the whole campaign backlog (measured: p99 95 s behind
a 100,000-user campaign written at 2,000/s to senders delivering 840/s). So a campaign writes
its next batch only while at most ``api.campaign_max_backlog`` messages wait, summed over the
normal-lane topics of its channels: the messages committed there (read_committed end offsets)
that the lane's sender group has not committed as consumed. The rest of the campaign waits in
the store, its users not yet written, and an update waits behind at most that many messages.

A lane whose sender group never committed an offset counts as empty: no senders serve that
channel, and holding the campaign would only stop it for good. A group that has committed, and
whose senders are down, holds the campaign until they are back.

The backlog is read with the Kafka admin API (the groups' committed offsets, the topics' end
offsets), at most once per ``interval_s`` while it is below the bound. When it cannot be read
(Kafka slow or down) it is unknown, and the campaign goes on at its rate: the produce itself
then waits for Kafka as before.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from confluent_kafka import ConsumerGroupTopicPartitions, IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Lane:
    """A channel's normal lane: its topic and the sender group that consumes it."""

    topic: str
    group: str


def waiting(ends: Mapping[int, int], starts: Mapping[int, int], committed: Mapping[int, int]) -> int:
    """Messages not yet consumed over a topic's partitions: end offset minus the group's committed
    offset, or minus the partition's first offset where the group committed none (its senders
    start from the earliest)."""
    total = 0
    for partition, end in ends.items():
        done = committed.get(partition)
        if done is None or done < 0:
            done = starts.get(partition, 0)
        total += max(0, end - done)
    return total


class Backlog:
    """The messages waiting on the normal lanes of channels, read through one admin client."""

    def __init__(self, client_config: Mapping[str, str], lanes: Mapping[str, Lane], timeout_s: float = 5.0) -> None:
        self._config = dict(client_config)
        self._lanes = dict(lanes)
        self._timeout_s = timeout_s
        self._client: AdminClient | None = None  # made when a campaign first asks: most processes never do
        self._lock = threading.Lock()  # campaigns run in threads of their own

    @property
    def _admin(self) -> AdminClient:
        with self._lock:
            if self._client is None:
                self._client = AdminClient(self._config)
            return self._client

    def waiting(self, channels: Sequence[str]) -> int | None:
        """The sum over ``channels``' lanes, or None when Kafka did not tell in time."""
        try:
            return sum(self._lane(self._lanes[c]) for c in channels if c in self._lanes)
        except (KafkaException, TimeoutError) as exc:
            logger.debug("the campaigns' backlog is unknown: %s", exc)
            return None

    def _lane(self, lane: Lane) -> int:
        meta = self._admin.list_topics(lane.topic, timeout=self._timeout_s).topics.get(lane.topic)
        if meta is None or meta.error is not None or not meta.partitions:
            return 0  # not created yet: nothing waits
        partitions = [TopicPartition(lane.topic, p) for p in meta.partitions]
        ends = self._offsets(partitions, OffsetSpec.latest())
        starts = self._offsets(partitions, OffsetSpec.earliest())
        group = self._admin.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(lane.group, partitions)], request_timeout=self._timeout_s
        )[lane.group].result(self._timeout_s)
        committed = {tp.partition: tp.offset for tp in group.topic_partitions or () if tp.error is None}
        if all(offset < 0 for offset in committed.values()):
            return 0  # no sender ever consumed this lane (the channel not deployed): holding helps nobody
        return waiting(ends, starts, committed)

    def _offsets(self, partitions: list[TopicPartition], spec: OffsetSpec) -> dict[int, int]:
        futures = self._admin.list_offsets({tp: spec for tp in partitions},
                                           isolation_level=IsolationLevel.READ_COMMITTED,
                                           request_timeout=self._timeout_s)
        return {tp.partition: f.result(self._timeout_s).offset for tp, f in futures.items()}


class Gate:
    """Holds a campaign's next batch while the backlog of its channels is above ``bound``."""

    def __init__(self, read: Callable[[Sequence[str]], int | None], bound: int, interval_s: float = 0.5,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._read = read
        self._bound = bound
        self._interval_s = interval_s
        self._clock = clock
        self._next_read = float("-inf")
        self.found: int | None = None  # the backlog last read

    def hold_s(self, channels: Sequence[str]) -> float:
        """0 when the batch may go now; else how long to wait before asking again. The backlog is
        read again only after ``interval_s`` once it was found below the bound."""
        if self._bound <= 0:
            return 0.0
        now = self._clock()
        if now < self._next_read:
            return 0.0
        found = self.found = self._read(channels)
        if found is not None and found > self._bound:
            return self._interval_s
        self._next_read = now + self._interval_s
        return 0.0
