"""The bulk import's pure parts: lines read with a bound, every kind of bad line named by its
number without its content, progress, and the store loop (batches, a refused profile, a store
that stays away)."""

from __future__ import annotations

import io
import json
from collections.abc import Iterable

import pytest

from senders.errors import StoreUnavailableError
from senders.profiles.importer import (
    BadLine,
    GoodLine,
    ImportOptions,
    ImportStats,
    ImportStopped,
    RawLine,
    import_profiles,
    max_line_bytes,
    parse_line,
    read_lines,
)
from senders.profiles.model import MAX_DOCUMENT_BYTES, Profile, ProfileError, parse_profile
from senders.profiles.user_id import user_id_problem

PHONE = "+15550000042"


def _line(n: int, text: str | bytes) -> RawLine:
    data = text.encode() if isinstance(text, str) else text
    return RawLine(n, data, len(data))


def test_a_good_line_is_its_user_id_and_the_rest_as_the_profile() -> None:
    good = parse_line(_line(3, json.dumps({"user_id": "u-1", "tz": "Asia/Dhaka", "contacts": {"sms": [PHONE]}})), 512)
    assert good == GoodLine(3, "u-1", parse_profile({"tz": "Asia/Dhaka", "contacts": {"sms": [PHONE]}}))
    assert parse_line(_line(4, "   "), 512) is None  # blank: skipped, not bad


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"user_id": "u-1", "contacts": {"sms": ["+1555', "not JSON: Unterminated string starting at (column 41)"),
        (b'{"user_id": "\xff"}', "not JSON: not UTF-8 text"),
        (f'["{PHONE}"]', "not a JSON object"),
        (json.dumps({"contacts": {"sms": [PHONE]}}), "no user_id"),
        (json.dumps({"user_id": 7, "contacts": {}}), "user_id: must be a string"),
        (json.dumps({"user_id": "", "contacts": {}}), "user_id: a user id must not be empty"),
        (json.dumps({"user_id": "u\n1"}), "user_id: a user id must be printable text (no NUL or control characters)"),
        (json.dumps({"user_id": " u-1"}), "user_id: a user id has no surrounding spaces"),
        (json.dumps({"user_id": "ü" * 257}), "user_id: a user id has at most 512 UTF-8 bytes (dedup.max_field_bytes); this one has 514"),
        (
            json.dumps({"user_id": "u-1", "tz": "Mars/Base", "contacts": {"sms": ["0171"]}, "colour": "red"}),
            "invalid profile: tz: a time zone is UTC or an IANA Area/Location name such as Asia/Dhaka;"
            " contacts.sms[0].address: a phone number must be in E.164 form: + and 7 to 15 digits, no spaces;"
            " colour: Extra inputs are not permitted",
        ),
    ],
)
def test_every_kind_of_bad_line_is_named_by_its_number_and_the_problem(text: str | bytes, problem: str) -> None:
    bad = parse_line(_line(17, text), 512)
    assert bad == BadLine(17, problem)
    assert str(bad).startswith("line 17: ")
    for secret in ("0171", PHONE, "red", "Mars"):  # never the line's content
        assert secret not in bad.problem.replace("Mars/", "")


def test_a_line_past_the_limit_is_not_held_and_reading_goes_on_after_it() -> None:
    limit = max_line_bytes(512)
    assert limit > MAX_DOCUMENT_BYTES
    huge = b'{"user_id": "u-1", "x": "' + b"a" * (3 * limit) + b'"}'
    source = io.BytesIO(b'{"user_id": "u-0"}\n' + huge + b"\n\n" + b'{"user_id": "u-2"}\r\n{"user_id": "u-3"}')
    lines = list(read_lines(source, limit, chunk=1000))
    assert [(r.number, r.data) for r in lines] == [
        (1, b'{"user_id": "u-0"}'), (2, None), (3, b""), (4, b'{"user_id": "u-2"}'), (5, b'{"user_id": "u-3"}'),
    ]
    assert lines[1].size == len(huge) + 1
    assert parse_line(lines[1], 512) == BadLine(2, f"too long: {len(huge) + 1} bytes, more than {limit}")


