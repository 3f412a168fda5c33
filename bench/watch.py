"""The harness's Kafka clients, each in a process of its own: the output watcher and the live producer.

Run as threads of the harness they shared one GIL with each other and with the harness, and that
was most of the latency floor (1.1 s p99 at 5,000/s with no system in between). Here each is a
process started with ``spawn`` (no fork of a process with librdkafka's threads), and they talk to
the harness over a pipe. ``time.monotonic()`` is CLOCK_MONOTONIC, one clock for every process of
the machine, so the producer's send times and the watcher's read times compare.

* :class:`Watcher` reads the output topics from the beginning with ``isolation.level =
  read_committed`` until stopped, and keeps a tally of what it read (:class:`ItemTally`: every
  parsed output item; :class:`IndexTally`: how often each record of a pass-through stream came
  back). It sends the harness the time and size of every batch it read (every 20 ms at most),
  and at the end the tally and, for the records it read after :meth:`Watcher.live`, the time it
  first read each request's output (the latency phase).
* :class:`LiveProducer` produces a list of records at a fixed rate and reports each one's
  ``produce()`` time. It batches like an ordinary producer (:data:`LIVE_PRODUCER`): idempotent,
  ``linger.ms = 5`` (the default of librdkafka and, since Kafka 4.0, of the Java client).
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
import traceback
import uuid
from array import array
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from multiprocessing.connection import Connection
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from bench.dataset import Item, Record
from bench.measure import Parser, read_index

#: the live producer: what an ordinary producer does (idempotent, acks=all, linger 5 ms)
LIVE_PRODUCER = {"enable.idempotence": "true", "linger.ms": "5", "queue.buffering.max.messages": "1000000"}
#: the watcher: read_committed; a fetch is answered as soon as committed data is there
WATCH_CONSUMER = {"isolation.level": "read_committed", "enable.auto.commit": "false",
                  "auto.offset.reset": "earliest", "fetch.wait.max.ms": "500", "enable.partition.eof": "false"}
_SPAWN = multiprocessing.get_context("spawn")


class ItemTally:
    """Every output item read, counted; a request's id is its notification id."""

    def __init__(self, parse: Parser) -> None:
        self.parse = parse
        self.seen: Counter[Item] = Counter()

    def add(self, topic: str, value: bytes | None) -> Hashable | None:
        item = self.parse(topic, value)
        self.seen[item] += 1
        return item[1]


class IndexTally:
    """A pass-through stream of ``size`` records (bench.measure.index_record): how often each
    came back (saturating at 255), and how many records carried no index in range."""

    def __init__(self, size: int) -> None:
        self.counts = bytearray(size)
        self.unreadable = 0

    def add(self, topic: str, value: bytes | None) -> Hashable | None:
        i = read_index(value)
        if i is None or not 0 <= i < len(self.counts):
            self.unreadable += 1
            return None
        if self.counts[i] < 255:
            self.counts[i] += 1
        return i


Tally = ItemTally | IndexTally


