"""A single-node Apache Kafka broker (KRaft) on loopback, run from the jars Maven fetched."""

from __future__ import annotations

import base64
import logging
import os
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from operators.errors import DedupError
from settings import REPO_ROOT

logger = logging.getLogger(__name__)

KAFKA_JARS = REPO_ROOT / ".cache" / "jars" / "kafka"


class BrokerError(DedupError):
    """The local broker could not be started, reached or stopped."""


@dataclass(frozen=True)
class LocalBroker:
    """Where a local broker keeps its files and which ports it answers on.

    :param home: data, logs, pid file and server.properties live here
    :param port: client (PLAINTEXT) port on 127.0.0.1
    :param controller_port: KRaft controller port on 127.0.0.1
    :param heap_mb: JVM heap of the broker
    """

    home: Path
    port: int = 9092
    controller_port: int = 9093
    heap_mb: int = 512

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid_file(self) -> Path:
        return self.home / "kafka.pid"

    @property
    def log_file(self) -> Path:
        return self.home / "server.log"

    def properties(self) -> str:
        return "\n".join(
            [
                "process.roles=broker,controller",
                "node.id=1",
                f"controller.quorum.voters=1@127.0.0.1:{self.controller_port}",
                f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
                f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
                "controller.listener.names=CONTROLLER",
                "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                "inter.broker.listener.name=PLAINTEXT",
                f"log.dirs={self.home / 'data'}",
                "num.partitions=1",
                "auto.create.topics.enable=false",
                "offsets.topic.replication.factor=1",
                "offsets.topic.num.partitions=4",
                "transaction.state.log.replication.factor=1",
                "transaction.state.log.min.isr=1",
                "transaction.state.log.num.partitions=4",
                "transaction.max.timeout.ms=900000",
                "group.initial.rebalance.delay.ms=0",
                "share.coordinator.state.topic.replication.factor=1",
                "share.coordinator.state.topic.min.isr=1",
                "",
            ]
        )

    def pid(self) -> int | None:
        """The broker's pid when its process is alive, else None."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        try:  # reap it if it is our own child that has exited
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return None
        except ChildProcessError:
            pass  # not our child (started by another dedupctl)
        try:
            os.kill(pid, 0)
        except OSError:
            return None
        return pid

    def answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False

    def status(self) -> str:
        pid = self.pid()
        if pid is None:
            return f"stopped (home {self.home})"
        state = "running" if self.answers() else "starting"
        return f"{state}: pid {pid}, {self.bootstrap}, home {self.home}"

    def start(self, timeout_s: float = 90.0) -> None:
        """Start the broker unless it runs already; returns once it takes metadata requests."""
        if self.pid() is not None:
            self._wait_ready(timeout_s)
            return
        if self.answers():
            raise BrokerError(f"port {self.port} is taken by another process")
        if not KAFKA_JARS.is_dir() or not any(KAFKA_JARS.glob("kafka_2.13-*.jar")):
            raise BrokerError(f"no Kafka jars in {KAFKA_JARS}: run `make jars` first")
        self.home.mkdir(parents=True, exist_ok=True)
        config = self.home / "server.properties"
        config.write_text(self.properties())
        classpath = f"{KAFKA_JARS}/*"
        if not (self.home / "data" / "meta.properties").exists():
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
            subprocess.run(  # "=": an id may start with "-", which would read as an option
                ["java", "-cp", classpath, "kafka.tools.StorageTool", "format",
                 f"--cluster-id={cluster_id}", "-c", str(config)],
                check=True, capture_output=True, timeout=120,
            )
        log4j = self.home / "log4j2.properties"
        log4j.write_text(
            "rootLogger.level=INFO\nrootLogger.appenderRef.out.ref=out\n"
            "appender.out.type=Console\nappender.out.name=out\n"
            "appender.out.layout.type=PatternLayout\nappender.out.layout.pattern=[%d] %p %m (%c)%n\n"
            "logger.kafka.name=kafka\nlogger.kafka.level=WARN\n"
            "logger.apache.name=org.apache.kafka\nlogger.apache.level=WARN\n"
        )
        with open(self.log_file, "ab") as log:
            proc = subprocess.Popen(
                ["java", f"-Xmx{self.heap_mb}m", f"-Xms{self.heap_mb}m", "-XX:+UseG1GC",
                 f"-Dlog4j2.configurationFile={log4j}", "-cp", classpath, "kafka.Kafka", str(config)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )
        self.pid_file.write_text(str(proc.pid))
        logger.info("kafka broker starting", extra={"pid": proc.pid, "port": self.port})
        self._wait_ready(timeout_s)

    def _wait_ready(self, timeout_s: float) -> None:
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + timeout_s
        admin = None
        while time.monotonic() < deadline:
            if self.pid() is None:
                raise BrokerError(f"the broker exited during start-up; see {self.log_file}")
            if self.answers():
                admin = admin or AdminClient({"bootstrap.servers": self.bootstrap})
                try:
                    admin.list_topics(timeout=5)
                    return
                except Exception:  # noqa: BLE001 - not ready yet, retry until the deadline
                    pass
            time.sleep(0.5)
        raise BrokerError(f"the broker did not answer within {timeout_s:.0f} s; see {self.log_file}")

    def stop(self, timeout_s: float = 30.0) -> bool:
        """Stop the broker (SIGTERM, then SIGKILL); returns False when it was not running."""
        pid = self.pid()
        if pid is None:
            return False
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.pid() is not None:
            time.sleep(0.2)
        if self.pid() is not None:
            os.kill(pid, signal.SIGKILL)
            time.sleep(0.5)
        self.pid_file.unlink(missing_ok=True)
        return True
