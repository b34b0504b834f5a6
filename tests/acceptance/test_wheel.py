"""Every way of installing sasflow yields a working `sasflow db upgrade` and `sasflow --help`:
the README's plain editable install, a strict editable install, a wheel and an sdist.

Each mode installs into a fresh virtualenv made without pip. sasflow itself is installed with
`--no-deps --no-index --no-build-isolation` (the build uses this venv's setuptools, from the
dev extras); its dependencies come from this venv's site-packages through a `.pth` file. So
nothing is downloaded, except by the README's own line, which keeps pip's build isolation and
fetches setuptools from the configured index. Each install works on a copy of the checkout, so
building leaves no `build/` or `*.egg-info` behind in the worktree.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import services
from tests.acceptance.processes import REPO

pytestmark = [pytest.mark.acceptance, pytest.mark.slow]

# This interpreter's venv site-packages: where the dependencies come from.
DEPENDENCIES = sysconfig.get_paths()["purelib"]
README_INSTALL = re.compile(r"^python3 -m venv \.venv && \.venv/bin/pip install -e \.$", re.M)


def _tracked_files() -> list[str]:
    """The files git tracks, as the worktree has them: stray local files (a venv, a link to
    one, build outputs) never reach the copy."""
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    return [path for path in listed.split("\0") if path and (REPO / path).exists()]


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A copy of what git tracks in the worktree (no venv, no build outputs)."""
    copy = tmp_path / "checkout"
    for path in _tracked_files():
        (copy / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / path, copy / path, follow_symlinks=False)
    return copy


@pytest.fixture
def empty_database_url() -> Iterator[str]:
    """A throwaway database with no schema yet: `db upgrade` must create all of it."""
    name = services.unique("sasflow_install")
    services.create_database(name)
    yield services.database_url(name)
    services.drop_database(name)


def _run(args: list[str], *, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, f"{args}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _bare_venv(path: Path) -> Path:
    """A venv without pip whose site-packages also sees this venv's (the dependencies)."""
    _run([sys.executable, "-m", "venv", "--without-pip", str(path)], cwd=path.parent)
    return _with_dependencies(path)


def _with_dependencies(venv: Path) -> Path:
    (site,) = venv.glob("lib/python3*/site-packages")
    # Appended after the venv's own site-packages: the sasflow installed there comes first.
    (site / "_sasflow_test_dependencies.pth").write_text(DEPENDENCIES + "\n")
    return venv


def _pip_into(venv: Path, *args: str, cwd: Path) -> None:
    """This venv's pip installing into `venv`, offline and without dependencies."""
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--no-build-isolation",
            *args,
        ],
        cwd=cwd,
    )


def _assert_works(venv: Path, database_url: str, *, cwd: Path) -> None:
    """`sasflow --help` and `sasflow db upgrade` from an empty database, outside the checkout
    (so the current directory cannot stand in for the install)."""
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "SASFLOW_APP"}}
    env["SASFLOW_DATABASE_URL"] = database_url
    sasflow = str(venv / "bin" / "sasflow")
    assert "Usage: sasflow" in _run([sasflow, "--help"], cwd=cwd, env=env)
    head = sorted(p.name for p in (REPO / "alembic" / "versions").glob("0*.py"))[-1][:4]
    upgraded = _run([sasflow, "db", "upgrade"], cwd=cwd, env=env)
    assert f"revision {head}" in upgraded
    assert "schema matches" in _run([sasflow, "db", "check"], cwd=cwd, env=env)


def test_readme_install_line_installs_a_working_sasflow(
    checkout: Path, tmp_path: Path, empty_database_url: str
) -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    (line,) = README_INSTALL.findall(readme)
    # The README's line as written (pip's build isolation included); only the dependencies,
    # which this venv has already, are not downloaded again.
    env = {**os.environ, "PIP_NO_DEPS": "1"}
    env.pop("PYTHONPATH", None)
    _run(["bash", "-c", line], cwd=checkout, env=env)
    venv = _with_dependencies(checkout / ".venv")
    _assert_works(venv, empty_database_url, cwd=tmp_path)


def test_strict_editable_install_works(
    checkout: Path, tmp_path: Path, empty_database_url: str
) -> None:
    venv = _bare_venv(tmp_path / "venv")
    _pip_into(venv, "-e", str(checkout), "--config-settings", "editable_mode=strict", cwd=checkout)
    _assert_works(venv, empty_database_url, cwd=tmp_path)


def test_wheel_ships_the_migrations_and_upgrades_a_database(
    checkout: Path, tmp_path: Path, empty_database_url: str
) -> None:
    wheels = tmp_path / "wheels"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-index",
            "--no-build-isolation",
            "-w",
            str(wheels),
            str(checkout),
        ],
        cwd=checkout,
    )
    (wheel,) = wheels.glob("sasflow-*.whl")
    venv = _bare_venv(tmp_path / "venv")
    _pip_into(venv, str(wheel), cwd=tmp_path)
    (site,) = venv.glob("lib/python3*/site-packages")
    shipped = sorted(p.name for p in (site / "sasflow" / "migrations" / "versions").glob("0*.py"))
    in_checkout = sorted(p.name for p in (REPO / "alembic" / "versions").glob("0*.py"))
    assert shipped == in_checkout
    assert (site / "sasflow" / "migrations" / "env.py").is_file()
    assert not (site / "alembic" / "env.py").exists(), "the wheel must not shadow alembic"
    console = REPO / "engine" / "api" / "console"
    for folder in ("templates", "static"):  # the console's package data
        shipped = sorted(p.name for p in (site / "sasflow" / "api" / "console" / folder).iterdir())
        assert shipped == sorted(p.name for p in (console / folder).iterdir())
    _assert_works(venv, empty_database_url, cwd=tmp_path)


def test_sdist_installs_a_working_sasflow(
    checkout: Path, tmp_path: Path, empty_database_url: str
) -> None:
    dist = tmp_path / "dist"
    _run(
        [
            sys.executable,
            "-c",
            "import sys; from setuptools import build_meta; build_meta.build_sdist(sys.argv[1])",
            str(dist),
        ],
        cwd=checkout,
    )
    (sdist,) = dist.glob("sasflow-*.tar.gz")
    venv = _bare_venv(tmp_path / "venv")
    _pip_into(venv, str(sdist), cwd=tmp_path)
    _assert_works(venv, empty_database_url, cwd=tmp_path)
