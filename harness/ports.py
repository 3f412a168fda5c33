"""Free loopback ports for the servers the harness starts."""

from __future__ import annotations

import contextlib
import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port_run(count: int, attempts: int = 50) -> int:
    """The first of ``count`` consecutive free loopback ports (for layouts of base + k)."""
    for _ in range(attempts):
        base = free_port()
        if base + count > 65535:
            continue
        try:
            with contextlib.ExitStack() as held:
                for port in range(base, base + count):
                    s = held.enter_context(socket.socket())
                    s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise OSError(f"no run of {count} free ports found")
