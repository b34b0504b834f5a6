"""The budgeted claim's statements (store/flow/claim.py), built from the limits that apply and
kept (lru_cache: the same limits give the same statement object, whose compiled form
SQLAlchemy caches): the steps in flight per budget, and the candidates. Every time comparison
uses the database clock."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Select,
    and_,
    cast,
    func,
    literal,
    not_,
    null,
    select,
    union_all,
)

from sasflow.states import StepState
from sasflow.store.flow.keys import key_value
from sasflow.store.flow.model import KeyExpr
from sasflow.store.runs.queries import claimable_in_run, not_paused_agent, not_timer
from sasflow.store.schema import flow_buckets, runs, steps
from sasflow.store.sqltime import now, statement_now
from sasflow.store.types import Timestamp


@dataclass(frozen=True)
class Selector:
    """The steps a budget family covers: an agent's, all or some of its actions."""

    agent: str
    actions: frozenset[str] | None = None

    def where(self) -> ColumnElement[bool]:
        if self.actions is None:
            return steps.c.agent == self.agent
        return and_(steps.c.agent == self.agent, steps.c.action.in_(sorted(self.actions)))

    def covers(self, agent: str, action: str) -> bool:
        return agent == self.agent and (self.actions is None or action in self.actions)


@dataclass(frozen=True)
class Family:
    """The budgets of one limit or implicit bound: its steps, and its key (None: one budget)."""

    name: str
    selector: Selector
    key: KeyExpr | None = None


@lru_cache(maxsize=256)
def budget_reads(families: tuple[Family, ...], rated: tuple[str, ...]) -> Select[Any]:
    """What the budgeted claim reads once it holds its locks, in one round trip: rows (kind,
    name, key, n, at) of the statement's clock (kind 't', `at`), the steps in flight per family
    and key (kind 'c', `n`, as `in_flight`) and the busy buckets of the `rated` limits (kind
    'b', their `tat` in `at`; flow_buckets' primary key)."""
    clock = select(
        literal("t").label("kind"),
        literal("").label("name"),
        literal("").label("key"),
        literal(0).label("n"),
        statement_now().label("at"),
    )
    parts: list[Select[Any]] = [clock]
    for part in _counts(families):
        counted = part.subquery()
        parts.append(
            select(
                literal("c"), counted.c.name, counted.c.key, counted.c.n, cast(null(), Timestamp())
            )
        )
    if rated:
        parts.append(
            select(
                literal("b"),
                flow_buckets.c.limit_name,
                flow_buckets.c.key,
                literal(0),
                flow_buckets.c.tat,
            ).where(
                flow_buckets.c.limit_name.in_(list(rated)), flow_buckets.c.tat > statement_now()
            )
        )
    if len(parts) == 1:
        return clock
    return select(*union_all(*parts).subquery().c)


@lru_cache(maxsize=256)
def in_flight(families: tuple[Family, ...]) -> Select[Any]:
    """(name, key, n): the steps in `processing` of each family, per key (ix_steps_expiry, then
    the runs' primary key for a keyed family)."""
    return select(*union_all(*_counts(families)).subquery().c)


def _counts(families: Sequence[Family]) -> list[Select[Any]]:
    parts: list[Any] = []
    for family in families:
        where = [steps.c.state == StepState.PROCESSING, family.selector.where()]
        if family.key is None:
            part = select(
                literal(family.name).label("name"),
                literal("").label("key"),
                func.count().label("n"),
            ).where(*where)
        else:
            key = key_value(family.key)
            part = (
                select(
                    literal(family.name).label("name"), key.label("key"), func.count().label("n")
                )
                .select_from(steps.join(runs, runs.c.id == steps.c.run_id))
                .where(*where)
                .group_by(key)
            )
        parts.append(part)
    return parts


@dataclass(frozen=True)
class Excluded:
    """Steps a budget that admits nothing now covers: the family's, or its `keys` only."""

    selector: Selector
    key: KeyExpr | None = None
    keys: tuple[str, ...] = ()

    def where(self) -> ColumnElement[bool]:
        if self.key is None:
            return not_(self.selector.where())
        return not_(and_(self.selector.where(), key_value(self.key).in_(self.keys)))


@lru_cache(maxsize=256)
def candidates(
    agent: str, excluded: tuple[Excluded, ...], keys: tuple[KeyExpr, ...], window: int
) -> Select[Any]:
    """Up to `window` ready steps of `agent` that no exhausted budget covers, in claim order,
    locked, with their runs' value of each of `keys` (k0, k1, ...) (ix_steps_ready_agent: one
    agent's steps in claim order, whatever the other agents' backlogs)."""
    return (
        select(
            steps.c.id,
            steps.c.agent,
            steps.c.action,
            steps.c.priority,
            steps.c.not_before,
            *(key_value(k).label(f"k{i}") for i, k in enumerate(keys)),
        )
        .join(runs, runs.c.id == steps.c.run_id)
        .where(
            steps.c.state == StepState.PENDING,
            steps.c.agent == agent,
            steps.c.locked_by.is_(None),
            steps.c.not_before <= now(),
            not_timer(),
            claimable_in_run(),
            not_paused_agent(),
            *(e.where() for e in excluded if e.selector.agent == agent),
        )
        .order_by(steps.c.priority.desc(), steps.c.not_before, steps.c.id)
        .limit(window)
        .with_for_update(of=steps, skip_locked=True)
    )


@lru_cache(maxsize=256)
def ready_count(selector: Selector) -> Select[Any]:
    """The steps of `selector` ready to be claimed now (ix_steps_ready)."""
    return (
        select(func.count())
        .select_from(steps.join(runs, runs.c.id == steps.c.run_id))
        .where(
            steps.c.state == StepState.PENDING,
            steps.c.locked_by.is_(None),
            steps.c.not_before <= now(),
            not_timer(),
            claimable_in_run(),
            selector.where(),
        )
    )
