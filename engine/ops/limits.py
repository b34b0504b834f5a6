"""Operator actions on flow limits (docs/flow-control.md): list, show, set, delete.

Each change validates the definition, writes the row, is audited with its actor and reason
(`limits.set`, `limits.delete`) and wakes every scheduler (NOTIFY), which re-reads its flow
plan; the budgeted claim reads the limits under lock, so new numbers hold from the next claim.
The CLI, the HTTP API and the console call these functions.
"""

from __future__ import annotations

from typing import Any

from sasflow.errors import InvalidLimitError, LimitNotFoundError
from sasflow.ops.reasons import REASON_MAX, has_text
from sasflow.store.db import Connection
from sasflow.store.flow import limits
from sasflow.store.flow.fleet import read_fleet
from sasflow.store.flow.model import Limit
from sasflow.store.flow.plan import FlowPlan, make_plan
from sasflow.store.flow.state import limit_state
from sasflow.store.operator.audit import AuditRecord, record


def _plan(conn: Connection) -> FlowPlan:
    return make_plan(limits.enabled_limits(conn), read_fleet(conn), fleet_bound=True)


def _view(conn: Connection, row: dict[str, Any], plan: FlowPlan) -> dict[str, Any]:
    limit = limits.to_limit(row)
    return {
        **row,
        "description": limit.describe(),
        "burst_effective": limit.effective_burst if limit.rate is not None else None,
        "state": limit_state(conn, limit, plan),
    }


def list_limits(conn: Connection) -> list[dict[str, Any]]:
    """Every limit, by name, with its live state (see `store.flow.state.limit_state`)."""
    plan = _plan(conn)
    return [_view(conn, row, plan) for row in limits.all_rows(conn)]


def show(conn: Connection, name: str) -> dict[str, Any]:
    """One limit with its live state."""
    row = limits.find(conn, name)
    if row is None:
        raise LimitNotFoundError(f"no flow limit named {name!r}")
    return _view(conn, row, _plan(conn))


def _check_reason(reason: str) -> None:
    if not has_text(reason) or len(reason) > REASON_MAX:
        raise InvalidLimitError(
            f"a change of a limit needs a reason with text (1 to {REASON_MAX} characters)"
        )


def _audit(conn: Connection, action: str, actor: str, reason: str, detail: Any) -> None:
    record(conn, AuditRecord(actor=actor, action=f"limits.{action}", reason=reason, detail=detail))


def set_limit(
    conn: Connection, limit: Limit, *, actor: str, reason: str, namespace: str
) -> dict[str, Any]:
    """Create or replace the limit `limit.name`; the limit as shown afterwards, with
    `created`."""
    _check_reason(reason)
    created = limits.save(conn, limit, actor=actor, reason=reason)
    row = limits.find(conn, limit.name)
    if row is None:  # pragma: no cover - written in this transaction
        raise LimitNotFoundError(f"no flow limit named {limit.name!r}")
    definition = {
        k: v for k, v in row.items() if k not in {"created_at", "updated_at", "last_admitted_at"}
    }
    _audit(conn, "set", actor, reason, {"created": created, "limit": definition})
    limits.notify_changed(conn, namespace)
    return {**_view(conn, row, _plan(conn)), "created": created}


def delete(
    conn: Connection, name: str, *, actor: str, reason: str, namespace: str
) -> dict[str, Any]:
    """Delete the limit (and its buckets); the row as it was."""
    _check_reason(reason)
    row = limits.find(conn, name, lock=True)
    if row is None:
        raise LimitNotFoundError(f"no flow limit named {name!r}")
    limits.remove(conn, name)
    definition = {
        k: v for k, v in row.items() if k not in {"created_at", "updated_at", "last_admitted_at"}
    }
    _audit(conn, "delete", actor, reason, {"limit": definition})
    limits.notify_changed(conn, namespace)
    return row
