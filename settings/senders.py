"""The ``[senders]`` section: the sender workers.

Plain fields with a default and a ``:param`` line each: a new setting is one line here and one
in the docstring (its environment variable ``DEDUP_SENDERS_<FIELD>`` and its TOML key follow).
"""

from __future__ import annotations

from operators.records import Channel
from senders.policy.breaker import BreakerOptions
from senders.policy.bucket import RateLimit
from senders.policy.retry import RetryPolicy, format_step
from settings.base import Flag, OptionalSecret, OptionalStr, Section


class SendersSettings(Section):
    """The sender workers: retries, providers, rate limits, the status store, their topics.

    A provider is named by a string: an ``http://`` or ``https://`` URL (JSON POST), ``smtp``
    (the ``smtp_*`` settings), or ``fake`` (the scripted fake: nothing leaves the process).
    An empty primary means the channel has no provider and its workers refuse to start.

    :param group_prefix: consumer groups are ``<prefix>.<channel>.<lane>``
    :param instance_id: names this process's transactional producers
        (``<prefix>.<channel>.<lane>.<instance_id>.<n>``); a stable id lets a restarted process
        fence its dead predecessor's open transaction at once; empty: a fresh random id
    :param status_topic: every status change, keyed by message key
    :param dlq_topic: the dead-letter topic
    :param delay_topic_template: the delay topics of a channel topic, one per delay step;
        ``{topic}`` is the channel topic, ``{step}`` the step (``30s``)
    :param max_attempts: provider attempts per message, the first included
    :param base_backoff_ms: wait after the first failed attempt; doubles after each further one
    :param max_backoff_ms: upper bound of the wait
    :param jitter_ratio: up to this fraction of the wait is added at random
    :param batch_size: records a worker takes per poll (one Kafka transaction)
    :param poll_timeout_ms: how long a poll waits for records
    :param lease_ms: a claim is its worker's for this long; must exceed the provider timeouts
    :param session_timeout_ms: consumer session timeout (how soon a dead worker's partitions move)
    :param transaction_timeout_ms: the broker aborts a dead worker's open transaction after this
    :param status_store: empty: SQLite in ``<data_dir>/senders/status.sqlite3``; a path or
        ``sqlite:///path``; or a ``postgresql://`` DSN (needs psycopg)
    :param status_store_password: password for the PostgreSQL DSN (a secret)
    :param sqlite_synchronous: SQLite ``synchronous`` pragma (FULL survives power loss, NORMAL
        survives a crash of the process)
    :param address_book: JSON file ``{"user_id": {"sms": "+4420...", "email": "..."}}``;
        empty: the user id is the address (providers that resolve users themselves)
    :param push_primary: push provider
    :param push_secondary: push failover provider (empty: none)
    :param sms_primary: SMS provider
    :param sms_secondary: SMS failover provider
    :param email_primary: email provider
    :param email_secondary: email failover provider
    :param push_rate_per_sec: rate limit of each push provider
    :param sms_rate_per_sec: rate limit of each SMS provider
    :param email_rate_per_sec: rate limit of each email provider
    :param rate_burst: token-bucket size of each provider
    :param http_timeout_ms: HTTP provider request timeout (a timeout is a transient failure)
    :param http_token: bearer token sent to HTTP providers (a secret)
    :param smtp_host: SMTP relay host
    :param smtp_port: SMTP relay port
    :param smtp_starttls: upgrade the SMTP connection with STARTTLS
    :param smtp_username: SMTP login
    :param smtp_password: SMTP password (a secret)
    :param smtp_from: envelope and header sender of emails
    :param smtp_timeout_ms: SMTP connection and command timeout
    :param breaker_window: the primary's recent outcomes the failure rate is taken over
    :param breaker_min_calls: outcomes needed before the circuit may open
    :param breaker_failure_rate: failure fraction that opens the circuit (moves to the secondary)
    :param breaker_open_ms: time on the secondary before the primary is probed again
    :param metrics_log_interval_s: how often a running worker logs its metrics (0: never)
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
    lease_ms: int = 60_000
    session_timeout_ms: int = 45_000
    transaction_timeout_ms: int = 60_000
    status_store: str = ""
    status_store_password: OptionalSecret = None
    sqlite_synchronous: str = "FULL"
    address_book: str = ""
    push_primary: str = ""
    push_secondary: str = ""
    sms_primary: str = ""
    sms_secondary: str = ""
    email_primary: str = ""
    email_secondary: str = ""
    push_rate_per_sec: float = 500.0
    sms_rate_per_sec: float = 50.0
    email_rate_per_sec: float = 50.0
    rate_burst: int = 20
    http_timeout_ms: int = 5_000
    http_token: OptionalSecret = None
    smtp_host: str = "127.0.0.1"
    smtp_port: int = 25
    smtp_starttls: Flag = False
    smtp_username: OptionalStr = None
    smtp_password: OptionalSecret = None
    smtp_from: str = "notifications@localhost"
    smtp_timeout_ms: int = 10_000
    breaker_window: int = 20
    breaker_min_calls: int = 5
    breaker_failure_rate: float = 0.5
    breaker_open_ms: int = 30_000
    metrics_log_interval_s: float = 60.0

    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(
            base_ms=self.base_backoff_ms,
            max_attempts=self.max_attempts,
            jitter_ratio=self.jitter_ratio,
            max_backoff_ms=self.max_backoff_ms,
        )

    def breaker_options(self) -> BreakerOptions:
        return BreakerOptions(
            window=self.breaker_window,
            min_calls=self.breaker_min_calls,
            failure_rate=self.breaker_failure_rate,
            open_ms=self.breaker_open_ms,
        )

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
