"""Contacts at rest: encryption with rotation, the lookup hash, the stored rows."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import os
from concurrent.futures import ThreadPoolExecutor

import pytest
from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import padding
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from pydantic import SecretStr

from operators.errors import ConfigError
from operators.records import Channel
from senders.profiles.crypto import ContactCipher, ContactDecryptError, ContactKeyOptions, generate_key
from senders.profiles.model import parse_profile
from senders.profiles.sealed import open_contacts, open_profile, preferences_document, seal_contacts

OLD, NEW, LOOKUP, LOOKUP_NEW = (Fernet.generate_key().decode() for _ in range(4))


def test_encrypt_with_the_newest_decrypt_with_any() -> None:
    old = ContactCipher([OLD], [LOOKUP])
    stored = old.encrypt("+8801711000001")
    assert "+8801711000001" not in stored and "8801711000001" not in stored
    both = ContactCipher([NEW, OLD], [LOOKUP])
    assert both.decrypt(stored) == "+8801711000001"
    assert not both.is_current(stored)
    rotated = both.rotate(stored)
    assert both.is_current(rotated) and both.decrypt(rotated) == "+8801711000001"
    assert ContactCipher([NEW], [LOOKUP]).decrypt(rotated) == "+8801711000001"
    with pytest.raises(ContactDecryptError) as info:
        ContactCipher([NEW], [LOOKUP]).decrypt(stored)
    assert str(info.value) == "invalid profile: a stored contact cannot be decrypted with any configured key"


def test_tampered_or_garbage_values_do_not_decrypt() -> None:
    cipher = ContactCipher([NEW], [LOOKUP])
    token = cipher.encrypt("a@example.com")
    with pytest.raises(ContactDecryptError):
        cipher.decrypt(token[:-4] + ("AAAA" if token[-4:] != "AAAA" else "BBBB"))
    for garbage in ("", "not a token", "é"):
        with pytest.raises(ContactDecryptError):
            cipher.rotate(garbage)
        assert not cipher.is_current(garbage)



def _signed(key: str, version: int, iv: bytes, ciphertext: bytes) -> str:
    """A token with a valid HMAC under ``key`` around any bytes (what only the key's holder makes)."""
    raw = base64.urlsafe_b64decode(key)
    body = bytes([version]) + (1).to_bytes(8, "big") + iv + ciphertext
    return base64.urlsafe_b64encode(body + hmac.digest(raw[:16], body, hashlib.sha256)).decode()


def _cbc(key: str, iv: bytes, plain: bytes) -> bytes:
    encryptor = Cipher(algorithms.AES(base64.urlsafe_b64decode(key)[16:]), modes.CBC(iv)).encryptor()
    return encryptor.update(plain) + encryptor.finalize()


def _fernet(keys: list[str], token: str) -> str | None:
    try:
        return MultiFernet([Fernet(k) for k in keys]).decrypt(token.encode("ascii")).decode("utf-8")
    except (InvalidToken, UnicodeError):
        return None


def _ours(cipher: ContactCipher, token: str) -> str | None:
    try:
        return cipher.decrypt(token)
    except ContactDecryptError:
        return None


def test_decryption_agrees_with_fernet_on_every_token() -> None:
    """``decrypt`` opens a token exactly when ``cryptography``'s Fernet does, to the same text:
    every length of address, either key, each byte of a token flipped, valid HMACs around a bad
    version, a ciphertext of no or part of a block, bad padding, bytes that are not UTF-8."""
    both = ContactCipher([NEW, OLD], [LOOKUP])
    keys = [NEW, OLD]
    tokens = [Fernet(k).encrypt(("é" * n + "a" * (n % 7)).encode()).decode() for k in keys for n in range(0, 40, 3)]
    token = tokens[3]
    raw = bytearray(base64.urlsafe_b64decode(token))
    for i in range(len(raw)):
        flipped = bytearray(raw)
        flipped[i] ^= 0x01
        tokens.append(base64.urlsafe_b64encode(bytes(flipped)).decode())
    tokens.append(base64.urlsafe_b64encode(bytes(raw[:-1])).decode())
    signed_at = len(tokens)
    iv = os.urandom(16)
    pad = padding.PKCS7(128).padder()
    good = pad.update(b"a@example.com") + pad.finalize()
    tokens += [
        _signed(NEW, 0x80, iv, _cbc(NEW, iv, good)),  # as Fernet makes them
        _signed(NEW, 0x81, iv, _cbc(NEW, iv, good)),  # another version
        _signed(NEW, 0x80, iv, b""),  # no ciphertext
        _signed(NEW, 0x80, iv, _cbc(NEW, iv, good)[:-1]),  # part of a block
        _signed(NEW, 0x80, iv, _cbc(NEW, iv, b"a" * 16)),  # padding byte 0x61
        _signed(NEW, 0x80, iv, _cbc(NEW, iv, b"a" * 15 + b"\x00")),  # padding byte 0
        _signed(NEW, 0x80, iv, _cbc(NEW, iv, b"a" * 14 + b"\x01\x02")),  # 2, but 1 before it
        _signed(OLD, 0x80, iv, _cbc(OLD, iv, b"\xff" * 15 + b"\x01")),  # not UTF-8
        _signed(OLD, 0x80, iv, _cbc(OLD, iv, b"\x10" * 16)),  # a whole block of padding: empty
        "", "not a token", "é", token + "=", token.replace("-", "+"),
    ]
    results = [(_ours(both, t), _fernet(keys, t)) for t in tokens]
    assert all(ours == theirs for ours, theirs in results), [t for t, r in zip(tokens, results, strict=True) if r[0] != r[1]]
    opened = [i for i, (ours, _) in enumerate(results) if ours is not None]
    # the encrypted ones, the one made as Fernet does, the empty one; and a token spelt two more
    # ways where the Fernet installed takes them (cryptography 51 refuses both: an extra "=",
    # "+" for "-"; earlier versions took them)
    spelt = [i for i in (len(tokens) - 2, len(tokens) - 1) if _fernet(keys, tokens[i]) is not None]
    assert opened == [*range(28), signed_at, signed_at + 8, *spelt]
    assert _ours(ContactCipher([NEW], [LOOKUP]), tokens[0]) == "" and _ours(ContactCipher([OLD], [LOOKUP]), tokens[0]) is None



def test_decryption_from_many_threads_at_once() -> None:
    """The workers' store threads share one cipher."""
    cipher = ContactCipher([NEW], [LOOKUP])
    addresses = [f"user{n}@example.com" for n in range(300)]
    tokens = [cipher.encrypt(a) for a in addresses]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: [cipher.decrypt(t) for t in tokens], range(8)))
    assert results == [addresses] * 8


