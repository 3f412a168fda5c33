"""bench.checkpoints: every checkpoint of a run kept from REST's short history, summed per window."""

from __future__ import annotations

from typing import Any

from bench.checkpoints import CheckpointLog, summarize


def entry(cid: int, status: str = "COMPLETED", trigger: int = 0, duration: int = 100, **more: Any) -> dict[str, Any]:
    return {"id": cid, "status": status, "trigger_timestamp": trigger, "latest_ack_timestamp": trigger + duration,
            "end_to_end_duration": duration, "checkpointed_size": 1000, **more}


def test_a_checkpoint_seen_in_progress_then_completed_is_kept_once_and_savepoints_are_left_out() -> None:
    answers = [
        [entry(1, trigger=1000), entry(2, "IN_PROGRESS", trigger=2000)],
        [entry(2, trigger=2000, duration=300), entry(3, trigger=3000), entry(9, is_savepoint=True)],
        RuntimeError("REST down"),
    ]

    def fetch() -> list[dict[str, Any]]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    log = CheckpointLog(fetch)
    for _ in range(3):
        log.poll()
    assert [e["id"] for e in log.completed()] == [1, 2, 3]
    assert log.errors == 1
    got = summarize(log, 1500, 3500)
    assert got is not None
    assert (got["completed"], got["failed"], got["unseen"]) == (2, 0, 0)
    assert (got["duration_ms_max"], got["duration_ms_mean"]) == (300.0, 200.0)
    assert got["between_completions_ms_max"] == 3100 - 2300


def test_checkpoints_the_log_never_saw_are_counted_as_unseen() -> None:
    log = CheckpointLog(lambda: [entry(4, trigger=10), entry(7, trigger=40), entry(8, "FAILED", trigger=50)])
    log.poll()
    got = summarize(log, 0, 100)
    assert got is not None
    assert (got["completed"], got["failed"], got["unseen"]) == (2, 1, 2)
    assert summarize(None, 0, 100) is None


def test_each_completed_checkpoints_phases_are_asked_once_and_summed_per_task() -> None:
    asked: list[int] = []

    def details(cid: int) -> dict[str, dict[str, float]]:
        asked.append(cid)
        if cid == 3:
            raise RuntimeError("left the history")
        return {"keyed": {"start_delay": 1.0 * cid, "sync": 10.0 * cid, "async": 2.0, "alignment": 0.0},
                **({"source": {"start_delay": 0.0, "sync": 1.0, "async": 1.0, "alignment": 0.0}} if cid == 1 else {})}

    polls = [[entry(1, trigger=10), entry(2, "IN_PROGRESS", trigger=20)],
             [entry(2, trigger=20), entry(3, trigger=30)],
             [entry(2, trigger=20), entry(3, trigger=30), entry(4, "FAILED", trigger=40)]]
    log = CheckpointLog(lambda: polls.pop(0), details=details)
    for _ in range(3):
        log.poll()
    assert asked == [1, 2, 3]  # completed ones, each once; not while in progress, not a failed one
    assert log.errors == 1 and log.entries[3]["phases"] is None
    got = summarize(log, 0, 100)
    assert got is not None
    keyed = got["phases_ms"]["keyed"]
    assert keyed["checkpoints"] == 2 and keyed["sync"]["max"] == 20.0 and keyed["start_delay"]["max"] == 2.0
    assert got["phases_ms"]["source"]["checkpoints"] == 1


def test_a_log_without_details_has_no_phases() -> None:
    log = CheckpointLog(lambda: [entry(1, trigger=10)])
    log.poll()
    got = summarize(log, 0, 100)
    assert got is not None and got["phases_ms"] == {}
