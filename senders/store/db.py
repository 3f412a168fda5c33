"""The status store's connection: SQLite or PostgreSQL, one transaction per call, reconnecting.

A connection that fails (PostgreSQL gone, SQLite locked past its busy timeout) raises
``StoreUnavailableError``; the next transaction connects again, so a worker that backs off and
retries needs no new store object.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from senders.errors import StatusStoreError, StoreUnavailableError

logger = logging.getLogger(__name__)

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS delivery_status (
        message_key TEXT PRIMARY KEY,
        notification_id TEXT NOT NULL,
        channel TEXT NOT NULL,
        lane TEXT NOT NULL,
        status TEXT NOT NULL,
        attempts INTEGER NOT NULL,
        provider TEXT,
        last_error TEXT,
        dead_letter TEXT,
        retry_at_ms BIGINT,
        lease_until_ms BIGINT NOT NULL DEFAULT 0,
        owner TEXT,
        unpublished INTEGER NOT NULL DEFAULT 0,
        created_ms BIGINT NOT NULL,
        updated_ms BIGINT NOT NULL
    )""",
    # the rules' counters (senders.rules.limits): one row per counter, locked while it is
    # counted, and its distinct units
    """CREATE TABLE IF NOT EXISTS limit_counter (
        counter_key TEXT PRIMARY KEY,
        expires_ms BIGINT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS limit_unit (
        counter_key TEXT NOT NULL,
        unit TEXT NOT NULL,
        expires_ms BIGINT NOT NULL,
        PRIMARY KEY (counter_key, unit)
    )""",
    # user profiles (senders.store.profiles): the preferences in the clear, the contacts sealed
    """CREATE TABLE IF NOT EXISTS user_profile (
        user_id TEXT PRIMARY KEY,
        preferences TEXT NOT NULL,
        updated_ms BIGINT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS user_contact (
        user_id TEXT NOT NULL,
        channel TEXT NOT NULL,
        position INTEGER NOT NULL,
        address_enc TEXT NOT NULL,
        address_hash TEXT NOT NULL,
        verified INTEGER NOT NULL,
        active INTEGER NOT NULL,
        platform TEXT,
        registered_ms BIGINT NOT NULL,
        PRIMARY KEY (user_id, channel, position)
    )""",
    "CREATE INDEX IF NOT EXISTS user_contact_by_hash ON user_contact (channel, address_hash)",

    """CREATE TABLE IF NOT EXISTS inactive_address (
        channel TEXT NOT NULL,
        address_hash TEXT NOT NULL,
        reason TEXT NOT NULL,
        since_ms BIGINT NOT NULL,
        PRIMARY KEY (channel, address_hash)
    )""",
    # one row per dead letter redriven (its position in the dead-letter topic): each only once
    """CREATE TABLE IF NOT EXISTS redriven_letter (
        dlq_topic TEXT NOT NULL,
        dlq_partition INTEGER NOT NULL,
        dlq_offset BIGINT NOT NULL,
        message_key TEXT NOT NULL,
        produced INTEGER NOT NULL DEFAULT 0,
        at_ms BIGINT NOT NULL,
        PRIMARY KEY (dlq_topic, dlq_partition, dlq_offset)
    )""",
    # the live `senders run` processes, so that two never share an instance id
    """CREATE TABLE IF NOT EXISTS sender_process (
        instance_id TEXT PRIMARY KEY,
        holder TEXT NOT NULL,
        host TEXT NOT NULL,
        pid INTEGER NOT NULL,
        heartbeat_ms BIGINT NOT NULL
    )""",
)

#: columns added to a table after its first release: (table, column, type), added where missing
ADDED_COLUMNS = (
    ("delivery_status", "user_id", "TEXT"),
    ("delivery_status", "reason", "TEXT"),
    ("delivery_status", "not_before_ms", "BIGINT"),
    ("delivery_status", "template", "TEXT"),
    ("delivery_status", "template_version", "INTEGER"),
    ("delivery_status", "locale", "TEXT"),
    # the provider's id of a sent message: delivery receipts find the message by it
    ("delivery_status", "provider_ref", "TEXT"),
)
#: indexes on added columns (made after them)
INDEXES = (
    "CREATE INDEX IF NOT EXISTS delivery_status_by_user ON delivery_status (user_id)",
    "CREATE INDEX IF NOT EXISTS delivery_status_by_age ON delivery_status (updated_ms)",
    "CREATE INDEX IF NOT EXISTS delivery_status_by_notification ON delivery_status (notification_id)",
    "CREATE INDEX IF NOT EXISTS delivery_status_by_provider_ref ON delivery_status (provider, provider_ref)",
)

