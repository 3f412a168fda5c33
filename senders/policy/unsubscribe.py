"""The one-click unsubscribe link of a marketing email (pure): ``<unsubscribe_url>?u=<user
id>&t=<token>``, the token an HMAC-SHA256 of the user id with the first of
``senders.unsubscribe_secrets``; ``POST`` to it (RFC 8058: body ``List-Unsubscribe=One-Click``)
opts the user out of marketing email (``api.unsubscribe``).

The link names the user, not the message: it keeps working after the message's status row is
pruned, as a link in a mailbox must. A token is accepted with any of the keys, so a new key can
be put first without breaking the links already sent; dropping a key ends its links.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Sequence
from urllib.parse import urlencode

#: what a token signs besides the user id: a token of another purpose is never one of these
PURPOSE = b"notify-unsubscribe:email:"
#: the form body of a one-click unsubscribe POST (RFC 8058)
ONE_CLICK = "List-Unsubscribe=One-Click"
USER_PARAM = "u"
TOKEN_PARAM = "t"


def token(key: bytes, user_id: str) -> str:
    digest = hmac.new(key, PURPOSE + user_id.encode("utf-8"), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def link(base_url: str, key: bytes, user_id: str) -> str:
    """The user's unsubscribe URL."""
    query = urlencode({USER_PARAM: user_id, TOKEN_PARAM: token(key, user_id)})
    return f"{base_url}{'&' if '?' in base_url else '?'}{query}"


def headers(base_url: str, key: bytes, user_id: str) -> dict[str, str]:
    """``List-Unsubscribe`` and ``List-Unsubscribe-Post`` of a marketing email (RFC 2369, 8058)."""
    return {"List-Unsubscribe": f"<{link(base_url, key, user_id)}>", "List-Unsubscribe-Post": ONE_CLICK}


def genuine(keys: Sequence[bytes], user_id: str, given: str) -> bool:
    """Whether ``given`` is the user's token under one of ``keys`` (each compared in constant time)."""
    raw = given.encode("utf-8", "replace")
    return any(hmac.compare_digest(token(key, user_id).encode("ascii"), raw) for key in keys)
