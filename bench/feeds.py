"""What a system is given and what it must give back: the dataset, or a pass-through stream.

* :class:`DatasetFeed`: the benchmark's dataset (Avro, or its JSON copy for the Flink SQL peer);
  the expected output is the reference model's.
* :class:`IndexFeed`: the ceiling's input (and the latency floor's): record i is its index in 12
  ASCII digits followed by the rest of request ``i mod len(dataset)``, with that request's key
  and partition (so the job's record sizes and partitioning), and it must come back exactly once.
  It is not tied to the dataset's length, so the ceiling gets a backlog long enough for its rate.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from dataclasses import dataclass

from bench.dataset import Dataset, Record
from bench.measure import Exactness, Parser, compare, index_exactness, index_record
from bench.watch import IndexTally, ItemTally, Tally


@dataclass
class DatasetFeed:
    ds: Dataset
    fmt: str = "avro"
    #: the keys in state are exactly the accepted requests unless windows end within the run
    evicting: bool = False

    @property
    def backlog(self) -> int:
        return self.ds.spec.backlog

    @property
    def size(self) -> int:
        return len(self.ds)

    def records(self, start: int, stop: int) -> Iterator[Record]:
        ds = self.ds
        values = ds.avro if self.fmt == "avro" else ds.json
        for i in range(start, stop):
            yield values[i], ds.keys[i], ds.partitions[i]

    def outputs(self, n: int) -> int:
        """Output records expected from the first ``n`` requests."""
        return self.ds.outputs_cum[n]

    def ident(self, i: int) -> Hashable:
        """What the watcher's tally names request ``i`` by."""
        return self.ds.nids[i]

    def tally(self, parse: Parser | None) -> Tally:
        assert parse is not None
        return ItemTally(parse)

    def exactness(self, tally: Tally, processed: int) -> Exactness:
        assert isinstance(tally, ItemTally)
        return compare(self.ds.expected_counter(processed), tally.seen)

    def keys(self, processed: int) -> int:
        return self.ds.new_cum[processed]


@dataclass
class IndexFeed:
    ds: Dataset
    backlog: int
    live_pool: int
    evicting: bool = False

    @property
    def size(self) -> int:
        return self.backlog + self.live_pool

    def records(self, start: int, stop: int) -> Iterator[Record]:
        ds, n = self.ds, len(self.ds)
        for i in range(start, stop):
            j = i % n
            yield index_record(i, ds.avro[j]), ds.keys[j], ds.partitions[j]

    def outputs(self, n: int) -> int:
        return n

    def ident(self, i: int) -> Hashable:
        return i

    def tally(self, parse: Parser | None = None) -> Tally:
        return IndexTally(self.size)

    def exactness(self, tally: Tally, processed: int) -> Exactness:
        assert isinstance(tally, IndexTally)
        return index_exactness(tally.counts, processed, tally.unreadable)

    def keys(self, processed: int) -> int:
        return 0


Feed = DatasetFeed | IndexFeed
