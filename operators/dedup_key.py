"""The dedup key of a request, and the shard of the keyed state it lives in."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

from operators.records import NotificationRequest

DERIVED_KEY_HEX_CHARS = 32


def canonical_json(params: Mapping[str, str]) -> bytes:
    return json.dumps(params, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode(
        "utf-8"
    )


def derive_dedup_key(user_id: str, template_id: str, params: Mapping[str, str]) -> str:
    """First 32 hex chars of sha256(user_id | template_id | canonical_json(params))."""
    digest = hashlib.sha256()
    digest.update(f"{user_id}|{template_id}|".encode())
    digest.update(canonical_json(params))
    return digest.hexdigest()[:DERIVED_KEY_HEX_CHARS]


def resolve_dedup_key(request: NotificationRequest) -> str:
    """``dedup_key`` when given and non-empty, else the derived key."""
    if request.dedup_key:
        return request.dedup_key
    return derive_dedup_key(request.user_id, request.template_id, request.params)


def key_hash(dedup_key: str) -> int:
    """A stable, signed 128-bit hash of the key: the Bloom filter's item and the shard's source.

    Stable across processes and restarts (unlike ``hash()``), so a saved filter stays valid.
    """
    digest = hashlib.blake2b(dedup_key.encode("utf-8"), digest_size=16).digest()
    return int.from_bytes(digest, "little", signed=True)


def shard_of(hashed: int, shards: int) -> int:
    return hashed % shards
