"""A confluent-kafka consumer loop that deduplicates, with its state in Redis or in memory.

``--store redis``: ``SET key value NX GET PX window`` per request, pipelined per batch (one round
trip), then ``INCR`` of a counter for the duplicates (their occurrence number). ``--store memory``:
a dict of the latest accepted request per key and a heap of expiries, evicted when the newest
event time seen minus the out-of-orderness passes them: the ceiling of what Python does with no
durability.

Neither is exactly-once: offsets are auto-committed by the consumer independently of the output
and of the Redis writes, and the output producer is idempotent but not transactional. After a
crash requests can be lost (offset committed, output not sent) or repeated; the in-memory store
loses everything.
"""

from __future__ import annotations

import argparse
import heapq
import logging
import sys
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer

from bench.peers.common import (
    accepted_outputs,
    duplicate_output,
    prefixed_topics,
    stop_on_sigterm,
    write_stats,
)
from operators import codec
from operators.dedup_key import resolve_dedup_key
from operators.records import NotificationRequest
from operators.window import WindowConfig, window_ms

#: None: new; else (original notification id, its event time, occurrence number)
Verdict = tuple[str, int, int] | None
#: (request, dedup key, Kafka partition)
Batch = list[tuple[NotificationRequest, str, int]]


class MemoryStore:
    """The latest accepted request per key; evicted once the watermark passes its window.

    The watermark is the job's: the newest event time of each partition minus the
    out-of-orderness, the minimum over ``partitions`` partitions (none until each has a record).
    Partitions are consumed at different paces, so a single newest event time would evict keys
    that a lagging partition still repeats.
    """

    def __init__(self, cfg: WindowConfig, partitions: int, out_of_orderness_ms: int = 60_000) -> None:
        self.cfg = cfg
        self.partitions = partitions
        self.lag = out_of_orderness_ms
        self.entries: dict[str, list[Any]] = {}
        self.expiries: list[tuple[int, str]] = []
        self.newest: dict[int, int] = {}
        self.evicted = 0

    def decide(self, batch: Batch) -> list[Verdict]:
        out: list[Verdict] = []
        entries = self.entries
        newest = self.newest
        for req, key, partition in batch:
            t = req.event_time
            if t > newest.get(partition, -(2**62)):
                newest[partition] = t
            entry = entries.get(key)
            if entry is not None and abs(t - entry[1]) < entry[2]:
                entry[3] += 1
                out.append((entry[0], entry[1], entry[3]))
                continue
            w = window_ms(req.dedup_ttl_sec, self.cfg)
            entries[key] = [req.notification_id, t, w, 1]
            heapq.heappush(self.expiries, (t + w, key))
            out.append(None)
        if len(newest) < self.partitions:
            return out
        watermark = min(newest.values()) - self.lag
        while self.expiries and self.expiries[0][0] <= watermark:
            _, key = heapq.heappop(self.expiries)
            entry = entries.get(key)
            if entry is not None and entry[1] + entry[2] <= watermark:
                del entries[key]
                self.evicted += 1
        return out

    def stats(self) -> dict[str, Any]:
        size = sys.getsizeof(self.entries) + sys.getsizeof(self.expiries)
        for key, entry in self.entries.items():
            size += sys.getsizeof(key) + sys.getsizeof(entry) + sum(sys.getsizeof(v) for v in entry)
        size += sum(sys.getsizeof(e) for e in self.expiries)  # the keys are shared with the dict
        return {"keys": len(self.entries), "state_bytes": size, "evicted": self.evicted}


