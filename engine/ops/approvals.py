"""Approvals (`Step.approval`): list the open ones, approve (with the form's fields) or reject
(with a reason), the one service behind `sasflow approvals`, `/v1/approvals`,
`/v1/runs/{id}/steps/{step}/approve|reject` and the console (docs/concepts.md, "Approvals").

A decision is fenced and exactly once: the run is locked, then the step; only an open approval
(its step pending) changes, so a second decision is refused (InvalidActionError, 409) saying
who decided. Who may decide: a token holding the approval's scope (`approve`, or
`approve:<group>` for a named group of approvers) or `admin`. Every decision is an event of the
step in the run's timeline and a record of the audit trail (`approvals.approve`,
`approvals.reject`) with the actor and the comment or reason; it closes the approval's
`approval_overdue` alert.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sasflow.approvals import APPROVAL_EVENT, DEFAULT_GROUP, MAX_TEXT, scope_of, validate_form
from sasflow.commands import StoredError
from sasflow.errors import (
    ApprovalForbiddenError,
    ApprovalNotFoundError,
    InvalidActionError,
    InvalidFormError,
)
from sasflow.ops.actions import lock_run
from sasflow.ops.reasons import REASON_MAX, has_text
from sasflow.ops.tokens import grants
from sasflow.registry import Registry
from sasflow.states import StepState
from sasflow.store.db import Connection
from sasflow.store.inbound import approvals as store
from sasflow.store.inbound.match import MatchReport
from sasflow.store.operator import audit
from sasflow.store.operator import transitions as operator
from sasflow.store.runs import events
from sasflow.store.runs.completed import advance_completed
from sasflow.store.runs.parked import raise_parked_alerts
from sasflow.waits import EVENT_AGENT

MAX_LISTED = 1000
APPROVED = "approved"
REJECTED = "rejected"


def may_decide(scopes: Iterable[str], group: str) -> bool:
    """Whether a token with `scopes` may decide approvals of `group`: it holds the group's scope
    (`approve` for the default group, `approve:<group>` for another) or `admin`. The plain
    `approve` scope does not decide a named group's approvals."""
    return grants(scopes, scope_of(group))


def describe(row: Any) -> dict[str, Any]:
    """An open approval as the doors show it."""
    approval = (row.input or {}).get("approval", {})
    return {
        "run_id": row.run_id,
        "step": row.name,
        "workflow": row.workflow,
        "version": row.version,
        "business_key": row.business_key,
        "group": approval.get("group", DEFAULT_GROUP),
        "scope": approval.get("scope", scope_of(DEFAULT_GROUP)),
        "form": approval.get("form", {}),
        "opened_at": row.opened_at.isoformat(),
        "times_out_at": None if row.times_out_at is None else row.times_out_at.isoformat(),
        "escalate_at": None if row.escalate_at is None else row.escalate_at.isoformat(),
    }


def list_open(
    conn: Connection,
    *,
    workflow: str | None = None,
    group: str | None = None,
    run_id: int | None = None,
    limit: int = 100,
) -> list[dict[str, Any]]:
    """Open approvals, oldest first, of `workflow`, of approvers' `group`, of run `run_id`."""
    rows = store.open_approvals(
        conn, workflow=workflow, group=group, run_id=run_id, limit=max(1, min(limit, MAX_LISTED))
    )
    return [describe(r) for r in rows]


def approve(
    conn: Connection,
    run_id: int,
    step: str,
    *,
    actor: str,
    scopes: Iterable[str],
    fields: Mapping[str, Any],
    comment: str | None = None,
    namespace: str,
    registry: Registry | None = None,
) -> dict[str, Any]:
    """Approve the open approval `step` of run `run_id` with its form's `fields` (validated:
    InvalidFormError names each refused field), in the caller's transaction: the step is
    processed with the fields and `{decision, by, at, comment}` as its output, and the run
    advances."""
    row = _open_for(conn, run_id, step, scopes)
    if comment is not None and len(comment) > MAX_TEXT:
        raise InvalidFormError({"comment": f"must be at most {MAX_TEXT} characters"})
    clean, refused = validate_form((row.input or {}).get("approval", {}).get("form", {}), fields)
    if refused:
        raise InvalidFormError(refused)
    at = audit.database_now(conn).isoformat()
    output = {**clean, "decision": APPROVED, "by": actor, "at": at, "comment": comment}
    done = store.decide(conn, row.id, StepState.PROCESSED, output=output)
    if done is None:  # the run lock makes this unreachable; the fence says so anyway
        raise InvalidActionError(f"approval {step!r} of run {run_id} is no longer open")
    _record(conn, row, done, StepState.PROCESSED, actor=actor, why=comment, detail=output)
    return _advance(conn, row, done, StepState.PROCESSED, output, actor, namespace, registry)


