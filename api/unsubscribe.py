"""``POST /unsubscribe?u=<user id>&t=<token>``: the one-click unsubscribe of a marketing email
(RFC 8058: the mail client POSTs ``List-Unsubscribe=One-Click`` to the ``List-Unsubscribe``
URL, ``senders.policy.unsubscribe``). No bearer token: the link's own token, an HMAC of the user
id with one of ``senders.unsubscribe_secrets``, is the authentication (a wrong or missing one is
401, the reason logged, never told). The user is opted out of marketing email
(``ProfileStore.apply_preferences``, as ``PUT /v1/users/{id}/preferences`` does); the same POST
again changes nothing. A user without a profile (erased since) gets none.

``GET`` of the same URL (someone opening the link) answers a page with one button that makes
the POST: a GET never unsubscribes, so a link scanner following it changes nothing.
"""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse
from pydantic import BaseModel

from api.docs import errors
from api.errors import ApiError
from api.services import services
from api.users import check_user
from senders.policy import unsubscribe
from senders.store.db import Database
from senders.store.profiles import ProfileStore

logger = logging.getLogger(__name__)
router = APIRouter()

User = Annotated[str, Query(alias=unsubscribe.USER_PARAM, min_length=1, max_length=512, description="the user id")]
Token = Annotated[str, Query(alias=unsubscribe.TOKEN_PARAM, min_length=1, max_length=128,
                             description="the link's token")]
REFUSED = ApiError(401, "unauthorized", "this unsubscribe link is not valid")
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
}
_FIELD, _VALUE = unsubscribe.ONE_CLICK.split("=")
#: its form posts the one-click body to the page's own URL (the query holds the user and token)
PAGE = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Unsubscribe</title></head>
<body><form method="post"><input type="hidden" name="{_FIELD}" value="{_VALUE}">
<p>Stop marketing email to you?</p><button type="submit">Unsubscribe</button></form></body></html>
"""


class Unsubscribed(BaseModel):
    channel: str = "email"
    marketing: bool = False


@router.post("/unsubscribe", response_model=Unsubscribed, responses=errors(400, 401, 413, 503),
             summary="One-click unsubscribe from marketing email (RFC 8058; the link's signed token)")
async def one_click(user: User, token: Token, request: Request) -> Unsubscribed:
    s = services(request)
    check_user(s, user, "u")
    if not unsubscribe.genuine(s.cfg.senders.unsubscribe_keys(), user, token):
        logger.warning("refused an unsubscribe: %s", "no unsubscribe_secrets configured"
                       if not s.cfg.senders.unsubscribe_keys() else "bad token")
        raise REFUSED

    def opt_out(db: Database) -> bool:
        profiles = ProfileStore(db, s.cipher)
        if profiles.get(user) is None:
            return False
        profiles.apply_preferences(user, {"marketing": {"email": False}})
        return True

    s.profiles.drop(user)
    if await s.pool.run(opt_out):
        logger.info("a user unsubscribed from marketing email (one-click)")
    return Unsubscribed()


@router.get("/unsubscribe", response_class=HTMLResponse, include_in_schema=False)
async def page(user: User, token: Token) -> HTMLResponse:
    return HTMLResponse(PAGE, headers=PAGE_HEADERS)
