"""Writes tests/vectors.json, the contract's shared test vectors: inputs and the expected outputs
of the dedup-key derivation, the canonical JSON, the shard function, the message key and the
record encodings. JUnit (connector/src/test/java/.../VectorsTest.java) and pytest
(tests/operators/test_vectors.py) both check their implementation against the file.

Run it (``python -m tests.make_vectors``) only when the contract changes on purpose, and read the
diff: every changed expectation is a change of the wire format or of where a key's state lives.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.reference import request_record
from operators import codec
from operators.dedup_key import (
    canonical_json,
    derive_dedup_key,
    key_group_of,
    key_hash,
    message_key,
    resolve_dedup_key,
    shard_of,
    subtask_of,
)
from operators.records import Category, Channel, NotificationRequest, Priority, SourcePosition
from operators.window import Accepted
from tests import encoders

VECTORS = Path(__file__).resolve().parent / "vectors.json"

PARAMS = [
    {},
    {"order": "A-17", "eta": "2024-05-01"},
    {"b": "2", "a": "1"},
    {"quote": 'say "hi"', "back\\slash": "c:\\temp", "slash/": "a/b"},
    {"ctl": "line1\nline2\r\t\b\f\x01\x1f\x7f"},
    {"ünï": "cödé", "日本": "語", "name": "Zoë"},
    {"😀": "emoji key", "\uffff": "last BMP", "\ue000": "private use", "𝄞": "astral"},
    {"": "empty key", " ": "space"},
]
KEYS = ["", "a", "abc", "key-1", "campaign-2026-11:carol", "ключ", "日本語", "😀𝄞", "x" * 512, "a|b:c"]
SHARDS = [1, 2, 3, 16, 128, 1000]


def requests() -> list[NotificationRequest]:
    out = []
    for i, params in enumerate(PARAMS):
        out.append(NotificationRequest(
            notification_id=f"n-{i}", user_id=["u-1", "ユーザー", "user-42", "😀"][i % 4],
            template_id=["otp", "order_shipped", "t|x"][i % 3], params=params,
            channels=[(Channel.SMS,), (Channel.PUSH, Channel.EMAIL), (Channel.EMAIL, Channel.PUSH, Channel.SMS)][i % 3],
            event_time=1_796_115_600_000 + i * 1_001, priority=list(Priority)[i % 3],
            category=list(Category)[i % 2], dedup_key=[None, "", "explicit:ключ"][i % 3],
            dedup_ttl_sec=[None, 300, 0, 2_592_001][i % 4],
            traceparent=[None, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"][i % 2],
        ))
    return out


def fields(req: NotificationRequest) -> dict[str, Any]:
    return request_record(req)


def main() -> None:
    from operators.contract import Topics

    topics = Topics()
    reqs = requests()
    vectors: dict[str, Any] = {
        "doc": "The contract's shared test vectors, checked by JUnit and by pytest; written by tests/make_vectors.py.",
        "canonical_json": [{"params": p, "json": canonical_json(p).decode("utf-8")} for p in PARAMS],
        "derived_key": [
            {"user_id": r.user_id, "template_id": r.template_id, "params": r.params,
             "key": derive_dedup_key(r.user_id, r.template_id, r.params)}
            for r in reqs
        ],
        "shard": [{"key": k, "shards": n, "shard": shard_of(k, n)} for k in KEYS for n in SHARDS],
        "key_hash": [{"key": k, "hash": key_hash(k)} for k in KEYS],
        "key_group": [
            {"shard": s, "max_parallelism": m, "key_group": key_group_of(s, m),
             "parallelism": p, "subtask": subtask_of(key_group_of(s, m), p, m)}
            for s in (0, 1, 2, 17, 127, 999) for m in (128, 4096) for p in (1, 3, 4)
        ],
        "message_key": [],
        "records": [],
    }
    for r in reqs:
        key = resolve_dedup_key(r)
        base = fields(r)
        raw = codec.encode_request(r)
        entry: dict[str, Any] = {
            "request": base, "request_hex": raw.hex(), "dedup_key": key, "channel_messages": [],
        }
        for ch in base["channels"]:
            vectors["message_key"].append({"dedup_key": key, "channel": ch, "event_time": r.event_time,
                                           "message_key": message_key(key, ch, base)})
        for routed in encoders.channel_messages(r, key, topics):
            entry["channel_messages"].append({"topic_role": topics.spec_of(routed.topic).role,  # type: ignore[union-attr]
                                              "key_hex": routed.key.hex() if routed.key else None,
                                              "value_hex": routed.value.hex()})
        dup = encoders.duplicate_notice(r, key, Accepted("orig-1", r.event_time - 5, 1000, 3), topics)
        entry["duplicate"] = {"original_notification_id": "orig-1", "first_seen_event_time": r.event_time - 5,
                              "occurrence": 3, "key_hex": dup.key.hex() if dup.key else None,
                              "value_hex": dup.value.hex()}
        wm = r.event_time + 60_000
        reason = f"event_time {r.event_time} is behind the watermark {wm} minus allowed lateness 0 ms"
        late = encoders.late_notice(r, wm, reason, topics)
        entry["late"] = {"watermark": wm, "reason": reason, "key_hex": late.key.hex() if late.key else None,
                         "value_hex": late.value.hex()}
        vectors["records"].append(entry)
    invalid = []
    for raw, prefix in [(b"", 16), (b"\x00\x01not-avro", 16), (bytes(range(256)) * 2, 100)]:
        pos = SourcePosition("notifications.requests", 3, 12345)
        routed = encoders.invalid_record(raw, "why", pos, topics, prefix_bytes=prefix)
        invalid.append({"raw_hex": raw.hex(), "prefix_bytes": prefix, "error": "why", "topic": pos.topic,
                        "partition": pos.partition, "offset": pos.offset, "value_hex": routed.value.hex()})
    vectors["invalid_records"] = invalid
    VECTORS.write_text(json.dumps(vectors, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
