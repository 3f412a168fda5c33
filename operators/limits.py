"""The job's input limits (``dedup.max_*``) in Python, for producers that check a request before
writing it: the HTTP API refuses what the job would send to ``notifications.invalid``.

The job checks them in the JVM (``connector/.../RequestParser.java``) on the encoded record; the
reasons here are the same words, so a caller reads what the invalid topic would have said.
"""

from __future__ import annotations

from dataclasses import dataclass

from operators.records import NotificationRequest

#: the request fields bounded by ``max_field_bytes`` (the JVM's list)
LIMITED_FIELDS = ("dedup_key", "notification_id", "user_id", "template_id")


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """:param max_record_bytes: a serialized request's size
    :param max_field_bytes: each of ``LIMITED_FIELDS`` in UTF-8 bytes
    :param max_params: entries of params
    :param max_param_bytes: a params key or value in UTF-8 bytes
    :param max_future_ms: how far ahead of the wall clock an event time may be"""

    max_record_bytes: int
    max_field_bytes: int
    max_params: int
    max_param_bytes: int
    max_future_ms: int


def _utf8(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def field_problem(name: str, value: str | None, limits: RequestLimits) -> str | None:
    """Why one bounded field is over its limit, or None."""
    if value is None:
        return None
    size = _utf8(value)
    if size > limits.max_field_bytes:
        return f"{name} of {size} bytes is over the limit of {limits.max_field_bytes} bytes (dedup.max_field_bytes)"
    return None


def params_problem(params: dict[str, str], limits: RequestLimits) -> str | None:
    if len(params) > limits.max_params:
        return f"params has {len(params)} entries, more than the limit of {limits.max_params} (dedup.max_params)"
    for key, value in params.items():
        size = max(_utf8(key), _utf8(value))
        if size > limits.max_param_bytes:
            return (
                f"a params entry of {size} bytes is over the limit of {limits.max_param_bytes} bytes"
                " (dedup.max_param_bytes)"
            )
    return None


def request_problem(request: NotificationRequest, encoded: bytes, limits: RequestLimits, now_ms: int) -> str | None:
    """Why the job would refuse this request (its encoded bytes), judged at ``now_ms``; None when
    it would take it. The order is the job's: size, fields, params, event time."""
    if len(encoded) > limits.max_record_bytes:
        return (
            f"record of {len(encoded)} bytes is over the limit of {limits.max_record_bytes} bytes"
            " (dedup.max_record_bytes)"
        )
    for name in LIMITED_FIELDS:
        problem = field_problem(name, getattr(request, name), limits)
        if problem:
            return problem
    problem = params_problem(request.params, limits)
    if problem:
        return problem
    ahead = request.event_time - now_ms
    if ahead > limits.max_future_ms:
        return (
            f"event_time {request.event_time} is {ahead} ms ahead of the clock, more than the"
            f" {limits.max_future_ms} ms allowed (dedup.max_future_ms)"
        )
    return None
