"""Avro (schemaless binary) codecs for every topic, with the schemas read from ``schemas/``.

The job itself never decodes or encodes in Python (the JVM parses each request once and writes
every output record); these codecs serve the tools, the senders, the harness and the tests.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Mapping
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
    """The record's bytes, as fastavro writes them. A writer generated from the schema
    (``writer``, ~3x faster: the senders write two status records a message) writes every record
    that fits the schema plainly; anything else (a value of another type, a missing field, a
    number out of range) goes to fastavro, which writes it or raises its own error."""
    try:
        return _writer(stem)(record)
    except Exception:  # noqa: BLE001 - fastavro decides, and explains
        buf = io.BytesIO()
        schemaless_writer(buf, load_schema(stem), dict(record))
        return buf.getvalue()


@cache
def _writer(stem: str) -> Write:
    try:
        return writer(_expanded(stem))
    except NotImplementedError as exc:  # a type the generator does not write: fastavro writes it all
        reason = str(exc)

        def unsupported(record: Mapping[str, Any]) -> bytes:
            raise NotImplementedError(reason)

        return unsupported


#: a record's bytes; raises on a value that does not plainly fit the schema
Write = Callable[[Mapping[str, Any]], bytes]
_INT_RANGE = (-(1 << 31), 1 << 31)
_LONG_RANGE = (-(1 << 63), 1 << 63)


def writer(schema: Any) -> Write:
    """A function writing records of ``schema`` (expanded: no references) as fastavro does:
    fields in order, a missing one as its default, zig-zag varints, strings as UTF-8, an array or
    a map as one block then 0, a union's branch by the value's type (None: null). Generated once
    per schema as straight-line Python, as ``skipper`` is. It raises (TypeError, KeyError,
    ValueError, OverflowError) on what it does not write plainly; ``encode`` hands that to
    fastavro."""
    namespace: dict[str, Any] = {"_varint": _varint, "_blob": _blob, "_ranges": (_INT_RANGE, _LONG_RANGE)}
    lines = ["    out = bytearray()", "    a, w = out.append, out.extend"]
    _emit_write(schema, "r", lines, "    ", namespace)
    source = "def write(r):\n" + "\n".join(lines) + "\n    return bytes(out)\n"
    exec(compile(source, f"<avro write {_schema_name(schema)}>", "exec"), namespace)  # noqa: S102 - our schema
    return namespace["write"]  # type: ignore[no-any-return]


def _varint(n: int) -> bytes:
    """The zig-zag varint of a long (range checked by the caller)."""
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _blob(data: bytes) -> bytes:
    return _varint(len(data)) + data


def _emit_write(schema: Any, value: str, out: list[str], pad: str, namespace: dict[str, Any]) -> None:
    """Append the lines that write the value held in the variable ``value``."""
    kind, schema = _kind(schema)
    depth = len(namespace)
    if kind == "record":
        for f in schema["fields"]:
            field = f"v{depth}_{len(out)}"
            if "default" in f:
                default = f"_default{len(namespace)}"
                namespace[default] = f["default"]
                out.append(f"{pad}{field} = {value}.get({f['name']!r}, {default})")
            else:
                out.append(f"{pad}{field} = {value}[{f['name']!r}]")
            _emit_write(f["type"], field, out, pad, namespace)
    elif kind in ("string", "bytes"):
        if kind == "string":
            out.append(f"{pad}if not isinstance({value}, str): raise TypeError('not a string')")
        else:
            out.append(f"{pad}if not isinstance({value}, bytes): raise TypeError('not bytes')")
        data = f"{value}.encode()" if kind == "string" else value
        out += [f"{pad}b = {data}", f"{pad}if len(b) < 64:", f"{pad}    a(len(b) << 1)", f"{pad}    w(b)",
                f"{pad}else:", f"{pad}    w(_blob(b))"]
    elif kind in ("int", "long"):
        low, high = _INT_RANGE if kind == "int" else _LONG_RANGE
        out += [
            f"{pad}if not {low} <= {value} < {high}: raise OverflowError('out of range')",
            f"{pad}if 0 <= {value} < 64:",
            f"{pad}    a({value} << 1)",
            f"{pad}else:",
            f"{pad}    w(_varint({value}))",
        ]
    elif kind == "enum":
        symbols = f"_symbols{len(namespace)}"
        namespace[symbols] = {symbol: bytes(_varint(i)) for i, symbol in enumerate(schema["symbols"])}
        out.append(f"{pad}w({symbols}[{value}])")
    elif kind == "union":
        branches = [_kind(branch)[0] for branch in schema]
        if len(schema) != 2 or branches[0] != "null" or branches[1] not in ("string", "int", "long"):
            raise NotImplementedError(f"union {branches}")  # none in schemas/: fastavro writes it
        check = "isinstance({v}, str)" if branches[1] == "string" else "type({v}) is int"
        out += [f"{pad}if {value} is None:", f"{pad}    a(0)", f"{pad}elif {check.format(v=value)}:", f"{pad}    a(2)"]
        _emit_write(schema[1], value, out, pad + "    ", namespace)
        out += [f"{pad}else:", f"{pad}    raise TypeError('no branch of the union')"]
    elif kind in ("array", "map"):
        item = f"i{depth}_{len(out)}"
        out += [f"{pad}if {value}:", f"{pad}    w(_varint(len({value})))"]
        if kind == "array":
            out.append(f"{pad}    for {item} in {value}:")
        else:
            key = f"k{depth}_{len(out)}"
            out.append(f"{pad}    for {key}, {item} in {value}.items():")
            _emit_write("string", key, out, pad + "        ", namespace)
        _emit_write(schema["items" if kind == "array" else "values"], item, out, pad + "        ", namespace)
        out.append(f"{pad}a(0)")
    elif kind == "null":
        out.append(f"{pad}if {value} is not None: raise TypeError('not null')")
    else:
        raise NotImplementedError(kind)  # fixed, float, double, boolean: none in schemas/


def decode(stem: str, raw: bytes) -> Any:
    """Decode a record; raises ValueError when bytes are missing or left over.

    A record that ends where its trailing optional fields (``["null", ...]``, default null) begin
    was written before they were added (an old producer, a record from before an upgrade): they
    read as null, as the JVM's AvroReader reads them.
    """
    try:
        return _decode_as(stem, raw, load_schema(stem), _check(stem))
    except Exception:
        for writer, check in _older(stem):
            try:
                return _decode_as(stem, raw, writer, check, reader=load_schema(stem))
            except Exception:  # noqa: S112 - the next older form may fit; the first error is raised
                continue
        raise


def _decode_as(stem: str, raw: bytes, writer: Any, check: Skip, reader: Any = None) -> Any:
    buf = io.BytesIO(raw)
    record = schemaless_reader(buf, writer, reader)
    if buf.tell() != len(raw):
        raise ValueError(f"{len(raw) - buf.tell()} trailing bytes after the record")
    # Reject an enum or union index out of range, as the JVM's reader does: fastavro uses the
    # index as a Python list index, so a negative one (the byte 0x01 is -1) silently decodes as the
    # symbol or branch counted from the end.
    check(memoryview(raw), 0)
    return record


@cache
def _older(stem: str) -> tuple[tuple[Any, Skip], ...]:
    """The schema without its last 1, 2, ... trailing optional fields (writer form and checker)."""
    out = []
    full = _expanded(stem)
    fields = full["fields"]
    n = len(fields)
    while n > 0 and isinstance(fields[n - 1]["type"], list) and fields[n - 1]["type"][0] == "null":
        n -= 1
        older = {**full, "fields": fields[:n]}
        out.append((parse_schema(older, _write_hint=False), skipper(older)))
    return tuple(out)


@cache
def _expanded(stem: str) -> Any:
    """The schema with every named type written out in place (no references left)."""
    return _parse(str(SCHEMAS_DIR), stem, expand=True)


@cache
def _check(stem: str) -> Skip:
    return skipper(_expanded(stem))


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


#: the position after one value at a position of a record's bytes (already decoded once)
Skip = Callable[[memoryview, int], int]
_FIXED_SIZES = {"null": 0, "boolean": 1, "float": 4, "double": 8}
_COMPLEX = frozenset(("record", "enum", "array", "map", "fixed"))


def skipper(schema: Any) -> Skip:
    """A function that skips one value of ``schema`` (an expanded schema: no references),
    checking every enum and union index as the JVM's reader does.

    Generated once per schema as straight-line Python (as ``dataclasses`` writes its methods): a
    record's fields, its unions' branches and its one-byte varints (most sizes and indexes) are
    inline, so checking a record costs a few operations a field; longer varints, arrays and maps
    go through ``read_long`` and the helpers below.
    """
    namespace: dict[str, Any] = {"read_long": read_long, "_index": _index}
    lines: list[str] = []
    _emit(schema, lines, "    ", namespace)
    source = "def check(raw, p):\n" + "\n".join(lines) + "\n    return p\n"
    exec(compile(source, f"<avro check {_schema_name(schema)}>", "exec"), namespace)  # noqa: S102 - our schema
    return namespace["check"]  # type: ignore[no-any-return]


def _schema_name(schema: Any) -> str:
    return str(schema.get("name", "")) if isinstance(schema, dict) else str(schema)


def _kind(schema: Any) -> tuple[str, Any]:
    """The schema's kind, with ``{"type": "long", "logicalType": ...}`` and ``{"type": {...}}``
    unwrapped."""
    while isinstance(schema, dict) and (not isinstance(schema["type"], str) or schema["type"] not in _COMPLEX):
        schema = schema["type"]
    if isinstance(schema, list):
        return "union", schema
    return (schema if isinstance(schema, str) else schema["type"]), schema


def _emit(schema: Any, out: list[str], pad: str, namespace: dict[str, Any]) -> None:
    """Append the lines that move ``p`` past one value of ``schema``."""
    kind, schema = _kind(schema)
    if kind == "record":
        for f in schema["fields"]:
            _emit(f["type"], out, pad, namespace)
    elif kind in ("string", "bytes"):
        out += [
            f"{pad}b = raw[p]",
            f"{pad}if b < 128:",
            f"{pad}    p += 1 + ((b >> 1) ^ -(b & 1))",
            f"{pad}else:",
            f"{pad}    n, p = read_long(raw, p)",
            f"{pad}    p += n",
        ]
    elif kind in ("int", "long"):
        out += [f"{pad}if raw[p] < 128:", f"{pad}    p += 1", f"{pad}else:", f"{pad}    p = read_long(raw, p)[1]"]
    elif kind == "enum":
        size, what = len(schema["symbols"]), f"enum {schema['name']}"
        out += [
            f"{pad}b = raw[p]",
            f"{pad}if b < {2 * size} and not b & 1:",
            f"{pad}    p += 1",
            f"{pad}else:",
            f"{pad}    p = _index(raw, p, {size}, {what!r})[1]",
        ]
    elif kind == "union":
        out.append(f"{pad}b = raw[p]")
        for i, branch in enumerate(schema):
            out.append(f"{pad}{'if' if i == 0 else 'elif'} b == {2 * i}:")
            out.append(f"{pad}    p += 1")
            _emit(branch, out, pad + "    ", namespace)
        fallback = f"_union{len(namespace)}"
        namespace[fallback] = tuple(skipper(branch) for branch in schema)
        out += [
            f"{pad}else:",
            f"{pad}    i, p = _index(raw, p, {len(schema)}, 'union')",
            f"{pad}    p = {fallback}[i](raw, p)",
        ]
    elif kind in ("array", "map"):
        helper = f"_blocks{len(namespace)}"
        namespace[helper] = _blocks(skipper(schema["items" if kind == "array" else "values"]), kind == "map")
        out.append(f"{pad}p = {helper}(raw, p)")
    elif kind == "fixed":
        out.append(f"{pad}p += {int(schema['size'])}")
    else:
        out.append(f"{pad}p += {_FIXED_SIZES[kind]}")


def _blocks(item: Skip, keyed: bool) -> Skip:
    """Skip an array's or a map's blocks (a map's keys are strings)."""

    def blocks(raw: memoryview, pos: int) -> int:
        count, pos = read_long(raw, pos)
        while count:
            if count < 0:
                count = -count
                pos = read_long(raw, pos)[1]  # the block's size in bytes
            for _ in range(count):
                if keyed:
                    size, pos = read_long(raw, pos)
                    pos += size
                pos = item(raw, pos)
            count, pos = read_long(raw, pos)
        return pos

    return blocks


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
