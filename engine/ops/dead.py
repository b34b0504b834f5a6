"""Dead letters: list, show, replay and purge what sits in `<ns>.dead` (every dead-lettered
message) or `<ns>.dead.requests` (the supervisor's copy of dead-lettered requests).

A queue cannot be browsed: every command takes the whole queue (up to `scan_limit` messages)
with basic.get and manual acks on one channel, acts on the matching ones (replay: publish to
their source queue, confirmed, then ack; purge: ack) and closes the channel, which hands every
other message back to the broker. They keep their place in a classic queue and are marked
redelivered. While a command holds them, nobody else sees them: the supervisor's next sweep
counts a held request instead.

A dead letter's id hashes what a requeue does not change (its headers, correlation id,
reply-to and body), so `replay ID` addresses the message `list` showed. Two identical
messages share an id; a command given that id acts on both.

Every replay and purge is one `audit` row (action `dead.replay` / `dead.purge`; the
supervisor's retention, supervisor.dead_letters, records `dead.expire`) with the actor, the
reason and the ids, written in a transaction that is open while the broker is touched and
commits after it; the action is also logged, in case the database fails in between.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sasflow.errors import DeadLetterNotFoundError, InvalidActionError
from sasflow.store.db import Connection
from sasflow.store.operator import audit
from sasflow.transport.base import Delivery, Outgoing, Transport
from sasflow.transport.topology import (
    DEAD_AT_HEADER,
    PROCESS_HEADER,
    REASON_HEADER,
    SOURCE_HEADER,
    Names,
    declare_common,
)

log = logging.getLogger(__name__)

REPLAY_ACTION = "dead.replay"
PURGE_ACTION = "dead.purge"
SCAN_LIMIT = 10_000
"""Messages one command holds at most; a longer queue is acted on in its first part."""
BROKER_HEADERS = ("x-death", "x-first-death-", "x-last-death-")
"""Headers RabbitMQ writes when it dead-letters a message; a replayed copy starts afresh."""


@dataclass(frozen=True)
class DeadLetter:
    """One dead-lettered message, as taken from its dead-letter queue."""

    id: str
    queue: str
    """The dead-letter queue it sits in."""
    source_queue: str | None
    """The queue it was dead-lettered from (where a replay puts it back)."""
    reason: str
    dead_lettered_at: datetime | None
    age_s: float | None
    """Seconds since it was dead-lettered, by the database's clock."""
    process: str | None
    headers: dict[str, Any]
    correlation_id: str | None
    reply_to: str | None
    body: bytes

    def body_text(self) -> str:
        """The body pretty-printed when it is JSON, else as (lossy) UTF-8 text."""
        try:
            return json.dumps(json.loads(self.body), indent=2, ensure_ascii=False)
        except ValueError:
            return self.body.decode("utf-8", errors="replace")

    def summary(self, body_chars: int | None = 200) -> dict[str, Any]:
        body = self.body_text()
        if body_chars is not None and len(body) > body_chars:
            body = body[: body_chars - 1] + "…"
        return {
            "id": self.id,
            "queue": self.queue,
            "source_queue": self.source_queue,
            "reason": self.reason,
            "dead_lettered_at": self.dead_lettered_at,
            "age_s": self.age_s,
            "process": self.process,
            "correlation_id": self.correlation_id,
            "reply_to": self.reply_to,
            "headers": self.headers,
            "body": body,
        }


@dataclass(frozen=True)
class DeadFilter:
    """Which dead letters a command selects; every given condition must hold."""

    ids: tuple[str, ...] = ()
    reason: str | None = None
    """A substring of the reason (case-insensitive)."""
    source: str | None = None
    """The source queue, with or without the namespace prefix (`submit`, `agent.payments`)."""
    older_than_s: float | None = None
    newer_than_s: float | None = None
    limit: int | None = None

    def matches(self, letter: DeadLetter, namespace: str) -> bool:
        if self.ids and letter.id not in self.ids:
            return False
        if self.reason is not None and self.reason.lower() not in letter.reason.lower():
            return False
        if self.source is not None and letter.source_queue != _qualified(self.source, namespace):
            return False
        if self.older_than_s is not None and (letter.age_s or 0.0) < self.older_than_s:
            return False
        return not (self.newer_than_s is not None and (letter.age_s or 0.0) > self.newer_than_s)


@dataclass(frozen=True)
class Scan:
    letters: list[DeadLetter]
    """The matching dead letters, in queue order."""
    scanned: int
    truncated: bool
    """The queue holds more than the scan limit: only its first part was looked at."""


@dataclass(frozen=True)
class Acted:
    """What replay or purge did (or, with dry_run, would do)."""

    dry_run: bool
    done: list[DeadLetter]
    failed: list[tuple[DeadLetter, str]] = field(default_factory=list)
    """Dead letters the broker refused to replay; they stay where they were."""
    truncated: bool = False
    audit_id: int | None = None
    skipped: list[tuple[DeadLetter, str]] = field(default_factory=list)
    """Replay: selected dead letters it cannot replay, each with why; they stay where they were."""


