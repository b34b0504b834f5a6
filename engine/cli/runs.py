"""`sasflow runs list | show | resubmit | cancel` (`migrate` in migrate_runs.py, `pause` and
`resume` in pause.py, `unpark` and `fail` in park.py): the operator's commands."""

from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from sasflow.cli.context import CliContext, default_actor, fail
from sasflow.cli.lazy import LazyGroup
from sasflow.cli.output import (
    OUTPUT_OPTION,
    Column,
    compact_time,
    error_text,
    parse_moment,
    print_table,
    to_json,
)
from sasflow.errors import InvalidMessageError, SasflowError
from sasflow.messages import Limits, loads, value_depth
from sasflow.ops import cancel as cancel_ops
from sasflow.ops import resubmit as resubmit_ops
from sasflow.ops import runs as run_ops
from sasflow.states import RunState

BY_OPTION = click.option(
    "--by",
    "actor",
    default=default_actor,
    show_default="$USER@host",
    help="Who acts (recorded in the audit trail).",
)
REASON_OPTION = click.option("--reason", required=True, help="Why (recorded in the audit trail).")


F = TypeVar("F", bound=Callable[..., Any])


def _filter_options(command: F) -> F:
    for option in reversed(
        [
            click.option(
                "--state",
                "states",
                multiple=True,
                type=click.Choice([state.value for state in RunState]),
                help="Run state (repeatable).",
            ),
            click.option("--workflow", help="Workflow name."),
            click.option("--key", help="Business key."),
            click.option(
                "--text",
                help="Text found (case-insensitive) in the business key, the run's input, output"
                " or error, or a step's error; among the newest 100,000 runs only.",
            ),
            click.option("--since", help="Created at or after: 15m, 2h, 3d or an ISO-8601 time."),
            click.option("--until", help="Created before: 15m, 2h, 3d or an ISO-8601 time."),
            click.option(
                "--limit", type=click.IntRange(1, 100_000), default=100, show_default=True
            ),
        ]
    ):
        command = option(command)
    return command


def _run_filter(
    states: tuple[str, ...],
    workflow: str | None,
    key: str | None,
    since: str | None,
    until: str | None,
    limit: int,
    text: str | None = None,
) -> run_ops.RunFilter:
    return run_ops.RunFilter(
        states=states,
        workflow=workflow,
        key=key,
        text=text or None,
        since=parse_moment(since),
        until=parse_moment(until),
        limit=limit,
    )


@click.group(
    cls=LazyGroup,
    lazy={
        "migrate": "sasflow.cli.migrate_runs:migrate_command",
        "pause": "sasflow.cli.pause:pause_runs",
        "resume": "sasflow.cli.pause:resume_runs",
        "unpark": "sasflow.cli.park:unpark_runs",
        "fail": "sasflow.cli.park:fail_runs",
    },
)
def runs() -> None:
    """Inspect, resubmit, cancel and migrate runs."""


@runs.command("list")
@_filter_options
@click.option("--parked", is_flag=True, help="Only runs with a parked step.")
@OUTPUT_OPTION
@click.pass_obj
def list_command(
    obj: CliContext,
    states: tuple[str, ...],
    workflow: str | None,
    key: str | None,
    text: str | None,
    since: str | None,
    until: str | None,
    limit: int,
    parked: bool,
    output: str,
) -> None:
    """List runs, newest first; a run with a parked step shows `(parked)` after its state."""
    where = _run_filter(states, workflow, key, since, until, limit, text)
    where = dataclasses.replace(where, parked=parked)
    found, now = obj.read(lambda conn: run_ops.list_runs(conn, where))
    if output == "json":
        click.echo(to_json(found))
        return
    print_table(
        f"{len(found)} run(s), times UTC",
        RUN_COLUMNS,
        [
            [
                r["id"],
                r["workflow"],
                r["version"],
                r["business_key"],
                f"{r['state']} (parked)" if r["parked"] else r["state"],
                r["created_at"],
                r["finished_at"],
                error_text(r["error"]),
            ]
            for r in found
        ],
        now=now,
    )


RUN_COLUMNS = (
    Column("id", wrap=False, justify="right"),
    Column("workflow"),
    Column("v", drop=2, justify="right"),
    Column("key"),
    Column("state", wrap=False),
    Column("created", drop=3, wrap=False),
    Column("finished", drop=1, wrap=False),
    Column("error"),
)
"""`runs list`: when narrow, the finish time goes first, then the version, then the creation
time; the error is never dropped (it folds)."""

