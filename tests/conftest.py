"""Shared fixtures: a real Kafka broker and a real PostgreSQL server for the session, and
factories for topics and jobs.

The broker is a testcontainers Kafka where a Docker engine answers; otherwise (as on these
machines) the local KRaft broker run from the Maven jars. ``DEDUP_TEST_BOOTSTRAP`` points the
suite at a broker that is already running instead. PostgreSQL is a throwaway cluster started
from the Debian package's binaries (``make setup`` installs them); ``DEDUP_TEST_POSTGRES`` points
the suite at a running server instead (a DSN of a role that may create databases).

``make test`` runs the files in two processes (pytest-xdist, ``--dist loadfile``: a file's tests
share one process, each process its own broker and PostgreSQL). Files are handed out in
collection order (``--no-loadscope-reorder``: xdist would otherwise hand out the files with the
most tests first), so the longest ones (``LONGEST_FIRST``) are collected first: the processes then
end together instead of one running a two-minute file alone at the end.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness.local_kafka import LocalBroker
from harness.local_postgres import LocalPostgres
from harness.ports import free_port
from operators.contract import Topics
from ops import kafka_io
from settings import Settings

#: the files that take longest (the durations CI prints), longest first
LONGEST_FIRST = (
    "tests/harness/test_chaos_slice.py",
    "tests/harness/test_kafka_cluster.py",
    "tests/test_readme.py",
    "tests/ops/test_ops_job.py",
    "tests/jobs/test_restarts.py",
    "tests/harness/test_cluster.py",
    "tests/bench/test_harness.py",
    "tests/senders/test_story.py",
    "tests/senders/test_crash.py",
    "tests/senders/test_in_flight.py",
    "tests/jobs/test_hardening.py",
    "tests/jobs/test_restore.py",
    "tests/api/test_idempotency.py",
    "tests/senders/test_resilience.py",
    "tests/api/test_running.py",
    "tests/senders/test_rules.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: n for n, path in enumerate(LONGEST_FIRST)}
    missing = [p for p in LONGEST_FIRST if not (Path(__file__).parent.parent / p).is_file()]
    assert not missing, f"tests/conftest.py LONGEST_FIRST names files that do not exist: {missing}"
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))  # stable: the rest keep their order


def _docker_engine_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=15).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if os.environ.get("DEDUP_TEST_BOOTSTRAP"):
        yield os.environ["DEDUP_TEST_BOOTSTRAP"]
        return
    if _docker_engine_answers():
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer("apache/kafka:4.1.1").with_kraft() as container:
            yield container.get_bootstrap_server()
        return
    broker = LocalBroker(home=tmp_path_factory.mktemp("kafka"), port=free_port(), controller_port=free_port())
    broker.start()
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """The DSN of the session's PostgreSQL server (its ``postgres`` database)."""
    if os.environ.get("DEDUP_TEST_POSTGRES"):
        yield os.environ["DEDUP_TEST_POSTGRES"]
        return
    server = LocalPostgres(port=free_port()).start()
    try:
        yield server.dsn
    finally:
        server.stop()


@pytest.fixture
def postgres_dsn(postgres_server: str) -> str:
    """A new, empty database on the session's server for one test; returns its DSN."""
    import psycopg

    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return _with_database(postgres_server, name)


def _with_database(dsn: str, name: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(dsn)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


@pytest.fixture
def topic_factory(kafka_bootstrap: str) -> Callable[..., Topics]:
    """Fresh, uniquely named topics for one test: ``topic_factory(partitions=2)``."""

    def make(partitions: int = 2) -> Topics:
        topics = _prefixed(f"t{uuid.uuid4().hex[:8]}.")
        kafka_io.create_topics({"bootstrap.servers": kafka_bootstrap}, topics.all(), partitions)
        return topics

    return make


def _prefixed(prefix: str) -> Topics:

    base = Topics()
    return base.with_prefix(prefix)


@pytest.fixture
def settings_factory(kafka_bootstrap: str, tmp_path: Path) -> Callable[..., Settings]:
    """Settings for one test's job: its own topics, checkpoints, group and transactional ids."""

    def make(topics: Topics, parallelism: int = 1, **sections: dict[str, object]) -> Settings:
        run_id = uuid.uuid4().hex[:8]
        base = Settings(topics=topics)
        cfg = base.with_overrides(
            kafka={"bootstrap_servers": kafka_bootstrap, "group_id": f"test-{run_id}"},
            flink={
                "parallelism": parallelism,
                "checkpoint_dir": str(tmp_path / f"checkpoints-{run_id}"),
                "checkpoint_interval_ms": 1000,
                "transactional_id_prefix": f"test-{run_id}",
                "rest_port": free_port(),
                "restart_attempts": 3,
                "restart_delay_ms": 500,
            },
            dedup={"idleness_ms": 5000},
        )
        return cfg.with_overrides(**sections) if sections else cfg

    return make


@pytest.fixture
def job_factory() -> Iterator[Callable[..., object]]:
    """Start the real job on the mini-cluster, detached; every job is cancelled at teardown."""
    from jobs.runner import run_job

    clients: list[object] = []

    def start(cfg: Settings, resume_from: str | None = None) -> object:
        client = run_job(cfg, resume_from, detached=True)
        clients.append(client)
        return client

    yield start
    for client in clients:
        try:
            client.cancel().result()  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - already finished or failed; nothing left to stop
            pass
