"""Contacts at rest: phone numbers, email addresses and device tokens are stored encrypted, and
found again by a keyed hash without decrypting anything.

Encryption is Fernet (AES-128-CBC with HMAC-SHA256, a random IV per value) through
``MultiFernet``: a value is encrypted with the newest key and decrypts with any configured key.
The lookup hash is HMAC-SHA256 over the channel and the normalized address (an email address in
lower case), so "which user has +8801711000001" is one indexed query; without the lookup key the
hash reveals nothing, and unlike a plain hash it cannot be reversed by hashing every phone number.

Keys are secrets (pydantic's ``SecretStr``, as the settings hold them, or anything with
``get_secret_value()``), never in a repr, a log or an error message. Each is 32 random bytes in
url-safe base64, as ``generate_key()`` makes them.

Rotating the encryption key:

1. Generate a key and put it FIRST in ``encryption_keys``, the old keys after it; restart the
   writers. New and changed contacts are encrypted with the new key, the old ones still decrypt.
2. Re-encrypt what is stored: every value for which ``is_current`` is false goes through
   ``rotate`` (decrypt with whichever key fits, encrypt with the newest). Interrupted, the pass
   can simply run again.
3. When no stored value needs an old key any more, remove it from ``encryption_keys``. A value
   that still needed it can no longer be read (``ContactDecryptError``), so remove it only after
   step 2 completed.

Rotating the lookup key works the same way with ``lookup_keys`` (newest first): lookups try the
hashes under every configured key (``lookup_hashes``), while a pass recomputes every stored hash
with the newest one (``lookup_hash``) from the decrypted address; then the old key goes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from operators.errors import ConfigError
from operators.records import Channel
from senders.profiles.model import ProfileError, normalize_address


class SecretValue(Protocol):
    """A secret string: pydantic's ``SecretStr`` and the like."""

    def get_secret_value(self) -> str: ...


class ContactDecryptError(ProfileError):
    """A stored contact does not decrypt with any configured key (or was tampered with)."""

    def __init__(self) -> None:
        super().__init__(["a stored contact cannot be decrypted with any configured key"])


@dataclass(frozen=True)
class ContactKeyOptions:
    """Keys of the contacts at rest (both secrets; neither has a default).

    :param encryption_keys: Fernet keys separated by commas, the newest first: values are
        encrypted with the first and decrypt with any (see the rotation steps above)
    :param lookup_keys: keys of the lookup hash separated by commas, the newest first
    """

    encryption_keys: SecretValue | None = field(default=None, repr=False)
    lookup_keys: SecretValue | None = field(default=None, repr=False)


def generate_key() -> str:
    """A fresh key, for either list."""
    return Fernet.generate_key().decode("ascii")


def _split(secret: SecretValue | None, what: str) -> list[str]:
    keys = [k.strip() for k in secret.get_secret_value().split(",")] if secret is not None else []
    keys = [k for k in keys if k]
    if not keys:
        raise ConfigError(f"no {what} configured for the contacts at rest")
    return keys


def _key_bytes(key: str, what: str, n: int) -> bytes:
    try:
        raw = base64.urlsafe_b64decode(key.encode("ascii"))
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raw = b""
    if len(raw) != 32:
        raise ConfigError(f"{what} {n} is not 32 url-safe base64-encoded bytes (see generate_key)")
    return raw


class ContactCipher:
    """Encrypts, decrypts, re-encrypts and hashes contact addresses."""

    def __init__(self, encryption_keys: Sequence[str], lookup_keys: Sequence[str]) -> None:
        if not encryption_keys or not lookup_keys:
            raise ConfigError("the contacts at rest need at least one encryption key and one lookup key")
        for n, key in enumerate(encryption_keys, 1):
            _key_bytes(key, "encryption key", n)
        self._fernets = [Fernet(key) for key in encryption_keys]
        self._multi = MultiFernet(self._fernets)
        self._lookup = [_key_bytes(key, "lookup key", n) for n, key in enumerate(lookup_keys, 1)]

    @classmethod
    def from_options(cls, options: ContactKeyOptions) -> ContactCipher:
        return cls(_split(options.encryption_keys, "encryption keys"), _split(options.lookup_keys, "lookup keys"))

    def __repr__(self) -> str:
        return f"ContactCipher({len(self._fernets)} encryption key(s), {len(self._lookup)} lookup key(s))"

    def encrypt(self, address: str) -> str:
        """The address encrypted with the newest key, as ASCII text."""
        return self._multi.encrypt(address.encode("utf-8")).decode("ascii")

    def decrypt(self, token: str) -> str:
        """The address; raises ContactDecryptError when no configured key opens it."""
        try:
            return self._multi.decrypt(token.encode("ascii")).decode("utf-8")
        except (InvalidToken, UnicodeError):
            raise ContactDecryptError() from None

    def is_current(self, token: str) -> bool:
        """Whether the value is encrypted with the newest key (nothing to rotate)."""
        try:
            self._fernets[0].decrypt(token.encode("ascii"))
        except (InvalidToken, UnicodeError):
            return False
        return True

    def rotate(self, token: str) -> str:
        """The same address re-encrypted with the newest key; raises ContactDecryptError."""
        try:
            return self._multi.rotate(token.encode("ascii")).decode("ascii")
        except (InvalidToken, UnicodeError):
            raise ContactDecryptError() from None

    def lookup_hash(self, channel: Channel, address: str) -> str:
        """The keyed hash (hex) an address is found by, under the newest lookup key."""
        return self._hash(self._lookup[0], channel, address)

    def lookup_hashes(self, channel: Channel, address: str) -> tuple[str, ...]:
        """The hashes under every lookup key, newest first: what to query while one is rotated."""
        return tuple(self._hash(key, channel, address) for key in self._lookup)

    @staticmethod
    def _hash(key: bytes, channel: Channel, address: str) -> str:
        canonical = normalize_address(channel, address)
        if channel is Channel.EMAIL:
            canonical = canonical.lower()
        message = f"{channel.value}\x00{canonical}".encode()
        return hmac.new(key, message, hashlib.sha256).hexdigest()
