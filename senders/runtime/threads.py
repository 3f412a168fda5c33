"""The OS name of a thread (``top -H``, ``/proc/PID/task/TID/comm``), so that the CPU of a
``senders run`` process can be told apart by thread: the event loop, each worker's consumer,
producer and store threads, librdkafka's own (named by librdkafka)."""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

_PR_SET_NAME = 15
_libc: ctypes.CDLL | None = None
if sys.platform.startswith("linux"):
    try:
        _libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    except OSError:  # pragma: no cover - no libc to load: threads keep the interpreter's name
        _libc = None


def name_os_thread(name: str) -> None:
    """Give the calling thread ``name`` (cut to Linux's 15 bytes); nothing off Linux."""
    if _libc is not None:
        _libc.prctl(_PR_SET_NAME, name.encode("ascii", "replace")[:15], 0, 0, 0)
