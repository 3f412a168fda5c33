"""The Python side of the contract against tests/vectors.json (JUnit checks the JVM against it too:
connector/src/test/java/io/notifydedup/flink/VectorsTest.java)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from operators import codec
from operators.contract import Topics
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
from operators.records import SourcePosition
from operators.window import Accepted
from tests import encoders

VECTORS = json.loads((Path(__file__).resolve().parents[1] / "vectors.json").read_text(encoding="utf-8"))
TOPICS = Topics()


def ids(v: dict[str, Any]) -> str:
    return json.dumps(v, ensure_ascii=True)[:60]


@pytest.mark.parametrize("v", VECTORS["canonical_json"], ids=ids)
def test_canonical_json(v: dict[str, Any]) -> None:
    assert canonical_json(v["params"]).decode("utf-8") == v["json"]


@pytest.mark.parametrize("v", VECTORS["derived_key"], ids=ids)
def test_derived_key(v: dict[str, Any]) -> None:
    assert derive_dedup_key(v["user_id"], v["template_id"], v["params"]) == v["key"]


def test_key_hash() -> None:
    assert [key_hash(v["key"]) for v in VECTORS["key_hash"]] == [v["hash"] for v in VECTORS["key_hash"]]


def test_shard() -> None:
    assert [shard_of(v["key"], v["shards"]) for v in VECTORS["shard"]] == [v["shard"] for v in VECTORS["shard"]]


def test_key_group() -> None:
    for v in VECTORS["key_group"]:
        assert key_group_of(v["shard"], v["max_parallelism"]) == v["key_group"], v
        assert subtask_of(v["key_group"], v["parallelism"], v["max_parallelism"]) == v["subtask"], v


@pytest.mark.parametrize("v", VECTORS["message_key"], ids=ids)
def test_message_key(v: dict[str, Any]) -> None:
    assert message_key(v["dedup_key"], v["channel"], {"event_time": v["event_time"]}) == v["message_key"]


@pytest.mark.parametrize("v", VECTORS["records"], ids=lambda v: v["request"]["notification_id"])
def test_records(v: dict[str, Any]) -> None:
    req = codec.decode_request(bytes.fromhex(v["request_hex"]))
    assert resolve_dedup_key(req) == v["dedup_key"]
    routed = encoders.channel_messages(req, v["dedup_key"], TOPICS)
    assert [(TOPICS.spec_of(r.topic).role, r.key.hex() if r.key else None, r.value.hex())  # type: ignore[union-attr]
            for r in routed] == [(m["topic_role"], m["key_hex"], m["value_hex"]) for m in v["channel_messages"]]
    d = v["duplicate"]
    dup = encoders.duplicate_notice(
        req, v["dedup_key"], Accepted(d["original_notification_id"], d["first_seen_event_time"], 1, d["occurrence"]),
        TOPICS,
    )
    assert (dup.key.hex() if dup.key else None, dup.value.hex()) == (d["key_hex"], d["value_hex"])
    lt = v["late"]
    late = encoders.late_notice(req, lt["watermark"], lt["reason"], TOPICS)
    assert (late.key.hex() if late.key else None, late.value.hex()) == (lt["key_hex"], lt["value_hex"])


@pytest.mark.parametrize("v", VECTORS["invalid_records"], ids=lambda v: v["raw_hex"][:16])
def test_invalid_records(v: dict[str, Any]) -> None:
    pos = SourcePosition(v["topic"], v["partition"], v["offset"])
    routed = encoders.invalid_record(bytes.fromhex(v["raw_hex"]), v["error"], pos, TOPICS, v["prefix_bytes"])
    assert routed.value.hex() == v["value_hex"]
    decoded = codec.decode("invalid_record", routed.value)
    assert len(decoded["raw"]) == min(v["prefix_bytes"], len(bytes.fromhex(v["raw_hex"])))
