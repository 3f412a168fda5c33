"""One frozen configuration: defaults, then a TOML file, then ``DEDUP_*`` variables, then flags.

File sections and environment variables share names: ``[kafka] bootstrap_servers`` is
``DEDUP_KAFKA_BOOTSTRAP_SERVERS``, ``[topics] push`` is ``DEDUP_TOPICS_PUSH``, a section's table
``[senders.fcm] project_id`` is ``DEDUP_SENDERS_FCM_PROJECT_ID``; ``DEDUP_CONFIG`` names the
file. Flags go through ``Settings.with_overrides(section={...})``.

One module per section (pydantic models, frozen): settings/kafka.py, dedup.py, flink.py,
senders.py (its providers' tables in providers.py), api.py, topics.py; the whole in
settings/model.py. Secrets are ``SecretStr``: never in a repr, a log line or a dump,
``.get_secret_value()`` where a client needs them. What Flink is told, in every environment, is
derived from these in settings/flink_conf.py.
"""

from settings.api import ApiSettings
from settings.base import ENV_PREFIX, REPO_ROOT
from settings.dedup import DedupSettings
from settings.flink import FlinkSettings
from settings.kafka import KafkaSettings
from settings.model import Settings, load_settings
from settings.senders import SendersSettings

__all__ = [
    "ApiSettings",
    "ENV_PREFIX",
    "REPO_ROOT",
    "DedupSettings",
    "FlinkSettings",
    "KafkaSettings",
    "SendersSettings",
    "Settings",
    "load_settings",
]
