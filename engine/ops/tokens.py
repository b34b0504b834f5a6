"""HTTP API tokens: create (the secret is shown once), list, revoke, and authenticate.

A token is `sft_` and 43 random URL-safe characters (256 bits). Only its SHA-256 is stored:
a slow password hash buys nothing against a secret of that entropy and would cost every
request a few milliseconds. Scopes: `submit`, `read`, `operate`, `approve`, `admin`, and
`approve:<group>` for a named group of approvers (`Step.approval(approvers=...)`); `admin`
implies every other.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sasflow.approvals import is_group_scope
from sasflow.errors import InvalidTokenError, TokenNotFoundError
from sasflow.store.db import Connection
from sasflow.store.operator import audit, tokens

SCOPES = ("submit", "read", "operate", "approve", "admin")
"""submit: POST runs; read: GET runs and alerts; operate: cancel, resubmit, acknowledge;
approve: decide approvals of the default group (`approve:<group>`: of that group only);
admin: all of them."""
ADMIN = "admin"
PREFIX = "sft_"
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.@-]{0,99}$")


@dataclass(frozen=True)
class NewToken:
    """A created token: `secret` is shown once and never stored."""

    secret: str
    token: dict[str, Any]


def hash_token(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def grants(scopes: Iterable[str], scope: str) -> bool:
    """Whether a token with `scopes` may do what needs `scope`."""
    held = set(scopes)
    return scope in held or ADMIN in held


def create(conn: Connection, *, name: str, scopes: Iterable[str], actor: str) -> NewToken:
    """A new token named `name` with `scopes` (audited as `tokens.create`)."""
    chosen = sorted(set(scopes))
    unknown = [s for s in chosen if s not in SCOPES and not is_group_scope(s)]
    if not NAME_PATTERN.fullmatch(name) or not chosen or unknown:
        detail = f"unknown scopes {unknown}; " if unknown else ""
        raise InvalidTokenError(
            f"{detail}a token needs a name matching {NAME_PATTERN.pattern} and one or more "
            f"scopes of {', '.join(SCOPES)}, or approve:<group> (group: letters, digits, '_', "
            "'-'; at most 50)"
        )
    if tokens.live_name_taken(conn, name):
        raise InvalidTokenError(f"a live token named {name!r} exists: revoke it first")
    secret = PREFIX + secrets.token_urlsafe(32)
    row = tokens.insert_token(
        conn, name=name, token_hash=hash_token(secret), scopes=chosen, created_by=actor
    )
    audit.record(
        conn,
        audit.AuditRecord(
            actor=actor,
            action="tokens.create",
            reason=None,
            detail={"name": name, "scopes": chosen},
        ),
    )
    return NewToken(secret, row)


def list_tokens(conn: Connection, *, include_revoked: bool = False) -> list[dict[str, Any]]:
    """Every live token (and the revoked ones too with `include_revoked`), never a secret."""
    found: list[dict[str, Any]] = tokens.list_tokens(conn, include_revoked=include_revoked)
    return found


def revoke(conn: Connection, name: str, *, actor: str, reason: str) -> dict[str, Any]:
    """Revoke the live token `name` (audited as `tokens.revoke`); requests with it get 401."""
    row = tokens.revoke_token(conn, name)
    if row is None:
        raise TokenNotFoundError(f"no live token named {name!r}")
    audit.record(
        conn,
        audit.AuditRecord(
            actor=actor, action="tokens.revoke", reason=reason, detail={"name": name}
        ),
    )
    return row


def authenticate(conn: Connection, secret: str) -> dict[str, Any] | None:
    """The live token whose secret this is, or None."""
    if not secret.startswith(PREFIX):
        return None
    return tokens.token_by_hash(conn, hash_token(secret))


def authenticate_hash(conn: Connection, token_hash: str) -> dict[str, Any] | None:
    """The live token with this hash (what a console session keeps), or None."""
    return tokens.token_by_hash(conn, token_hash)
