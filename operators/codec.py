"""Avro (schemaless binary) codecs for every topic, with the schemas read from ``schemas/``.

The job itself never decodes or encodes in Python (the JVM parses each request once and writes
every output record); these codecs serve the tools, the senders, the harness and the tests.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.schema import UnknownType

from operators.contract import SCHEMAS_DIR, contract
from operators.errors import InvalidRecordError
from operators.records import Category, Channel, NotificationRequest, Priority

#: schema file stem -> the record it holds, for every ``schemas/*.avsc``
SCHEMA_FILES = {
    p.stem: json.loads(p.read_text(encoding="utf-8"))["name"] for p in sorted(SCHEMAS_DIR.glob("*.avsc"))
}
_REQUEST = contract().request
#: the longest Avro long: 64 bits in 7-bit groups
MAX_VARINT_BYTES = 10


def stem_of(type_name: str) -> str:
    """NotificationRequest -> notification_request: a named type lives in its snake-case file."""
    simple = type_name.rsplit(".", 1)[-1]
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", simple).lower()


def _parse(schemas_dir: str, stem: str, expand: bool) -> Any:
    """Parse ``<stem>.avsc``, first parsing the file of every named type it refers to."""
    named: dict[str, Any] = {}
    pending = [stem]
    while True:
        try:
            return parse_schema(_read(schemas_dir, stem), named_schemas=named, expand=expand)
        except UnknownType as exc:
            dependency = stem_of(str(exc.name))
            if dependency in pending:
                raise
            pending.append(dependency)
            parse_schema(_read(schemas_dir, dependency), named_schemas=named)


@cache
def load_schema(stem: str, schemas_dir: str = str(SCHEMAS_DIR)) -> Any:
    """Parse ``schemas/<stem>.avsc`` (and the files of the named types it uses)."""
    return _parse(schemas_dir, stem, expand=False)


def field_names(stem: str) -> list[str]:
    """The fields of a record schema, in order."""
    return [f["name"] for f in _read(str(SCHEMAS_DIR), stem)["fields"]]


def _read(schemas_dir: str, stem: str) -> Any:
    return _plain_longs(json.loads((Path(schemas_dir) / f"{stem}.avsc").read_text(encoding="utf-8")))


def _plain_longs(node: Any) -> Any:
    """Drop ``timestamp-millis`` so times stay epoch-millisecond ints (the wire is the same long)."""
    if isinstance(node, dict):
        return {k: _plain_longs(v) for k, v in node.items() if k != "logicalType"}
    if isinstance(node, list):
        return [_plain_longs(v) for v in node]
    return node


def encode(stem: str, record: Mapping[str, Any]) -> bytes:
    buf = io.BytesIO()
    schemaless_writer(buf, load_schema(stem), dict(record))
    return buf.getvalue()


def decode(stem: str, raw: bytes) -> Any:
    """Decode a record; raises ValueError when bytes are missing or left over.

    A record that ends where its trailing optional fields (``["null", ...]``, default null) begin
    was written before they were added (an old producer, a record from before an upgrade): they
    read as null, as the JVM's AvroReader reads them.
    """
    try:
        return _decode_as(stem, raw, load_schema(stem), _expanded(stem))
    except Exception:
        for writer, expanded in _older(stem):
            try:
                return _decode_as(stem, raw, writer, expanded, reader=load_schema(stem))
            except Exception:  # noqa: S112 - the next older form may fit; the first error is raised
                continue
        raise


def _decode_as(stem: str, raw: bytes, writer: Any, expanded: Any, reader: Any = None) -> Any:
    buf = io.BytesIO(raw)
    record = schemaless_reader(buf, writer, reader)
    if buf.tell() != len(raw):
        raise ValueError(f"{len(raw) - buf.tell()} trailing bytes after the record")
    # Reject an enum or union index out of range, as the JVM's reader does: fastavro uses the
    # index as a Python list index, so a negative one (the byte 0x01 is -1) silently decodes as the
    # symbol or branch counted from the end.
    _skip(expanded, memoryview(raw), 0)
    return record


@cache
def _older(stem: str) -> tuple[tuple[Any, Any], ...]:
    """The schema without its last 1, 2, ... trailing optional fields (writer and expanded forms)."""
    out = []
    full = _expanded(stem)
    fields = full["fields"]
    n = len(fields)
    while n > 0 and isinstance(fields[n - 1]["type"], list) and fields[n - 1]["type"][0] == "null":
        n -= 1
        older = {**full, "fields": fields[:n]}
        out.append((parse_schema(older, _write_hint=False), older))
    return tuple(out)


@cache
def _expanded(stem: str) -> Any:
    """The schema with every named type written out in place (no references left)."""
    return _parse(str(SCHEMAS_DIR), stem, expand=True)


def read_long(raw: bytes | memoryview, pos: int) -> tuple[int, int]:
    """The Avro long (zig-zag varint) at ``pos``, and the position after it.

    At most ten bytes are read: a longer varint is rejected at once, so a crafted record cannot
    make decoding slower than linear (a Python int would otherwise grow with every byte).
    """
    value = shift = 0
    for _ in range(MAX_VARINT_BYTES):
        byte = raw[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (value >> 1) ^ -(value & 1), pos
        shift += 7
    raise ValueError(f"varint longer than {MAX_VARINT_BYTES} bytes at byte {pos}")


def _index(raw: memoryview, pos: int, size: int, what: str) -> tuple[int, int]:
    index, pos = read_long(raw, pos)
    if not 0 <= index < size:
        raise ValueError(f"{what} index {index} out of range [0, {size})")
    return index, pos


def _skip(schema: Any, raw: memoryview, pos: int) -> int:
    """Position after one value of ``schema`` at ``pos`` (the bytes already decoded once)."""
    if isinstance(schema, list):
        branch, pos = _index(raw, pos, len(schema), "union")
        return _skip(schema[branch], raw, pos)
    if isinstance(schema, str):
        kind = schema
    else:
        kind = schema["type"]
        if not isinstance(kind, str) or kind not in ("record", "enum", "array", "map", "fixed"):
            return _skip(kind, raw, pos)
    if kind == "record":
        for f in schema["fields"]:
            pos = _skip(f["type"], raw, pos)
        return pos
    if kind == "enum":
        return _index(raw, pos, len(schema["symbols"]), f"enum {schema['name']}")[1]
    if kind in ("array", "map"):
        count, pos = read_long(raw, pos)
        while count:
            if count < 0:
                count = -count
                pos = read_long(raw, pos)[1]  # the block's size in bytes
            for _ in range(count):
                if kind == "map":
                    pos = _skip("string", raw, pos)
                pos = _skip(schema["items" if kind == "array" else "values"], raw, pos)
            count, pos = read_long(raw, pos)
        return pos
    if kind == "fixed":
        return pos + schema["size"]
    if kind in ("string", "bytes"):
        size, pos = read_long(raw, pos)
        return pos + size
    if kind in ("int", "long"):
        return read_long(raw, pos)[1]
    return pos + {"null": 0, "boolean": 1, "float": 4, "double": 8}[kind]


def decode_request(raw: bytes) -> NotificationRequest:
    """Decode and validate one ``NotificationRequest``, or raise InvalidRecordError with the reason."""
    if not raw:
        raise InvalidRecordError("empty record")
    try:
        rec = decode("notification_request", raw)
    except Exception as exc:  # fastavro raises many types on garbage; all mean "undecodable"
        raise InvalidRecordError(f"undecodable NotificationRequest: {type(exc).__name__}: {exc}") from None
    return request_from_fields(rec)


def request_from_fields(rec: Mapping[str, Any]) -> NotificationRequest:
    """Validate decoded (or JSON) fields into a request; the rules are the data contract's."""
    for name in _REQUEST["required_text"]:
        value = rec.get(name)
        if not isinstance(value, str) or not value:
            raise InvalidRecordError(f"{name} is missing or empty")
    event_time = rec.get("event_time")
    if isinstance(event_time, bool) or not isinstance(event_time, int):
        raise InvalidRecordError("event_time is missing or not an integer (epoch milliseconds)")
    channels_raw = rec.get(_REQUEST["channels"])
    if not isinstance(channels_raw, (list, tuple)) or not channels_raw:
        raise InvalidRecordError(f"{_REQUEST['channels']} is missing or empty")
    try:
        channels = tuple(dict.fromkeys(Channel(c) for c in channels_raw))
        priority = Priority(rec.get("priority") or Priority.NORMAL)
        category = Category(rec.get("category") or Category.TRANSACTIONAL)
    except ValueError as exc:
        raise InvalidRecordError(f"unknown enum value: {exc}") from None
    params = rec.get("params") or {}
    if not isinstance(params, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in params.items()
    ):
        raise InvalidRecordError("params must map strings to strings")
    dedup_key = rec.get("dedup_key")
    if dedup_key is not None and not isinstance(dedup_key, str):
        raise InvalidRecordError("dedup_key must be a string or null")
    ttl = rec.get("dedup_ttl_sec")
    if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int)):
        raise InvalidRecordError("dedup_ttl_sec must be an integer or null")
    traceparent = rec.get("traceparent")
    if traceparent is not None and not isinstance(traceparent, str):
        raise InvalidRecordError("traceparent must be a string or null")
    return NotificationRequest(
        notification_id=rec["notification_id"],
        user_id=rec["user_id"],
        template_id=rec["template_id"],
        channels=channels,
        event_time=event_time,
        params=dict(params),
        priority=priority,
        category=category,
        dedup_key=dedup_key,
        dedup_ttl_sec=ttl,
        traceparent=traceparent,
    )


def encode_request(request: NotificationRequest) -> bytes:
    return encode("notification_request", request.to_avro())