#: statements a connection keeps prepared: each multi-row statement in each of its sizes
#: (``statement_rows``), and the rest
PREPARED_STATEMENTS = 512

#: serialises concurrent CREATE TABLE IF NOT EXISTS on PostgreSQL (which may otherwise collide)
_SCHEMA_LOCK = 7_262_013


def statement_rows(n: int) -> int:
    """How many rows a multi-row statement for ``n`` is written for: ``n`` rounded up to a power
    of two. A few statement texts so serve batches of every size, and stay prepared (SQLite's
    statement cache, psycopg's prepared statements): preparing a statement of a few hundred rows
    costs more than running it."""
    return 1 << max(0, n - 1).bit_length()


class Database:
    """One connection (opened on first use and again after a failure) and its SQL dialect."""

    def __init__(
        self,
        connect: Callable[[], Any],
        *,
        dialect: str,
        transient: tuple[type[BaseException], ...],
        where: str,
        attached: frozenset[str] = frozenset(),
        store_tables: bool = True,
    ) -> None:
        self.dialect = dialect
        #: the other SQLite files each connection has attached, by schema name
        self.attached = attached
        self._store_tables = store_tables
        self.where = where  # for messages: a path, or host/database (never a password)
        self._connect = connect
        self._transient = transient
        self._conn: Any = None
        self._lock_suffix = " FOR UPDATE" if dialect == "postgresql" else ""
        #: called after each committed transaction (the senders count them: a metric)
        self.on_commit: Callable[[], None] | None = None
        #: told how long each SQLite write transaction waited for the file's write lock (its
        #: ``BEGIN IMMEDIATE``: the busy handler's sleeps, and in a busy process the wait for the
        #: interpreter's lock after it; seconds): the API's metric
        self.on_lock_wait: Callable[[float], None] | None = None
        #: told how long each SQLite write transaction held the file's write lock (from its
        #: ``BEGIN IMMEDIATE`` to its ``COMMIT``; seconds): every other writer of the file waits
        #: that long (the senders' metric)
        self.on_lock_held: Callable[[float], None] | None = None

    @property
    def for_update(self) -> str:
        return self._lock_suffix

    def sql(self, text: str) -> str:
        return text.replace("?", "%s") if self.dialect == "postgresql" else text

    # Statements over many rows. SQLite: one row of parameters per item, the rows padded to
    # ``statement_rows`` so that a few texts serve every batch and stay prepared. PostgreSQL: one
    # array parameter per column, so that the text is one and short (psycopg parses a statement of
    # more than 50 parameters in Python on every call, and keeps none of them prepared).

    def in_list(self, values: Sequence[str]) -> tuple[str, list[Any]]:
        """What goes in ``IN (...)`` for these text ``values`` (not empty), and its parameters."""
        if self.dialect == "postgresql":
            return "SELECT unnest(CAST(? AS TEXT[]))", [list(values)]
        padded = [*values, *[values[0]] * (statement_rows(len(values)) - len(values))]  # the same test
        return ", ".join("?" * len(padded)), padded

    def many_rows(self, rows: Sequence[Sequence[Any]], template: str) -> tuple[str, list[Any]]:
        """``template, template, ...`` for a multi-row ``INSERT ... VALUES`` of ``rows`` (not empty;
        the statement ends ``ON CONFLICT ... DO NOTHING``), and the parameters, flat. SQLite: padded
        by repeating the first row (which then conflicts and changes nothing)."""
        if self.dialect == "sqlite":
            rows = [*rows, *[rows[0]] * (statement_rows(len(rows)) - len(rows))]
        return ", ".join([template] * len(rows)), [v for row in rows for v in row]

    def with_values(self, columns: Sequence[tuple[str, str]], rows: Sequence[Sequence[Any]]) -> tuple[str, list[Any]]:
        """``WITH v (<names>) AS (...) `` of ``rows`` (not empty), for one statement that changes
        many rows (``UPDATE ... FROM v WHERE <key> = v.<key>``; SQLite from 3.33); and its
        parameters. ``columns``: (name, SQL type). SQLite: a VALUES list padded with rows of NULLs
        (which match no key), its first row cast to the types; PostgreSQL: ``unnest`` of one
        array per column."""
        names = ", ".join(name for name, _ in columns)
        if self.dialect == "postgresql":
            arrays = ", ".join(f"CAST(? AS {kind}[])" for _, kind in columns)
            return f"WITH v ({names}) AS (SELECT * FROM unnest({arrays})) ", [list(c) for c in zip(*rows, strict=True)]
        first = "(" + ", ".join(f"CAST(? AS {kind})" for _, kind in columns) + ")"
        row = "(" + ", ".join("?" * len(columns)) + ")"
        n = statement_rows(len(rows))
        params = [v for r in rows for v in r] + [None] * (len(columns) * (n - len(rows)))
        return f"WITH v ({names}) AS (VALUES {', '.join([first, *[row] * (n - 1)])}) ", params

    def select_rows(self, cur: Any, columns: str, rest: str, params: Iterable[Any] = (),
                    with_: str = "") -> list[tuple[Any, ...]]:
        """The rows of ``<with_>SELECT <columns> <rest>`` (``with_``: a ``WITH ...`` clause, as
        ``with_values`` writes one). On SQLite they come as one row, a JSON array of them (texts,
        numbers and NULLs only): ``sqlite3`` lets the interpreter's lock go around each step, each
        row of a result is one, and in a busy process each step waits to take the lock back
        (``ops.gil``)."""
        if self.dialect == "sqlite":
            (text,) = self.exec(cur, f"{with_}SELECT json_group_array(json_array({columns})) {rest}",
                                params).fetchone()
            return [tuple(row) for row in json.loads(text)]
        return [tuple(row) for row in self.exec(cur, f"{with_}SELECT {columns} {rest}", params).fetchall()]

    def exec(self, cur: Any, text: str, params: Iterable[Any] = ()) -> Any:
        cur.execute(self.sql(text), tuple(params))
        return cur

    def _connection(self) -> Any:
        if self._conn is None:
            try:
                conn = self._connect()
            except self._transient as exc:
                raise StoreUnavailableError(f"status store {self.where} unavailable: {exc}") from None
            self._conn = conn
            try:
                self._create_schema()
            except BaseException:
                self._drop()
                raise
        return self._conn

    def _create_schema(self) -> None:
        if not self._store_tables:
            return
        with self.tx() as cur:
            if self.dialect == "postgresql":
                cur.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            for ddl in SCHEMA:
                cur.execute(ddl)
            for table, column, kind in ADDED_COLUMNS:
                if column not in self.columns(cur, table):
                    cur.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
            for ddl in INDEXES:
                cur.execute(ddl)

    def ensure_schema(self, statements: Iterable[str]) -> None:
        """Run more ``CREATE ... IF NOT EXISTS`` statements (another component's tables, such
        as the API's), serialised like the store's own."""
        with self.tx() as cur:
            if self.dialect == "postgresql":
                cur.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            for ddl in statements:
                cur.execute(ddl)

    def lock_schema(self, cur: Any) -> None:
        """Inside a transaction: serialise it with every other schema change (PostgreSQL)."""
        if self.dialect == "postgresql":
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))

    def columns(self, cur: Any, table: str) -> set[str]:
        """A table's column names (empty when there is no such table)."""
        if self.dialect == "postgresql":
            cur.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = %s"
                " AND table_schema = current_schema()",
                (table,),
            )
            return {r[0] for r in cur.fetchall()}
        cur.execute(f"PRAGMA table_info({table})")
        return {r[1] for r in cur.fetchall()}

    @contextmanager
    def tx(self, write: bool = True) -> Iterator[Any]:
        """One transaction; SQLite writers take the write lock first (BEGIN IMMEDIATE), so what
        they read cannot change under them."""
        conn = self._connection()
        cur = conn.cursor()
        try:
            locked = 0.0
            if self.dialect == "sqlite":
                started = time.perf_counter()
                cur.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                locked = time.perf_counter()
                if write and self.on_lock_wait is not None:
                    self.on_lock_wait(locked - started)
            yield cur
            conn.commit() if self.dialect == "postgresql" else cur.execute("COMMIT")
            if write and locked and self.on_lock_held is not None:
                self.on_lock_held(time.perf_counter() - locked)
            if self.on_commit is not None:
                self.on_commit()
        except self._transient as exc:
            self._rollback_or_drop()
            raise StoreUnavailableError(f"status store {self.where} unavailable: {exc}") from None
        except BaseException:
            self._rollback_or_drop()
            raise
        finally:
            try:
                cur.close()
            except Exception:  # noqa: BLE001 - the connection is gone already
                pass

    def _rollback_or_drop(self) -> None:
        if self._conn is None:
            return
        try:
            self._conn.rollback()
        except Exception:  # noqa: BLE001 - a broken connection: open a new one next time
            self._drop()

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - closing a broken connection
                logger.debug("closing the status store connection failed", exc_info=True)

    def close(self) -> None:
        self._drop()


