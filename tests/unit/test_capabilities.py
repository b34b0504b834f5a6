"""The engine's capabilities (store.dialect) and the one description of a step record
(store.step_rows) that both submission paths derive from. No database is opened: an engine
connects on first use, and capabilities are decided from its dialect and driver."""

from __future__ import annotations

import json
import re
from dataclasses import fields

from sqlalchemy import create_engine

from sasflow import Step, Workflow
from sasflow.states import StepKind
from sasflow.store.dialect import Capabilities, capabilities, with_capabilities
from sasflow.store.runs import submit_many
from sasflow.store.runs.step_rows import (
    DEFINED_COLUMNS,
    STEP_COLUMNS,
    forward_definition,
    new_idempotency_key,
    step_row,
)

POSTGRES_URL = "postgresql+psycopg://nobody@127.0.0.1:1/none"
UUID4_HEX = re.compile(r"[0-9a-f]{12}4[0-9a-f]{3}[89ab][0-9a-f]{15}")


def test_postgresql_through_psycopg_takes_every_fast_path() -> None:
    engine = create_engine(POSTGRES_URL)
    assert capabilities(engine) == Capabilities(*[True] * len(fields(Capabilities)))


def test_sqlite_takes_the_portable_paths() -> None:
    engine = create_engine("sqlite://")
    assert capabilities(engine) == Capabilities(*[False] * len(fields(Capabilities)))
    assert capabilities(engine).portable() == capabilities(engine)


def test_capabilities_are_decided_once_per_engine_and_shared_by_its_connections() -> None:
    engine = create_engine("sqlite://")
    with engine.connect() as conn:
        assert capabilities(conn) is capabilities(engine)
    assert capabilities(engine) is capabilities(engine)


def test_portable_keeps_what_the_database_has_and_drops_the_fast_paths() -> None:
    fast = capabilities(create_engine(POSTGRES_URL))
    assert fast.portable() == Capabilities(
        notifications=True,
        server=True,
        one_statement_submit=False,
        merged_claim=False,
        batched_complete=False,
        copy_events=False,
        relay_in_flight=False,
        percentiles=False,
    )


def test_with_capabilities_leaves_the_engine_it_derives_from_as_it_was() -> None:
    engine = create_engine(POSTGRES_URL)
    fast = capabilities(engine)
    derived = with_capabilities(engine, fast.portable())
    assert capabilities(derived) == fast.portable()
    assert capabilities(engine) == fast
    assert derived.pool is engine.pool


workflow = Workflow(
    "w",
    [Step("a", "agent", "act", pool="p"), Step("b", "agent", "act", after=("a",))],
)


def test_a_step_row_has_every_step_column() -> None:
    row = step_row(forward_definition(workflow, "a"), run_id=1, priority=2, input={}, pool="p")
    assert list(row) == [c.name for c in DEFINED_COLUMNS] + [
        "run_id",
        "priority",
        "idempotency_key",
        "input",
    ]
    assert set(row) == {c.name for c in STEP_COLUMNS}
    assert (row["kind"], row["state"], row["pool"]) == (StepKind.FORWARD, "pending", "p")


def test_the_one_statement_template_and_text_derive_from_the_step_columns() -> None:
    entry = submit_many._template(workflow)
    assert entry is not None
    templates = json.loads(f"{{{entry}}}")
    fields_ = {"i", "root"} | {c.name for c in DEFINED_COLUMNS}
    assert [set(t) for t in templates["w@1"]] == [fields_, fields_]
    assert f"INSERT INTO steps ({', '.join(c.name for c in STEP_COLUMNS)})" in submit_many._SQL


def test_idempotency_keys_are_fresh_uuid4_hex() -> None:
    keys = {new_idempotency_key() for _ in range(100)}
    assert len(keys) == 100
    assert all(UUID4_HEX.fullmatch(k) for k in keys)
