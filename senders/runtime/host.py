"""The host's part of the senders' metrics: the CPU-idle group they run in (``senders.cpu_idle``)."""

from __future__ import annotations

from ops.cpu_idle import GuardWindow
from senders.runtime.metrics import Metrics


def record_cpu_idle(metrics: Metrics, window: GuardWindow) -> None:
    """The CPU-idle group's guard's last window (ops/cpu_idle.py): what the group's threads (the
    job's and the senders') ran and waited, whether it is idle, and each relief."""
    metrics.set("sender_cpu_idle_group_cores", window.cores)
    metrics.set("sender_cpu_idle_group_waiting_threads", window.waiting)
    metrics.set("sender_cpu_idle_group_idle", 1.0 if window.idle else 0.0)
    metrics.inc("sender_cpu_idle_group_reliefs_total", 1.0 if window.relieved else 0.0)
