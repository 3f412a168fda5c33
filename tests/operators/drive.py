"""Drives ``operators.dedup`` the way the Flink adapter does, without Flink: per shard an
in-memory store and memory, mini-batches that never cross a watermark, eviction timers fired when
the watermark passes them. Its verdicts are compared with the reference model (harness.reference)."""

from __future__ import annotations

import random
from collections.abc import Iterable

from harness.reference import Outcome
from operators.bloom import BloomConfig
from operators.dedup import ACCEPTED, DUPLICATE, DedupOptions, ShardMemory, decide_batch, evict
from operators.dedup_key import key_hash, resolve_dedup_key, shard_of
from operators.records import NotificationRequest
from operators.window import Accepted, WindowConfig

Summary = tuple[str, str | None, int | None, int | None]


class DictStore:
    """``operators.dedup.ShardStore`` over a dict, counting its reads. It holds plain tuples, as
    the job's MapState gives them back (jobs/dedup_function.py writes ``tuple(accepted)``)."""

    def __init__(self) -> None:
        self.entries: dict[str, tuple[object, ...]] = {}
        self.reads = 0

    def get(self, key: str) -> Accepted | None:
        self.reads += 1
        return self.entries.get(key)  # type: ignore[return-value]  # a tuple of Accepted's fields


def options(cfg: WindowConfig, grain_ms: int = 1) -> DedupOptions:
    bloom = BloomConfig(initial_keys=8, fp_rate=0.01)
    return DedupOptions(window=cfg, bloom=bloom, eviction_grain_ms=grain_ms, fold_every=512)


class Driver:
    """The adapter's loop: ``run(stream)`` gives one summary per request, in order."""

    def __init__(self, cfg: WindowConfig, shards: int = 4, seed: int = 0, max_batch: int = 1) -> None:
        self.cfg = cfg
        self.opts = options(cfg)
        self.shards = shards
        self.rng = random.Random(seed)
        self.max_batch = max_batch
        self.stores = [DictStore() for _ in range(shards)]
        self.memories = [ShardMemory.empty(self.opts.bloom) for _ in range(shards)]
        self.logs: list[list[tuple[int, str, int]]] = [[] for _ in range(shards)]
        self.timers: list[set[int]] = [set() for _ in range(shards)]
        self.watermark = -(2**63)

    def advance(self, watermark: int) -> None:
        """The watermark moved: fire every timer it passed, as Flink does, in time order."""
        self.watermark = max(self.watermark, watermark)
        for s in range(self.shards):
            for fire_at in sorted(t for t in self.timers[s] if t <= self.watermark):
                self.timers[s].discard(fire_at)
                gone = evict(self.logs[s], self.stores[s], fire_at, self.cfg)
                for key in gone.evicted:
                    del self.stores[s].entries[key]
                self.memories[s].held -= len(gone.evicted)
                self.logs[s] = gone.survivors
                self.memories[s].refilter((k for _, k, _ in gone.survivors), self.opts.bloom)

    def run(self, stream: Iterable[tuple[NotificationRequest, int]]) -> list[Summary]:
        items = list(stream)
        out: list[Summary | None] = [None] * len(items)
        i = 0
        while i < len(items):
            watermark = items[i][1]
            self.advance(watermark)
            # one batch: requests under the same watermark, up to max_batch of them
            j = i
            while j < len(items) and items[j][1] == watermark and j - i < self.rng.randint(1, self.max_batch):
                j += 1
            j = max(j, i + 1)
            by_shard: dict[int, list[int]] = {}
            for k in range(i, j):
                by_shard.setdefault(shard_of(resolve_dedup_key(items[k][0]), self.shards), []).append(k)
            for s, idx in by_shard.items():
                reqs = [items[k][0] for k in idx]
                result = decide_batch(
                    dedup_keys=[resolve_dedup_key(r) for r in reqs],
                    key_hashes=[key_hash(resolve_dedup_key(r)) for r in reqs],
                    event_times=[r.event_time for r in reqs],
                    notification_ids=[r.notification_id for r in reqs],
                    ttls=[r.dedup_ttl_sec for r in reqs],
                    watermark=self.watermark,
                    memory=self.memories[s],
                    store=self.stores[s],
                    opts=self.opts,
                )
                self.stores[s].entries.update({k: tuple(a) for k, a in result.written.items()})
                self.logs[s] += result.logged
                if self.memories[s].bloom.full():  # as the adapter does: a larger filter
                    self.memories[s].grow(self.opts.bloom)
                self.timers[s] |= result.timers
                v = result.verdicts
                for n, k in enumerate(idx):
                    if v.outcome[n] == ACCEPTED:
                        out[k] = ("new", None, None, None)
                    elif v.outcome[n] == DUPLICATE:
                        out[k] = ("duplicate", v.original_notification_id[n], v.first_seen_event_time[n], v.occurrence[n])
                    else:
                        assert v.watermark[n] == self.watermark
                        out[k] = ("late", None, None, None)
            i = j
        assert all(o is not None for o in out)
        return [o for o in out if o is not None]

    def held(self) -> int:
        return sum(m.held for m in self.memories)


def summarize(outcomes: list[Outcome]) -> list[Summary]:
    return [(o.verdict, o.original_notification_id, o.first_seen_event_time, o.occurrence) for o in outcomes]
