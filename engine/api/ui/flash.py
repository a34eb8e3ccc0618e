"""A one-time message after a form action ("Marked 3 task instances success: a, b, c"):
set on the redirect, shown once by the page it leads to, then forgotten.

The message travels in a cookie of its own, signed with an HMAC keyed by the session's CSRF
token: only the session that acted shows it (a cookie planted by another site or another
session fails the check and is dropped unseen), and it needs no server-side state. The
page that shows it deletes the cookie in the same response, so a reload does not repeat it.
"""

import base64
import binascii
import hashlib
import hmac
from typing import Final

from fastapi import Request, Response

from engine.api.deps import get_config
from engine.api.security import principal_of

FLASH_COOKIE: Final = "sluice_flash"
#: A message longer than this is cut (a cookie holds about 4 KB; this stays well under).
MAX_FLASH_CHARS: Final = 1000
#: The names a message lists before "and N more".
MAX_NAMES: Final = 10


def _key(request: Request) -> bytes | None:
    principal = principal_of(request)
    return None if principal is None or not principal.csrf else principal.csrf.encode()


def _sign(key: bytes, payload: str) -> str:
    return hmac.new(key, payload.encode(), hashlib.sha256).hexdigest()


def set_flash(request: Request, response: Response, message: str) -> None:
    """Have the next page ``request``'s session opens show ``message`` once (nothing
    without a session: a bearer-token client reads the redirect, not a page)."""
    key = _key(request)
    if key is None:
        return
    text = message if len(message) <= MAX_FLASH_CHARS else message[: MAX_FLASH_CHARS - 1] + "…"
    payload = base64.urlsafe_b64encode(text.encode()).decode()
    response.set_cookie(
        FLASH_COOKIE,
        f"{payload}.{_sign(key, payload)}",
        path="/",
        httponly=True,
        samesite="lax",
        secure=get_config(request).api.cookie_secure,
    )


def read_flash(request: Request) -> str | None:
    """The message left for this page by the session's last action, if its signature holds."""
    cookie, key = request.cookies.get(FLASH_COOKIE), _key(request)
    if not cookie or key is None:
        return None
    payload, _, signature = cookie.rpartition(".")
    if not hmac.compare_digest(signature.encode(), _sign(key, payload).encode()):
        return None
    try:
        return base64.urlsafe_b64decode(payload.encode()).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None


def forget_flash(request: Request, response: Response) -> None:
    """Delete the message's cookie with the page that showed (or refused) it."""
    if FLASH_COOKIE in request.cookies:
        response.delete_cookie(
            FLASH_COOKIE,
            path="/",
            httponly=True,
            samesite="lax",
            secure=get_config(request).api.cookie_secure,
        )


def names(items: list[str]) -> str:
    """``a, b, c``, or the first ``MAX_NAMES`` and ``and N more``."""
    shown = ", ".join(items[:MAX_NAMES])
    rest = len(items) - MAX_NAMES
    return f"{shown} and {rest} more" if rest > 0 else shown
