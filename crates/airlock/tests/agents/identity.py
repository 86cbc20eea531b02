# A hostile agent as a host user: read root-only files in its read-only
# view, and exhaust the per-user kernel quotas (inotify instances) that it
# would share with host root if it were host root.
import json, os, sys, time

r = {"uid": os.getuid(), "gid": os.getgid()}
r["uid_map"] = open("/proc/self/uid_map").read().split()
r["gid_map"] = open("/proc/self/gid_map").read().split()
here = os.path.dirname(os.path.abspath(__file__))
for name in ("root-only.txt", "public.txt"):
    try:
        r[name] = open(os.path.join(here, name)).read()
    except OSError as e:
        r[name] = e.errno

import ctypes
libc = ctypes.CDLL(None, use_errno=True)
fds = []
while len(fds) < 4096:
    fd = libc.inotify_init1(0o2000000)  # IN_CLOEXEC
    if fd < 0:
        r["inotify_stop_errno"] = ctypes.get_errno()
        break
    fds.append(fd)
r["inotify_instances"] = len(fds)
json.dump(r, open(os.environ["AIRLOCK_RESULT_FILE"], "w"))
print("RESULT " + json.dumps(r), flush=True)
print("HOLDING %d inotify instances" % len(fds), flush=True)
# Hold them until the test says so (it writes `release` into the agent dir,
# which the sandbox sees read-only but live).
deadline = time.time() + 60
while time.time() < deadline and not os.path.exists(os.path.join(here, "release")):
    time.sleep(0.02)
print("released", flush=True)
