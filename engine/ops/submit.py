"""Record a run for the HTTP API (or any caller with a token name): checked like a message."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import ValidationError

from sasflow.backpressure import split_batch
from sasflow.commands import NewRun, Refused, SubmitResult
from sasflow.doors import BacklogGate, admit_one, known_keys
from sasflow.errors import (
    BacklogFullError,
    InvalidInputError,
    InvalidMessageError,
    UnknownWorkflowError,
)
from sasflow.messages import Limits, Submission, encode_within, problems_line
from sasflow.registry import Registry
from sasflow.store.db import Connection
from sasflow.store.runs.submit import record_runs, submit

Answer = SubmitResult | Refused | BacklogFullError
"""One submission's answer in a batch: its run, why it was refused, or that its workflow's
backlog is at its bound (submit it again after `retry_after`)."""


def submit_run(
    conn: Connection,
    registry: Registry,
    new: NewRun,
    *,
    actor: str,
    namespace: str,
    limits: Limits,
    backlog: BacklogGate | None = None,
) -> SubmitResult:
    """Record `new` in the caller's transaction, idempotently on (workflow, key); its size and
    nesting are checked as the submitter checks a message. `actor` goes into the run's first
    event. With `backlog`, a workflow at its bound raises BacklogFullError, unless the key
    names an existing run (docs/backpressure.md)."""
    check_size(new, limits)
    if backlog is None:
        return submit(conn, registry, new, namespace=namespace, actor=actor)
    workflow = registry.workflow(new.workflow)  # the latest version's bound
    admit_one(conn, backlog.room(conn, workflow), new.key)
    result = submit(conn, registry, new, namespace=namespace, actor=actor)
    if result.created:
        backlog.admitted(workflow.name, 1)
    return result


def check_size(new: NewRun, limits: Limits) -> None:
    """InvalidInputError when `new` is larger or deeper than a submission message may be."""
    try:
        encode_within(
            Submission(
                workflow=new.workflow,
                input=new.input,
                key=new.key,
                priority=new.priority,
                version=new.version,
            ),
            limits,
        )
    except ValidationError as exc:
        raise InvalidInputError(f"invalid submission: {problems_line(exc)}") from exc
    except InvalidMessageError as exc:
        raise InvalidInputError(f"invalid submission: {exc}") from exc


def submit_runs(
    conn: Connection,
    registry: Registry,
    news: Sequence[NewRun],
    *,
    actor: str,
    namespace: str,
    limits: Limits,
    backlog: BacklogGate | None = None,
    isolate: bool = False,
) -> list[Answer]:
    """Record `news` in the caller's transaction, in one statement where the workflows allow
    it (store.runs.submit.record_runs): one answer per submission, in order. Each is checked
    as `submit_run` checks one; with `backlog`, the submissions past their workflow's bound
    (the first ones of each workflow are admitted, as the submitter admits a batch) are
    answered BacklogFullError, unless their key names a run.

    Without `isolate`, data the database refuses raises InvalidInputError and the caller's
    transaction must be rolled back: submit again with `isolate` to find which one it was
    (record_runs)."""
    answers: list[Answer | None] = [None] * len(news)
    checked: list[int] = []
    for i, new in enumerate(news):
        try:
            check_size(new, limits)
        except InvalidInputError as exc:
            answers[i] = Refused(exc)
            continue
        checked.append(i)
    if backlog is not None:
        checked = _admit(conn, registry, news, checked, backlog=backlog, answers=answers)
    recorded = record_runs(
        conn,
        registry,
        [news[i] for i in checked],
        namespace=namespace,
        actor=actor,
        isolate=isolate,
    )
    for i, answer in zip(checked, recorded, strict=True):
        answers[i] = answer
        if backlog is not None and isinstance(answer, SubmitResult) and answer.created:
            backlog.admitted(news[i].workflow, 1)
    done = [a for a in answers if a is not None]
    if len(done) != len(news):
        raise RuntimeError("submit_runs left a submission unanswered")
    return done


def _admit(
    conn: Connection,
    registry: Registry,
    news: Sequence[NewRun],
    checked: list[int],
    *,
    backlog: BacklogGate,
    answers: list[Answer | None],
) -> list[int]:
    """The indexes of `checked` admitted under their workflows' bounds, in order; those past
    a bound get their BacklogFullError in `answers`."""
    by_workflow: dict[str, list[int]] = {}
    for i in checked:
        by_workflow.setdefault(news[i].workflow, []).append(i)
    over: set[int] = set()
    for name, indexes in by_workflow.items():
        try:
            workflow = registry.workflow(name)  # the latest version's bound
        except UnknownWorkflowError:
            continue  # record_runs refuses them
        room = backlog.room(conn, workflow)
        past = split_batch(room, indexes).over
        if not past:
            continue
        # A key that names a run is answered (a duplicate), never refused.
        known = known_keys(conn, name, [k for i in past if (k := news[i].key) is not None])
        for i in past:
            if news[i].key not in known:
                answers[i] = room.refusal()
                over.add(i)
    return [i for i in checked if i not in over]


def known_workflows(registry: Registry) -> list[str]:
    """The names an unknown workflow's error lists."""
    return sorted({w.name for w in registry.workflows})
