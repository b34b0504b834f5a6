"""Throw-away PostgreSQL and RabbitMQ instances the suite may restart and kill.

The shared services on the default ports are never touched: each instance lives under the
run's temporary directory, on free loopback ports, and only processes whose identity was
checked are signalled.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import psycopg
from psycopg import sql

PG_ROOT = Path("/usr/lib/postgresql")
APP_ROLE = "sasflow_app"
"""The roles connect as this owner of the database, not as a superuser: superusers are exempt
from the connection limits the `pg_connection_limit` fault sets."""
RABBIT_BIN = Path("/usr/lib/rabbitmq/bin")
CHANNEL_TICK_MS = 1000
"""The channel tick of a node given a consumer timeout: RabbitMQ (3.10) compares a channel's
oldest unacknowledged delivery with `consumer_timeout` only on this tick (`channel_tick_interval`,
60 s by default, an application setting outside rabbitmq.conf's schema), so a timeout of a few
seconds closes the channel about a second after it passed instead of up to a minute later."""


class ServiceError(RuntimeError):
    """A dedicated service instance could not be started or controlled."""


def unavailable() -> str | None:
    """Why this machine cannot run instances, if it cannot: they need root (PostgreSQL runs
    as the postgres user), the PostgreSQL and RabbitMQ binaries, runuser and psql."""
    if os.geteuid() != 0:
        return "the instances need root (PostgreSQL runs as the postgres user)"
    if not any(PG_ROOT.glob("*/bin/initdb")):
        return f"no PostgreSQL binaries under {PG_ROOT}"
    if not (RABBIT_BIN / "rabbitmq-server").exists():
        return f"no RabbitMQ binaries under {RABBIT_BIN}"
    missing = [tool for tool in ("runuser", "psql") if shutil.which(tool) is None]
    return f"missing: {', '.join(missing)}" if missing else None


def free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _run(
    argv: list[str], *, env: dict[str, str] | None = None, timeout: float = 120, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run a control command; servers it starts must log to files (they would hold our pipes
    open otherwise)."""
    done = subprocess.run(
        argv,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    if check and done.returncode != 0:
        raise ServiceError(
            f"{' '.join(argv)} exited {done.returncode}: "
            f"{(done.stderr or done.stdout).strip()[-2000:]}"
        )
    return done


def _wait(predicate: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(predicate) and predicate():
            return
        time.sleep(0.3)
    raise ServiceError(f"timed out after {timeout:.0f}s waiting for {what}")


class PostgresInstance:
    """An `initdb` cluster run as the `postgres` OS user, trust auth, durable commits.

    `restart_immediate` is `pg_ctl restart -m immediate`: what Debian's
    `pg_ctlcluster <version> <name> restart -m immediate` runs for a packaged cluster.
    """

    def __init__(self, root: Path, *, port: int | None = None, name: str | None = None) -> None:
        """`port`: its port (default: a free one); `name`: its `cluster_name`, which a standby
        streams under (its walreceiver's application_name)."""
        versions = (
            sorted((p.name for p in PG_ROOT.iterdir() if (p / "bin/initdb").exists()), key=float)
            if PG_ROOT.is_dir()
            else []
        )
        if not versions:
            raise ServiceError(f"no PostgreSQL binaries under {PG_ROOT}")
        if shutil.which("runuser") is None:
            raise ServiceError("runuser is needed to run PostgreSQL as the postgres user")
        self.bin = PG_ROOT / versions[-1] / "bin"
        self.root = root
        self.data = root / "pgdata"
        self.sockets = root / "pgsock"
        self.port = port or free_port()
        self.name = name
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/sasflow"
        """The superuser's: the suite's own checks and fault actions."""
        self.app_url = f"postgresql+psycopg://{APP_ROLE}@127.0.0.1:{self.port}/sasflow"
        """The sasflow processes'."""
        self.started = False

    def _as_postgres(self, *argv: str, timeout: float = 120) -> None:
        _run(["runuser", "-u", "postgres", "--", *argv], timeout=timeout)

    def options(self) -> str:
        """The server's command-line settings (pg_ctl -o): its port and sockets are not in
        its data directory, which a standby copies."""
        named = f" -c cluster_name={self.name}" if self.name else ""
        return (
            f"-p {self.port} -k {self.sockets} -c listen_addresses=127.0.0.1 "
            f"-c fsync=on -c synchronous_commit=on -c max_connections=200{named}"
        )

    def start(self) -> None:
        for folder in (self.data, self.sockets):
            folder.mkdir(parents=True)
            shutil.chown(folder, "postgres", "postgres")
        self._as_postgres(
            str(self.bin / "initdb"),
            "-D",
            str(self.data),
            "-A",
            "trust",
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--no-instructions",
        )
        self.started = True
        self._pg_ctl_start()
        self._as_postgres(
            str(self.bin / "createdb"),
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-U",
            "postgres",
            "-O",
            "postgres",
            "sasflow",
        )
        self.admin(f"CREATE ROLE {APP_ROLE} LOGIN", f"ALTER DATABASE sasflow OWNER TO {APP_ROLE}")

    def _pg_ctl_start(self) -> None:
        self._as_postgres(
            str(self.bin / "pg_ctl"),
            "-D",
            str(self.data),
            "-w",
            "-t",
            "60",
            "-l",
            str(self.data / "server.log"),
            "-o",
            self.options(),
            "start",
        )

    def admin(self, *statements: str) -> None:
        """Run statements as the superuser, each in its own transaction, whatever the server's
        default_transaction_read_only says."""
        with psycopg.connect(
            f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres", autocommit=True
        ) as conn:
            conn.execute("SET default_transaction_read_only = off")
            for statement in statements:
                conn.execute(sql.SQL(statement))

    def read_only_for(self, seconds: float) -> None:
        """Every session refuses writes (a standby after a failover, a disk-full guard), then
        the server is writable again: ALTER SYSTEM and a reload reach the open sessions too."""
        self.admin("ALTER SYSTEM SET default_transaction_read_only = on", "SELECT pg_reload_conf()")
        try:
            time.sleep(seconds)
        finally:
            self.admin(
                "ALTER SYSTEM RESET default_transaction_read_only", "SELECT pg_reload_conf()"
            )

    def connection_limit_for(self, seconds: float) -> None:
        """The roles' connections are cut and no new one is accepted ("too many connections
        for role", SQLSTATE 53300) for `seconds`."""
        self.admin(
            f"ALTER ROLE {APP_ROLE} CONNECTION LIMIT 0",
            f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{APP_ROLE}'",
        )
        try:
            time.sleep(seconds)
        finally:
            self.admin(f"ALTER ROLE {APP_ROLE} CONNECTION LIMIT -1")

    def restart_immediate(self) -> None:
        self.restart("immediate")

    def restart(self, mode: str) -> None:
        """`pg_ctl restart -m <mode>`: `fast` ends the sessions and checkpoints, `immediate`
        is a crash (WAL recovery on start)."""
        self._as_postgres(
            str(self.bin / "pg_ctl"),
            "-D",
            str(self.data),
            "-w",
            "-t",
            "60",
            "-l",
            str(self.data / "server.log"),
            "-m",
            mode,
            "restart",
        )

    def running(self) -> bool:
        done = subprocess.run(
            [
                "runuser",
                "-u",
                "postgres",
                "--",
                str(self.bin / "pg_ctl"),
                "-D",
                str(self.data),
                "status",
            ],
            capture_output=True,
            timeout=30,
            check=False,
        )
        return done.returncode == 0

    def ensure_running(self) -> None:
        """Start the server if it is down, with its own port and sockets (a plain `pg_ctl
        start` would take the data directory's defaults: port 5432)."""
        if not self.running():
            self._pg_ctl_start()

    def in_recovery(self) -> bool:
        """Whether the server is a standby."""
        with psycopg.connect(
            f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres", connect_timeout=5
        ) as conn:
            return bool(conn.execute("SELECT pg_is_in_recovery()").fetchone() == (True,))

    def synchronous_standbys(self, names: str | None) -> None:
        """Set `synchronous_standby_names` (None: reset to none, commits wait for no standby)
        and reload: what a failover manager such as Patroni does on a primary."""
        setting = (
            "ALTER SYSTEM RESET synchronous_standby_names"
            if names is None
            else f"ALTER SYSTEM SET synchronous_standby_names = '{names}'"
        )
        self.admin(setting, "SELECT pg_reload_conf()")

    def promote(self) -> None:
        """`pg_ctl promote`: a standby becomes a primary (waits until it accepts writes)."""
        self._as_postgres(
            str(self.bin / "pg_ctl"), "-D", str(self.data), "-w", "-t", "60", "promote"
        )

    def stop(self) -> None:
        if self.started:
            self.started = False
            with contextlib.suppress(ServiceError, subprocess.TimeoutExpired):
                self._as_postgres(
                    str(self.bin / "pg_ctl"),
                    "-D",
                    str(self.data),
                    "-w",
                    "-t",
                    "30",
                    "-m",
                    "immediate",
                    "stop",
                    timeout=60,
                )


class PostgresStandby(PostgresInstance):
    """A streaming standby of `primary` (pg_basebackup -R), on a free port (or `port`).

    It streams as `name`, which the primary's `synchronous_standby_names` may list. Once
    promoted it is a primary like any other, and may be the `primary` of a new standby."""

    def __init__(
        self,
        primary: PostgresInstance,
        root: Path,
        *,
        port: int | None = None,
        name: str = "sasflow_standby",
    ) -> None:
        super().__init__(root, port=port, name=name)
        self.primary = primary

    def start(self) -> None:
        for folder in (self.data.parent, self.sockets):
            folder.mkdir(parents=True, exist_ok=True)
            shutil.chown(folder, "postgres", "postgres")
        self._as_postgres(
            str(self.bin / "pg_basebackup"),
            *("-h", "127.0.0.1", "-p", str(self.primary.port), "-U", "postgres"),
            *("-D", str(self.data), "-R", "-X", "stream", "--checkpoint=fast"),
        )
        self.started = True
        self._pg_ctl_start()


def _setting_name(key: str) -> str:
    if re.fullmatch(r"[a-z][a-z_]*", key) is None:
        raise ValueError(f"not a RabbitMQ setting name: {key!r}")
    return key


class RabbitInstance:
    """A second RabbitMQ node on this machine with its own name, ports, cookie and files."""

    def __init__(
        self,
        root: Path,
        run_id: str,
        *,
        prefix: str = "sasflow-chaos",
        ports: tuple[int, int] | None = None,
        cookie: str | None = None,
        config: str = "",
        consumer_timeout: float | None = None,
    ) -> None:
        """`ports`: its AMQP and distribution ports (default: free ones); `cookie`: its Erlang
        cookie (default: a random one; nodes of one cluster share theirs); `config`: lines
        added to its rabbitmq.conf; `consumer_timeout`: seconds a delivery may stay
        unacknowledged before the node closes its channel (default: RabbitMQ's, 30 minutes),
        checked every CHANNEL_TICK_MS."""
        if consumer_timeout is not None and consumer_timeout <= 0:
            raise ValueError(f"consumer_timeout must be > 0 seconds, got {consumer_timeout!r}")
        server = RABBIT_BIN / "rabbitmq-server"
        if not server.exists():
            raise ServiceError(f"RabbitMQ is not installed ({server} missing)")
        self.root = root / "rabbitmq"
        self.node = f"{prefix}-{run_id}@localhost"
        self.port, self.dist_port = ports or (free_port(), free_port())
        self.cookie = cookie or os.urandom(16).hex().upper()
        self.config = config
        self.consumer_timeout = consumer_timeout
        self.url = f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"
        self.os_pid: int | None = None
        self.started = False
        home = self.root / "home"
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),
            "LANG": "C.UTF-8",
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(self.root / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.root / "log"),
            "RABBITMQ_PID_FILE": str(self.root / "beam.pid"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.root / "enabled_plugins"),
            # Our own files replace /etc/rabbitmq's: its env file names the shared node.
            "RABBITMQ_CONFIG_FILE": str(self.root / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(self.root / "advanced.config"),
            "RABBITMQ_CONF_ENV_FILE": str(self.root / "rabbitmq-env.conf"),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            # Erlang writes crash dumps (of the node, or of a CLI call against a node that is
            # down) to the working directory otherwise.
            "ERL_CRASH_DUMP": str(self.root / "log" / "erl_crash.dump"),
        }
        self.ctl_base = [str(RABBIT_BIN / "rabbitmqctl"), "-n", self.node]

    def _write_files(self) -> None:
        home = Path(self.env["HOME"])
        for folder in (home, self.root / "mnesia", self.root / "log"):
            folder.mkdir(parents=True, exist_ok=True)
        cookie = home / ".erlang.cookie"
        cookie.write_text(self.cookie)
        cookie.chmod(0o400)
        (self.root / "enabled_plugins").write_text("[].\n")
        (self.root / "rabbitmq-env.conf").write_text("# sasflow chaos: nothing from /etc\n")
        # No management or prometheus listener (no plugins), loopback only.
        timeout = self.consumer_timeout
        (self.root / "rabbitmq.conf").write_text(
            f"listeners.tcp.local = 127.0.0.1:{self.port}\n"
            "log.console = false\n"
            "log.file.level = warning\n"
            + ("" if timeout is None else f"consumer_timeout = {round(timeout * 1000)}\n")
            + self.config
        )
        if timeout is not None:
            (self.root / "advanced.config").write_text(
                f"[{{rabbit, [{{channel_tick_interval, {CHANNEL_TICK_MS}}}]}}].\n"
            )

    @property
    def log_file(self) -> Path:
        """The node's log (warnings and errors; kept across its restarts)."""
        return self.root / "log" / f"{self.node}.log"

    def ctl(
        self, *args: str, timeout: float = 120, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return _run([*self.ctl_base, *args], env=self.env, timeout=timeout, check=check)

    def boot(self) -> None:
        """Start the node on its files (a node of a cluster rejoins it)."""
        _run([str(RABBIT_BIN / "rabbitmq-server"), "-detached"], env=self.env, timeout=60)
        _wait(
            lambda: self.ctl("ping", "--timeout", "5", check=False).returncode == 0,
            timeout=90,
            what=f"RabbitMQ node {self.node} to answer",
        )
        self.ctl("await_startup", "--timeout", "90", timeout=100)
        self.os_pid = None
        self.pid()

    def start(self) -> None:
        self._write_files()
        self.started = True
        self.boot()

    def _check_ours(self, pid: int) -> None:
        """Refuse to signal a process that is not this node's beam."""
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError as exc:
            raise ServiceError(f"pid {pid} of {self.node} is gone: {exc}") from exc
        if b"beam" not in cmdline or f"RABBITMQ_NODENAME={self.node}".encode() not in environ:
            raise ServiceError(f"pid {pid} is not the beam of {self.node}; not touching it")

    def stop_app_start_app(self, down_for: float) -> None:
        self.stop_app()
        time.sleep(down_for)
        self.start_app()

    def stop_app(self) -> None:
        """The node stays up, RabbitMQ in it stops: every connection is closed."""
        self.ctl("stop_app")

    def start_app(self) -> None:
        """Start RabbitMQ in the node again. A start refused because Mnesia still runs from the
        stop (RabbitMQ's prelaunch asserts it does not: seen once on a loaded machine, after a
        freeze) stops Mnesia and tries again, at most twice."""
        for tries_left in (2, 1, 0):
            try:
                self.ctl("start_app")
                break
            except ServiceError as exc:
                if "mnesia" not in str(exc) or not tries_left:
                    raise
                self.ctl("eval", "application:stop(mnesia).", check=False)
                time.sleep(1)
        self.ctl("await_startup", "--timeout", "90", timeout=100)

    def hard_kill_and_restart(self, down_for: float) -> None:
        self.kill()
        time.sleep(down_for)
        self.boot()

    def pid(self) -> int:
        """The beam's OS pid (asked of the node when this object did not boot it)."""
        if self.os_pid is None:
            self.os_pid = int(self.ctl("eval", "os:getpid().").stdout.strip().strip('"'))
        self._check_ours(self.os_pid)
        return self.os_pid

    def kill(self, pid: int | None = None) -> None:
        """SIGKILL the node's beam (checked to be ours; `pid`: as `pid()` found it) and wait
        until it is gone."""
        pid = pid or self.pid()
        self._check_ours(pid)
        os.kill(pid, signal.SIGKILL)
        _wait(lambda: not Path(f"/proc/{pid}").exists(), 30, "the beam to die")
        self.os_pid = None

    def answers(self) -> bool:
        """Whether RabbitMQ runs in the node (not only the Erlang VM)."""
        return self.ctl("await_startup", "--timeout", "3", check=False, timeout=30).returncode == 0

    def join(self, seed: RabbitInstance) -> None:
        """Make this fresh node a member of `seed`'s cluster (same cookie)."""
        self.ctl("stop_app")
        self.ctl("reset")
        self.ctl("join_cluster", seed.node)
        self.start_app()

    def listing(self, kind: str, *fields: str) -> list[dict[str, object]]:
        """`rabbitmqctl <kind>` (list_queues, list_exchanges, ...) as this node sees the
        cluster, one dict an item (`--local` among `fields`: only what this node hosts)."""
        done = self.ctl(kind, "-q", "--formatter", "json", *fields, timeout=60)
        rows = json.loads(done.stdout or "[]")
        return [row for row in rows if isinstance(row, dict)]

    def freeze_for(self, seconds: float) -> None:
        """SIGSTOP the node (a network hang: connections open, nothing answers, handshakes
        stall), then SIGCONT."""
        if self.os_pid is None:
            raise ServiceError("RabbitMQ node pid unknown")
        self._check_ours(self.os_pid)
        os.kill(self.os_pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            os.kill(self.os_pid, signal.SIGCONT)

    def settings(self, *keys: str) -> dict[str, int | None]:
        """Integer settings of the `rabbit` application in the running node (None: unset)."""
        asked = ", ".join(f"application:get_env(rabbit, {_setting_name(k)})" for k in keys)
        done = self.ctl("eval", f"[{asked}].")
        found = [m.group(1) for m in re.finditer(r"\{ok,(\d+)\}|undefined", done.stdout)]
        if len(found) != len(keys):
            raise ServiceError(f"{self.node}: unexpected settings {done.stdout.strip()!r}")
        return {
            key: None if value is None else int(value)
            for key, value in zip(keys, found, strict=True)
        }

    def set_settings(self, settings: dict[str, int | None]) -> None:
        """Set (None: unset) integer settings of the `rabbit` application in the running
        node, for what reads them from then on (a channel reads its consumer timeout and tick
        when it opens). The node's files are left alone: a restart forgets them."""
        changes = ", ".join(
            f"application:unset_env(rabbit, {_setting_name(key)})"
            if value is None
            else f"application:set_env(rabbit, {_setting_name(key)}, {int(value)})"
            for key, value in settings.items()
        )
        self.ctl("eval", f"{changes}.")

    def override_consumer_timeout(self, seconds: float) -> dict[str, int | None]:
        """Give the running node a consumer timeout of `seconds`, checked every
        CHANNEL_TICK_MS, for the channels opened from now on (its files say otherwise: a
        restart forgets it); returns what it had, for `set_settings` to put back."""
        before = self.settings("consumer_timeout", "channel_tick_interval")
        self.set_settings(
            {
                "consumer_timeout": round(seconds * 1000),
                "channel_tick_interval": CHANNEL_TICK_MS,
            }
        )
        return before

    def disk_alarm_for(self, seconds: float) -> None:
        """Raise the free-disk limit above the disk's size: the disk alarm blocks every
        publishing connection until the limit is back to RabbitMQ's default."""
        self.ctl("set_disk_free_limit", "1000000GB")
        try:
            time.sleep(seconds)
        finally:
            self.ctl("set_disk_free_limit", "50MB")

    def ensure_running(self) -> None:
        if self.ctl("await_startup", "--timeout", "5", check=False).returncode != 0:
            if self.ctl("ping", "--timeout", "5", check=False).returncode == 0:
                self.ctl("start_app")
                self.ctl("await_startup", "--timeout", "90", timeout=100)
            else:
                self.boot()

    def stop(self) -> None:
        if not self.started:
            return
        self.started = False
        with contextlib.suppress(ServiceError, subprocess.TimeoutExpired, ValueError):
            self.pid()  # known before the node is asked to stop, to make sure it did
        with contextlib.suppress(ServiceError, subprocess.TimeoutExpired):
            self.ctl("stop", timeout=60)
        if self.os_pid is not None and Path(f"/proc/{self.os_pid}").exists():
            with contextlib.suppress(ServiceError, ProcessLookupError):
                self._check_ours(self.os_pid)
                os.kill(self.os_pid, signal.SIGKILL)
