"""The provider interface: a public ``send()`` that wraps each provider's ``_try_send()`` with
its one deadline, timing, outcome logging and metrics (GOV.UK Notify's pattern). Providers are
asynchronous: many calls of one worker are in flight at once on the process's event loop."""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from operators.records import Channel
from senders.errors import ProviderError, ProviderPermanentError, ProviderRetryableError
from senders.providers.deadlines import Deadlines
from senders.runtime.metrics import CounterKey, Metrics
from senders.templates.render import Rendered

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Receipt:
    """A provider accepted a message.

    :param provider: the provider's name
    :param reference: the provider's id for the message, when it returned one
    :param elapsed_ms: how long the call took
    """

    provider: str
    reference: str | None
    elapsed_ms: float


class Provider(ABC):
    """One way out for one channel. Subclasses implement ``_try_send`` and raise
    ``ProviderRetryableError`` or ``ProviderPermanentError``; anything else they raise is
    treated as a transient failure (and logged with its traceback). ``send`` cuts a call at
    ``timeout_s`` (``asyncio.timeout``'s meaning on one timer for all calls: ``deadlines``;
    connect, TLS, login and the reply all count), whatever the server does meanwhile."""

    #: the protocol the provider speaks, set by each adapter (``http``, ``smtp``, ``outbox``, ...):
    #: ``senders run`` logs it per channel and ``make demo`` prints it
    protocol: ClassVar[str] = ""
    #: the longest one send may take (its one deadline, seconds); None: the call leaves no process
    timeout_s: float | None = None
    #: the setting that gives ``timeout_s`` (named when the lease is too short for it)
    deadline_setting = "timeout"
    #: the calls it carries at once (an SMTP relay's sessions, one message each); None: no bound
    #: of its own. The dispatcher claims no more messages than that for it, so none waits for a
    #: session inside its deadline.
    capacity: int | None = None

    def __init__(self, *, name: str, metrics: Metrics | None = None) -> None:
        self.name = name
        self.metrics = metrics if metrics is not None else Metrics()
        self._counter_keys: dict[tuple[str, Channel, str], tuple[CounterKey, CounterKey]] = {}
        self._deadlines = Deadlines()

    async def send(self, *, to: str, message_key: str, message: Rendered) -> Receipt:
        """Send one rendered message; ``message_key`` doubles as the idempotency key. Raises
        ProviderError."""
        start = time.monotonic()
        outcome = "sent"
        channel = message.channel
        try:
            if self.timeout_s is None:
                reference = await self._try_send(to=to, message_key=message_key, message=message)
            else:
                async with self._deadlines.within(self.timeout_s):
                    reference = await self._try_send(to=to, message_key=message_key, message=message)
        except TimeoutError:
            outcome = "transient"
            logger.debug("%s: no reply to %s in time", self.name, message_key, extra={"provider": self.name})
            raise ProviderRetryableError(self.name, f"no reply within {self.timeout_s:g} s") from None
        except ProviderRetryableError as exc:
            outcome = "transient"
            logger.debug(
                "%s did not take %s (transient): %s",
                self.name,
                message_key,
                exc.reason,
                extra={"message_key": message_key, "provider": self.name},
            )
            raise
        except ProviderPermanentError as exc:
            outcome = "permanent"
            if exc.credentials:  # an operator's to fix: counted for the alert, and said
                self.metrics.inc("provider_auth_failures_total", provider=self.name, channel=channel.value)
                logger.warning(
                    "%s refused our credentials on %s: %s",
                    self.name,
                    message_key,
                    exc.reason,
                    extra={"message_key": message_key, "provider": self.name},
                )
            else:
                logger.debug(
                    "%s rejected %s (permanent): %s",
                    self.name,
                    message_key,
                    exc.reason,
                    extra={"message_key": message_key, "provider": self.name},
                )
            raise
        except ProviderError:
            outcome = "transient"
            raise
        except Exception as exc:  # a bug or an unexpected library error: retry, and show it
            outcome = "transient"
            logger.exception(
                "%s failed on %s",
                self.name,
                message_key,
                extra={"message_key": message_key, "provider": self.name},
            )
            raise ProviderRetryableError(self.name, f"unexpected {type(exc).__name__}") from exc
        finally:
            elapsed = (time.monotonic() - start) * 1000
            calls, ms = self._call_counters(channel, outcome)
            self.metrics.add((calls, 1.0), (ms, elapsed))
        # DEBUG: a busy sender makes thousands of these a second (the counters above say it all)
        logger.debug(
            "%s accepted %s in %.0f ms",
            self.name,
            message_key,
            elapsed,
            extra={"message_key": message_key, "provider": self.name},
        )
        return Receipt(self.name, reference, elapsed)

    def _call_counters(self, channel: Channel, outcome: str) -> tuple[CounterKey, CounterKey]:
        """The keys of ``provider_calls_total`` and ``provider_call_ms_sum`` for a call's channel
        and outcome, made once (a busy sender counts thousands of calls a second)."""
        found = self._counter_keys.get((self.name, channel, outcome))
        if found is None:
            found = self._counter_keys[(self.name, channel, outcome)] = (
                self.metrics.counter_key("provider_calls_total", provider=self.name, channel=channel.value,
                                         outcome=outcome),
                self.metrics.counter_key("provider_call_ms_sum", provider=self.name, channel=channel.value),
            )
        return found

    def describe(self) -> str:
        """``<protocol> (<name>)``, e.g. ``http (sms-a.example:443)``: how logs and the demo show a
        provider (its name never holds a credential)."""
        return f"{self.protocol} ({self.name})"

    async def aclose(self) -> None:  # noqa: B027 - most providers hold no connections
        """Close the provider's connections (the pool calls this when it stops)."""

    @abstractmethod
    async def _try_send(self, *, to: str, message_key: str, message: Rendered) -> str | None:
        """Hand the rendered message over; return the provider's reference, if any."""
