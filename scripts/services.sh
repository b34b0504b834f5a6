# shellcheck shell=bash
# Make PostgreSQL and RabbitMQ reachable for sasflow's tests and local runs. Source it:
#   . scripts/services.sh
# It keeps SASFLOW_DATABASE_URL / SASFLOW_BROKER_URL when they are set and reachable;
# otherwise it finds the local services, starts them when installed but stopped, and installs
# them (Debian packages postgresql, rabbitmq-server; needs root) when missing. It exports the
# URLs it settled on, and SASFLOW_CHROMIUM: the browser of tests/ui (Debian's chromium,
# installed when missing). The database URL names a server where the tests may create databases.

_sasflow_log() { printf 'services: %s\n' "$*" >&2; }

_sasflow_psql_ok() {  # $1: SQLAlchemy or libpq URL
  local url=${1/+psycopg/}
  command -v psql >/dev/null 2>&1 || return 1
  PGCONNECT_TIMEOUT=3 psql "$url" -qAtc 'select 1' >/dev/null 2>&1
}

_sasflow_tcp_open() {  # $1 host, $2 port
  timeout 3 bash -c "exec 3<>/dev/tcp/$1/$2" 2>/dev/null
}

_sasflow_sudo() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

_sasflow_apt_install() {
  _sasflow_log "installing $* (Debian packages)"
  _sasflow_sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  _sasflow_sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

_sasflow_postgres() {
  local candidates
  if [ -n "${SASFLOW_DATABASE_URL:-}" ]; then
    if _sasflow_psql_ok "$SASFLOW_DATABASE_URL"; then return 0; fi
    _sasflow_log "SASFLOW_DATABASE_URL is set but not reachable yet; trying to start PostgreSQL"
    candidates=("$SASFLOW_DATABASE_URL")
  else
    candidates=("postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
                "postgresql+psycopg:///postgres")
  fi
  for url in "${candidates[@]}"; do
    if _sasflow_psql_ok "$url"; then export SASFLOW_DATABASE_URL=$url; return 0; fi
  done
  if ! ls /etc/postgresql/*/main >/dev/null 2>&1; then
    _sasflow_apt_install postgresql
  fi
  local version
  version=$(ls /etc/postgresql | sort -V | tail -n 1)
  _sasflow_log "starting PostgreSQL $version"
  _sasflow_sudo pg_ctlcluster --skip-systemctl-redirect "$version" main start 2>/dev/null || true
  for _ in $(seq 1 30); do
    for url in "${candidates[@]}"; do
      if _sasflow_psql_ok "$url"; then export SASFLOW_DATABASE_URL=$url; return 0; fi
    done
    # A fresh Debian cluster only lets OS user postgres in: give the current user a superuser
    # role, reached over the Unix socket with peer authentication (no password anywhere).
    if [ -z "${_sasflow_role_made:-}" ] && command -v runuser >/dev/null 2>&1 \
        && runuser -u postgres -- psql -qAtc 'select 1' >/dev/null 2>&1; then
      runuser -u postgres -- createuser -s "$(id -un)" 2>/dev/null || true
      runuser -u postgres -- createdb -O "$(id -un)" "$(id -un)" 2>/dev/null || true
      _sasflow_role_made=1
    fi
    sleep 1
  done
  _sasflow_log "PostgreSQL is not reachable; set SASFLOW_DATABASE_URL"
  return 1
}

_sasflow_rabbitmq() {
  local url=${SASFLOW_BROKER_URL:-amqp://localhost:5672/%2F}
  local hostport host port
  hostport=$(python3 -c 'import sys, urllib.parse as u; p = u.urlsplit(sys.argv[1]); print(p.hostname or "localhost", p.port or 5672)' "$url")
  host=${hostport% *}; port=${hostport#* }
  export SASFLOW_BROKER_URL=$url
  if _sasflow_tcp_open "$host" "$port"; then return 0; fi
  if ! command -v rabbitmq-server >/dev/null 2>&1; then
    _sasflow_apt_install rabbitmq-server
  fi
  _sasflow_log "starting RabbitMQ"
  _sasflow_sudo rabbitmq-server -detached >/dev/null 2>&1 || true
  for _ in $(seq 1 90); do
    if _sasflow_tcp_open "$host" "$port"; then
      _sasflow_sudo rabbitmqctl await_startup >/dev/null 2>&1 || true
      return 0
    fi
    sleep 1
  done
  _sasflow_log "RabbitMQ is not reachable at $host:$port; set SASFLOW_BROKER_URL"
  return 1
}

_sasflow_chromium() {
  # The browser of tests/ui (Playwright cannot download its own here): Debian's chromium.
  if [ -n "${SASFLOW_CHROMIUM:-}" ] && [ -x "$SASFLOW_CHROMIUM" ]; then return 0; fi
  if ! command -v chromium >/dev/null 2>&1 && [ -z "${SASFLOW_SKIP_INSTALL:-}" ]; then
    _sasflow_apt_install chromium
  fi
  if command -v chromium >/dev/null 2>&1; then
    SASFLOW_CHROMIUM=$(command -v chromium)
    export SASFLOW_CHROMIUM
    return 0
  fi
  _sasflow_log "chromium is not installed: the browser tests (tests/ui) will fail"
}

if ! command -v psql >/dev/null 2>&1 && [ -z "${SASFLOW_SKIP_INSTALL:-}" ]; then
  _sasflow_apt_install postgresql-client
fi
_sasflow_postgres
_sasflow_rabbitmq
_sasflow_chromium
_sasflow_log "database $(python3 -c 'import sys, re; print(re.sub(r"://([^:@/]*):[^@/]*@", r"://\1:***@", sys.argv[1]))' "$SASFLOW_DATABASE_URL"), broker $(python3 -c 'import sys, re; print(re.sub(r"://([^:@/]*):[^@/]*@", r"://\1:***@", sys.argv[1]))' "$SASFLOW_BROKER_URL")"
