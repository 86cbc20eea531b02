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
# The seeded webhook's receiver is on loopback (nothing listens there).
export EGRESS_ALLOW_INTERNAL_HOSTS=127.0.0.1
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

# Seeds the organization (an agent, a finished run, a connection, a
# webhook, a second key) and writes each pass's parameters.
python3 - "$base" "$key" "$home" <<'PY'
import json, sys, time, urllib.request

base, key, home = sys.argv[1], sys.argv[2], sys.argv[3]

def call(method, path, body=None):
    req = urllib.request.Request(
        base + path,
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)

manifest = '[agent]\nname = "demo"\ncommand = ["/bin/true"]\ntimeout = 10\n\n[network]\negress = "none"\n'
call("POST", "/v1/agents", {"manifest": manifest, "files": {"notes.txt": "seeded"}})
run = call("POST", "/v1/runs", {"agent": "demo", "prompt": "seeded"})["id"]
for _ in range(200):
    if call("GET", "/v1/runs/" + run)["status"] not in ("queued", "running"):
        break
    time.sleep(0.1)
call("POST", "/v1/connections", {"name": "demo", "integration": "demo", "type": "bearer", "fields": {"token": "seeded"}})
hook = call("POST", "/v1/webhooks", {"url": "http://127.0.0.1:9/hook", "events": ["run.succeeded"]})["id"]
other = call("POST", "/v1/api-keys", {"name": "seeded"})["id"]

def op(ids, **params):
    ids = ", ".join(json.dumps(i) for i in ids)
    fields = ", ".join(f"{k} = {json.dumps(v)}" for k, v in params.items())
    return f"[[operations]]\ninclude-operation-id = [{ids}]\nparameters = {{ {fields} }}\n\n"

# Both passes: only the second key may be revoked (the run's own key,
# revoked, would leave every later request a 401).
keys = op(["revoke_api_key"], id=other)
with open(home + "/generated.toml", "w") as f:
    f.write(keys)
with open(home + "/seeded.toml", "w") as f:
    f.write(keys)
    f.write(op(["get_agent", "delete_agent"], name="demo"))
    f.write(op(["get_connection", "put_connection", "delete_connection"], name="demo"))
    f.write(op(["get_run", "cancel_run", "get_run_cost", "list_run_egress", "stream_run_events",
                "get_run_logs", "get_run_result", "get_result"], id=run))
    f.write(op(["get_webhook", "delete_webhook", "list_webhook_deliveries"], id=hook))
PY


# Two passes, each bounded. The first generates every path parameter; the
# second is pointed at the seeded things, so the answers past the lookups
# are reached too (their deletion was tried in the first: here it would
# leave the rest nothing to find).
budget="${SCHEMATHESIS_MAX_SECONDS:-150}"
common=(
  --header "Authorization: Bearer $key"
  --checks not_a_server_error,status_code_conformance
  --max-examples "${SCHEMATHESIS_MAX_EXAMPLES:-40}"
  --request-timeout 10
  --seed "${SCHEMATHESIS_SEED:-4711}"
  --generation-database none
  --no-color
)
status=0
st --config-file "$home/generated.toml" run "$base/v1/openapi.json" "${common[@]}" \
  --phases examples,coverage,fuzzing \
  --max-time "$((budget * 3 / 5))" \
  --report-dir "$home/report" ${SCHEMATHESIS_ARGS:-} || status=$?
st --config-file "$home/seeded.toml" run "$base/v1/openapi.json" "${common[@]}" \
  --include-tag agents --include-tag connections --include-tag runs \
  --include-tag webhooks --include-tag api_keys \
  --exclude-operation-id delete_agent --exclude-operation-id delete_connection \
  --exclude-operation-id delete_webhook \
  --phases examples,fuzzing \
  --max-time "$((budget * 2 / 5))" \
  --report-dir "$home/report-seeded" ${SCHEMATHESIS_ARGS:-} || status=$?

if [ "$status" -ne 0 ]; then
  echo "---- airlock serve's log (last 100 lines) ----"
  tail -n 100 "$home/serve.log"
fi
exit "$status"
