"""Which scheme checks and reads the receipts of each provider, by the provider's name as the
senders give it (``POST /webhooks/{provider}``), built from the settings:

* a name in ``api.webhook_secrets`` (``provider=secret;...``): this project's own receipts
  (HMAC-SHA256, ``api.receipts.notify``), as before;
* ``twilio``: Twilio's signed status callbacks, when ``[senders.twilio]`` has ``auth_token``,
  ``account_sid`` and ``status_callback`` (``api.receipts.twilio``);
* ``sendgrid``: SendGrid's signed event webhook, when ``[senders.sendgrid]`` has
  ``webhook_public_key`` (``api.receipts.sendgrid``).

A name given in ``api.webhook_secrets`` keeps this project's scheme whatever it is. Any other
name has no receipts: its POSTs are refused (401).
"""

from __future__ import annotations

from collections.abc import Mapping

from api.receipts.model import ReceiptScheme
from api.receipts.notify import NotifyReceipts
from api.receipts.sendgrid import SendGridReceipts
from api.receipts.twilio import TwilioReceipts
from senders.providers import sendgrid, twilio
from settings import Settings
from settings.sms_email import load_event_webhook_key


def receipt_schemes(cfg: Settings, secrets: Mapping[str, bytes]) -> dict[str, ReceiptScheme]:
    """provider name -> its receipts' scheme; ``secrets``: ``api.webhook_secrets`` parsed."""
    tolerance = cfg.api.webhook_tolerance_s
    out: dict[str, ReceiptScheme] = {name: NotifyReceipts(secret, tolerance) for name, secret in secrets.items()}
    t, g = cfg.senders.twilio, cfg.senders.sendgrid
    if t.auth_token is not None and t.account_sid and t.status_callback:
        out.setdefault(twilio.SPEC, TwilioReceipts(t.auth_token, t.status_callback, t.account_sid))
    if g.webhook_public_key:
        out.setdefault(sendgrid.SPEC, SendGridReceipts(load_event_webhook_key(g.webhook_public_key), tolerance))
    return out
