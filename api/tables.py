"""The API's tables, in the senders' status store database (``senders.store.db``), and their
migration from an earlier layout (``prepare``: run by the API at start and by the commands that
use the tables). On SQLite the request tables (``REQUEST_TABLES``) are in a file of their own
(``api.database``)."""

from __future__ import annotations

from senders.errors import StatusStoreError
from senders.store.db import Database

#: on SQLite, the schema name of the file that holds ``REQUEST_TABLES`` (``api.database``)
REQUESTS = "requests"
#: the tables the API's processes write for every request: its Idempotency-Key and its record (the
#: store writer's, ``api.writer``), and the callers' rate budgets (``api.ratelimit``)
REQUEST_TABLES = ("api_idempotency", "api_request", "api_rate_budget")

TOKEN_TABLE = """CREATE TABLE IF NOT EXISTS {name} (
        token_hash TEXT PRIMARY KEY,
        caller TEXT NOT NULL,
        created_ms BIGINT NOT NULL,
        expires_ms BIGINT,
        revoked INTEGER NOT NULL DEFAULT 0
    )"""

SCHEMA = (
    # callers: a unique name, its scopes, categories, templates, rate and shared namespaces
    """CREATE TABLE IF NOT EXISTS api_caller (
        name TEXT PRIMARY KEY,
        scopes TEXT NOT NULL,
        categories TEXT NOT NULL,
        templates TEXT NOT NULL,
        rate_per_sec DOUBLE PRECISION,
        namespaces TEXT NOT NULL,
        created_ms BIGINT NOT NULL
    )""",
    # bearer tokens of the callers: only the SHA-256 of a token is kept
    TOKEN_TABLE.format(name="api_token"),
    # the job's verdicts other than accepted: duplicate (of which original), late, invalid
    """CREATE TABLE IF NOT EXISTS api_outcome (
        notification_id TEXT NOT NULL,
        verdict TEXT NOT NULL,
        dedup_key TEXT,
        user_id TEXT,
        original_id TEXT,
        occurrence INTEGER,
        watermark_ms BIGINT,
        reason TEXT,
        at_ms BIGINT NOT NULL,
        PRIMARY KEY (notification_id, verdict)
    )""",
    "CREATE INDEX IF NOT EXISTS api_outcome_by_key ON api_outcome (dedup_key)",
    "CREATE INDEX IF NOT EXISTS api_outcome_by_age ON api_outcome (at_ms)",
    # delivery receipts as they came (a receipt twice is one row)
    """CREATE TABLE IF NOT EXISTS api_receipt (
        provider TEXT NOT NULL,
        provider_ref TEXT NOT NULL,
        status TEXT NOT NULL,
        message_key TEXT NOT NULL,
        reason TEXT,
        received_ms BIGINT NOT NULL,
        PRIMARY KEY (provider, provider_ref, status)
    )""",
    "CREATE INDEX IF NOT EXISTS api_receipt_by_message ON api_receipt (message_key)",
    # a provider's receipts that came before their message was recorded as sent (api/receipts/held.py):
    # the event as JSON, its address encrypted as contacts are
    """CREATE TABLE IF NOT EXISTS api_held_receipt (
        provider TEXT NOT NULL,
        provider_ref TEXT NOT NULL,
        kind TEXT NOT NULL,
        event TEXT NOT NULL,
        received_ms BIGINT NOT NULL,
        PRIMARY KEY (provider, provider_ref, kind)
    )""",
    "CREATE INDEX IF NOT EXISTS api_held_receipt_by_age ON api_held_receipt (received_ms)",
    # campaigns: the definition, the segment in order, the progress (its source of truth is the
    # campaigns topic, written in each batch's transaction; ``written`` follows it)
    """CREATE TABLE IF NOT EXISTS api_campaign (
        campaign_id TEXT PRIMARY KEY,
        caller TEXT NOT NULL,
        template TEXT NOT NULL,
        params TEXT NOT NULL,
        channels TEXT NOT NULL,
        rate_per_sec DOUBLE PRECISION NOT NULL,
        send_at_ms BIGINT NOT NULL,
        state TEXT NOT NULL,
        total INTEGER NOT NULL,
        written INTEGER NOT NULL,
        created_ms BIGINT NOT NULL,
        updated_ms BIGINT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS api_campaign_user (
        campaign_id TEXT NOT NULL,
        position INTEGER NOT NULL,
        user_id TEXT NOT NULL,
        PRIMARY KEY (campaign_id, position)
    )""",
    "CREATE INDEX IF NOT EXISTS api_campaign_by_caller ON api_campaign (caller, state)",
    # leases: what runs once across the API processes of the store, and which process runs it
    """CREATE TABLE IF NOT EXISTS api_lease (
        name TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        host TEXT NOT NULL,
        pid INTEGER NOT NULL,
        expires_ms BIGINT NOT NULL,
        acquired_ms BIGINT NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS api_campaign_user_by_user ON api_campaign_user (user_id)",
)

REQUEST_SCHEMA = (
    # Idempotency-Key -> the first request's fingerprint and answer, for a bounded time
    """CREATE TABLE IF NOT EXISTS {into}api_idempotency (
        idem_key TEXT PRIMARY KEY,
        fingerprint TEXT NOT NULL,
        state TEXT NOT NULL,
        notification_id TEXT NOT NULL,
        user_id TEXT NOT NULL,
        answer TEXT,
        created_ms BIGINT NOT NULL,
        expires_ms BIGINT NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS {into}api_idempotency_by_expiry ON api_idempotency (expires_ms)",
    "CREATE INDEX IF NOT EXISTS {into}api_idempotency_by_user ON api_idempotency (user_id)",
    # each request the API wrote to Kafka, and where
    """CREATE TABLE IF NOT EXISTS {into}api_request (
        notification_id TEXT PRIMARY KEY,
        dedup_key TEXT NOT NULL,
        user_id TEXT NOT NULL,
        template TEXT NOT NULL,
        channels TEXT NOT NULL,
        priority TEXT NOT NULL,
        caller TEXT NOT NULL,
        event_time_ms BIGINT NOT NULL,
        accepted_ms BIGINT NOT NULL,
        kafka_partition INTEGER NOT NULL,
        kafka_offset BIGINT NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS {into}api_request_by_key ON api_request (dedup_key)",
    "CREATE INDEX IF NOT EXISTS {into}api_request_by_user ON api_request (user_id, accepted_ms)",
    "CREATE INDEX IF NOT EXISTS {into}api_request_by_position ON api_request (kafka_partition, kafka_offset)",
    "CREATE INDEX IF NOT EXISTS {into}api_request_by_age ON api_request (accepted_ms)",
    # the callers' rate budgets: per caller, budget and window, what the processes leased of it
    """CREATE TABLE IF NOT EXISTS {into}api_rate_budget (
        caller TEXT NOT NULL,
        bucket TEXT NOT NULL,
        window_ms BIGINT NOT NULL,
        granted BIGINT NOT NULL,
        PRIMARY KEY (caller, bucket, window_ms)
    )""",
    "CREATE INDEX IF NOT EXISTS {into}api_rate_budget_by_window ON api_rate_budget (window_ms)",
)

#: made once the tables have their current layout (after ``migrate``)
AFTER_MIGRATION = ("CREATE INDEX IF NOT EXISTS api_token_by_caller ON api_token (caller)",)


def request_schema(into: str = "") -> tuple[str, ...]:
    """``REQUEST_SCHEMA`` in the schema ``into`` (``"requests."``; ``""``: the connection's main)."""
    return tuple(ddl.format(into=into) for ddl in REQUEST_SCHEMA)


def prepare(db: Database) -> int:
    """The API's tables, created where missing and migrated in place from an earlier layout;
    returns the callers the migration made (0 when there was nothing to migrate). On SQLite,
    ``db`` has the requests file attached (``api.database``)."""
    from api.migrate import migrate

    db.ensure_schema(SCHEMA)
    if db.dialect == "sqlite":
        if REQUESTS not in db.attached:
            raise StatusStoreError("the API's tables on SQLite need the requests file attached: open the store"
                                   " with api.database")
        db.ensure_schema(request_schema(f"{REQUESTS}."))
        move_requests(db)
    else:
        db.ensure_schema(request_schema())
    made = migrate(db)
    db.ensure_schema(AFTER_MIGRATION)
    return made


def move_requests(db: Database) -> int:
    """SQLite: the request tables of a store from before they had a file of their own (or the rate
    budgets from before they were among them), moved there (in one transaction over both files; a
    move cut short is finished by the next start, a row already moved is kept once). Returns the
    rows moved."""
    moved = 0
    with db.tx() as cur:
        for table in REQUEST_TABLES:
            found = db.exec(cur, "SELECT 1 FROM main.sqlite_master WHERE type = 'table' AND name = ?",
                            (table,)).fetchone()
            if found is None:
                continue
            columns = ", ".join(str(r[1]) for r in db.exec(cur, f"PRAGMA main.table_info({table})").fetchall())
            moved += max(0, db.exec(cur, f"INSERT OR IGNORE INTO {REQUESTS}.{table} ({columns})"
                                         f" SELECT {columns} FROM main.{table}").rowcount)
            db.exec(cur, f"DROP TABLE main.{table}")
    return moved