def test_user_id_rule() -> None:
    assert user_id_problem("user-42", 512) is None
    assert user_id_problem("a" * 512, 512) is None
    assert user_id_problem("a" * 513, 512) is not None
    assert user_id_problem("tab\there", 512) is not None
    assert user_id_problem("a/b", 512) is not None


class FakeStore:
    """Records each put_many as a batch; refuses a user (as a store refuses a profile), or is
    unavailable for its first ``unavailable`` calls."""

    def __init__(self, refuse: str = "", unavailable: int = 0) -> None:
        self.batches: list[list[str]] = []
        self.profiles: dict[str, Profile] = {}
        self.refuse = refuse
        self.unavailable = unavailable

    def put_many(self, profiles: Iterable[tuple[str, Profile]]) -> None:
        items = list(profiles)
        if self.unavailable:
            self.unavailable -= 1
            raise StoreUnavailableError("store away")
        if any(user == self.refuse for user, _ in items):
            raise ProfileError(["user_id: refused"])
        self.batches.append([user for user, _ in items])
        self.profiles.update(items)


def _lines(users: Iterable[str | None]) -> list[RawLine]:
    return [_line(n, json.dumps({"user_id": u}) if u is not None else "nope") for n, u in enumerate(users, 1)]


def _run(lines: list[RawLine], store: FakeStore, **options: object) -> tuple[ImportStats, list[str], list[str]]:
    bad: list[str] = []
    progress: list[str] = []
    stats = import_profiles(
        lines, store, ImportOptions(**options),  # type: ignore[arg-type]
        on_bad=lambda b: bad.append(str(b)),
        on_progress=lambda s: progress.append(f"{s.read}/{s.imported}/{s.bad}"),
        sleep=lambda s: None,
    )
    return stats, bad, progress


def test_batches_progress_and_bad_lines_without_stopping() -> None:
    users = [f"u-{i}" if i % 4 else None for i in range(1, 11)]  # lines 4 and 8 are bad
    store = FakeStore()
    stats, bad, progress = _run(_lines(users), store, batch_size=3, progress_lines=5, progress_s=0)
    assert (stats.read, stats.imported, stats.bad) == (10, 8, 2)
    assert bad == ["line 4: not JSON: Expecting value (column 1)", "line 8: not JSON: Expecting value (column 1)"]
    assert store.batches == [["u-1", "u-2", "u-3"], ["u-5"], ["u-6", "u-7", "u-9"], ["u-10"]]
    # progress says what is stored: the batch in hand is written before it is reported
    assert progress == ["5/4/1", "10/8/2"]


def test_a_profile_the_store_refuses_is_a_bad_line_and_the_rest_of_its_batch_is_stored() -> None:
    store = FakeStore(refuse="u-2")
    stats, bad, _ = _run(_lines(["u-1", "u-2", "u-3"]), store, batch_size=10, progress_lines=0, progress_s=0)
    assert (stats.imported, stats.bad) == (2, 1)
    assert bad == ["line 2: refused by the store: user_id: refused"]
    assert set(store.profiles) == {"u-1", "u-3"}


def test_a_store_away_for_a_while_is_waited_for_and_one_that_stays_away_stops_the_import() -> None:
    store = FakeStore(unavailable=2)
    stats, _, _ = _run(_lines(["u-1", "u-2"]), store, batch_size=10, progress_lines=0, progress_s=0)
    assert stats.imported == 2 and store.batches == [["u-1", "u-2"]]
    lines = _lines(["u-1", "u-2", "u-3", "u-4"])
    store = FakeStore()
    original = store.put_many
    calls = {"n": 0}

    def second_batch_fails(profiles: Iterable[tuple[str, Profile]]) -> None:
        calls["n"] += 1
        if calls["n"] > 1:
            raise StoreUnavailableError("store away")
        original(profiles)

    store.put_many = second_batch_fails  # type: ignore[method-assign]
    with pytest.raises(ImportStopped, match="every line up to 2 was imported") as stopped:
        _run(lines, store, batch_size=2, progress_lines=0, progress_s=0, store_retries=2)
    assert stopped.value.through_line == 2 and calls["n"] == 4  # one call and two retries of the second batch
