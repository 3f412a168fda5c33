"""Bad input at volume: thousands of fuzzed and schema-violating records in a valid stream.

Every one lands in notifications.invalid with its bytes and position, the job never restarts
because of them, and the valid output is exactly the reference model's.
"""

from __future__ import annotations

import random
import time

import pytest

from harness.reference import diff_records, expected_records, run
from operators import codec
from operators.errors import InvalidRecordError
from operators.records import Channel, NotificationRequest
from operators.window import NO_WATERMARK, WindowConfig
from ops.flink_rest import RestClient
from tests.jobs.helpers import produce, read_outputs, wait_for_total

pytestmark = pytest.mark.integration

BASE = 1_796_115_600_000


def is_invalid(raw: bytes) -> bool:
    try:
        codec.decode_request(raw)
    except InvalidRecordError:
        return True
    return False


def fuzzed(rng: random.Random, valid: list[bytes]) -> bytes:
    kind = rng.randrange(5)
    if kind == 0:
        return rng.randbytes(rng.randint(0, 300))
    base = bytearray(rng.choice(valid))
    if kind == 1:  # flipped bits
        for _ in range(rng.randint(1, 4)):
            base[rng.randrange(len(base))] ^= 1 << rng.randrange(8)
        return bytes(base)
    if kind == 2:  # truncated
        return bytes(base[: rng.randrange(len(base))])
    if kind == 3:  # trailing garbage
        return bytes(base) + rng.randbytes(rng.randint(1, 20))
    fields = codec.decode("notification_request", bytes(base))  # contract violations in valid Avro
    field = rng.choice(["notification_id", "user_id", "template_id", "channels"])
    fields[field] = [] if field == "channels" else ""
    return codec.encode("notification_request", fields)


def test_fuzzed_input_goes_to_invalid_and_valid_output_is_exact(
    kafka_bootstrap, topic_factory, settings_factory, job_factory
):
    rng = random.Random(5)
    topics = topic_factory(partitions=2)
    cfg = settings_factory(topics, parallelism=2)
    job = job_factory(cfg)
    reqs = [
        NotificationRequest(
            notification_id=f"n-{i}", user_id=f"u-{i % 300}", template_id="t", params={"i": str(i % 150)},
            channels=(Channel.SMS,), event_time=BASE + i * 100,
        )
        for i in range(1000)
    ]
    valid = [codec.encode_request(r) for r in reqs]
    stream: list[tuple[bytes | None, bytes, int]] = []
    bad: list[bytes] = []
    offsets = [0, 0]
    expected_invalid = []
    vi = 0
    while vi < len(reqs) or len(bad) < 3000:
        if len(bad) < 3000 and (vi >= len(reqs) or rng.random() < 0.75):
            raw = fuzzed(rng, valid)
            if not is_invalid(raw):
                continue  # a mutation that is still a valid request is not bad input
            bad.append(raw)
            partition, key = rng.randrange(2), None
            expected_invalid.append({"raw": raw, "topic": topics.requests, "partition": partition,
                                     "offset": offsets[partition]})
        else:
            req = reqs[vi]
            partition, key, raw = int(req.user_id[2:]) % 2, req.user_id.encode(), valid[vi]
            vi += 1
        stream.append((key, raw, partition))
        offsets[partition] += 1
    produce(kafka_bootstrap, topics.requests, stream)

    expected = expected_records(run([(r, NO_WATERMARK) for r in reqs], WindowConfig()), topics)
    total = sum(len(v) for v in expected.values()) + len(bad)
    wait_for_total(kafka_bootstrap, topics, total, timeout_s=240)
    time.sleep(3)
    out = read_outputs(kafka_bootstrap, topics)

    actual = {t: [v for _, v in recs] for t, recs in out.items()}
    invalid = actual.pop(topics.invalid)
    assert all(v["error"] for v in invalid)
    stripped = [{k: v[k] for k in ("raw", "topic", "partition", "offset")} for v in invalid]
    assert diff_records({topics.invalid: expected_invalid}, {topics.invalid: stripped}, topics) == []
    expected.pop(topics.invalid)
    assert diff_records(expected, actual, topics) == []
    assert len(actual[topics.duplicates]) > 0

    rest = RestClient(f"http://127.0.0.1:{cfg.flink.rest_port}")
    deadline = time.monotonic() + 30  # the REST metric fetcher refreshes every 10 s
    metrics = []
    while not metrics and time.monotonic() < deadline:
        metrics = rest.call("GET", f"/jobs/{job.get_job_id()}/metrics?get=numRestarts")
        time.sleep(1)
    assert metrics == [{"id": "numRestarts", "value": "0"}]
