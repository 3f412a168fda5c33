"""``dedupctl users``: put, import (``users_import_cmd``), get and erase user profiles (contacts
encrypted at rest), re-encrypt them after a key rotation, and make a key.

``get`` prints the contacts: an operator asked for them. Nothing here logs them.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from operators.errors import ConfigError
from operators.records import Channel
from senders.profiles.crypto import generate_key
from senders.profiles.model import profile_document, profile_from_json
from senders.profiles.user_id import user_id_problem
from senders.runtime.pool import contact_cipher, open_profile_store, open_status_store
from settings import Settings


def _out(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _read(source: str) -> bytes:
    if source == "-":
        return sys.stdin.buffer.read()
    with open(source, "rb") as f:
        return f.read()


def _user_id(cfg: Settings, user_id: str) -> str:
    """The one user-id rule (the API's), with the job's field limit."""
    problem = user_id_problem(user_id, cfg.dedup.max_field_bytes)
    if problem:
        raise ConfigError(f"user id: {problem}")
    return user_id


def cmd_users_put(cfg: Settings, args: argparse.Namespace) -> int:
    _user_id(cfg, args.user_id)
    try:
        text = _read(args.file)
    except OSError as exc:
        sys.stderr.write(f"dedupctl users put: cannot read {args.file}: {exc.strerror}\n")
        return 2
    profile = profile_from_json(text)  # ProfileError: every problem by field, no value quoted
    store = open_status_store(cfg)
    try:
        open_profile_store(cfg, store).put(args.user_id, profile)
    finally:
        store.close()
    counts = ", ".join(f"{c.value} {len(profile.contacts.of(c))}" for c in Channel)
    _out(f"user {args.user_id}: profile stored (contacts: {counts})")
    return 0


def cmd_users_get(cfg: Settings, args: argparse.Namespace) -> int:
    _user_id(cfg, args.user_id)
    store = open_status_store(cfg)
    try:
        profile = open_profile_store(cfg, store).get(args.user_id)
    finally:
        store.close()
    if profile is None:
        sys.stderr.write(f"dedupctl users get: no profile for user {args.user_id}\n")
        return 3
    _out(json.dumps(profile_document(profile), indent=2, ensure_ascii=False))
    return 0


def cmd_users_erase(cfg: Settings, args: argparse.Namespace) -> int:
    from api.database import open_api_store
    from api.erase import erase_user

    _user_id(cfg, args.user_id)
    db = open_api_store(cfg)  # the API's tables: erased too, whether or not an API ever ran here
    try:
        done = erase_user(db, contact_cipher(cfg), args.user_id)
    finally:
        db.close()
    _out(
        f"user {args.user_id}: {'profile' if done.profile else 'no profile'} erased, {done.contacts} contact(s),"
        f" {done.statuses} status row(s), {done.limit_counters} limit counter(s), {done.requests} API request(s),"
        f" {done.idempotency_keys} idempotency key(s), {done.verdicts} verdict(s), {done.receipts} receipt(s),"
        f" {done.campaign_entries} campaign entr{'y' if done.campaign_entries == 1 else 'ies'}"
    )
    return 0 if done.anything else 3


def cmd_users_reencrypt(cfg: Settings, args: argparse.Namespace) -> int:
    store = open_status_store(cfg)
    try:
        changed = open_profile_store(cfg, store).rotate()
    finally:
        store.close()
    _out(f"{changed} contact(s) re-encrypted and re-hashed with the newest keys")
    return 0


def cmd_users_keygen(cfg: Settings, args: argparse.Namespace) -> int:
    _out(generate_key())
    return 0


def register(subparsers: Any) -> None:
    """Add ``users`` to the ``dedupctl`` parser."""
    p = subparsers.add_parser("users", help="user profiles: preferences and contacts")
    sub = p.add_subparsers(dest="users_command", required=True)
    q = sub.add_parser("put", help="validate a profile document and replace the user's profile with it")
    q.add_argument("user_id")
    q.add_argument("file", help="the JSON document, or - for stdin")
    q.set_defaults(func=cmd_users_put)
    from dedupctl.users_import_cmd import register as register_import

    register_import(sub)
    q = sub.add_parser("get", help="print the user's profile (contacts included)")
    q.add_argument("user_id")
    q.set_defaults(func=cmd_users_get)
    q = sub.add_parser("erase", help="remove everything stored of the user (docs/api.md lists it)")
    q.add_argument("user_id")
    q.set_defaults(func=cmd_users_erase)
    q = sub.add_parser(
        "reencrypt", help="after a key rotation: re-encrypt and re-hash every contact with the newest keys"
    )
    q.set_defaults(func=cmd_users_reencrypt)
    q = sub.add_parser("keygen", help="print a new key for contact_encryption_keys or contact_lookup_keys")
    q.set_defaults(func=cmd_users_keygen)
