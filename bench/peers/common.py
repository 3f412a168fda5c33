"""What the Python peers share: the topic names of a run and the job's output records.

The Python peers write exactly what the job writes (Avro ``ChannelMessage`` per channel and lane,
Avro ``DuplicateNotice``), built here from the data contract's schemas (``operators.codec``),
so their output is read and checked like the job's.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path
from typing import Any

from operators import codec
from operators.contract import Topics
from operators.records import NotificationRequest

#: (topic, Kafka key, value)
Out = tuple[str, bytes | None, bytes]


def prefixed_topics(prefix: str, requests: str) -> Topics:
    return Topics({**Topics().with_prefix(f"{prefix}.").by_role(), "requests": requests})


def accepted_outputs(req: NotificationRequest, dedup_key: str, topics: Topics) -> list[Out]:
    base = req.to_avro()
    base["dedup_key"] = dedup_key
    user = req.user_id.encode("utf-8")
    out: list[Out] = []
    for channel in req.channels:
        msg = dict(base, message_key=f"{dedup_key}:{channel.value}", channel=channel.value)
        out.append((topics.channel_topic(channel, req.priority), user, codec.encode("channel_message", msg)))
    return out


def duplicate_output(
    req: NotificationRequest, dedup_key: str, original_id: str, original_time: int, occurrence: int,
    topics: Topics,
) -> Out:
    notice = {
        "notification_id": req.notification_id, "dedup_key": dedup_key,
        "original_notification_id": original_id, "first_seen_event_time": original_time,
        "event_time": req.event_time, "occurrence": occurrence,
    }
    return (topics.duplicates, dedup_key.encode("utf-8"), codec.encode("duplicate_notice", notice))


def stop_on_sigterm() -> threading.Event:
    """An event set by SIGTERM or SIGINT: the peers finish their batch, flush and write stats."""
    stop = threading.Event()

    def handler(_signum: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop


def write_stats(path: str | None, stats: dict[str, Any]) -> None:
    if not path:
        return
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps(stats))
    os.replace(tmp, path)
