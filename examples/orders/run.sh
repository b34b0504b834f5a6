#!/usr/bin/env bash
# Start every process of the Procfile next to this script; Ctrl-C or SIGTERM stops them all,
# and so does any one of them exiting (as honcho and foreman do). Run from anywhere; the
# repository root is made the working directory so `examples.orders.app` imports.
#   SASFLOW_DATABASE_URL=... SASFLOW_BROKER_URL=... examples/orders/run.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here/../.."
export SASFLOW_APP="${SASFLOW_APP:-examples.orders.app}"
export PYTHONUNBUFFERED=1
pids=()
while IFS= read -r line || [[ -n "$line" ]]; do
  [[ -z "${line// }" || "$line" == \#* ]] && continue
  name="${line%%:*}"
  command="${line#*:}"
  echo "run.sh: starting $name:$command"
  bash -c "exec $command" &
  pids+=("$!")
done < "$here/Procfile"
stop() { kill -TERM "${pids[@]}" 2>/dev/null || true; }
trap stop INT TERM
wait -n || true
stop
wait || true
echo "run.sh: stopped"
