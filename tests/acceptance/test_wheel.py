"""`sasflow db upgrade` works from a built wheel, not only from a checkout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.acceptance.processes import REPO

pytestmark = [pytest.mark.acceptance, pytest.mark.slow]


def test_wheel_ships_the_migrations_and_upgrades_a_database(
    tmp_path: Path, database_url: str
) -> None:
    wheels = tmp_path / "wheels"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(REPO)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = wheels.glob("sasflow-*.whl")
    target = tmp_path / "site"
    installed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "-q",
            "--target",
            str(target),
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert installed.returncode == 0, installed.stderr
    assert (target / "sasflow" / "migrations" / "env.py").is_file()
    shipped = sorted(p.name for p in (target / "sasflow" / "migrations" / "versions").glob("0*.py"))
    in_checkout = sorted(p.name for p in (REPO / "alembic" / "versions").glob("0*.py"))
    assert shipped == in_checkout
    assert not (target / "alembic").exists(), "the wheel must not shadow the alembic package"
    # The wheel's copy first on the path; dependencies come from this interpreter's site.
    env = {**os.environ, "PYTHONPATH": str(target), "SASFLOW_DATABASE_URL": database_url}
    where = subprocess.run(
        [sys.executable, "-c", "import sasflow; print(sasflow.__file__)"],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=True,
    )
    assert where.stdout.startswith(str(target))
    for args, expected in (
        (["db", "downgrade", "base"], "revision None"),
        (["db", "upgrade"], f"revision {in_checkout[-1].split('_')[0]}"),
        (["db", "check"], "schema matches"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "sasflow", *args],
            env=env,
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert expected in done.stdout