def reject(
    conn: Connection,
    run_id: int,
    step: str,
    *,
    actor: str,
    scopes: Iterable[str],
    reason: str,
    namespace: str,
    registry: Registry | None = None,
) -> dict[str, Any]:
    """Reject the open approval `step` of run `run_id` with `reason` (required), in the
    caller's transaction: the step fails permanently (`ApprovalRejectedError`), or parks when
    its policy parks permanent errors, and the run follows its failure policy."""
    row = _open_for(conn, run_id, step, scopes)
    if not has_text(reason) or len(reason) > REASON_MAX:
        raise InvalidFormError({"reason": f"a reason with text is required (1 to {REASON_MAX})"})
    at = audit.database_now(conn).isoformat()
    decision = {"decision": REJECTED, "by": actor, "at": at, "reason": reason}
    error = StoredError("ApprovalRejectedError", f"rejected by {actor}: {reason}", decision)
    state = StepState.PARKED if row.park_errors else StepState.ERROR
    done = store.decide(conn, row.id, state, error=error.to_json())
    if done is None:
        raise InvalidActionError(f"approval {step!r} of run {run_id} is no longer open")
    _record(conn, row, done, state, actor=actor, why=reason, detail=decision)
    if state == StepState.PARKED:
        raise_parked_alerts(conn, [row.id], actor=actor)
    return _advance(conn, row, done, state, decision, actor, namespace, registry)


@dataclass(frozen=True)
class Decision:
    """What a person decides: `approve` with the form's `fields` and a `comment`, or `reject`
    with a `reason`."""

    verb: str
    fields: Mapping[str, Any] = field(default_factory=dict)
    comment: str | None = None
    reason: str = ""


def decide(
    conn: Connection,
    run_id: int,
    step: str,
    decision: Decision,
    *,
    actor: str,
    scopes: Iterable[str],
    namespace: str,
    registry: Registry | None = None,
) -> dict[str, Any]:
    """`approve` or `reject` as `decision` says (the doors' one call)."""
    if decision.verb == "approve":
        return approve(
            conn,
            run_id,
            step,
            fields=decision.fields,
            comment=decision.comment,
            actor=actor,
            scopes=scopes,
            namespace=namespace,
            registry=registry,
        )
    if decision.verb == "reject":
        return reject(
            conn,
            run_id,
            step,
            reason=decision.reason,
            actor=actor,
            scopes=scopes,
            namespace=namespace,
            registry=registry,
        )
    raise InvalidActionError(f"unknown decision {decision.verb!r}: approve or reject")


def _open_for(conn: Connection, run_id: int, step: str, scopes: Iterable[str]) -> Any:
    """The approval `step` of run `run_id`, its run and step locked, if `scopes` may decide it
    and it is open."""
    lock_run(conn, run_id)
    row = store.approval_step(conn, run_id, step)
    if row is None or row.agent != EVENT_AGENT or row.action != APPROVAL_EVENT:
        raise ApprovalNotFoundError(f"run {run_id} has no approval step {step!r}")
    group = _group_of(row)
    if group is not None and not may_decide(scopes, group):
        raise ApprovalForbiddenError(
            f"deciding approval {step!r} needs the {scope_of(group)!r} scope (or 'admin'); "
            f"the token has: {', '.join(sorted(scopes)) or 'none'}"
        )
    if row.state != StepState.PENDING:
        decided = _decision_of(row)
        raise InvalidActionError(
            f"approval {step!r} of run {run_id} was already {decided}"
            if decided
            else f"approval {step!r} of run {run_id} is {row.state}: only an open approval "
            "can be decided"
        )
    return row


def _group_of(row: Any) -> str | None:
    """The approval's group, from its input once it opened; None before (not open: refused)."""
    approval = row.input.get("approval") if isinstance(row.input, dict) else None
    return str(approval.get("group", DEFAULT_GROUP)) if isinstance(approval, dict) else None


def _decision_of(row: Any) -> str | None:
    """`approved by X at T` / `rejected by X at T: reason` of a decided approval, else None."""
    output = row.output if isinstance(row.output, dict) else {}
    if output.get("decision") == APPROVED:
        return f"approved by {output.get('by')} at {output.get('at')}"
    return None


def _record(
    conn: Connection,
    row: Any,
    done: Any,
    state: StepState,
    *,
    actor: str,
    why: str | None,
    detail: dict[str, Any],
) -> None:
    """The decision in the audit trail, and its `approval_overdue` alert closed."""
    verb = APPROVED if state == StepState.PROCESSED else REJECTED
    audit.record(
        conn,
        audit.AuditRecord(
            actor=actor,
            action=f"approvals.{'approve' if verb == APPROVED else 'reject'}",
            reason=why,
            detail={"run_id": row.run_id, "step": row.name, "workflow": row.workflow, **detail},
        ),
    )
    store.resolve_overdue(conn, done.id, actor=actor, reason=verb)


def _advance(  # noqa: PLR0917
    conn: Connection,
    row: Any,
    done: Any,
    state: StepState,
    detail: dict[str, Any],
    actor: str,
    namespace: str,
    registry: Registry | None,
) -> dict[str, Any]:
    """The step's event recorded with the run's advance; what the doors answer."""
    verb = APPROVED if state == StepState.PROCESSED else REJECTED
    event = events.step_event(
        done, StepState.PENDING, state, actor=actor, reason=verb, detail=detail
    )
    report = MatchReport()
    advance_completed(
        conn, registry, {row.run_id}, [event], report, namespace=namespace, actor=actor
    )
    return {
        "run_id": row.run_id,
        "step": row.name,
        "decision": verb,
        "by": actor,
        "at": detail["at"],
        "step_state": str(state),
        "run_state": operator.run_state(conn, row.run_id),
    }
