"""The ``[senders]`` section: the sender workers.

Plain fields with a default and a ``:param`` line each: a new setting is one line here and one
in the docstring (its environment variable ``DEDUP_SENDERS_<FIELD>`` and its TOML key follow).
"""

from __future__ import annotations

from pydantic import Field, field_validator

from operators.errors import ConfigError
from operators.records import Channel
from senders.policy.breaker import BreakerOptions
from senders.policy.bucket import RateLimit
from senders.policy.outbox import OutboxLimits
from senders.policy.prices import parse_prices
from senders.policy.retry import RetryPolicy, format_step
from senders.profiles.crypto import ContactKeyOptions
from senders.rules.options import RuleOptions
from senders.templates.options import TemplateOptions
from settings.base import REPO_ROOT, Flag, OptionalSecret, OptionalStr, Section
from settings.providers import ApnsSettings, FcmSettings
from settings.sms_email import SendgridSettings, TwilioSettings, http_url

HOUR_MS = 3_600_000


class SendersSettings(Section):
    """The sender workers: retries, providers, rate limits, the status store, their topics.

    A provider is named by a string: an ``http://`` or ``https://`` URL (JSON POST), ``smtp``
    (the ``smtp_*`` settings), ``fcm`` or ``apns`` (their tables, settings/providers.py),
    ``twilio`` (SMS) or ``sendgrid`` (email; their tables, settings/sms_email.py), ``outbox``
    (files under ``<data_dir>/outbox``, the ``outbox_*`` settings: nothing leaves the machine)
    or ``fake`` (the scripted fake: nothing leaves the process). Every primary is ``outbox`` by
    default, so a local run delivers without an account anywhere; a production configuration
    names a real provider for each channel it serves (``senders run`` warns once per channel that
    writes to the outbox, and where). An empty primary means the channel has no provider and its
    workers refuse to start.

    :param group_prefix: consumer groups are ``<prefix>.<channel>.<lane>``
    :param instance_id: names this process's transactional producers
        (``<prefix>.<channel>.<lane>.<instance_id>.<n>``); a stable id lets a restarted process
        fence its dead predecessor's open transaction at once; empty: a fresh random id. Two live
        processes never share one: the second is refused at start
    :param status_topic: every status change, keyed by message key
    :param dlq_topic: the dead-letter topic
    :param delay_topic_template: the delay topics of a channel topic, one per delay step;
        ``{topic}`` is the channel topic, ``{step}`` the step (``30s``)
    :param max_attempts: provider attempts per message, the first included
    :param base_backoff_ms: wait after the first failed attempt; doubles after each further one
    :param max_backoff_ms: upper bound of the wait
    :param jitter_ratio: up to this fraction of the wait is added at random
    :param batch_size: records a worker takes per poll
    :param poll_timeout_ms: how long a poll waits for records
    :param max_in_flight: provider calls one worker keeps open at once, counted from the claim to
        the outcome's record (so a crash leaves at most this many to send again); a channel's
        workers share its providers, whose connection pools are sized for all of them. At most
        one per user and channel: a user's later messages wait in arrival order
    :param claim_batch: the most messages claimed (ruled, rendered, leased) in one status-store
        transaction; outcomes are recorded in batches of up to this many too
    :param buffered_records: records a worker holds beyond those whose calls are open (waiting
        behind their user's message in flight, or for a free call); more pause the consumer
    :param commit_interval_ms: how often a worker commits its finished records (their status,
        retry and dead-letter records and the offsets before the first unfinished one) in one
        Kafka transaction
    :param lease_ms: a claim is its worker's for this long; must exceed the longest send deadline
        (``http_timeout_ms``, ``smtp_timeout_ms`` of the providers in use) by a second, or the
        workers refuse to start
    :param session_timeout_ms: consumer session timeout (how soon a dead worker's partitions move)
    :param transaction_timeout_ms: the broker aborts a dead worker's open transaction after this
    :param kafka_timeout_ms: how long a worker waits on the broker (init_transactions, the topics'
        metadata, a commit) before it gives up, backs off and reconnects
    :param restart_backoff_ms: a failed worker (broker or store unreachable, producer fenced)
        starts again after this; the wait doubles with each failure in a row
    :param restart_backoff_max_ms: upper bound of that wait; a worker that ran this long without
        failing starts again from ``restart_backoff_ms``
    :param instance_ttl_ms: a ``senders run`` process records itself (instance id, host, pid) in
        the status store and renews that every third of this; another process may take its
        instance id over only once it is this old (at once when its pid is gone on this host)
    :param status_store: empty: SQLite in ``<data_dir>/senders/status.sqlite3``; a path or
        ``sqlite:///path``; or a ``postgresql://`` DSN (needs psycopg)
    :param status_store_password: password for the PostgreSQL DSN (a secret)
    :param sqlite_synchronous: SQLite ``synchronous`` pragma (FULL survives power loss, NORMAL
        survives a crash of the process)
    :param sqlite_busy_timeout_ms: how long a SQLite transaction waits for the store's write lock
        before the worker backs off
    :param contact_encryption_keys: Fernet keys of the contacts at rest, comma-separated, the
        newest first (a secret; ``dedupctl users keygen`` makes one): contacts are encrypted with
        the first and decrypt with any. Required by the senders and ``dedupctl users``; rotation:
        docs/senders.md
    :param contact_lookup_keys: keys of the contacts' keyed lookup hash, comma-separated, the
        newest first (a secret, made like the encryption keys)
    :param profile_cache_ttl_ms: a worker reads a user's profile from the store at most once in
        this long (a change, such as an opt-out, is seen within it)
    :param templates_dir: the templates directory; empty: the repository's ``templates/``
    :param default_locale: the locale a message is rendered in when the user has none, or the
        template not the user's; every template version must have it
    :param max_sms_segments: an SMS text that needs more segments (GSM-7 / UCS-2) is rejected
    :param marketing_per_day: marketing notifications a user receives per local day, in the
        user's time zone (0: no limit)
    :param one_time_codes_per_hour: one-time codes a recipient (an address) receives per hour
        (0: no limit); more are rejected (``recipient_limit``)
    :param preferences_retry_ms: a marketing message whose recipient's preferences cannot be read
        is deferred this long (fail closed); a transactional one is sent (fail open)
    :param status_retention_ms: a finished message's row in the status store (and its limit
        units, redrive bookkeeping) is kept this long after its last change, then pruned; 0: the
        longest dedup window (``dedup.max_window_sec``) plus the longest retry schedule
    :param prune_interval_ms: how often a process's first worker prunes the status store
    :param push_primary: push provider (default ``outbox``)
    :param push_secondary: push failover provider (empty: none)
    :param sms_primary: SMS provider (default ``outbox``)
    :param sms_secondary: SMS failover provider
    :param email_primary: email provider (default ``outbox``)
    :param email_secondary: email failover provider
    :param push_rate_per_sec: rate limit of each push provider
    :param sms_rate_per_sec: rate limit of each SMS provider
    :param email_rate_per_sec: rate limit of each email provider
    :param rate_burst: token-bucket size of each provider
    :param nice: ``senders run`` runs at this CPU nice (0-19; 0: as started): below the API and
        the broker when they share a host (ops/priority.py says why and what it buys)
    :param cpu_idle: ``senders run`` runs in the job's CPU-idle control group (``flink.cpu_idle``,
        ops/cpu_idle.py), below the API and the broker
    :param switch_interval_ms: Python's switch interval in ``senders run``: how long a thread
        running Python code (the event loop's calls, another worker's rules) may keep the
        interpreter's lock from a worker's store thread, which wants it back after each step of
        its statements while it holds the store file's write lock (``ops.gil``; more than 0, at
        most 100). 5, CPython's own: 1 shortens a claim beside a busy thread 65 -> 15 ms
        (``python -m bench.claim_round``), but beside the whole pipeline the codes' p99 in the
        flood was 1.36 and 1.49 s at 1 against 1.00 s at 5 (bench/results/slo-2026-12-07-s47-*)
    :param metrics_port: ``senders run`` serves its Prometheus metrics on 127.0.0.1:PORT/metrics
        (0: not served; ``--metrics-port`` overrides it); ``dedupctl slo`` reads them there
    :param provider_prices: a message's price per provider, ``label=PRICE;label=PRICE`` (the
        label: a URL's host[:port], ``smtp``, ``fake``), in whatever unit the bills use;
        a provider not named costs 0. Counted for every message a provider takes
        (``sender_cost_units_total`` by channel and provider)
    :param http_timeout_ms: the deadline of one HTTP send, connect to last byte (a timeout is a
        transient failure); ``lease_ms`` must exceed it
    :param http_token: bearer token sent to HTTP providers (a secret)
    :param http2: speak HTTP/2 to the HTTP providers (httpx, ALPN; for providers that offer it);
        off: HTTP/1.1 keep-alive connections
    :param http_ca_file: PEM file of the CAs that HTTPS providers' certificates are verified
        against; empty: the system's CAs (verification is never off)
    :param smtp_host: SMTP relay host
    :param smtp_port: SMTP relay port
    :param smtp_starttls: upgrade the SMTP connection with STARTTLS (verified)
    :param smtp_implicit_tls: speak TLS from the start (SMTPS, port 465), verified
    :param smtp_ca_file: PEM file of the CAs the SMTP relay's certificate is verified against;
        empty: the system's CAs
    :param smtp_username: SMTP login; needs smtp_starttls or smtp_implicit_tls
    :param smtp_password: SMTP password (a secret)
    :param smtp_from: envelope and header sender of emails
    :param smtp_timeout_ms: the deadline of one SMTP send (waiting for a pooled connection,
        connect, TLS, login, the message); ``lease_ms`` must exceed it
    :param smtp_pool_size: SMTP sessions kept open per relay, each carrying one message at a time
        and reused from message to message: at most this many emails are in flight to it (the
        senders claim no more), so a relay answering in L seconds takes at most this / L emails
        a second (32 at 200 ms: 160/s). Keep it within the relay's limit of connections per
        client (Postfix's ``smtpd_client_connection_count_limit`` is 50 by default)
    :param http_invalid_recipient: the HTTP answers that say the address itself is invalid, the
        only ones that deactivate it: a status (``410``), or ``STATUS:CODE`` when the reply's
        body must contain CODE (``400:invalid_recipient``); comma-separated
    :param smtp_invalid_recipient: the enhanced statuses of a refused recipient that deactivate
        it: ``5.1`` is any 5.1.x (bad mailbox, domain, syntax); comma-separated
    :param invalid_recipient_rules: per provider, rules in place of those two:
        ``LABEL=RULES;LABEL=RULES``, LABEL being the provider's name (a URL's host[:port], or
        ``smtp``), e.g. ``sms-a.example=400:21211,410``
    :param outbox_max_messages: the ``outbox`` provider keeps this many messages per channel,
        the oldest removed beyond it (0: no limit)
    :param outbox_max_age_ms: and removes those older than this (0: no limit)
    :param breaker_window: the primary's recent outcomes the failure rate is taken over
    :param breaker_min_calls: outcomes needed before the circuit may open
    :param breaker_failure_rate: failure fraction that opens the circuit (moves to the secondary)
    :param breaker_open_ms: time on the secondary before the primary is probed again
    :param metrics_log_interval_s: how often a running worker logs its metrics (0: never)
    :param fcm: the ``[senders.fcm]`` table: Firebase Cloud Messaging HTTP v1 (``FcmSettings``)
    :param apns: the ``[senders.apns]`` table: Apple Push Notification service (``ApnsSettings``)
    :param twilio: the ``[senders.twilio]`` table: Twilio's Messages API, SMS (``TwilioSettings``)
    :param sendgrid: the ``[senders.sendgrid]`` table: SendGrid's v3 mail send (``SendgridSettings``)
    :param unsubscribe_url: the API's public URL of ``POST /unsubscribe``: every marketing email
        carries it, with its user and a signed token, as ``List-Unsubscribe`` (one-click, RFC
        8058). Required by ``sendgrid`` (its workers refuse to start without it and
        ``unsubscribe_secrets``); ``smtp`` adds the headers when it is set
    :param unsubscribe_secrets: keys of the unsubscribe links' tokens (a secret), comma-separated,
        the newest first: links are signed with the first and accepted with any (a new key put
        first keeps the links already in mailboxes working)
    """

    group_prefix: str = "notify-senders"
    instance_id: str = ""
    status_topic: str = "notifications.status"
    dlq_topic: str = "notifications.dlq"
    delay_topic_template: str = "{topic}.retry.{step}"
    max_attempts: int = 5
    base_backoff_ms: int = 30_000
    max_backoff_ms: int = 3_600_000
    jitter_ratio: float = 0.2
    batch_size: int = 200
    poll_timeout_ms: int = 100
    max_in_flight: int = Field(default=400, ge=1, le=10_000)
    claim_batch: int = Field(default=200, ge=1, le=5_000)
    buffered_records: int = Field(default=2_000, ge=1)
    commit_interval_ms: int = Field(default=100, ge=1, le=60_000)
    lease_ms: int = 60_000
    session_timeout_ms: int = 45_000
    transaction_timeout_ms: int = 60_000
    kafka_timeout_ms: int = 30_000
    restart_backoff_ms: int = 1_000
    restart_backoff_max_ms: int = 30_000
    instance_ttl_ms: int = 30_000
    status_store: str = ""
    status_store_password: OptionalSecret = None
    sqlite_synchronous: str = "FULL"
    sqlite_busy_timeout_ms: int = 30_000
    contact_encryption_keys: OptionalSecret = None
    contact_lookup_keys: OptionalSecret = None
    profile_cache_ttl_ms: int = 5_000
    templates_dir: str = ""
    default_locale: str = "en"
    max_sms_segments: int = 3
    marketing_per_day: int = 1
    one_time_codes_per_hour: int = 5
    preferences_retry_ms: int = 60_000
    status_retention_ms: int = 0
    prune_interval_ms: int = 600_000
    push_primary: str = "outbox"
    push_secondary: str = ""
    sms_primary: str = "outbox"
    sms_secondary: str = ""
    email_primary: str = "outbox"
    email_secondary: str = ""
    push_rate_per_sec: float = 500.0
    sms_rate_per_sec: float = 50.0
    email_rate_per_sec: float = 50.0
    rate_burst: int = 20
    metrics_port: int = Field(default=0, ge=0, le=65_535)
    nice: int = Field(default=0, ge=0, le=19)
    cpu_idle: Flag = False
    switch_interval_ms: float = Field(default=5.0, gt=0.0, le=100.0)
    provider_prices: str = ""
    http_timeout_ms: int = 5_000
    http_token: OptionalSecret = None
    http2: Flag = False
    http_ca_file: str = ""
    smtp_host: str = "127.0.0.1"
    smtp_port: int = 25
    smtp_starttls: Flag = False
    smtp_implicit_tls: Flag = False
    smtp_ca_file: str = ""
    smtp_username: OptionalStr = None
    smtp_password: OptionalSecret = None
    smtp_from: str = "notifications@localhost"
    smtp_timeout_ms: int = 10_000
    smtp_pool_size: int = Field(default=32, ge=1, le=1_000)
    http_invalid_recipient: str = "400:invalid_recipient,404:invalid_recipient,410"
    smtp_invalid_recipient: str = "5.1"
    invalid_recipient_rules: str = ""
    outbox_max_messages: int = Field(default=1_000, ge=0)
    outbox_max_age_ms: int = Field(default=7 * 24 * HOUR_MS, ge=0)
    breaker_window: int = 20
    breaker_min_calls: int = 5
    breaker_failure_rate: float = 0.5
    breaker_open_ms: int = 30_000
    metrics_log_interval_s: float = 60.0
    fcm: FcmSettings = Field(default_factory=FcmSettings)
    apns: ApnsSettings = Field(default_factory=ApnsSettings)
    twilio: TwilioSettings = Field(default_factory=TwilioSettings)
    sendgrid: SendgridSettings = Field(default_factory=SendgridSettings)
    unsubscribe_url: str = ""
    unsubscribe_secrets: OptionalSecret = None

    @field_validator("unsubscribe_url")
    @classmethod
    def _unsubscribe_url(cls, value: str) -> str:
        return http_url(value, empty_ok=True)

    def unsubscribe_keys(self) -> list[bytes]:
        """The unsubscribe tokens' keys, the signing one first (empty: none configured)."""
        if self.unsubscribe_secrets is None:
            return []
        return [k.strip().encode("utf-8") for k in self.unsubscribe_secrets.get_secret_value().split(",") if k.strip()]

    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(
            base_ms=self.base_backoff_ms,
            max_attempts=self.max_attempts,
            jitter_ratio=self.jitter_ratio,
            max_backoff_ms=self.max_backoff_ms,
        )

    def rule_options(self) -> RuleOptions:
        return RuleOptions(
            marketing_per_day=self.marketing_per_day,
            one_time_codes_per_window=self.one_time_codes_per_hour,
            one_time_code_window_ms=HOUR_MS,
            preferences_retry_ms=self.preferences_retry_ms,
        )

    def template_options(self) -> TemplateOptions:
        return TemplateOptions(
            directory=self.templates_dir or str(REPO_ROOT / "templates"),
            default_locale=self.default_locale,
            max_sms_segments=self.max_sms_segments,
        )

    def contact_keys(self) -> ContactKeyOptions:
        return ContactKeyOptions(
            encryption_keys=self.contact_encryption_keys, lookup_keys=self.contact_lookup_keys
        )

    def retention_ms(self, max_window_sec: int) -> int:
        """How long a finished message's row is kept: the setting, or the longest dedup window
        plus the longest retry schedule (every backoff at its full jitter, and a lease each)."""
        if self.status_retention_ms > 0:
            return self.status_retention_ms
        return max_window_sec * 1000 + self.retry_policy().schedule_ms() + self.max_attempts * self.lease_ms

    def outbox_limits(self) -> OutboxLimits:
        return OutboxLimits(max_messages=self.outbox_max_messages, max_age_ms=self.outbox_max_age_ms)

    def uses_outbox(self) -> bool:
        """Whether a channel's primary or secondary is the ``outbox`` provider (the API serves its
        page only then)."""
        return any(spec == "outbox" for channel in Channel for spec in self.providers(channel))

    def breaker_options(self) -> BreakerOptions:
        return BreakerOptions(
            window=self.breaker_window,
            min_calls=self.breaker_min_calls,
            failure_rate=self.breaker_failure_rate,
            open_ms=self.breaker_open_ms,
        )

    @field_validator("provider_prices")
    @classmethod
    def _prices_parse(cls, value: str) -> str:
        try:
            parse_prices(value)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return value

    def prices(self) -> dict[str, float]:
        return dict(parse_prices(self.provider_prices))

    def rate_limit(self, channel: Channel) -> RateLimit:
        rate = float(getattr(self, f"{channel.value}_rate_per_sec"))
        return RateLimit(per_second=rate, burst=self.rate_burst)

    def providers(self, channel: Channel) -> tuple[str, str]:
        """The (primary, secondary) provider names of a channel; secondary may be empty."""
        name = channel.value
        return str(getattr(self, f"{name}_primary")), str(getattr(self, f"{name}_secondary"))

    def delay_topics(self, source_topic: str) -> dict[int, str]:
        """Delay step (ms) -> the delay topic of a channel topic for that step."""
        return {
            step: self.delay_topic_template.format(topic=source_topic, step=format_step(step))
            for step in self.retry_policy().steps()
        }
