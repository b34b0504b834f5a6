"""What every command receives: the settings read at the edge, and lazy access to the app."""

from __future__ import annotations

import getpass
import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, TypeVar

import click

from sasflow.appload import load_registry
from sasflow.errors import (
    AssignmentConflictError,
    BrokerRefusedError,
    BrokerUnavailableError,
    ConfigurationError,
    DefinitionChangedError,
    SasflowError,
    SchemaOutdatedError,
    StoreRefusedError,
    StoreUnavailableError,
    UnknownWorkflowError,
)
from sasflow.hooks import Hooks
from sasflow.observability.build import role_hooks
from sasflow.redact import redact_url
from sasflow.registry import Registry
from sasflow.runtime import stop_on_signals
from sasflow.settings import Settings
from sasflow.store.db import (
    Connection,
    Engine,
    EngineOptions,
    make_engine,
    run_transaction,
    transaction,
)
from sasflow.store.operator.audit import database_now
from sasflow.transport.base import Transport
from sasflow.transport.factory import broker_options, is_in_process, make_transport
from sasflow.transport.memory import MemoryBroker
from sasflow.transport.topology import Names

T = TypeVar("T")

log = logging.getLogger(__name__)

LOG_FORMAT = "%(asctime)s %(levelname)s %(processName)s[%(process)d] %(name)s: %(message)s"


@dataclass
class CliContext:
    """`in_process` is set by commands that run every role as threads of this process (`sasflow
    demo`): only they may use the in-process bus (`memory://`)."""

    settings: Settings
    in_process: bool = False
    _registry: Registry | None = field(default=None, init=False)
    _broker: MemoryBroker | None = field(default=None, init=False)
    _broker_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    @property
    def names(self) -> Names:
        return Names(self.settings.namespace)

    def registry(self) -> Registry:
        if self._registry is None:
            if not self.settings.app:
                raise ConfigurationError(
                    "no app given: pass --app MODULE[:ATTRIBUTE] or set SASFLOW_APP"
                )
            self._registry = load_registry(self.settings.app)
        return self._registry

    def engine(
        self,
        role: str,
        pool_size: int | None = None,
        statement_timeout_ms: int | Literal["settings"] | None = "settings",
    ) -> Engine:
        """An engine for `role`. `pool_size` is the command's own default (a short-lived
        command needs one connection); SASFLOW_DB_POOL_SIZE, when set, wins over it."""
        return make_engine(
            self.settings.database_url,
            engine_options(self.settings, role, pool_size, statement_timeout_ms),
        )

    def in_transaction(self, work: Callable[[Connection], T]) -> T:
        """Run an operator's `work` in one transaction of its own short-lived engine, once the
        schema is known to be at head (`check_schema`); a sasflow error becomes a clean CLI
        error."""
        engine = self.engine("ops", pool_size=1)
        try:
            check_schema(engine)
            return run_transaction(engine, work)
        except SasflowError as exc:
            raise fail(exc) from exc
        finally:
            engine.dispose()

    def read(self, work: Callable[[Connection], T]) -> tuple[T, datetime]:
        """`in_transaction(work)` and the database's clock in that transaction (what a table
        compacts its times against)."""
        return self.in_transaction(lambda conn: (work(conn), database_now(conn)))

    def hooks(self, role: str, *, engine: Engine | None = None) -> Hooks:
        """The observability hooks of `role` from the settings (metrics, tracing, JSON log
        context), closed when the command ends."""
        try:
            chain = role_hooks(self.settings, role, engine=engine)
        except ConfigurationError as exc:
            raise fail(exc) from exc
        click.get_current_context().call_on_close(chain.close)
        return chain

    def transport(self, role: str, *, long_running: bool = False) -> Transport:
        """A new transport for `role`; every in-process one shares this context's broker. A
        broker URL (or list) that cannot work ends a `long_running` role with exit status 78
        (EX_CONFIG, as a refusal at its first connection does), a command with 1."""
        url = self.settings.broker_url
        broker = None
        if is_in_process(url):
            if not self.in_process:
                raise click.UsageError(
                    f"the broker URL {redact_url(url)!r} is the in-process bus, which only "
                    "connects roles running inside one process: pass --broker-url amqp://... "
                    "(or set SASFLOW_BROKER_URL) to reach RabbitMQ, or run `sasflow demo`"
                )
            with self._broker_lock:  # role threads (e.g. the alert sink's) may ask at once
                if self._broker is None:
                    self._broker = MemoryBroker()
                broker = self._broker
        try:
            return make_transport(
                url,
                process_name=f"sasflow-{role}",
                broker=broker,
                options=broker_options(self.settings),
            )
        except ConfigurationError as exc:
            raise (ConfigurationExit(str(exc)) if long_running else fail(exc)) from exc


