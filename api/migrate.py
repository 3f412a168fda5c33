"""The API's tables migrated in place from the layout before callers had scopes.

Then ``api_token`` held each token's caller name, categories, templates and rate, and names were
not unique. Now a caller is a row of ``api_caller`` and a token names its caller. The migration,
one transaction, run by whoever opens the tables first:

* each caller name becomes a caller with the scopes ``send,status:read`` (what such a token could
  do that is still allowed: send, and read its own notifications), and the categories, templates
  and rate of its newest live token (of its newest token when all are revoked);
* a name outside the new rule (``api.callers.NAME``) becomes a name that fits it: lower case,
  other characters as ``-`` (``Shop Team`` -> ``shop-team``), ``-2``, ``-3``... when taken; the
  API's requests and campaigns of that caller follow the new name;
* every token keeps working (and stays revoked if it was), with no expiry.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from api.callers import NAME
from api.scopes import LEGACY_SCOPES, scopes_text
from senders.store.db import Database

logger = logging.getLogger(__name__)

_LEGACY_COLUMNS = {"categories", "templates", "rate_per_sec"}


def fitting_name(old: str, taken: set[str]) -> str:
    """A caller name under the rule for a legacy one (itself when it fits and is free)."""
    if NAME.fullmatch(old) and old not in taken:
        return old
    base = re.sub(r"[^a-z0-9_.-]", "-", old.lower()).lstrip("_.-")[:60] or "caller"
    name, n = base, 1
    while name in taken or not NAME.fullmatch(name):
        n += 1
        name = f"{base}-{n}"
    return name


def migrate(db: Database) -> int:
    """Migrate a legacy ``api_token`` in place; returns the callers made (0: nothing to do)."""
    with db.tx() as cur:
        db.lock_schema(cur)
        if not _LEGACY_COLUMNS <= db.columns(cur, "api_token"):
            return 0
        rows = db.exec(
            cur,
            "SELECT token_hash, caller, categories, templates, rate_per_sec, created_ms, revoked FROM api_token"
            " ORDER BY created_ms, token_hash",
        ).fetchall()
        taken = {r[0] for r in db.exec(cur, "SELECT name FROM api_caller").fetchall()}
        legacy = list(dict.fromkeys(r[1] for r in rows))
        names = {old: old for old in legacy if NAME.fullmatch(old) and old not in taken}  # they keep theirs
        taken |= set(names)
        for old in legacy:
            if old not in names:
                names[old] = fitting_name(old, taken)
                taken.add(names[old])
        newest: dict[str, tuple[Any, ...]] = {}
        for row in rows:
            old = row[1]
            live = not int(row[6])
            if old not in newest or live or int(newest[old][6]):
                newest[old] = row  # rows are oldest first: the last live one wins
        from api.tables import TOKEN_TABLE

        cur.execute(TOKEN_TABLE.format(name="api_token_v2"))
        for token_hash, old, _, _, _, created, revoked in rows:
            db.exec(
                cur,
                "INSERT INTO api_token_v2 (token_hash, caller, created_ms, expires_ms, revoked)"
                " VALUES (?, ?, ?, NULL, ?)",
                (token_hash, names[old], int(created), int(revoked)),
            )
        cur.execute("DROP TABLE api_token")
        cur.execute("ALTER TABLE api_token_v2 RENAME TO api_token")
        for old, row in newest.items():
            _, _, categories, templates, rate, created, _ = row
            db.exec(
                cur,
                "INSERT INTO api_caller (name, scopes, categories, templates, rate_per_sec, namespaces, created_ms)"
                " VALUES (?, ?, ?, ?, ?, '', ?) ON CONFLICT (name) DO NOTHING",
                (names[old], scopes_text(LEGACY_SCOPES), categories, templates, rate, int(created)),
            )
        for old, new in names.items():
            if old != new:
                for table in ("api_request", "api_campaign"):
                    db.exec(cur, f"UPDATE {table} SET caller = ? WHERE caller = ?", (new, old))
    renamed = sum(1 for old, new in names.items() if old != new)
    logger.info("migrated %d tokens of %d callers to callers with scopes (%d renamed to fit the name rule)",
                len(rows), len(names), renamed)
    return len(names)