STEP_COLUMNS = (
    Column("id", drop=4, wrap=False, justify="right"),
    Column("kind", drop=3),
    Column("name"),
    Column("agent.action", drop=5),
    Column("state", wrap=False),
    Column("attempt", wrap=False, justify="right"),
    Column("failures", drop=6, wrap=False),
    Column("locked_by", drop=1),
    Column("complete_by", drop=2, wrap=False),
    Column("error"),
)
"""`runs show`'s steps: the lock and its deadline go first, then kind, id, agent.action and
the failure count; name, state, attempt and error stay."""

EVENT_COLUMNS = (
    Column("#", drop=2, wrap=False, justify="right"),
    Column("at", wrap=False),
    Column("what"),
    Column("from", drop=1, wrap=False),
    Column("to", wrap=False),
    Column("attempt", drop=3, wrap=False, justify="right"),
    Column("by", drop=4),
    Column("reason"),
)
"""`runs show`'s timeline: the state left goes first, then the event id, the attempt and who."""


@runs.command("show")
@click.argument("run_id", type=int)
@click.option(
    "--traceback",
    "tracebacks",
    is_flag=True,
    help="Also print the handler's traceback of each failure that kept one.",
)
@OUTPUT_OPTION
@click.pass_obj
def show_command(obj: CliContext, run_id: int, tracebacks: bool, output: str) -> None:
    """Show a run: its steps (state, attempt, failures, error; what a held step waits for) and
    its event timeline. The JSON output keeps each error's traceback whole."""
    detail, now = obj.read(lambda conn: run_ops.show_run(conn, run_id))
    if output == "json":
        click.echo(to_json(detail))
        return
    run = detail["run"]
    # The run itself as lines, not a one-row table: each reads whole at any width.
    click.echo(
        f"run {run['id']}: {run['workflow']} v{run['version']}, key {run['business_key']}, "
        f"{run['state']}{', paused' if run['paused'] else ''}"
        + (f", parked: {', '.join(run['parked'])}" if run["parked"] else "")
    )
    if run.get("parent_run_id") is not None:
        click.echo(f"  parent: run {run['parent_run_id']}, step {run['parent_step']}")
    if run.get("children"):
        click.echo(f"  children: {', '.join(f'run {c}' for c in run['children'])}")
    finished = run["finished_at"]
    click.echo(
        f"  created {compact_time(run['created_at'], now)} UTC"
        + (f", finished {compact_time(finished, now)}" if finished else "")
    )
    if run["error"] is not None:
        click.echo(f"  error: {error_text(run['error'])}")
    print_table(
        "steps",
        STEP_COLUMNS,
        [
            [
                s["id"],
                s["kind"],
                s["name"],
                f"{s['agent']}.{s['action']}",
                s["state"],
                s["attempt"],
                f"{s['failure_count']}/{s['max_failures']}",
                s["locked_by"],
                s["complete_by"],
                error_text(s["error"]),
            ]
            for s in detail["steps"]
        ],
        now=now,
    )
    for step in detail["steps"]:
        if step.get("waiting"):
            click.echo(f"step {step['name']} waits: {step['waiting']}")
        if step.get("skipped"):
            click.echo(f"step {step['name']} skipped: {step['skipped']}")
    if detail["failures"]:
        # One line each, not a table: the error is what matters and must not be cut.
        click.echo("failures (every attempt that did not succeed, kept across resubmissions):")
        for f in detail["failures"]:
            error = error_text(f["error"])
            click.echo(
                f"  {compact_time(f['at'], now)} step {f['step']} attempt {f['attempt']}: "
                f"{f['outcome'] or f['to_state']}{f': {error}' if error else ''}"
            )
            if tracebacks:
                _print_traceback(f["error"])
    print_table(
        "timeline",
        EVENT_COLUMNS,
        [
            [
                e["id"],
                e["created_at"],
                e["step"] or "run",
                e["from_state"],
                e["to_state"],
                e["attempt"],
                e["actor"],
                e["reason"],
            ]
            for e in detail["events"]
        ],
        now=now,
    )


def _print_traceback(error: Any) -> None:
    """A stored error's traceback (the agent's, bounded), indented under its failure line."""
    text = error.get("traceback") if isinstance(error, dict) else None
    if isinstance(text, str) and text:
        click.echo(textwrap.indent(text.rstrip("\n"), "      "))


