"""The HTTP API's bearer tokens: only a hash of each secret is stored."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, insert, select, update

from sasflow.store.schema import api_tokens
from sasflow.store.sqltime import now


def insert_token(
    conn: Connection, *, name: str, token_hash: str, scopes: Sequence[str], created_by: str
) -> dict[str, Any]:
    """Record a new token; the live name is unique (uq_api_tokens_live_name)."""
    row = conn.execute(
        insert(api_tokens)
        .values(name=name, token_hash=token_hash, scopes=list(scopes), created_by=created_by)
        .returning(*_SHOWN)
    ).one()
    return dict(row._mapping)


def live_name_taken(conn: Connection, name: str) -> bool:
    """Whether a live token has this name (uq_api_tokens_live_name)."""
    found = conn.execute(
        select(api_tokens.c.id).where(api_tokens.c.name == name, api_tokens.c.revoked_at.is_(None))
    ).first()
    return found is not None


def token_by_hash(conn: Connection, token_hash: str) -> dict[str, Any] | None:
    """The live token with this hash, or None (uq_api_tokens_token_hash)."""
    row = conn.execute(
        select(*_SHOWN).where(
            api_tokens.c.token_hash == token_hash, api_tokens.c.revoked_at.is_(None)
        )
    ).first()
    return None if row is None else dict(row._mapping)


def list_tokens(conn: Connection, *, include_revoked: bool = False) -> list[dict[str, Any]]:
    """Every token (never its hash), by name (a sequential scan: a handful of rows)."""
    query = select(*_SHOWN).order_by(api_tokens.c.name, api_tokens.c.id)
    if not include_revoked:
        query = query.where(api_tokens.c.revoked_at.is_(None))
    return [dict(r._mapping) for r in conn.execute(query)]


def revoke_token(conn: Connection, name: str) -> dict[str, Any] | None:
    """Revoke the live token of this name; None when there is none (uq_api_tokens_live_name)."""
    row = conn.execute(
        update(api_tokens)
        .where(api_tokens.c.name == name, api_tokens.c.revoked_at.is_(None))
        .values(revoked_at=now())
        .returning(*_SHOWN)
    ).first()
    return None if row is None else dict(row._mapping)


_SHOWN = (
    api_tokens.c.id,
    api_tokens.c.name,
    api_tokens.c.scopes,
    api_tokens.c.created_by,
    api_tokens.c.created_at,
    api_tokens.c.revoked_at,
)
