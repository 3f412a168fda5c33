"""The ``outbox`` provider: every rendered message is kept where a developer can read it, and
nothing leaves the machine. A file per message under ``<data_dir>/outbox/<channel>/`` (format:
``senders.providers.outbox_files``) and the API's outbox page. It is the default provider of
every channel (``senders.<channel>_primary``), so that a local run delivers without any account:
a production configuration names a real one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from senders.errors import ProviderRetryableError
from senders.policy.outbox import OutboxLimits
from senders.providers.base import Provider
from senders.providers.outbox_files import OutboxWriter, new_message_id, outbox_record
from senders.runtime.metrics import Metrics
from senders.templates.render import Rendered


class OutboxProvider(Provider):
    """Writes each message to the outbox (in a worker thread: the event loop never waits on the
    disk) and answers with a generated id, the provider's reference of the message. A write that
    fails (a full disk, no permission) is a transient failure: retried like a provider's 503."""

    protocol = "outbox"

    def __init__(
        self,
        *,
        name: str = "outbox",
        root: Path,
        limits: OutboxLimits | None = None,
        metrics: Metrics | None = None,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        super().__init__(name=name, metrics=metrics)
        self.root = root
        self._writer = OutboxWriter(root, limits or OutboxLimits(), clock_ns)

    async def _try_send(self, *, to: str, message_key: str, message: Rendered) -> str | None:
        message_id = new_message_id()
        record = outbox_record(message_id=message_id, message_key=message_key, to=to, message=message)
        try:
            await asyncio.to_thread(self._writer.write, record)
        except OSError as exc:
            raise ProviderRetryableError(
                self.name, f"cannot write the outbox: {exc.strerror or type(exc).__name__}"
            ) from exc
        return message_id
