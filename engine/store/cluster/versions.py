"""The workflow versions the cluster knows: each (workflow, version)'s fingerprint as first
registered, and which versions the live schedulers have loaded (docs/howto/upgrade.md).

A process that loads a (workflow, version) whose fingerprint differs from the registered one
is refused at start (DefinitionChangedError, exit status 78): its runs would be advanced by
two definitions at once (a renamed step read as missing, a builder reading another step).
The fix is a new version number, never an edit in place.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import Connection, and_, or_, select, tuple_

from sasflow.errors import DefinitionChangedError
from sasflow.store.cluster.registrations import live
from sasflow.store.dialect import upsert_insert
from sasflow.store.schema import runs, schedulers, workflow_versions
from sasflow.store.sqltime import now, plus_seconds
from sasflow.workflow import Workflow

VersionKey = tuple[str, int]
"""(workflow name, version)."""


def record(conn: Connection, loaded: Iterable[Workflow], *, actor: str) -> None:
    """Register the fingerprints of the `loaded` versions not known yet, then raise
    DefinitionChangedError naming the versions whose registered fingerprint differs (primary
    key)."""
    mine = {(w.name, w.version): w for w in loaded}
    if not mine:
        return
    conn.execute(
        upsert_insert(conn, workflow_versions).on_conflict_do_nothing(),
        [
            {
                "workflow": w.name,
                "version": w.version,
                "fingerprint": w.fingerprint,
                "registered_by": actor[:200],
            }
            for w in mine.values()
        ],
    )
    rows = conn.execute(
        select(
            workflow_versions.c.workflow,
            workflow_versions.c.version,
            workflow_versions.c.fingerprint,
            workflow_versions.c.registered_at,
            workflow_versions.c.registered_by,
        ).where(tuple_(workflow_versions.c.workflow, workflow_versions.c.version).in_(list(mine)))
    ).all()
    changed = [r for r in rows if mine[(r.workflow, r.version)].fingerprint != r.fingerprint]
    if changed:
        first = changed[0]
        others = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
        raise DefinitionChangedError(
            f"workflow {first.workflow!r} version {first.version} differs from the definition "
            f"registered by {first.registered_by} at {first.registered_at:%Y-%m-%d %H:%M:%S}"
            f"{others}: runs of a version must keep one definition; give the changed "
            "definition a new version number (docs/howto/upgrade.md)"
        )


def loaded_by_live(conn: Connection) -> set[VersionKey] | None:
    """The versions some live scheduler has loaded; None when a live scheduler does not say
    (one older than this column): then nobody can tell that a version is missing
    (ix_schedulers_lease_expires_at)."""
    found: set[VersionKey] = set()
    for (workflows,) in conn.execute(select(schedulers.c.workflows).where(live())):
        if workflows is None:
            return None
        found.update((str(name), int(version)) for name, version in workflows)
    return found


def waiting_versions(conn: Connection, *, older_than_s: float) -> list[VersionKey]:
    """The versions of runs whose advance has waited more than `older_than_s` seconds for a
    scheduler (ix_runs_advance_due)."""
    return [
        (r.workflow, r.version)
        for r in conn.execute(
            select(runs.c.workflow, runs.c.version)
            .distinct()
            .where(
                runs.c.advance_due.is_not(None),
                runs.c.advance_due < plus_seconds(now(), -older_than_s),
            )
        )
    ]


def matching(keys: Iterable[VersionKey]) -> Any:
    """The condition "the run's (workflow, version) is one of `keys`" (never true when empty)."""
    every = [and_(runs.c.workflow == name, runs.c.version == version) for name, version in keys]
    return or_(*every) if every else runs.c.id.is_(None)
