#!/usr/bin/env bash
# A bounded schemathesis run against a real `airlock serve`: every answer's
# status must be one the OpenAPI document lists for its operation, and no
# answer may be a 5xx.
#
# The server and schemathesis run in a network namespace of their own with
# only loopback up: whatever the generated requests ask for (webhook URLs,
# hosts to resolve), no packet leaves the machine. The server's store is a
# fresh SQLite file in a temporary home; its backend is `process` (no
# container needed). Usage: .ci/schemathesis.sh [path/to/airlock]
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${AIRLOCK_IN_NETNS:-}" != 1 ]; then
  exec unshare --net env AIRLOCK_IN_NETNS=1 bash "$0" "$@"
fi
ip link set lo up

airlock="${1:-${CARGO_TARGET_DIR:-target}/debug/airlock}"
[ -x "$airlock" ] || { echo "no airlock binary at $airlock (cargo build -p airlock)"; exit 1; }
# The interpreter pip installed it for (its `st` script may not be on PATH).
st() { python3 -m schemathesis.cli "$@"; }
python3 -c 'import schemathesis' 2>/dev/null \
  || { echo "schemathesis is not installed (python3 -m pip install -r .ci/requirements.txt)"; exit 1; }

home="$(mktemp -d /tmp/airlock-schemathesis-XXXXXX)"
server=""
cleanup() {
  [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
  [ -n "${SCHEMATHESIS_KEEP:-}" ] && cp -r "$home" "$SCHEMATHESIS_KEEP"
  rm -rf "$home"
}
trap cleanup EXIT

export AIRLOCK_HOME="$home"
export API_AUTH_SECRET="schemathesis-api-auth-secret-0123456789"
export CONNECTION_ENCRYPTION_KEY="AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="
# No resolver answers in the namespace: a name never resolves.
export AIRLOCK_DNS_SERVER="127.0.0.1:9"
# Every request is judged, none is slowed down by the key's rate.
export API_RATE_PER_SECOND=1000000 API_RATE_BURST=1000000 API_AUTH_FAILURE_BURST=1000000
export AIRLOCK_LOG=warn
unset DATABASE_URL RUN_ADAPTER PLATFORM_RUN_LIMITS

"$airlock" serve --listen 127.0.0.1:0 --backend process 2>"$home/serve.log" &
server=$!
base=""
for _ in $(seq 1 600); do
  base="$(grep -o 'listening on http://[0-9.:]*' "$home/serve.log" | head -n 1 | sed 's/listening on //' || true)"
  if [ -n "$base" ] && curl -fsS -o /dev/null "$base/readyz" 2>/dev/null; then break; fi
  kill -0 "$server" 2>/dev/null || { cat "$home/serve.log"; echo "airlock serve exited"; exit 1; }
  sleep 0.1
done
curl -fsS -o /dev/null "$base/readyz" || { cat "$home/serve.log"; echo "airlock serve was not ready"; exit 1; }

key="$("$airlock" orgs create schemathesis | python3 -c 'import json,sys; print(json.load(sys.stdin)["api_key"])')"

status=0
st run "$base/v1/openapi.json" \
  --header "Authorization: Bearer $key" \
  --checks not_a_server_error,status_code_conformance \
  --phases examples,coverage,fuzzing \
  --max-examples "${SCHEMATHESIS_MAX_EXAMPLES:-40}" \
  --max-time "${SCHEMATHESIS_MAX_SECONDS:-150}" \
  --request-timeout 10 \
  --seed "${SCHEMATHESIS_SEED:-4711}" \
  --generation-database none \
  --no-color \
  --report-dir "$home/report" ${SCHEMATHESIS_ARGS:-} || status=$?

if [ "$status" -ne 0 ]; then
  echo "---- airlock serve's log (last 100 lines) ----"
  tail -n 100 "$home/serve.log"
fi
exit "$status"