def engine_options(
    settings: Settings,
    role: str,
    pool_size: int | None = None,
    statement_timeout_ms: int | Literal["settings"] | None = "settings",
) -> EngineOptions:
    """The connection settings of `role`'s engine (see EngineOptions for the defaults)."""
    defaults = EngineOptions()
    size = settings.db_pool_size or pool_size or defaults.pool_size
    overflow = settings.db_max_overflow
    timeout_ms: int | None
    if statement_timeout_ms == "settings":
        seconds = settings.db_statement_timeout
        timeout_ms = round(seconds * 1000) if seconds > 0 else None
    else:
        timeout_ms = statement_timeout_ms
    return EngineOptions(
        application_name=f"sasflow-{role}",
        pool_size=size,
        max_overflow=size if overflow is None else overflow,
        pool_timeout=settings.db_pool_timeout,
        connect_timeout=settings.db_connect_timeout,
        statement_timeout_ms=timeout_ms,
    )


def check_not_refused(engine: Engine | None = None, transport: Transport | None = None) -> None:
    """Connect once to each given: raise (exit status 78) when the database or broker refuses
    this process's configuration, or the database's schema is empty or behind this sasflow's
    head (`check_schema`). One that cannot be reached yet is left to the role, which retries;
    so is a refusal after that first connection, and a schema that falls behind while the role
    runs (sasflow.schema_watch)."""
    try:
        if engine is not None:
            check_schema(engine)
    except SchemaOutdatedError as exc:
        raise role_failed(exc) from exc
    except StoreUnavailableError as exc:
        _raise_if_refused_at_start(exc)
    if transport is None:
        return
    try:
        transport.connect()
    except BrokerUnavailableError as exc:
        _raise_if_refused_at_start(exc)
    finally:
        transport.close()


def check_definitions(engine: Engine, registry: Registry, *, actor: str) -> None:
    """Raise DefinitionChangedError (exit status 78) when a workflow version of `registry` was
    first registered with another definition (store.cluster.versions); record the new ones. A
    database that cannot be reached yet is left to the role (schedulers check again when they
    register)."""
    from sasflow.store.cluster import versions  # noqa: PLC0415 - only the roles need it

    try:
        with transaction(engine) as conn:
            versions.record(conn, registry.workflows, actor=f"{actor}@{socket.gethostname()}")
    except StoreUnavailableError as exc:
        log.warning("workflow fingerprints not checked: %s", exc)


def check_schema(engine: Engine) -> None:
    """Raise SchemaOutdatedError, saying what `sasflow db check` says, when the database was
    never migrated or is behind this sasflow's head revision; a database ahead of it (a newer
    sasflow migrated it before its processes were restarted) is logged and used. The store's
    errors (unreachable, refused) are raised as they are."""
    from sasflow.store import migrate  # noqa: PLC0415 - alembic: only commands that need it

    status = migrate.require_head(engine)
    if status.ahead or status.unreadable is not None:
        log.warning("%s; carrying on", status.sentence())


