"""The SASL JAAS string of the Flink source and sink: a password with ``"``, ``\\``, ``;`` or a line
break still reaches the Kafka client as itself (issue 13)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from pydantic import SecretStr

from settings import REPO_ROOT, KafkaSettings
from settings.kafka import jaas_quoted

PASSWORDS = [
    "plain",
    'say "hi"',
    "back\\slash",
    "semi;colon=equals",
    'mixed\\"; username="admin',
    "ends with a backslash\\",
    "line\nbreak\r\n",
    "tab\tand unicode ü 𝄞",
    "",
]
KAFKA_JARS = REPO_ROOT / ".cache" / "jars" / "kafka"


def jaas(password: str, user: str = "dedup") -> str:
    kafka = KafkaSettings(sasl_mechanism="SCRAM-SHA-512", sasl_username=user, sasl_password=SecretStr(password))
    return kafka.java_properties()["sasl.jaas.config"]


def test_quoted_values_escape_quotes_backslashes_and_line_breaks() -> None:
    assert jaas_quoted('a"b') == '"a\\"b"'
    assert jaas_quoted("a\\b") == '"a\\\\b"'
    assert jaas_quoted("a;b") == '"a;b"'
    assert jaas_quoted("a\nb") == '"a\\nb"'
    text = jaas('x"; evil="1')
    assert text == (
        'org.apache.kafka.common.security.scram.ScramLoginModule required '
        'username="dedup" password="x\\"; evil=\\"1";'
    )
    assert text.count(";") == 2  # the one inside the quotes, and the end


def _kafka_parses(texts: list[str]) -> list[dict[str, str]]:
    jars = [*KAFKA_JARS.glob("kafka-clients-*.jar"), *KAFKA_JARS.glob("slf4j-api-*.jar")]
    if shutil.which("java") is None or len(jars) < 2:
        pytest.skip("needs java and the Kafka client jars (make jars)")
    source = Path(__file__).with_name("JaasOptions.java")
    proc = subprocess.run(
        ["java", "-cp", ":".join(map(str, jars)), str(source), *texts],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    parsed: list[dict[str, str]] = [{} for _ in texts]
    for line in proc.stdout.splitlines():
        n, key, value = (line.split(" ") + [""])[:3]
        parsed[int(n)][key] = bytes.fromhex(value).decode("utf-8")
    return parsed


def test_the_kafka_client_reads_every_password_back() -> None:
    """Kafka's own parser (JaasContext of kafka-clients) on the strings the job hands to Flink."""
    parsed = _kafka_parses([jaas(p, user=f'user "{i}"') for i, p in enumerate(PASSWORDS)])
    assert parsed == [{"username": f'user "{i}"', "password": p} for i, p in enumerate(PASSWORDS)]
