"""Callers, scopes and tokens without a running API: the store's functions, the cache, the
migration of the earlier table, and ``dedupctl api token create|list|revoke`` (issue 20: tokens
could not be listed, revoked or expired; names were not unique; a revoked token worked for 30 s;
unknown tokens were not cached)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from api.callers import Caller
from api.database import StoreAccess
from api.scopes import LEGACY_SCOPES, ROUTE_SCOPES, Scope, check_routes, markdown_table, route_of
from api.tables import SCHEMA, prepare, request_schema
from api.tokens import CallerExists, TokenCache, create_caller, list_tokens, lookup, revoke, rotate, token_id
from dedupctl.cli import main
from harness.settings_file import write_settings
from operators.records import Category
from senders.store.db import Database
from settings import REPO_ROOT, Settings
from tests.senders.conftest import store_location  # noqa: F401 - the fixture (SQLite and PostgreSQL)

SHOP = Caller("shop", frozenset({Scope.SEND, Scope.STATUS_READ}), frozenset({Category.TRANSACTIONAL}))


@pytest.fixture
def db(tmp_path: Path) -> Database:
    found = StoreAccess(str(tmp_path / "s.sqlite3")).open()
    prepare(found)
    return found


def test_a_caller_name_is_unique_and_rotation_issues_another_token(db: Database) -> None:
    first = create_caller(db, SHOP, 1_000)
    with pytest.raises(CallerExists, match="--rotate"):
        create_caller(db, SHOP, 2_000)
    second = rotate(db, "shop", 3_000)
    assert first != second
    assert [lookup(db, t, 4_000).caller for t in (first, second)] == [SHOP, SHOP]  # type: ignore[union-attr]
    assert [(t.caller, t.token_id, t.scopes, t.revoked) for t in list_tokens(db)] == [
        ("shop", token_id(first), "send,status:read", False), ("shop", token_id(second), "send,status:read", False)]


@pytest.mark.parametrize("name", ["Shop", "a/b", "ns:x", "", "-x", "x" * 65, "shop team"])
def test_caller_names_follow_the_rule(db: Database, name: str) -> None:
    with pytest.raises(ValueError, match=r"\[a-z0-9\]"):
        create_caller(db, Caller(name, frozenset({Scope.SEND})), 1)


def test_revoked_and_expired_tokens_are_refused(db: Database) -> None:
    token = create_caller(db, SHOP, 1_000, expires_ms=10_000)
    assert lookup(db, token, 9_999) is not None
    assert lookup(db, token, 10_000) is None  # expired
    other = rotate(db, "shop", 1_000)
    assert revoke(db, token_id=token_id(other)) == 1
    assert lookup(db, other, 2_000) is None
    third = rotate(db, "shop", 1_000)
    assert revoke(db, caller="shop") == 2  # the expired first and the third: those not revoked yet
    assert lookup(db, third, 2_000) is None
    assert revoke(db, token_id="ffffffffffff") == 0
    with pytest.raises(ValueError, match="hex prefix"):
        revoke(db, token_id="not-hex")


def test_the_cache_keeps_live_and_refused_tokens_and_checks_expiry_on_every_hit(db: Database) -> None:
    now, wall = [0.0], [5_000]
    cache = TokenCache(5.0, 1.0, clock=lambda: now[0], wall_ms=lambda: wall[0])
    token = create_caller(db, SHOP, 1_000, expires_ms=8_000)
    assert cache.get(token) is None  # ask the store
    cache.put(token, lookup(db, token, wall[0]))
    assert cache.get(token).caller == SHOP  # type: ignore[union-attr]
    wall[0] = 8_000  # expired while cached: refused at once, not after the cache's time
    assert cache.get(token) is TokenCache.REFUSED
    bad = "ndk_" + "x" * 43
    cache.put(bad, None)
    assert cache.get(bad) is TokenCache.REFUSED  # a failed lookup is kept: no store query for it
    now[0] = 1.0
    assert cache.get(bad) is None  # for negative_ttl_s only


def test_the_gate_reads_a_token_once_for_all_its_requests_and_again_ahead_of_its_expiry(db: Database) -> None:
    """Requests that find no cached token wait for one store read between them; past half its
    cache time a token is read again in the background while its requests go on at once; a token
    revoked meanwhile is refused once that read is back."""
    import asyncio
    from types import SimpleNamespace

    from api.gate import Gate

    now = [0.0]
    token = create_caller(db, SHOP, 1_000)
    reads: list[float] = []

    async def run(fn):  # type: ignore[no-untyped-def]
        reads.append(now[0])
        await asyncio.sleep(0.05)  # a store thread busy elsewhere
        return fn(db)

    services = SimpleNamespace(tokens=TokenCache(5.0, 1.0, clock=lambda: now[0]), pool=SimpleNamespace(run=run))
    gate = Gate(lambda scope, receive, send: None)  # type: ignore[arg-type, return-value]
    scope = {"headers": [(b"authorization", f"Bearer {token}".encode())]}

    async def scenario() -> None:
        found = await asyncio.gather(*(gate._caller(scope, services) for _ in range(50)))
        assert {f.caller.name for f in found} == {"shop"} and reads == [0.0]
        now[0] = 2.0  # within the first half: from the cache alone
        assert (await gate._caller(scope, services)).caller.name == "shop" and len(reads) == 1
        now[0] = 3.0  # past half: answered from the cache, read again meanwhile (once)
        revoke(db, caller="shop")
        for _ in range(5):
            assert (await gate._caller(scope, services)) is not None
            await asyncio.sleep(0)
        assert reads == [0.0, 3.0]
        await asyncio.sleep(0.1)
        assert await gate._caller(scope, services) is None  # the read is back: revoked

    asyncio.run(scenario())


def test_the_route_table_has_every_route_once_and_the_gate_finds_them() -> None:
    from api.app import create_app

    create_app()  # it checks its routes against the table (check_routes) or does not start
    with pytest.raises(AssertionError, match="no scope for"):
        check_routes([*ROUTE_SCOPES, ("GET", "/v1/unscoped")])
    assert route_of("GET", "/v1/notifications/shop/evt/with/slashes") == (
        "GET", "/v1/notifications/{notification_id:path}")
    assert route_of("GET", "/v1/users/u1") == ("GET", "/v1/users/{user_id}")
    assert route_of("DELETE", "/v1/users/u1") == ("DELETE", "/v1/users/{user_id}")
    assert route_of("GET", "/v1/users/u1/notifications") == ("GET", "/v1/users/{user_id}/notifications")
    assert route_of("PATCH", "/v1/users/u1") is None and route_of("GET", "/v1/nothing") is None


def test_docs_and_readme_show_the_route_scope_table() -> None:
    table = markdown_table()
    for doc in (REPO_ROOT / "docs" / "api.md", REPO_ROOT / "README.md"):
        assert table in doc.read_text(encoding="utf-8"), f"{doc.name}: run `dedupctl api scopes` and paste its table"


def test_an_earlier_token_table_is_migrated_in_place_with_send_and_status_read(store_location: str) -> None:  # noqa: F811
    """On SQLite and on PostgreSQL."""
    db = StoreAccess(store_location).open()
    legacy = [s.replace("api_token (\n        token_hash TEXT PRIMARY KEY,\n        caller TEXT NOT NULL,\n"
                        "        created_ms BIGINT NOT NULL,\n        expires_ms BIGINT,", "api_token (\n"
                        "        token_hash TEXT PRIMARY KEY, caller TEXT NOT NULL, categories TEXT NOT NULL,"
                        " templates TEXT NOT NULL, rate_per_sec DOUBLE PRECISION, created_ms BIGINT NOT NULL,")
              for s in SCHEMA if "api_caller" not in s]
    legacy += request_schema()  # then in the store's own file on SQLite too: moved to the requests file
    assert any("categories" in s for s in legacy)
    db.ensure_schema(legacy)
    from api.tokens import new_token, token_hash

    tokens = [new_token() for _ in range(4)]
    rows = [(tokens[0], "shop", "transactional", "", 5.0, 1, 0), (tokens[1], "shop", "marketing", "eid_sale", None, 2, 0),
            (tokens[2], "Growth Team", "marketing", "", None, 3, 1), (tokens[3], "growth-team", "transactional", "",
                                                                      None, 4, 0)]
    with db.tx() as cur:
        for t, caller, cats, tmpl, rate, at, revoked in rows:
            db.exec(cur, "INSERT INTO api_token (token_hash, caller, categories, templates, rate_per_sec, created_ms,"
                    " revoked) VALUES (?, ?, ?, ?, ?, ?, ?)", (token_hash(t), caller, cats, tmpl, rate, at, revoked))
        db.exec(cur, "INSERT INTO api_request (notification_id, dedup_key, user_id, template, channels, priority,"
                " caller, event_time_ms, accepted_ms, kafka_partition, kafka_offset) VALUES"
                " ('n1', 'k', 'u', 't', 'sms', 'normal', 'Growth Team', 1, 1, 0, 0)")
    assert prepare(db) == 3
    assert prepare(db) == 0  # once
    shop = lookup(db, tokens[0], 10)
    assert shop is not None and shop.caller == Caller("shop", LEGACY_SCOPES, frozenset({Category.MARKETING}),
                                                       frozenset({"eid_sale"}), None)  # its newest live token's
    assert lookup(db, tokens[1], 10) == shop
    assert lookup(db, tokens[2], 10) is None  # revoked stays revoked
    renamed = {t.caller for t in list_tokens(db)}
    assert renamed == {"shop", "growth-team", "growth-team-2"}  # a name that fits keeps it
    with db.tx(write=False) as cur:
        assert db.exec(cur, "SELECT caller FROM api_request").fetchone()[0] == "growth-team-2"
    assert lookup(db, tokens[3], 10).caller.name == "growth-team"  # type: ignore[union-attr]


def test_the_token_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = Settings().with_overrides(senders={"status_store": str(tmp_path / "s.sqlite3")})
    config = str(write_settings(cfg, tmp_path / "cfg.toml"))

    def run(*args: str) -> tuple[int, str, str]:
        code = main(["--config", config, "api", "token", *args])
        out = capsys.readouterr()
        return code, out.out, out.err

    code, token, _ = run("create", "shop", "--scopes", "send,profiles:write", "--rate", "50", "--expires-in", "30d")
    assert code == 0 and token.strip().startswith("ndk_")
    assert run("create", "shop", "--scopes", "send")[0] == 2
    code, _, err = run("create", "shop", "--scopes", "send")
    assert "--rotate" in err
    code, second, _ = run("create", "shop", "--rotate")
    assert code == 0 and second != token
    assert run("create", "shop", "--rotate", "--scopes", "send")[0] == 2
    assert "unknown scope 'admin'" in run("create", "other", "--scopes", "send,admin")[2]
    assert "--scopes is required" in run("create", "other")[2]
    code, listed, _ = run("list", "--json")
    rows = [json.loads(line) for line in listed.splitlines()]
    assert [(r["caller"], r["scopes"], r["revoked"], r["expires_ms"] is None) for r in rows] == [
        ("shop", ["send", "profiles:write"], False, False), ("shop", ["send", "profiles:write"], False, True)]
    assert token.strip() not in listed and second.strip() not in listed
    assert rows[0]["token_id"] == token_id(token.strip())
    code, out, _ = run("revoke", rows[0]["token_id"])
    assert code == 0 and out.startswith("1 token(s) revoked") and "api.token_cache_ttl_ms" in out
    code, table, _ = run("list")
    assert table.splitlines()[0].split() == ["CALLER", "TOKEN", "ID", "SCOPES", "CREATED", "EXPIRES", "REVOKED"]
    assert [line.split()[-1] for line in table.splitlines()[1:]] == ["yes", "no"]
    assert run("revoke", "--caller", "shop")[0] == 0
    assert run("revoke", "--caller", "shop")[0] == 3  # none left to revoke
