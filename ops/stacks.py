"""Every thread's Python stack on demand: ``kill -USR1 <pid>`` writes them to the process's
standard error (its log), and the process runs on.

For a process that is alive but stuck (a campaign that stops writing, a worker that stops
consuming) without an error to log: the stacks say where each thread waits. faulthandler writes
them from the signal handler itself, so a thread holding the interpreter's lock does not keep
them back. They name code and lines only, never a variable's value (no secret, no parameter).
"""

from __future__ import annotations

import faulthandler
import signal

#: the signal that asks for the stacks (none of our processes, uvicorn's or Flink's client uses it)
STACKS_SIGNAL = signal.SIGUSR1
STDERR_FD = 2


def dump_stacks_on_signal() -> None:
    """From now on, ``STACKS_SIGNAL`` writes every thread's stack to standard error (its file
    descriptor: a caller that swapped ``sys.stderr`` for an object without one, as a test's
    capture does, changes nothing)."""
    faulthandler.register(STACKS_SIGNAL, file=STDERR_FD, all_threads=True, chain=False)
