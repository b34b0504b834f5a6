"""Console sessions: a signed cookie holding the token's hash and the session's CSRF token.

The cookie is signed (itsdangerous) and expires SESSION_MAX_AGE_S after the last page that
signed it anew (an idle timeout); it is HttpOnly, SameSite=Strict, and Secure when the request
came over TLS. It holds the token's hash, never its secret, and the token is looked up again
on every request: revoking it ends the session.
Before login the cookie holds a CSRF token only, so the login form is protected too.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass

from itsdangerous import BadSignature, URLSafeTimedSerializer
from starlette.requests import Request
from starlette.responses import Response

COOKIE = "sasflow_console"
SESSION_MAX_AGE_S = 8 * 3600
_SALT = "sasflow.console.session"


@dataclass(frozen=True)
class Session:
    csrf: str
    token_hash: str | None = None

    def csrf_matches(self, sent: str | None) -> bool:
        return sent is not None and hmac.compare_digest(self.csrf, sent)


def anonymous() -> Session:
    """A session before login: a fresh CSRF token, nobody logged in."""
    return Session(csrf=secrets.token_urlsafe(32))


class SessionCodec:
    """Reads and writes the session cookie with the server's signing key."""

    def __init__(self, key: bytes) -> None:
        self._serializer = URLSafeTimedSerializer(key, salt=_SALT)

    def read(self, request: Request) -> Session | None:
        """The request's session, or None (no cookie, a bad signature, expired)."""
        value = request.cookies.get(COOKIE)
        if value is None:
            return None
        try:
            data = self._serializer.loads(value, max_age=SESSION_MAX_AGE_S)
        except BadSignature:
            return None
        if not isinstance(data, dict) or not isinstance(data.get("csrf"), str):
            return None
        token_hash = data.get("token")
        return Session(data["csrf"], token_hash if isinstance(token_hash, str) else None)

    def write(self, request: Request, response: Response, session: Session) -> None:
        value = self._serializer.dumps({"csrf": session.csrf, "token": session.token_hash})
        response.set_cookie(
            COOKIE,
            value,
            max_age=SESSION_MAX_AGE_S,
            path="/ui",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )

    @staticmethod
    def clear(response: Response) -> None:
        response.delete_cookie(COOKIE, path="/ui", httponly=True, samesite="strict")