def _postgres(location: str, password: str | None, connect_timeout_s: int) -> Database:
    try:
        import psycopg
    except ImportError:
        raise StatusStoreError(
            "a postgresql:// status store needs psycopg (pip install '.[postgres]')"
        ) from None
    parts = urlsplit(location)
    where = f"postgresql://{parts.hostname or 'localhost'}:{parts.port or 5432}{parts.path}"

    def connect() -> Any:
        extra: dict[str, Any] = {"connect_timeout": connect_timeout_s, "application_name": "notify-senders"}
        if password:
            extra["password"] = password
        conn = psycopg.connect(location, **extra)
        conn.prepared_max = PREPARED_STATEMENTS
        return conn

    return Database(connect, dialect="postgresql", transient=(psycopg.OperationalError,), where=where)


def sqlite_path(location: str) -> Path:
    """The file of a SQLite location: ``sqlite:///relative.db`` or ``sqlite:////absolute/path.db``
    (as SQLAlchemy spells them), or a path."""
    return Path(location[len("sqlite:///") :] if location.startswith("sqlite:///") else location)


def _sqlite(location: str, synchronous: str, busy_timeout_ms: int, attach: Mapping[str, Path],
            store_tables: bool) -> Database:
    path = sqlite_path(location)
    mode = synchronous.upper()
    if mode not in ("OFF", "NORMAL", "FULL", "EXTRA"):
        raise StatusStoreError(f"unknown sqlite synchronous mode {synchronous!r}")
    if not all(name.isidentifier() for name in attach):
        raise StatusStoreError(f"attached schema names must be identifiers: {sorted(attach)}")
    path.parent.mkdir(parents=True, exist_ok=True)

    def connect() -> sqlite3.Connection:
        conn = sqlite3.connect(
            str(path),
            timeout=busy_timeout_ms / 1000,
            isolation_level=None,
            check_same_thread=False,
            cached_statements=PREPARED_STATEMENTS,
        )
        try:
            for schema in ("main", *attach):
                if schema != "main":
                    conn.execute(f"ATTACH DATABASE ? AS {schema}", (str(attach[schema]),))
                conn.execute(f"PRAGMA {schema}.journal_mode=WAL")
                conn.execute(f"PRAGMA {schema}.synchronous={mode}")
        except BaseException:
            conn.close()
            raise
        return conn

    return Database(connect, dialect="sqlite", transient=(sqlite3.OperationalError,), where=str(path),
                    attached=frozenset(attach), store_tables=store_tables)


