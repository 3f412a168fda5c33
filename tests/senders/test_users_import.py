"""``dedupctl users import`` on SQLite and a real PostgreSQL: good lines stored, every bad line
reported by its number (never its content) without stopping, a re-import replaces, progress on
stderr, and the exit status a script can act on."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from dedupctl.cli import main as dedupctl
from operators.records import Channel
from senders.profiles.crypto import ContactCipher, generate_key
from senders.profiles.model import parse_profile
from senders.store.profiles import ProfileStore
from senders.store.status import open_store

KEYS = (generate_key(), generate_key())


def _config(tmp_path: Path, location: str) -> list[str]:
    config = tmp_path / "c.toml"
    config.write_text(
        f'data_dir = "{tmp_path}"\n[senders]\nstatus_store = "{location}"\ncontact_encryption_keys = "{KEYS[0]}"\n'
        f'contact_lookup_keys = "{KEYS[1]}"\n'
    )
    return ["--config", str(config), "users", "import"]


def _profiles(location: str) -> ProfileStore:
    return ProfileStore(open_store(location, synchronous="NORMAL").db, ContactCipher([KEYS[0]], [KEYS[1]]))


def _user(i: int, **extra: object) -> str:
    return json.dumps({"user_id": f"u-{i}", "contacts": {"sms": [f"+1555000{i:04d}"], "email": [f"u{i}@example.com"]},
                       **extra})


def test_import_reports_bad_lines_by_number_and_stores_the_rest(
    store_location: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = [
        _user(1, locale="bn"),
        '{"user_id": "u-2", "contacts": {"sms": ["+1555',  # 2: not JSON
        "",  # 3: blank, skipped
        '["+15550009999"]',  # 4: not an object
        json.dumps({"contacts": {"sms": ["+15550008888"]}}),  # 5: no user_id
        json.dumps({"user_id": "u-6", "tz": "Mars/Base", "contacts": {"sms": ["0171 555"]}}),  # 6: bad profile
        json.dumps({"user_id": "u" * 600, "contacts": {}}),  # 7: user id too long
        '{"user_id": "u-8", "x": "' + "a" * 70_000 + '"}',  # 8: line too long
        _user(9),
    ]
    source = tmp_path / "users.jsonl"
    source.write_text("\n".join(lines) + "\n")
    assert dedupctl([*_config(tmp_path, store_location), str(source), "--batch-size", "2"]) == 1
    out, err = capsys.readouterr()
    assert "imported 2 profile(s) from " in out and "6 bad line(s) (9 lines in" in out
    problems = [line.split(": ", 1)[1] for line in err.splitlines() if line.startswith(f"{source}:")]
    numbers = [int(line.split(":")[1]) for line in err.splitlines() if line.startswith(f"{source}:")]
    assert numbers == [2, 4, 5, 6, 7, 8]
    assert problems[0].startswith("not JSON: ") and problems[1] == "not a JSON object"
    assert problems[2] == "no user_id" and problems[3].startswith("invalid profile: tz: a time zone is UTC or an IANA")
    assert "contacts.sms[0].address" in problems[3]
    assert problems[4] == "user_id: a user id has at most 512 UTF-8 bytes (dedup.max_field_bytes); this one has 600"
    assert problems[5].startswith("too long: 70028 bytes")
    for secret in ("+1555", "0171", "9999", "8888", "uuuu", "aaaa"):  # contacts are personal data
        assert secret not in err
    profiles = _profiles(store_location)
    assert profiles.get("u-1") == parse_profile(
        {"locale": "bn", "contacts": {"sms": ["+15550000001"], "email": ["u1@example.com"]}})
    assert profiles.get("u-9") is not None
    assert [profiles.get(u) for u in ("u-2", "u-6", "u-8")] == [None, None, None]


def test_a_reimport_replaces_and_progress_goes_to_stderr(
    store_location: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    command = _config(tmp_path, store_location)
    first = tmp_path / "first.jsonl"
    first.write_text("\n".join(_user(i) for i in range(1, 8)) + "\n")
    assert dedupctl([*command, str(first), "--progress-every", "3", "--batch-size", "2"]) == 0
    out, err = capsys.readouterr()
    assert "imported 7 profile(s)" in out and "0 bad line(s)" in out
    progress = [line for line in err.splitlines() if line.startswith("dedupctl users import: ")]
    assert [p.split(": ", 1)[1].split(",")[0] for p in progress] == [
        "3 lines read: 3 imported", "6 lines read: 6 imported"]
    assert all(p.endswith(" lines/s") for p in progress)
    # the same users again from stdin, with other contacts: each line replaces its user's profile
    again = "\n".join(json.dumps({"user_id": f"u-{i}", "contacts": {"push": [f"tok-{i}"]}}) for i in (1, 2))
    monkeypatch.setattr(sys, "stdin", SimpleNamespace(buffer=io.BytesIO(again.encode())))
    assert dedupctl([*command, "-"]) == 0
    assert "imported 2 profile(s) from stdin" in capsys.readouterr().out
    profiles = _profiles(store_location)
    assert profiles.get("u-1") == parse_profile({"contacts": {"push": ["tok-1"]}})
    assert profiles.users_with(Channel.SMS, "+15550000001") == []  # the old contacts are gone
    assert profiles.users_with(Channel.SMS, "+15550000003") == ["u-3"]  # the others untouched


def test_an_unreadable_file_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert dedupctl([*_config(tmp_path, str(tmp_path / "s.sqlite3")), str(tmp_path / "missing.jsonl")]) == 2
    assert "cannot read" in capsys.readouterr().err
