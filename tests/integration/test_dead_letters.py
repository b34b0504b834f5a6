"""`sasflow dead`: a poison submission is dead-lettered and listed with its reason and source;
filters select by reason, source and age; a replay after the missing workflow is registered
makes it a run; a purge dry run names exactly what the real purge removes; requests are never
replayed; every replay and purge leaves an audit row."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import Engine, select

from sasflow import Registry
from sasflow.cli.main import cli
from sasflow.store.schema import audit, runs
from sasflow.transport.topology import REASON_HEADER, SOURCE_HEADER, Names
from tests import harness, services
from tests.apps import ops

pytestmark = pytest.mark.integration

Sasflow = Callable[..., Result]
WITHOUT_OPS = Registry([ops.killable], [ops.remote])
"""The app before the fix: the `ops` workflow is not registered yet."""


@pytest.fixture
def sasflow(database_url: str, names: Names, broker_url: str) -> Sasflow:
    env = {
        "SASFLOW_DATABASE_URL": database_url,
        "SASFLOW_BROKER_URL": broker_url,
        "SASFLOW_NAMESPACE": names.namespace,
    }

    def invoke(*args: str, code: int = 0) -> Result:
        result = CliRunner().invoke(cli, list(args), env=env)
        assert result.exit_code == code, result.output
        return result

    return invoke


def _json(sasflow: Sasflow, *args: str) -> Any:
    return json.loads(sasflow("dead", *args, "-o", "json").output)


def _listed(sasflow: Sasflow, *filters: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = _json(sasflow, "list", *filters)["dead_letters"]
    return found


def _runs(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(select(runs.c.business_key)).scalars())


def _poison(engine: Engine, names: Names, sasflow: Sasflow) -> dict[str, dict[str, Any]]:
    """Two submissions the submitter refuses: an unknown workflow and a body that is not JSON."""
    role = harness.submitter(engine, WITHOUT_OPS, names)
    with harness.running(role):
        harness.wait_for(lambda: services.queue_exists(names.submit), what="submit queue")
        body = json.dumps({"workflow": "ops", "key": "late-1", "input": {"value": 1}})
        harness.publish_raw(names.submit, body.encode(), correlation_id="c-1")
        harness.publish_raw(names.submit, b"{not json")
        harness.wait_for(lambda: role.stats.dead_lettered == 2, what="two dead letters")
    letters = _listed(sasflow)
    assert len(letters) == 2
    return {
        "unknown": next(le for le in letters if "unknown workflow" in le["reason"]),
        "garbled": next(le for le in letters if "JSON" in le["reason"]),
    }


def test_list_shows_reason_source_age_and_body_and_filters_select(
    engine: Engine, names: Names, sasflow: Sasflow
) -> None:
    poison = _poison(engine, names, sasflow)
    unknown = poison["unknown"]
    assert unknown["source_queue"] == names.submit
    assert unknown["queue"] == names.dead_letter_queue
    assert "'ops'" in unknown["reason"]
    assert 0 <= unknown["age_s"] < 60
    assert unknown["correlation_id"] == "c-1"
    assert '"key": "late-1"' in unknown["body"]  # pretty-printed JSON
    assert unknown["headers"][REASON_HEADER] == unknown["reason"]
    # Listing requeues everything: a second look shows the same ids.
    assert {le["id"] for le in _listed(sasflow)} == {p["id"] for p in poison.values()}

    assert [le["id"] for le in _listed(sasflow, "--reason-contains", "UNKNOWN WORK")] == [
        unknown["id"]
    ]
    assert len(_listed(sasflow, "--source", "submit")) == 2
    assert len(_listed(sasflow, "--source", names.submit)) == 2
    assert _listed(sasflow, "--source", "replies") == []
    assert _listed(sasflow, "--older-than", "1h") == []
    assert len(_listed(sasflow, "--newer-than", "1h")) == 2
    assert len(_listed(sasflow, "--limit", "1")) == 1

    shown = _json(sasflow, "show", unknown["id"])
    assert shown["id"] == unknown["id"]
    assert json.loads(shown["body"])["input"] == {"value": 1}
    assert "no dead letter" in sasflow("dead", "show", "0" * 16, code=1).output


def test_replay_after_the_fix_makes_the_submission_a_run_and_is_audited(
    engine: Engine, names: Names, sasflow: Sasflow
) -> None:
    poison = _poison(engine, names, sasflow)
    unknown = poison["unknown"]["id"]
    fixed = harness.submitter(engine, ops.registry, names)  # the workflow is registered now
    with harness.running(fixed):
        preview = _json(sasflow, "replay", unknown, "--dry-run", "--reason", "ops deployed")
        assert preview["ids"] == [unknown]
        assert preview["dry_run"] is True
        done = _json(sasflow, "replay", unknown, "--reason", "ops deployed", "--by", "alice")
        assert done["ids"] == [unknown]
        harness.wait_for(lambda: _runs(engine) == ["late-1"], what="the replayed run")
    assert [le["id"] for le in _listed(sasflow)] == [poison["garbled"]["id"]]
    with engine.connect() as conn:
        row = conn.execute(select(audit)).one()
    assert (row.action, row.actor, row.reason) == ("dead.replay", "alice", "ops deployed")
    assert [d["id"] for d in row.detail["dead_letters"]] == [unknown]
    assert row.detail["dead_letters"][0]["source_queue"] == names.submit


def test_purge_dry_run_names_exactly_what_purge_yes_removes(
    engine: Engine, names: Names, sasflow: Sasflow
) -> None:
    poison = _poison(engine, names, sasflow)
    assert (
        "--dry-run to preview or --yes" in sasflow("dead", "purge", "--reason", "x", code=2).output
    )
    preview = _json(sasflow, "purge", "--source", "submit", "--dry-run", "--reason", "junk")
    assert sorted(preview["ids"]) == sorted(p["id"] for p in poison.values())
    done = _json(sasflow, "purge", "--source", "submit", "--yes", "--reason", "junk")
    assert sorted(done["ids"]) == sorted(preview["ids"])
    assert _listed(sasflow) == []
    with engine.connect() as conn:
        row = conn.execute(select(audit)).one()
    assert (row.action, row.reason, row.detail["count"]) == ("dead.purge", "junk", 2)


def test_a_dead_lettered_request_is_not_replayed_and_nothing_is_taken(
    names: Names, sasflow: Sasflow
) -> None:
    sasflow("dead", "list")  # declares the namespace's dead-letter queues
    harness.publish_raw(
        names.dead_letter_queue,
        json.dumps({"step_id": 1, "attempt": 1}).encode(),
        headers={REASON_HEADER: "handler refused it", SOURCE_HEADER: names.agent("remote")},
    )
    (letter,) = _listed(sasflow)
    refused = sasflow("dead", "replay", letter["id"], "--reason", "retry", code=1)
    assert "sasflow runs resubmit" in refused.output
    assert [le["id"] for le in _listed(sasflow)] == [letter["id"]]
    assert "no dead letter" in sasflow("dead", "purge", "f" * 16, "--reason", "x", code=1).output


def test_replay_dry_run_previews_what_it_replays_and_what_it_skips_and_why(
    engine: Engine, names: Names, sasflow: Sasflow
) -> None:
    """Selected by filters: the dry run lists the replayable dead letters and each skipped one
    with why; the replay then does exactly that and audits the skipped ones."""
    sasflow("dead", "list")  # declares the namespace's queues
    published = [
        ({REASON_HEADER: "unknown workflow 'ops'", SOURCE_HEADER: names.submit}, b'{"a": 1}'),
        ({REASON_HEADER: "handler refused it", SOURCE_HEADER: names.agent("remote")}, b"{}"),
        ({REASON_HEADER: "came from nowhere"}, b'{"b": 2}'),
    ]
    for headers, body in published:
        harness.publish_raw(names.dead_letter_queue, body, headers=headers)
    by_reason = {le["reason"]: le["id"] for le in _listed(sasflow)}
    submission = by_reason["unknown workflow 'ops'"]
    request, sourceless = by_reason["handler refused it"], by_reason["came from nowhere"]

    preview = _json(sasflow, "replay", "--dry-run", "--reason", "fixed")
    human = sasflow("dead", "replay", "--dry-run", "--reason", "fixed").output
    named = sasflow("dead", "replay", "--dry-run", request, "--reason", "fixed").output
    done = _json(sasflow, "replay", "--yes", "--reason", "fixed")

    assert preview["ids"] == done["ids"] == [submission]
    skipped = {s["id"]: s for s in preview["skipped"]}
    assert skipped == {s["id"]: s for s in done["skipped"]}
    assert skipped[request]["source_queue"] == names.agent("remote")
    assert "request to an agent" in skipped[request]["why"]
    assert "sasflow runs resubmit" in skipped[request]["why"]
    assert skipped[sourceless]["why"] == "without a source queue: nowhere to put it back"
    assert f"would replay 1 dead letter(s): {submission}\n" in human
    assert f"skipped {request} (from {names.agent('remote')}): a request to an agent" in human
    assert f"skipped {sourceless}: without a source queue" in human
    assert "would replay 0 dead letter(s)" in named
    assert f"skipped {request} (from" in named
    assert sorted(le["id"] for le in _listed(sasflow)) == sorted([request, sourceless])
    with engine.connect() as conn:
        row = conn.execute(select(audit)).one()
    assert row.detail["count"] == 1
    assert {s["id"] for s in row.detail["skipped"]} == {request, sourceless}