@runs.command("resubmit")
@click.argument("run_id", type=int, required=False)
@REASON_OPTION
@click.option("--from-step", help="Re-run from this step (and everything after it).")
@click.option(
    "--input",
    "input_text",
    metavar="JSON|@FILE",
    help="The corrected run input: a JSON object as text, or @FILE to read it from a file (as "
    "`sasflow submit --input`); a bare file path is still read as before.",
)
@_filter_options
@click.option("--dry-run", is_flag=True, help="Bulk: only list the runs that would be resubmitted.")
@click.option("--yes", is_flag=True, help="Bulk: really resubmit them.")
@BY_OPTION
@OUTPUT_OPTION
@click.pass_obj
def resubmit_command(
    obj: CliContext,
    run_id: int | None,
    reason: str,
    from_step: str | None,
    input_text: str | None,
    states: tuple[str, ...],
    workflow: str | None,
    key: str | None,
    text: str | None,
    since: str | None,
    until: str | None,
    limit: int,
    dry_run: bool,
    yes: bool,
    actor: str,
    output: str,
) -> None:
    """Resubmit RUN_ID (from its failed step by default), or, without RUN_ID, every run the
    filters select (default --state error): preview with --dry-run, act with --yes."""
    try:
        registry = obj.registry()
    except SasflowError as exc:
        raise fail(exc) from exc
    result: dict[str, Any]
    if run_id is not None:
        if dry_run or yes or states or workflow or key or text or since or until:
            raise click.UsageError(
                "filters, --dry-run and --yes are for bulk resubmission (without RUN_ID)"
            )
        new_input = None if input_text is None else _read_input(input_text, obj.settings.limits())
        done = obj.in_transaction(
            lambda conn: resubmit_ops.resubmit(
                conn,
                registry,
                run_id,
                actor=actor,
                reason=reason,
                from_step=from_step,
                new_input=new_input,
                namespace=obj.settings.namespace,
            )
        )
        result = {
            "run_id": done.run_id,
            "reset": list(done.reset_steps),
            "ready": list(done.ready_steps),
        }
    else:
        if from_step or input_text is not None:
            raise click.UsageError("--from-step and --input apply to one run (give RUN_ID)")
        if not dry_run and not yes:
            raise click.UsageError("bulk resubmission needs --dry-run or --yes")
        where = _run_filter(states, workflow, key, since, until, limit, text)
        done_many = obj.in_transaction(
            lambda conn: resubmit_ops.resubmit_many(
                conn,
                registry,
                where,
                actor=actor,
                reason=reason,
                dry_run=dry_run,
                namespace=obj.settings.namespace,
            )
        )
        ids = [done.run_id for done in done_many]
        result = {"dry_run": dry_run, "count": len(ids), "run_ids": ids}
    if output == "json":
        click.echo(to_json(result))
    elif "dry_run" in result:
        verb = "would resubmit" if dry_run else "resubmitted"
        click.echo(
            f"{verb} {result['count']} run(s): {' '.join(str(i) for i in result['run_ids'])}"
        )
    else:
        click.echo(
            f"resubmitted run {result['run_id']}: reset {', '.join(result['reset'])}; "
            f"ready {', '.join(result['ready']) or '(none yet)'}"
        )


def _read_input(raw: str, limits: Limits) -> dict[str, Any]:
    """A corrected run input: a JSON object within the message limits, like a submission's;
    `raw` is its JSON text, `@FILE`, or (the form before JSON text was taken) a file's path."""
    where = "the input"
    if raw.startswith("@") or not raw.lstrip().startswith("{"):
        path = Path(raw[1:] if raw.startswith("@") else raw)
        if not path.is_file():
            raise click.BadParameter(
                f"{raw!r} is neither a JSON object nor @FILE naming a file", param_hint="--input"
            )
        body, where = path.read_bytes(), str(path)
    else:
        body = raw.encode("utf-8", "replace")
    try:
        value = loads(body, limits, what="the input")
        # The input as it would travel in a submission (the envelope is one level more).
        limits.check_depth(value_depth(value, limits.max_json_depth) + 1)
    except InvalidMessageError as exc:
        raise click.BadParameter(f"{where}: {exc}", param_hint="--input") from exc
    if not isinstance(value, dict):
        raise click.BadParameter(
            f"{where}: the run input must be a JSON object, got {type(value).__name__}",
            param_hint="--input",
        )
    return value


@runs.command("cancel")
@click.argument("run_id", type=int)
@REASON_OPTION
@click.option(
    "--compensate",
    is_flag=True,
    help="Undo the processed steps (their compensating actions, in reverse order).",
)
@BY_OPTION
@OUTPUT_OPTION
@click.pass_obj
def cancel_command(
    obj: CliContext, run_id: int, reason: str, compensate: bool, actor: str, output: str
) -> None:
    """Cancel a pending or running run; late replies of its steps are ignored."""
    done = obj.in_transaction(
        lambda conn: cancel_ops.cancel(
            conn,
            run_id,
            actor=actor,
            reason=reason,
            compensate=compensate,
            namespace=obj.settings.namespace,
        )
    )
    result = {
        "run_id": done.run_id,
        "state": done.state,
        "cancelled_steps": list(done.cancelled_steps),
    }
    if output == "json":
        click.echo(to_json(result))
    else:
        click.echo(
            f"run {done.run_id} is {done.state}; cancelled steps: "
            f"{', '.join(done.cancelled_steps) or '(none)'}"
        )
