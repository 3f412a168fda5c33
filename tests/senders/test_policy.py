"""Pure logic of the senders: retry policy, circuit breaker, token bucket (no Kafka, no clock)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from operators.errors import ConfigError
from senders.policy.breaker import BreakerOptions, CircuitBreaker
from senders.policy.bucket import RateLimit, TokenBucket
from senders.policy.retry import RetryPolicy, format_step
from senders.statuses import CircuitState

# -- retry policy ----------------------------------------------------------------------------------


def test_waits_double_from_the_base() -> None:
    policy = RetryPolicy(base_ms=1000, max_attempts=4, jitter_ratio=0.0)
    assert [policy.nominal_delay_ms(a) for a in (1, 2, 3)] == [1000, 2000, 4000]
    assert [policy.next_attempt_at(a, 10_000, 0.5) for a in (1, 2, 3)] == [11_000, 12_000, 14_000]


def test_no_retry_after_the_last_attempt() -> None:
    policy = RetryPolicy(base_ms=1000, max_attempts=4)
    assert policy.next_attempt_at(3, 0, 0.0) is not None
    assert policy.next_attempt_at(4, 0, 0.0) is None
    assert RetryPolicy(base_ms=1000, max_attempts=1).next_attempt_at(1, 0, 0.0) is None


def test_the_wait_is_capped() -> None:
    policy = RetryPolicy(base_ms=1000, max_attempts=30, max_backoff_ms=5000, jitter_ratio=0.0)
    assert [policy.nominal_delay_ms(a) for a in range(1, 7)] == [1000, 2000, 4000, 5000, 5000, 5000]
    assert policy.steps() == (1000, 2000, 4000, 5000)
    assert policy.nominal_delay_ms(200) == 5000  # no overflow


@given(attempt=st.integers(1, 10), rand=st.floats(0.0, 1.0, exclude_max=True), ratio=st.floats(0.0, 1.0))
def test_jitter_stays_within_its_ratio(attempt: int, rand: float, ratio: float) -> None:
    policy = RetryPolicy(base_ms=1000, max_attempts=11, jitter_ratio=ratio)
    nominal = policy.nominal_delay_ms(attempt)
    assert nominal <= policy.delay_ms(attempt, rand) <= nominal * (1 + ratio)


def test_jitter_spreads_the_waits() -> None:
    policy = RetryPolicy(base_ms=1000, max_attempts=4, jitter_ratio=0.5)
    assert policy.delay_ms(1, 0.0) == 1000
    assert policy.delay_ms(1, 0.99) == 1495


def test_a_longer_retry_after_wins() -> None:
    policy = RetryPolicy(base_ms=1000, max_attempts=4, jitter_ratio=0.0)
    assert policy.next_attempt_at(1, 0, 0.0, retry_after_ms=30_000) == 30_000
    assert policy.next_attempt_at(1, 0, 0.0, retry_after_ms=10) == 1000


def test_each_wait_goes_to_the_longest_step_that_fits() -> None:
    policy = RetryPolicy(base_ms=1000, max_attempts=4)
    assert policy.steps() == (1000, 2000, 4000)
    assert [policy.step_for(w) for w in (1000, 1099, 2150, 4400, 60_000, 10)] == [
        1000,
        1000,
        2000,
        4000,
        4000,
        1000,
    ]
    assert [format_step(s) for s in (1000, 30_000, 1500)] == ["1s", "30s", "1500ms"]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"base_ms": 0},
        {"max_attempts": 0},
        {"jitter_ratio": 1.5},
        {"base_ms": 10, "max_backoff_ms": 5},
    ],
)
def test_bad_policies_are_config_errors(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


# -- circuit breaker -------------------------------------------------------------------------------

OPTS = BreakerOptions(window=10, min_calls=4, failure_rate=0.5, open_ms=1000)


def test_the_circuit_opens_at_the_failure_rate() -> None:
    b = CircuitBreaker(OPTS)
    for ok in (True, False, True):
        assert b.use_primary(0)
        assert b.record(success=ok, now_ms=0) is None
    assert b.record(success=False, now_ms=5) is CircuitState.OPEN  # 2 of 4 failed
    assert not b.use_primary(10)


def test_no_decision_before_min_calls() -> None:
    b = CircuitBreaker(OPTS)
    for _ in range(3):
        b.record(success=False, now_ms=0)
    assert b.state is CircuitState.CLOSED
    assert b.record(success=False, now_ms=0) is CircuitState.OPEN


def test_a_healthy_primary_stays_closed() -> None:
    b = CircuitBreaker(OPTS)
    for i in range(100):
        b.record(success=i % 3 != 2, now_ms=i)  # a third fail: below the rate
    assert b.state is CircuitState.CLOSED


def test_one_probe_after_open_ms_and_its_success_closes() -> None:
    b = CircuitBreaker(OPTS)
    for _ in range(4):
        b.record(success=False, now_ms=100)
    assert not b.use_primary(1099)
    assert b.use_primary(1100)  # the probe
    assert b.state is CircuitState.HALF_OPEN
    assert not b.use_primary(1101)  # only one probe at a time
    assert b.record(success=True, now_ms=1150) is CircuitState.CLOSED
    assert b.use_primary(1151) and b.use_primary(1152)


def test_a_failed_probe_opens_again_for_open_ms() -> None:
    b = CircuitBreaker(OPTS)
    for _ in range(4):
        b.record(success=False, now_ms=0)
    assert b.use_primary(1000)
    assert b.record(success=False, now_ms=1200) is CircuitState.OPEN
    assert not b.use_primary(2100)
    assert b.use_primary(2200)


def test_outcomes_of_the_secondary_and_stale_calls_are_ignored() -> None:
    b = CircuitBreaker(OPTS)
    for _ in range(4):
        b.record(success=False, now_ms=0, primary=False)
    assert b.state is CircuitState.CLOSED
    for _ in range(4):
        b.record(success=False, now_ms=0)
    assert b.record(success=True, now_ms=1) is None  # started before it opened
    assert b.state is CircuitState.OPEN


# -- token bucket ----------------------------------------------------------------------------------


def test_burst_then_the_rate() -> None:
    bucket = TokenBucket(RateLimit(per_second=10, burst=3), now_s=0.0)
    waits = [bucket.reserve(0.0) for _ in range(5)]
    assert waits[:3] == [0.0, 0.0, 0.0]
    assert waits[3] == pytest.approx(0.1) and waits[4] == pytest.approx(0.2)
    assert bucket.reserve(10.0) == 0.0  # refilled, but never beyond the burst
    assert bucket.available(10.0) == pytest.approx(2.0)


@given(
    gaps=st.lists(st.floats(0.0, 0.3), min_size=1, max_size=60),
    rate=st.floats(1.0, 50.0),
    burst=st.integers(1, 5),
)
def test_no_window_ever_exceeds_burst_plus_rate(gaps: list[float], rate: float, burst: int) -> None:
    bucket = TokenBucket(RateLimit(per_second=rate, burst=burst), now_s=0.0)
    now, uses = 0.0, []
    for gap in gaps:
        now += gap
        uses.append(now + bucket.reserve(now))
    assert uses == sorted(uses)  # callers go in turn
    for i in range(len(uses)):
        for j in range(i, len(uses)):
            assert j - i + 1 <= burst + rate * (uses[j] - uses[i]) + 1e-6


# -- delay topics ----------------------------------------------------------------------------------

DELAYS = RetryPolicy(base_ms=1000, max_attempts=4, jitter_ratio=0.1, max_backoff_ms=4000)  # steps 1, 2, 4 s


def test_a_retry_within_its_topics_step_is_held_until_due() -> None:
    from senders.policy.delays import DelayAction, place_delayed

    d = place_delayed(not_before_ms=11_050, written_ms=10_000, step_ms=1000, now_ms=10_010, policy=DELAYS)
    assert (d.action, d.until_ms) == (DelayAction.HOLD, 11_050)
    d = place_delayed(not_before_ms=11_050, written_ms=10_000, step_ms=1000, now_ms=11_050, policy=DELAYS)
    assert d.action is DelayAction.DUE


def test_a_retry_due_past_its_topics_step_holds_only_that_long_then_moves_on() -> None:
    from senders.policy.delays import DelayAction, place_delayed

    # written to the 1 s topic but due 3.5 s later: held until 1.1 s after it was written
    d = place_delayed(not_before_ms=13_500, written_ms=10_000, step_ms=1000, now_ms=10_010, policy=DELAYS)
    assert (d.action, d.until_ms) == (DelayAction.HOLD, 11_100)
    d = place_delayed(not_before_ms=13_500, written_ms=10_000, step_ms=1000, now_ms=11_100, policy=DELAYS)
    assert (d.action, d.step_ms, d.not_before_ms) == (DelayAction.MOVE, 2000, 13_500)


def test_a_retry_due_in_2057_is_moved_with_its_due_time_cut_to_max_backoff() -> None:
    from senders.policy.delays import DelayAction, place_delayed

    d = place_delayed(not_before_ms=10**13, written_ms=0, step_ms=4000, now_ms=5000, policy=DELAYS)
    assert (d.action, d.step_ms, d.not_before_ms) == (DelayAction.MOVE, 4000, 9000)
    # where it lands it is held as one of that topic's own records: it moves no further
    again = place_delayed(not_before_ms=9000, written_ms=5000, step_ms=4000, now_ms=5001, policy=DELAYS)
    assert (again.action, again.until_ms) == (DelayAction.HOLD, 9000)


@given(
    wait=st.integers(0, 10**7),
    written=st.integers(0, 10**6),
    lag=st.integers(0, 10**6),
)
def test_no_record_holds_its_partition_past_its_topics_step(wait: int, written: int, lag: int) -> None:
    from senders.policy.delays import DelayAction, place_delayed

    step = DELAYS.step_for(wait)
    now = written + lag
    d = place_delayed(not_before_ms=written + wait, written_ms=written, step_ms=step, now_ms=now, policy=DELAYS)
    if d.action is DelayAction.HOLD:
        assert d.until_ms <= written + step * 1.1 + 1
    if d.action is DelayAction.MOVE:
        assert now < d.not_before_ms <= now + DELAYS.max_backoff_ms


# -- restarts and identities -----------------------------------------------------------------------


def test_restarts_back_off_doubling_and_a_healthy_run_resets_them() -> None:
    from senders.policy.restarts import RestartPolicy

    p = RestartPolicy(initial_ms=100, max_ms=1000)
    assert [p.delay_ms(n) for n in (1, 2, 3, 4, 5, 60)] == [100, 200, 400, 800, 1000, 1000]
    assert p.failures_after(4, ran_ms=50) == 5
    assert p.failures_after(4, ran_ms=1000) == 1


def test_three_fences_within_the_window_are_a_fencing_loop() -> None:
    from senders.policy.restarts import FenceWatch, RestartPolicy

    watch = FenceWatch(RestartPolicy(fences=3, fence_window_ms=1000))
    assert not watch.fenced(0) and not watch.fenced(2000) and not watch.fenced(2500)  # a zombie now and then
    assert watch.fenced(2900)  # three within a second: another live process


def test_who_is_in_the_way_of_an_instance_id() -> None:
    from senders.store.instances import ProcessEntry, in_the_way

    other = ProcessEntry("i1", "h-other", "host-a", 42, heartbeat_ms=10_000)

    def way(entries: list[ProcessEntry], *, instance_id: str = "i1", host: str = "host-a", now: int = 12_000,
            exclusive: bool = False, alive: bool = True) -> ProcessEntry | None:
        return in_the_way(entries, instance_id=instance_id, holder="me", host=host, now_ms=now, ttl_ms=5000,
                          exclusive=exclusive, alive_here=lambda pid: alive)

    assert way([other]) == other  # live, same id
    assert way([other], alive=False) is None  # its pid is gone on this host
    assert way([other], host="host-b", alive=False) == other  # another host: its heartbeat decides
    assert way([other], now=15_001) is None  # lapsed
    assert way([other], instance_id="i2") is None  # another id, on a shared store
    assert way([other], instance_id="i2", exclusive=True) == other  # SQLite: one process


def test_permanent_rejections_across_addresses_open_the_circuit_and_say_so() -> None:
    b = CircuitBreaker(OPTS)
    for n in range(3):
        assert b.record(success=False, now_ms=0, rejected=f"a{n}") is None
    assert b.record(success=False, now_ms=0, rejected="a3") is CircuitState.OPEN
    assert b.rejecting  # the alert: messages to four addresses were rejected, not retried
    assert b.use_primary(1000) and b.record(success=True, now_ms=1000) is CircuitState.CLOSED
    assert not b.rejecting


def test_one_address_rejected_again_and_again_says_nothing_of_the_provider() -> None:
    b = CircuitBreaker(OPTS)
    for _ in range(20):
        b.record(success=False, now_ms=0, rejected="the-same-address")
        b.record(success=True, now_ms=0)
    assert b.state is CircuitState.CLOSED and not b.rejecting


def test_transient_failures_open_the_circuit_without_the_rejection_alert() -> None:
    b = CircuitBreaker(OPTS)
    for _ in range(4):
        b.record(success=False, now_ms=0)
    assert b.state is CircuitState.OPEN and not b.rejecting