def test_the_lookup_hash_is_keyed_and_normalized() -> None:
    cipher = ContactCipher([NEW], [LOOKUP])
    h = cipher.lookup_hash(Channel.EMAIL, "Ann@Example.com")
    assert len(h) == 64 and h == cipher.lookup_hash(Channel.EMAIL, " ann@example.COM ")
    assert h != cipher.lookup_hash(Channel.SMS, "Ann@Example.com")
    assert h != ContactCipher([NEW], [LOOKUP_NEW]).lookup_hash(Channel.EMAIL, "ann@example.com")
    assert cipher.lookup_hash(Channel.SMS, "+8801711000001") != cipher.lookup_hash(Channel.SMS, "+8801711000002")
    rotating = ContactCipher([NEW], [LOOKUP_NEW, LOOKUP])
    assert rotating.lookup_hashes(Channel.EMAIL, "ann@example.com") == (
        ContactCipher([NEW], [LOOKUP_NEW]).lookup_hash(Channel.EMAIL, "ann@example.com"), h,
    )


def test_keys_come_from_secrets_and_never_show() -> None:
    opts = ContactKeyOptions(encryption_keys=SecretStr(f"{NEW}, {OLD}"), lookup_keys=SecretStr(LOOKUP))
    cipher = ContactCipher.from_options(opts)
    token = cipher.encrypt("x")
    assert ContactCipher([NEW], [LOOKUP]).decrypt(token) == "x"
    with pytest.raises(ContactDecryptError):
        ContactCipher([OLD], [LOOKUP]).decrypt(token)
    assert cipher.lookup_hash(Channel.SMS, "x") == ContactCipher([NEW], [LOOKUP]).lookup_hash(Channel.SMS, "x")
    for text in (repr(opts), str(opts), repr(cipher)):
        assert NEW not in text and OLD not in text and LOOKUP not in text
    assert repr(cipher) == "ContactCipher(2 encryption key(s), 1 lookup key(s))"


