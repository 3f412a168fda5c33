"""``dedupctl api``: run the HTTP API, manage callers' tokens (create, rotate, list, revoke),
print the OpenAPI document and the route -> scope table; campaigns through the running API
(dedupctl/campaigns_cmd.py)."""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import time
from datetime import UTC, datetime
from typing import Any

from dedupctl import campaigns_cmd
from operators.errors import ConfigError
from ops.priority import set_cpu_priority
from settings import Settings

logger = logging.getLogger(__name__)

_DURATION = re.compile(r"([1-9]\d{0,8})([smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86_400}


def _out(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def parse_duration(text: str) -> int:
    """``90s``, ``30m``, ``12h``, ``30d`` -> milliseconds; raises ValueError."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"a duration is a number and s, m, h or d (30d, 12h): not {text!r}")
    return int(match.group(1)) * _UNIT_S[match.group(2)] * 1000


def _time(ms: int | None) -> str:
    return "never" if ms is None else datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def cmd_api_run(cfg: Settings, args: argparse.Namespace) -> int:
    from api.server import run

    if args.processes is not None and args.processes < 1:
        raise ConfigError("api run: --processes must be at least 1")
    if cfg.api.nice:
        logger.info("the API's processes: %s", set_cpu_priority(cfg.api.nice))
    run(cfg, args.host, args.port, args.processes)
    return 0


def cmd_api_token_create(cfg: Settings, args: argparse.Namespace) -> int:
    from api.callers import Caller, parse_categories, parse_list
    from api.database import open_api_store
    from api.scopes import parse_scopes
    from api.tokens import create_caller, rotate

    now = int(time.time() * 1000)
    try:
        expires = None if args.expires_in is None else now + parse_duration(args.expires_in)
        if args.rotate:
            given = [f"--{n}" for n in ("scopes", "categories", "templates", "rate", "namespaces")
                     if getattr(args, n) is not None]
            if given:
                raise ValueError(f"--rotate keeps the caller's {', '.join(given)}: give only --expires-in with it")
            caller = None
        else:
            if args.scopes is None:
                raise ValueError("--scopes is required: send, profiles:read, profiles:write, profiles:erase,"
                                 " status:read, support:read, campaigns (comma-separated)")
            caller = Caller(
                name=args.caller,
                scopes=parse_scopes(args.scopes),
                categories=parse_categories(args.categories or "transactional"),
                templates=parse_list(args.templates),
                rate_per_sec=args.rate,
                namespaces=parse_list(args.namespaces),
            )
    except ValueError as exc:
        raise ConfigError(f"api token create: {exc}") from None
    db = open_api_store(cfg)
    try:
        token = rotate(db, args.caller, now, expires) if caller is None else create_caller(db, caller, now, expires)
    except ValueError as exc:
        raise ConfigError(f"api token create: {exc}") from None
    finally:
        db.close()
    what = "another token" if caller is None else "a token"
    sys.stderr.write(f"{what} for {args.caller}, expires {_time(expires)} (shown once; the store keeps only its"
                     " hash):\n")
    _out(token)
    return 0


def cmd_api_token_list(cfg: Settings, args: argparse.Namespace) -> int:
    from api.database import open_api_store
    from api.tokens import list_tokens

    db = open_api_store(cfg)
    try:
        tokens = list_tokens(db)
    finally:
        db.close()
    if args.json:
        for t in tokens:
            _out(json.dumps({"caller": t.caller, "token_id": t.token_id, "scopes": t.scopes.split(",") if t.scopes
                             else [], "created_ms": t.created_ms, "expires_ms": t.expires_ms,
                             "revoked": t.revoked}))
        return 0
    rows = [("CALLER", "TOKEN ID", "SCOPES", "CREATED", "EXPIRES", "REVOKED")]
    rows += [(t.caller, t.token_id, t.scopes, _time(t.created_ms), _time(t.expires_ms), "yes" if t.revoked else "no")
             for t in tokens]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        _out("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())
    return 0


def cmd_api_token_revoke(cfg: Settings, args: argparse.Namespace) -> int:
    from api.database import open_api_store
    from api.tokens import revoke

    if (args.token_id is None) == (args.caller is None):
        raise ConfigError("api token revoke: give a TOKEN_ID or --caller NAME, one of them")
    db = open_api_store(cfg)
    try:
        n = revoke(db, token_id=args.token_id, caller=args.caller)
    except ValueError as exc:
        raise ConfigError(f"api token revoke: {exc}") from None
    finally:
        db.close()
    ttl = cfg.api.token_cache_ttl_ms / 1000
    _out(f"{n} token(s) revoked: refused at once by an API process that has not cached them, within {ttl:g} s"
         " (api.token_cache_ttl_ms) by one that has")
    return 0 if n else 3


def cmd_api_openapi(cfg: Settings, args: argparse.Namespace) -> int:
    from api.app import create_app

    _out(json.dumps(create_app().openapi(), indent=2, sort_keys=True))
    return 0


def cmd_api_scopes(cfg: Settings, args: argparse.Namespace) -> int:
    from api.scopes import markdown_table, scopes_table

    _out(scopes_table())
    _out("")
    _out(markdown_table())
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("api", help="the HTTP API: run it, manage callers' tokens")
    api_sub = p.add_subparsers(dest="api_command", required=True)
    q = api_sub.add_parser("run", help="serve the API in the foreground")
    q.add_argument("--host", help="default: api.host (127.0.0.1)")
    q.add_argument("--port", type=int, help="default: api.port (8080)")
    q.add_argument("--processes", type=int, help="API processes on the one port (default: api.processes, 1); more"
                   " than one on a SQLite store take turns writing")
    q.set_defaults(func=cmd_api_run)
    q = api_sub.add_parser("token", help="callers' bearer tokens")
    token_sub = q.add_subparsers(dest="token_command", required=True)
    t = token_sub.add_parser("create", help="make caller CALLER and print its token once (--rotate: another token of"
                             " an existing caller)")
    t.add_argument("caller", help="a unique name: [a-z0-9][a-z0-9_.-]{0,63}")
    t.add_argument("--scopes", help="what it may do, comma-separated: send, profiles:read, profiles:write,"
                   " profiles:erase, status:read, support:read, campaigns")
    t.add_argument("--categories", help="what it may send: transactional,marketing (default: transactional)")
    t.add_argument("--templates", help="the templates it may send, comma-separated (default: all of its categories)")
    t.add_argument("--rate", type=float, help="its notifications per second (default: api.default_rate_per_sec)")
    t.add_argument("--namespaces", help="shared dedup namespaces it may send in (Dedup-Namespace), comma-separated")
    t.add_argument("--expires-in", help="the token expires after this long: 90s, 30m, 12h, 30d (default: never)")
    t.add_argument("--rotate", action="store_true", help="another token of an existing caller, with its scopes")
    t.set_defaults(func=cmd_api_token_create)
    t = token_sub.add_parser("list", help="every token: caller, token id, scopes, created, expires, revoked")
    t.add_argument("--json", action="store_true", help="one JSON object a line")
    t.set_defaults(func=cmd_api_token_list)
    t = token_sub.add_parser("revoke", help="revoke a token by its id (token list shows it), or all of a caller's")
    t.add_argument("token_id", nargs="?")
    t.add_argument("--caller", help="revoke every token of this caller")
    t.set_defaults(func=cmd_api_token_revoke)
    q = api_sub.add_parser("openapi", help="print the OpenAPI document (docs/openapi.json is this)")
    q.set_defaults(func=cmd_api_openapi)
    q = api_sub.add_parser("scopes", help="print the scopes and the route -> scope table (docs/api.md has it)")
    q.set_defaults(func=cmd_api_scopes)
    campaigns_cmd.register(api_sub)
