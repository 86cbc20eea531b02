"""TEMPORARY: gives a copy of the OpenAPI document the operation ids and tags
the server is being given (issue 47 item 9), by method and path, so that the
SDKs are generated with their final names. Delete this file, and its call in
generate.sh, once the server's document carries these names itself.

Usage: rename-operations.py IN OUT
"""

import json
import sys

FINAL = {
    ("get", "/healthz"): ("healthz", "health"),
    ("get", "/readyz"): ("readyz", "health"),
    ("get", "/v1/openapi.json"): ("get_openapi", "document"),
    ("get", "/v1/org"): ("get_org", "org"),
    ("get", "/v1/api-keys"): ("list_api_keys", "api_keys"),
    ("post", "/v1/api-keys"): ("create_api_key", "api_keys"),
    ("delete", "/v1/api-keys/{id}"): ("revoke_api_key", "api_keys"),
    ("post", "/v1/agents"): ("register_agent", "agents"),
    ("get", "/v1/agents"): ("list_agents", "agents"),
    ("get", "/v1/agents/{name}"): ("get_agent", "agents"),
    ("delete", "/v1/agents/{name}"): ("delete_agent", "agents"),
    ("post", "/v1/runs"): ("create_run", "runs"),
    ("get", "/v1/runs"): ("list_runs", "runs"),
    ("get", "/v1/runs/{id}"): ("get_run", "runs"),
    ("post", "/v1/runs/{id}/cancel"): ("cancel_run", "runs"),
    ("get", "/v1/runs/{id}/events"): ("stream_run_events", "runs"),
    ("get", "/v1/runs/{id}/logs"): ("get_run_logs", "runs"),
    ("get", "/v1/runs/{id}/egress"): ("list_run_egress", "runs"),
    ("get", "/v1/runs/{id}/cost"): ("get_run_cost", "runs"),
    ("get", "/v1/runs/{id}/result"): ("get_run_result", "runs"),
    ("get", "/v1/runs/{id}/results/{result_id}"): ("get_result", "runs"),
    ("post", "/v1/connections"): ("create_connection", "connections"),
    ("get", "/v1/connections"): ("list_connections", "connections"),
    ("get", "/v1/connections/{name}"): ("get_connection", "connections"),
    ("put", "/v1/connections/{name}"): ("put_connection", "connections"),
    ("delete", "/v1/connections/{name}"): ("delete_connection", "connections"),
    ("post", "/v1/webhooks"): ("create_webhook", "webhooks"),
    ("get", "/v1/webhooks"): ("list_webhooks", "webhooks"),
    ("get", "/v1/webhooks/{id}"): ("get_webhook", "webhooks"),
    ("delete", "/v1/webhooks/{id}"): ("delete_webhook", "webhooks"),
    ("get", "/v1/webhooks/{id}/deliveries"): ("list_webhook_deliveries", "webhooks"),
}

TAGS = [
    "health",
    "document",
    "org",
    "agents",
    "api_keys",
    "connections",
    "runs",
    "webhooks",
]


def main(src: str, dst: str) -> None:
    with open(src) as f:
        doc = json.load(f)
    seen = set()
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            if method not in ("get", "put", "post", "delete", "patch"):
                continue
            final = FINAL.get((method, path))
            if final is None:
                sys.exit(f"rename-operations.py: no final name for {method} {path}")
            op["operationId"], op["tags"] = final[0], [final[1]]
            seen.add((method, path))
    missing = set(FINAL) - seen
    if missing:
        sys.exit(f"rename-operations.py: not in the document: {sorted(missing)}")
    old = {t["name"]: t for t in doc.get("tags", [])}
    doc["tags"] = [
        {"name": t, "description": old.get(t, {}).get("description", "")} for t in TAGS
    ]
    with open(dst, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
