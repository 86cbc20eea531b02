# An ordinary Python agent: threads, files, a subprocess, and an HTTP
# request through the run's proxy (to the test's server named in the prompt).
import concurrent.futures, hashlib, json, os, subprocess, tempfile, urllib.request

r = {}
target = open(os.environ["AIRLOCK_PROMPT_FILE"]).read().strip()

def work(i):
    return hashlib.sha256(str(i).encode() * 100000).hexdigest()[:8]
with concurrent.futures.ThreadPoolExecutor(8) as pool:
    r["threads"] = len(set(pool.map(work, range(32))))

with tempfile.NamedTemporaryFile("w+", dir=os.getcwd() if os.access(".", os.W_OK) else None) as f:
    f.write("x" * 100000)
    f.flush()
    r["tmp_file"] = os.path.getsize(f.name)
ws = os.environ.get("AIRLOCK_WORKSPACE", "/workspace")
with open(os.path.join(ws, "out.txt"), "w") as f:
    f.write("written")
r["workspace_file"] = open(os.path.join(ws, "out.txt")).read()

r["subprocess"] = subprocess.run(["/bin/sh", "-c", "echo $((6 * 7))"],
                                 capture_output=True, text=True, check=True).stdout.strip()

with urllib.request.urlopen("http://%s/hello" % target, timeout=30) as resp:
    r["http"] = [resp.status, resp.read().decode()]
json.dump(r, open(os.environ["AIRLOCK_RESULT_FILE"], "w"))
print("RESULT " + json.dumps(r), flush=True)
