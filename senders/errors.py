"""Exceptions of the senders, with the data a caller needs to act on them."""

from __future__ import annotations

from operators.errors import DedupError


class SenderError(DedupError):
    """Base of the senders' errors."""


class TransactionStuckError(SenderError):
    """A worker's Kafka transaction outlived every timeout it was given; the worker starts over."""


class InvalidTransitionError(SenderError):
    """A status change the state machine does not allow (a bug, or a corrupted store)."""

    def __init__(self, old: str | None, new: str) -> None:
        super().__init__(f"status cannot change from {old or 'nothing'} to {new}")
        self.old = old
        self.new = new


class StatusStoreError(SenderError):
    """The status store is unreachable or not what this code expects."""


class StoreUnavailableError(StatusStoreError):
    """The status store did not answer, or stayed locked: worth trying again after a pause."""


class InstanceInUseError(SenderError):
    """Another live ``senders run`` process holds this process's identity (its instance id, or a
    SQLite store, which serves one process). Starting anyway would fence each other's producers."""


class ProviderError(SenderError):
    """A provider did not accept a message; ``reason`` is fit for logs (no address, no params)."""

    def __init__(self, provider: str, reason: str, *, status_code: int | None = None) -> None:
        super().__init__(f"{provider}: {reason}")
        self.provider = provider
        self.reason = reason
        self.status_code = status_code


class ProviderRetryableError(ProviderError):
    """Worth trying again later: timeouts, throttling, 5xx, 4xx SMTP replies.

    ``retry_after_s`` is the provider's own hint (HTTP Retry-After), when it gave one.
    """

    def __init__(
        self,
        provider: str,
        reason: str,
        *,
        status_code: int | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(provider, reason, status_code=status_code)
        self.retry_after_s = retry_after_s


class ProviderPermanentError(ProviderError):
    """Trying again cannot help. ``deactivate_address`` when the address itself is the cause
    (unknown recipient, invalid number), so it is not tried again for any message.
    ``credentials`` when the provider refused our credentials or our sender's identity (a key
    revoked, a project that does not own the token): never the address's fault, and an operator's
    to fix (``provider_auth_failures_total``, an alert)."""

    def __init__(
        self,
        provider: str,
        reason: str,
        *,
        status_code: int | None = None,
        deactivate_address: bool = True,
        credentials: bool = False,
    ) -> None:
        super().__init__(provider, reason, status_code=status_code)
        self.deactivate_address = deactivate_address and not credentials
        self.credentials = credentials