def dead_queue(names: Names, which: str) -> str:
    """`dead` -> <ns>.dead (every dead letter); `requests` -> <ns>.dead.requests."""
    queues = {"dead": names.dead_letter_queue, "requests": names.dead_requests}
    if which not in queues:
        raise InvalidActionError(f"unknown dead-letter queue {which!r}: dead or requests")
    return queues[which]


def list_dead(
    conn: Connection,
    transport: Transport,
    names: Names,
    where: DeadFilter,
    *,
    queue: str = "dead",
    scan_limit: int = SCAN_LIMIT,
) -> Scan:
    """The dead letters `where` selects (the database gives the clock for their age)."""
    now = audit.database_now(conn)
    with _taken(transport, names, dead_queue(names, queue), scan_limit) as (taken, truncated):
        letters = [read_letter(d, now) for d in taken]
    return Scan(_select(letters, where, names.namespace), len(letters), truncated)


def show_dead(
    conn: Connection, transport: Transport, names: Names, dead_id: str, *, queue: str = "dead"
) -> DeadLetter:
    found = list_dead(conn, transport, names, DeadFilter(ids=(dead_id,)), queue=queue).letters
    if not found:
        raise DeadLetterNotFoundError(f"no dead letter {dead_id} in {dead_queue(names, queue)}")
    return found[0]


def replay(
    conn: Connection,
    transport: Transport,
    names: Names,
    where: DeadFilter,
    *,
    actor: str,
    reason: str,
    dry_run: bool,
    queue: str = "dead",
    scan_limit: int = SCAN_LIMIT,
) -> Acted:
    """Publish each selected dead letter to its source queue (confirmed), then remove it.

    Submissions and replies only: a dead-lettered request's attempt was counted as failed (the
    step was retried or failed since), so a replayed request would do its work again and its
    reply would be fenced out: resubmit the run instead (`sasflow runs resubmit`). Selected by
    filters, such dead letters (and any that names no source queue) are skipped, each with
    why, in the dry run as in the replay; named by id, the replay is refused (the dry run
    says why)."""
    now = audit.database_now(conn)
    with _taken(transport, names, dead_queue(names, queue), scan_limit) as (taken, truncated):
        chosen = _chosen(taken, where, names, now)
        _require_ids(where, chosen, names, queue)
        skipped = [(le, why) for _, le in chosen if (why := _unreplayable(le, names))]
        if skipped and where.ids and not dry_run:
            raise InvalidActionError(
                "; ".join(f"dead letter {le.id} is {why}" for le, why in skipped)
            )
        chosen = [(d, le) for d, le in chosen if not _unreplayable(le, names)]
        if dry_run:
            return Acted(True, [le for _, le in chosen], truncated=truncated, skipped=skipped)
        results = transport.publish_many([_replayed(le) for _, le in chosen])
        done: list[DeadLetter] = []
        failed: list[tuple[DeadLetter, str]] = []
        for (delivery, letter), error in zip(chosen, results, strict=True):
            if error is None and transport.ack(delivery):
                done.append(letter)
            else:
                failed.append((letter, str(error or "connection lost before the ack")))
        audit_id = _audit(
            conn,
            REPLAY_ACTION,
            actor=actor,
            reason=reason,
            done=done,
            failed=failed,
            queue=queue,
            skipped=skipped,
        )
    return Acted(False, done, failed, truncated, audit_id, skipped)


def purge(
    conn: Connection,
    transport: Transport,
    names: Names,
    where: DeadFilter,
    *,
    actor: str,
    reason: str,
    dry_run: bool,
    queue: str = "dead",
    scan_limit: int = SCAN_LIMIT,
) -> Acted:
    """Remove the selected dead letters for good."""
    now = audit.database_now(conn)
    with _taken(transport, names, dead_queue(names, queue), scan_limit) as (taken, truncated):
        chosen = _chosen(taken, where, names, now)
        _require_ids(where, chosen, names, queue)
        if dry_run:
            return Acted(True, [le for _, le in chosen], truncated=truncated)
        done: list[DeadLetter] = []
        failed: list[tuple[DeadLetter, str]] = []
        for delivery, letter in chosen:
            if transport.ack(delivery):
                done.append(letter)
            else:
                failed.append((letter, "connection lost before the ack"))
        audit_id = _audit(
            conn, PURGE_ACTION, actor=actor, reason=reason, done=done, failed=failed, queue=queue
        )
    return Acted(False, done, failed, truncated, audit_id)


# -- internals ---------------------------------------------------------------------------


@contextlib.contextmanager
def _taken(
    transport: Transport, names: Names, queue: str, scan_limit: int
) -> Iterator[tuple[list[Delivery], bool]]:
    """Every message of `queue` (up to `scan_limit`), held unacked until the block ends; then
    the channel closes and the broker requeues the ones not acked."""
    transport.connect()
    try:
        declare_common(transport, names)  # a fresh namespace has no dead-letter queue yet
        taken: list[Delivery] = []
        truncated = False
        while True:
            delivery = transport.get(queue)
            if delivery is None:
                break
            if len(taken) == scan_limit:
                truncated = True  # this one is handed back too, with the rest
                break
            taken.append(delivery)
        yield taken, truncated
    finally:
        transport.close()


