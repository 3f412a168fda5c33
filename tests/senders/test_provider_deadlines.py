"""A provider call's deadline on the shared timer (senders/providers/deadlines.py) means what
``asyncio.timeout`` means: the call cut at its time as TimeoutError, a finished call left alone, a
cancel from outside still a cancel."""

from __future__ import annotations

import asyncio

import pytest

from senders.providers.deadlines import Deadlines


async def _call(deadlines: Deadlines, within_s: float, takes_s: float) -> str:
    async with deadlines.within(within_s):
        await asyncio.sleep(takes_s)
    return "done"


def test_only_the_calls_past_their_deadline_are_cut() -> None:
    async def main() -> list[object]:
        deadlines = Deadlines()
        calls = [_call(deadlines, 0.2, takes) for takes in (0.01, 0.5, 0.05, 0.6, 0.1)]
        return await asyncio.gather(*calls, return_exceptions=True)

    got = asyncio.run(main())
    assert [type(r).__name__ if isinstance(r, BaseException) else r for r in got] == [
        "done", "TimeoutError", "done", "TimeoutError", "done"]


def test_a_deadline_cuts_at_its_time_not_at_another_s() -> None:
    async def main() -> tuple[float, float]:
        deadlines = Deadlines()
        loop = asyncio.get_running_loop()
        start = loop.time()

        async def timed(within: float) -> float:
            with pytest.raises(TimeoutError):
                await _call(deadlines, within, 5.0)
            return loop.time() - start

        late, early = await asyncio.gather(timed(0.3), timed(0.1))  # the later deadline comes first
        return late, early

    late, early = asyncio.run(main())
    assert 0.1 <= early < 0.25 and 0.3 <= late < 0.45


def test_a_cancel_from_outside_stays_a_cancel_and_the_task_can_go_on() -> None:
    async def main() -> tuple[bool, str]:
        deadlines = Deadlines()
        task = asyncio.ensure_future(_call(deadlines, 10.0, 5.0))
        await asyncio.sleep(0.05)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            cancelled = True
        else:
            cancelled = False
        # a call finished well inside its deadline is not cut when the deadline passes later
        ok = await _call(deadlines, 0.1, 0.01)
        await asyncio.sleep(0.2)
        return cancelled, ok

    assert asyncio.run(main()) == (True, "done")


def test_the_deadlines_work_on_a_second_event_loop() -> None:
    deadlines = Deadlines()

    async def cut() -> None:
        with pytest.raises(TimeoutError):
            await _call(deadlines, 0.05, 1.0)

    asyncio.run(cut())
    asyncio.run(cut())
