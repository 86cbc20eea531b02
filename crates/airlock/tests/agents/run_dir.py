# A hostile agent going for what the platform reads or connects to: the
# sidecar's sockets (rename, replace, plant), the run directory and its
# owner file, and the host disk (fill every writable place it can find).
# Then the legitimate path: MCP through the runtime's relay still works.
import json, os, socket, sys, urllib.request

r = {}
prompt = open(os.environ["AIRLOCK_PROMPT_FILE"]).read().strip()
home = prompt  # the test tells the agent where the host keeps its runs

def attempt(name, f):
    try:
        v = f()
        r[name] = "ok" if v is None else v
    except OSError as e:
        r[name] = e.errno

# The sockets the runtime uses are wherever its relay connects: find the
# directory the way an agent would, from the mount table.
mounts = [l.split() for l in open("/proc/self/mountinfo")]
try:
    r["sockets_listing"] = sorted(os.listdir("/run/airlock"))
except OSError as e:
    r["sockets_listing"] = e.errno
r["sockets_present"] = [os.path.exists("/run/airlock/" + s) for s in ("sidecar.sock", "proxy.sock")]
sock_dirs = ["/run/airlock"] + [m[4] for m in mounts if m[4].endswith("/sock") or "/runs/" in m[4]]
r["sock_dirs"] = sock_dirs
for d in sock_dirs:
    s = os.path.join(d, "sidecar.sock")
    attempt("rename:" + s, lambda s=s: os.rename(s, s + ".moved"))
    attempt("unlink:" + s, lambda s=s: os.unlink(s))
    def plant(d=d):
        x = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        x.bind(os.path.join(d, "sidecar.sock"))
    attempt("bind:" + s, plant)
    attempt("create:" + d, lambda d=d: open(os.path.join(d, "planted"), "w").write("x"))
    attempt("chmod:" + d, lambda d=d: os.chmod(d, 0o777))

# The host's run directory and owner file are not in the sandbox's view.
runs = os.path.join(home, "runs")
r["runs_visible"] = os.path.exists(runs)
try:
    # only the mount point of the agent's own directory, if it lives there
    r["home_listing"] = sorted(os.listdir(home))
except OSError as e:
    r["home_listing"] = e.errno
r["owner_files"] = []
for d in [runs] + [m[4] for m in mounts]:
    p = os.path.join(d, os.environ.get("AIRLOCK_RUN_ID", "?"), "owner.pid")
    if os.path.exists(p):
        r["owner_files"].append(p)

# Fill every writable mount point (and the usual places) until ENOSPC.
targets = {"/workspace", "/tmp", "/dev/shm", os.environ["AIRLOCK_WORKSPACE"]}
for m in mounts:
    if "rw" in m[5].split(",") and not m[4].startswith("/proc"):
        targets.add(m[4])
written = {}
chunk = b"z" * (1 << 20)
for t in sorted(targets):
    n = 0
    try:
        with open(os.path.join(t, "fill-%d" % len(written)), "wb") as f:
            while n < (256 << 20):
                f.write(chunk)
                f.flush()
                n += len(chunk)
    except OSError as e:
        pass
    written[t] = n
r["written"] = written
r["total_written"] = sum(written.values())
for t in targets:
    for f in os.listdir(t) if os.path.isdir(t) else []:
        if f.startswith("fill-"):
            try:
                os.unlink(os.path.join(t, f))
            except OSError:
                pass

# The legitimate path: the sidecar, through the runtime's relay, with its token.
def mcp(body, session=None):
    h = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
    if session:
        h["mcp-session-id"] = session
    h["mcp-protocol-version"] = "2025-11-25"
    req = urllib.request.Request(os.environ["AIRLOCK_MCP_URL"], data=json.dumps(body).encode(), headers=h)
    with urllib.request.urlopen(req, timeout=10) as resp:
        text = resp.read().decode()
        return resp.headers.get("mcp-session-id"), text
try:
    sid, _ = mcp({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "hostile", "version": "1"}}})
    mcp({"jsonrpc": "2.0", "method": "notifications/initialized"}, sid)
    _, tools = mcp({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, sid)
    r["mcp_tools"] = "run_history" in tools
except Exception as e:
    r["mcp_tools"] = "error: %r" % e
# /events is the runtime's channel, not the agent's, even through the relay
try:
    base = os.environ["AIRLOCK_MCP_URL"].rsplit("/mcp", 1)[0]
    req = urllib.request.Request(base + "/events", data=b'{"events":[{"type":"result","at":1,"exit_code":0,"result":{"forged":true}}]}', headers={"content-type": "application/json"})
    urllib.request.urlopen(req, timeout=10)
    r["events_via_relay"] = "accepted"
except urllib.error.HTTPError as e:
    r["events_via_relay"] = e.code
json.dump(r, open(os.environ["AIRLOCK_RESULT_FILE"], "w"))
print("RESULT " + json.dumps(r), flush=True)
print("done", flush=True)