def _prioritize() -> None:
    """Ahead of the machine's other work (BENCH_CLIENT_NICE, default -10; needs root, else kept)."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, int(os.environ.get("BENCH_CLIENT_NICE", "-10")))
    except (OSError, ValueError):
        pass


def _watch(conn: Connection, bootstrap: str, topics: list[str], tally: Tally) -> None:
    _prioritize()
    first_seen: dict[Hashable, float] = {}
    pending: list[tuple[float, int]] = []
    consumer = None
    try:
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-watch-{uuid.uuid4().hex[:10]}",
                             **WATCH_CONSUMER})
        meta = consumer.list_topics(timeout=15)
        parts = [TopicPartition(t, p, -2) for t in topics for p in meta.topics[t].partitions]
        consumer.assign(parts)
        live, ready, last_sent, clock = False, False, 0.0, time.monotonic
        while True:
            # ready once a fetch of every partition was answered (its cached watermarks are set):
            # the first fetches of a new assignment take a while, and must not count as latency
            if not ready and all(consumer.get_watermark_offsets(p, cached=True)[1] >= 0 for p in parts):
                conn.send(("ready",))
                ready = True
            if conn.poll():
                if conn.recv() == "stop":
                    break
                live = True
            # consume() waits for its whole timeout unless the batch fills: a short one
            msgs = consumer.consume(5000, 0.005)
            now = clock()
            if msgs:
                n = 0
                for m in msgs:
                    err = m.error()
                    if err is not None:
                        if err.code() != KafkaError._PARTITION_EOF:
                            conn.send(("warning", str(err)))
                        continue
                    topic, value = m.topic(), m.value()
                    if topic is None or value is None:  # a record always has both
                        continue
                    key = tally.add(topic, value)
                    if live and key not in first_seen:
                        first_seen[key] = now
                    n += 1
                if n:
                    pending.append((now, n))
            if pending and now - last_sent >= 0.02:
                conn.send(("batches", pending))
                pending, last_sent = [], now
    except Exception as exc:  # noqa: BLE001 - reported to the harness, never silently
        conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
        while conn.recv() != "stop":
            pass
    finally:
        if consumer is not None:
            consumer.close()
    conn.send(("result", pending, tally, first_seen))
    conn.close()


class Watcher:
    """The read_committed output watcher, in a process of its own (see the module's doc)."""

    def __init__(self, bootstrap: str, topics: Sequence[str], tally: Tally) -> None:
        self.count = 0
        #: (monotonic time a consume() returned, records in it)
        self.batches: list[tuple[float, int]] = []
        self.first_seen: dict[Hashable, float] = {}
        self.tally = tally
        self.error: str | None = None
        self.warnings: list[str] = []
        self._conn, child = _SPAWN.Pipe()
        self._proc = _SPAWN.Process(target=_watch, args=(child, bootstrap, list(topics), tally),
                                    name="bench-watcher", daemon=True)
        self._proc.start()
        child.close()
        self._done = self._ready = False
        deadline = time.monotonic() + 60
        while not self._ready and not self.error:
            if time.monotonic() > deadline or not self._proc.is_alive():
                raise RuntimeError(f"the watcher did not start: {self.error or 'no answer in 60 s'}")
            self.drain(0.05)

    @property
    def pid(self) -> int:
        return int(self._proc.pid or 0)

    def drain(self, timeout_s: float = 0.0) -> None:
        """Take what the watcher sent (waiting up to ``timeout_s`` for the first message)."""
        while not self._done and self._conn.poll(timeout_s):
            timeout_s = 0.0
            try:
                msg = self._conn.recv()
            except EOFError:
                self.error = self.error or "the watcher process exited"
                self._done = True
                return
            kind = msg[0]
            if kind == "batches" or kind == "result":
                for t, n in msg[1]:
                    self.count += n
                    self.batches.append((t, n))
            if kind == "ready":
                self._ready = True
            elif kind == "warning":
                self.warnings.append(msg[1])
            elif kind == "error":
                self.error = msg[1]
            elif kind == "result":
                self.tally, self.first_seen, self._done = msg[2], msg[3], True

    def live(self) -> None:
        """From now on, note the time each request's first output is read."""
        self._conn.send("live")

    def wait_for(self, count: int, timeout_s: float, alive: Callable[[], bool] = lambda: True,
                 idle_s: float | None = None) -> str:
        """Until ``count`` records were read: "complete"; or why not: "idle" (output of this wait
        started and then stopped for ``idle_s``: a system whose output differs from the model),
        "timeout", "died" (``alive()`` false), "watcher failed"."""
        start_count = self.count
        deadline = time.monotonic() + timeout_s
        while True:
            self.drain(0.02)
            if self.count >= count:
                return "complete"
            now = time.monotonic()
            if self.error or self._done:
                return "watcher failed"
            if not alive():
                return "died"
            if now > deadline:
                return "timeout"
            if idle_s is not None and self.count > start_count and now - self.batches[-1][0] > idle_s:
                return "idle"

    def stop(self, timeout_s: float = 120.0) -> None:
        """Stop reading; afterwards ``tally`` and ``first_seen`` hold what it read."""
        if not self._done:
            try:
                self._conn.send("stop")
            except OSError:
                pass
            deadline = time.monotonic() + timeout_s
            while not self._done and time.monotonic() < deadline:
                self.drain(0.1)
                if not self._proc.is_alive() and not self._conn.poll():
                    break
        self._proc.join(10)
        if self._proc.is_alive():
            self._proc.kill()
        if not self._done:
            self.error = self.error or "the watcher gave no result"

    def first_time(self) -> float | None:
        return self.batches[0][0] if self.batches else None

    def time_reaching(self, count: int) -> float | None:
        total = 0
        for t, n in self.batches:
            total += n
            if total >= count:
                return t
        return None


def _produce(conn: Connection, bootstrap: str, topic: str, records: list[Record], rate: float,
             conf: dict[str, str], prime_topic: str | None) -> None:
    _prioritize()
    errors: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    prod = Producer({"bootstrap.servers": bootstrap, **conf})
    prod.list_topics(topic, timeout=15)  # connected before the clock starts
    if prime_topic:  # and its producer id acquired, a first batch sent and acknowledged
        prod.produce(prime_topic, value=b"prime")
        prod.flush(15)
    conn.send(("ready",))
    conn.recv()
    count = len(records)
    times = array("d", bytes(8 * count))
    clock, sleep, produce, poll = time.monotonic, time.sleep, prod.produce, prod.poll
    t0 = clock()
    i = 0
    while i < count:
        now = clock()
        due = min(count, int((now - t0) * rate) + 1)
        while i < due:
            value, key, partition = records[i]
            try:
                produce(topic, value=value, key=key, partition=partition, on_delivery=on_delivery)
            except BufferError:
                poll(0.001)
                continue
            times[i] = now
            i += 1
        poll(0)
        wait = t0 + i / rate - clock()
        if wait > 0:
            sleep(min(wait, 0.002))
    achieved = count / max(1e-6, clock() - t0)
    left = prod.flush(60)
    if left:
        errors.append(f"{left} records not delivered after 60 s")
    conn.send(("done", times, achieved, errors))
    conn.close()


class LiveProducer:
    """Produces ``records`` to ``topic`` at ``rate``/s from a process of its own, once :meth:`go`
    is called; ``times[i]`` is when record i was given to ``produce()``. Before that it connects,
    and, given a ``prime_topic``, writes a record there (its producer id and first request out of
    the way)."""

    def __init__(self, bootstrap: str, topic: str, records: list[Record], rate: float,
                 conf: dict[str, str] | None = None, prime_topic: str | None = None) -> None:
        self.times: Sequence[float] = []
        self.achieved = 0.0
        self.errors: list[str] = []
        self._conn, child = _SPAWN.Pipe()
        self._proc = _SPAWN.Process(target=_produce, args=(child, bootstrap, topic, records, rate,
                                                           conf or LIVE_PRODUCER, prime_topic),
                                    name="bench-producer", daemon=True)
        self._proc.start()
        child.close()
        if not self._conn.poll(60):
            raise RuntimeError("the live producer did not start in 60 s")
        self._conn.recv()
        self._done = False

    @property
    def pid(self) -> int:
        return int(self._proc.pid or 0)

    def go(self) -> None:
        self._conn.send("go")

    def done(self, timeout_s: float = 0.0) -> bool:
        if not self._done and self._conn.poll(timeout_s):
            try:
                _, self.times, self.achieved, self.errors = self._conn.recv()
            except EOFError:
                self.errors = ["the live producer exited"]
            self._done = True
            self._proc.join(10)
        elif not self._done and not self._proc.is_alive():
            self.errors, self._done = ["the live producer exited"], True
        return self._done


def produce_live(producer: LiveProducer, watcher: Watcher, timeout_s: float) -> None:
    """Start the producer and serve the watcher's messages until the producer is done."""
    producer.go()
    deadline = time.monotonic() + timeout_s
    while not producer.done(0.0):
        watcher.drain(0.01)
        if time.monotonic() > deadline:
            raise TimeoutError(f"the live producer did not finish in {timeout_s:.0f} s")


class CommitClock(threading.Thread):
    """When output became visible to a read_committed reader, from the broker rather than from a
    reader: the output topics' last stable offsets (ListOffsets, ``READ_COMMITTED``), polled
    every ``interval_s``. A reader that reads slower than a system commits (the watcher reads
    about 150,000 records/s; the pass-through ceiling commits faster) times its own pace, and the
    CPU over such a window is that of a system done and idle. Offsets count each transaction's
    commit marker too (one per partition per commit: well under 0.1% of a backlog here)."""

    def __init__(self, bootstrap: str, topics: Sequence[str], interval_s: float = 0.1) -> None:
        super().__init__(name="commit-clock", daemon=True)
        from confluent_kafka.admin import AdminClient

        self._admin = AdminClient({"bootstrap.servers": bootstrap})
        meta = self._admin.list_topics(timeout=15)
        self._parts = [TopicPartition(t, p) for t in topics for p in meta.topics[t].partitions]
        self.interval_s = interval_s
        self._start = self._offsets()
        #: (monotonic time of an answer, offsets that became stable since the previous one)
        self.batches: list[tuple[float, int]] = []
        self.error: str | None = None
        self._last = sum(self._start.values())
        self._stop_event = threading.Event()

    def _offsets(self) -> dict[tuple[str, int], int]:
        from confluent_kafka import IsolationLevel
        from confluent_kafka.admin import OffsetSpec

        futures = self._admin.list_offsets({tp: OffsetSpec.latest() for tp in self._parts},
                                           isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=10)
        return {(tp.topic, tp.partition): int(f.result().offset) for tp, f in futures.items()}

    def run(self) -> None:
        while not self._stop_event.wait(self.interval_s):
            try:
                self._poll()
            except Exception as exc:  # noqa: BLE001 - the rate falls back to the watcher's times
                self.error = f"{type(exc).__name__}: {exc}"
                return

    def stop(self) -> None:
        """Stop polling, after one last answer (what became stable since the previous one)."""
        if self._stop_event.is_set():
            return
        self._stop_event.set()
        if self.ident is not None:
            self.join(15)
        if self.error is None:
            self._poll()

    def _poll(self) -> None:
        total = sum(self._offsets().values())
        if total > self._last:
            self.batches.append((time.monotonic(), total - self._last))
            self._last = total