@pytest.mark.parametrize(("opts", "message"), [
    (ContactKeyOptions(), "no encryption keys configured for the contacts at rest"),
    (ContactKeyOptions(encryption_keys=SecretStr(" , ")), "no encryption keys configured for the contacts at rest"),
    (ContactKeyOptions(encryption_keys=SecretStr(NEW)), "no lookup keys configured for the contacts at rest"),
    (ContactKeyOptions(encryption_keys=SecretStr(f"{NEW},short"), lookup_keys=SecretStr(LOOKUP)),
     "encryption key 2 is not 32 url-safe base64-encoded bytes (see generate_key)"),
    (ContactKeyOptions(encryption_keys=SecretStr(NEW), lookup_keys=SecretStr("pässword")),
     "lookup key 1 is not 32 url-safe base64-encoded bytes (see generate_key)"),
])
def test_missing_or_malformed_keys(opts: ContactKeyOptions, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        ContactCipher.from_options(opts)
    assert str(info.value) == message
    assert "short" not in message and "pässword" not in str(info.value)


def test_generated_keys_are_usable() -> None:
    a, b = generate_key(), generate_key()
    assert a != b
    assert ContactCipher([a], [b]).decrypt(ContactCipher([a], [b]).encrypt("tok")) == "tok"


def test_contacts_sealed_as_rows_and_opened_again() -> None:
    cipher = ContactCipher([NEW], [LOOKUP])
    profile = parse_profile({
        "locale": "bn", "tz": "Asia/Dhaka",
        "contacts": {"push": [{"address": "tok-1", "platform": "android", "active": False}],
                     "sms": ["+8801711000001", "+8801711000002"], "email": [{"address": "a@example.com", "verified": False}]},
    })
    rows = seal_contacts(profile.contacts, cipher)
    assert [(r.channel, r.position, r.verified, r.active, r.platform) for r in rows] == [
        (Channel.PUSH, 0, True, False, "android"), (Channel.SMS, 0, True, True, None),
        (Channel.SMS, 1, True, True, None), (Channel.EMAIL, 0, False, True, None),
    ]
    assert rows[1].address_hash == cipher.lookup_hash(Channel.SMS, "+8801711000001")
    assert all("+880" not in r.address_enc and "+880" not in repr(r) for r in rows)
    prefs = preferences_document(profile)
    assert prefs == {"locale": "bn", "tz": "Asia/Dhaka", "quiet_hours": None,
                     "marketing": {"push": True, "sms": True, "email": True}}
    assert open_profile(prefs, reversed(rows), cipher) == profile
    assert open_contacts([], cipher) == parse_profile({}).contacts


def test_rotating_stored_rows_then_dropping_the_old_key() -> None:
    contacts = parse_profile({"contacts": {"sms": ["+8801711000001"], "email": ["a@example.com"]}}).contacts
    rows = seal_contacts(contacts, ContactCipher([OLD], [LOOKUP]))
    with pytest.raises(ContactDecryptError):
        open_contacts(rows, ContactCipher([NEW], [LOOKUP]))
    during = ContactCipher([NEW, OLD], [LOOKUP])
    assert [during.is_current(r.address_enc) for r in rows] == [False, False]
    rotated = [dataclasses.replace(r, address_enc=during.rotate(r.address_enc)) for r in rows]
    assert [during.is_current(r.address_enc) for r in rotated] == [True, True]
    assert open_contacts(rotated, ContactCipher([NEW], [LOOKUP])) == contacts
