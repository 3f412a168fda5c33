"""The ``[api]`` section: the HTTP front door (``dedupctl api run``).

The API keeps its own tables (tokens, idempotency keys, the requests it accepted, the job's
verdicts on them, campaigns) in the senders' status store (``senders.status_store``): it reads the
statuses and profiles there.
"""

from __future__ import annotations

from pydantic import Field, field_validator

from settings.base import OptionalSecret, Section


class ApiSettings(Section):
    """The HTTP API.

    :param host: the address ``api run`` listens on
    :param port: its port
    :param max_body_bytes: the largest request body of every endpoint but campaigns (413 past it)
    :param max_campaign_body_bytes: the largest body of ``POST /v1/campaigns`` (an inline segment)
    :param max_campaign_users: the most users one campaign may have
    :param ack_timeout_ms: how long a request waits for Kafka to acknowledge its record (acks=all);
        past it the answer is 503 and the caller retries with the same Idempotency-Key. Above the
        time a cluster takes to fence a crashed broker (``broker.session.timeout.ms``, 9 s by
        default; ~10-11 s measured here), so a broker's crash makes accepts slow, not failed
    :param kafka_linger_ms: the request producer's ``linger.ms``: how long librdkafka waits for
        more records to send together (fewer, larger batches: less CPU in the broker and in the
        producer per request) before it sends a batch
    :param idempotency_ttl_s: how long an Idempotency-Key is remembered: a repeat within it gets
        the first answer; after it the key may be sent again (the dedup job still catches a repeat
        within its window)
    :param default_rate_per_sec: notifications per second a caller may send when it has no rate
        of its own (429 past it, with Retry-After), across all the API processes of the store. A
        campaign may not run faster than its caller's rate
    :param calls_rate_per_sec: every other ``/v1`` call a caller may make per second, across all
        the API processes of the store (429 past it)
    :param rate_lease_fraction: a process takes a caller's rate budget from the store in chunks
        of this share of a window's budget (at most a quarter of what is left): one store
        transaction per chunk, and at most one unspent chunk per process at a window's end
    :param processes: API processes on the one port (``api run --processes``); more than one
        needs a PostgreSQL store or a SQLite file on this host (one writer at a time)
    :param lease_ttl_ms: the lease of the process that runs the campaigns, the verdicts' reader
        and pruning for all of them lasts this long, renewed every third of it: when its holder
        dies, another process takes over within it (at once when the holder ran on this host)
    :param campaign_poll_ms: how often that process looks for campaigns to run (one created or
        resumed through another process starts within this time)
    :param held_receipts_interval_ms: how often that process applies the providers' receipts that
        came before their message was recorded as sent (held; see docs/api.md)
    :param held_receipts_ttl_s: a held receipt whose message is still not recorded after this long
        is dropped (counted in the log)
    :param writer_max_batch: the most idempotency reservations (and, apart, completions) the
        store writer puts in one transaction
    :param writer_round_ms: a store writer's round starts at least this long after the one before
        (0: at once): under load the requests of this time share one transaction and one profile
        read, so a request costs less CPU; an idle writer's next round is not held (``api.writer``)
    :param switch_interval_ms: Python's switch interval in each API process: how long the event
        loop's thread may run on while another thread (the store writer, between the steps of its
        statements) waits for the interpreter's lock (``ops.gil``; CPython's default is 5; more than
        0, at most 100)
    :param nice: ``api run`` runs its processes at this CPU nice (-20 to 19; 0: as started); below
        0, above the other services of a shared host, needs CAP_SYS_NICE (ops/priority.py says
        why and what it buys; refused, the API runs on as it was, with a warning)
    :param token_cache_ttl_ms: a looked-up token is trusted this long without reading the store
        again: a token revoked (``dedupctl api token revoke``) is refused at once by a process
        that has not cached it and within this time by one that has. Its expiry is checked on
        every request
    :param token_negative_ttl_ms: a token the store does not know (or knows revoked or expired) is
        refused this long without asking the store again
    :param pending_wait_ms: a repeat of a request another API process is writing waits this long
        for its answer (polling the store) before it answers 409; at least ``ack_timeout_ms``
    :param max_active_campaigns: campaigns a caller may have scheduled, running or paused at once
        (409 ``too_many_campaigns`` past it)
    :param kafka_probe_interval_ms: how often the API asks the brokers for the requests topic's
        metadata (on connections of its own); once three probes in a row have gone unanswered with
        no record acknowledged meanwhile (or librdkafka finds every broker down), and until the
        brokers answer again, ``POST /v1/notifications`` is 503 at once and ``/readyz`` says
        ``kafka: unreachable``
    :param webhook_secrets: the delivery receipts' HMAC secrets, ``provider=secret`` pairs
        separated by ``;`` (the provider as the senders name it: a URL's host[:port]); a secret
    :param webhook_tolerance_s: a receipt whose timestamp is further than this from the clock is
        refused (the replay window)
    :param campaigns_topic: the campaigns' progress (a compacted topic of one partition), written
        in the same Kafka transaction as each batch of a campaign's requests
    :param transactional_id_prefix: a campaign's producer is ``<prefix>.<campaign id>``
    :param campaign_batch_ms: a campaign writes one batch (one transaction) per this much time
    :param campaign_max_backlog: a campaign writes its next batch only while at most this many
        messages wait for the senders on the normal lanes of its channels (``api.backlog``), so
        the order updates on those lanes wait behind no more; 0: no bound, only the rate
    :param outcomes_group: the consumer group that reads the job's duplicate, late and invalid
        topics into the store, for the status of a notification
    :param sqlite_synchronous: SQLite ``synchronous`` of the API's connections (NORMAL survives
        a crash of the process; a lost idempotency record only lets a retry through to the dedup)
    :param store_threads: connections (and threads) the API uses for a PostgreSQL store (a SQLite
        store takes one writer at a time: one)
    :param prune_interval_s: how often expired idempotency keys and old records are dropped
    :param shutdown_timeout_s: on SIGTERM, how long requests in flight may finish and the Kafka
        producer may flush
    :param segments_dir: where a campaign's ``segment_file`` is read from (a name, never a path;
        empty: segment files are refused)
    """

    host: str = "127.0.0.1"
    port: int = 8080
    max_body_bytes: int = 64 * 1024
    max_campaign_body_bytes: int = 4 * 1024 * 1024
    max_campaign_users: int = 100_000
    ack_timeout_ms: int = 15_000
    kafka_linger_ms: int = 1
    idempotency_ttl_s: int = 86_400
    default_rate_per_sec: float = 100.0
    calls_rate_per_sec: float = 500.0
    token_cache_ttl_ms: int = 5_000
    token_negative_ttl_ms: int = 2_000
    pending_wait_ms: int = 17_000
    max_active_campaigns: int = 5
    kafka_probe_interval_ms: int = 1_000
    webhook_secrets: OptionalSecret = None
    webhook_tolerance_s: int = 300
    campaigns_topic: str = "notifications.campaigns"
    transactional_id_prefix: str = "notify-api"
    campaign_batch_ms: int = 100
    campaign_max_backlog: int = 2_000
    outcomes_group: str = "notify-api-outcomes"
    sqlite_synchronous: str = "NORMAL"
    store_threads: int = 4
    prune_interval_s: int = 60
    rate_lease_fraction: float = 0.1
    processes: int = 1
    lease_ttl_ms: int = 10_000
    campaign_poll_ms: int = 1_000
    held_receipts_interval_ms: int = 1_000
    held_receipts_ttl_s: int = 86_400
    writer_max_batch: int = 256
    writer_round_ms: int = 10
    switch_interval_ms: float = Field(default=1.0, le=100.0)
    nice: int = Field(default=0, ge=-20, le=19)
    shutdown_timeout_s: float = 10.0
    segments_dir: str = ""

    @field_validator("port")
    @classmethod
    def _port(cls, value: int) -> int:
        if not 0 < value < 65_536:
            raise ValueError("must be a TCP port, 1 to 65535")
        return value

    @field_validator(
        "max_body_bytes", "max_campaign_body_bytes", "max_campaign_users", "ack_timeout_ms", "idempotency_ttl_s",
        "token_cache_ttl_ms", "webhook_tolerance_s", "campaign_batch_ms", "store_threads", "prune_interval_s",
        "pending_wait_ms", "max_active_campaigns", "kafka_probe_interval_ms", "processes", "lease_ttl_ms",
        "campaign_poll_ms", "writer_max_batch", "held_receipts_interval_ms", "held_receipts_ttl_s",
    )
    @classmethod
    def _positive(cls, value: int) -> int:
        if value < 1:
            raise ValueError("must be at least 1")
        return value

    @field_validator("token_negative_ttl_ms", "kafka_linger_ms", "campaign_max_backlog", "writer_round_ms")
    @classmethod
    def _not_negative(cls, value: int) -> int:
        if value < 0:
            raise ValueError("must be 0 or more")
        return value

    @field_validator("rate_lease_fraction")
    @classmethod
    def _fraction(cls, value: float) -> float:
        if not 0 < value <= 1:
            raise ValueError("must be more than 0 and at most 1")
        return value

    @field_validator("default_rate_per_sec", "calls_rate_per_sec", "shutdown_timeout_s", "switch_interval_ms")
    @classmethod
    def _positive_float(cls, value: float) -> float:
        if not value > 0:
            raise ValueError("must be positive")
        return value

    def local_url(self) -> str:
        """Where a tool on this host reaches the API: ``http://<host>:<port>``, loopback when the
        API listens on every address."""
        host = "127.0.0.1" if self.host in ("", "0.0.0.0", "::") else self.host  # noqa: S104 - not a bind
        return f"http://{host}:{self.port}"

    def webhook_secret_map(self) -> dict[str, bytes]:
        """provider -> its receipts' secret; a ConfigError-worthy entry raises ValueError (no value quoted)."""
        if self.webhook_secrets is None:
            return {}
        out: dict[str, bytes] = {}
        for n, entry in enumerate(e for e in self.webhook_secrets.get_secret_value().split(";") if e.strip()):
            provider, sep, secret = entry.partition("=")
            if not sep or not provider.strip() or not secret.strip():
                raise ValueError(f"api.webhook_secrets: entry {n + 1} is not provider=secret")
            out[provider.strip()] = secret.strip().encode("utf-8")
        return out
