"""What ``bench.senders`` runs on for the whole benchmark: the broker, PostgreSQL, the two provider
stubs and the CPU sampler watching them (each started here unless given)."""

from __future__ import annotations

import time
from pathlib import Path

from bench.measure import ProcSampler
from bench.stubs.process import StubProcess
from harness.local_kafka import LocalBroker
from harness.local_postgres import LocalPostgres
from harness.ports import free_port
from operators.records import Channel
from senders.profiles.crypto import generate_key


class Environment:
    """The broker, PostgreSQL, the stubs and the CPU sampler, for the whole benchmark."""

    def __init__(self, work: Path, bootstrap: str | None, postgres: str | None, needs_pg: bool) -> None:
        self.work = work
        self.sampler = ProcSampler(interval_s=0.1)
        self.sampler.start()
        self.offset_s = time.time() - time.monotonic()
        self.keys = (generate_key(), generate_key())
        self.broker: LocalBroker | None = None
        self.pg: LocalPostgres | None = None
        self.http: StubProcess | None = None
        self.smtp: StubProcess | None = None
        try:
            if bootstrap is None:
                self.broker = LocalBroker(home=work / "kafka", port=free_port(), controller_port=free_port())
                self.broker.start()
                bootstrap = self.broker.bootstrap
                pid = self.broker.pid()
                if pid is not None:
                    self.sampler.watch("broker", pid)
            self.bootstrap = bootstrap
            self.pg_dsn = postgres
            if needs_pg and postgres is None:
                self.pg = LocalPostgres(port=free_port()).start()
                self.pg_dsn = self.pg.dsn
                postmaster = self.pg.data_dir / "postmaster.pid"
                self.sampler.watch("postgres", int(postmaster.read_text().split()[0]))
            self.http = StubProcess("http")
            self.smtp = StubProcess("smtp")
            self.sampler.watch("stub-http", self.http.pid)
            self.sampler.watch("stub-smtp", self.smtp.pid)
        except BaseException:
            self.close()
            raise

    def stub(self, channel: Channel) -> StubProcess:
        stub = self.smtp if channel is Channel.EMAIL else self.http
        assert stub is not None
        return stub

    def stubs(self) -> list[StubProcess]:
        return [s for s in (self.http, self.smtp) if s is not None]

    def database(self, name: str) -> str:
        import psycopg

        assert self.pg_dsn is not None
        with psycopg.connect(self.pg_dsn, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.pg_dsn.rsplit("/", 1)[0] + f"/{name}"

    def xact_commit(self, name: str, settle_s: float = 10.0) -> int | None:
        """Committed transactions of a database so far (pg_stat_database), read from another one
        once its client backends are gone (a backend reports its counts when it exits, at the
        latest), waiting ``settle_s`` at most for that."""
        import psycopg

        assert self.pg_dsn is not None
        deadline = time.monotonic() + settle_s
        with psycopg.connect(self.pg_dsn, autocommit=True) as conn:
            while time.monotonic() < deadline:
                row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s"
                                   " AND backend_type = 'client backend'", (name,)).fetchone()
                if row is None or int(row[0]) == 0:
                    break
                time.sleep(0.1)
            row = conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (name,)).fetchone()
        return int(row[0]) if row else None

    def drop_database(self, name: str) -> None:
        import psycopg

        assert self.pg_dsn is not None
        with psycopg.connect(self.pg_dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def close(self) -> None:
        for stub in self.stubs():
            stub.stop()
        if self.pg is not None:
            self.pg.stop()
        if self.broker is not None:
            self.broker.stop()
        self.sampler.stop()
