"""The providers' TLS: always verifying, against the system's CAs or a configured CA file."""

from __future__ import annotations

import ssl

from operators.errors import ConfigError


def tls_context(ca_file: str | None) -> ssl.SSLContext:
    """A verifying client context (hostname checked): the system's CAs, or only ``ca_file``'s (PEM)."""
    try:
        return ssl.create_default_context(cafile=ca_file or None)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the CA file {ca_file}: {exc}") from None
