"""The services' CPU priorities when they share a host: a throughput service below the
latency-bound ones, and the API, whose callers wait, above the rest.

The job and the senders have seconds of slack (a code's budget is 2 s, a checkpoint's output
waits up to an interval anyway); the API answers a caller who waits, and the broker acknowledges
its writes. On one host they all share the cores, and the scheduler's fair share made the API's
requests wait behind the job's and the senders' turns: on 2 cores at 1,000 accepts/s beside the
whole pipeline, the accept p99 was 36.7-62.9 ms at one priority (three runs) and 21.3-40.7 ms with
the job and the senders at nice 10 (four), the codes' and order updates' latencies unchanged
(``python -m bench.slo [--nice 0]``; bench/results/slo-2026-12-06-s37-*). A nice process still
takes every cycle nobody else wants, so a campaign flood is as fast as before when the API is
idle.

The API's processes share one session, and so one autogroup: the scheduler gives that group the
share of any other session's (the broker's, a provider stub's, a load generator's), whatever the
number of processes in it. ``api.nice`` below 0 (it needs CAP_SYS_NICE: root, or systemd's
``Nice=``) gives the group more: at 2,000 accepts/s beside the whole pipeline on 2 cores, with
the API's two processes at nice -5, the accept p99 was 97.7, 90.6, 106, 92.9 and 98.4 ms in five runs
against 105 and 134 ms at 0 (``python -m bench.slo --api-nice``, bench/results/slo-2026-12-06-s38-*);
later runs at -5 gave 111-225 ms (s39-*, README): with the machine that full, the spread between
runs is wider than the difference, so what -5 buys there is not measured yet.

A nice only lowers a service inside the scheduler's fair share; ``ops.cpu_idle`` takes the job
and the senders out of it (a CPU-idle control group, with a guard against starvation).

Linux's autogroups (``kernel.sched_autogroup_enabled``) share the CPU between sessions first and
only then between the processes of one session by their nice values, so a process that leads its
session (a service started by systemd, or with ``setsid``) sets its autogroup's nice too; one
that does not leaves it, as it is then its terminal's, the shell's included.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)

AUTOGROUP = Path("/proc/self/autogroup")


def set_cpu_priority(nice: int) -> str:
    """Run this process, and what it starts from now on, at ``nice`` (-20 to 19; 0 leaves it as it
    is; below 0 needs CAP_SYS_NICE); says what was done, for the log. Never raises: a refusal is
    logged and the process runs on as it was."""
    if nice == 0:
        return "CPU priority unchanged"
    done = []
    current = os.getpriority(os.PRIO_PROCESS, 0)
    if (nice > 0 and current < nice) or (nice < 0 and current != nice):
        try:
            os.setpriority(os.PRIO_PROCESS, 0, nice)
            done.append(f"nice {nice}")
        except OSError as exc:
            logger.warning("the process keeps its CPU priority (nice %d): %s", current, exc)
    if AUTOGROUP.exists() and os.getsid(0) == os.getpid():
        try:
            AUTOGROUP.write_text(str(nice))
            done.append(f"its session's autogroup at nice {nice}")
        except OSError as exc:
            logger.warning("the session's autogroup keeps its CPU priority: %s", exc)
    return ", ".join(done) or f"already at nice {current}"


def yield_cpu(nice: int) -> str:
    """``set_cpu_priority`` for a throughput service: 0-19, a value below 0 leaves it as it is."""
    return set_cpu_priority(max(0, nice))
