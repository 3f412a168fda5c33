"""The same dedup as a Quix Streams application: RocksDB state, a window, exactly-once.

State is Quix's per-message-key RocksDB state: the input's Kafka key is the user id, and every
repeat of a request carries its user id, so a dedup key always lives under one message key
(``state.get(dedup_key)`` within it; no repartition topic is needed). Each entry holds the latest
accepted request (id, event time, window, occurrences); the window rule is checked in event time
(``|t - t0| < W0``), and the entry is written with Quix's state TTL (``ttl=`` the window, counted
from the record's timestamp) so it expires. ``processing_guarantee="exactly-once"``: the output,
the changelog of the state and the input offsets are committed in one Kafka transaction per
checkpoint (``commit_interval``).
"""

from __future__ import annotations

import argparse
import logging
from datetime import timedelta
from pathlib import Path
from typing import Any

from quixstreams import Application
from quixstreams.models.serializers import Serializer

from bench.peers.common import accepted_outputs, duplicate_output, prefixed_topics
from operators import codec
from operators.dedup_key import resolve_dedup_key
from operators.window import window_ms


class RoutedValue(Serializer):
    """The (topic, key, value) tuples the dedup step emits: the value is already Avro bytes."""

    def __call__(self, value: Any, ctx: Any) -> bytes:
        return bytes(value[2])


class RoutedKey(Serializer):
    def __call__(self, value: Any, ctx: Any) -> bytes:
        return bytes(value) if value is not None else b""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--input", required=True)
    p.add_argument("--prefix", required=True)
    p.add_argument("--group", required=True)
    p.add_argument("--state-dir", required=True)
    p.add_argument("--commit-interval-s", type=float, default=2.0)
    p.add_argument("--ready-file", help="written once the application is about to run")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")

    from settings import Settings

    cfg = Settings().dedup.window_config()
    topics = prefixed_topics(args.prefix, args.input)
    app = Application(
        broker_address=args.bootstrap, consumer_group=args.group, auto_offset_reset="earliest",
        processing_guarantee="exactly-once", commit_interval=args.commit_interval_s,
        state_dir=args.state_dir, loglevel="WARNING", auto_create_topics=True,
        consumer_extra_config={"fetch.wait.max.ms": "20"},
    )
    source = app.topic(args.input, key_deserializer="bytes", value_deserializer="bytes")
    outputs = {
        name: app.topic(name, key_serializer=RoutedKey(), value_serializer=RoutedValue())
        for name in topics.outputs()
    }

    def decide(value: bytes, state: Any) -> list[tuple[str, bytes | None, bytes]]:
        req = codec.decode_request(value)
        key = resolve_dedup_key(req)
        stored = state.get(key)
        if stored is not None and abs(req.event_time - stored[1]) < stored[2]:
            stored[3] += 1
            state.set(key, stored, ttl=timedelta(milliseconds=stored[2]))
            return [duplicate_output(req, key, stored[0], stored[1], stored[3], topics)]
        w = window_ms(req.dedup_ttl_sec, cfg)
        state.set(key, [req.notification_id, req.event_time, w, 1], ttl=timedelta(milliseconds=w))
        return accepted_outputs(req, key, topics)

    sdf = app.dataframe(source)
    sdf = sdf.apply(decide, stateful=True, expand=True)
    sdf.to_topic(lambda value, _key, _ts, _headers: outputs[value[0]], key=lambda value: value[1])
    if args.ready_file:
        Path(args.ready_file).write_text("ready")
    app.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
