"""The providers' own settings: one small model per provider, each a table under ``[senders]``
(``[senders.fcm]``, ``[senders.apns]``), its variables ``DEDUP_SENDERS_<PROVIDER>_<FIELD>``
(``DEDUP_SENDERS_FCM_PROJECT_ID``).

A provider spec (``senders.<channel>_primary`` / ``_secondary``) names the model it reads:
``fcm`` -> ``[senders.fcm]``, ``apns`` -> ``[senders.apns]`` (docs/senders.md, "Providers").
What every HTTP provider shares stays in ``[senders]``: the deadline (``http_timeout_ms``) and the
CAs verified against (``http_ca_file``). Credentials are secrets: a file's path, or the secret
itself (from the environment), never both.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from settings.base import OptionalSecret, Section

DAY_S = 86_400


class PushSettings(Section):
    """What both push providers take: how long a message may wait for its device.

    :param ttl_s: a message not delivered within this long after its request's event time is
        dropped by the provider (FCM ``android.ttl``, APNs ``apns-expiration``); one already
        older is not sent (permanent, the address kept). At most 28 days (FCM's bound)
    :param code_ttl_s: the same for one-time codes (a code is worth nothing after it lapses)
    :param streams_per_connection: the most calls open at once on one HTTP/2 connection; more
        calls open more connections, up to the calls the workers may have open divided by this.
        At most 100 (httpx's own cap per connection; FCM's front ends allow 100, APNs ~1,000)
    """

    ttl_s: int = Field(default=28 * DAY_S, ge=1, le=28 * DAY_S)
    code_ttl_s: int = Field(default=600, ge=1, le=28 * DAY_S)
    streams_per_connection: int = Field(default=100, ge=1, le=100)


class FcmSettings(PushSettings):
    """Firebase Cloud Messaging, HTTP v1 (spec ``fcm``).

    :param project_id: the Firebase project (``projects/{project_id}/messages:send``); empty: the
        service-account key's ``project_id``
    :param service_account_file: the service-account key (the JSON file the Firebase console
        gives): its ``client_email``, ``private_key`` and ``token_uri`` make the OAuth2 access token
    :param service_account_json: that key's JSON itself (a secret), instead of the file
    :param base_url: where ``/v1/projects/...`` is posted; an ``http://`` URL speaks HTTP/2 in
        clear with prior knowledge (h2c: test stubs only, nothing of Google's)
    """

    project_id: str = ""
    service_account_file: str = ""
    service_account_json: OptionalSecret = None
    base_url: str = "https://fcm.googleapis.com"

    @model_validator(mode="after")
    def _one_key(self) -> FcmSettings:
        if self.service_account_file and self.service_account_json is not None:
            raise ValueError("give service_account_file or service_account_json, not both")
        return self


class ApnsSettings(PushSettings):
    """Apple Push Notification service, token-based authentication (spec ``apns``).

    :param base_url: ``https://api.push.apple.com`` (production) or
        ``https://api.sandbox.push.apple.com`` (development builds of the app); an ``http://`` URL
        speaks HTTP/2 in clear with prior knowledge (h2c: test stubs only, APNs itself is TLS only)
    :param team_id: the developer account's Team ID (the provider token's ``iss``)
    :param key_id: the signing key's Key ID (the provider token's ``kid``)
    :param key_file: the signing key, the ``.p8`` file (PEM, an EC P-256 private key)
    :param key: that key's PEM itself (a secret), instead of the file
    :param topic: the app's bundle id (``apns-topic``)
    """

    base_url: str = "https://api.push.apple.com"
    team_id: str = ""
    key_id: str = ""
    key_file: str = ""
    key: OptionalSecret = None
    topic: str = ""

    @model_validator(mode="after")
    def _one_key(self) -> ApnsSettings:
        if self.key_file and self.key is not None:
            raise ValueError("give key_file or key, not both")
        return self
