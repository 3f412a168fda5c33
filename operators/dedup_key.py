"""The keys the contract defines: a request's dedup key, a channel message's message key, and the
shard of keyed state a dedup key lives in. The JVM's twin is connector/.../contract/Keys.java;
tests/vectors.json checks both, byte for byte."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

from operators.contract import contract
from operators.records import Channel, NotificationRequest

_KEY = contract().dedup_key
_MESSAGE_KEY = contract().message_key
if tuple(_KEY["derived_from"]) != ("user_id", "template_id", "params"):
    raise ImportError("the derived dedup key is made of user_id, template_id and params")


def canonical_json(params: Mapping[str, str]) -> bytes:
    return json.dumps(params, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def derive_dedup_key(user_id: str, template_id: str, params: Mapping[str, str]) -> str:
    """The first hex characters of digest(user_id | template_id | canonical_json(params))."""
    sep = _KEY["separator"]
    digest = hashlib.new(str(_KEY["digest"]).replace("-", "").lower())
    digest.update(f"{user_id}{sep}{template_id}{sep}".encode())
    digest.update(canonical_json(params))
    return digest.hexdigest()[: int(_KEY["hex_chars"])]


def resolve_dedup_key(request: NotificationRequest) -> str:
    """``dedup_key`` when given and non-empty, else the derived key."""
    if request.dedup_key:
        return request.dedup_key
    return derive_dedup_key(request.user_id, request.template_id, request.params)


def message_key(dedup_key: str, channel: Channel | str, fields: Mapping[str, object]) -> str:
    """The contract's message-key parts joined by its separator: ``dedup_key`` is the resolved
    key, ``channel`` the channel, any other part the request field of that name."""
    parts = []
    for part in _MESSAGE_KEY["parts"]:
        if part == "dedup_key":
            parts.append(dedup_key)
        elif part == "channel":
            parts.append(str(channel))
        else:
            parts.append(str(fields[part]))
    return str(_MESSAGE_KEY["separator"]).join(parts)


def dedup_key_of(message_key: str) -> str:
    """The dedup key a message key was made from (the parts after it never hold the separator)."""
    tail = len(_MESSAGE_KEY["parts"]) - 1 - list(_MESSAGE_KEY["parts"]).index("dedup_key")
    return message_key.rsplit(str(_MESSAGE_KEY["separator"]), tail)[0] if tail else message_key


def shard_of(dedup_key: str, shards: int) -> int:
    """The shard of keyed state a dedup key is in (the JVM's Keys.shardOf: Java's String.hashCode,
    then a murmur3 finalizer), e.g. for ``dedupctl trace`` to say which shard holds a key."""
    h = 0
    for unit in _utf16_units(dedup_key):
        h = (31 * h + unit) & _U32
    return _signed(_fmix32(h)) % shards


def key_group_of(shard: int, max_parallelism: int) -> int:
    """The Flink key group a shard's state is in (KeyGroupRangeAssignment.assignToKeyGroup of the
    Integer key: MathUtils.murmurHash of its hashCode, modulo max parallelism)."""
    h = _rotl((shard * 0xCC9E2D51) & _U32, 15)
    h = _rotl((h * 0x1B873593) & _U32, 13)
    h = _signed(_fmix32(((h * 5 + 0xE6546B64) & _U32) ^ 4))
    return (abs(h) if h != -(1 << 31) else 0) % max_parallelism


def subtask_of(key_group: int, parallelism: int, max_parallelism: int) -> int:
    """The subtask that holds a key group at a parallelism (computeOperatorIndexForKeyGroup)."""
    return key_group * parallelism // max_parallelism


_U32 = 0xFFFFFFFF


def _fmix32(h: int) -> int:
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _U32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _U32
    return h ^ (h >> 16)


def _rotl(h: int, r: int) -> int:
    return ((h << r) | (h >> (32 - r))) & _U32


def _signed(h: int) -> int:
    return h - (1 << 32) if h & 0x80000000 else h


def _utf16_units(text: str) -> list[int]:
    data = text.encode("utf-16-be", "surrogatepass")
    return [int.from_bytes(data[i:i + 2], "big") for i in range(0, len(data), 2)]


def key_hash(dedup_key: str) -> int:
    """The dedup key's stable 64-bit hash: the first 8 bytes of its SHA-256 (UTF-8), big-endian,
    signed. The JVM computes the same (Keys.keyHash) for every request; the Bloom prefilter's item.
    """
    return int.from_bytes(hashlib.sha256(dedup_key.encode("utf-8")).digest()[:8], "big", signed=True)
