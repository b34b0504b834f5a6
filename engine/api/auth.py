"""Bearer-token authentication: `require(scope)` is the dependency every endpoint names.

No `Authorization: Bearer TOKEN` header, or a token that is unknown or revoked -> 401; a
token without the scope -> 403 (`admin` holds every scope). Both say why in the error body.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from sasflow.api.context import ApiContext, get_context
from sasflow.api.errors import ApiError
from sasflow.ops import tokens

_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="sasflow"'}


@dataclass(frozen=True)
class Principal:
    """Who is calling: the token's id and name (the actor of every audited action) and its
    scopes."""

    token_id: int
    name: str
    scopes: frozenset[str]

    def may(self, scope: str) -> bool:
        return tokens.grants(self.scopes, scope)


def authenticate(request: Request, ctx: ApiContext) -> Principal:
    """The principal of the request's bearer token, or ApiError 401."""
    header = request.headers.get("authorization")
    if header is None:
        raise ApiError(
            401, "unauthorized", "no token: send Authorization: Bearer TOKEN", headers=_CHALLENGE
        )
    scheme, _, secret = header.partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise ApiError(
            401,
            "unauthorized",
            "the Authorization header must be 'Bearer TOKEN'",
            headers=_CHALLENGE,
        )
    found = ctx.transaction(lambda conn: tokens.authenticate(conn, secret.strip()))
    if found is None:
        raise ApiError(401, "invalid_token", "the token is unknown or revoked", headers=_CHALLENGE)
    return Principal(int(found["id"]), str(found["name"]), frozenset(found["scopes"]))


def require(scope: str) -> Callable[[Request, ApiContext], Principal]:
    """A dependency that authenticates the request and checks that its token has `scope`."""
    if scope not in tokens.SCOPES:
        raise ValueError(f"unknown scope {scope!r}")

    def dependency(request: Request, ctx: Annotated[ApiContext, Depends(get_context)]) -> Principal:
        principal = authenticate(request, ctx)
        if not principal.may(scope):
            held = ", ".join(sorted(principal.scopes))
            raise ApiError(
                403,
                "forbidden",
                f"token {principal.name!r} lacks the {scope!r} scope (it has: {held})",
            )
        return principal

    return dependency
