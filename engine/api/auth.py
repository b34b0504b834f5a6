"""Bearer-token authentication: `require(scope)` is the dependency every endpoint names.

No `Authorization: Bearer TOKEN` header, or a token that is unknown or revoked -> 401; a
token without the scope -> 403 (`admin` holds every scope). Both say why in the error body.

In the OpenAPI document the token is the `bearer` security scheme, and each operation names
the scope it needs (`security: [{"bearer": ["read"]}]`): Swagger UI's Authorize button and
generated clients send the token.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from sasflow.api.context import ApiContext, get_context
from sasflow.api.errors import ApiError
from sasflow.ops import tokens

_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="sasflow"'}

BEARER = HTTPBearer(
    scheme_name="bearer",
    bearerFormat="sft_...",
    description="A token from `sasflow tokens create --name NAME --scope SCOPE`. Its scopes: "
    "`read` (GET runs, alerts, schedules, schedulers, agents, limits; the subscription "
    "stream), `submit` (POST /v1/runs), `operate` (cancel, resubmit, acknowledge, pause, "
    "resume, trigger, drain, undrain, change limits), `approve` (decide approvals; "
    "`approve:<group>` those of a named group of approvers), `admin` (every scope). An operation "
    "names the scope it needs.",
    auto_error=False,  # `authenticate` says what is wrong, in the API's error shape
)


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


def authenticated(scope: str) -> Callable[[Request, ApiContext], Principal]:
    """A dependency that authenticates the request and leaves the scope to the service: the
    resource says which it needs (an approval's group: `approve` or `approve:<group>`).
    `scope` is what the OpenAPI document names."""
    if scope not in tokens.SCOPES:
        raise ValueError(f"unknown scope {scope!r}")

    def dependency(
        request: Request,
        ctx: Annotated[ApiContext, Depends(get_context)],
        _: HTTPAuthorizationCredentials | None = Security(BEARER, scopes=[scope]),  # noqa: B008
    ) -> Principal:
        return authenticate(request, ctx)

    return dependency


def require(scope: str) -> Callable[[Principal], Principal]:
    """A dependency that authenticates the request and checks that its token has `scope`."""
    authenticated_ = authenticated(scope)

    # A default, not Annotated: the annotation is read as a string, where it is unknown.
    def dependency(principal: Principal = Depends(authenticated_)) -> Principal:  # noqa: B008
        if not principal.may(scope):
            held = ", ".join(sorted(principal.scopes))
            raise ApiError(
                403,
                "forbidden",
                f"token {principal.name!r} lacks the {scope!r} scope (it has: {held})",
            )
        return principal

    return dependency
