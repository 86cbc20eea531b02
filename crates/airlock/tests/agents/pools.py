# A hostile agent going for the pools the host's kernel keeps for every
# process at once: native AIO contexts (fs.aio-max-nr), pseudo-terminals
# (kernel.pty.max), keyrings, System V IPC, open files (fs.file-max) and
# socket buffer memory (net.ipv4.tcp_mem, net.ipv4.udp_mem). It takes what
# it can, says HOLDING, and holds it until the test writes `release` into
# its directory, so the test can check the host meanwhile. It also uses
# what it may: its own IPC namespace, files, sockets, a memfd.
import ctypes, errno, json, mmap, os, resource, socket, sys, time

here = os.path.dirname(os.path.abspath(__file__))
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
r = {}
held = []

def sys_call(nr, *args):
    conv = [a if isinstance(a, ctypes._SimpleCData) else ctypes.c_long(a) for a in args]
    v = libc.syscall(ctypes.c_long(nr), *conv)
    return v, ctypes.get_errno()

# Native AIO: two contexts of half the host's pool each took all of it
# (fs.aio-max-nr, 65536); here 2 x 4096 events are enough to tell.
ctxs = []
for _ in range(2):
    ctx = ctypes.c_ulong(0)
    v, e = sys_call(206, 4096, ctypes.addressof(ctx))  # io_setup
    if v == 0:
        ctxs.append(ctx)
    else:
        r["io_setup_errno"] = e
        break
r["aio_contexts"] = len(ctxs)
held.append(ctxs)

# Pseudo-terminals: as many as it can get, up to 64 (one agent took 3,071).
ptys = []
try:
    while len(ptys) < 64:
        ptys.append(os.openpty())
except OSError as e:
    r["openpty_errno"] = e.errno
r["ptys"] = len(ptys)
held.append(ptys)

# Keyrings (kernel.keys: quotas per uid, kept in the kernel, not the sandbox).
v, e = sys_call(248, ctypes.c_char_p(b"user"), ctypes.c_char_p(b"airlock-test"),
                ctypes.c_char_p(b"x"), 1, -2)  # add_key(…, KEY_SPEC_PROCESS_KEYRING)
r["add_key"] = e if v < 0 else "ok"

# System V IPC and POSIX message queues: the sandbox's own namespace, used.
KEY = 0x41524C4B  # "ARLK": the test looks for it on the host
shm = libc.shmget(KEY, 1 << 20, 0o1600)
r["shmget"] = "ok" if shm >= 0 else ctypes.get_errno()
sem = libc.semget(KEY, 4, 0o1600)
r["semget"] = "ok" if sem >= 0 else ctypes.get_errno()
msg = libc.msgget(KEY, 0o1600)
r["msgget"] = "ok" if msg >= 0 else ctypes.get_errno()

# Open files: the limit, and as many as it can open.
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
r["nofile"] = [soft, hard]
try:
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard * 4, hard * 4))
    r["raise_nofile"] = "ok"
except (OSError, ValueError) as e:
    r["raise_nofile"] = getattr(e, "errno", None) or str(e)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
reserve = 160  # for the sockets below
files = []
try:
    while len(files) < 1_000_000:
        files.append(os.open("/dev/null", os.O_RDONLY))
except OSError as e:
    r["open_errno"] = e.errno
r["files_opened"] = len(files)
for fd in files[-reserve:]:
    os.close(fd)
files = files[:-reserve]
held.append(files)

# UDP: datagrams to its own sockets, never read, until 32 MiB are queued
# or the kernel stops taking more (what it refuses is dropped: what counts
# is what its receive queues hold).
def udp_rx_queued(ports):
    total = 0
    for line in open("/proc/self/net/udp").read().splitlines()[1:]:
        f = line.split()
        if int(f[1].split(":")[1], 16) in ports:
            total += int(f[4].split(":")[1], 16)
    return total

udp_target = 32 << 20
udps = []
dgram = b"\0" * 65000
try:
    while len(udps) < 48:
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        u.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)
        u.bind(("127.0.0.1", 0))
        u.setblocking(False)
        udps.append(u)
        for _ in range(256):
            try:
                u.sendto(dgram, u.getsockname())
            except OSError:
                break
        if udp_rx_queued({x.getsockname()[1] for x in udps}) >= udp_target:
            break
except OSError as e:
    r["udp_errno"] = e.errno
r["udp_sockets"] = len(udps)
r["udp_queued_bytes"] = udp_rx_queued({x.getsockname()[1] for x in udps})
held.append(udps)

# Socket buffers: loopback TCP pairs, written to and never read, until
# 256 MiB are queued or the kernel stops taking more.
target = 256 << 20
queued = 0
pairs = []
srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
srv.bind(("127.0.0.1", 0))
srv.listen(64)
chunk = b"\0" * (1 << 16)
try:
    while queued < target and len(pairs) < 24:
        c = socket.create_connection(srv.getsockname())
        s, _ = srv.accept()
        for sk in (c, s):
            sk.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 << 20)
            sk.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)
        c.setblocking(False)
        pairs.append((c, s))
        stalled = 0
        while queued < target:
            try:
                queued += c.send(chunk)
                stalled = 0
            except BlockingIOError:
                stalled += 1
                if stalled > 50:
                    break
                time.sleep(0.002)
except OSError as e:
    r["tcp_errno"] = e.errno
r["tcp_pairs"] = len(pairs)
r["tcp_queued_bytes"] = queued
held.append(pairs)

# A memfd: memory like any other (the test checks it is the run's).
fd = os.memfd_create("airlock-test")
os.write(fd, b"\1" * (64 << 20))
r["memfd_bytes"] = os.fstat(fd).st_size
held.append(fd)

json.dump(r, open(os.environ["AIRLOCK_RESULT_FILE"], "w"))
print("RESULT " + json.dumps(r), flush=True)
print("HOLDING", flush=True)
deadline = time.time() + 90
while time.time() < deadline and not os.path.exists(os.path.join(here, "release")):
    time.sleep(0.02)
print("released", flush=True)
