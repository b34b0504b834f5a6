# shellcheck shell=bash
# Sourced by scripts/test and scripts/demo: `ensure_venv SPEC` makes the virtualenv $venv
# (default .venv) and installs this checkout into it (SPEC: '.' or '.[dev]'), editable and
# strict so that mypy can follow it. Needs python3 >= 3.11 (and python3-venv on Debian,
# installed here when missing).
venv=${SASFLOW_VENV:-.venv}

ensure_venv() {
  local spec=$1
  if [ ! -x "$venv/bin/python" ]; then
    if ! python3 -m venv "$venv" 2>/dev/null; then
      # Debian's python3 needs python3-venv for virtual environments.
      local s=()
      if [ "$(id -u)" != 0 ]; then s=(sudo); fi
      "${s[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
      "${s[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
      python3 -m venv "$venv"
    fi
  fi
  local pip_log
  pip_log=$(mktemp)
  if ! "$venv/bin/python" -m pip install -q -e "$spec" --config-settings editable_mode=strict \
      >"$pip_log" 2>&1; then
    cat "$pip_log" >&2
    rm -f "$pip_log"
    return 1
  fi
  rm -f "$pip_log"
  "$venv/bin/python" -c 'import sasflow.agents, sasflow.supervisor, sasflow.migrations'
}
