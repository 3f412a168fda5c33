"""``dedupctl api``: run the HTTP API, create a caller's token, write the OpenAPI document."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from operators.errors import ConfigError
from senders.runtime.pool import open_status_store
from settings import Settings


def _out(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def cmd_api_run(cfg: Settings, args: argparse.Namespace) -> int:
    from api.server import run

    run(cfg, args.host, args.port)
    return 0


def cmd_api_token_create(cfg: Settings, args: argparse.Namespace) -> int:
    from api.tables import SCHEMA
    from api.tokens import Caller, create_token, parse_categories

    try:
        caller = Caller(
            name=args.caller,
            categories=parse_categories(args.categories),
            templates=frozenset(t.strip() for t in (args.templates or "").split(",") if t.strip()),
            rate_per_sec=args.rate,
        )
    except ValueError as exc:
        raise ConfigError(f"api token create: {exc}") from None
    store = open_status_store(cfg)
    try:
        store.db.ensure_schema(SCHEMA)
        token = create_token(store.db, caller, int(time.time() * 1000))
    except ValueError as exc:
        raise ConfigError(f"api token create: {exc}") from None
    finally:
        store.close()
    sys.stderr.write(f"a token for {caller.name} (shown once; the store keeps only its hash):\n")
    _out(token)
    return 0


def cmd_api_openapi(cfg: Settings, args: argparse.Namespace) -> int:
    from api.app import create_app

    _out(json.dumps(create_app().openapi(), indent=2, sort_keys=True))
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("api", help="the HTTP API: run it, make a caller's token")
    api_sub = p.add_subparsers(dest="api_command", required=True)
    q = api_sub.add_parser("run", help="serve the API in the foreground")
    q.add_argument("--host", help="default: api.host (127.0.0.1)")
    q.add_argument("--port", type=int, help="default: api.port (8080)")
    q.set_defaults(func=cmd_api_run)
    q = api_sub.add_parser("token", help="callers' bearer tokens")
    token_sub = q.add_subparsers(dest="token_command", required=True)
    t = token_sub.add_parser("create", help="print a new token for CALLER once")
    t.add_argument("caller")
    t.add_argument("--categories", default="transactional", help="transactional,marketing (default: transactional)")
    t.add_argument("--templates", help="the templates it may send, comma-separated (default: all of its categories)")
    t.add_argument("--rate", type=float, help="its notifications per second (default: api.default_rate_per_sec)")
    t.set_defaults(func=cmd_api_token_create)
    q = api_sub.add_parser("openapi", help="print the OpenAPI document (docs/openapi.json is this)")
    q.set_defaults(func=cmd_api_openapi)
