"""What a caller may do (pure): the scopes a token carries, and the one table that says which
scope admits each route. The gate (``api.gate``) checks it on every request; docs/api.md and the
README show it as ``markdown_table()`` renders it (a test compares them).

Every ``/v1`` route is in the table, with exactly one scope; the app refuses to start otherwise
(``check_routes``). Routes outside ``/v1`` are not in it: ``/healthz``, ``/readyz``,
``/openapi.json`` and ``/support`` (the page's shell: its data comes from ``/v1/support/...``)
answer anyone, and so does ``/outbox`` (the outbox's page: its data comes from ``/v1/outbox``);
the public but signed ones (``SIGNED_ROUTES``) take no token, each request carrying its own
proof instead.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from enum import StrEnum

from starlette.routing import compile_path


class Scope(StrEnum):
    SEND = "send"  # POST /v1/notifications, within the caller's categories and templates
    PROFILES_READ = "profiles:read"
    PROFILES_WRITE = "profiles:write"  # preferences, contacts (and their verified flag), devices
    PROFILES_ERASE = "profiles:erase"
    STATUS_READ = "status:read"  # the caller's own notifications only
    SUPPORT_READ = "support:read"  # every caller's notifications and campaigns (the support page), the outbox
    CAMPAIGNS = "campaigns"  # create, read, pause and resume the caller's own campaigns


#: what each scope is for, in the docs' words
MEANING: Mapping[Scope, str] = {
    Scope.SEND: "send notifications (the templates of its categories, or only its `--templates`)",
    Scope.PROFILES_READ: "read a user's preferences and how many addresses per channel",
    Scope.PROFILES_WRITE: "change preferences, contacts (and their `verified` flag) and devices",
    Scope.PROFILES_ERASE: "erase a user and everything stored of them",
    Scope.STATUS_READ: "what became of the caller's own notifications",
    Scope.SUPPORT_READ: "every caller's notifications and campaigns (the support page); pause and resume"
    " any campaign; the outbox's messages, addresses and bodies (where the outbox is in use)",
    Scope.CAMPAIGNS: "create, read, pause and resume the caller's own campaigns (marketing templates)",
}

#: the scopes a token made before scopes existed has (the migration gives them these)
LEGACY_SCOPES = frozenset({Scope.SEND, Scope.STATUS_READ})

#: (method, route path as the app declares it) -> the one scope that admits it
ROUTE_SCOPES: Mapping[tuple[str, str], Scope] = {
    ("POST", "/v1/notifications"): Scope.SEND,
    ("GET", "/v1/notifications/{notification_id:path}"): Scope.STATUS_READ,
    ("GET", "/v1/users/{user_id}/notifications"): Scope.STATUS_READ,
    ("GET", "/v1/users/{user_id}"): Scope.PROFILES_READ,
    ("PUT", "/v1/users/{user_id}/preferences"): Scope.PROFILES_WRITE,
    ("PUT", "/v1/users/{user_id}/contacts"): Scope.PROFILES_WRITE,
    ("POST", "/v1/devices"): Scope.PROFILES_WRITE,
    ("DELETE", "/v1/users/{user_id}"): Scope.PROFILES_ERASE,
    ("POST", "/v1/campaigns"): Scope.CAMPAIGNS,
    ("GET", "/v1/campaigns/{campaign_id}"): Scope.CAMPAIGNS,
    ("POST", "/v1/campaigns/{campaign_id}/pause"): Scope.CAMPAIGNS,
    ("POST", "/v1/campaigns/{campaign_id}/resume"): Scope.CAMPAIGNS,
    ("GET", "/v1/support/notifications/{notification_id:path}"): Scope.SUPPORT_READ,
    ("GET", "/v1/support/users/{user_id}/notifications"): Scope.SUPPORT_READ,
    ("GET", "/v1/support/campaigns/{campaign_id}"): Scope.SUPPORT_READ,
    ("POST", "/v1/support/campaigns/{campaign_id}/pause"): Scope.SUPPORT_READ,
    ("POST", "/v1/support/campaigns/{campaign_id}/resume"): Scope.SUPPORT_READ,
    ("GET", "/v1/outbox"): Scope.SUPPORT_READ,  # addresses and bodies of every caller's messages
}


#: the public routes a signature authenticates instead of a token: (method, path) -> by what
SIGNED_ROUTES: Mapping[tuple[str, str], str] = {
    ("POST", "/webhooks/{provider}"): "the provider's signature (api.receipts)",
    ("POST", "/unsubscribe"): "the link's token, an HMAC of the user id (senders.policy.unsubscribe)",
}


_COMPILED: tuple[tuple[str, re.Pattern[str], str], ...] = tuple(
    (method, compile_path(path)[0], path) for method, path in ROUTE_SCOPES
)


def route_of(method: str, path: str) -> tuple[str, str] | None:
    """The table's (method, route path) of a request, or None when no route of the table has
    this path and method (the router then answers 404 or 405)."""
    for m, pattern, route in _COMPILED:
        if m == method and pattern.match(path):
            return m, route
    return None


def parse_scopes(text: str) -> frozenset[Scope]:
    """``send,status:read`` -> the scopes; raises ValueError naming a wrong one."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ValueError(f"at least one scope: {', '.join(s.value for s in Scope)}")
    known = {s.value for s in Scope}
    for name in names:
        if name not in known:
            raise ValueError(f"unknown scope {name!r}: one of {', '.join(s.value for s in Scope)}")
    return frozenset(Scope(n) for n in names)


def scopes_text(scopes: Iterable[Scope]) -> str:
    """The stored and printed form: in the order of ``Scope``."""
    chosen = set(scopes)
    return ",".join(s.value for s in Scope if s in chosen)


def check_routes(declared: Iterable[tuple[str, str]]) -> None:
    """Every declared ``/v1`` (method, path) has its scope, and every route of the table (and of
    ``SIGNED_ROUTES``) exists; raises AssertionError naming what is missing (the app then does
    not start)."""
    routes = set(declared)
    v1 = {(m, p) for m, p in routes if p.startswith("/v1/")}
    unscoped = sorted(v1 - set(ROUTE_SCOPES))
    missing = sorted((set(ROUTE_SCOPES) - v1) | (set(SIGNED_ROUTES) - routes))
    if unscoped or missing:
        raise AssertionError(f"api.scopes.ROUTE_SCOPES is out of date: no scope for {unscoped}; no route for {missing}")


def display_path(path: str) -> str:
    """A route path as the docs write it (``{notification_id:path}`` -> ``{notification_id}``)."""
    return path.replace(":path}", "}")


def markdown_table() -> str:
    """The route -> scope table of docs/api.md and the README."""
    lines = ["| route | scope |", "|---|---|"]
    for (method, path), scope in ROUTE_SCOPES.items():
        lines.append(f"| `{method} {display_path(path)}` | `{scope.value}` |")
    return "\n".join(lines)


def scopes_table() -> str:
    """The scopes and what each is for (docs/api.md)."""
    lines = ["| scope | lets a caller |", "|---|---|"]
    lines += [f"| `{s.value}` | {MEANING[s]} |" for s in Scope]
    return "\n".join(lines)
