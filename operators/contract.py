"""The data contract as Python reads it: ``schemas/contract.json`` beside the ``.avsc`` files.

The JVM operators read the same file (connector/.../contract/Contract.java, packaged into the
connector jar): the topics by role, the lanes, the outcomes of the dedup decision and the columns
that cross the JVM/Python boundary are stated there and nowhere else.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from operators.errors import ConfigError
from operators.records import Channel, Priority

SCHEMAS_DIR = Path(os.environ.get("DEDUP_SCHEMAS_DIR") or Path(__file__).resolve().parent.parent / "schemas")


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """One topic of the contract.

    :param role: the name code and settings use for it (``push``, ``duplicates``, ...)
    :param name: its default name (settings can rename it)
    :param schema: the stem of its ``.avsc`` file
    :param key: what its Kafka key is: a request field, ``dedup_key`` (the resolved key), or None
    :param outcome: the dedup outcome that writes it (None for the input)
    :param channel: for a channel topic, its channel
    :param lane: for a channel topic, its lane
    """

    role: str
    name: str
    schema: str
    key: str | None
    outcome: str | None
    channel: str | None
    lane: str | None


@dataclass(frozen=True, slots=True)
class Column:
    """One column of a mini-batch or of its verdicts (``boundary`` of the contract)."""

    name: str
    type: str
    nullable: bool


@dataclass(frozen=True)
class Contract:
    """The parsed ``contract.json``."""

    raw: Mapping[str, Any]
    topics: tuple[TopicSpec, ...]
    outcomes: tuple[str, ...]
    lanes: Mapping[str, tuple[str, ...]]
    batch_columns: tuple[Column, ...]
    verdict_columns: tuple[Column, ...]

    def topic(self, role: str) -> TopicSpec:
        for t in self.topics:
            if t.role == role:
                return t
        raise ConfigError(f"no topic role {role!r} in the contract")

    def outcome(self, name: str) -> int:
        """The code of an outcome (its position in the contract's list)."""
        return self.outcomes.index(name)

    def lane_of(self, priority: Priority) -> str:
        for lane, priorities in self.lanes.items():
            if priority.value in priorities:
                return lane
        raise ConfigError(f"priority {priority} has no lane in the contract")

    @property
    def request(self) -> Mapping[str, Any]:
        return dict(self.raw["request"])

    @property
    def dedup_key(self) -> Mapping[str, Any]:
        return dict(self.raw["dedup_key"])

    @property
    def message_key(self) -> Mapping[str, Any]:
        return dict(self.raw["message_key"])


@cache
def contract(schemas_dir: str = str(SCHEMAS_DIR)) -> Contract:
    raw = json.loads((Path(schemas_dir) / "contract.json").read_text(encoding="utf-8"))
    topics = tuple(
        TopicSpec(
            role=t["role"], name=t["name"], schema=t["schema"], key=t.get("key"),
            outcome=t.get("outcome"), channel=t.get("channel"), lane=t.get("lane"),
        )
        for t in raw["topics"]
    )
    boundary = raw["boundary"]

    def columns(key: str) -> tuple[Column, ...]:
        return tuple(Column(c["name"], c["type"], bool(c.get("nullable", False))) for c in boundary[key])

    return Contract(
        raw=raw,
        topics=topics,
        outcomes=tuple(raw["outcomes"]),
        lanes={lane: tuple(p) for lane, p in raw["lanes"].items()},
        batch_columns=columns("batch"),
        verdict_columns=columns("verdicts"),
    )


class Topics:
    """Topic names by contract role; every name can be changed in the settings (``[topics]``).

    ``topics.push`` is the name of the topic of role ``push``; the roles are the contract's, so a
    role that is not there is an AttributeError.
    """

    __slots__ = ("_names",)

    def __init__(self, names: Mapping[str, str] | None = None, **overrides: str) -> None:
        specs = contract().topics
        merged = {t.role: t.name for t in specs}
        for role, name in {**(names or {}), **overrides}.items():
            if role not in merged:
                raise ConfigError(f"no topic role {role!r} in the contract; roles: {', '.join(merged)}")
            if not isinstance(name, str) or not name:
                raise ConfigError(f"topic {role} must be a non-empty name")
            merged[role] = name
        object.__setattr__(self, "_names", merged)

    def __getattr__(self, role: str) -> str:
        names = object.__getattribute__(self, "_names")
        try:
            return str(names[role])
        except KeyError:
            raise AttributeError(f"no topic role {role!r} in the contract") from None

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Topics is immutable")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Topics) and self.by_role() == other.by_role()

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.by_role().items())))

    def __repr__(self) -> str:
        return f"Topics({self.by_role()!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Topics, (self.by_role(),))

    def by_role(self) -> dict[str, str]:
        return dict(object.__getattribute__(self, "_names"))

    def __iter__(self) -> Iterator[str]:
        return iter(self.by_role().values())

    def with_prefix(self, prefix: str) -> Topics:
        return Topics({role: prefix + name for role, name in self.by_role().items()})

    def outputs(self) -> list[str]:
        """The job's output topics, in contract order."""
        return [self.by_role()[t.role] for t in contract().topics if t.outcome is not None]

    def all(self) -> list[str]:
        return list(self.by_role().values())

    def channel_topic(self, channel: Channel | str, priority: Priority | str) -> str:
        """The topic of a channel in the lane of a priority (high: the priority lane)."""
        return self.lane_topic(channel, contract().lane_of(Priority(priority)))

    def lane_topic(self, channel: Channel | str, lane: str) -> str:
        for t in contract().topics:
            if t.channel == str(channel) and t.lane == lane:
                return self.by_role()[t.role]
        raise ConfigError(f"no topic for {channel} on lane {lane}")

    def spec_of(self, topic: str) -> TopicSpec | None:
        """The contract entry of a topic name, or None for a topic outside the contract."""
        names = self.by_role()
        for t in contract().topics:
            if names[t.role] == topic:
                return t
        return None

    def schema_of(self, topic: str) -> str | None:
        spec = self.spec_of(topic)
        return spec.schema if spec is not None else None
