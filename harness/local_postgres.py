"""A throwaway PostgreSQL server on loopback, from the Debian package's binaries (initdb, pg_ctl).

Started as ``harness/local_kafka.py`` starts Kafka: a fresh cluster in a temporary directory, on
a free port, no fsync (a test server: its data is thrown away). ``initdb`` refuses to run as
root, so as root the cluster belongs to the ``postgres`` user the package creates and the
commands run through ``runuser``.
"""

from __future__ import annotations

import glob
import logging
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from operators.errors import DedupError

logger = logging.getLogger(__name__)

#: the package's user, who owns the cluster when we run as root
SERVICE_USER = "postgres"


class PostgresError(DedupError):
    """The local PostgreSQL server could not be found, started or stopped."""


def find_binaries() -> Path:
    """The directory with ``initdb`` and ``pg_ctl``: on PATH, else the newest /usr/lib/postgresql/*/bin."""
    on_path = shutil.which("initdb")
    if on_path and shutil.which("pg_ctl"):
        return Path(os.path.realpath(on_path)).parent
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3].split(".")[0])
    )
    if not candidates:
        raise PostgresError(
            "no PostgreSQL server binaries (initdb, pg_ctl): `make setup` installs Debian's postgresql"
        )
    return Path(candidates[-1]).parent


def _as_service_user() -> list[str]:
    if os.geteuid() != 0:
        return []
    if shutil.which("runuser") is None:
        raise PostgresError("running as root needs runuser (util-linux) to start PostgreSQL as postgres")
    return ["runuser", "-u", SERVICE_USER, "--"]


@dataclass
class LocalPostgres:
    """A cluster in ``home`` (a new temporary directory when not given) on 127.0.0.1:``port``.

    :param port: the TCP port on 127.0.0.1
    :param home: data directory, socket and log live here; removed by ``stop`` when it made it
    """

    port: int
    home: Path | None = None
    _made_home: bool = field(default=False, repr=False)

    @property
    def dsn(self) -> str:
        return f"postgresql://{SERVICE_USER}@127.0.0.1:{self.port}/postgres"

    def dsn_for(self, database: str) -> str:
        return f"postgresql://{SERVICE_USER}@127.0.0.1:{self.port}/{database}"

    @property
    def data_dir(self) -> Path:
        assert self.home is not None
        return self.home / "data"

    @property
    def log_file(self) -> Path:
        assert self.home is not None
        return self.home / "server.log"

    def start(self, timeout_s: float = 60.0) -> LocalPostgres:
        bin_dir = find_binaries()
        prefix = _as_service_user()
        if self.home is None:
            # /tmp, not pytest's tmp dirs: those are root's alone, and the server runs as postgres
            self.home = Path(tempfile.mkdtemp(prefix="notify-pg-"))
            self._made_home = True
        if prefix:
            shutil.chown(self.home, user=SERVICE_USER)
        run = [*prefix]
        init = [
            *run, str(bin_dir / "initdb"), "-D", str(self.data_dir), "-U", SERVICE_USER,
            "-A", "trust", "-E", "UTF8", "--no-sync", "--locale=C",
        ]
        self._run(init, timeout_s, "initdb")
        options = " ".join(
            [
                f"-p {self.port}",
                "-c listen_addresses=127.0.0.1",
                f"-c unix_socket_directories={self.home}",
                "-c fsync=off",
                "-c synchronous_commit=off",
                "-c full_page_writes=off",
                "-c max_connections=200",
                "-c shared_buffers=32MB",
            ]
        )
        ctl = [
            *run, str(bin_dir / "pg_ctl"), "-D", str(self.data_dir), "-l", str(self.log_file),
            "-o", options, "-w", "-t", str(int(timeout_s)), "start",
        ]
        self._run(ctl, timeout_s + 10, "pg_ctl start")
        logger.info("postgres started", extra={"port": self.port, "home": str(self.home)})
        return self

    def _run(self, cmd: list[str], timeout_s: float, what: str) -> None:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            log = self.log_file.read_text(errors="replace")[-2000:] if self.log_file.exists() else ""
            raise PostgresError(f"{what} failed ({proc.returncode}): {proc.stderr.strip()}\n{log}")

    def stop(self) -> None:
        if self.home is None or not (self.data_dir / "postmaster.pid").exists():
            self._cleanup()
            return
        cmd = [*_as_service_user(), str(find_binaries() / "pg_ctl"), "-D", str(self.data_dir),
               "-m", "immediate", "-w", "stop"]
        subprocess.run(cmd, capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while (self.data_dir / "postmaster.pid").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        self._cleanup()

    def _cleanup(self) -> None:
        if self._made_home and self.home is not None:
            shutil.rmtree(self.home, ignore_errors=True)

    def create_database(self, name: str) -> str:
        """A new empty database; returns its DSN."""
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.dsn_for(name)
