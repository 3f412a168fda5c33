"""``POST /v1/notifications``: a caller's notification, in its own key space.

The Idempotency-Key is kept as ``<caller>/<key>`` and is also the dedup key the job sees, so no
caller can collide with, suppress or read another's notifications. A caller granted a shared
namespace may send ``Dedup-Namespace: <namespace>``: its dedup key is then ``ns:<namespace>/<key>``
(which no caller's space can produce), so two sources of one business event that share the
namespace are deduplicated by the job; each one's Idempotency-Key stays its own.

A repeat (the same key and body) gets the first answer with 200, whatever the completion batch
is doing; while another request (of this or another API process) is writing the key, the repeat
waits for its answer (``api.pending_wait_ms``, polling the store) and only then says 409.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Annotated, Any

from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from api.accept import Reach, accept, channels_now, check_key, fingerprint, header_text, unknown_user
from api.asgi import AsgiScope, Send, header, respond, send_json
from api.callers import Caller, name_problem, shared_key
from api.docs import V1, errors
from api.errors import INVALID_TEXT, STORE_UNAVAILABLE, ApiError, bad_request, forbidden, invalid_body, problems
from api.idempotency import Reservation, Reserve, Reserved
from api.models import NotificationAccepted, NotificationIn
from api.producer import NotAcknowledged
from api.services import Services, services
from api.store import RequestRecord
from api.users import check_user
from operators.tracing import CALLER, NOTIFICATION_ID, unsampled
from senders.errors import StoreUnavailableError

logger = logging.getLogger(__name__)
router = APIRouter()

ROUTE = "/v1/notifications"
NAMESPACE_HEADER = "Dedup-Namespace"
_FIRST_POLL_S = 0.005
_MAX_POLL_S = 0.05


def _now_ms() -> int:
    return int(time.time() * 1000)


def new_notification_id(now_ms: int) -> str:
    """``n_``, the time (ms, 12 hex digits) and 80 random bits: ids in the order they were made,
    so each goes at the end of the request table's key index, where a random one went into a
    random page of it (one more page in each round's transaction, and in the WAL). The store
    writer's CPU per request, the API alone at 2,000/s (``python -m bench.api --rate 2000
    --seconds 20 --processes 2 --connections 256 --users 20000``, interleaved): 0.139 and 0.137 ms
    with these, 0.160 and 0.165 with random ids."""
    return f"n_{now_ms:012x}{os.urandom(10).hex()}"


def kafka_unavailable(why: str) -> ApiError:
    return ApiError(503, "kafka_unavailable", f"{why}; retry with the same Idempotency-Key",
                    headers={"Retry-After": "1"})


def dedup_space(caller: Caller, namespace: str | None) -> str:
    """The prefix of the request's dedup key: the caller's own space, or a shared namespace it
    was granted."""
    if namespace is None:
        return caller.key_space("")
    problem = name_problem(namespace, f"{NAMESPACE_HEADER}")
    if problem:
        raise bad_request(problem, code="invalid_namespace")
    if namespace not in caller.namespaces:
        raise forbidden(f"caller {caller.name} may not send in the dedup namespace {namespace}")
    return shared_key(namespace, "")


@router.post(
    ROUTE,
    status_code=202,
    response_model=NotificationAccepted,
    responses={200: {"model": NotificationAccepted, "description": "the same request again: the first answer"},
               **errors(*V1, 403, 404, 409, 422, 429)},
    summary="Queue a notification",
)
async def post_notification(
    body: NotificationIn,
    request: Request,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", examples=["evt-2"], description=(
        "the caller's key of this request (UTF-8): the same key and body again gets the first answer"))] = None,
    dedup_namespace: Annotated[str | None, Header(alias=NAMESPACE_HEADER, description=(
        "a shared dedup namespace the caller was granted: the dedup key is then ns:<namespace>/<key>"))] = None,
    traceparent: Annotated[str | None, Header(description=(
        "W3C trace context of the caller's span: the notification's trace continues it (traces on)"))] = None,
) -> Any:
    # the route as the OpenAPI document shows it; the gate serves it by ``serve`` (below): the same
    # ``notify`` without the framework's routing, dependencies and response classes
    status, answer = await notify(services(request), request.state.caller, body, idempotency_key, dedup_namespace,
                                  traceparent)
    return JSONResponse(answer, status_code=status)


async def serve(scope: AsgiScope, body: bytes, send: Send, s: Services) -> None:
    """``POST /v1/notifications`` as plain ASGI, for the gate, which has already admitted the
    caller (``scope["state"]["caller"]``) and read the body: the body validated as the route's
    model (400 as the app answers an invalid body), then ``notify``; an ApiError is its JSON
    answer. Headers as the server hands them over (latin-1, byte for byte)."""
    try:
        status, answer = await notify(s, scope["state"]["caller"], parse_body(scope, body),
                                      header(scope, b"idempotency-key"), header(scope, b"dedup-namespace"),
                                      header(scope, b"traceparent"))
    except ApiError as error:
        await respond(send, error)
        return
    except StoreUnavailableError as exc:
        logger.warning("the store did not answer: %s", exc)
        s.metrics.unavailable.labels("store_unavailable").inc()
        await respond(send, STORE_UNAVAILABLE)
        return
    except UnicodeEncodeError:
        await respond(send, INVALID_TEXT)
        return
    await send_json(send, status, answer)


def parse_body(scope: AsgiScope, body: bytes) -> NotificationIn:
    """The body as the route's model; 400 ``invalid_request`` as the app answers a body that is
    not one (not JSON by its Content-Type, not JSON, or not the model)."""
    content_type = header(scope, b"content-type")
    if content_type is not None:
        media = content_type.split(";", 1)[0].strip().lower()
        if not (media == "application/json" or (media.startswith("application/") and media.endswith("+json"))):
            raise invalid_body(["body: the body must be JSON (Content-Type: application/json)"])
    try:
        return NotificationIn.model_validate_json(body)
    except ValidationError as exc:
        raise invalid_body(problems(exc.errors())) from None


async def notify(
    s: Services,
    caller: Caller,
    body: NotificationIn,
    idempotency_key: str | None,
    dedup_namespace: str | None,
    traceparent: str | None = None,
) -> tuple[int, dict[str, Any]]:
    """A notification of ``caller``: (202, the answer) once Kafka has it, or (200, the first
    answer) for a repeat; raises ApiError (400, 403, 404, 409, 422, 503). With traces on, in a
    span of its own (a child of the caller's ``traceparent``), whose context the request record
    carries on to the job and the senders."""
    if not s.tracing.on:
        return await _notify(s, caller, body, idempotency_key, dedup_namespace)
    if unsampled(traceparent):
        # the caller's trace is not kept: its context goes on in the record as it came, no span
        return await _notify(s, caller, body, idempotency_key, dedup_namespace, traceparent)
    with s.tracing.span(f"POST {ROUTE}", parent=traceparent, kind="server",
                        attributes={CALLER: caller.name, "http.route": ROUTE}) as span:
        assert span is not None
        try:
            status, answer = await _notify(s, caller, body, idempotency_key, dedup_namespace, s.tracing.traceparent())
        except ApiError as error:
            span.set_attribute("http.response.status_code", error.status)
            raise
        span.set_attribute("http.response.status_code", status)
        span.set_attribute(NOTIFICATION_ID, answer["id"])
        return status, answer


async def _notify(
    s: Services,
    caller: Caller,
    body: NotificationIn,
    idempotency_key: str | None,
    dedup_namespace: str | None,
    traceparent: str | None = None,
) -> tuple[int, dict[str, Any]]:
    namespace = header_text(dedup_namespace, NAMESPACE_HEADER, "invalid_namespace")
    space = dedup_space(caller, namespace)
    raw = header_text(idempotency_key, "Idempotency-Key", "invalid_idempotency_key")
    longest = max(caller.key_space(""), space, key=lambda p: len(p.encode("utf-8")))
    key = check_key(raw, s.limits, longest)
    check_user(s, body.user_id)
    idem_key, dedup_key = caller.key_space(key), space + key
    now = _now_ms()
    notification_id = new_notification_id(now)
    accepted = accept(body, caller=caller, catalog=s.catalog, limits=s.limits, dedup_key=dedup_key,
                      notification_id=notification_id, now_ms=now, traceparent=traceparent)
    fp = fingerprint(caller, body, namespace)
    reserved, reach = await _reserve(s, idem_key, fp, notification_id, body.user_id)
    if reserved.outcome is Reservation.REPLAY:
        s.metrics.repeats.labels("replay").inc()
        assert reserved.answer is not None
        return 200, reserved.answer
    if reserved.outcome is Reservation.OTHER_BODY:
        s.metrics.repeats.labels("other_body").inc()
        raise ApiError(422, "idempotency_key_reused", "this Idempotency-Key was used with another request")
    assert reach is not None
    if not reach.exists:
        raise unknown_user(body.user_id)
    down = s.producer.unavailable()
    if down is not None:
        s.writer.release(idem_key, notification_id)
        s.metrics.unavailable.labels("kafka_down").inc()
        raise kafka_unavailable(down)
    req = accepted.request
    try:
        written = await s.producer.write(s.cfg.topics.requests, req.user_id.encode("utf-8"), accepted.encoded)
    except NotAcknowledged as exc:
        logger.warning("a notification was not written: %s", exc.reason)
        s.writer.release(idem_key, notification_id)
        s.metrics.unavailable.labels("kafka_no_ack").inc()
        raise kafka_unavailable("Kafka did not acknowledge the request in time") from None
    queued, skipped = channels_now(reach, req.channels, accepted.kind, accepted.allow_unverified)
    answer = {"id": notification_id, "dedup_key": dedup_key, "queued": queued, "skipped": skipped,
              "status_url": f"/v1/notifications/{notification_id}"}
    record = RequestRecord(notification_id, dedup_key, req.user_id, req.template_id,
                           tuple(c.value for c in req.channels), req.priority.value, caller.name, req.event_time, now,
                           written.partition, written.offset)
    s.writer.complete(idem_key, answer, record)  # stored in the writer's next round (api.writer)
    return 202, answer


async def _reserve(
    s: Services, idem_key: str, fp: str, notification_id: str, user_id: str
) -> tuple[Reserved, Reach | None]:
    """The key reserved for this request (NEW, with what the user's profile says), or the first answer
    (REPLAY), or OTHER_BODY: in the store writer's next round, with the requests of the same
    moment. A key being written (IN_PROGRESS) is waited for: its answer from this process's
    writer, or from the store once it is done there (another process, or this one's round that
    stored it meanwhile); a key released by a failed write is taken."""
    api = s.cfg.api
    deadline = time.monotonic() + api.pending_wait_ms / 1000
    pause = _FIRST_POLL_S
    while True:
        reserved, reach = await s.writer.reserve(Reserve(idem_key, fp, notification_id, user_id))
        if reserved.outcome is not Reservation.IN_PROGRESS:
            return reserved, reach
        held = s.writer.answer_of(idem_key)
        if held is not None:
            return Reserved(Reservation.REPLAY, held), None
        if time.monotonic() + pause > deadline:
            s.metrics.repeats.labels("in_progress").inc()
            raise ApiError(409, "in_progress", "a request with this Idempotency-Key is still being written; retry",
                           headers={"Retry-After": "1"})
        await asyncio.sleep(pause)
        pause = min(pause * 2, _MAX_POLL_S)
