# A hostile agent going for the kernel beyond its namespaces: socket families
# that no network namespace isolates (vsock reaches the host), netlink and
# packet sockets, the kernel-information files of /proc, and the memory of
# the sandbox's PID 1. Then the legitimate socket families, used for real.
import json, os, socket

r = {}

def attempt(name, f):
    try:
        v = f()
        r[name] = "ok" if v is None else v
    except OSError as e:
        r[name] = e.errno

def sock(family, kind, proto=0):
    return lambda: socket.socket(family, kind, proto).close()

attempt("af_vsock", sock(socket.AF_VSOCK, socket.SOCK_STREAM))
attempt("af_netlink", sock(socket.AF_NETLINK, socket.SOCK_DGRAM))
attempt("af_packet", sock(socket.AF_PACKET, socket.SOCK_DGRAM))
attempt("af_alg", sock(socket.AF_ALG, socket.SOCK_SEQPACKET))
attempt("af_key", sock(socket.AF_KEY, socket.SOCK_RAW, 2))
attempt("socketpair_vsock", lambda: socket.socketpair(socket.AF_VSOCK, socket.SOCK_STREAM))

# the legitimate families: a real exchange on each
def unix_pair():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    a.sendall(b"ping")
    return b.recv(4).decode()
def tcp(family, host):
    srv = socket.socket(family, socket.SOCK_STREAM)
    srv.bind((host, 0))
    srv.listen(1)
    c = socket.create_connection((host, srv.getsockname()[1]), timeout=5)
    s, _ = srv.accept()
    c.sendall(b"pong")
    return s.recv(4).decode()
attempt("af_unix", unix_pair)
attempt("af_inet", lambda: tcp(socket.AF_INET, "127.0.0.1"))
attempt("af_inet6", lambda: tcp(socket.AF_INET6, "::1"))

def read(path, n=4096):
    with open(path, "rb") as f:
        return {"bytes": len(f.read(n))}
for p in ("keys", "key-users", "timer_list", "slabinfo", "vmallocinfo", "pagetypeinfo",
          "kcore", "sched_debug", "kallsyms", "iomem", "ioports", "modules", "kmsg"):
    if os.path.exists("/proc/" + p):
        attempt("proc_" + p, lambda p=p: read("/proc/" + p))
for d in ("acpi", "scsi", "asound", "driver"):
    if os.path.exists("/proc/" + d):
        attempt("procdir_" + d, lambda d=d: {"entries": len(os.listdir("/proc/" + d))})
# system calls by number (x86_64): the ones seccomp refuses whatever their
# arguments, with arguments the kernel itself would answer otherwise
# (clone3(NULL, 0): EINVAL; io_uring_setup(1, NULL): EFAULT), and one allowed
import ctypes, platform
if platform.machine() == "x86_64":
    libc = ctypes.CDLL(None, use_errno=True)
    # In a child: a filter may kill rather than refuse (another backend's
    # profile), which is then the answer, not the end of this agent.
    def raw(nr, *args):
        def f():
            rd, wr = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(rd)
                v = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
                out = ctypes.get_errno() if v == -1 else {"returned": v}
                os.write(wr, json.dumps(out).encode())
                os._exit(0)
            os.close(wr)
            data = os.read(rd, 4096)
            os.close(rd)
            _, st = os.waitpid(pid, 0)
            if os.WIFSIGNALED(st):
                return {"killed_by": os.WTERMSIG(st)}
            return json.loads(data)
        return f
    attempt("sys_clone3", raw(435, 0, 0))
    attempt("sys_x32_getpid", raw(0x40000000 | 39))
    attempt("sys_io_uring_setup", raw(425, 1, 0))
    attempt("sys_keyctl", raw(250, 0, 0))
    attempt("sys_getpid", raw(39))
# host secrets in /etc: each masked by a mount of its own, a file by the
# (nodev, read-only) null device, a directory by an empty read-only one
import stat
def masked(path):
    st = os.stat(path)
    up = os.stat(os.path.dirname(path))
    try:
        target = os.path.join(path, "x") if stat.S_ISDIR(st.st_mode) else path
        with open(target, "w") as f:
            f.write("x")
        write = "written"
    except OSError as e:
        write = e.errno
    return {"own_mount": st.st_dev != up.st_dev, "chr": stat.S_ISCHR(st.st_mode),
            "write": write}
for p in ("/etc/shadow", "/etc/gshadow", "/etc/ssl/private"):
    if os.path.lexists(p):
        attempt("etc_" + p[5:].replace("/", "_"), lambda p=p: masked(p))
# ordinary /proc still works
attempt("proc_self_status", lambda: read("/proc/self/status"))
attempt("proc_meminfo", lambda: read("/proc/meminfo"))

# PID 1 of the sandbox (sandbox-init): not dumpable, nothing of it readable
attempt("pid1_mem", lambda: read("/proc/1/mem", 8))
attempt("pid1_environ", lambda: read("/proc/1/environ"))
attempt("pid1_fd", lambda: len(os.listdir("/proc/1/fd")))
attempt("pid1_maps", lambda: read("/proc/1/maps"))
r["pid1_dumpable_status"] = [l for l in open("/proc/1/status") if l.startswith(("Uid", "Name"))]
# The runtime (it holds the sidecar token): wherever it is in the tree, not
# dumpable, nothing of it readable.
def cmdline(p):
    try:
        return open("/proc/%s/cmdline" % p, "rb").read()
    except OSError:
        return b""
runtime = [p for p in os.listdir("/proc") if p.isdigit()
           and cmdline(p).split(b"\0")[:3][1:] == [b"runtime", b"--"]
           and cmdline(p).split(b"\0")[0].endswith(b"airlock")]
r["runtime_pids"] = len(runtime)
for p in runtime[:1]:
    attempt("runtime_mem", lambda: read("/proc/%s/mem" % p, 8))
    attempt("runtime_environ", lambda: read("/proc/%s/environ" % p))
    attempt("runtime_fd", lambda: len(os.listdir("/proc/%s/fd" % p)))
    attempt("runtime_maps", lambda: read("/proc/%s/maps" % p))
json.dump(r, open(os.environ["AIRLOCK_RESULT_FILE"], "w"))
print("RESULT " + json.dumps(r), flush=True)
print("done", flush=True)
