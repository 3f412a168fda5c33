"""A sender worker: one consumer (read_committed) on a channel topic and its delay topics, one
transactional producer, up to ``max_in_flight`` provider calls open at once on the process's
event loop.

Three coroutines share a ``Ledger``: the control loop (consume, commit), the claimer (claims
batches of the records whose turn it is, then starts their calls) and the finisher (records the
calls' outcomes in batches). The blocking work runs on the worker's own threads: one for the
consumer, one for the producer, one for the status store (its one connection).

Every ``commit_interval_ms`` one Kafka transaction carries the status, retry and dead-letter
records of every finished record, and per partition the offset after its contiguous prefix of
finished records. Only after it commits are the outcomes marked published in the store. A
retry that is not due yet holds its partition: the consumer seeks back to it and pauses that
partition until the retry's time, while every other partition goes on.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from senders.errors import SenderError, StoreUnavailableError, TransactionStuckError
from senders.policy.leases import RECORD_MARGIN_MS
from senders.policy.transitions import AttemptResult
from senders.records import Delivery
from senders.runtime.handler import DeliveryHandler, Handled, SendJob
from senders.runtime.ledger import TP, CommitPlan, Entry, Ledger, Stage
from senders.runtime.metrics import Metrics
from senders.runtime.threads import DaemonThreadExecutor, name_os_thread
from senders.statuses import AttemptOutcome, Lane
from senders.store.batches import release_many

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: a record claimed by another worker (its lease live) is tried again this often
WAIT_POLL_S = 0.25
#: the most rate-limit tokens a worker's claims reserve ahead, in seconds of the provider's rate
CLAIM_AHEAD_S = 0.1


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    """How a worker talks to Kafka and how much it keeps open.

    :param group_id: its consumer group (one per channel and lane)
    :param transactional_id: its producer's transactional id (unique among live workers)
    :param source_topic: the channel topic (a lane of one channel)
    :param delay_topics: that topic's delay topics: name -> delay step (ms)
    :param batch_size: records per poll
    :param poll_timeout_s: longest wait for records
    :param session_timeout_ms: consumer session timeout
    :param transaction_timeout_ms: producer transaction timeout
    :param lag_interval_s: how often consumer lag is measured
    :param kafka_timeout_s: the longest wait on the broker (init_transactions, metadata, a
        commit) before ``run`` gives up with an exception
    :param max_in_flight: messages claimed for a call whose outcome is not recorded yet (the
        calls open, and those answered but not yet recorded): what a crash can leave to repeat
    :param claim_batch: the most records claimed (or outcomes recorded) in one store transaction
    :param buffered_records: records held beyond the open calls before the consumer pauses
    :param commit_interval_s: how often finished records are committed
    """

    group_id: str
    transactional_id: str
    source_topic: str
    delay_topics: Mapping[str, int]
    batch_size: int = 200
    poll_timeout_s: float = 0.1
    session_timeout_ms: int = 45_000
    transaction_timeout_ms: int = 60_000
    lag_interval_s: float = 1.0
    kafka_timeout_s: float = 30.0
    max_in_flight: int = 400
    claim_batch: int = 200
    buffered_records: int = 2_000
    commit_interval_s: float = 0.1


def _position(msg: Message) -> tuple[str, int, int]:
    topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
    assert topic is not None and partition is not None and offset is not None  # a record, not an error
    return topic, partition, offset


def _abort_quietly(producer: Producer) -> None:
    """Abort an open transaction on the way out, so that read_committed readers need not wait
    for the broker's transaction timeout; a fatal producer cannot, and the broker will."""
    try:
        producer.abort_transaction(5)
    except KafkaException:
        logger.debug("abort_transaction failed", exc_info=True)


def _bytes(raw: str | bytes | None) -> bytes | None:
    return raw.encode() if isinstance(raw, str) else raw


def _leaf(exc: BaseException) -> BaseException:
    """The first real failure inside a task group's exception group."""
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