def open_database(
    location: str,
    *,
    synchronous: str = "FULL",
    password: str | None = None,
    busy_timeout_ms: int = 30_000,
    connect_timeout_s: int = 10,
    attach: Mapping[str, Path] | None = None,
    store_tables: bool = True,
) -> Database:
    """``location``: a ``postgresql://`` DSN, ``sqlite:///path``, or a file path. Connects at
    once, so that a wrong location is reported at start.

    SQLite only: ``attach`` (schema name -> file) other files to every connection (a writer's
    ``BEGIN IMMEDIATE`` then takes the write lock of each of them too); ``store_tables=False``
    for a file that holds none of the store's own tables."""
    if is_postgres(location):
        if attach:
            raise StatusStoreError("a PostgreSQL store attaches no other files")
        db = _postgres(location, password, connect_timeout_s)
    else:
        db = _sqlite(location, synchronous, busy_timeout_ms, attach or {}, store_tables)
    try:
        db._connection()
    except StoreUnavailableError as exc:
        raise StatusStoreError(f"cannot open the status store: {exc}") from None
    return db


def is_postgres(location: str) -> bool:
    return location.startswith(("postgresql://", "postgres://"))


def is_shared(db: Database) -> bool:
    """Whether processes on several hosts can share this store (SQLite is one file on one host)."""
    return db.dialect == "postgresql"

