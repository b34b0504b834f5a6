"""`sasflow tokens create | list | revoke` on a SQLite file: the secret is printed once and
authenticates; names and scopes are checked; revocation is audited and immediate."""

from __future__ import annotations

import json

from click.testing import CliRunner
from sqlalchemy import Engine

from sasflow.cli.main import cli
from sasflow.ops import tokens
from sasflow.store.db import run_transaction
from sasflow.store.operator import audit


def _sasflow(sqlite_url: str, *args: str) -> tuple[int, str, str]:
    done = CliRunner().invoke(cli, ["--database-url", sqlite_url, "tokens", *args])
    return done.exit_code, done.stdout, done.stderr


def test_create_list_revoke(sqlite_url: str, sqlite_engine: Engine) -> None:
    code, out, err = _sasflow(
        sqlite_url, "create", "--name", "shop", "--scope", "submit", "--scope", "read"
    )
    assert code == 0, err
    secret = out.strip()
    assert secret.startswith("sft_")
    assert "cannot be shown again" in err
    found = run_transaction(sqlite_engine, lambda conn: tokens.authenticate(conn, secret))
    assert found is not None
    assert (found["name"], found["scopes"]) == ("shop", ["read", "submit"])

    code, _, err = _sasflow(sqlite_url, "create", "--name", "shop", "--scope", "read")
    assert (code, "a live token named 'shop' exists" in err) == (1, True)
    code, _, err = _sasflow(sqlite_url, "create", "--name", "x", "--scope", "root")
    assert (code, "unknown scopes ['root']" in err) == (1, True)
    code, _, err = _sasflow(sqlite_url, "create", "--name", "bad name", "--scope", "read")
    assert code == 1
    assert "a token needs a name matching" in err

    code, out, _ = _sasflow(sqlite_url, "list", "-o", "json")
    listed = json.loads(out)
    assert [(t["name"], t["scopes"], t["revoked_at"]) for t in listed] == [
        ("shop", ["read", "submit"], None)
    ]
    assert "token_hash" not in listed[0]

    code, out, err = _sasflow(sqlite_url, "revoke", "shop", "--reason", "leaked", "--actor", "ann")
    assert (code, out.strip()) == (0, "token 'shop' revoked"), err
    assert run_transaction(sqlite_engine, lambda conn: tokens.authenticate(conn, secret)) is None
    code, _, err = _sasflow(sqlite_url, "revoke", "shop", "--reason", "again")
    assert (code, "no live token named 'shop'" in err) == (1, True)
    code, out, _ = _sasflow(sqlite_url, "list", "--all", "-o", "json")
    assert json.loads(out)[0]["revoked_at"] is not None
    trail = run_transaction(sqlite_engine, audit.recent)
    assert [(a["action"], a["reason"]) for a in reversed(trail)] == [
        ("tokens.create", None),
        ("tokens.revoke", "leaked"),
    ]
    assert trail[0]["actor"] == "ann"