class RedisStore:
    def __init__(self, cfg: WindowConfig, port: int) -> None:
        import redis

        self.cfg = cfg
        self.r: Any = redis.Redis(host="127.0.0.1", port=port)
        self.r.ping()
        self.baseline = self.used_memory()

    def used_memory(self) -> int:
        return int(self.r.info("memory")["used_memory"])

    def decide(self, batch: Batch) -> list[Verdict]:
        """Rounds of one pipeline each: a key's n-th request of the batch goes in round n, so it
        sees what the round before wrote (a repeat within a batch is common)."""
        out: list[Verdict] = [None] * len(batch)
        rounds: list[list[int]] = []
        seen: dict[str, int] = {}
        for i, (_, key, _) in enumerate(batch):
            n = seen.get(key, 0)
            seen[key] = n + 1
            if n == len(rounds):
                rounds.append([])
            rounds[n].append(i)
        for indexes in rounds:
            self._round(batch, indexes, out)
        return out

    def _round(self, batch: Batch, indexes: list[int], out: list[Verdict]) -> None:
        pipe = self.r.pipeline(transaction=False)
        windows = {}
        for i in indexes:
            req, key, _ = batch[i]
            w = windows[i] = window_ms(req.dedup_ttl_sec, self.cfg)
            pipe.set(key, f"{req.notification_id}|{req.event_time}|{w}", nx=True, get=True, px=w)
        olds = pipe.execute()
        follow = self.r.pipeline(transaction=False)
        counted: list[tuple[int, str, int] | None] = []  # two follow-up commands per entry
        for i, old in zip(indexes, olds, strict=True):
            if old is None:
                continue
            req, key, _ = batch[i]
            nid, t0, w0 = old.decode().split("|")
            if abs(req.event_time - int(t0)) < int(w0):
                follow.incr(f"{key}#n")
                follow.pexpire(f"{key}#n", int(w0))
                counted.append((i, nid, int(t0)))
            else:  # still in Redis (processing-time expiry) but outside its event-time window: new
                follow.set(key, f"{req.notification_id}|{req.event_time}|{windows[i]}", px=windows[i])
                follow.delete(f"{key}#n")
                counted.append(None)
        if counted:
            res = follow.execute()
            for n, entry in enumerate(counted):
                if entry is not None:
                    i, nid, t0 = entry
                    out[i] = (nid, t0, int(res[2 * n]) + 1)

    def stats(self) -> dict[str, Any]:
        mem = self.r.info("memory")
        keys = int(self.r.dbsize())
        return {"keys_including_counters": keys, "used_memory": int(mem["used_memory"]),
                "state_bytes": int(mem["used_memory"]) - self.baseline}


def consumer_partitions(bootstrap: str, topic: str) -> list[int]:
    from confluent_kafka.admin import AdminClient

    meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=30)
    return sorted(meta.topics[topic].partitions)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--input", required=True)
    p.add_argument("--prefix", required=True, help="output topics are <prefix>.notifications.*")
    p.add_argument("--group", required=True)
    p.add_argument("--store", choices=("memory", "redis"), required=True)
    p.add_argument("--redis-port", type=int)
    p.add_argument("--stats", help="JSON file the counts and state size are written to")
    p.add_argument("--batch", type=int, default=2000)
    p.add_argument("--ready-file", help="written once the loop is about to consume")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")

    from settings import Settings

    cfg = Settings().dedup.window_config()
    topics = prefixed_topics(args.prefix, args.input)
    partitions = len(consumer_partitions(args.bootstrap, args.input))
    store: MemoryStore | RedisStore = (
        MemoryStore(cfg, partitions) if args.store == "memory" else RedisStore(cfg, int(args.redis_port))
    )
    consumer = Consumer({
        "bootstrap.servers": args.bootstrap, "group.id": args.group, "auto.offset.reset": "earliest",
        "enable.auto.commit": "true", "auto.commit.interval.ms": "1000", "fetch.wait.max.ms": "20",
        "isolation.level": "read_committed",
    })
    producer = Producer({
        "bootstrap.servers": args.bootstrap, "enable.idempotence": "true", "linger.ms": "5",
        "batch.size": "1000000", "queue.buffering.max.messages": "1000000",
        "queue.buffering.max.kbytes": "1048576",
    })
    consumer.subscribe([args.input])
    stop = stop_on_sigterm()
    if args.ready_file:
        Path(args.ready_file).write_text("ready")
    processed = duplicates = 0
    last_stats = time.monotonic()
    while not stop.is_set():
        # consume() waits for its whole timeout unless the batch fills: a short one keeps latency low
        msgs = consumer.consume(args.batch, 0.01)
        batch: Batch = []
        for m in msgs:
            value, partition = m.value(), m.partition()
            if m.error() is not None or value is None or partition is None:
                continue
            req = codec.decode_request(value)
            batch.append((req, resolve_dedup_key(req), partition))
        if batch:
            for (req, key, _), verdict in zip(batch, store.decide(batch), strict=True):
                if verdict is None:
                    outs = accepted_outputs(req, key, topics)
                else:
                    duplicates += 1
                    outs = [duplicate_output(req, key, verdict[0], verdict[1], verdict[2], topics)]
                for topic, k, value in outs:
                    while True:
                        try:
                            producer.produce(topic, value=value, key=k)
                            break
                        except BufferError:
                            producer.poll(0.05)
            processed += len(batch)
        producer.poll(0)
        if time.monotonic() - last_stats > 2:
            write_stats(args.stats, {"processed": processed, "duplicates": duplicates})
            last_stats = time.monotonic()
    producer.flush(60)
    consumer.close()
    write_stats(args.stats, {"processed": processed, "duplicates": duplicates, **store.stats()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
