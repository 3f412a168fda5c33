"""A throwaway Redis server on loopback, from Debian's ``redis-server`` package (``make setup``
installs it where missing), for the tests and the benchmark of the Redis-backed engine."""

from __future__ import annotations

import shutil
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from harness import server_process
from harness.ports import free_port
from operators.errors import DedupError


class RedisError(DedupError):
    """The local Redis server could not be started."""


def redis_command(port: int, work: Path, *, durable: bool = True) -> list[str]:
    """``redis-server`` on 127.0.0.1:``port`` with its files in ``work``; durable: an append-only
    file synced every second (what a platform team would run), else nothing written."""
    cmd = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(work), "--save", "",
           "--protected-mode", "yes"]
    return cmd + (["--appendonly", "yes", "--appendfsync", "everysec"] if durable else ["--appendonly", "no"])


@dataclass
class LocalRedis:
    """:param home: where the server keeps its files and log"""

    home: Path
    port: int = field(default_factory=free_port)
    durable: bool = False
    _proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 30.0) -> LocalRedis:
        if shutil.which("redis-server") is None:
            raise RedisError("redis-server is not installed: `make setup` installs Debian's redis-server")
        self.home.mkdir(parents=True, exist_ok=True)
        self._proc = server_process.launch(redis_command(self.port, self.home, durable=self.durable),
                                           self.home / "redis.log")
        if server_process.wait_ready(self._proc, self._listens, timeout_s, interval_s=0.05):
            return self
        if self._proc.poll() is not None:
            raise RedisError(f"redis-server exited: see {self.home / 'redis.log'}")
        self.stop()
        raise RedisError(f"redis-server did not listen on {self.port} within {timeout_s:.0f} s")

    def _listens(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        if self._proc is not None:
            server_process.stop(self._proc)
            self._proc = None

    def __enter__(self) -> LocalRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
