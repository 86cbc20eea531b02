# A hostile agent mapping the host from inside: the mounts it sees, the
# directory of the `airlock` binary it was started from (argv[1] names the
# host's), build artefacts anywhere it can walk, the host's sysfs and its
# pseudo-terminal pool. Then what it may: its own directory.
import json, os, sys

r = {}
host_dir = sys.argv[1]
r["host_binary_dir_exists"] = os.path.exists(host_dir)

def unescape(p):
    return p.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")
r["mounts"] = sorted({unescape(l.split()[4]) for l in open("/proc/self/mountinfo")})

# The runtime that started this agent: where its binary is, and what else
# is in that directory.
def cmdline(p):
    try:
        return open("/proc/%s/cmdline" % p, "rb").read().split(b"\0")
    except OSError:
        return []
runtime = [cmdline(p) for p in os.listdir("/proc") if p.isdigit()]
runtime = [c for c in runtime if c[1:3] == [b"runtime", b"--"]]
if runtime:
    exe = runtime[0][0].decode()
    r["runtime_exe"] = exe
    try:
        r["runtime_dir_entries"] = sorted(os.listdir(os.path.dirname(exe)))
    except OSError as e:
        r["runtime_dir_entries"] = e.errno

# Build artefacts or other binaries of the host's tree, wherever it can walk
# (the system directories are the host's own or the image's, read-only).
skip = {"/proc", "/sys", "/dev", "/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}
names = {"airlock-sidecar", "airlock-probe", "deps", "incremental", ".fingerprint", "build"}
found, seen = [], 0
for root, dirs, files in os.walk("/"):
    dirs[:] = [d for d in dirs if os.path.join(root, d) not in skip]
    for n in dirs + files:
        seen += 1
        if n in names or n.endswith((".rlib", ".rmeta", ".d")):
            found.append(os.path.join(root, n))
    if seen > 200000 or len(found) > 50:
        break
r["artefacts"] = found[:50]
r["walked"] = seen

def listing(p):
    try:
        return sorted(os.listdir(p))
    except OSError as e:
        return e.errno
r["sys"] = listing("/sys")
r["dev_pts"] = listing("/dev/pts")
try:
    os.close(os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY))
    r["ptmx"] = "opened"
except OSError as e:
    r["ptmx"] = e.errno
# the legitimate path: its own directory, read-only
r["own_file"] = len(open(os.path.abspath(__file__)).read())
json.dump(r, open(os.environ["AIRLOCK_RESULT_FILE"], "w"))
print("RESULT " + json.dumps(r), flush=True)
