"""Where a user is reached on a channel. Channel messages carry the user id, not the address."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from operators.errors import ConfigError
from operators.records import Channel


class AddressBook(Protocol):
    def lookup(self, user_id: str, channel: Channel) -> str | None:
        """The user's address on the channel, or None when there is none."""


class UserIdAddresses:
    """The user id is the address: for providers that resolve users themselves."""

    def lookup(self, user_id: str, channel: Channel) -> str | None:
        return user_id


class StaticAddresses:
    """A fixed map ``{user_id: {channel: address}}`` (the demo's, tests', or a JSON file)."""

    def __init__(self, entries: Mapping[str, Mapping[str, str]]) -> None:
        self._entries = {user: dict(by_channel) for user, by_channel in entries.items()}

    @classmethod
    def from_file(cls, path: str | Path) -> StaticAddresses:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read the address book {path}: {exc}") from None
        if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
            raise ConfigError(f"address book {path}: expected {{user_id: {{channel: address}}}}")
        return cls(data)

    def lookup(self, user_id: str, channel: Channel) -> str | None:
        return self._entries.get(user_id, {}).get(channel.value)


def address_book(path: str) -> AddressBook:
    return StaticAddresses.from_file(path) if path else UserIdAddresses()
