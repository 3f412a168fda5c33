"""Where a user is reached on a channel. Channel messages carry the user id, not the address."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from operators.errors import ConfigError
from operators.records import Channel


@dataclass(frozen=True, slots=True)
class Contact:
    """A user's address on a channel.

    :param address: the phone number, email address or device token
    :param registered_ms: when the user last registered this address (0: not known); an address
        deactivated before then is active again (the user says it works now)
    """

    address: str
    registered_ms: int = 0

    def __repr__(self) -> str:  # never the address
        return f"Contact(registered_ms={self.registered_ms})"


class AddressBook(Protocol):
    def lookup(self, user_id: str, channel: Channel) -> Contact | None:
        """The user's contact on the channel, or None when there is none."""


class UserIdAddresses:
    """The user id is the address: for providers that resolve users themselves."""

    def lookup(self, user_id: str, channel: Channel) -> Contact | None:
        return Contact(user_id)


def _contact(value: Any, where: str) -> Contact:
    if isinstance(value, str):
        return Contact(value)
    if isinstance(value, Mapping) and isinstance(value.get("address"), str):
        registered = value.get("registered_ms", 0)
        if not isinstance(registered, int):
            raise ConfigError(f"address book {where}: registered_ms must be an integer (ms since the epoch)")
        return Contact(value["address"], registered)
    raise ConfigError(f"address book {where}: expected an address or {{\"address\": ..., \"registered_ms\": ...}}")


class StaticAddresses:
    """A fixed map ``{user_id: {channel: address}}`` (the demo's, tests', or a JSON file); an
    address may also be ``{"address": ..., "registered_ms": ...}``."""

    def __init__(self, entries: Mapping[str, Mapping[str, Any]], where: str = "(in memory)") -> None:
        self._entries = {
            user: {channel: _contact(value, where) for channel, value in by_channel.items()}
            for user, by_channel in entries.items()
        }

    @classmethod
    def from_file(cls, path: str | Path) -> StaticAddresses:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read the address book {path}: {exc}") from None
        if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
            raise ConfigError(f"address book {path}: expected {{user_id: {{channel: address}}}}")
        return cls(data, str(path))

    def lookup(self, user_id: str, channel: Channel) -> Contact | None:
        return self._entries.get(user_id, {}).get(channel.value)


def address_book(path: str) -> AddressBook:
    return StaticAddresses.from_file(path) if path else UserIdAddresses()
