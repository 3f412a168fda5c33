"""operators.dedup_key: the derived key, its resolution, its hash and its shard."""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from operators.dedup_key import derive_dedup_key, key_hash, resolve_dedup_key, shard_of
from operators.records import NotificationRequest

RequestFactory = Callable[..., NotificationRequest]

PROPERTY = settings(max_examples=200, deadline=None)


def expected_key(user_id: str, template_id: str, params: dict[str, str]) -> str:
    """The data contract's formula, written out independently."""
    canonical = json.dumps(params, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256((user_id + "|" + template_id + "|" + canonical).encode("utf-8")).hexdigest()[:32]


# computed once with expected_key and written down, so a change of the formula cannot go unnoticed
@pytest.mark.parametrize(
    ("user_id", "template_id", "params", "hex_key"),
    [
        ("user-1", "otp", {}, "68c7180139d1888329cd1fc11b162413"),
        (
            "user-42",
            "order-shipped",
            {"order": "A-17", "eta": "2024-05-01"},
            "c50c186cb1b4ac5556429bcc58add944",
        ),
        (
            "ユーザー",
            "welcome",
            {"name": "Zoë", "greeting": "こんにちは"},
            "1750fc43d8bc8f29f857c7d85328a1c6",
        ),
    ],
)
def test_fixed_vectors(user_id: str, template_id: str, params: dict[str, str], hex_key: str) -> None:
    assert derive_dedup_key(user_id, template_id, params) == hex_key
    assert expected_key(user_id, template_id, params) == hex_key


TEXT = st.text(max_size=12)
PARAMS = st.dictionaries(st.text(max_size=6), st.text(max_size=6), max_size=6)


@PROPERTY
@given(TEXT, TEXT, PARAMS)
def test_derived_key_matches_the_formula(user_id: str, template_id: str, params: dict[str, str]) -> None:
    key = derive_dedup_key(user_id, template_id, params)
    assert key == expected_key(user_id, template_id, params)
    assert len(key) == 32 and all(c in "0123456789abcdef" for c in key)


@PROPERTY
@given(PARAMS, st.randoms(use_true_random=False))
def test_param_order_does_not_matter(params: dict[str, str], rnd: random.Random) -> None:
    items = list(params.items())
    rnd.shuffle(items)
    assert derive_dedup_key("u", "t", dict(items)) == derive_dedup_key("u", "t", params)
    assert derive_dedup_key("u", "t", dict(reversed(items))) == derive_dedup_key("u", "t", params)


def test_unicode_params_are_hashed_as_utf8_not_escaped() -> None:
    params = {"名前": "Zoë 🎉"}
    escaped = json.dumps(params, sort_keys=True, separators=(",", ":"))  # \\u escapes
    assert derive_dedup_key("u", "t", params) == expected_key("u", "t", params)
    assert derive_dedup_key("u", "t", params) != hashlib.sha256(f"u|t|{escaped}".encode()).hexdigest()[:32]


def test_every_input_matters() -> None:
    base = derive_dedup_key("u", "t", {"a": "1"})
    assert derive_dedup_key("v", "t", {"a": "1"}) != base
    assert derive_dedup_key("u", "s", {"a": "1"}) != base
    assert derive_dedup_key("u", "t", {"a": "2"}) != base
    assert derive_dedup_key("u", "t", {"b": "1"}) != base
    assert derive_dedup_key("u", "t", {}) != base
    # the separator keeps field boundaries: ("a|b", "c") and ("a", "b|c") differ only by it
    assert derive_dedup_key("ab", "c", {}) != derive_dedup_key("a", "bc", {})


def test_explicit_dedup_key_wins(make_request: RequestFactory) -> None:
    assert resolve_dedup_key(make_request(dedup_key="order-17", params={"x": "1"})) == "order-17"
    assert resolve_dedup_key(make_request(dedup_key=" ")) == " "


@pytest.mark.parametrize("dedup_key", [None, ""])
def test_missing_or_empty_dedup_key_falls_back_to_the_derived_one(
    make_request: RequestFactory, dedup_key: str | None
) -> None:
    req = make_request(user_id="u9", template_id="t9", params={"k": "v"}, dedup_key=dedup_key)
    assert resolve_dedup_key(req) == expected_key("u9", "t9", {"k": "v"})


def test_key_hash_is_stable() -> None:
    # fixed values: a saved Bloom filter depends on them across processes and versions
    assert key_hash("abc") == -5010229573455851542
    assert key_hash("") == -2039914840885289964
    assert key_hash("key-1") == -4744132826562501773
    digest = hashlib.sha256(b"abc").digest()
    assert key_hash("abc") == int.from_bytes(digest[:8], "big", signed=True)


def test_key_hash_is_the_same_in_another_process() -> None:
    code = "from operators.dedup_key import key_hash; print(key_hash('stable?'))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "12345"},
        cwd=Path(__file__).resolve().parents[2],
    )
    assert int(out.stdout) == key_hash("stable?")


@PROPERTY
@given(st.text(max_size=40))
def test_key_hash_range(key: str) -> None:
    h = key_hash(key)
    assert -(2**63) <= h < 2**63
    assert h == key_hash(key)


def test_key_hash_uses_both_signs() -> None:
    hashes = [key_hash(f"key-{i}") for i in range(4_000)]
    assert any(h < 0 for h in hashes) and any(h > 0 for h in hashes)


@PROPERTY
@given(st.text(max_size=40), st.integers(1, 4096))
def test_shard_range(key: str, shards: int) -> None:
    assert 0 <= shard_of(key, shards) < shards


def test_shards_spread_evenly() -> None:
    counts = [0] * 16
    for i in range(4_000):
        counts[shard_of(f"key-{i}", 16)] += 1
    assert min(counts) > 150 and max(counts) < 350  # 250 expected per shard
