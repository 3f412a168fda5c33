"""The push protocols the delivery benchmark can send by (``python -m bench.senders
--push-protocol json|fcm|apns``): this project's JSON contract, FCM HTTP v1 or APNs, each to the
HTTP provider stub (bench/stubs/http.py) on ``/push``, FCM and APNs over h2c (HTTP/2 in clear with
prior knowledge: many calls as streams on few connections). Their keys are made here, throwaway,
and written as files beside the run's settings (the service-account key's ``token_uri`` is the
stub's ``/token``)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

PUSH_PROTOCOLS = ("json", "fcm", "apns")


def _pem(key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def _private_file(path: Path, text: str) -> str:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
    return str(path)


def write_push_keys(where: Path, stub_origin: str) -> dict[str, str]:
    """A throwaway FCM service-account key and APNs ``.p8`` key under ``where``: their paths."""
    where.mkdir(parents=True, exist_ok=True)
    account = {"type": "service_account", "project_id": "bench", "private_key_id": "bench-key",
               "private_key": _pem(rsa.generate_private_key(public_exponent=65537, key_size=2048)),
               "client_email": "bench@bench.iam.gserviceaccount.com", "token_uri": f"{stub_origin}/token"}
    return {
        "fcm": _private_file(where / "service-account.json", json.dumps(account)),
        "apns": _private_file(where / "AuthKey_BENCH00001.p8", _pem(ec.generate_private_key(ec.SECP256R1()))),
    }


def push_settings(protocol: str, stub_origin: str, keys: dict[str, str]) -> dict[str, Any]:
    """The ``[senders]`` fields that send push by ``protocol`` to the stub at ``stub_origin``."""
    base = f"{stub_origin}/push"
    if protocol == "json":
        return {"push_primary": base}
    if protocol == "fcm":
        return {"push_primary": "fcm",
                "fcm": {"service_account_file": keys["fcm"], "project_id": "bench", "base_url": base}}
    if protocol == "apns":
        return {"push_primary": "apns",
                "apns": {"key_file": keys["apns"], "team_id": "BENCHTEAM1", "key_id": "BENCH00001",
                         "topic": "com.example.bench", "base_url": base}}
    raise ValueError(f"unknown push protocol {protocol!r}: choose from {', '.join(PUSH_PROTOCOLS)}")
