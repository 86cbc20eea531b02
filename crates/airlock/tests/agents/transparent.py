# The transparent plane from inside a sandbox: tools that ignore the proxy
# variables (a Go and a Node client, git), the sandbox's resolver, and what
# must stay unreachable. Writes what each saw as the run's result.
import json, os, socket, ssl, subprocess

here = os.path.dirname(os.path.abspath(__file__))
ws = os.environ["AIRLOCK_WORKSPACE"]
a = json.load(open(os.path.join(here, "args.json")))
ca = os.path.join(here, "test-ca.pem")
# No proxy for the tools: what they reach, they reach through the plane.
env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
env.update(SSL_CERT_FILE=ca, NODE_EXTRA_CA_CERTS=ca, GIT_SSL_CAINFO=ca, HOME=ws)
r = {"resolv": open("/etc/resolv.conf").read()}


def run(cmd):
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=90)
    return {"code": p.returncode, "out": p.stdout, "err": p.stderr[-600:]}


r["go"] = run([os.path.join(here, "probe-go")] + a["urls"]["go"])
r["node"] = run([a["node"], os.path.join(here, "transparent.js")] + a["urls"]["node"])
# Plain HTTP, named by its Host: judged as the proxy judges plain HTTP.
r["go_plain"] = run([os.path.join(here, "probe-go")] + a["urls"]["go_plain"])
r["node_plain"] = run([a["node"], os.path.join(here, "transparent.js")] + a["urls"]["node_plain"])
clone = os.path.join(ws, "clone")
r["git"] = run(["git", "clone", "-q", a["repo"], clone])
readme = os.path.join(clone, "README")
r["git"]["readme"] = open(readme).read() if os.path.exists(readme) else None

# The sandbox's answers: synthetic, the same each time (nothing to rebind).
r["rebind_addrs"] = [socket.gethostbyname("rebind.test") for _ in range(3)]
api = socket.gethostbyname("api.test")
r["api_addr"] = api
port = a["port"]


def tls(addr, sni):
    ctx = ssl.create_default_context(cafile=ca)
    try:
        with socket.create_connection((addr, port), timeout=10) as s:
            with ctx.wrap_socket(s, server_hostname=sni) as t:
                t.sendall(b"GET /sni HTTP/1.1\r\nHost: " + sni.encode() + b"\r\nConnection: close\r\n\r\n")
                return {"ok": t.recv(200).decode(errors="replace")}
    except Exception as e:
        return {"error": repr(e)}


# Another name's SNI on the address issued for api.test.
r["sni_mismatch"] = tls(api, "other.test")
r["sni_match"] = tls(api, "api.test")
# Literal addresses: a synthetic one never issued, the upstream's own, a public one.
r["literal_synthetic"] = tls("127.18.250.250", "api.test")
r["literal_upstream"] = tls(a["upstream_ip"], "api.test")
try:
    socket.create_connection(("192.0.2.1", 443), timeout=5).close()
    r["literal_public"] = "connected"
except Exception as e:
    r["literal_public"] = repr(e)

# UDP to anything but the responder: the host's UDP peer must see nothing.
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sent = []
for dest in [("127.0.0.1", a["udp_port"]), (api, a["udp_port"]), (a["upstream_ip"], a["udp_port"]), ("192.0.2.1", 53)]:
    try:
        u.sendto(b"udp-probe", dest)
        sent.append("sent")
    except Exception as e:
        sent.append(repr(e))
r["udp"] = sent
json.dump(r, open(os.environ["AIRLOCK_RESULT_FILE"], "w"))
