"""A multi-host database URL, in either form SQLAlchemy accepts, reaches every connection a
role opens with the same hosts and ports: the pool's and the LISTEN connection's. With several
hosts, libpq is told to look for the writable one (target_session_attrs=read-write) unless the
URL says otherwise."""

from __future__ import annotations

import pytest
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy.engine import make_url

from sasflow.errors import ConfigurationError
from sasflow.store.db import EngineOptions, host_count, libpq_conninfo, make_engine
from sasflow.store.listen import libpq_dsn

REPEATED = "postgresql+psycopg://app:pw@/sasflow?host=db1:5432&host=db2:5433"
COMMA = "postgresql+psycopg://app:pw@/sasflow?host=db1,db2&port=5432,5433"


@pytest.mark.parametrize("url", [REPEATED, COMMA])
def test_both_multi_host_forms_give_libpq_the_same_hosts_ports_and_target(url: str) -> None:
    assert conninfo_to_dict(libpq_dsn(url)) == {
        "host": "db1,db2",
        "port": "5432,5433",
        "dbname": "sasflow",
        "user": "app",
        "password": "pw",
        "target_session_attrs": "read-write",
    }


@pytest.mark.parametrize("url", [REPEATED, COMMA])
def test_the_pool_connects_with_the_same_parameters_as_the_listen_connection(url: str) -> None:
    engine = make_engine(url)
    try:
        _args, params = engine.dialect.create_connect_args(engine.url)
    finally:
        engine.dispose()
    listen = conninfo_to_dict(libpq_conninfo(url, EngineOptions()))
    pool = {k: str(v) for k, v in params.items() if k != "context"}
    assert {k: listen[k] for k in pool} == pool
    assert listen["target_session_attrs"] == "read-write"


def test_the_listen_connection_gets_the_pools_keepalives_and_timeouts() -> None:
    options = EngineOptions(application_name="sasflow-scheduler", connect_timeout=4)
    params = conninfo_to_dict(libpq_conninfo(COMMA, options))
    assert {k: params[k] for k in ("application_name", "connect_timeout", "keepalives")} == {
        "application_name": "sasflow-scheduler",
        "connect_timeout": "4",
        "keepalives": "1",
    }
    assert {"keepalives_idle", "keepalives_interval", "keepalives_count"} <= params.keys()
    assert params["tcp_user_timeout"] == "30000"


def test_an_explicit_target_session_attrs_is_kept() -> None:
    url = f"{COMMA}&target_session_attrs=primary"
    assert conninfo_to_dict(libpq_dsn(url))["target_session_attrs"] == "primary"


@pytest.mark.parametrize(
    "url",
    [
        "postgresql+psycopg://app@db1:5432/sasflow",
        "postgresql://app@db1/sasflow?sslmode=require",
        "postgresql+psycopg://app@/sasflow?host=/var/run/postgresql",
    ],
)
def test_one_host_is_left_as_it_is(url: str) -> None:
    params = conninfo_to_dict(libpq_dsn(url))
    assert "target_session_attrs" not in params
    assert params["dbname"] == "sasflow"


def test_one_host_keeps_its_query_parameters() -> None:
    url = "postgresql+psycopg://app:p%40ss@db1:6432/sasflow?sslmode=verify-full&sslrootcert=/ca"
    assert conninfo_to_dict(libpq_dsn(url)) == {
        "host": "db1",
        "port": "6432",
        "dbname": "sasflow",
        "user": "app",
        "password": "p@ss",
        "sslmode": "verify-full",
        "sslrootcert": "/ca",
    }


@pytest.mark.parametrize(
    ("url", "hosts"),
    [
        ("postgresql+psycopg://app@db1/sasflow", 1),
        ("postgresql+psycopg://app@/sasflow", 1),
        (REPEATED, 2),
        (COMMA, 2),
        ("postgresql+psycopg://app@/sasflow?host=a,b,c&port=1,2,3", 3),
    ],
)
def test_host_count(url: str, hosts: int) -> None:
    assert host_count(make_url(url)) == hosts


@pytest.mark.parametrize(
    "url",
    [
        "postgresql+psycopg://app@/sasflow?host=db1:5432&host=db2:5433&port=5432",
        "postgresql+psycopg://app@/sasflow?host=db1,db2&port=5432",
    ],
)
def test_a_malformed_multi_host_url_is_a_configuration_error(url: str) -> None:
    with pytest.raises(ConfigurationError, match="invalid database URL"):
        libpq_dsn(url)


def test_make_engine_refuses_a_malformed_multi_host_url_at_once() -> None:
    with pytest.raises(ConfigurationError, match="number of hosts and ports"):
        make_engine("postgresql+psycopg://app@/sasflow?host=db1,db2&port=5432,5433,5434")
