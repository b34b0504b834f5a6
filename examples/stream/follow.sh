#!/bin/sh
# Follow the sasflow subscription stream with curl and a POSIX shell: print every record on a
# line of its own and acknowledge every UPDATE. RecordIO needs no JSON parser to split: read
# the size line, then exactly that many bytes (`read` and `head -c` never read ahead on a pipe).
#   SASFLOW_API_URL=http://127.0.0.1:8080 SASFLOW_API_TOKEN=... sh examples/stream/follow.sh
set -eu
api=${SASFLOW_API_URL:-http://127.0.0.1:8080}
auth="Authorization: Bearer $SASFLOW_API_TOKEN"
json="Content-Type: application/json"
headers=$(mktemp)
trap 'rm -f "$headers"' EXIT

curl -sSN -D "$headers" -H "$auth" -H "$json" \
  -d '{"type":"SUBSCRIBE","subscriber":{"name":"shell"}}' "$api/v1/stream" |
while IFS= read -r size; do
  record=$(head -c "$size")
  printf '%s\n' "$record"
  case $record in
    '{"type":"UPDATE","uuid":"'*)
      uuid=${record#*'"uuid":"'}
      uuid=${uuid%%'"'*}
      stream=$(sed -n 's/^[Ss]asflow-[Ss]tream-[Ii]d: *\([0-9a-f-]*\).*/\1/p' "$headers")
      curl -sS -o /dev/null -H "$auth" -H "$json" -H "Sasflow-Stream-Id: $stream" \
        -d "{\"type\":\"ACKNOWLEDGE\",\"uuid\":\"$uuid\"}" "$api/v1/stream" </dev/null
      ;;
  esac
done
