# A hostile agent going for its sandbox's PID 1 (the namespace sandbox's
# init, the docker container's init): its memory for writing (code
# injection), its environment, descriptors and maps, and signals. Then the
# legitimate path: its own memory.
import json, os, signal

r = {}
def attempt(name, f):
    try:
        v = f()
        r[name] = "ok" if v is None else v
    except OSError as e:
        r[name] = e.errno

def open_mem(pid, flags):
    fd = os.open("/proc/%s/mem" % pid, flags)
    os.close(fd)
attempt("pid1_mem_rw", lambda: open_mem(1, os.O_RDWR))
attempt("pid1_mem_ro", lambda: open_mem(1, os.O_RDONLY))
attempt("pid1_environ", lambda: len(open("/proc/1/environ", "rb").read()))
attempt("pid1_fd", lambda: len(os.listdir("/proc/1/fd")))
attempt("pid1_maps", lambda: len(open("/proc/1/maps").read()))
attempt("pid1_exe", lambda: os.readlink("/proc/1/exe"))
r["pid1_status"] = {l.split(":")[0]: l.split(":", 1)[1].strip()
                    for l in open("/proc/1/status") if l.startswith(("Name", "Uid"))}
# signals: PID 1 of a PID namespace takes none it has no handler for
attempt("kill_pid1", lambda: os.kill(1, signal.SIGKILL))
r["pid1_alive"] = os.path.exists("/proc/1/status")
# the legitimate path: its own memory (read; the namespace sandbox's
# Landlock rules refuse every write outside its tmpfs, /proc included)
def read_own():
    fd = os.open("/proc/self/mem", os.O_RDONLY)
    try:
        maps = open("/proc/self/maps").readline()
        start = int(maps.split("-")[0], 16)
        return len(os.pread(fd, 16, start))
    finally:
        os.close(fd)
attempt("self_mem_read", read_own)
json.dump(r, open(os.environ["AIRLOCK_RESULT_FILE"], "w"))
print("RESULT " + json.dumps(r), flush=True)