def _raise_if_refused_at_start(exc: StoreUnavailableError | BrokerUnavailableError) -> None:
    if isinstance(exc, StoreRefusedError | BrokerRefusedError) and exc.never_connected:
        raise role_failed(exc) from exc


def default_actor() -> str:
    """`$USER@hostname`."""
    try:
        user = getpass.getuser()
    except OSError:  # no USER/LOGNAME and no passwd entry (containers with an arbitrary uid)
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


BROKER_LOGGERS = ("pika", "sasflow.transport")
"""The broker client's loggers and sasflow's transport (connections, reconnections)."""


def setup_logging(
    level: str,
    log_format: str = "text",
    role: str = "cli",
    *,
    one_shot: bool = False,
    verbose: bool = False,
) -> None:
    """The root logger at `level`, as text or JSON lines naming `role`; alembic from WARNING
    up. pika logs an ERROR with a traceback for every failed (re)connection that sasflow handles
    and reports itself in one line, so it is heard only at DEBUG, or from WARNING up when
    `verbose`. A `one_shot` command (not a long-running role) prints no broker log line at all
    unless `verbose`: its own `Error: ...` line says what failed."""
    if log_format == "json":
        from sasflow.observability.jsonlog import JsonFormatter  # noqa: PLC0415

        handler = logging.StreamHandler()
        handler.setFormatter(JsonFormatter(role))
        logging.basicConfig(level=level.upper(), handlers=[handler])
    else:
        logging.basicConfig(level=level.upper(), format=LOG_FORMAT)
    root = logging.getLogger().level
    logging.getLogger("alembic").setLevel(max(logging.WARNING, root))
    pika = logging.DEBUG if root <= logging.DEBUG else logging.CRITICAL
    if verbose:
        pika = min(pika, max(logging.WARNING, root))
    logging.getLogger("pika").setLevel(pika)
    if one_shot and not verbose and root > logging.DEBUG:
        for name in BROKER_LOGGERS:
            logging.getLogger(name).setLevel(logging.CRITICAL)


def build_settings(**overrides: Any) -> Settings:
    """Settings from the command line, falling back to SASFLOW_* variables, then defaults."""
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValueError as exc:
        raise click.UsageError(f"invalid settings: {exc}") from exc


EX_CONFIG = 78
"""sysexits.h: a configuration error. A service manager should not restart in a loop on it
(systemd: RestartPreventExitStatus=78)."""


def fail(exc: SasflowError) -> click.ClickException:
    """A sasflow error as a one-line CLI error: exit status 1, or 78 (EX_CONFIG) when the
    database's schema is not at head (`sasflow db upgrade` is the fix, not a retry)."""
    if isinstance(exc, SchemaOutdatedError):
        return ConfigurationExit(str(exc))
    if isinstance(exc, UnknownWorkflowError) and exc.hint:
        return click.ClickException(f"{exc}; {exc.hint}")
    return click.ClickException(str(exc))


def role_failed(exc: SasflowError) -> click.ClickException:
    """How a long-running role ends on a sasflow error: exit status 78 (EX_CONFIG) when the
    database or broker refused this process before it ever connected, or it was started with
    another assignment strategy than the live schedulers, or on a database whose schema is not
    at head (a service manager should not restart it), else 1 as `fail`. Operator commands
    keep 1 for every other failure."""
    if isinstance(exc, StoreRefusedError | BrokerRefusedError) and exc.never_connected:
        return ConfigurationExit(str(exc))
    if isinstance(exc, AssignmentConflictError | DefinitionChangedError):
        return ConfigurationExit(str(exc))
    return fail(exc)


class ConfigurationExit(click.ClickException):
    """`Error: ...` and exit status 78: what the process was given is refused."""

    exit_code = EX_CONFIG


def stop_event() -> threading.Event:
    """An event that SIGTERM and SIGINT set."""
    event = threading.Event()
    stop_on_signals(event)
    return event
