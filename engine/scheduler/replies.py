"""The scheduler's replies: taken from `<ns>.replies`, applied in one transaction per batch and
acked together with one multiple-ack; and the failures the scheduler decides itself (a request
the broker refused, a pool with no agent), applied the same way and fenced as an agent's error
would be. A batch the store cannot apply is applied again one reply at a time, so one bad reply
is dead-lettered (or fails its step) without holding back the others.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from sasflow.commands import StoredError
from sasflow.errors import InvalidMessageError, StoreUnavailableError
from sasflow.messages import Limits, Progress, Reply, Unknown, parse_on_replies, safe_text
from sasflow.scheduler.context import Context, Part
from sasflow.scheduler.flow import FlowDuty
from sasflow.scheduler.inflight import InFlightCap
from sasflow.scheduler.outbox import RelayDuty
from sasflow.states import ReplyStatus
from sasflow.store.db import transaction
from sasflow.store.runs.apply import ApplyReport, apply_outcomes, fail_step
from sasflow.store.runs.progress import ProgressReport, apply_progress
from sasflow.transport.base import Delivery

Held = tuple[Delivery, Reply | Progress]

log = logging.getLogger(__name__)


class Replies(Part):
    """Holds the replies delivered since the last pass until the loop applies them."""

    def __init__(
        self,
        ctx: Context,
        limits: Limits,
        *,
        in_flight: InFlightCap,
        outbox: RelayDuty,
        flow: FlowDuty,
    ) -> None:
        super().__init__(ctx)
        self._limits = limits
        self._in_flight = in_flight
        self._flow = flow
        self._outbox = outbox
        self.waiting: list[Held] = []
        """Delivered, not applied yet (unacked): replies and agents' progress messages."""

    def clear(self) -> None:
        """Forget the deliveries of a lost connection: the broker delivers them again."""
        self.waiting.clear()

    def on_reply(self, delivery: Delivery) -> None:
        """The consumer's callback: hold a valid reply or progress message, dead-letter an
        invalid one, ack one of a kind this version does not know (a newer agent's)."""
        try:
            message = parse_on_replies(delivery.body, self._limits)
        except InvalidMessageError as exc:
            self._transport.dead_letter(
                delivery, str(exc), dead_letter_exchange=self._names.dead_letter_exchange
            )
            self._stats.dead_lettered += 1
            self._hooks.dead_lettered(delivery.queue, str(exc))
            return
        if isinstance(message, Unknown):
            log.debug("%s: ignored a %r message (newer than this scheduler)", self._id, message)
            self._stats.ignored += 1
            self._transport.ack(delivery)
            return
        self.waiting.append((delivery, message))

    def apply(self) -> None:
        """Apply the replies and progress messages held and ack them. Raises
        StoreUnavailableError with those not applied held again (unacked), to be applied at a
        later pass."""
        held, self.waiting = self.waiting, []
        replies = [(d, m) for d, m in held if isinstance(m, Reply)]
        signals = [(d, m) for d, m in held if isinstance(m, Progress)]
        try:
            self._apply(replies, signals)
        except StoreUnavailableError:
            self.waiting = held + self.waiting  # keep them unacked and try again
            raise
        except Exception:
            log.exception(
                "%s: applying %d replies failed; applying them one by one", self._id, len(held)
            )
            self._apply_one_by_one(replies, signals)
            return
        # Tags grow per channel: one multiple-ack of the last covers the batch (dead-lettered
        # ones were acked already; a multiple-ack skips them).
        last = max(held, key=lambda item: item[0].tag)[0]
        self._transport.ack(last, multiple=True)

    def fail(
        self, step_id: int, attempt: int, error: StoredError, *, agent: str | None = None
    ) -> None:
        """Fail an attempt for good ourselves (fenced as an agent's error would be)."""
        with transaction(self._engine) as conn:
            report = fail_step(
                conn,
                self._registry,
                step_id,
                attempt,
                error,
                namespace=self._names.namespace,
                actor=self._id,
                agent=agent,
            )
            self._hooks.runs_finished(conn, report.finished)
        self._count(report)

    def _apply_one_by_one(
        self, replies: list[tuple[Delivery, Reply]], signals: list[tuple[Delivery, Progress]]
    ) -> None:
        """After a batch failed: the progress messages together (advisory: acked even if they
        fail again), then each reply alone."""
        try:
            self._apply([], signals)
        except StoreUnavailableError:
            self.waiting = [*signals, *replies, *self.waiting]
            raise
        except Exception:
            log.exception("%s: %d progress messages dropped", self._id, len(signals))
        for delivery, _ in signals:
            self._transport.ack(delivery)
        for index, item in enumerate(replies):
            try:
                self._apply_alone(item)
            except StoreUnavailableError:
                self.waiting = [*replies[index:], *self.waiting]  # unacked: try them again
                raise

    def _apply(
        self,
        held: list[tuple[Delivery, Reply]],
        signals: Sequence[tuple[Delivery, Progress]] = (),
    ) -> None:
        started = time.monotonic()
        progress = ProgressReport()
        with transaction(self._engine) as conn:
            if signals:
                progress = apply_progress(
                    conn,
                    [m.progress() for _, m in signals],
                    actor=self._id,
                    finished={(r.step_id, r.attempt) for _, r in held},
                )
            report = apply_outcomes(
                conn,
                self._registry,
                [r.outcome() for _, r in held],
                namespace=self._names.namespace,
                actor=self._id,
            )
            self._hooks.runs_finished(conn, report.finished)
        self._stats.started += progress.started
        self._stats.heartbeats += progress.heartbeats
        if held:
            self._hooks.replies_applied(held, report, time.monotonic() - started)
        self._count(report)

    def _count(self, report: ApplyReport) -> None:
        self._stats.applied += report.applied
        self._stats.dropped += len(report.dropped)
        # Only applied replies record events worth relaying; dropped ones change nothing.
        if report.applied > 0:
            self._outbox.recorded()
        if report.ready or report.backing_off:
            self._wake.set()  # claim what is ready; or learn when the backoff ends
        if report.deferred:
            self._advance.set()  # user code to run, or a version to find
        if (self._in_flight.capped or self._flow.limited) and report.applied:
            self._wake.set()  # an agent left out of the last claim may have room again

    def _apply_alone(self, item: tuple[Delivery, Reply]) -> None:
        delivery, reply = item
        try:
            self._apply([item])
        except StoreUnavailableError:
            raise
        except Exception as exc:
            log.exception("%s: reply for step %s cannot be applied", self._id, reply.step_id)
            if not self._apply_instead(reply, exc):
                self._transport.dead_letter(
                    delivery,
                    f"reply could not be applied: {exc!r}",
                    dead_letter_exchange=self._names.dead_letter_exchange,
                )
                self._stats.dead_lettered += 1
                self._hooks.dead_lettered(delivery.queue, "reply could not be applied")
                return
        self._transport.ack(delivery)

    def _apply_instead(self, reply: Reply, exc: Exception) -> bool:
        """The store refused what the reply carries (e.g. a value jsonb cannot hold): fail the
        step with that reason, so the run shows it instead of waiting for its deadline."""
        if reply.status is ReplyStatus.ERROR:
            return False
        error = StoredError("InvalidReplyError", safe_text(f"the reply could not be stored: {exc}"))
        try:
            self.fail(reply.step_id, reply.attempt, error, agent=reply.agent)
        except StoreUnavailableError:
            raise
        except Exception:
            log.exception("%s: could not fail step %s instead", self._id, reply.step_id)
            return False
        return True
