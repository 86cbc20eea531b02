"""Drives the sidecar's /mcp with the official MCP Python SDK (mcp 2.x).

Reads one JSON document on stdin:
  {"url": "...", "token": "..." | null, "mode": "legacy" | "2026-07-28", "uds": null | "/path.sock",
   "ops": [{"op": "list_tools"} | {"op": "call", "name": ..., "args": {...}} | {"op": "read", "uri": ...}]}
and prints one JSON document on stdout:
  {"protocol_version": ..., "results": [...]} or {"fatal": {...}}.
Each result is the SDK's parsed result (by alias, JSON mode) or
{"exception": class name, "code": JSON-RPC code or null, "message": ...}.
"""

import asyncio
import json
import sys

import httpx2
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


def dump(model):
    return model.model_dump(by_alias=True, mode="json", exclude_none=True)


def describe(exc):
    error = getattr(exc, "error", None)
    return {
        "exception": type(exc).__name__,
        "code": getattr(error, "code", None),
        "message": str(exc),
    }


async def main():
    cfg = json.load(sys.stdin)
    headers = {}
    if cfg.get("token"):
        headers["Authorization"] = f"Bearer {cfg['token']}"
    http = create_mcp_http_client(headers=headers)
    if cfg.get("uds"):
        http = httpx2.AsyncClient(
            headers=headers,
            timeout=httpx2.Timeout(30, read=300),
            transport=httpx2.AsyncHTTPTransport(uds=cfg["uds"]),
        )
    out = {"results": []}
    try:
        async with http:
            transport = streamable_http_client(cfg["url"], http_client=http)
            async with Client(transport, mode=cfg["mode"]) as client:
                out["protocol_version"] = client.session.protocol_version
                for op in cfg["ops"]:
                    try:
                        if op["op"] == "list_tools":
                            r = await client.list_tools()
                            out["results"].append({"tools": [dump(t) for t in r.tools], "meta": r.meta})
                        elif op["op"] == "call":
                            r = await client.call_tool(op["name"], op.get("args"))
                            out["results"].append(dump(r))
                        elif op["op"] == "read":
                            r = await client.read_resource(op["uri"])
                            out["results"].append(dump(r))
                        else:
                            out["results"].append({"exception": "BadOp", "message": op["op"]})
                    except Exception as exc:  # noqa: BLE001 - reported to the Rust test
                        out["results"].append(describe(exc))
    except BaseException as exc:  # noqa: BLE001 - includes ExceptionGroup from the task group
        leaves = []
        stack = [exc]
        while stack:
            e = stack.pop()
            inner = getattr(e, "exceptions", None)
            if inner:
                stack.extend(inner)
            else:
                leaves.append(describe(e))
        out["fatal"] = leaves
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main())
