"""`sasflow submit`: start a run from the command line."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError

from sasflow.cli.context import CliContext, check_schema, fail
from sasflow.errors import InvalidMessageError, SasflowError
from sasflow.messages import Limits, Submission, encode_within, loads, problems_line
from sasflow.store.db import transaction
from sasflow.store.runs.submit import submit
from sasflow.transport.base import Outgoing
from sasflow.transport.topology import declare_common


def _parse_input(raw: str, limits: Limits) -> Any:
    # Bytes, checked within the limits before json.loads sees them (a file may be huge).
    body = Path(raw[1:]).read_bytes() if raw.startswith("@") else raw.encode("utf-8", "replace")
    try:
        return loads(body, limits, what="the input")
    except InvalidMessageError as exc:
        raise click.BadParameter(str(exc), param_hint="--input") from exc


EX_DATAERR = 65
"""sysexits.h: the data was incorrect. `sasflow submit` exits with it when the key names a run
recorded with another input: that run is kept as it is and this input is not used, which
retrying cannot change."""

CONFLICT = "input differs from the recorded run"


class KeyConflict(click.ClickException):
    """`Error: ...` and exit status 65 (EX_DATAERR), after the result line."""

    exit_code = EX_DATAERR


@click.command("submit")
@click.argument("workflow")
@click.option(
    "--input",
    "input_",
    default="{}",
    show_default=True,
    help="The run's input: JSON text, or @FILE to read it from a file.",
)
@click.option(
    "--key",
    help="Business key, not empty; the same key twice yields one run (a different input with "
    "it: exit status 65) [default: a random key, so every call starts a new run].",
)
@click.option(
    "--priority",
    type=click.IntRange(-1000, 1000),
    default=0,
    show_default=True,
    help="Higher runs first.",
)
@click.option(
    "--version",
    "version",
    type=click.IntRange(min=1),
    help="Workflow version [default: the latest registered].",
)
@click.option("--reply-to", help="Queue that receives this run's status notifications.")
@click.option(
    "--start-at",
    help="Start the run later: ISO 8601 time with an offset (2026-12-01T09:00:00+00:00); "
    "its first steps are not claimed before it [default: at once].",
)
@click.option(
    "--via-broker",
    is_flag=True,
    help="Publish to the <ns>.submit queue instead of writing to the database. With an app "
    "(--app or SASFLOW_APP), an unknown workflow or version is refused before anything is "
    "published; without one, the submitter checks it (and dead-letters it).",
)
@click.pass_obj
def submit_command(
    obj: CliContext,
    workflow: str,
    input_: str,
    key: str | None,
    priority: int,
    version: int | None,
    reply_to: str | None,
    start_at: str | None,
    via_broker: bool,
) -> None:
    """Submit a run of WORKFLOW and print its id (or, with --via-broker, its key) as one JSON
    line. A key that names a run already recorded prints that run with "created": false; if
    its input differs from this one, also "conflict", an error line and exit status 65."""
    if key == "":
        raise click.BadParameter(
            "an empty key names no run: give a non-empty key, or leave --key out for a random one",
            param_hint="--key",
        )
    limits = obj.settings.limits()
    try:
        submission = Submission(
            workflow=workflow,
            input=_parse_input(input_, limits),
            key=uuid.uuid4().hex if key is None else key,
            priority=priority,
            version=version,
            reply_to=reply_to,
            start_at=start_at,
        )
    except ValidationError as exc:  # one line per field, not pydantic's dump
        raise click.UsageError(f"invalid submission: {problems_line(exc)}") from exc
    try:
        body = encode_within(submission, limits)  # what the submitter would accept
    except InvalidMessageError as exc:
        raise click.BadParameter(str(exc), param_hint="--input") from exc
    try:
        if via_broker:
            if obj.settings.app:  # the submitter would refuse it: say so, publish nothing
                obj.registry().workflow(workflow, version)
            transport = obj.transport("submit")
            transport.connect()
            try:
                declare_common(transport, obj.names)
                transport.publish(Outgoing("", obj.names.submit, body, mandatory=True))
            finally:
                transport.close()
            click.echo(json.dumps({"published": True, "workflow": workflow, "key": submission.key}))
            return
        registry = obj.registry()
        engine = obj.engine("submit", pool_size=1)
        try:
            check_schema(engine)
            with transaction(engine) as conn:
                result = submit(
                    conn,
                    registry,
                    submission.new_run(),
                    namespace=obj.settings.namespace,
                    actor="cli",
                )
        finally:
            engine.dispose()
    except SasflowError as exc:
        raise fail(exc) from exc
    answer: dict[str, Any] = {
        "run_id": result.run_id,
        "workflow": workflow,
        "key": result.business_key,
        "created": result.created,
        "state": result.state,
    }
    if result.input_differs:
        answer["conflict"] = CONFLICT
    click.echo(json.dumps(answer))
    if (conflict := result.conflict(workflow)) is not None:
        raise KeyConflict(conflict)