def _chosen(
    taken: list[Delivery], where: DeadFilter, names: Names, now: datetime
) -> list[tuple[Delivery, DeadLetter]]:
    pairs = [(d, read_letter(d, now)) for d in taken]
    chosen = [(d, le) for d, le in pairs if where.matches(le, names.namespace)]
    return chosen[: where.limit] if where.limit is not None else chosen


def _select(letters: list[DeadLetter], where: DeadFilter, namespace: str) -> list[DeadLetter]:
    chosen = [le for le in letters if where.matches(le, namespace)]
    return chosen[: where.limit] if where.limit is not None else chosen


def _require_ids(
    where: DeadFilter, chosen: list[tuple[Delivery, DeadLetter]], names: Names, queue: str
) -> None:
    """Ids named by the operator must all be there: acting on part of them is a surprise."""
    missing = sorted(set(where.ids) - {le.id for _, le in chosen})
    if missing:
        raise DeadLetterNotFoundError(
            f"no dead letter {', '.join(missing)} in {dead_queue(names, queue)} "
            "matching the filters (nothing was done)"
        )


def read_letter(delivery: Delivery, now: datetime) -> DeadLetter:
    """What sasflow (its headers) and the broker (`x-death`) wrote on a dead letter; its age
    by `now`, the database's clock."""
    headers = dict(delivery.headers)
    deaths = headers.get("x-death") or []
    first = deaths[0] if deaths and isinstance(deaths[0], dict) else {}
    source = headers.get(SOURCE_HEADER) or first.get("queue")
    reason = headers.get(REASON_HEADER)
    if reason is None:
        reason = f"broker dead-lettered it ({first.get('reason', 'unknown')})"
    at = _moment(headers.get(DEAD_AT_HEADER)) or _moment(first.get("time"))
    return DeadLetter(
        id=_identity(delivery),
        queue=delivery.queue,
        source_queue=_text(source),
        reason=_text(reason) or "",
        dead_lettered_at=at,
        age_s=(now - at).total_seconds() if at is not None else None,
        process=_text(headers.get(PROCESS_HEADER)),
        headers=headers,
        correlation_id=delivery.correlation_id,
        reply_to=delivery.reply_to,
        body=delivery.body,
    )


def _identity(delivery: Delivery) -> str:
    """What a requeue leaves unchanged (not the delivery tag nor the redelivered flag)."""
    digest = hashlib.sha256()
    meta = [dict(delivery.headers), delivery.correlation_id, delivery.reply_to]
    digest.update(json.dumps(meta, sort_keys=True, default=str).encode())
    digest.update(b"\0")
    digest.update(delivery.body)
    return digest.hexdigest()[:16]


def _moment(value: Any) -> datetime | None:
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    return None


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _qualified(queue: str, namespace: str) -> str:
    return queue if queue.startswith(f"{namespace}.") else f"{namespace}.{queue}"


def _is_request(letter: DeadLetter, names: Names) -> bool:
    return (letter.source_queue or "").startswith(names.agent(""))


def _unreplayable(letter: DeadLetter, names: Names) -> str:
    """Why `letter` cannot be replayed, or "" when it can."""
    if _is_request(letter, names):
        return (
            "a request to an agent: its attempt was counted as failed already; resubmit the "
            "run (sasflow runs resubmit) instead"
        )
    if letter.source_queue is None:
        return "without a source queue: nowhere to put it back"
    return ""


def _replayed(letter: DeadLetter) -> Outgoing:
    """The message as it was first published: without sasflow's or the broker's dead-letter
    headers, straight to its source queue (mandatory: a queue gone since is an error)."""
    headers = {
        k: v
        for k, v in letter.headers.items()
        if not k.startswith("x-sasflow-") and not k.startswith(BROKER_HEADERS)
    }
    return Outgoing(
        exchange="",
        routing_key=letter.source_queue or "",
        body=letter.body,
        headers=headers or None,
        correlation_id=letter.correlation_id,
        reply_to=letter.reply_to,
        mandatory=True,
    )


def _audit(
    conn: Connection,
    action: str,
    *,
    actor: str,
    reason: str,
    done: list[DeadLetter],
    failed: list[tuple[DeadLetter, str]],
    queue: str,
    skipped: list[tuple[DeadLetter, str]] | None = None,
) -> int:
    detail: dict[str, Any] = {
        "queue": queue,
        "count": len(done),
        "dead_letters": [
            {"id": le.id, "source_queue": le.source_queue, "reason": le.reason} for le in done
        ],
        "failed": [{"id": le.id, "error": error} for le, error in failed],
    }
    if skipped:
        detail["skipped"] = [{"id": le.id, "why": why} for le, why in skipped]
    log.warning(
        "%s by %s (%s): %d dead letter(s) %s; %d failed",
        action,
        actor,
        reason,
        len(done),
        " ".join(le.id for le in done),
        len(failed),
    )
    return audit.record(conn, audit.AuditRecord(actor, action, reason, detail=detail))
