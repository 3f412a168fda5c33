"""Python's cyclic garbage collector in a long-running service (``dedupctl senders run``, the API).

What start-up made (modules, schemas, templates, clients) lives as long as the process: it is
frozen out of the collector's sight, so a full collection no longer walks it. And the youngest
generation is collected every ``YOUNG_THRESHOLD`` net allocations instead of CPython's 700: a
sender with a thousand calls open keeps tens of thousands of objects alive for the ~200 ms of a
call, so at 700 they were walked again and again and promoted to the older generations, whose
collections then walk them all (16 full collections in one run, 30-60 ms each). Measured on one
``senders run`` (``python -m bench.senders_probe --messages 24000 --latency-ms 200
--max-in-flight 1000``, two runs each): 246 -> 197 us of the process's CPU per message; the
collector's own CPU in a run 1.29 s -> 0.19 s.

The API keeps CPython's threshold: its event loop answers callers, a young collection of 30,000
objects is a ~10 ms pause on it, and at 1,000 and 2,000 requests/s the API's CPU per request was
the same either way (``python -m bench.api --rates 1000,2000 --seconds 20``: 0.654 / 0.443 ms
with it, 0.66 / 0.44 without).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

#: net allocations of container objects between two collections of the youngest generation
YOUNG_THRESHOLD = 30_000


@contextmanager
def serving(young_threshold: int | None = YOUNG_THRESHOLD) -> Iterator[None]:
    """While the service runs: start-up's objects frozen, and (``young_threshold`` not None) the
    young generation collected that much less often. Both undone on the way out (a test process
    runs many services in turn)."""
    before = gc.get_threshold()
    gc.freeze()
    if young_threshold is not None:
        gc.set_threshold(young_threshold, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
