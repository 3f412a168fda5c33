"""Every checkpoint of a Flink system's run, from its REST API, and what they cost per phase.

Flink's REST API keeps only the last ``web.checkpoints.history`` (10) checkpoints in
``/jobs/:id/checkpoints``, and its summary is over the whole run: at a 250 ms interval that is
2.5 s of history, and a run mixes the backlog (the job saturated) with the latency phases (a
fixed load). :class:`CheckpointLog` polls the history often enough to see each checkpoint and
keeps them by id; :func:`summarize` gives the checkpoints triggered within one window of the run
(wall-clock epoch ms, as Flink's timestamps are): how many, how often, how long each took from
trigger to the last acknowledgement (``end_to_end_duration``: what a read_committed reader waits
for on top of the interval), and how much each wrote. Given ``details``, it also asks, once per
completed checkpoint, for each task's slowest subtask's phases (:func:`subtask_phases`): when its
barrier reached it, its synchronous part (the task stops processing: the sink's flush and
pre-commit happen there), its asynchronous part, and its alignment.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bench.measure import percentile
from ops.flink_rest import RestClient

#: the fields of a history entry that are kept (Flink's names)
FIELDS = ("id", "status", "trigger_timestamp", "latest_ack_timestamp", "end_to_end_duration",
          "checkpointed_size", "state_size", "alignment_buffered", "processed_data", "persisted_data")


#: of each task, per checkpoint, the slowest subtask's (ms; Flink's per-subtask summary)
PHASES = ("start_delay", "sync", "async", "alignment")


def subtask_phases(rest: RestClient, job_id: str, vertices: Mapping[str, str], checkpoint_id: int
                   ) -> dict[str, dict[str, float]]:
    """One checkpoint's :data:`PHASES` per task (``vertices``: name -> id), each the slowest
    subtask's (``/jobs/:id/checkpoints/details/:cid/subtasks/:vid``, while the checkpoint is in
    the REST API's history)."""
    out = {}
    for name, vid in vertices.items():
        summary = rest.call("GET", f"/jobs/{job_id}/checkpoints/details/{checkpoint_id}/subtasks/{vid}")["summary"]
        out[name] = {
            "start_delay": float(summary["start_delay"]["max"]),
            "sync": float(summary["checkpoint_duration"]["sync"]["max"]),
            "async": float(summary["checkpoint_duration"]["async"]["max"]),
            "alignment": float(summary["alignment"]["duration"]["max"]),
        }
    return out


def job_history(rest: RestClient, job_id: str) -> list[dict[str, Any]]:
    """A job's recent checkpoints as the REST API keeps them (``history``: the last
    ``web.checkpoints.history``); what :class:`CheckpointLog` polls."""
    return list(rest.call("GET", f"/jobs/{job_id}/checkpoints").get("history") or [])


class CheckpointLog(threading.Thread):
    """Polls ``fetch()`` (the ``history`` list of ``/jobs/:id/checkpoints``) every ``interval_s``
    and keeps every entry by checkpoint id, the last answer for each (an in-progress checkpoint
    is seen again once completed); ``details(id)``, if given, once for each completed one: its
    ``phases`` (None when the asking failed)."""

    def __init__(self, fetch: Callable[[], Sequence[dict[str, Any]]], interval_s: float = 0.5,
                 details: Callable[[int], dict[str, dict[str, float]]] | None = None) -> None:
        super().__init__(name="checkpoint-log", daemon=True)
        self._fetch = fetch
        self._details = details
        self.interval_s = interval_s
        self.entries: dict[int, dict[str, Any]] = {}
        self.errors = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval_s):
            self.poll()

    def poll(self) -> None:
        try:
            history = self._fetch()
        except Exception:  # noqa: BLE001 - a missed poll loses nothing the next one sees
            self.errors += 1
            return
        for entry in history:
            if entry.get("is_savepoint"):
                continue
            cid = int(entry["id"])
            kept = {k: entry.get(k) for k in FIELDS}
            if "phases" in self.entries.get(cid, {}):
                kept["phases"] = self.entries[cid]["phases"]
            elif self._details is not None and kept["status"] == "COMPLETED":
                try:
                    kept["phases"] = self._details(cid)
                except Exception:  # noqa: BLE001 - asked once: it may have left the history meanwhile
                    self.errors += 1
                    kept["phases"] = None
            self.entries[cid] = kept

    def stop(self) -> None:
        if not self._stop_event.is_set():
            self._stop_event.set()
            if self.ident is not None:
                self.join(10)
            self.poll()

    def completed(self) -> list[dict[str, Any]]:
        return sorted((e for e in self.entries.values() if e["status"] == "COMPLETED"), key=lambda e: e["id"])

    def failed(self) -> list[dict[str, Any]]:
        return [e for e in self.entries.values() if e["status"] == "FAILED"]


def epoch_ms(monotonic_s: float) -> int:
    """A ``time.monotonic()`` reading as wall-clock epoch ms (Flink's checkpoint timestamps)."""
    return int((time.time() - time.monotonic() + monotonic_s) * 1000)


def summarize(log: CheckpointLog | None, t0_ms: int, t1_ms: int) -> dict[str, Any] | None:
    """The checkpoints triggered in ``[t0_ms, t1_ms)``: count, the time between their
    completions, their end-to-end duration (p50/p99/max) and the bytes each wrote (mean)."""
    if log is None:
        return None
    done = [e for e in log.completed() if t0_ms <= int(e["trigger_timestamp"] or 0) < t1_ms]
    failed = [e for e in log.failed() if t0_ms <= int(e["trigger_timestamp"] or 0) < t1_ms]
    durations = sorted(float(e["end_to_end_duration"]) for e in done if e["end_to_end_duration"] is not None)
    acks = sorted(int(e["latest_ack_timestamp"]) for e in done if e["latest_ack_timestamp"])
    gaps = sorted(float(b - a) for a, b in zip(acks, acks[1:], strict=False))
    sizes = [int(e["checkpointed_size"]) for e in done if e["checkpointed_size"] is not None]
    ids = [int(e["id"]) for e in done]
    return {
        "completed": len(done), "failed": len(failed),
        # ids are consecutive: a gap is a checkpoint the log never saw (polled too rarely)
        "unseen": (ids[-1] - ids[0] + 1 - len(ids)) if ids else 0,
        "window_s": round((t1_ms - t0_ms) / 1000, 2),
        "duration_ms_p50": percentile(durations, 50), "duration_ms_p99": percentile(durations, 99),
        "duration_ms_max": durations[-1] if durations else None,
        "duration_ms_mean": sum(durations) / len(durations) if durations else None,
        "between_completions_ms_p50": percentile(gaps, 50),
        "between_completions_ms_max": gaps[-1] if gaps else None,
        "checkpointed_bytes_mean": sum(sizes) / len(sizes) if sizes else None,
        "phases_ms": phase_percentiles([e["phases"] for e in done if e.get("phases")]),
    }


def phase_percentiles(phases: Sequence[Mapping[str, Mapping[str, float]]]) -> dict[str, dict[str, Any]]:
    """Task -> phase -> p50/p99/max over checkpoints, of each checkpoint's slowest subtask."""
    tasks = sorted({task for one in phases for task in one})
    out: dict[str, dict[str, Any]] = {}
    for task in tasks:
        out[task] = {"checkpoints": sum(task in one for one in phases)}
        for phase in PHASES:
            values = sorted(one[task][phase] for one in phases if task in one)
            out[task][phase] = {"p50": percentile(values, 50), "p99": percentile(values, 99),
                                "max": values[-1] if values else None}
    return out
