#!/usr/bin/env bash
# Generates both SDKs from the API's OpenAPI document; writes only under sdks/.
#
#   sdks/generate.sh [DOCUMENT.json]
#
# Without an argument the document is `airlock openapi`'s (the one `airlock
# serve` serves at /v1/openapi.json; AIRLOCK names the binary, default
# `airlock` on PATH). Needs, pinned: openapi-python-client and ruff from
# sdks/requirements.txt on PATH (or OPENAPI_PYTHON_CLIENT), and `npm ci` done
# in sdks/typescript (openapi-typescript, typescript). .ci/sdks runs it and
# fails when the committed code differs from what it writes.
set -euo pipefail
sdks="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

if [ $# -ge 1 ]; then
  cp "$1" "$work/served.json"
else
  "${AIRLOCK:-airlock}" openapi > "$work/served.json"
fi
# The document the committed code was generated from, kept beside it.
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); open(sys.argv[2], "w").write(json.dumps(d, indent=2, sort_keys=True) + "\n")' \
  "$work/served.json" "$sdks/openapi.json"

# Python: openapi-python-client writes the package airlock_client.generated.
"${OPENAPI_PYTHON_CLIENT:-openapi-python-client}" generate \
  --path "$sdks/openapi.json" \
  --config "$sdks/python/openapi-python-client.yaml" \
  --meta none --output-path "$work/python" --overwrite
rm -rf "$sdks/python/airlock_client/generated"
mv "$work/python" "$sdks/python/airlock_client/generated"

# TypeScript: openapi-typescript writes the document's types; tsc builds the
# facade beside them into dist/ (committed: installing from the path needs
# no build step).
ts="$sdks/typescript"
"$ts/node_modules/.bin/openapi-typescript" "$sdks/openapi.json" \
  --output "$ts/src/schema.ts" --silent
rm -rf "$ts/dist"
"$ts/node_modules/.bin/tsc" -p "$ts/tsconfig.json"
