"""The ``[topics]`` section: topic names by contract role (``push = "..."``), validated against
schemas/contract.json and seen by callers as an ``operators.contract.Topics``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

from pydantic import PlainSerializer, PlainValidator
from pydantic_core import PydanticCustomError

from operators.contract import Topics
from settings.base import UNKNOWN_SETTING


def topic_roles() -> tuple[str, ...]:
    """The roles a ``[topics]`` section may name: the contract's."""
    return tuple(Topics().by_role())


def _as_topics(value: object) -> Topics:
    if isinstance(value, Topics):
        return value
    if not isinstance(value, Mapping):
        raise PydanticCustomError("topics_type", "must map topic roles to topic names")
    unknown = sorted(str(k) for k in set(value) - set(topic_roles()))
    if unknown:
        raise PydanticCustomError(UNKNOWN_SETTING, "unknown setting(s): {names}", {"names": ", ".join(unknown)})
    for role, name in value.items():
        if not isinstance(name, str) or not name:
            raise PydanticCustomError("topic_name", "{role} must be a non-empty topic name", {"role": role})
    return Topics(dict(value))


def _names(topics: Topics) -> dict[str, str]:
    return topics.by_role()


#: the section's type: a mapping role -> name in, a Topics out (a mapping again when dumped)
TopicNames = Annotated[
    Topics, PlainValidator(_as_topics), PlainSerializer(_names, return_type=dict[str, str])
]