class _Run:
    """One run's state, on the event loop."""

    def __init__(self) -> None:
        self.ledger = Ledger()
        #: messages claimed to be sent whose outcomes are not recorded yet (a dropped entry's too):
        #: at most ``max_in_flight``, so a crash leaves no more in the window
        self.in_flight = 0
        self.calls = 0  # provider calls open
        self.claiming = 0
        self.recording = 0
        self.finished: list[tuple[Entry, SendJob, AttemptResult]] = []
        self.claim_wake = asyncio.Event()
        self.finish_wake = asyncio.Event()
        self.stopping = False
        self.failure: BaseException | None = None
        self.events: list[tuple[str, list[TopicPartition]]] = []  # rebalances, from the consumer thread

    def busy(self) -> bool:
        return bool(self.in_flight or self.claiming or self.recording or self.finished)


class SenderWorker:
    def __init__(
        self,
        *,
        name: str,
        client_config: Mapping[str, str],
        options: WorkerOptions,
        handler: DeliveryHandler,
        metrics: Metrics,
    ) -> None:
        self.name = name
        self.options = options
        self.handler = handler
        self.metrics = metrics
        self.ready = threading.Event()  # set once partitions are assigned
        self._client_config = dict(client_config)
        self._delay = set(options.delay_topics)
        self._holds: dict[TP, tuple[int, int]] = {}  # partition -> (offset to resume at, until ms)
        self._assigned: list[TopicPartition] = []
        self._unpause: list[TopicPartition] = []
        self._paused_all = False
        self._labels = {"channel": handler.channel.value, "lane": handler.lane.value}
        self._next_lag = 0.0
        self._run: _Run | None = None
        self._threads: dict[str, Executor] = {}
        #: makes the transactional producer (a test replaces it to inject broker errors)
        self.producer_factory: Callable[[dict[str, str]], Producer] = Producer

    # -- threads ----------------------------------------------------------------------------------

    async def _on(self, thread: str, fn: Callable[..., T], *args: Any) -> T:
        """Run blocking work on one of the worker's threads (kafka, txn, store)."""
        return await asyncio.get_running_loop().run_in_executor(self._threads[thread], fn, *args)

    # -- lifecycle --------------------------------------------------------------------------------

    async def run(self, stop: threading.Event) -> None:
        """Consume until ``stop``, then finish the calls in flight and commit; raises on a failure
        (broker or store unreachable, producer fenced) once the calls in flight have finished and
        their outcomes are recorded, after which a new ``run`` starts over from the committed
        offsets."""
        o = self.options
        self._holds, self._assigned, self._unpause, self._paused_all = {}, [], [], False
        self._threads = {
            name: ThreadPoolExecutor(
                1, thread_name_prefix=f"{self.name}-{name}", initializer=name_os_thread, initargs=(f"snd-{name}",)
            )
            for name in ("kafka", "store")
        }
        # the producer's: a transaction stuck past its bound is left on it (_commit)
        self._threads["txn"] = DaemonThreadExecutor(f"{self.name}-txn", "snd-txn")
        run = self._run = _Run()
        consumer: Consumer | None = None
        try:
            consumer = await self._on("kafka", self._consumer)
            producer = await self._on("txn", self._producer)
            await self._on("kafka", self._subscribe, consumer, run)
            logger.info("%s consuming %s (group %s)", self.name, o.source_topic, o.group_id)
            self.metrics.set("sender_worker_up", 1, **self._labels)
            try:
                async with asyncio.TaskGroup() as tasks:
                    tasks.create_task(self._claimer(run, tasks))
                    tasks.create_task(self._finisher(run))
                    await self._control(run, consumer, producer, stop)
            except BaseExceptionGroup as group:
                raise _leaf(group) from None
        finally:
            self.ready.clear()
            if consumer is not None:
                try:
                    await self._on("kafka", consumer.close)
                except (KafkaException, RuntimeError):
                    logger.debug("%s: consumer close failed", self.name, exc_info=True)
            for pool in self._threads.values():
                pool.shutdown(wait=False)
            logger.info("%s stopped", self.name)

    def _consumer(self) -> Consumer:
        o = self.options
        return Consumer(
            {
                **self._client_config,
                "group.id": o.group_id,
                "isolation.level": "read_committed",
                "enable.auto.commit": "false",
                "auto.offset.reset": "earliest",
                "session.timeout.ms": str(o.session_timeout_ms),
                "fetch.wait.max.ms": "100",
            }
        )

    def _producer(self) -> Producer:
        o = self.options
        producer = self.producer_factory(
            {
                **self._client_config,
                "transactional.id": o.transactional_id,
                "transaction.timeout.ms": str(o.transaction_timeout_ms),
                "linger.ms": "5",
            }
        )
        producer.init_transactions(o.kafka_timeout_s)
        return producer

    def _subscribe(self, consumer: Consumer, run: _Run) -> None:
        o = self.options
        self._await_topics(consumer, [o.source_topic, *o.delay_topics], o.kafka_timeout_s)

        def on_assign(c: Consumer, partitions: list[TopicPartition]) -> None:
            self._on_assign(c, partitions)
            run.events.append(("assign", list(partitions)))

        def on_revoke(c: Consumer, partitions: list[TopicPartition]) -> None:
            self._on_revoke(c, partitions)
            run.events.append(("revoke", list(partitions)))

        topics = [o.source_topic, *o.delay_topics]
        consumer.subscribe(topics, on_assign=on_assign, on_revoke=on_revoke, on_lost=on_revoke)

    def _await_topics(self, consumer: Consumer, names: list[str], timeout_s: float = 30.0) -> None:
        """Subscribe only once every topic is in the metadata: a topic that appears later would
        be picked up only at the next metadata refresh (minutes), and its retries would wait."""
        deadline = time.monotonic() + timeout_s
        while True:
            topics = consumer.list_topics(timeout=max(1.0, min(10.0, timeout_s))).topics
            missing = [
                n for n in names if n not in topics or topics[n].error is not None or not topics[n].partitions
            ]
            if not missing:
                return
            if time.monotonic() > deadline:
                raise SenderError(
                    f"{self.name}: no such topic(s) {missing}; `dedupctl senders topics` creates them"
                )
            time.sleep(0.2)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._assigned = list(partitions)
        self._unpause = list(partitions)
        self._paused_all = False
        self._holds = {
            tp: h for tp, h in self._holds.items() if any((p.topic, p.partition) == tp for p in partitions)
        }
        logger.info("%s assigned %d partitions", self.name, len(partitions))
        self.ready.set()

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        gone = {(p.topic, p.partition) for p in partitions}
        self._holds = {tp: h for tp, h in self._holds.items() if tp not in gone}
        self._assigned = [p for p in self._assigned if (p.topic, p.partition) not in gone]

    # -- the control loop: consume, commit ------------------------------------------------------

    async def _control(self, run: _Run, consumer: Consumer, producer: Producer, stop: threading.Event) -> None:
        o = self.options
        next_commit = time.monotonic() + o.commit_interval_s
        while True:
            if (stop.is_set() or run.failure is not None) and not run.stopping:
                run.stopping = True
                run.claim_wake.set()
                run.finish_wake.set()
            if run.stopping:
                if not run.busy():
                    break
                await asyncio.sleep(0.01)
            else:
                full = len(run.ledger) >= o.buffered_records + o.max_in_flight
                entries = await self._on("kafka", self._poll, consumer, full)
                self._rebalanced(run)
                for entry in entries:
                    run.ledger.add(entry)
                if entries:
                    run.claim_wake.set()
                if time.monotonic() >= self._next_lag:
                    await self._on("kafka", self._measure_lag, consumer)
                    logger.debug(
                        "%s: %d records held, %d ready, %d calls open, %d claiming, %d to record",
                        self.name, len(run.ledger), run.ledger.ready, run.in_flight, run.claiming,
                        len(run.finished) + run.recording,
                    )
                if self.handler.housekeeping_due():
                    await self._on("store", self.handler.housekeeping)
            if time.monotonic() >= next_commit:
                next_commit = time.monotonic() + o.commit_interval_s
                await self._commit(run, consumer, producer)
        if run.failure is not None:
            raise run.failure
        await self._commit(run, consumer, producer)  # what finished while stopping

    def _poll(self, consumer: Consumer, full: bool) -> list[Entry]:
        """On the consumer's thread: a batch of records, as entries (those that need no claim
        already finished: undecodable, not due and moved on); a record not due yet holds its
        partition."""
        if self._unpause:
            # holds end with the assignment; make sure no pause outlives it either
            consumer.resume(self._unpause)
            self._unpause = []
        if full and not self._paused_all and self._assigned:
            consumer.pause(self._assigned)
            self._paused_all = True
        elif not full and self._paused_all:
            held = set(self._holds)
            consumer.resume([p for p in self._assigned if (p.topic, p.partition) not in held])
            self._paused_all = False
        self._resume_due(consumer)
        batch = consumer.consume(num_messages=self.options.batch_size, timeout=self._poll_timeout())
        entries: list[Entry] = []
        for msg in batch:
            err = msg.error()
            if err is not None:
                if err.fatal():
                    raise KafkaException(err)
                if err.code() != KafkaError._PARTITION_EOF:
                    logger.warning("%s consumer error: %s", self.name, err)
                continue
            topic, partition, offset = _position(msg)
            tp = (topic, partition)
            if tp in self._holds:
                continue  # fetched before the partition was held: it comes again on resume
            written = msg.timestamp()[1]
            first = self.handler.decode(
                topic=topic,
                partition=partition,
                offset=offset,
                key=_bytes(msg.key()),
                value=_bytes(msg.value()),
                delay_step_ms=self.options.delay_topics.get(topic),
                written_ms=written,
            )
            if isinstance(first, Handled) and first.hold_until_ms is not None:
                self._hold(consumer, topic, partition, offset, first.hold_until_ms)
                continue
            if isinstance(first, Delivery):
                entries.append(Entry(tp, offset, written, first))
            else:
                entries.append(Entry(tp, offset, written, None, Stage.DONE, first.outputs, first.published))
        return entries

    def _rebalanced(self, run: _Run) -> None:
        """Revoked partitions leave the ledger: their finished records are not committed by this
        worker (their outcomes are in the store, unpublished: the next owner publishes them);
        calls still open finish, and the next owner's claim waits for their leases."""
        events, run.events = run.events, []
        for kind, partitions in events:
            if kind == "revoke":
                gone = run.ledger.drop([(p.topic, p.partition) for p in partitions])
                if gone:
                    logger.info("%s: %d records of revoked partitions dropped", self.name, len(gone))

    async def _commit(self, run: _Run, consumer: Consumer, producer: Producer) -> None:
        plan = run.ledger.commit_plan()
        oldest = run.ledger.oldest_waiting_ms([self.options.source_topic])
        age = 0.0 if oldest is None else max(0.0, time.time() - oldest / 1000)
        self.metrics.set("sender_oldest_waiting_age_seconds", age, **self._labels)
        if not plan:
            return
        bound = self._transaction_bound_s()
        try:
            committed = await asyncio.wait_for(self._on("txn", self._transact, consumer, producer, plan), bound)
        except TimeoutError:
            raise TransactionStuckError(
                f"{self.name}: a transaction did not finish within {bound:.0f} s; its producer is left behind"
                " and the worker starts over with new clients (librdkafka's send_offsets_to_transaction can"
                " outlive its timeout when the group coordinator's broker dies: librdkafka issues 5456, 5511)"
            ) from None
        if committed:
            published = run.ledger.committed(plan)
            # only now: after an abort the rows must still say "unpublished", so that the
            # redelivered records produce these outcomes again instead of being skipped
            try:
                await self._on("store", self.handler.store.mark_published, published)
            except StoreUnavailableError as exc:
                # committed in Kafka all the same; a replay of these records would republish them
                logger.warning("%s: could not mark %d outcomes published: %s", self.name, len(published), exc)
            return
        # aborted: every partition starts again from its committed offset; what finished comes
        # back and is republished from the store, what is in flight waits for its lease
        gone = run.ledger.drop()
        logger.warning(
            "%s transaction aborted: rewinding to the committed offsets (%d records again)", self.name, len(gone)
        )
        await self._on("kafka", self._rewind, consumer)

    def _transaction_bound_s(self) -> float:
        """The longest a transaction may take on the producer's thread: its offsets and its commit
        are each bounded by ``kafka_timeout_s``, with a half more for the records' produce."""
        return 2.5 * self.options.kafka_timeout_s

    def _transact(self, consumer: Consumer, producer: Producer, plan: CommitPlan) -> bool:
        """On the producer's thread: records and offsets in one transaction; False when it was
        aborted on an abortable error (the caller rewinds); raises on any other."""
        try:
            producer.begin_transaction()
            for out in plan.outputs:
                while True:
                    try:
                        producer.produce(out.topic, key=out.key, value=out.value)
                        break
                    except BufferError:
                        producer.poll(0.05)
            timeout = self.options.kafka_timeout_s
            if plan.offsets:
                offsets = [TopicPartition(t, p, o) for (t, p), o in plan.offsets.items()]
                producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(), timeout)
            self._commit_transaction(producer, timeout)
            return True
        except KafkaException as exc:
            error = exc.args[0]
            if not isinstance(error, KafkaError) or error.fatal() or not error.txn_requires_abort():
                _abort_quietly(producer)
                raise
            logger.warning("%s transaction aborted (%s)", self.name, error)
            producer.abort_transaction(self.options.kafka_timeout_s)
            return False

    @staticmethod
    def _commit_transaction(producer: Producer, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                producer.commit_transaction(max(0.1, deadline - time.monotonic()))
                return
            except KafkaException as exc:
                error = exc.args[0]
                if isinstance(error, KafkaError) and error.retriable() and time.monotonic() < deadline:
                    continue
                raise

    def _rewind(self, consumer: Consumer) -> None:
        self._holds.clear()
        self._paused_all = False
        committed = consumer.committed(consumer.assignment(), timeout=self.options.kafka_timeout_s)
        for tp in committed:
            consumer.resume([tp])
            consumer.seek(TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else -2))

    # -- claims and calls -------------------------------------------------------------------------

    def _call_horizon_s(self) -> float:
        """How long a claimed message may wait for its rate-limit token: half of what its lease
        leaves beyond the longest call and the time to record the outcome, and no more than
        ``CLAIM_AHEAD_S``: the tokens a worker reserves ahead are a queue that the other lane's
        calls (a one-time code behind a campaign) wait in."""
        d = self.handler.dispatcher
        longest = max((p.timeout_s or 0.0) for p in (d.primary, d.secondary) if p is not None)
        return min(CLAIM_AHEAD_S, max(0.0, (self.handler.lease_ms - RECORD_MARGIN_MS) / 1000 - longest) / 2)

    async def _claimer(self, run: _Run, tasks: asyncio.TaskGroup) -> None:
        """Claims the records whose turn it is, as many as there are free calls and rate-limit
        tokens due within the claims' leases, in batches; starts their calls."""
        o = self.options
        try:
            while True:
                await run.claim_wake.wait()
                run.claim_wake.clear()
                while not run.stopping and run.ledger.ready:
                    free = o.max_in_flight - run.in_flight - run.claiming
                    want = min(free, o.claim_batch, run.ledger.ready)
                    if want <= 0:
                        break
                    granted = self.handler.dispatcher.promise(
                        want, self._call_horizon_s(), first=self.handler.lane is Lane.PRIORITY
                    )
                    if granted <= 0:  # the bucket is empty (a token comes soon) or the
                        await self.handler.dispatcher.room(0.02)  # provider's seats are taken
                        continue
                    batch = run.ledger.take(granted)
                    if not batch:
                        self.handler.dispatcher.release(granted)
                        break
                    run.claiming += len(batch)
                    try:
                        steps = await self._on("store", self.handler.claim_batch, [e.delivery for e in batch])
                    except BaseException:
                        run.ledger.give_back(batch)
                        self.handler.dispatcher.release(granted)
                        raise
                    finally:
                        run.claiming -= len(batch)
                    self._start(run, tasks, batch, steps, granted)
                if run.stopping:
                    return
        except Exception as exc:  # noqa: BLE001 - the run stops, once its open calls are done
            run.failure = run.failure or exc

    def _start(
        self,
        run: _Run,
        tasks: asyncio.TaskGroup,
        batch: list[Entry],
        steps: list[Handled | SendJob],
        granted: int,
    ) -> None:
        calls = 0
        unsent: list[tuple[str, int]] = []
        for entry, step in zip(batch, steps, strict=True):
            if isinstance(step, Handled):
                if step.hold_until_ms is not None and not entry.dropped:
                    # claimed by another worker (or a call of ours before a rewind): try again
                    run.ledger.wait(entry)
                    delay = min(WAIT_POLL_S, max(0.0, step.hold_until_ms / 1000 - time.time()))
                    asyncio.get_running_loop().call_later(delay, self._wake, run, entry)
                else:
                    run.ledger.finish(entry, step.outputs, step.published)
                continue
            if entry.dropped:  # its partition was revoked while it was claimed: no call is made
                run.ledger.finish(entry, [], [])
                unsent.append((step.delivery.message_key, step.delivery.attempt))
                continue
            entry.stage, entry.job = Stage.SENDING, step
            run.in_flight += 1
            if step.can_send:
                calls += 1
                run.calls += 1
                tasks.create_task(self._send(run, entry, step))
            else:
                run.finished.append((entry, step, AttemptResult(AttemptOutcome.TRANSIENT, step.reason)))
                run.finish_wake.set()
        self.handler.dispatcher.release(granted - calls)
        self.metrics.set("sender_calls_in_flight", run.calls, **self._labels)
        if unsent:
            tasks.create_task(self._release(unsent))

    async def _release(self, claims: list[tuple[str, int]]) -> None:
        """End the leases of claims whose partitions were revoked before their calls started, so
        their next owner need not wait out the lease (with a full ledger behind them, a whole
        partition would wait). Failing that, the leases run out as after a crash."""
        try:
            db, owner = self.handler.store.db, self.handler.owner
            released = await self._on("store", lambda: release_many(db, claims, owner=owner))
        except Exception as exc:  # noqa: BLE001 - best effort: the leases run out all the same
            logger.warning("%s: could not release %d claims of revoked partitions: %s", self.name, len(claims), exc)
            return
        logger.info("%s: %d claims of revoked partitions released, no call made", self.name, released)

    @staticmethod
    def _wake(run: _Run, entry: Entry) -> None:
        run.ledger.wake(entry)
        run.claim_wake.set()

    async def _send(self, run: _Run, entry: Entry, job: SendJob) -> None:
        try:
            result = await self.handler.call(job)
        finally:
            run.calls -= 1
        run.finished.append((entry, job, result))
        run.finish_wake.set()

    async def _finisher(self, run: _Run) -> None:
        """Records the outcomes of finished calls in batches; a store that stays away past the
        claims' leases fails the run (the messages are claimed again once the leases are out)."""
        while True:
            await run.finish_wake.wait()
            run.finish_wake.clear()
            while run.finished:
                batch = run.finished[: self.options.claim_batch]
                del run.finished[: len(batch)]
                run.recording += len(batch)
                try:
                    done = await self._on(
                        "store", self.handler.finish_batch, [(job, result) for _, job, result in batch]
                    )
                finally:
                    run.recording -= len(batch)
                run.in_flight -= len(batch)
                for (entry, _, _), handled in zip(batch, done, strict=True):
                    run.ledger.finish(entry, [] if entry.dropped else handled.outputs, handled.published)
                run.claim_wake.set()  # the users' next messages may go
            if run.stopping and not run.busy():
                return

    # -- holds ------------------------------------------------------------------------------------

    def _hold(self, consumer: Consumer, topic: str, partition: int, offset: int, until_ms: int) -> None:
        tp = TopicPartition(topic, partition, offset)
        consumer.pause([tp])
        consumer.seek(tp)
        self._holds[(topic, partition)] = (offset, until_ms)

    def _resume_due(self, consumer: Consumer) -> None:
        now = time.time() * 1000
        due = [tp for tp, (_, until) in self._holds.items() if until <= now]
        for topic, partition in due:
            offset, _ = self._holds.pop((topic, partition))
            if not self._paused_all:
                consumer.resume([TopicPartition(topic, partition, offset)])

    def _poll_timeout(self) -> float:
        if not self._holds:
            return self.options.poll_timeout_s
        soonest = min(until for _, until in self._holds.values()) / 1000 - time.time()
        return max(0.0, min(self.options.poll_timeout_s, soonest))

    # -- metrics ----------------------------------------------------------------------------------

    def _measure_lag(self, consumer: Consumer) -> None:
        self._next_lag = time.monotonic() + self.options.lag_interval_s
        if not self._assigned:
            return
        lag = {"source": 0, "delay": 0}
        try:
            for tp in consumer.position(self._assigned):
                if tp.offset < 0:
                    continue  # nothing fetched yet
                _, high = consumer.get_watermark_offsets(tp, cached=True)  # updated by every fetch
                lag["delay" if tp.topic in self._delay else "source"] += max(0, high - tp.offset)
        except KafkaException as exc:
            logger.debug("%s lag unknown: %s", self.name, exc)
            return
        for kind, value in lag.items():
            self.metrics.set("sender_consumer_lag", value, topics=kind, **self._labels)
