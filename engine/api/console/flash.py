"""One-time messages after an action ("Run 42 cancelled", "3 runs resubmitted"): the action's
redirect carries the message in a signed cookie, the next full page shows it at its top (a
`status` region) and clears the cookie, so it shows once.

The cookie (`sasflow_flash`, path /ui, HttpOnly, SameSite=Strict) is signed with the session's
key under its own salt, so a page cannot be made to show a message the server did not write;
it lives 5 minutes at most. htmx requests (a panel refreshing itself) neither show nor clear
it: the message waits for the page the action redirected to.

For an action's route: `views.redirect(request, who, location, flash="Alert 7 acknowledged")`;
for a response made another way, `console_of(request).flash.put(request, response, message)`.
"""

from __future__ import annotations

from itsdangerous import BadSignature, URLSafeTimedSerializer
from starlette.requests import Request
from starlette.responses import Response

COOKIE = "sasflow_flash"
MAX_AGE_S = 300
MAX_CHARS = 500
"""A message is cut to this length (a cookie holds 4 kB)."""
_SALT = "sasflow.console.flash"


class FlashCodec:
    """Writes and reads the one-time message with the server's signing key."""

    def __init__(self, key: bytes) -> None:
        self._serializer = URLSafeTimedSerializer(key, salt=_SALT)

    def put(self, request: Request, response: Response, message: str) -> None:
        """Have the next full page show `message`."""
        text = message if len(message) <= MAX_CHARS else message[: MAX_CHARS - 1] + "…"
        response.set_cookie(
            COOKIE,
            self._serializer.dumps(text),
            max_age=MAX_AGE_S,
            path="/ui",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )

    def pending(self, request: Request) -> str | None:
        """The message waiting for this request's page (None: none, a bad signature, too old,
        or an htmx request, which never takes it)."""
        if request.headers.get("HX-Request") or COOKIE not in request.cookies:
            return None
        try:
            found = self._serializer.loads(request.cookies[COOKIE], max_age=MAX_AGE_S)
        except BadSignature:
            return None
        return found if isinstance(found, str) else None

    @staticmethod
    def clear(request: Request, response: Response) -> None:
        """Forget the message once a page showed it (or it could not be read)."""
        if request.headers.get("HX-Request") or COOKIE not in request.cookies:
            return
        response.delete_cookie(COOKIE, path="/ui", httponly=True, samesite="strict")
